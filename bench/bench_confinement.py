"""What the kernel's wall costs a shell command (activities/confinement.py): the same commands run with and
without it, alternating (a host's load moves both alike), p50 and p99 of each and their ratio; and what the
launcher costs (kiwi/launch.py, through which every process Kiwi starts goes on Linux): the same command
started directly, as Kiwi did with a ``preexec_fn``, without the parent-death signal.

.venv/bin/python bench/bench_confinement.py [--calls 300]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from activities import confinement, process  # noqa: E402
from activities.process import run_process  # noqa: E402
from kiwi.contracts import CommandRequest  # noqa: E402


async def main(calls: int) -> None:
    abi = confinement.landlock.abi_version()
    if not abi:
        sys.exit("this kernel has no Landlock: nothing to measure")
    with tempfile.TemporaryDirectory() as folder:
        project = Path(folder)
        (project / "out").mkdir()
        for index in range(50):  # (the root's entries are listed for every command: a project's worth)
            (project / f"file{index}.txt").write_text("a line\n" * 100)
        req = CommandRequest(
            project_root=str(project), argv=["x"], read_grants=["**"], write_grants=["out/**"]
        )
        wall = (abi, lambda program, temp: confinement.shell_rules(req, program, temp))
        for argv in (["true"], ["grep", "-r", "line", "."]):
            direct: list[float] = []
            plain: list[float] = []
            walled: list[float] = []
            for _ in range(calls):
                for samples, confine, launched in (
                    (direct, None, False),
                    (plain, None, True),
                    (walled, wall, True),
                ):
                    process.launches = (lambda: True) if launched else (lambda: False)  # type: ignore[assignment]
                    started = time.perf_counter()
                    await run_process(argv, cwd=folder, timeout=30, max_output=10_000_000, confine=confine)
                    samples.append((time.perf_counter() - started) * 1000)
            d50, p50, q50 = (statistics.median(s) for s in (direct, plain, walled))
            p99, q99 = (sorted(s)[int(len(s) * 0.99)] for s in (plain, walled))
            print(
                f"{' '.join(argv):<20} started directly p50 {d50:.2f} ms | launched p50 {p50:.2f} ms "
                f"(+{p50 - d50:.2f} ms) p99 {p99:.2f} ms | launched and confined p50 {q50:.2f} ms p99 {q99:.2f} ms"
                f" | {q50 / p50:.2f}x the launched (+{q50 - p50:.2f} ms)"
            )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    asyncio.run(main(parser.parse_args().calls))
