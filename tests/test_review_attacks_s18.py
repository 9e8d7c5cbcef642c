"""Session 18: attacks on limits a run had no default for. Each test is the attack against the real stack
(a Temporal dev server, a real worker); it fails while the hole is open."""

from __future__ import annotations

from kiwi.contracts import RunLimits
from tests.helpers import directive_md, wait_for, write_directive
from tests.test_kiwi_mcp_tools import agent_run, kiwi_directive

FORK = '<execute resource="tool" id="directive.run"/><write resource="filesystem" path="notes/**"/>'
QUICK_CHILD = (
    '<step name="write"><tool_call tool="filesystem.write"><param name="path">notes/child.txt</param>'
    '<param name="content">from the child</param></tool_call></step>'
)


async def test_attack_a_run_starts_child_runs_without_end_when_the_harness_names_no_limit(runs, project):
    """Attack: the project's harness sets no limit on directive.run (kiwi init's file did not); a directive
    that may start child runs, its children too, let the agent start runs without end, each a workflow on
    the server and the worker. Safe: directive.run has a default per-run limit (20); a child it starts may
    use half of what is left, so the tree of runs stays bounded however deep the agent goes. On the way: a
    child that made no call of a limited pattern gave back none of the half held for it (its missing count
    read as all used), so a run could start only 4 children one after another under a limit of 20."""
    default = RunLimits().rate_limits["directive.run"]
    assert default == 20
    kiwi_directive(project, "fork", FORK)
    write_directive(
        project / ".ai" / "directives" / "quick.md",
        directive_md(
            QUICK_CHILD,
            name="quick",
            inputs='<input name="n" type="integer"/>',  # (each call differs: loop detection stays quiet)
            permissions='<write resource="filesystem" path="notes/**"/>',
        ),
    )
    run_id = await agent_run(runs, "fork")
    # The first child is another fork the agent drives: it gets half (rounded up) of the 19 left.
    child = await runs.call_tool(run_id, "directive.run", {"directive": "fork"})
    assert child.status == "ok", child
    child_id = child.result["run_id"]
    await wait_for(lambda: _awaiting(runs, child_id), what="the child run to wait for the agent")
    for index in range(10):
        await _start_quick(runs, child_id, index)
    refused = await runs.call_tool(child_id, "directive.run", {"directive": "quick", "inputs": {"n": 10}})
    assert refused.status == "rate_limited", f"the child started an 11th run of its own: {refused}"
    assert "rate limit for directive.run is 10 calls per run" in refused.reason, refused.reason
    # The parent keeps the other 9 while the child runs.
    for index in range(9):
        await _start_quick(runs, run_id, index)
    refused = await runs.call_tool(run_id, "directive.run", {"directive": "quick", "inputs": {"n": 9}})
    assert refused.status == "rate_limited", f"the parent started a run past the limit: {refused}"
    assert "directive.run" in refused.reason
    await runs.cancel(run_id)


async def _start_quick(runs, run_id: str, index: int) -> None:
    """One more child run of ``run_id``, waited for until it has ended (a running child holds back half of
    what is left of its parent's limits; its end gives back what it did not use)."""
    started = await runs.call_tool(run_id, "directive.run", {"directive": "quick", "inputs": {"n": index}})
    assert started.status == "ok", (index, started)
    child = started.result["run_id"]

    async def ended():
        return [
            c for c in (await runs.status(run_id)).children if c.run_id == child and c.status == "completed"
        ]

    await wait_for(ended, what=f"child run {child} of {run_id} to end")


async def _awaiting(runs, run_id: str) -> bool:
    return (await runs.status(run_id)).status == "awaiting_agent"
