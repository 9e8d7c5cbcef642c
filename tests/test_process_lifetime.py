"""What Kiwi starts dies with the worker that started it, even a worker killed with ``kill -9``
(kiwi/lifetime.py): MCP servers over stdio, and the commands of shell.run, git and local tools, with what
they start in their process groups. Each runs in a session of its own, out of the worker's process group,
so nothing else would stop it: the kernel's parent-death signal and the keeper (kiwi/keeper.py) do."""

from __future__ import annotations

import asyncio
import contextlib
import marshal
import os
import signal
import sys
import textwrap
import uuid
from pathlib import Path

import pytest
from temporalio.exceptions import ApplicationError

from activities.process import run_process
from kiwi.items.store import ItemStore
from kiwi.lifetime import Keeper
from kiwi.runs import RunClient
from tests.helpers import kiwi_worker, wait_for
from tests.test_mcp_servers import SERVERS, mcp_directive, registry

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the kernel's parent-death signal is Linux's"
)


def _children(pid: int, name: str) -> list[int]:
    """The processes whose parent is ``pid`` and whose command line names ``name`` (read from /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rpartition(")")[2].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().decode(errors="replace")
        except (OSError, ValueError, IndexError):
            continue
        if ppid == pid and name in cmdline:
            found.append(int(entry))
    return found


async def run_command_in_a_process(tmp_path: Path, script: str) -> asyncio.subprocess.Process:
    """A process of its own (standing for a worker, killed as one is) that runs ``sh -c script`` through
    run_process, as shell.run, git and local tools do."""
    runner = tmp_path / "runner.py"
    runner.write_text(
        textwrap.dedent(
            f"""
            import asyncio
            from activities.process import run_process

            argv = ["sh", "-c", {script!r}]
            asyncio.run(run_process(argv, cwd={str(tmp_path)!r}, timeout=600, max_output=1000))
            """
        )
    )
    return await asyncio.create_subprocess_exec(
        sys.executable, str(runner), start_new_session=True, env={**os.environ, "PYTHONPATH": str(REPO)}
    )


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for init to reap it has ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the kernel's parent-death signal is Linux's"
)
@pytest.mark.temporal
async def test_a_server_stuck_in_a_call_dies_with_a_worker_killed_by_kill_9(temporal_env, project, tmp_path):
    """A stdio server runs in a session of its own, so the worker's process group is not its group. Killed
    with kill -9, the worker cannot stop it, and a server stuck in a call (here waiting on a FIFO in a thread,
    as a server waits on a lock or a network) never reads the end of its input: it stayed behind for good.
    The kernel now kills it when the worker dies."""
    ledger = tmp_path / "ledger.txt"
    release = ledger.with_suffix(".release")
    os.mkfifo(release)
    registry(
        project,
        f'mcps:\n  ledger:\n    command: "{sys.executable}"\n'
        f'    args: ["{SERVERS / "ledger_server.py"}", "{ledger}"]\n',
    )
    mcp_directive(
        project,
        "held",
        tools='<mcp name="ledger" required="true"/>',
        permissions='<execute resource="mcp" name="ledger" actions="*"/>',
        body='<step name="work"><action>Call.</action></step>',
    )
    queue = f"kiwi-orphan-{uuid.uuid4().hex[:8]}"
    runs = RunClient(temporal_env.client, ItemStore(project), task_queue=queue)
    worker = await kiwi_worker(temporal_env.client.service_client.config.target_host, queue)
    try:
        run_id = await runs.start("held", {})
        call = asyncio.create_task(runs.call_tool(run_id, "ledger.hold", {"tag": "x"}))

        async def at_server() -> bool:
            return ledger.exists() and "hold x" in ledger.read_text()

        await wait_for(at_server, what="the call at the server")
        servers = _children(worker.pid, "ledger_server.py")
        assert len(servers) == 1, servers
        os.killpg(worker.pid, signal.SIGKILL)
        await worker.wait()

        async def gone() -> bool:
            return not _alive(servers[0])

        await wait_for(gone, what="the server to die with its worker", timeout=30)
        call.cancel()
    finally:
        if worker.returncode is None:
            os.killpg(worker.pid, signal.SIGKILL)
            await worker.wait()
        with contextlib.suppress(OSError):  # a server still waiting is let go (no reader: nothing to do)
            fd = os.open(release, os.O_WRONLY | os.O_NONBLOCK)
            os.write(fd, b"done\n")
            os.close(fd)


async def test_a_command_dies_with_the_process_that_ran_it_when_that_is_killed_by_kill_9(tmp_path):
    """A command run_process started (shell.run, git, local tools) kept running after its worker was
    killed, while Temporal retried its activity on another worker: the command ran twice at once."""
    pid_file = tmp_path / "command.pid"
    proc = await run_command_in_a_process(
        tmp_path, f"echo $$ > {pid_file}.tmp && mv {pid_file}.tmp {pid_file} && exec sleep 300"
    )
    await _dies_with_the_runner(proc, pid_file, "the command")


async def _dies_with_the_runner(
    proc: asyncio.subprocess.Process, pid_file: Path, what: str, grouped=False
) -> None:
    """Once the process whose pid the command writes to ``pid_file`` runs (in a process group of its own if
    ``grouped``), ``proc`` (standing for the worker) is killed with kill -9: that process dies too."""
    try:

        async def started() -> bool:
            return pid_file.exists()

        await wait_for(started, what=f"{what} to start")
        pid = int(pid_file.read_text())
        assert _alive(pid) and (not grouped or os.getpgid(pid) == pid)
        os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()
        await wait_for(lambda: _dead(pid), what=f"{what} to die with the process that ran it", timeout=30)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        if pid_file.exists():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)


async def test_what_a_command_leaves_running_in_its_group_ends_with_the_call(tmp_path):
    """A command that starts a helper in the background and exits (its output sent elsewhere, so the call
    ends) leaves nothing running: the call's end stops the command's whole process group."""
    result = await run_process(
        ["sh", "-c", "sleep 300 >/dev/null 2>&1 & echo $!"], cwd=str(tmp_path), timeout=30, max_output=1000
    )
    helper = int(result.stdout)
    try:
        await wait_for(lambda: _dead(helper), what="the command's helper to end with the call", timeout=10)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(helper, signal.SIGKILL)


# A helper `sleep 300` started in a process group of its own; its pid printed.
_GROUPED = (
    f"{sys.executable} -c 'import subprocess as s; "
    'print(s.Popen(["sleep", "300"], process_group=0, stdout=s.DEVNULL, stderr=s.DEVNULL).pid)\''
)


async def test_a_helper_in_a_process_group_of_its_own_ends_with_the_call_and_with_the_worker(tmp_path):
    """A process group is no way out: a helper a command puts in a group of its own (a shell's job control,
    `timeout`, ninja) stays in the command's session, and the call's end, or the keeper when the worker is
    killed with kill -9, ends every process of that session (review s27)."""
    result = await run_process(["sh", "-c", _GROUPED], cwd=str(tmp_path), timeout=30, max_output=1000)
    helper = int(result.stdout)
    try:
        await wait_for(
            lambda: _dead(helper), what="the helper in a group of its own to end with the call", timeout=10
        )
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(helper, signal.SIGKILL)

    pid_file = tmp_path / "helper.pid"
    proc = await run_command_in_a_process(
        tmp_path,
        f"{_GROUPED} > {pid_file}.tmp && mv {pid_file}.tmp {pid_file}; exec sleep 300",
    )
    await _dies_with_the_runner(proc, pid_file, "the helper in a group of its own", grouped=True)


async def test_a_cancelled_call_ends_its_command_and_the_helpers_in_its_session(tmp_path):
    """A call cancelled while its command runs (an activity cancelled, a worker shutting down) ends the
    command and what it left in a group of its own, cancelled again while it does so: the session is found
    and killed on a thread, shielded from the cancellation."""
    pid_file = tmp_path / "helper.pid"
    call = asyncio.ensure_future(
        run_process(
            ["sh", "-c", f"{_GROUPED} > {pid_file}.tmp && mv {pid_file}.tmp {pid_file}; exec sleep 300"],
            cwd=str(tmp_path),
            timeout=600,
            max_output=1000,
        )
    )

    async def started() -> bool:
        return pid_file.exists()

    await wait_for(started, what="the command to start its helper", timeout=30)
    helper = int(pid_file.read_text())
    try:
        call.cancel()
        await asyncio.sleep(0)
        call.cancel()  # (again, while the call ends what it started)
        with pytest.raises(asyncio.CancelledError):
            await call
        await wait_for(lambda: _dead(helper), what="the helper to end with the cancelled call", timeout=10)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(helper, signal.SIGKILL)


def _session_sleeper() -> int:
    import subprocess

    return subprocess.Popen(["sleep", "300"], start_new_session=True).pid


async def test_the_keeper_is_started_again_if_it_dies_and_kills_every_group_still_named():
    """The keeper (kiwi/keeper.py) kills the groups it was told of when its input ends (Kiwi's process gone).
    Killed itself, it is started again with the next group and told of every group still running; a group
    Kiwi released is not killed."""
    keeper = Keeper()
    first, released, second = _session_sleeper(), _session_sleeper(), _session_sleeper()
    try:
        keeper.keep(first)
        keeper.keep(released)
        keeper.release(released)
        killed = keeper._process
        killed.kill()
        killed.wait()
        keeper.keep(second)
        assert keeper._process is not killed and keeper._process.poll() is None
        keeper._process.stdin.close()  # (as when this process dies: the pipe's only writer is gone)
        keeper._process.wait(10)
        for pid in (first, second):
            await wait_for(lambda pid=pid: _dead(pid), what=f"group {pid} to be killed", timeout=10)
        assert not await _dead(released)
    finally:
        for pid in (first, released, second):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)


async def _dead(pid: int) -> bool:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # (reaped if it is ours, so a killed child does not linger as a zombie)
    return not _alive(pid)


# While set, each child the interpreter forks and runs Python in writes its pid to this file.
_MARK: list[Path] = []


def _python_ran_in_a_child() -> None:
    if _MARK:
        with open(_MARK[0], "a") as f:
            f.write(f"{os.getpid()}\n")


os.register_at_fork(after_in_child=_python_ran_in_a_child)


async def test_no_python_runs_between_fork_and_exec_in_a_process_kiwi_starts(runs, project, tmp_path):
    """CPython runs Python in a forked child only for a ``preexec_fn`` (its after-fork hooks, then the
    function). In the threaded worker such a child can wait forever on a runtime lock another thread held at
    the fork (CPython 3.11, gh-112275): seen in CI, a child stuck before its MCP server started, and the
    worker's event loop stuck waiting for it. Every process Kiwi starts now goes through the launcher
    (kiwi/launch.py): a hook run in each child the interpreter forks is never called, for a shell.run
    through the real stack, a local command, and an MCP server; what the launcher asks still holds (the
    parent-death signal: the tests above; the confinement: tests/test_confinement.py)."""
    from kiwi.upstream.stdio import StdioLink
    from tests.test_attack_shell import agent_run, shell

    marks = tmp_path / "forked"
    run_id = await agent_run(
        runs,
        project,
        "forks",
        '<read resource="filesystem" path="**"/><execute resource="shell" commands="ls"/>',
    )
    _MARK.append(marks)
    try:
        listed = await shell(runs, run_id, "ls", "-a")
        local = await run_process(["true"], cwd=str(tmp_path), timeout=30, max_output=100)
        link = StdioLink(sys.executable, ["-c", "import sys; sys.stdin.read()"])
        async with link.streams():
            server = link.pid
    finally:
        _MARK.clear()
    assert listed.status == "ok" and ".ai" in listed.result["stdout"].split(), listed
    assert local.exit_code == 0 and server is not None
    assert not marks.exists(), f"Python ran in forked children: {marks.read_text()}"


async def _launched(launch, cwd: Path) -> int:
    """Start ``launch`` as Kiwi does and wait until its program runs (raising why not); its exit code."""
    proc = await asyncio.create_subprocess_exec(*launch.argv, cwd=cwd, env=launch.env, pass_fds=launch.fds)
    launch.spawned()
    try:
        await launch.started()
    finally:
        code = await proc.wait()
    return code


async def test_the_launcher_never_runs_a_program_it_could_not_ready(tmp_path):
    """What the launcher cannot do before the program (here a ruleset that is no Landlock ruleset) stops it
    before the program runs: the worker is told why, and the program never ran unconfined. A program that
    cannot be executed is told apart from one that is not there, as a direct start would tell them."""
    from kiwi import landlock
    from kiwi.lifetime import Launch, NotLaunched

    made = tmp_path / "ran"
    argv = ["/usr/bin/touch", str(made)]
    assert await _launched(Launch(argv[0], argv, {}), tmp_path) == 0 and made.exists()  # (it works)
    made.unlink()

    not_a_ruleset, other = os.pipe()
    try:
        confinement = landlock.Ruleset(not_a_ruleset).confinement()
        landlock_absent = landlock.abi_version() == 0
        with pytest.raises(NotLaunched, match="Landlock restriction" if not landlock_absent else ""):
            await _launched(Launch(argv[0], argv, {}, confinement=confinement), tmp_path)
    finally:
        os.close(other)
    assert not made.exists()

    # A launcher that ends before the program (here: it finds its worker gone, and kills itself) is no
    # program that ran and was killed (review s27).
    orphaned = Launch(argv[0], argv, {})
    spec = marshal.loads(os.pread(orphaned.fds[0], 1 << 20, 0))
    os.pwrite(orphaned.fds[0], marshal.dumps({**spec, "parent": 1}), 0)
    with pytest.raises(NotLaunched, match="ended before the program started"):
        await _launched(orphaned, tmp_path)
    assert not made.exists()

    plain = tmp_path / "plain"
    plain.write_text("#!/bin/sh\ntouch ran\n")
    with pytest.raises(PermissionError):
        await _launched(Launch(str(plain), [str(plain)], {}), tmp_path)
    with pytest.raises(FileNotFoundError):
        await _launched(Launch("kiwi-no-such-program", ["x"], {"PATH": str(tmp_path)}, search=True), tmp_path)
    for program, says in ((str(plain), "not executable"), (str(tmp_path / "gone"), "command not found")):
        with pytest.raises(ApplicationError, match=says):
            await run_process([program], cwd=str(tmp_path), timeout=30, max_output=100)
    assert not (tmp_path / "ran").exists() and not made.exists()


async def test_an_argument_that_is_not_text_fails_the_call_and_leaks_nothing(tmp_path):
    """A lone surrogate (which a JSON tool call can carry) cannot be given to a program. It failed with a
    raw UnicodeEncodeError after the launcher's pipe was made, leaking two descriptors a call (review s27:
    150 calls, 300 descriptors): the call now fails, naming why, and nothing is left open."""
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(20):
        with pytest.raises(ApplicationError, match="not text a program can take"):
            await run_process(["echo", "\ud800"], cwd=str(tmp_path), timeout=30, max_output=100)
    assert len(os.listdir("/proc/self/fd")) <= before + 1


def test_the_launcher_runs_nothing_a_project_could_hold():
    """The launcher runs before a command is confined. Started as `python kiwi/launch.py` from a virtual
    environment, it read Kiwi's file and the environment's pyvenv.cfg at each start: a command allowed to
    write a project holding Kiwi's checkout or environment rewrote either, and the next command's launcher
    ran the agent's code unconfined, as the worker's user (review s27). Its code is now read once, when the
    worker starts, and it runs on the base interpreter, with no argument naming a file."""
    from kiwi import lifetime
    from kiwi.lifetime import Launch

    launch = Launch("/bin/true", ["true"], {})
    try:
        interpreter, *args = launch.argv
        assert interpreter == lifetime.INTERPRETER and args[:3] == ["-I", "-S", "-c"]
        assert args[3] == (REPO / "kiwi" / "launch.py").read_text()
        assert not [a for a in args[4:] if not a.isdigit()]
        if sys.prefix != sys.base_prefix:  # (a virtual environment's interpreter reads its pyvenv.cfg)
            assert not Path(interpreter).resolve().is_relative_to(Path(sys.prefix).resolve())
    finally:
        launch.close()
