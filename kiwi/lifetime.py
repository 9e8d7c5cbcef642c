"""Processes Kiwi starts die with the Kiwi process that started them, even one killed with ``kill -9``.

Kiwi starts MCP servers, shell commands and local tools in sessions of their own (so it can stop each
one's whole process tree), which also takes them out of the worker's process group: a worker killed with
``kill -9`` could not stop them. A server stuck in a call never read the end of its input and stayed
behind for good; a command kept running while Temporal retried its activity on another worker, so it ran
twice at once. Two things stop them now:

- on Linux the kernel sends the process Kiwi starts SIGKILL when the thread that started it ends
  (:func:`dies_with_parent`; the kernel clears that request in every process it forks);
- the keeper (``kiwi/keeper.py``), one small process per Kiwi process, started with the first group it
  is told of, is told of every process group Kiwi starts (:func:`kept`) and kills those still running when
  Kiwi's end of its pipe closes. That covers what the started process starts in its group: a server behind
  a launcher that does not exec it (``npx``, ``uv run``, a shell script) and a command's own children.

A process that leaves its group (``setsid``, a daemon's double fork) is out of reach of both.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

_PR_SET_PDEATHSIG = 1


def dies_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` for a child process: it asks the kernel to SIGKILL the child when the thread that
    starts it ends, and kills itself if this process died before the request took effect. None where the
    kernel has no such request (not Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved here: the child only calls it
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def die_with_parent() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)

    return die_with_parent


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


@contextlib.contextmanager
def kept(group: int) -> Iterator[None]:
    """While inside, the process group ``group`` (a process Kiwi started in a session of its own) is killed
    if this process dies. On the way out the group is killed (what the process left running in it ends
    with it) and the keeper forgets it. (The leader may have been reaped by then: its group's id stays
    taken while a member lives, and a free id is given out again only after the system's pids wrap
    around, not in the moment between the leader's end and this kill.)"""
    _KEEPER.keep(group)
    try:
        yield
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGKILL)
        _KEEPER.release(group)
