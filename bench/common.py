"""What the benchmarks share: a scratch project, the tuned dev server, worker processes, percentiles, CPU."""

from __future__ import annotations

import asyncio
import atexit
import os
import shutil
import signal
import tempfile
from pathlib import Path

from kiwi.cli import main as kiwi
from kiwi.devserver import DEFAULTS, DevServer, free_port


def scratch_project(root: Path) -> None:
    """`kiwi init` in ``root`` (made the current folder), with an empty user space and key folder beside it
    (never inside: no run works in a folder that holds them), removed when the bench ends.

    init makes a signing key there and signs the example; benches sign their own directives with
    ``tests.helpers.write_directive`` so the runs have their declared grants.
    """
    os.environ["AI_USER_SPACE"] = beside(root, "user")
    os.environ["KIWI_KEYS_DIR"] = beside(root, "keys")
    os.chdir(root)
    kiwi(["init", "--json"])


def beside(root: Path, what: str) -> str:
    """A new folder next to ``root`` (a bench's scratch project), removed when the process ends."""
    folder = tempfile.mkdtemp(prefix=f"{root.name}-{what}-", dir=root.parent)
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


def wait_directive(root: Path) -> None:
    """``wait``: one step that waits for the agent (``decide``)."""
    from tests.helpers import directive_md, write_directive

    write_directive(
        root / ".ai" / "directives" / "wait.md",
        directive_md('<step name="decide"><action>Decide.</action></step>', name="wait"),
    )


def notes_directive(root: Path) -> None:
    """``notes``: one agent step that may write under notes/."""
    from tests.helpers import directive_md, write_directive

    write_directive(
        root / ".ai" / "directives" / "notes.md",
        directive_md(
            '<step name="work"><action>Write notes.</action></step>',
            name="notes",
            permissions='<write resource="filesystem" path="notes/**"/>',
        ),
    )


def tuned_dev_server(root: Path) -> DevServer:
    """The dev server with `kiwi dev`'s default tuning, on free loopback ports, state in ``root``."""
    t = DEFAULTS["temporal"]
    return DevServer(
        ip="127.0.0.1",
        port=free_port(),
        ui_port=free_port(),
        db_file=root / "temporal.sqlite",
        pragmas=t["sqlite_pragmas"],
        dynamic_config=t["dynamic_config"],
    )


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * p))]


def cpu_seconds(pid: int | None = None) -> float:
    """User + system CPU time a process has used so far (this process when ``pid`` is None)."""
    if pid is None:
        times = os.times()
        return times.user + times.system
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def start_worker(
    address: str, env: dict[str, str] | None = None, queue: str = "kiwi", *extra: str
) -> asyncio.subprocess.Process:
    """A `kiwi worker` process started as the tests start one (``tests.helpers.kiwi_worker``);
    ``extra``: more of its options (``--threaded``)."""
    from tests.helpers import kiwi_worker

    return await kiwi_worker(address, queue, *extra, env=env)


async def gather_limited(limit: int, jobs) -> list:
    sem = asyncio.Semaphore(limit)

    async def one(job):
        async with sem:
            return await job

    return await asyncio.gather(*(one(j) for j in jobs))


async def stop_worker(proc: asyncio.subprocess.Process, sig: int = signal.SIGTERM) -> None:
    """Stop a worker started by :func:`start_worker` (SIGKILL to play a crash)."""
    if proc.returncode is None:
        os.killpg(proc.pid, sig)
        await proc.wait()


def pin_processes(workers: list[int], others: list[int]) -> str:
    """Give the worker processes ``workers`` (their threads, and every process they started: MCP servers)
    the host's last core, and ``others`` (the Temporal server, the callers) the rest: what a host where
    the worker has a core of its own measures. A description of what went where."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        raise SystemExit("--pin needs at least 2 cores")
    mine, rest = {cores[-1]}, set(cores[:-1])
    for pids, where in ((workers, mine), (others, rest)):
        for pid in pids:
            for process in [pid] + (_descendants(pid) if where is mine else []):
                for tid in os.listdir(f"/proc/{process}/task"):
                    os.sched_setaffinity(int(tid), where)
    return f"workers and their MCP servers on core {cores[-1]}, the server and callers on {sorted(rest)}"


def children(pid: int) -> list[int]:
    """The processes ``pid`` started that still run (Linux)."""
    return [
        int(child)
        for tid in os.listdir(f"/proc/{pid}/task")
        for child in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()
    ]


def _descendants(pid: int) -> list[int]:
    return [p for child in children(pid) for p in (child, *_descendants(child))]
