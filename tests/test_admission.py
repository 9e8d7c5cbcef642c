"""The pure call admission (lookup, policy, rate limits, loop detection), without a Temporal server."""

from __future__ import annotations

import copy

from hypothesis import given, settings
from hypothesis import strategies as st

from kiwi.admission import admit
from kiwi.contracts import McpServerContext, RunLimits, RunSnapshot, RunState
from kiwi.items.directive import parse_directive
from tests.helpers import directive_md

DIRECTIVE, _ = parse_directive(
    directive_md(
        '<step name="work"><action>Work.</action></step>',
        name="work",
        permissions='<read resource="filesystem" path="notes/**"/><write resource="filesystem" path="notes/**"/>'
        '<execute resource="mcp" name="clock" actions="now"/>',
        tools='<tools><mcp name="clock"/></tools>',
    ),
    "work.md",
)


def snapshot(**limits) -> RunSnapshot:
    return RunSnapshot(
        run_id="run-work-1",
        directive=DIRECTIVE,
        content_hash="",
        grants=DIRECTIVE.grants(),
        project_root="/project",
        limits=RunLimits(**limits),
    )


def test_a_tool_the_run_does_not_have_is_not_found_with_the_tools_it_has():
    outcome = admit("filesystem.reed", {"path": "notes/a"}, 1, snap=snapshot(), state=RunState(), now=0)
    assert outcome.refusal.error_type == "ToolNotFound" and "filesystem.read" in outcome.refusal.hint


def test_a_call_outside_the_grants_is_denied_with_the_grant_to_add():
    outcome = admit(
        "filesystem.write", {"path": "src/a.py", "content": ""}, 1, snap=snapshot(), state=RunState(), now=0
    )
    assert outcome.refusal.status == "denied"
    assert outcome.refusal.hint == 'add <write resource="filesystem" path="src/**"/> to <permissions>'


def test_a_per_run_limit_counts_admitted_calls_only():
    snap, state = snapshot(rate_limits={"filesystem.write": 2}), RunState()
    results = [
        admit("filesystem.write", {"path": f"notes/{i}", "content": ""}, i, snap=snap, state=state, now=i)
        for i in range(4)
    ]
    assert [r.refusal.status if r.refusal else "ok" for r in results] == [
        "ok",
        "ok",
        "rate_limited",
        "rate_limited",
    ]
    assert state.call_counts == {"filesystem.write": 2}
    assert results[2].refusal.reason == "rate limit for filesystem.write is 2 calls per run"


def test_a_window_refuses_with_how_long_to_wait_and_opens_again():
    snap, state = snapshot(rate_windows={"filesystem.read": (2, 60.0)}), RunState()

    def read(now: float):
        return admit("filesystem.read", {"path": "notes/a"}, 1, snap=snap, state=state, now=now).refusal

    assert read(100) is None and read(101) is None
    refused = read(110)
    assert refused.status == "rate_limited" and refused.hint == "try again in 50s"
    assert read(161) is None


def test_the_same_call_three_times_warns_of_a_loop():
    snap, state = snapshot(), RunState()
    warnings = [
        admit("filesystem.read", {"path": "notes/a"}, i, snap=snap, state=state, now=i).warning
        for i in range(3)
    ]
    assert warnings[:2] == ["", ""] and "3 times in a row" in warnings[2] and state.loop_warnings == 1


def test_a_loop_warning_counts_the_calls_as_they_were_made():
    """README trial s34: the sixth same call's warning said "3 times", the threshold, not the count."""
    snap, state = snapshot(), RunState()
    warnings = [
        admit("filesystem.read", {"path": "notes/a"}, i, snap=snap, state=state, now=i).warning
        for i in range(12)
    ]
    counts = [w.split("made ")[1].split(" times")[0] if w else "" for w in warnings]
    assert counts == ["", "", "3", "4", "5", "6", "7", "8", "9", "10 or more", "10 or more", "10 or more"], (
        counts
    )
    other = admit("filesystem.read", {"path": "notes/b"}, 12, snap=snap, state=state, now=12).warning
    assert other == "", other


def test_an_unavailable_or_hidden_mcp_tool_is_an_error_naming_what_there_is():
    state = RunState(mcp_context={"clock": McpServerContext(server="clock", available=False, error="no npx")})
    down = admit("clock.now", {}, 1, snap=snapshot(), state=state, now=0).refusal
    assert down.error_type == "McpUnavailable" and "no npx" in down.reason
    state.mcp_context["clock"] = McpServerContext(server="clock", available=True, tool_hashes={"now": "h"})
    assert admit("clock.now", {}, 1, snap=snapshot(), state=state, now=0).refusal is None
    hidden = admit("clock.set", {}, 2, snap=snapshot(), state=state, now=0).refusal
    assert hidden.error_type == "ToolNotFound" and hidden.hint == "tools of clock this run can call: now"


@settings(max_examples=200, deadline=None)
@given(
    tool=st.sampled_from(
        ["filesystem.read", "filesystem.write", "filesystem.delete", "shell.run", "clock.now", "nope"]
    ),
    path=st.sampled_from(["notes/a", "src/b", "../x", "/etc/passwd", ".git/config", ""]),
    used=st.integers(min_value=0, max_value=3),
)
def test_a_refused_call_changes_nothing_in_the_runs_state(tool, path, used):
    snap = snapshot(rate_limits={"filesystem.write": 2, "filesystem.read": 2})
    state = RunState(call_counts={"filesystem.write": used, "filesystem.read": used})
    before = copy.deepcopy(state)
    outcome = admit(tool, {"path": path, "content": "x", "command": "ls"}, 1, snap=snap, state=state, now=5)
    if outcome.refusal is not None:
        assert state == before
    else:
        counted = tool in snap.limits.rate_limits
        assert state.call_counts.get(tool, 0) == (used + 1 if counted else 0)
        assert path.startswith("notes/") or not tool.startswith("filesystem.")


def test_kiwi_meta_tools_are_admitted_by_their_grant_and_runs_before_them_replay_without():
    directive, _ = parse_directive(
        directive_md(
            '<step name="work"><action>Work.</action></step>',
            name="meta",
            permissions='<execute resource="kiwi-mcp" action="search"/>'
            '<execute resource="mcp" name="kiwi-mcp" actions="search"/>',
        ),
        "meta.md",
    )
    snap = RunSnapshot(
        run_id="run-meta-1",
        directive=directive,
        content_hash="",
        grants=directive.grants(),
        project_root="/project",
        limits=RunLimits(rate_limits={"mcp.*": 1}),
    )
    args = {"query": "deploy"}
    # Twice: a meta-tool is not an external MCP server's tool, so "mcp.*" does not count it.
    for seq in (1, 2):
        assert admit("kiwi-mcp.search", args, seq, snap=snap, state=RunState(), now=0).refusal is None
    load = admit(
        "kiwi-mcp.load", {"item_type": "tool", "item_id": "x"}, 3, snap=snap, state=RunState(), now=0
    )
    assert load.refusal.status == "denied" and 'action="load"' in load.refusal.hint
    # A run started before the meta-tools (kiwi_tools=False on replay) decides as it always did.
    old = admit("kiwi-mcp.search", args, 1, snap=snap, state=RunState(), now=0, kiwi_tools=False)
    assert old.refusal.error_type == "ToolNotFound" and "kiwi-mcp" not in old.refusal.hint
    # An MCP grant for a server named kiwi-mcp meant that server then, and never reaches the meta-tools now.
    mcp_only = directive.grants().model_copy(update={"kiwi_actions": []})
    assert mcp_only.check("kiwi-mcp.search", args, kiwi_tools=False).allowed
    assert not mcp_only.check("kiwi-mcp.search", args).allowed
