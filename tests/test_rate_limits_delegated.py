"""A call the agent makes through kiwi-mcp.execute is one call under a `*` rate limit, not two.

kiwi-mcp.execute of a tool is admitted as itself (its grant, its own rate limit) and then makes the tool's
call, admitted again; both counted under `*`, so a run allowed `*: 3` calls got one delegated call and
then a refusal for the next. The inner call is the call (as for loop detection): a pattern the execute
counted is not counted again. Against the real stack (tests/test_review_attacks_s9.py's set-up)."""

from __future__ import annotations

from tests.test_kiwi_mcp_tools import agent_run, kiwi_directive
from tests.test_review_attacks_s9 import PARENT, WORD_COUNT, harness


def _count(i: int) -> dict:
    return {"tool_name": "word_count", "parameters": {"text": "a " * (i + 1)}}


async def test_a_delegated_call_counts_once_under_a_star_rate_limit(runs, project):
    harness(project, "rate_limits:\n  '*': 3\n  word_count: 2\n")
    kiwi_directive(project, "limited", PARENT + WORD_COUNT)
    run_id = await agent_run(runs, "limited")
    first, second = [await runs.call_tool(run_id, "kiwi-mcp.execute", _count(i)) for i in range(2)]
    assert (first.status, second.status) == ("ok", "ok"), (first, second)
    # The tool's own limit still holds for the call made through execute...
    third = await runs.call_tool(run_id, "kiwi-mcp.execute", _count(2))
    assert third.status == "rate_limited" and "word_count" in third.reason, third
    # ... and `*` counted each agent call once: the refused one and two delegated ones make three.
    fourth = await runs.call_tool(run_id, "filesystem.list", {"path": "notes"})
    assert fourth.status == "rate_limited" and "rate limit for *" in fourth.reason, fourth
    await runs.cancel(run_id)
