"""Run a child process the way every Kiwi activity does: no shell, capped output, heartbeats,
a timeout, and cancellation that kills the whole process group."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass

from opentelemetry import propagate, trace
from temporalio import activity

from kiwi import landlock
from kiwi.errors import CommandNotFound, ToolFailed, ToolTimeout
from kiwi.lifetime import Launch, NotLaunched, keeper_ready, kept, launches
from kiwi.searchpath import search_path, within

HEARTBEAT_SECONDS = 2.0

# What a child inherits from the worker; the rest (API keys, KIWI_*, TEMPORAL_*, GIT_*) stays behind.
INHERITED_ENV = ("PATH", "LANG", "LANGUAGE", "TZ", "TERM", "TMPDIR", "HOME", "USER", "LOGNAME")
# git, whoever runs it (an agent's shell.run or Kiwi's own checkpoint): no system or global config, no
# prompts, no pager, and settings a repository's own .git/config cannot override (command-line
# precedence) that would otherwise make git run a program. Each was checked with git 2.39;
# "diff.external=" is not here because an empty value makes every "git diff" fail ("external diff
# died"): shell.run refuses repositories that configure an external diff (see activities/repochecks.py).
GIT_ENV = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_PAGER": "cat",
    "PAGER": "cat",
    "GIT_EDITOR": "false",
    "GIT_SEQUENCE_EDITOR": "false",
    # git takes no abbreviated option (`git rm --f` is --force to git, and was --format to Kiwi's reading):
    # an abbreviation stops git with an error instead (fourth review s24).
    "GIT_TEST_DISALLOW_ABBREVIATED_OPTIONS": "1",
}
GIT_FORCED_CONFIG = (
    ("core.hooksPath", "/dev/null"),
    ("core.fsmonitor", "false"),
    ("safe.bareRepository", "explicit"),
    ("core.pager", "cat"),
    ("core.editor", "false"),
    ("sequence.editor", "false"),
    ("core.sshCommand", "false"),
    ("protocol.allow", "never"),
    ("credential.helper", ""),
    ("uploadpack.packObjectsHook", ""),
    ("gpg.program", "false"),
    ("gpg.ssh.program", "false"),
    ("gpg.x509.program", "false"),
    # (A merge's default strategy from configuration: any other name runs git-merge-NAME.)
    ("pull.twohead", "ort"),
    ("pull.octopus", "octopus"),
    ("core.askPass", ""),
    # (An automatic gc in the foreground: detached, it outlived the call, and a confined command may not
    # make the session it detaches into.)
    ("gc.autoDetach", "false"),
    ("maintenance.autoDetach", "false"),  # (git 2.47 and newer: it overrides gc.autoDetach)
)


def child_env(
    extra: dict[str, str] | None = None,
    git_config: list[tuple[str, str]] | None = None,
    project: str | None = None,
) -> dict[str, str]:
    """The environment of a child: the allow-listed part of the worker's, what the caller passes, and
    git's hardening last, so neither the caller nor the worker can switch it off. ``project``: PATH leaves out
    the entries in that folder too (review s32, fifth round: the project's `.venv/bin` on the worker's PATH
    found the agent's `bash` for a local tool, and its `false` for git's `gpg.program=false`)."""
    env = {k: v for k, v in os.environ.items() if k in INHERITED_ENV or k.startswith("LC_")}
    env.update({k: v for k, v in (extra or {}).items() if not k.startswith("GIT_CONFIG")})
    if "PATH" in env:
        env["PATH"] = search_path(env["PATH"], project)
    env.update(trace_env())
    env.update(GIT_ENV)
    pairs = [*GIT_FORCED_CONFIG, *(git_config or [])]
    env["GIT_CONFIG_COUNT"] = str(len(pairs))
    for index, (key, value) in enumerate(pairs):
        env[f"GIT_CONFIG_KEY_{index}"] = key
        env[f"GIT_CONFIG_VALUE_{index}"] = value
    return env


def kiwi_git(root: str) -> str:
    """The git Kiwi runs itself (its checkpoints, its checks, its reading of git's settings), as an absolute
    path: the first on kiwi.searchpath's PATH for the project at ``root`` that is no file of it (review s32,
    fourth round: a relative entry, or the project's `.venv/bin` activated before `kiwi dev`, found the agent's
    `git`, which Kiwi ran at its next write). "git" when there is none at all (starting it then fails as it
    did); ToolFailed when the only one is a project's."""
    real_root = os.path.realpath(root)
    path = os.environ.get("PATH", os.defpath)
    for entry in search_path(path, root).split(os.pathsep):
        candidate = os.path.join(entry, "git")
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            real = os.path.realpath(candidate)  # (a link to a file of the project is one)
            if not within(real, real_root):
                return real
    if shutil.which("git", path=path):
        raise ToolFailed.error(
            "the only git on the worker's PATH is a file of the project (one an agent may write): Kiwi runs none; "
            "install git where the worker runs, outside the project"
        )
    return "git"


def project_of(cwd: str) -> str:
    """The Kiwi project ``cwd`` is in, for a caller that does not say: the nearest folder holding `.ai` but the
    home folder (``cwd`` itself when there is none)."""
    folder = os.path.realpath(cwd)
    home = os.path.realpath(os.path.expanduser("~"))
    while True:
        if os.path.isdir(os.path.join(folder, ".ai")) and folder != home:  # (`~/.ai`: the user space)
            return folder
        parent = os.path.dirname(folder)
        if parent == folder:
            return os.path.realpath(cwd)
        folder = parent


def trace_env() -> dict[str, str]:
    """The current trace as ``TRACEPARENT`` / ``TRACESTATE`` (OpenTelemetry's convention for a child
    process), so a tool that traces continues the call's trace; {} when tracing is off."""
    if not trace.get_current_span().get_span_context().is_valid:
        return {}
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return {k.upper(): v for k, v in carrier.items() if k in ("traceparent", "tracestate")}


@dataclass
class ProcessResult:
    exit_code: int
    stdout: str
    stderr: str
    truncated: bool


def remove_tree(top: str) -> None:
    """Remove the folder ``top`` and all below it, never following a link, and never raising: a folder a
    command made unwritable (`chmod 500 a`) is made writable first, as ``TemporaryDirectory`` does; a tree
    too deep for Python's recursion, or for the worker's open files, goes with rm (review s26)."""

    def writable(function: Callable[..., object], path: str, _: object) -> None:
        with contextlib.suppress(OSError):
            if (
                os.geteuid() != 0
            ):  # (root needs no mode to remove; a folder swapped for a link is not chmod-ed)
                folder = os.path.dirname(path)
                if path != top and not os.path.islink(folder):
                    os.chmod(folder, 0o700)
                if os.path.isdir(path) and not os.path.islink(path):
                    os.chmod(path, 0o700)
            function(path)

    with contextlib.suppress(RecursionError, OSError):
        shutil.rmtree(top, onerror=writable)
    if os.path.lexists(top):
        for rm in ("/usr/bin/rm", "/bin/rm"):
            if os.path.exists(rm):
                with contextlib.suppress(OSError, subprocess.SubprocessError):
                    subprocess.run([rm, "-rf", "--", top], check=False, capture_output=True, timeout=300)
                break


async def _communicate(
    proc: asyncio.subprocess.Process, stdin: bytes, max_output: int
) -> tuple[bytes, bytes]:
    """``proc.communicate(stdin)`` keeping at most ``max_output`` + 1 bytes of each stream (the rest read and
    dropped, so the program is never blocked on a full pipe): `yes` held 7 GB of the worker's memory before
    its timeout cut it to ``max_output`` (review s26)."""

    async def feed() -> None:
        assert proc.stdin is not None
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            if stdin:
                proc.stdin.write(stdin)
                await proc.stdin.drain()
            proc.stdin.close()

    async def collect(stream: asyncio.StreamReader | None) -> bytes:
        held = bytearray()
        while stream is not None and (chunk := await stream.read(1 << 16)):
            if len(held) <= max_output:
                held += chunk[: max_output + 1 - len(held)]
        return bytes(held)

    _, out, err = await asyncio.gather(feed(), collect(proc.stdout), collect(proc.stderr))
    await proc.wait()
    return out, err


def _not_started(name: str, exc: OSError) -> Exception:
    """Why the program's ``execve`` failed, as the agent sees it."""
    if isinstance(exc, FileNotFoundError):
        return CommandNotFound.error(f"command not found: {name}")
    if isinstance(exc, PermissionError) or exc.errno == errno.ENOEXEC:
        return CommandNotFound.error(f"not executable: {name}")
    return ToolFailed.error(f"{name} did not start: {exc.strerror}")


async def _wait(
    task: asyncio.Future[object], proc: asyncio.subprocess.Process, deadline: float, name: str, timeout: float
) -> None:
    """Wait for ``task`` until ``deadline``, heartbeating; past it, or cancelled, the process group is
    killed (and ``task`` given up on past it: ToolTimeout)."""
    loop = asyncio.get_running_loop()
    try:
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                _kill_group(proc)
                # (A process that left the group may hold the output open: the call ends all the same.)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(asyncio.shield(task), HEARTBEAT_SECONDS)
                if not task.done():
                    task.cancel()
                    # (Its pipes too: asyncio's Process gives no public way; the transport is the one held.)
                    if (transport := getattr(proc, "_transport", None)) is not None:
                        transport.close()
                raise ToolTimeout.error(f"{name} timed out after {timeout:g}s")
            done, _ = await asyncio.wait({task}, timeout=min(HEARTBEAT_SECONDS, remaining))
            if done:
                return
            if activity.in_activity():
                activity.heartbeat()
    except asyncio.CancelledError:
        _kill_group(proc)
        raise


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


async def run_process(
    argv: list[str],
    *,
    cwd: str,
    timeout: float,
    max_output: int,
    stdin: str = "",
    env: dict[str, str] | None = None,
    git_config: list[tuple[str, str]] | None = None,
    confine: tuple[int, Callable[[str, str], landlock.Rules]] | None = None,
    direct: bool = False,
    project: str | None = None,
) -> ProcessResult:
    """Run ``argv`` in ``cwd`` with a scrubbed environment (``child_env``) plus ``env``.

    ``confine``: (Landlock ABI, the rules for (the program's absolute path, its own temporary folder)); the
    program then runs confined to them (``activities/confinement.py``), with ``TMPDIR`` that folder.
    ``direct``: Kiwi's own short git, started without the launcher (which costs ~9 ms a start, and a shell
    `git` call makes four of them before the command): the keeper alone ends it with a worker killed by
    ``kill -9``. ``project``: the project's folder (by default the nearest above ``cwd`` holding `.ai`), none of
    whose programs is found on PATH (child_env, kiwi_git)."""
    assert not (direct and confine), "a confined program starts through the launcher"
    project = project or project_of(cwd)
    if direct and argv[:1] == ["git"]:
        argv = [kiwi_git(project), *argv[1:]]
    if confine is None:
        return await _run(
            argv, cwd, timeout, max_output, stdin, child_env(env, git_config, project), None, direct
        )
    temp = tempfile.mkdtemp(prefix="kiwi-cmd-")
    try:
        environment = {**child_env(env, git_config, project), "TMPDIR": temp}
        return await _run(argv, cwd, timeout, max_output, stdin, environment, (confine[0], confine[1], temp))
    finally:
        remove_tree(temp)  # (what the command left there, however deep)


async def _run(
    argv: list[str],
    cwd: str,
    timeout: float,
    max_output: int,
    stdin: str,
    environment: dict[str, str],
    confine: tuple[int, Callable[[str, str], landlock.Rules], str] | None,
    direct: bool = False,
) -> ProcessResult:
    program = argv[0]
    if os.sep not in program:
        # Found on the absolute entries of PATH before the command starts, never from its folder.
        found = shutil.which(program, path=environment.get("PATH", os.defpath))
        if found is None:
            raise CommandNotFound.error(f"command not found: {program}")
        program = found
    ruleset = launch = None
    try:
        if confine is not None:
            abi, rules, temp = confine
            try:
                # (On a thread: a root of many entries takes a rule each; the event loop serves every run.)
                ruleset = await asyncio.to_thread(
                    lambda: rules(os.path.join(cwd, program), temp).ruleset(abi)
                )
            except (OSError, ValueError) as exc:
                why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
                raise ToolFailed.error(
                    f"{argv[0]} did not start: its confinement could not be set up ({why})"
                ) from None
        if not os.path.isdir(cwd):
            raise ToolFailed.error(f"{argv[0]} did not start: its working folder does not exist")
        # Through the launcher (kiwi/lifetime.py): it dies with a worker killed by kill -9, and no Python
        # runs between fork and exec in this threaded process.
        if launches() and not direct:
            try:
                launch = Launch(
                    program, argv, environment, confinement=ruleset.confinement() if ruleset else None
                )
            except UnicodeError:
                raise ToolFailed.error(
                    f"{argv[0]} did not start: an argument or environment value is not text a program can take"
                ) from None
        keeper_ready()
        with launch.spawning() if launch else contextlib.nullcontext():
            try:
                proc = await asyncio.create_subprocess_exec(
                    *(launch.argv if launch else argv),
                    executable=None if launch else program,  # (argv[0] stays as given: a program may read it)
                    cwd=cwd,
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.PIPE,
                    start_new_session=True,
                    env=launch.env if launch else environment,
                    pass_fds=launch.fds if launch else (),
                )
            except ValueError as exc:  # (a NUL in an argument or in the environment)
                raise ToolFailed.error(f"{argv[0]} did not start: {exc}") from None
            except OSError as exc:
                if launch is not None:
                    raise ToolFailed.error(
                        f"{argv[0]} did not start: Kiwi's launcher did not ({exc})"
                    ) from None
                raise _not_started(argv[0], exc) from None
    finally:
        if ruleset is not None:
            ruleset.close()
    async with kept(proc.pid):  # (its own children die with it, and with a worker killed by kill -9)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        if launch is not None:
            begun = asyncio.ensure_future(launch.started())
            try:
                await _wait(begun, proc, deadline, argv[0], timeout)
                begun.result()
            except OSError as exc:
                await proc.wait()
                raise _not_started(argv[0], exc) from None
            except NotLaunched as exc:
                await proc.wait()
                raise ToolFailed.error(f"{argv[0]} did not start: {exc}") from None
        communicate = asyncio.ensure_future(_communicate(proc, stdin.encode(), max_output))
        await _wait(communicate, proc, deadline, argv[0], timeout)
    stdout, stderr = communicate.result()
    truncated = len(stdout) > max_output or len(stderr) > max_output
    return ProcessResult(
        proc.returncode if proc.returncode is not None else -1,
        stdout[:max_output].decode("utf-8", "replace"),
        stderr[:max_output].decode("utf-8", "replace"),
        truncated,
    )
