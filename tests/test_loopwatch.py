"""Workflow tasks on the worker's event loop (workers.main.build_worker) and the watch that stands in for the
SDK's deadlock detection there (kiwi.loopwatch)."""

from __future__ import annotations

import asyncio
import logging
import threading

from kiwi.loopwatch import LoopWatch
from workers.main import build_worker


class _Said(logging.Handler):
    """The watch's log records, and an event set at the first error (the stall report)."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []
        self.reported = threading.Event()
        self.resumed = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        if record.levelno >= logging.ERROR:
            self.reported.set()
        elif record.levelno == logging.WARNING:
            self.resumed.set()


def stuck_workflow_code(reported: threading.Event) -> bool:
    """Code that holds the loop until the watch has said so (at most a minute)."""
    return reported.wait(60)


async def test_a_loop_held_by_stuck_code_is_logged_with_its_stack_and_again_when_it_turns():
    said = _Said()
    logger = logging.getLogger("kiwi.loopwatch")
    logger.addHandler(said)
    try:
        async with LoopWatch(threshold=0.2).watching():
            await asyncio.sleep(0)  # (the watch's beat has run once)
            assert stuck_workflow_code(said.reported), "the watch never reported the stuck loop"
            # The loop turns again: the watch says so once it sees the beat.
            assert await asyncio.to_thread(said.resumed.wait, 60), "the watch never saw the loop turn again"
    finally:
        logger.removeHandler(said)
    error = next(r for r in said.records if r.levelno == logging.ERROR)
    text = error.getMessage()
    assert "the worker's event loop has not turned for" in text
    assert "stuck_workflow_code" in text  # the stack names the code it is stuck in
    resumed = next(r for r in said.records if r.levelno == logging.WARNING).getMessage()
    assert "turns again after" in resumed
    assert sum(r.levelno == logging.ERROR for r in said.records) == 1  # one stall, one report


async def test_workflow_tasks_run_on_the_loop_unless_threaded_or_sandboxed(temporal_env):
    temporal_client = temporal_env.client
    assert build_worker(temporal_client, "q-inline").config()["debug_mode"] is True
    assert build_worker(temporal_client, "q-threaded", threaded=True).config()["debug_mode"] is False
    assert build_worker(temporal_client, "q-sandboxed", sandboxed=True).config()["debug_mode"] is False
