"""A child run the agent starts shares its parent's rate budget without taking all of it (BUDGET_HALVED).

Parent and children together stay within every limit (tests/test_attack_escapes.py holds them to it);
these are about the parent that goes on working while its child runs."""

from __future__ import annotations

from tests.helpers import directive_md, wait_for, write, write_directive
from tests.test_child_runs import _waiting

PARENT = '<write resource="filesystem" path="notes/**"/><execute resource="tool" id="directive.run"/>'
WRITES = '<write resource="filesystem" path="notes/**"/>'


async def test_a_parent_goes_on_writing_while_the_child_it_started_runs(runs, project):
    """The child was given all that was left of each per-run limit, so the parent's own next write was
    refused ("rate limit for filesystem.write is 100 calls per run" after one write) until the child ended.
    Now the child holds half of what is left and the parent keeps the other half."""
    _parent_and_kid(project, "9")
    run_id = await runs.start("parent", {})
    await wait_for(lambda: _waiting(runs, run_id), what="the parent to wait for its agent")
    assert (
        await runs.call_tool(run_id, "filesystem.write", {"path": "notes/p0", "content": "x"})
    ).status == "ok"
    kid = (await runs.call_tool(run_id, "directive.run", {"directive": "kid"})).result["run_id"]
    await wait_for(lambda: _waiting(runs, kid), what="the child to wait for its agent")
    # 8 writes were left: the child holds 4 of them, the parent keeps 4.
    parent = await _writes(runs, run_id, "q", 5)
    child = await _writes(runs, kid, "k", 5)
    assert parent == ["ok"] * 4 + ["rate_limited"], parent
    assert child == ["ok"] * 4 + ["rate_limited"], child
    assert len(list((project / "notes").iterdir())) == 9  # the limit, parent and child together
    await runs.cancel(kid)
    await runs.cancel(run_id)


async def test_a_finished_childs_calls_count_in_its_parents_window(runs, project):
    """Hostile review s38, third round: a window limit (`3/hour`) lent a child half the free slots and took them
    back when it ended, forgetting the calls it made: children one after another, then the parent, made 15 calls
    under 3 a minute. A finished child's calls in the window now count in its parent's."""
    _parent_and_kid(project, "3/hour")
    run_id, kid = await _parent_with_kid(runs)
    child = await _writes(runs, kid, "k", 3)
    assert child == ["ok", "ok", "rate_limited"], child  # (half of 3, rounded up)
    await runs.complete_step(kid, "wait", {"done": True})
    await runs.handle(kid).result()
    await wait_for(lambda: _settled(runs, run_id, kid), what="the parent to see its child end")
    parent = await _writes(runs, run_id, "p", 3)
    assert parent == ["ok", "rate_limited", "rate_limited"], parent
    assert len(list((project / "notes").iterdir())) == 3  # the limit, parent and child together
    await runs.cancel(run_id)


async def test_a_grandchilds_window_slots_stay_held_after_its_parent_ends(runs, project):
    """Hostile review s38, fourth round: a child that ended while its own child still ran gave its window slots
    back to the parent, and the grandchild's calls counted in no window (5 writes under 4 an hour). The slots a
    child still holds for runs it started now stay held in its parent (CHILD_HELD)."""
    _parent_and_kid(project, "4/hour")
    write_directive(project / ".ai" / "directives" / "mid.md", directive_md(
        '<step name="work"><action>Delegate.</action></step>', name="mid", permissions=PARENT))  # fmt: skip
    run_id = await runs.start("parent", {})
    await wait_for(lambda: _waiting(runs, run_id), what="the parent to wait for its agent")
    mid = (await runs.call_tool(run_id, "directive.run", {"directive": "mid"})).result["run_id"]
    await wait_for(lambda: _waiting(runs, mid), what="the child to wait for its agent")
    kid = (await runs.call_tool(mid, "directive.run", {"directive": "kid"})).result["run_id"]
    await wait_for(lambda: _waiting(runs, kid), what="the grandchild to wait for its agent")
    await runs.complete_step(mid, "work", {"done": True})
    await runs.handle(mid).result()
    await wait_for(lambda: _settled(runs, run_id, mid), what="the parent to see its child end")
    grandchild = (await runs.call_tool(kid, "filesystem.write", {"path": "notes/k0", "content": "x"})).status
    parent = await _writes(runs, run_id, "p", 4)
    assert grandchild == "ok"
    assert parent == ["ok", "ok", "ok", "rate_limited"], parent
    assert len(list((project / "notes").iterdir())) == 4  # the limit, all three runs together
    await runs.cancel(kid)
    await runs.cancel(run_id)


async def test_a_failed_childs_calls_count_in_its_parents_window(runs, project):
    """Hostile review s38, fourth round: a child that failed settled with nothing known, so the calls it made in a
    window were forgotten and its parent made the whole limit again. A failed child now says what it used."""
    _parent_and_kid(project, "3/hour", fails=True)
    run_id, kid = await _parent_with_kid(runs)
    child = await _writes(runs, kid, "k", 2)
    await runs.complete_step(kid, "wait", {"done": True})
    await wait_for(lambda: _settled(runs, run_id, kid, "failed"), what="the parent to see its child fail")
    parent = await _writes(runs, run_id, "p", 3)
    assert child == ["ok", "ok"], child
    assert parent == ["ok", "rate_limited", "rate_limited"], parent
    assert len(list((project / "notes").iterdir())) == 3
    await runs.cancel(run_id)


async def test_a_terminated_childs_window_slots_stay_held(runs, project):
    """A child ended from outside (terminated) says nothing of what it used: it may have used every window slot it
    had just now, and started runs that go on; its slots stay held in the parent (CHILD_HELD). They went back,
    so the parent made the whole limit again after the child's calls."""
    _parent_and_kid(project, "3/hour")
    run_id, kid = await _parent_with_kid(runs)
    child = await _writes(runs, kid, "k", 2)
    await runs.handle(kid).terminate("operator")
    await wait_for(lambda: _settled(runs, run_id, kid, "failed"), what="the parent to see its child end")
    parent = await _writes(runs, run_id, "p", 2)
    assert child == ["ok", "ok"], child
    assert parent == ["ok", "rate_limited"], parent
    await runs.cancel(run_id)


async def _writes(runs, run_id: str, prefix: str, count: int) -> list[str]:
    """``count`` writes of notes/{prefix}N by ``run_id``'s agent, one after another: each one's status."""
    return [
        (
            await runs.call_tool(run_id, "filesystem.write", {"path": f"notes/{prefix}{i}", "content": "x"})
        ).status
        for i in range(count)
    ]


async def _parent_with_kid(runs) -> tuple[str, str]:
    """A run of `parent` whose agent started `kid`, both waiting for their agent: their run ids."""
    run_id = await runs.start("parent", {})
    await wait_for(lambda: _waiting(runs, run_id), what="the parent to wait for its agent")
    kid = (await runs.call_tool(run_id, "directive.run", {"directive": "kid"})).result["run_id"]
    await wait_for(lambda: _waiting(runs, kid), what="the child to wait for its agent")
    return run_id, kid


async def _settled(runs, run_id: str, kid: str, status: str = "completed") -> bool:
    return any(c.run_id == kid and c.status == status for c in (await runs.status(run_id)).children)


def _parent_and_kid(project, limit: str, fails: bool = False) -> None:
    """`parent`, which may write notes/ and start `kid`, which may write notes/ (and, if ``fails``, fails after
    its agent's step: its next step runs a program it may not); filesystem.write limited to ``limit``."""
    write(project / ".ai" / "config" / "agent_harness.yaml", f"rate_limits:\n  filesystem.write: {limit}\n")
    ai = project / ".ai" / "directives"
    then = (
        '<step name="boom"><tool_call tool="shell.run"><param name="command">sort notes/k0</param></tool_call>'
        "</step>"
        if fails
        else ""
    )
    write_directive(ai / "kid.md", directive_md('<step name="wait"><action>Wait.</action></step>' + then,
                                                name="kid", permissions=WRITES))  # fmt: skip
    write_directive(ai / "parent.md", directive_md('<step name="work"><action>Delegate.</action></step>',
                                                   name="parent", permissions=PARENT))  # fmt: skip
