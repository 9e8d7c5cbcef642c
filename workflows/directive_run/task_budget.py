"""What one workflow task sends Temporal, kept under what Temporal takes.

A workflow task's completion is one gRPC message, and Temporal takes at most 4 MB of it: past that the
run is ended. A run's task carries, for each agent call, the call's arguments (the update's acceptance),
its answer as a local activity's marker, and the answer again as the update's completion. One
batch's answers are bounded (``MAX_ANSWER_BYTES``), but two batches, or one with large arguments, were
not: their task passed 4 MB and the run was ended.

``TaskBudget`` counts what the current task carries (a task is known by the history length it started
at, the same on replay) and keeps it under ``TASK_BYTES``:

- a local activity on the call path (an MCP call or batch, reads, kiwi-mcp.search/load) is started only
  while its largest answer still fits (``local_slot``), and holds that much until it answers (``settle``):
  past that, it waits until a running one answers (in the same task) or the task ends;
- an answer is handed back (the update's completion) only when it fits; else it waits for the next task
  (``room``: a 1 ms timer ends this one).

Sizes are JSON lengths, what the payloads hold; ``TASK_BYTES`` leaves the rest of the 4 MB for what
frames them and for the task's other commands.
"""

from __future__ import annotations

from typing import Any

from temporalio import workflow

from workflows.directive_run.options import CONTINUE_COMMIT_TIMER, TASK_BYTES

with workflow.unsafe.imports_passed_through():
    from kiwi.contracts import MAX_ANSWER_BYTES
    from kiwi.guards import JSON_TEXT


class TaskBudget:
    def __init__(self) -> None:
        self.task = -1
        self.carried = 0  # bytes the current task's completion carries so far
        self.reserved = 0  # the largest answers of the local activities still running

    def _carried(self) -> int:
        task = workflow.info().get_current_history_length()
        if task != self.task:
            self.task, self.carried = task, 0
        return self.carried

    def spend(self, size: int) -> None:
        """``size`` bytes go out with the current task (arguments accepted, an answer)."""
        self._carried()
        self.carried += size

    def fits(self, size: int) -> bool:
        return self._carried() + self.reserved + size <= TASK_BYTES

    def local_room(self) -> bool:
        """Whether a local activity's largest answer still fits beside what the task carries."""
        return self.fits(MAX_ANSWER_BYTES)

    async def local_slot(self) -> None:
        """Wait until a local activity's largest answer fits, then hold that room (``settle`` frees it).
        While local activities run, the first to answer may make room in this very task; with none running,
        a full task makes room only by ending (a 1 ms timer) so that the next one begins empty."""
        while not self.local_room():
            if self.reserved:
                await workflow.wait_condition(lambda: self.local_room() or not self.reserved)
            else:
                await workflow.sleep(CONTINUE_COMMIT_TIMER)
        self.reserved += MAX_ANSWER_BYTES

    def settle(self, size: int) -> None:
        """A local activity answered with ``size`` bytes (its marker is in the current task), or failed (0)."""
        self.reserved -= MAX_ANSWER_BYTES
        self.spend(size)

    async def room(self, size: int) -> None:
        """Wait until ``size`` more bytes fit in a task, then count them there."""
        while not self.fits(size) and (self._carried() or self.reserved):  # (alone, it goes as it is)
            await workflow.sleep(CONTINUE_COMMIT_TIMER)
        self.spend(size)


def json_bytes(value: Any) -> int:
    """The JSON length of ``value`` (non-ASCII spelled out as escapes: never less than its payload)."""
    return len(JSON_TEXT.encode(value))
