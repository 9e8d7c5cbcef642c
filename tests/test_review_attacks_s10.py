"""Review attacks on batched calls (upstream MCP calls as ``mcp.{server}.call_tools``, file reads and listings
as ``read_many``), against the real stack: a Temporal dev server, real MCP servers, a real project.

Each test makes a batch the way tests/test_batches.py does (the calls are admitted while no worker runs,
so the next worker's first workflow task holds them all) and asserts the safe outcome. The ledger server
(tests/servers/ledger_server.py) writes a line for every call it really runs, so "ran once" is counted at
the server, not taken from the run's word."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import WorkflowExecutionStatus

from kiwi.contracts import CompleteStepRequest
from kiwi.errors import RunStateConflict
from kiwi.runs import RunClient
from tests.helpers import wait_for, write
from tests.test_batches import _activity_types, _admitted, _reader, _run_waiting, _tool_calls, wait_admitted
from tests.test_mcp_servers import SERVERS, mcp_directive, registry, text_of
from workers.main import build_worker
from workflows.directive_run import DirectiveRun

LEDGER_SERVER = SERVERS / "ledger_server.py"


def _ledger_registry(project: Path, ledger: Path, extra: str = "") -> None:
    registry(
        project,
        f'mcps:\n  ledger:\n    command: "{sys.executable}"\n'
        f'    args: ["{LEDGER_SERVER}", "{ledger}"]\n{extra}',
    )


def _lines(ledger: Path) -> list[str]:
    return ledger.read_text().splitlines() if ledger.exists() else []


async def _ledger_run(temporal_env, project, tmp_path, *, extra: str = "", harness: str = "", actions="*"):
    """A run that may call the ledger server, waiting for the agent on a queue with no worker."""
    ledger = tmp_path / "ledger.txt"
    _ledger_registry(project, ledger, extra)
    if harness:
        write(project / ".ai" / "config" / "agent_harness.yaml", harness)
    mcp_directive(
        project,
        "ledgered",
        tools='<mcp name="ledger" required="true"/>',
        permissions=f'<execute resource="mcp" name="ledger" actions="{actions}"/>',
        body='<step name="work"><action>Call.</action></step>',
    )
    queue = f"kiwi-s10-{uuid.uuid4().hex[:8]}"
    runs, run_id = await _run_waiting(temporal_env, project, queue, "ledgered")
    return runs, run_id, queue, ledger


async def _answers(temporal_env, runs, run_id, queue, calls, *, timeout: float = 90):
    updates = await _admitted(runs, run_id, calls)
    async with build_worker(temporal_env.client, queue, sandboxed=True):
        return await asyncio.wait_for(asyncio.gather(*updates), timeout)


# ---------------------------------------------------------------- one slow call must not re-run its neighbours


async def test_a_slow_call_does_not_make_its_neighbours_run_again(temporal_env, project, tmp_path):
    """Attack: one call of a batch outlasts the server's timeout. The batch is one local activity with that
    timeout and the MCP retry policy, so the whole batch timed out and was retried: the quick calls beside
    the slow one, already done at the server, ran again (up to six times). Each call must run once, the slow
    one too: it answers ToolTimeout, never sent again (it reached the server, which may have done it; before
    session 18 it was made again alone, and its operation ran twice)."""
    runs, run_id, queue, ledger = await _ledger_run(temporal_env, project, tmp_path, extra="    timeout: 2\n")
    calls = [
        ("ledger.count", {"tag": "a"}),
        ("ledger.slow", {"tag": "s", "seconds": 30}),
        ("ledger.count", {"tag": "b"}),
    ]
    results = await _answers(temporal_env, runs, run_id, queue, calls)
    assert [r.status for r in results] == ["ok", "error", "ok"], results
    assert [text_of(results[0].result), text_of(results[2].result)] == ["counted a", "counted b"]
    assert results[1].error_type == "ToolTimeout" and "no answer within 2s" in results[1].reason, results[1]
    lines = _lines(ledger)
    assert lines.count("count a") == 1 and lines.count("count b") == 1, lines
    assert lines.count("slow s") == 1, lines
    types = await _activity_types(runs, run_id)
    assert types.count("mcp.ledger.call_tools") == 1 and types.count("mcp.ledger.call_tool") == 0
    await _replays(runs, run_id)


# ---------------------------------------------------------------- secrets, answers, counts


async def test_a_servers_secret_never_leaves_a_batch_in_answers_errors_audit_or_history(
    temporal_env, project, tmp_path, monkeypatch
):
    """Attack: the server puts its token into an answer and into an error, both in one batch beside a plain
    call; none of the answers, the audit trail or the run's history may hold the token."""
    token = f"tok-{uuid.uuid4().hex}"
    monkeypatch.setenv("S10_LEDGER_TOKEN", token)
    runs, run_id, queue, ledger = await _ledger_run(
        temporal_env, project, tmp_path, extra="    env: {LEDGER_TOKEN: '${S10_LEDGER_TOKEN}'}\n"
    )
    calls = [("ledger.token", {"tag": "t"}), ("ledger.fail", {"tag": "f"}), ("ledger.count", {"tag": "c"})]
    updates = await _admitted(runs, run_id, calls)
    async with build_worker(temporal_env.client, queue, sandboxed=True):
        results = await asyncio.wait_for(asyncio.gather(*updates), 60)
        audit = await _tool_calls(project, run_id, 3)
    assert (results[0].status, results[1].status, results[2].status) == ("ok", "error", "ok"), results
    assert "[secret S10_LEDGER_TOKEN]" in text_of(results[0].result)
    assert "[secret S10_LEDGER_TOKEN]" in results[1].reason
    assert text_of(results[2].result) == "counted c"
    history = (await runs.handle(run_id).fetch_history()).to_json()
    for text in (*(r.model_dump_json() for r in results), json.dumps(audit), history):
        assert token not in text
    assert "mcp.ledger.call_tools" in await _activity_types(runs, run_id)
    assert sorted(_lines(ledger)) == ["count c", "fail f", "token t"]


async def test_answers_past_the_payload_limit_fail_once_and_neighbours_answer(
    temporal_env, project, tmp_path
):
    """Attack: two ~1.2 MB answers (as sent) and a small one in one batch. Together they pass what a run can carry: the
    second large answer fails once (ToolFailed, never retried: the call may have had effects); the others
    answer; every call ran exactly once at the server, and the run still takes calls."""
    runs, run_id, queue, ledger = await _ledger_run(temporal_env, project, tmp_path)
    calls = [
        ("ledger.big", {"tag": "x", "size": 600_000}),
        ("ledger.count", {"tag": "c"}),
        ("ledger.big", {"tag": "y", "size": 600_000}),
    ]
    results = await _answers(temporal_env, runs, run_id, queue, calls)
    assert results[0].status == "ok", results[0].reason
    assert len(text_of(results[0].result)) == 600_000
    assert text_of(results[1].result) == "counted c"
    assert (results[2].status, results[2].error_type) == ("error", "ToolFailed"), results[2]
    assert "not retried" in results[2].reason
    assert sorted(_lines(ledger)) == ["big x", "big y", "count c"]
    async with build_worker(temporal_env.client, queue, sandboxed=True):
        after = await runs.call_tool(run_id, "ledger.count", {"tag": "after"})
    assert after.status == "ok" and after.call_seq == 4


async def test_a_huge_refusal_does_not_take_its_neighbours_answers(temporal_env, project, tmp_path):
    """Attack: the server refuses one call of a batch with a 2.5 MB error message. Refusals were not counted
    against the batch's shared answer size, so the batch's answer passed the limit and every call of it
    failed (ToolFailed), the neighbours' good answers lost. The refusal is the call's own answer, cut short;
    the neighbours answer; each call ran once."""
    runs, run_id, queue, ledger = await _ledger_run(temporal_env, project, tmp_path)
    calls = [
        ("ledger.count", {"tag": "a"}),
        ("ledger.refuse", {"tag": "r", "size": 2_500_000}),
        ("ledger.count", {"tag": "b"}),
    ]
    results = await _answers(temporal_env, runs, run_id, queue, calls)
    assert [(r.status, r.error_type, r.reason[:300]) for r in results[0::2]] == [("ok", "", "")] * 2
    assert results[1].status == "error" and results[1].error_type == "ToolFailed"
    assert len(results[1].reason) < 20_000
    assert sorted(_lines(ledger)) == ["count a", "count b", "refuse r"]
    await _replays(runs, run_id)


async def test_a_batch_does_not_get_past_a_rate_limit(temporal_env, project, tmp_path):
    runs, run_id, queue, ledger = await _ledger_run(
        temporal_env, project, tmp_path, harness="rate_limits:\n  ledger.count: 2\n"
    )
    calls = [("ledger.count", {"tag": f"c{i}"}) for i in range(5)]
    results = await _answers(temporal_env, runs, run_id, queue, calls)
    assert [r.status for r in results] == ["ok", "ok", "rate_limited", "rate_limited", "rate_limited"]
    assert _lines(ledger) == ["count c0", "count c1"]
    assert sorted(r.call_seq for r in results) == [1, 2, 3, 4, 5]


async def test_a_batch_does_not_get_past_a_zero_limit_or_the_tool_filters(temporal_env, project, tmp_path):
    """The registry shows count, token and big only; the directive declares count and big and grants both,
    and the harness allows big no call. Neither a refused tool nor a hidden one rides along with allowed
    calls."""
    ledger = tmp_path / "ledger.txt"
    _ledger_registry(project, ledger, "    tools: [count, token, big]\n")
    mcp_directive(
        project,
        "filtered",
        tools='<mcp name="ledger" required="true"><tool>count</tool><tool>big</tool></mcp>',
        permissions='<execute resource="mcp" name="ledger" actions="count,big"/>',
        body='<step name="work"><action>Call.</action></step>',
    )
    write(project / ".ai" / "config" / "agent_harness.yaml", "rate_limits:\n  ledger.big: 0\n")
    queue = f"kiwi-s10-{uuid.uuid4().hex[:8]}"
    runs, run_id = await _run_waiting(temporal_env, project, queue, "filtered")
    calls = [
        ("ledger.count", {"tag": "a"}),
        ("ledger.fail", {"tag": "hidden"}),  # hidden by the registry's filter
        ("ledger.token", {"tag": "filtered"}),  # granted, but outside the directive's own filter
        ("ledger.big", {"tag": "limited", "size": 3}),  # declared and granted, its rate limit is 0
        ("ledger.count", {"tag": "b"}),
    ]
    results = await _answers(temporal_env, runs, run_id, queue, calls)
    assert [r.status for r in results][0::4] == ["ok", "ok"]
    assert all(r.status != "ok" for r in results[1:4]), results
    assert results[3].status == "rate_limited"
    assert _lines(ledger) == ["count a", "count b"]


async def test_a_call_waiting_for_approval_does_not_ride_along_with_its_batch(
    temporal_env, project, tmp_path
):
    """count needs a human; nobody approves (the wait times out). Its neighbours answer, it never runs."""
    runs, run_id, queue, ledger = await _ledger_run(
        temporal_env, project, tmp_path, extra="    require_approval: [count]\n    approval_timeout: 1\n"
    )
    calls = [
        ("ledger.token", {"tag": "a"}),
        ("ledger.count", {"tag": "wait"}),
        ("ledger.token", {"tag": "b"}),
    ]
    results = await _answers(temporal_env, runs, run_id, queue, calls)
    assert [r.status for r in results][0::2] == ["ok", "ok"]
    assert results[1].status != "ok", results[1]
    assert sorted(_lines(ledger)) == ["token a", "token b"]


async def test_loop_detection_counts_every_call_of_a_batch(temporal_env, project, tmp_path):
    """Five identical calls at once: the loop check sees each, as it does calls made one by one, and the run
    is held as soon as its warnings reach the limit (the fourth call's): the fifth is refused, not taken."""
    runs, run_id, queue, ledger = await _ledger_run(
        temporal_env,
        project,
        tmp_path,
        harness="loop_detection:\n  repeat_threshold: 3\n  max_warnings: 2\n",
    )
    calls = [("ledger.count", {"tag": "same"})] * 5
    updates = await _admitted(runs, run_id, calls)
    async with build_worker(temporal_env.client, queue, sandboxed=True):
        results = await asyncio.wait_for(asyncio.gather(*updates, return_exceptions=True), 90)
    warned = [r.warnings for r in results[:4]]
    assert [any("times in a row" in w for w in ws) for ws in warned] == [False, False, True, True], results
    # The call whose warning held the run says so (README trial s36: it said only "if you are stuck, use help").
    held = "the run is now held (stuck) after 2 loop warnings: calls are refused until a human resumes it"
    assert [any(w.startswith(held) for w in ws) for ws in warned] == [False, False, False, True], results
    assert isinstance(results[4], RunStateConflict) and "stuck (2 loop warnings)" in str(results[4])
    assert _lines(ledger) == ["count same"] * 4
    async with build_worker(temporal_env.client, queue, sandboxed=True):
        status = await runs.status(run_id)
        assert status.status == "stuck", status
        with pytest.raises(Exception, match="stuck"):
            await runs.call_tool(run_id, "ledger.count", {"tag": "later"})
    assert "count later" not in _lines(ledger)


async def test_calls_that_reach_the_run_with_the_call_that_holds_it_do_not_run(
    temporal_env, project, tmp_path
):
    """Attack: calls (and a step's completion) sent in the same workflow task as the call whose loop warning
    reaches the limit. The run was held only once that call answered, so the calls after it went out in its
    batch and ran while the run was stuck, and the step completed. The run is held as soon as the warning
    that reaches the limit is counted (each update's validator runs just before its handler, in order):
    what comes after it in the task is refused as it is on a held run, and never reaches the server."""
    runs, run_id, queue, ledger = await _ledger_run(
        temporal_env,
        project,
        tmp_path,
        harness="loop_detection:\n  repeat_threshold: 2\n  max_warnings: 1\n",
    )
    calls = [
        ("ledger.count", {"tag": "same"}),
        ("ledger.count", {"tag": "same"}),  # the second in a row: the warning that reaches the limit
        ("ledger.count", {"tag": "after-1"}),
        ("ledger.count", {"tag": "after-2"}),
    ]
    updates = await _admitted(runs, run_id, calls)
    # The step completed in the same task, after the call that held the run: refused too.
    step = CompleteStepRequest(step="work", outputs={"done": True})
    updates.append(asyncio.create_task(runs._update(run_id, DirectiveRun.complete_step, step, "step-work")))
    await wait_admitted(runs, run_id, "step-work", "the step's completion")
    async with build_worker(temporal_env.client, queue, sandboxed=True):
        results = await asyncio.wait_for(asyncio.gather(*updates, return_exceptions=True), 90)
        status = await runs.status(run_id)
    assert [r.status for r in results[:2]] == ["ok", "ok"], results
    assert any("the same call was made 2 times in a row" in w for w in results[1].warnings), results[1]
    for refused in results[2:]:  # the two calls and the step's completion
        assert isinstance(refused, RunStateConflict), results
        assert "stuck" in str(refused) and f"kiwi resume {run_id}" in str(refused)
    assert _lines(ledger) == ["count same", "count same"]
    assert status.status == "stuck", status
    assert {v.name: v.status for v in status.steps}["work"] == "awaiting_agent", status.steps
    assert [c.status for c in status.last_calls] == ["ok", "ok"]
    await _replays(runs, run_id)


# ---------------------------------------------------------------- cancellation, continue-as-new, replay


async def test_cancelling_a_run_mid_batch_answers_every_call_once(temporal_env, project, tmp_path):
    """Three calls hang at the server in one batch; the run is cancelled. Every call answers Cancelled, none
    runs again, the run ends cancelled, and its history replays."""
    runs, run_id, queue, ledger = await _ledger_run(temporal_env, project, tmp_path)
    calls = [("ledger.slow", {"tag": f"s{i}", "seconds": 600}) for i in range(3)]
    updates = await _admitted(runs, run_id, calls)
    async with build_worker(temporal_env.client, queue, sandboxed=True):

        async def in_flight():
            return len(_lines(ledger)) == 3

        await wait_for(in_flight, what="the three calls at the server")
        await runs.cancel(run_id, "enough")
        results = await asyncio.wait_for(asyncio.gather(*updates), 60)
        await runs.handle(run_id).result()
        assert (await runs.status(run_id)).status == "cancelled"
    assert [(r.status, r.error_type) for r in results] == [("error", "Cancelled")] * 3, results
    assert sorted(_lines(ledger)) == ["slow s0", "slow s1", "slow s2"]
    await _replays(runs, run_id)


async def test_a_run_that_continues_as_new_with_a_batch_in_flight_loses_and_repeats_nothing(
    temporal_env, project, tmp_path
):
    runs, run_id, queue, ledger = await _ledger_run(
        temporal_env, project, tmp_path, harness="runs:\n  continue_as_new_after_updates: 3\n"
    )
    calls = [("ledger.count", {"tag": f"c{i}"}) for i in range(6)]
    before = (await runs.handle(run_id).describe()).run_id
    results = await _answers(temporal_env, runs, run_id, queue, calls)
    assert [text_of(r.result) for r in results] == [f"counted c{i}" for i in range(6)]
    assert sorted(r.call_seq for r in results) == list(range(1, 7))
    assert sorted(_lines(ledger)) == [f"count c{i}" for i in range(6)]
    made = 6
    # (The stopping worker may take the task that continues the run as new before it stops, on a loaded host:
    # CI s37. Then another round of calls, until one leaves it to the next worker.)
    while (await runs.handle(run_id).describe()).run_id != before and made < 30:
        before = (await runs.handle(run_id).describe()).run_id
        more = [("ledger.count", {"tag": f"c{made + i}"}) for i in range(3)]
        assert all(r.status == "ok" for r in await _answers(temporal_env, runs, run_id, queue, more))
        made += 3
    # The next call meets the run continuing as new (its task left with the stopped worker): it waits for
    # the execution that refused it to close, not for its successor, which it waited out 30 s for when the
    # refusal did not name its execution.
    waited: list[str] = []
    closed = runs._closed

    async def recorded(run: str, execution: str, deadline: float) -> None:
        waited.append(execution)
        await closed(run, execution, deadline)

    runs._closed = recorded
    async with build_worker(temporal_env.client, queue, sandboxed=True):
        after = await runs.call_tool(run_id, "ledger.count", {"tag": "after"})
        assert waited, "the call did not meet the run continuing as new"
        for execution in waited:
            ended = await runs.client.get_workflow_handle(run_id, run_id=execution).describe()
            assert ended.status == WorkflowExecutionStatus.CONTINUED_AS_NEW, (execution, ended.status)
        audit = await _tool_calls(project, run_id, made + 1)
        assert (await runs.status(run_id)).continued >= 1
    assert after.status == "ok" and after.call_seq == made + 1
    assert sorted(r["call_seq"] for r in audit) == list(range(1, made + 2))


async def _replays(runs: RunClient, run_id: str) -> Any:
    """The run's history, once it has replayed on this code (a non-determinism would raise)."""
    from temporalio.worker import Replayer

    from kiwi.converter import data_converter
    from workers.main import SANDBOX, WORKFLOWS

    history = await runs.handle(run_id).fetch_history()
    replayer = Replayer(workflows=WORKFLOWS, data_converter=data_converter, workflow_runner=SANDBOX)
    await replayer.replay_workflow(history)
    return history


# ---------------------------------------------------------------- file reads and listings


async def test_a_batch_of_reads_and_listings_through_links_fifos_and_outside_paths(
    temporal_env, project, tmp_path
):
    outside = tmp_path.parent / f"outside-{uuid.uuid4().hex[:6]}"
    outside.mkdir()
    (outside / "secret.txt").write_text("OUTSIDE-SECRET\n")
    runs, run_id, queue = await _reader(temporal_env, project, {"a.md": "note a\n"})
    notes = project / "notes"
    (notes / "link.md").symlink_to(outside / "secret.txt")
    (notes / "linkdir").symlink_to(outside)
    (notes / "inner.md").symlink_to(notes / "a.md")
    os.mkfifo(notes / "pipe")
    (notes / "sub").mkdir()
    calls = [
        ("filesystem.read", {"path": "notes/a.md"}),
        ("filesystem.read", {"path": "notes/link.md"}),
        ("filesystem.read", {"path": "notes/linkdir/secret.txt"}),
        ("filesystem.list", {"path": "notes/linkdir"}),
        ("filesystem.read", {"path": "notes/inner.md"}),
        ("filesystem.read", {"path": "notes/pipe"}),
        ("filesystem.read", {"path": "notes/sub"}),
        ("filesystem.read", {"path": "notes/../../" + outside.name + "/secret.txt"}),
        ("filesystem.list", {"path": "notes"}),
        ("filesystem.read", {"path": "notes/a.md"}),
    ]
    results = await _answers(temporal_env, runs, run_id, queue, calls, timeout=60)
    assert results[0].result["content"] == results[9].result["content"] == "note a\n"
    assert all(r.status != "ok" for r in results[1:8]), results
    assert results[1].status == results[2].status == results[3].status == "denied"
    entries = {e["name"]: e["type"] for e in results[8].result["entries"]}
    assert entries["link.md"] == entries["linkdir"] == "symlink"
    for r in results:
        assert "OUTSIDE-SECRET" not in r.model_dump_json()
    assert (await _activity_types(runs, run_id)).count("read_many") == 1
    assert sorted(r.call_seq for r in results) == list(range(1, 11))


async def test_large_reads_in_one_batch_are_read_again_alone_and_all_answer(temporal_env, project):
    """Three ~0.9 MB reads and a file of control characters (sent as base64, 1.3 MB) together: they cannot
    share one answer; each read that does not fit is made again alone, and every one answers whole."""
    files = {f"{n}.md": n * 900_000 for n in "abc"}
    runs, run_id, queue = await _reader(temporal_env, project, files)
    (project / "notes" / "ctl.bin").write_bytes(b"\x01" * 1_000_000)
    names = ["a.md", "ctl.bin", "b.md", "c.md"]
    calls = [("filesystem.read", {"path": f"notes/{n}"}) for n in names]
    results = await _answers(temporal_env, runs, run_id, queue, calls, timeout=60)
    assert [r.status for r in results] == ["ok"] * 4, [(r.status, r.reason) for r in results]
    assert [len(results[i].result["content"]) for i in (0, 2, 3)] == [900_000] * 3
    assert results[1].result["encoding"] == "base64"
    types = await _activity_types(runs, run_id)
    assert types.count("read_many") == 1 and types.count("read_file") >= 2
    await _replays(runs, run_id)


async def test_large_answers_of_two_batches_in_one_task_do_not_end_the_run(temporal_env, project, tmp_path):
    ledger = tmp_path / "ledger.txt"
    _ledger_registry(project, ledger)
    notes = project / "notes"
    notes.mkdir()
    for n in "ab":
        (notes / f"{n}.md").write_text(n * 850_000)
    mcp_directive(
        project,
        "mixed",
        tools='<mcp name="ledger" required="true"/>',
        permissions='<execute resource="mcp" name="ledger" actions="*"/>'
        '<read resource="filesystem" path="notes/**"/>',
        body='<step name="work"><action>Call.</action></step>',
    )
    queue = f"kiwi-s10-{uuid.uuid4().hex[:8]}"
    runs, run_id = await _run_waiting(temporal_env, project, queue, "mixed")
    calls = [
        ("filesystem.read", {"path": "notes/a.md"}),
        ("filesystem.read", {"path": "notes/b.md"}),
        ("ledger.big", {"tag": "x", "size": 400_000}),
    ]
    results = await _answers(temporal_env, runs, run_id, queue, calls, timeout=60)
    assert [r.status for r in results] == ["ok"] * 3
    async with build_worker(temporal_env.client, queue, sandboxed=True):
        assert (await runs.status(run_id)).status == "awaiting_agent"


async def test_large_arguments_and_answers_in_one_batch_do_not_end_the_run(temporal_env, project, tmp_path):
    """Two calls whose arguments and answers are each ~0.9 MB, in one batch: the answers fit the batch's
    shared limit, and the workflow task that carries them (and the calls' updates) must not end the run.
    (Sent by two clients, as two front ends would: one client sends one large call per run at a time.)"""
    runs, run_id, queue, ledger = await _ledger_run(temporal_env, project, tmp_path)
    updates = []
    for n in "pq":
        client = RunClient(temporal_env.client, runs.store, task_queue=queue)
        updates += await _admitted(client, run_id, [("ledger.count", {"tag": n * 450_000})])
    async with build_worker(temporal_env.client, queue, sandboxed=True):
        results = await asyncio.wait_for(asyncio.gather(*updates), 60)
    assert [r.status for r in results] == ["ok", "ok"], [r.reason for r in results]
    assert [len(_line) for _line in _lines(ledger)] == [6 + 450_000] * 2
    async with build_worker(temporal_env.client, queue, sandboxed=True):
        assert (await runs.status(run_id)).status == "awaiting_agent"
