"""A bound step's call results are held by the run and travel with it (its result, a continue-as-new's
input), and Temporal takes at most 2 MB of either: they are bounded as an agent's step outputs are.

Before: an automatic step reading two 1 MB files held 4 MB (each result, the step's `results`, and the
last again as `result`); the run could never complete: its workflow task failed over and over
(PayloadsTooLarge) and the run stayed open. Now the step fails with an error that says what to do."""

from __future__ import annotations

import asyncio

import pytest
from temporalio.client import WorkflowFailureError

from tests.helpers import write
from tests.test_kiwi_mcp_tools import kiwi_directive

READS = '<read resource="filesystem" path="notes/**"/>'


def _reads(*paths: str) -> str:
    calls = "".join(
        f'<tool_call tool="filesystem.read"><param name="path">{p}</param></tool_call>' for p in paths
    )
    return f'<step name="read">{calls}</step>'


async def test_bound_reads_past_what_a_run_holds_fail_the_step_not_the_run(runs, project):
    write(project / "notes" / "a.md", "a" * 1_000_000)
    write(project / "notes" / "b.md", "b" * 1_000_000)
    kiwi_directive(project, "reader", READS, _reads("notes/a.md", "notes/b.md"))
    run_id = await runs.start("reader", {})
    with pytest.raises(WorkflowFailureError) as failed:
        await asyncio.wait_for(runs.handle(run_id).result(), 60)
    cause = failed.value.cause
    assert cause.type == "StepFailed", cause
    assert "step 'read': with filesystem.read's result" in cause.message, cause.message
    assert "a run holds at most 1,000,000" in cause.message and "max_bytes" in cause.message
    assert (await runs.status(run_id)).status == "failed"


async def test_a_bound_read_within_what_a_run_holds_is_the_step_output(runs, project):
    write(project / "notes" / "a.md", "a" * 300_000)
    kiwi_directive(project, "reader", READS, _reads("notes/a.md"))
    run_id = await runs.start("reader", {})
    result = await asyncio.wait_for(runs.handle(run_id).result(), 60)
    outputs = result.outputs["read"]
    assert outputs["result"]["content"] == "a" * 300_000
    assert [r["content"] for r in outputs["results"]] == ["a" * 300_000]
