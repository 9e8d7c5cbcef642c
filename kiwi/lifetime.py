"""Processes Kiwi starts die with the Kiwi process that started them, even one killed with ``kill -9``.

Kiwi starts MCP servers, shell commands and local tools in sessions of their own (so it can stop each
one's whole process tree), which also takes them out of the worker's process group: a worker killed with
``kill -9`` could not stop them. A server stuck in a call never read the end of its input and stayed
behind for good; a command kept running while Temporal retried its activity on another worker, so it ran
twice at once. Two things stop them now:

- on Linux the kernel sends the process Kiwi starts SIGKILL when the thread that started it ends (asked
  by the launcher, :class:`Launch`, before it executes the program; the kernel clears that request in
  every process it forks; Kiwi's own short git commands start directly, without it);
- the keeper (``kiwi/keeper.py``), one small process per Kiwi process, started with the first group it
  is told of, is told of every process group Kiwi starts (:func:`kept`) and kills those still running when
  Kiwi's end of its pipe closes. That covers what the started process starts in its group: a server behind
  a launcher that does not exec it (``npx``, ``uv run``, a shell script) and a command's own children.

Both also end every process of the session the started process leads (a helper in a process group of its
own: ``timeout``, ninja). A process that leaves the session (``setsid``, a daemon's double fork) is out of
reach of both; a confined shell command cannot (its seccomp filter refuses ``setsid``).
"""

from __future__ import annotations

import asyncio
import contextlib
import marshal
import os
import signal
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator, Mapping
from pathlib import Path
from typing import Any

# The launcher's code, read once (see kiwi/launch.py), and the interpreter that runs it: the base one of a
# virtual environment (whose pyvenv.cfg names the standard library to load, and may be in a project).
LAUNCHER_CODE = Path(__file__).with_name("launch.py").read_text()
_BASE = getattr(sys, "_base_executable", "") or sys.executable
INTERPRETER = _BASE if os.path.isfile(_BASE) and os.access(_BASE, os.X_OK) else sys.executable


_READY = b"ready\0"  # (what the launcher says just before execve)


class NotLaunched(Exception):
    """The launcher could not ready the program (``kiwi/launch.py``): it did not run. The message says what
    failed: the confinement the kernel refused, or the launcher itself."""


def launches() -> bool:
    """Whether processes start through the launcher: on Linux, where the kernel has a parent-death signal."""
    return sys.platform.startswith("linux")


class Launch:
    """One process started through the launcher (``kiwi/launch.py``), which makes the kernel calls between
    ``fork`` and ``exec`` in a process of its own, so no Python runs in a child of the threaded worker (see
    the launcher's docstring: a ``preexec_fn`` there can wait forever on a lock held at the fork).

    Start :attr:`argv` (with :attr:`env` and ``pass_fds=`` :attr:`fds`, no ``preexec_fn``) inside
    :meth:`spawning`, then await :meth:`started`: it returns once the program runs, and raises what the
    program's ``execve`` raised (FileNotFoundError, PermissionError, ...) or :class:`NotLaunched`. ``search``:
    ``program`` is looked up on ``env``'s PATH, as ``execvp`` does; ``confinement``: what the launcher does
    to confine the program (``landlock.Ruleset.confinement()``), or None."""

    def __init__(
        self,
        program: str,
        argv: list[str],
        env: Mapping[str, str],
        *,
        search: bool = False,
        confinement: dict[str, Any] | None = None,
    ) -> None:
        self.program = program
        self._mine: list[int] = []
        self._status_read = -1
        # (Encoded before any descriptor is made: a value that is not text raises here, leaking nothing.)
        spec: dict[str, Any] = {
            "program": os.fsencode(program),
            "argv": [os.fsencode(a) for a in argv],
            "env": {os.fsencode(k): os.fsencode(v) for k, v in env.items()},
            "search": search,
            "parent": os.getpid(),
            "ruleset": -1,
            **(confinement or {}),
        }
        spec_fd = os.memfd_create("kiwi-launch", os.MFD_CLOEXEC)
        self._mine.append(spec_fd)  # (the child's copies are its own: closed here once it started)
        os.write(spec_fd, marshal.dumps(spec))
        self._status_read, status = os.pipe2(os.O_CLOEXEC)
        self._mine.append(status)
        self.fds = (spec_fd, status) + ((spec["ruleset"],) if spec["ruleset"] >= 0 else ())
        self.argv = [INTERPRETER, "-I", "-S", "-c", LAUNCHER_CODE, str(spec_fd), str(status)]
        self.env: dict[str, str] = {}  # (the launcher needs none; the program gets ``env``)

    @contextlib.contextmanager
    def spawning(self) -> Iterator[None]:
        """Around the start of :attr:`argv`: then this process's copies of the child's descriptors are
        closed (:meth:`spawned`), and the status pipe too if the start failed."""
        try:
            yield
        except BaseException:
            self.close()
            raise
        finally:
            self.spawned()

    def spawned(self) -> None:
        """The launcher has started (or could not): this process's copies of its descriptors are closed."""
        for fd in self._mine:
            os.close(fd)
        self._mine = []

    async def started(self) -> None:
        """Wait until the program runs (the status pipe closed on its ``execve``), or raise why it did not."""
        loop = asyncio.get_running_loop()
        fd, said = self._status_read, b""
        os.set_blocking(fd, False)
        try:
            while True:
                try:
                    chunk = os.read(fd, 4096)
                except BlockingIOError:
                    readable: asyncio.Future[None] = loop.create_future()
                    loop.add_reader(fd, _settle, readable)
                    try:
                        await readable
                    finally:
                        loop.remove_reader(fd)
                    continue
                if not chunk:
                    break
                said += chunk
        finally:
            self.close()
        if said == _READY:
            return
        if not said:
            raise NotLaunched("Kiwi's launcher ended before the program started")
        stage, errno, *rest = said.removeprefix(_READY).decode(errors="replace").split("\0")
        if stage == "exec":
            raise OSError(int(errno), os.strerror(int(errno)), self.program)
        why = rest[0] if rest else os.strerror(int(errno)) if int(errno) else "failed"
        if stage == "launcher":
            raise NotLaunched(f"Kiwi's launcher failed ({why})")
        if stage == "parent-death signal":
            raise NotLaunched(f"the kernel refused the parent-death signal ({why})")
        if stage.startswith("holding ") and int(errno) == 40:  # (ELOOP: a link where a place is held)
            place = stage.removeprefix("holding ").removesuffix(" read-only")
            raise NotLaunched(
                f"'{place}' is a symbolic link, and Kiwi holds that place read-only for the command (the "
                "settings a human's git or kiwi obeys), which it cannot do through a link: a human replaces the "
                f"link with what it leads to, or the grant names the place ({stage}: {why})"
            )
        raise NotLaunched(f"the kernel refused to confine it ({stage}: {why})")

    def close(self) -> None:
        self.spawned()
        if self._status_read >= 0:
            os.close(self._status_read)
            self._status_read = -1

    def __del__(self) -> None:
        with contextlib.suppress(OSError):
            self.close()


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class Keeper:
    """This process's keeper (``kiwi/keeper.py``): told of each process group Kiwi starts, it kills those
    still running when this process ends. Started with the first group; started again if it died."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._groups: set[int] = set()

    def ready(self) -> None:
        """Start the keeper now if none runs, so that telling it of a group just started is one write
        (started on the first group, it came up while that group already ran: a Kiwi process killed then
        left the group behind, as a loaded test host showed)."""
        with self._lock:
            self._send("", again=True)  # (nothing to say; a keeper that is not running is started)

    def keep(self, group: int) -> None:
        with self._lock:
            self._groups.add(group)
            self._send(f"+{group}\n", again=True)

    def release(self, group: int) -> None:
        """``group`` is gone (Kiwi stopped it): the keeper forgets it, so its id, free for the system to
        give another process, is never killed."""
        with self._lock:
            self._groups.discard(group)
            self._send(f"-{group}\n", again=False)

    def _send(self, line: str, *, again: bool) -> None:
        for _ in range(2):
            process = self._process
            if process is None or process.poll() is not None:
                if not again:
                    return  # (a new keeper is told of the groups still running only)
                process = self._process = self._start()
                if process is None:
                    return
                line = "".join(f"+{g}\n" for g in self._groups)
            try:
                assert process.stdin is not None
                process.stdin.write(line.encode())
                process.stdin.flush()
                return
            except (BrokenPipeError, OSError):
                self._process = None

    @staticmethod
    def _start() -> subprocess.Popen[bytes] | None:
        try:
            return subprocess.Popen(
                [sys.executable, "-I", str(Path(__file__).with_name("keeper.py"))],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # (a kill of this process's group leaves the keeper to act)
                close_fds=True,
                env={},  # (it needs nothing of this process's environment)
            )
        except OSError:
            return None


_KEEPER = Keeper()


def keeper_ready() -> None:
    """Call before starting a process :func:`kept` will hold (see :meth:`Keeper.ready`)."""
    _KEEPER.ready()


@contextlib.asynccontextmanager
async def kept(group: int) -> AsyncIterator[None]:
    """While inside, the process group ``group`` (a process Kiwi started in a session of its own) is killed
    if this process dies. On the way out the group and its session are killed (what the process left
    running in them ends with it) and the keeper forgets it. (The leader may have been reaped by then: its group's id stays
    taken while a member lives, and a free id is given out again only after the system's pids wrap
    around, not in the moment between the leader's end and this kill.)"""
    _KEEPER.keep(group)
    try:
        yield
    finally:
        # On a thread: the session's processes are found by reading every process's stat (~1.3 ms with 100
        # processes, more on a busy host), which on the event loop every run of the worker waited for.
        # Shielded: a call cancelled meanwhile still ends what it started before the keeper forgets it.
        await asyncio.shield(asyncio.to_thread(_end, group))


def _end(group: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, signal.SIGKILL)
    kill_session(group)
    _KEEPER.release(group)


def kill_session(session: int) -> None:
    """SIGKILL every process of ``session`` (a process Kiwi started leads it: its id is its pid). What made a
    process group of its own in it (`timeout`, ninja, ``setpgid``) is out of reach of ``killpg``, not of
    this; a confined command cannot leave the session (its seccomp filter refuses ``setsid``). Read from
    ``/proc`` (nothing where there is none)."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        return
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                if int(f.read().rpartition(b")")[2].split()[3]) == session:
                    os.kill(int(entry), signal.SIGKILL)
        except (OSError, ValueError, IndexError):
            continue
