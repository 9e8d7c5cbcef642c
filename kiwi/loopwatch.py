"""A worker's event loop that stops turning is said in its log, with the code it is stuck in.

Kiwi's worker runs its workflow tasks on its event loop (see ``workers.main.build_worker``), where the
Temporal SDK's deadlock detection (a workflow task still running after 2 s on its thread fails) does not
apply. This watch stands in for it: a thread that sees the loop not turning for ``threshold`` seconds logs
an error with the loop thread's stack, and a warning with the time it was stuck once it turns again.
Neither can end the stuck code; the log says where it is.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import threading
import time
import traceback
from collections.abc import AsyncIterator

logger = logging.getLogger("kiwi.loopwatch")

# The SDK's deadlock timeout for a workflow task on its own thread.
STALL_SECONDS = 2.0


class LoopWatch:
    """Watches the running loop from a thread of its own (see the module's docstring)."""

    def __init__(self, threshold: float = STALL_SECONDS) -> None:
        self.threshold = threshold
        self.beat = 0.0  # (when the loop last turned; set by watching())
        self._stop = threading.Event()
        self._loop_thread = 0

    async def _beating(self) -> None:
        while True:
            self.beat = time.monotonic()
            await asyncio.sleep(self.threshold / 4)

    def _watch(self) -> None:
        stalled_since: float | None = None
        while not self._stop.wait(self.threshold / 8):
            late = time.monotonic() - self.beat
            if stalled_since is None and late > self.threshold:
                stalled_since = self.beat
                frame = sys._current_frames().get(self._loop_thread)
                stack = "".join(traceback.format_stack(frame)) if frame is not None else "(no stack)"
                logger.error(
                    "the worker's event loop has not turned for %.1fs (workflow tasks, activities and "
                    "polling all wait on it); it is running:\n%s",
                    late,
                    stack,
                )
            elif stalled_since is not None and late <= self.threshold:
                logger.warning(
                    "the worker's event loop turns again after %.1fs",
                    self.beat - stalled_since,
                )
                stalled_since = None

    @contextlib.asynccontextmanager
    async def watching(self) -> AsyncIterator[None]:
        """Watch the running loop while the block runs."""
        self._loop_thread = threading.get_ident()
        self.beat = time.monotonic()
        beating = asyncio.create_task(self._beating())
        watcher = threading.Thread(target=self._watch, name="kiwi-loopwatch", daemon=True)
        watcher.start()
        try:
            yield
        finally:
            self._stop.set()
            beating.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beating
            watcher.join()
