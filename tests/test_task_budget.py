"""Attacks on what one workflow task carries (workflows/directive_run/task_budget.py), against the real stack.

Temporal takes at most 4 MB of a workflow task's completion, and hands a run the calls admitted for it in
one task of at most 4 MB: past either, the run is ended (terminated, "GrpcMessageTooLarge"). An agent that
sends large calls together, or calls whose answers are large, must not end its run. The ledger server
(tests/servers/ledger_server.py) writes a line for every call it really runs."""

from __future__ import annotations

import asyncio
import sys
import uuid

from kiwi.items.store import ItemStore
from kiwi.runs import RunClient
from tests.helpers import write
from tests.test_batches import _activity_types, _admitted, _run_waiting
from tests.test_mcp_servers import mcp_directive, registry, text_of
from tests.test_review_attacks_s10 import LEDGER_SERVER, _ledger_run, _lines, _replays
from workers.main import build_worker


async def _events(runs: RunClient, run_id: str) -> list:
    return [event async for event in runs.handle(run_id).fetch_history_events()]


async def test_large_calls_sent_at_once_do_not_end_the_run(temporal_env, project, tmp_path):
    """Eleven calls of ~900 KB of arguments each, sent at once: admitted together, Temporal would hand them
    to the run in one task past 4 MB and end the run. The client sends one large call per run at a time."""
    runs, run_id, queue, ledger = await _ledger_run(temporal_env, project, tmp_path)
    calls = [("ledger.length", {"tag": n * (900_000 + i)}) for i, n in enumerate("pqrstuvwxyz")]
    async with build_worker(temporal_env.client, queue, sandboxed=True):
        results = await asyncio.wait_for(
            asyncio.gather(*(runs.call_tool(run_id, tool, args) for tool, args in calls)), 120
        )
        assert [text_of(r.result) for r in results] == [f"{900_000 + i} characters" for i in range(11)]
        assert sorted(_lines(ledger)) == [f"length {900_000 + i}" for i in range(11)]
        assert (await runs.status(run_id)).status == "awaiting_agent"
    await _replays(runs, run_id)


async def test_calls_admitted_together_are_accepted_about_a_megabyte_a_task(temporal_env, project, tmp_path):
    """Four clients (four front ends) each send a call with 700 KB of arguments while no worker runs:
    the run's next task is handed all four (2.8 MB). The run accepts about 1 MB of arguments a task and
    refuses the rest as busy; each client sends its call again, and every call runs once."""
    runs, run_id, queue, ledger = await _ledger_run(temporal_env, project, tmp_path)
    tasks = []
    for i, n in enumerate("abcd"):
        client = RunClient(temporal_env.client, ItemStore(project), task_queue=queue)
        tasks += await _admitted(client, run_id, [("ledger.length", {"tag": n * (700_000 + i)})])
    async with build_worker(temporal_env.client, queue, sandboxed=True):
        results = await asyncio.wait_for(asyncio.gather(*tasks), 120)
        assert [text_of(r.result) for r in results] == [f"{700_000 + i} characters" for i in range(4)]
        assert sorted(_lines(ledger)) == [f"length {700_000 + i}" for i in range(4)]
        assert (await runs.status(run_id)).status == "awaiting_agent"
    # Accepted in more than one task: each acceptance names the task that took it.
    accepted = [
        e.workflow_execution_update_accepted_event_attributes.accepted_request_sequencing_event_id
        for e in await _events(runs, run_id)
        if e.HasField("workflow_execution_update_accepted_event_attributes")
        and e.workflow_execution_update_accepted_event_attributes.accepted_request.input.name == "call_tool"
    ]
    assert len(accepted) == 4 and len(set(accepted)) >= 3, accepted
    await _replays(runs, run_id)


async def test_three_batches_of_large_answers_in_one_task_do_not_end_the_run(temporal_env, project, tmp_path):
    """Reads of two 600 KB files and two MCP calls answering ~1 MB each, to two servers, admitted together:
    three batches in one task, each bounded at 1.9 MB, 3.2 MB of answers carried twice. Two go out at once;
    the third waits until one of them answered and left room in the task (all local activities); answers
    wait for a task with room for them."""
    servers = "".join(
        f'  {name}:\n    command: "{sys.executable}"\n    args: ["{LEDGER_SERVER}", "{tmp_path / name}.txt"]\n'
        for name in ("alpha", "beta")
    )
    registry(project, f"mcps:\n{servers}")
    for n in "ab":
        write(project / "notes" / f"{n}.md", n * 600_000)
    mcp_directive(
        project,
        "three",
        tools='<mcp name="alpha" required="true"/><mcp name="beta" required="true"/>',
        permissions='<execute resource="mcp" name="alpha" actions="*"/>'
        '<execute resource="mcp" name="beta" actions="*"/><read resource="filesystem" path="notes/**"/>',
        body='<step name="work"><action>Call.</action></step>',
    )
    queue = f"kiwi-budget-{uuid.uuid4().hex[:8]}"
    runs, run_id = await _run_waiting(temporal_env, project, queue, "three")
    calls = [
        ("filesystem.read", {"path": "notes/a.md"}),
        ("alpha.big", {"tag": "x", "size": 500_000}),
        ("filesystem.read", {"path": "notes/b.md"}),
        ("beta.big", {"tag": "y", "size": 500_000}),
    ]
    tasks = await _admitted(runs, run_id, calls)
    async with build_worker(temporal_env.client, queue, sandboxed=True):
        results = await asyncio.wait_for(asyncio.gather(*tasks), 120)
        assert [r.status for r in results] == ["ok"] * 4, [r.reason for r in results]
        assert [len(text_of(r.result)) for r in results[1::2]] == [500_000, 500_000]
        assert [len(r.result["content"]) for r in results[::2]] == [600_000, 600_000]
        assert (await runs.status(run_id)).status == "awaiting_agent"
    for name in ("alpha", "beta"):
        assert _lines(tmp_path / f"{name}.txt") == [f"big {'x' if name == 'alpha' else 'y'}"]
    types = await _activity_types(runs, run_id)
    assert sorted(t for t in types if t != "write_audit_records") == [
        "mcp.alpha.call_tool",
        "mcp.alpha.list_tools",
        "mcp.beta.call_tool",
        "mcp.beta.list_tools",
        "read_many",
    ], types
    assert await _activity_types(runs, run_id, local=False) == []
    await _replays(runs, run_id)
