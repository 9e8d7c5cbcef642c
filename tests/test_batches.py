"""Agent calls that arrive in the same workflow task go out as one local activity, those to one upstream
MCP server (``mcp.{server}.call_tools``) and file reads and listings (``read_many``): each call keeps its
own answer, call number and audit record, a refusal stays the call's own, and a transport failure that
hits an MCP batch is retried call by call, each call running once more at most.

The calls are admitted while no worker runs, so the next worker's first workflow task holds all of them."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from pathlib import Path

import pytest
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.enums.v1 import UpdateWorkflowExecutionLifecycleStage
from temporalio.api.update.v1 import UpdateRef, WaitPolicy
from temporalio.api.workflowservice.v1 import PollWorkflowExecutionUpdateRequest
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import ActivityEnvironment

from activities.audit import read_audit
from activities.batches import answer_batch
from kiwi.items.store import ItemStore
from kiwi.runs import RunClient
from tests.helpers import directive_md, wait_for, write_directive
from tests.test_durability import HISTORIES, _scrub
from tests.test_mcp_servers import EVERYTHING, SERVERS, mcp_directive, registry, text_of, waiting
from workers.main import build_worker
from workflows.directive_run import CURRENT


async def _admitted(runs: RunClient, run_id: str, calls: list[tuple[str, dict]]) -> list[asyncio.Task]:
    """The calls, sent, once the server has admitted every one (no worker runs them yet). (Neither the
    Python client's start_update nor the server's UpdateWorkflowExecution answers at ADMITTED; polling
    an update does.)"""
    tasks = []
    for i, (tool, arguments) in enumerate(calls):
        update_id = f"call-{i}-{uuid.uuid4().hex[:6]}"
        tasks.append(asyncio.create_task(runs.call_tool(run_id, tool, arguments, update_id=update_id)))
        await wait_admitted(runs, run_id, update_id, f"call {i}")
    return tasks


async def wait_admitted(runs: RunClient, run_id: str, update_id: str, what: str) -> None:
    """Wait until the server has admitted update ``update_id`` of the run."""
    client = runs.client

    async def admitted() -> bool:
        try:
            await client.workflow_service.poll_workflow_execution_update(
                PollWorkflowExecutionUpdateRequest(
                    namespace=client.namespace,
                    update_ref=UpdateRef(
                        workflow_execution=WorkflowExecution(workflow_id=run_id), update_id=update_id
                    ),
                    identity="test",
                    wait_policy=WaitPolicy(lifecycle_stage=ADMITTED),
                )
            )
        except RPCError as exc:
            # NOT_FOUND: not admitted yet. CANCELLED ("operation was canceled"): the server dropped the poll,
            # as a loaded dev server does now and then (seen twice on a 2-core CI host); poll again.
            if exc.status in (RPCStatusCode.NOT_FOUND, RPCStatusCode.CANCELLED):
                return False
            raise
        return True

    await wait_for(admitted, what=f"the server to admit {what}")


ADMITTED = UpdateWorkflowExecutionLifecycleStage.UPDATE_WORKFLOW_EXECUTION_LIFECYCLE_STAGE_ADMITTED


async def _activity_types(runs: RunClient, run_id: str, *, local: bool = True) -> list[str]:
    """The local activities the run's history recorded, in order (not ``local``: the regular ones)."""
    types = []
    async for event in runs.handle(run_id).fetch_history_events():
        if not local and event.HasField("activity_task_scheduled_event_attributes"):
            types.append(event.activity_task_scheduled_event_attributes.activity_type.name)
        if local and event.HasField("marker_recorded_event_attributes"):
            details = event.marker_recorded_event_attributes.details
            if "data" in details:
                types.append(json.loads(details["data"].payloads[0].data).get("activity_type", ""))
    return types


async def _tool_calls(project, run_id: str, count: int) -> list[dict]:
    """The run's tool_call audit records, once ``count`` are written (the idle flush writes them)."""

    async def written():
        calls = [r for r in read_audit(str(project), run_id) if r["event"] == "tool_call"]
        return calls if len(calls) >= count else None

    return await wait_for(written, what=f"{count} tool_call audit records")


async def _run_waiting(temporal_env, project, queue: str, name: str) -> tuple[RunClient, str]:
    runs = RunClient(temporal_env.client, ItemStore(project), task_queue=queue)
    async with build_worker(temporal_env.client, queue, sandboxed=True):
        run_id = await runs.start(name, {})
        await wait_for(lambda: waiting(runs, run_id), what="the agent step")
    return runs, run_id


async def _echoes_together(temporal_env, project, *, finish: bool = False):
    """Seven echoes and one call the policy refuses (no grant for get-sum: it never joins the batch),
    admitted together; ``finish``: the run's step is then completed."""
    registry(project, f'mcps:\n  everything:\n    command: node\n    args: ["{EVERYTHING}", "stdio"]\n')
    mcp_directive(
        project,
        "echoes",
        tools='<mcp name="everything" required="true"/>',
        permissions='<execute resource="mcp" name="everything" actions="echo"/>',
        body='<step name="work"><action>Echo.</action></step>',
    )
    queue = f"kiwi-batch-{uuid.uuid4().hex[:8]}"
    runs, run_id = await _run_waiting(temporal_env, project, queue, "echoes")
    calls = [("everything.echo", {"message": f"message {i}"}) for i in range(7)]
    calls.insert(3, ("everything.get-sum", {"a": 1, "b": 2}))
    updates = await _admitted(runs, run_id, calls)
    async with build_worker(temporal_env.client, queue, sandboxed=True):
        results = await asyncio.wait_for(asyncio.gather(*updates), 60)
        audit = await _tool_calls(project, run_id, 8)
        if finish:
            await runs.complete_step(run_id, "work", {"done": True})
            await runs.handle(run_id).result()
    return runs, run_id, results, audit


async def test_calls_arriving_together_go_out_as_one_batch_each_with_its_own_answer(temporal_env, project):
    runs, run_id, results, audit = await _echoes_together(temporal_env, project)
    refused = results.pop(3)
    assert refused.status == "denied"
    assert [text_of(r.result) for r in results] == [f"Echo: message {i}" for i in range(7)]
    assert sorted(r.call_seq for r in [*results, refused]) == list(range(1, 9))
    # One local activity carried the seven echoes.
    types = await _activity_types(runs, run_id)
    assert types.count("mcp.everything.call_tools") == 1
    assert types.count("mcp.everything.call_tool") == 0
    assert sorted(r["arguments"].get("message", "") for r in audit if r["decision"] == "allowed") == [
        f"message {i}" for i in range(7)
    ]
    assert len(audit) == 8


@pytest.mark.skipif(
    not os.environ.get("KIWI_RECORD_HISTORY"), reason="set KIWI_RECORD_HISTORY=1 to re-record"
)
async def test_record_batch_history(temporal_env, project):
    """Record tests/histories/mcp_batch-{CURRENT}.json: a run whose calls went out as a batch replays."""
    runs, run_id, _, _ = await _echoes_together(temporal_env, project, finish=True)
    history = json.loads((await runs.handle(run_id).fetch_history()).to_json())
    # No machine path is committed: the project folder and this checkout are replaced.
    here = str(Path(__file__).resolve().parents[1])
    scrubbed = _scrub(_scrub(history, str(project), "/project"), here, "/kiwi")
    target = HISTORIES / f"mcp_batch-{CURRENT}.json"
    target.write_text(json.dumps(scrubbed, indent=1))
    assert str(project) not in target.read_text() and here not in target.read_text()


async def test_a_transport_failure_in_a_batch_is_retried_call_by_call(temporal_env, project, tmp_path):
    marker = tmp_path / "crashed"
    registry(
        project,
        f'mcps:\n  crashy:\n    command: "{sys.executable}"\n'
        f'    args: ["{SERVERS / "crash_server.py"}", "{marker}"]\n',
    )
    mcp_directive(
        project,
        "crashing",
        tools='<mcp name="crashy" required="true"/>',
        permissions='<execute resource="mcp" name="crashy" actions="*"/>',
        body='<step name="work"><action>Call.</action></step>',
    )
    queue = f"kiwi-batch-{uuid.uuid4().hex[:8]}"
    runs, run_id = await _run_waiting(temporal_env, project, queue, "crashing")
    # Four calls hang in the server until the fifth ends its process: the batch's transport fails for all.
    calls = [("crashy.wait", {"text": f"t{i}"}) for i in range(4)] + [("crashy.crash", {"expected": 4})]
    updates = await _admitted(runs, run_id, calls)
    async with build_worker(temporal_env.client, queue, sandboxed=True):
        results = await asyncio.wait_for(asyncio.gather(*updates), 120)
        audit = await _tool_calls(project, run_id, 5)
    assert marker.read_text() == "crashed\n"
    assert [r.status for r in results] == ["ok"] * 5, results
    assert [text_of(r.result) for r in results[:4]] == [f"after the crash: t{i}" for i in range(4)]
    assert text_of(results[4].result) == "crashed before"
    # The batch, then each call once more on its own (the pool started the server again).
    types = await _activity_types(runs, run_id)
    assert types.count("mcp.crashy.call_tools") == 1
    assert types.count("mcp.crashy.call_tool") == 5
    assert await _activity_types(runs, run_id, local=False) == []
    assert sorted(r["call_seq"] for r in audit) == [1, 2, 3, 4, 5]


async def _reader(temporal_env, project, files: dict[str, str]) -> tuple[RunClient, str, str]:
    """A run that may read notes/** (holding ``files``), waiting for the agent; its queue has no worker."""
    notes = project / "notes"
    notes.mkdir(exist_ok=True)
    for name, text in files.items():
        (notes / name).write_text(text)
    write_directive(
        project / ".ai" / "directives" / "reader.md",
        directive_md(
            '<step name="work"><action>Read.</action></step>',
            name="reader",
            permissions='<read resource="filesystem" path="notes/**"/>',
        ),
    )
    queue = f"kiwi-batch-{uuid.uuid4().hex[:8]}"
    runs, run_id = await _run_waiting(temporal_env, project, queue, "reader")
    return runs, run_id, queue


async def test_reads_and_listings_arriving_together_go_out_as_one_batch(temporal_env, project):
    runs, run_id, queue = await _reader(temporal_env, project, {f"n{i}.md": f"note {i}\n" for i in range(4)})
    calls = [("filesystem.read", {"path": f"notes/n{i}.md"}) for i in range(4)] + [
        ("filesystem.list", {"path": "notes"}),
        ("filesystem.read", {"path": "notes/missing.md"}),  # in the batch: the file is not there
        ("filesystem.read", {"path": ".ai/config/agent_harness.yaml"}),  # refused by the grant: not sent
    ]
    updates = await _admitted(runs, run_id, calls)
    async with build_worker(temporal_env.client, queue, sandboxed=True):
        results = await asyncio.wait_for(asyncio.gather(*updates), 60)
        audit = await _tool_calls(project, run_id, len(calls))
    assert [r.result["content"] for r in results[:4]] == [f"note {i}\n" for i in range(4)]
    assert {e["name"] for e in results[4].result["entries"]} == {f"n{i}.md" for i in range(4)}
    assert (results[5].status, results[5].error_type) == ("error", "FileNotFound")
    assert "does not exist" in results[5].reason
    assert results[6].status == "denied"
    types = await _activity_types(runs, run_id)
    assert types.count("read_many") == 1
    assert types.count("read_file") == types.count("list_directory") == 0
    assert sorted(r["call_seq"] for r in audit) == list(range(1, len(calls) + 1))


async def test_two_large_reads_together_both_answer(temporal_env, project):
    """Answers of one batch share a payload; a read that does not fit beside another is made again alone."""
    runs, run_id, queue = await _reader(temporal_env, project, {n: n[0] * 990_000 for n in ("a.md", "b.md")})
    updates = await _admitted(
        runs, run_id, [("filesystem.read", {"path": f"notes/{n}"}) for n in ("a.md", "b.md")]
    )
    async with build_worker(temporal_env.client, queue, sandboxed=True):
        results = await asyncio.wait_for(asyncio.gather(*updates), 60)
    assert [r.status for r in results] == ["ok", "ok"]
    assert [len(r.result["content"]) for r in results] == [990_000, 990_000]
    types = await _activity_types(runs, run_id)
    assert types.count("read_many") == 1 and types.count("read_file") == 1


async def _answered(*calls, idempotent: bool = False):
    """activities.batches.answer_batch in a real activity context (the SDK's ActivityEnvironment)."""
    return await ActivityEnvironment().run(
        answer_batch, list(calls), frozenset({"ToolFailed"}), idempotent=idempotent
    )


async def _value(value):
    return value


async def _raise(exc):
    raise exc


async def test_a_batch_answers_each_call_on_its_own():
    result = await _answered(
        ("ok", _value({"n": 1})),
        ("refused", _raise(ApplicationError("no such tool", type="ToolFailed", non_retryable=True))),
        ("transport", _raise(ConnectionResetError("pipe closed"))),
        ("retryable", _raise(ApplicationError("server busy", type="McpUnavailable"))),
    )
    ok, refused, transport, retryable = result.items
    assert ok.value == {"n": 1} and not ok.retry and not ok.error_type
    assert (refused.error_type, refused.message, refused.retry) == ("ToolFailed", "no such tool", False)
    assert transport.retry and "ConnectionResetError: pipe closed" in transport.message
    assert retryable.retry and retryable.error_type == "McpUnavailable"


async def test_answers_past_the_shared_limit_fail_once_or_are_read_again():
    big = "x" * 1_000_000
    calls = lambda: (("first", _value(big)), ("second", _value(big)))  # noqa: E731
    first, second = (await _answered(*calls())).items
    assert first.value == big
    assert second.error_type == "ToolFailed" and not second.retry
    assert "the call ran once and is not retried" in second.message
    first, second = (await _answered(*calls(), idempotent=True)).items
    assert first.value == big and second.retry and second.value is None
