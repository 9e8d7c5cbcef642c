"""Escalations answered by the client's user through MCP input rounds (SEP-2322), with a real MCP client
whose elicitation callback plays the user, against the real stack."""

from __future__ import annotations

import os
import signal

import pytest
from mcp.client import Client
from mcp_types import ElicitResult, InputRequiredResult

from kiwi.devserver import free_port
from kiwi.errors import ItemInvalid
from kiwi.harness import load_harness
from kiwi.items.store import user_space
from mcp_frontend.input_rounds import REQUEST_KEY
from mcp_frontend.server import build_server
from tests.helpers import approver, data, execute, kiwi_mcp_http

OPT_IN = "\ninput_rounds:\n  escalations: true\n  sign_as: desk\n"
ESCALATE = {"action": "escalate", "reason": "the migration drops a column", "options": ["ship", "wait"]}


async def start_hello(client) -> str:
    started = await execute(
        client,
        {"item_type": "directive", "action": "run", "item_id": "hello_kiwi", "parameters": {"name": "Esc"}},
    )
    return started["run_id"]


def opt_in(project) -> str:
    harness = project / ".ai" / "config" / "agent_harness.yaml"
    harness.write_text(harness.read_text() + OPT_IN)
    return approver("desk")  # the key the front end signs the user's answers with


async def test_the_clients_user_answers_an_escalation_and_the_run_carries_on(runs, project, temporal_env):
    opt_in(project)
    asked = []

    async def the_user(context, params):
        asked.append(params)
        return ElicitResult(action="accept", content={"option": "wait", "note": "after the backup"})

    server = build_server(temporal_env.client, project, task_queue=runs.task_queue)
    async with Client(server, elicitation_callback=the_user) as client:
        run_id = await start_hello(client)
        answer = data(await client.call_tool("help", {**ESCALATE, "run_id": run_id}))
        assert answer["status"] == "decided" and answer["option"] == "wait" and answer["by"] == "desk"
        # The user saw the reason and exactly the options; the model never chose.
        assert len(asked) == 1 and "the migration drops a column" in asked[0].message
        assert asked[0].requested_schema["properties"]["option"]["enum"] == ["ship", "wait"]

    status = await runs.status(run_id)
    decision = status.decisions[0]
    assert (decision.answer, decision.by) == ("wait", "desk")
    assert "answered by the user of MCP client mcp" in decision.note and "after the backup" in decision.note
    assert status.status == "awaiting_agent"  # the hold is lifted; the agent carries on
    assert not status.refused_decisions


async def test_another_front_end_takes_the_retry(runs, project, temporal_env):
    opt_in(project)

    async def never(context, params):
        raise AssertionError("this client drives the round itself")

    first = build_server(temporal_env.client, project, task_queue=runs.task_queue)
    async with Client(first, elicitation_callback=never) as client:
        run_id = await start_hello(client)
        arguments = {**ESCALATE, "run_id": run_id}
        question = await client.session.call_tool("help", arguments, allow_input_required=True)
        assert isinstance(question, InputRequiredResult)
        assert run_id not in question.request_state  # sealed: the client cannot read or forge it
        key = next(iter(question.input_requests))
    assert (await runs.status(run_id)).status == "awaiting_human"

    # A second front end (another process, or this one restarted) takes the retry.
    second = build_server(temporal_env.client, project, task_queue=runs.task_queue)
    async with Client(second, elicitation_callback=never) as client:
        retried = await client.session.call_tool(
            "help",
            arguments,
            input_responses={key: ElicitResult(action="accept", content={"option": "ship"})},
            request_state=question.request_state,
        )
        assert data(retried)["status"] == "decided"
        tampered = question.request_state[:-4] + (
            "AAAA" if not question.request_state.endswith("AAAA") else "BBBB"
        )
        with pytest.raises(Exception, match="requestState"):
            await client.session.call_tool(
                "help",
                arguments,
                input_responses={key: ElicitResult(action="accept", content={"option": "wait"})},
                request_state=tampered,
            )
    assert (await runs.status(run_id)).decisions[0].answer == "ship"


async def test_a_user_who_declines_leaves_it_to_kiwi_decide(runs, project, temporal_env):
    opt_in(project)

    async def declines(context, params):
        return ElicitResult(action="decline")

    server = build_server(temporal_env.client, project, task_queue=runs.task_queue)
    async with Client(server, elicitation_callback=declines) as client:
        run_id = await start_hello(client)
        answer = data(await client.call_tool("help", {**ESCALATE, "run_id": run_id}))
        assert answer["status"] == "escalated" and "kiwi decide" in answer["message"]
    status = await runs.status(run_id)
    assert status.status == "awaiting_human" and status.decisions[0].answer == ""


async def test_without_the_harness_opting_in_no_client_is_asked(runs, project, temporal_env):
    approver("desk")

    async def the_user(context, params):
        raise AssertionError("the harness did not opt in: nobody is asked through the client")

    server = build_server(temporal_env.client, project, task_queue=runs.task_queue)
    async with Client(server, elicitation_callback=the_user) as client:
        run_id = await start_hello(client)
        answer = data(await client.call_tool("help", {**ESCALATE, "run_id": run_id}))
        assert answer["status"] == "escalated"
    assert (await runs.status(run_id)).status == "awaiting_human"


def test_the_harness_key_is_checked(project):
    harness = project / ".ai" / "config" / "agent_harness.yaml"
    base = harness.read_text()
    assert load_harness(project, user_space()).input_rounds.escalations is False
    harness.write_text(base + "\ninput_rounds:\n  escalations: true\n")
    with pytest.raises(ItemInvalid, match="sign_as"):
        load_harness(project, user_space())
    harness.write_text(base + "\ninput_rounds:\n  approvals: true\n")
    with pytest.raises(ItemInvalid, match="input_rounds.approvals needs input_rounds.sign_as"):
        load_harness(project, user_space())
    harness.write_text(base + "\ninput_rounds:\n  approvals: true\n  sign_as: desk\n")
    rounds = load_harness(project, user_space()).input_rounds
    assert rounds.approvals is True and rounds.escalations is False  # each opted into on its own


async def test_a_restarted_kiwi_mcp_process_takes_the_retry(runs, project, temporal_env):
    opt_in(project)
    port = free_port()

    async def never(context, params):
        raise AssertionError("this client drives the round itself")

    async with kiwi_mcp_http(temporal_env, runs, project, port) as (url, proc):
        async with Client(url, elicitation_callback=never) as client:
            run_id = await start_hello(client)
            arguments = {**ESCALATE, "run_id": run_id}
            question = await client.session.call_tool("help", arguments, allow_input_required=True)
            assert isinstance(question, InputRequiredResult)
        os.killpg(proc.pid, signal.SIGKILL)  # the front end that asked dies
        await proc.wait()

    async with (
        kiwi_mcp_http(temporal_env, runs, project, port) as (url, _),
        Client(url, elicitation_callback=never) as client,
    ):
        retried = await client.session.call_tool(
            "help",
            arguments,
            input_responses={REQUEST_KEY: ElicitResult(action="accept", content={"option": "ship"})},
            request_state=question.request_state,
        )
        assert data(retried)["status"] == "decided"
    decision = (await runs.status(run_id)).decisions[0]
    assert (decision.answer, decision.by) == ("ship", "desk")


APPROVALS_OPT_IN = "\ninput_rounds:\n  approvals: true\n  sign_as: desk\n"
# hello_kiwi writes notes/hello.md in an automatic step; the agent's call deletes it.
DELETE = {
    "item_type": "tool",
    "action": "call",
    "item_id": "filesystem.delete",
    "parameters": {"path": "notes/hello.md"},
}


def approvals_opt_in(project, extra: str = APPROVALS_OPT_IN) -> None:
    harness = project / ".ai" / "config" / "agent_harness.yaml"
    text = harness.read_text().replace("tools: [git.rollback]", "tools: [git.rollback, filesystem.delete]")
    harness.write_text(text + extra)
    approver("desk")


@pytest.mark.parametrize("decision", ["approve", "reject"])
async def test_the_clients_user_decides_a_call_waiting_for_approval(runs, project, temporal_env, decision):
    approvals_opt_in(project)
    asked = []

    async def the_user(context, params):
        asked.append(params)
        return ElicitResult(action="accept", content={"decision": decision, "reason": "read the plan"})

    server = build_server(temporal_env.client, project, task_queue=runs.task_queue, client_name="agent-1")
    async with Client(server, elicitation_callback=the_user) as client:
        run_id = await start_hello(client)
        answer = data(await client.call_tool("execute", {**DELETE, "run_id": run_id}))
    status = await runs.status(run_id)
    (request,) = status.approvals
    # The user saw exactly what would run: the tool, its arguments and the call's hash.
    assert len(asked) == 1 and "filesystem.delete notes/hello.md" in asked[0].message
    assert '"path": "notes/hello.md"' in asked[0].message and request.args_hash in asked[0].message
    assert asked[0].requested_schema["properties"]["decision"]["enum"] == ["approve", "reject"]
    # Signed by the operator's key, noting whose user decided; bound to that call like `kiwi approve`.
    assert request.decided_by == "desk" and "answered by the user of MCP client mcp" in request.reason
    assert not status.refused_decisions
    if decision == "approve":
        assert answer["status"] == "ok" and not (project / "notes" / "hello.md").exists()
        assert request.status == "approved"
    else:
        assert answer["status"] == "denied" and answer["error_type"] == "ApprovalRejected", answer
        assert (project / "notes" / "hello.md").exists() and request.status == "rejected"


async def test_approvals_are_not_asked_unless_the_harness_opts_into_them(runs, project, temporal_env):
    """Escalations through the client do not open approvals to it: each is its own switch."""
    approvals_opt_in(project, OPT_IN)

    async def the_user(context, params):
        raise AssertionError("approvals are not opted in: the client's user is never asked to approve")

    server = build_server(temporal_env.client, project, task_queue=runs.task_queue, client_name="agent-1")
    async with Client(server, elicitation_callback=the_user) as client:
        run_id = await start_hello(client)
        answer = data(await client.call_tool("execute", {**DELETE, "run_id": run_id, "wait_seconds": 1}))
    assert answer["status"] == "pending" and "approve" in answer["reason"]
    assert [a.status for a in (await runs.status(run_id)).approvals] == ["pending"]
    assert (project / "notes" / "hello.md").exists()


async def test_a_user_who_declines_leaves_the_call_to_kiwi_approve(runs, project, temporal_env):
    approvals_opt_in(project)

    async def the_user(context, params):
        return ElicitResult(action="decline")

    server = build_server(temporal_env.client, project, task_queue=runs.task_queue, client_name="agent-1")
    async with Client(server, elicitation_callback=the_user) as client:
        run_id = await start_hello(client)
        answer = data(await client.call_tool("execute", {**DELETE, "run_id": run_id}))
    (request,) = (await runs.status(run_id)).approvals
    assert answer["status"] == "pending" and f"kiwi approve {run_id} {request.request_id}" in answer["reason"]
    assert answer["result"]["call_id"] and request.status == "pending"
    assert (project / "notes" / "hello.md").exists()


async def test_an_approval_round_cannot_approve_another_call_or_be_replayed(runs, project, temporal_env):
    """The attack: the agent holds the sealed state of one approval round and tries it on another call."""
    approvals_opt_in(project)

    async def never(context, params):
        raise AssertionError("this client drives the round itself")

    server = build_server(temporal_env.client, project, task_queue=runs.task_queue, client_name="agent-1")
    async with Client(server, elicitation_callback=never) as client:
        run_id = await start_hello(client)
        call = {**DELETE, "run_id": run_id}
        question = await client.session.call_tool("execute", call, allow_input_required=True)
        assert isinstance(question, InputRequiredResult)
        key = next(iter(question.input_requests))
        approve = {key: ElicitResult(action="accept", content={"decision": "approve"})}
        # 1. The same state for other arguments (another file): refused, bound to the call as asked.
        other = {**call, "parameters": {"path": "notes/other.md"}}
        with pytest.raises(Exception, match="requestState"):
            await client.session.call_tool(
                "execute", other, input_responses=approve, request_state=question.request_state
            )
        assert [a.status for a in (await runs.status(run_id)).approvals] == ["pending"]
        # 2. The round as asked: approved once, the call runs.
        done = await client.session.call_tool(
            "execute", call, input_responses=approve, request_state=question.request_state
        )
        assert data(done)["status"] == "ok" and not (project / "notes" / "hello.md").exists()
        # 3. The same call again later needs its own approval: the old state replayed does not give it.
        (project / "notes" / "hello.md").write_text("again")
        again = await client.session.call_tool("execute", call, allow_input_required=True)
        assert isinstance(again, InputRequiredResult)
        replayed_result = await client.session.call_tool(
            "execute", call, input_responses=approve, request_state=question.request_state
        )
        replayed = data(replayed_result)  # an isError result in the seeds' error shape
        assert replayed_result.is_error and replayed["error"] == "RunStateConflict"
        assert "already approved" in replayed["message"]
    approvals = (await runs.status(run_id)).approvals
    assert [a.status for a in approvals] == ["approved", "pending"]
    assert (project / "notes" / "hello.md").read_text() == "again"


async def test_the_clients_user_decides_a_call_a_kiwi_mcp_execute_makes(runs, project, temporal_env):
    # kiwi-mcp.execute of an approval-gated tool waits on the call it makes: the user is asked about that
    # call (its tool, its arguments, its hash), and the decision reaches it.
    from tests.helpers import directive_md, write, write_directive

    approvals_opt_in(project)
    write_directive(
        project / ".ai" / "directives" / "tidy.md",
        directive_md(
            '<step name="work"><action>Tidy.</action></step>',
            name="tidy",
            permissions='<execute resource="kiwi-mcp" action="execute"/>'
            '<write resource="filesystem" path="notes/**"/>',
        ),
    )
    write(project / "notes" / "old.txt", "old")
    asked = []

    async def the_user(context, params):
        asked.append(params)
        return ElicitResult(action="accept", content={"decision": "approve"})

    server = build_server(temporal_env.client, project, task_queue=runs.task_queue, client_name="agent-1")
    async with Client(server, elicitation_callback=the_user) as client:
        run_id = (await execute(client, {"item_type": "directive", "action": "run", "item_id": "tidy"}))[
            "run_id"
        ]
        answer = data(
            await client.call_tool(
                "execute",
                {
                    "item_type": "tool",
                    "action": "call",
                    "run_id": run_id,
                    "item_id": "kiwi-mcp.execute",
                    "parameters": {
                        "item_type": "tool",
                        "item_id": "filesystem.delete",
                        "parameters": {"path": "notes/old.txt"},
                    },
                },
            )
        )
    (request,) = (await runs.status(run_id)).approvals
    assert len(asked) == 1 and request.args_hash in asked[0].message
    assert '"path": "notes/old.txt"' in asked[0].message
    assert (
        request.tool == "filesystem.delete" and request.status == "approved" and request.decided_by == "desk"
    )
    assert answer["status"] == "ok", answer
    assert not (project / "notes" / "old.txt").exists()
