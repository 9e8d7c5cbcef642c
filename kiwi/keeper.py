"""The keeper: a small process that outlives a Kiwi process to stop the process groups it started.

Run as ``python -I kiwi/keeper.py`` by :class:`kiwi.lifetime.Keeper`, in a session of its own (a kill of the
worker's process group leaves it). It reads lines from its standard input, the only end of a pipe whose
other end only the Kiwi process holds:

- ``+PGID``: a process group Kiwi started (an MCP server, a command), to stop if Kiwi dies;
- ``-PGID``: that group has been stopped by Kiwi itself (its processes are gone).

When the input ends (the Kiwi process exited, however: ``kill -9`` included), the keeper sends SIGKILL to
every group still named, and to every process of the sessions they lead, and exits. The kernel's parent-death signal reaches only the process Kiwi started;
this reaches the processes that one started too (a server behind ``npx`` or ``uv run``, a command's own
children), as long as they stay in its process group.

No import of Kiwi's: it starts in a few milliseconds and holds nothing of the worker's.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys


def main() -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # (a terminal's Ctrl-C is the worker's to handle)
    groups: set[int] = set()
    for line in sys.stdin.buffer:
        sign, digits = line[:1], line[1:].strip()
        if not digits.isdigit():
            continue
        group = int(digits)
        if group <= 1:
            continue  # (never the whole system's or init's group)
        if sign == b"+":
            groups.add(group)
        elif sign == b"-":
            groups.discard(group)
    for group in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGKILL)
    if groups:
        # Each group leads its session: what made a group of its own in it (`timeout`, ninja) goes too.
        for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
            with contextlib.suppress(OSError, ValueError, IndexError), open(f"/proc/{entry}/stat", "rb") as f:
                if entry.isdigit() and int(f.read().rpartition(b")")[2].split()[3]) in groups:
                    os.kill(int(entry), signal.SIGKILL)
    return 0


if __name__ == "__main__":
    sys.exit(main())
