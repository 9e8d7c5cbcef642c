"""Processes Kiwi starts die with the worker that started them, even one killed with ``kill -9``.

Kiwi starts MCP servers, shell commands and local tools in sessions of their own (so it can stop each
one's whole process tree), which also takes them out of the worker's process group: a worker killed with
``kill -9`` could not stop them. A server stuck in a call never read the end of its input and stayed
behind for good; a command kept running while Temporal retried its activity on another worker, so it ran
twice at once. On Linux the kernel now sends the child SIGKILL when the thread that started it ends (the
worker's event loop, for all of them). Elsewhere nothing changes.

Only the process Kiwi starts is covered: the kernel clears the request in every process that one forks, so
a server behind a launcher that does not exec it (npx, uv run, a shell script) or a command's own children
can outlive a killed worker (strict xfails in tests/test_review_attacks_s14.py).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable

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
