"""Durable MCP Tasks (io.modelcontextprotocol/tasks) backed by Temporal, with a real MCP client that
declares the extension, against `kiwi mcp --http` processes, a real Temporal server and a worker."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any, Literal

import pytest
from mcp.client import Client
from mcp.client.extension import ClientExtension, ResultClaim
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolResult, Request, RequestParams, Result
from pydantic import ConfigDict, Field

from kiwi.devserver import free_port
from mcp_frontend.server import build_server
from tests.helpers import approver, directive_md, execute, kiwi_mcp_http, wait_for, write, write_directive

TASKS = "io.modelcontextprotocol/tasks"


class TaskHandle(Result):
    """``CreateTaskResult`` as the client sees it (``resultType: "task"``)."""

    model_config = ConfigDict(extra="allow")
    result_type: Literal["task"] = "task"
    task_id: str
    status: str
    status_message: str | None = None
    created_at: str
    last_updated_at: str
    ttl_ms: int | None = None
    poll_interval_ms: int | None = None


class TaskState(Result):
    """A ``tasks/get`` answer: the task and, once terminal, its result or error."""

    model_config = ConfigDict(extra="allow")
    task_id: str
    status: str
    status_message: str | None = None
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    input_requests: dict[str, Any] | None = None
    poll_interval_ms: int | None = None


class TaskIdParams(RequestParams):
    task_id: str = Field(alias="taskId")


class GetTask(Request[TaskIdParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    name_param = "taskId"


class CancelTask(Request[TaskIdParams, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    name_param = "taskId"


class Tasks(ClientExtension):
    """The client half of the extension: declares it and lets `call_tool` hand back the task handle."""

    identifier = TASKS

    def claims(self):
        return [ResultClaim(result_type="task", model=TaskHandle, resolve=self._resolve)]

    async def _resolve(self, handle: TaskHandle, ctx) -> CallToolResult:
        while True:
            state = await get_task(ctx.session, handle.task_id)
            if state.status in ("completed", "failed", "cancelled"):
                return CallToolResult.model_validate(state.result or {"content": [], "isError": True})
            await asyncio.sleep((state.poll_interval_ms or 500) / 1000)


async def get_task(session, task_id: str) -> TaskState:
    return await session.send_request(GetTask(params=TaskIdParams(taskId=task_id)), TaskState)


async def start_task(client: Client, arguments: dict[str, Any]) -> TaskHandle:
    handle = await client.session.call_tool("execute", arguments, allow_claimed=True)
    assert isinstance(handle, TaskHandle), handle
    return handle


def gate_tool(project: Path) -> None:
    """A local tool that blocks until the test opens the gate (a file): a long build, a slow upstream."""
    write(
        project / ".ai" / "tools" / "gate" / "tool.yaml",
        "tool_id: gate\ntool_type: python\nexecutor:\n  entrypoint: main.py\n",
    )
    write(
        project / ".ai" / "tools" / "gate" / "main.py",
        "import pathlib, time\n\n\ndef main():\n    while not pathlib.Path('gate.open').exists():\n"
        "        time.sleep(0.05)\n    return {'passed': True}\n",
    )
    write_directive(
        project / ".ai" / "directives" / "gated_build.md",
        directive_md(
            '<step name="build"><description>wait at the gate</description>'
            '<tool_call tool="gate"></tool_call></step>',
            name="gated_build",
            permissions='<execute resource="tool" id="gate" />',
        ),
    )


RUN_GATED = {"item_type": "directive", "action": "run", "item_id": "gated_build"}


async def test_a_directive_run_task_survives_the_front_end_being_killed(runs, project, temporal_env):
    gate_tool(project)
    port = free_port()
    async with kiwi_mcp_http(temporal_env, runs, project, port) as (url, proc):
        async with Client(url, extensions=[Tasks()]) as client:
            handle = await start_task(client, RUN_GATED)
            assert handle.status == "working" and handle.task_id.startswith("run:run-gated_build-")
            state = await get_task(client.session, handle.task_id)
            assert state.status == "working" and state.result is None
        os.killpg(proc.pid, signal.SIGKILL)  # the front end dies; the client kept only the task id
        await proc.wait()
    run_id = handle.task_id.removeprefix("run:")
    assert (await runs.status(run_id)).status == "running"

    async with (
        kiwi_mcp_http(temporal_env, runs, project, port) as (url, _),
        Client(url, extensions=[Tasks()]) as client,
    ):
        assert (await get_task(client.session, handle.task_id)).status == "working"
        (project / "gate.open").write_text("")

        async def finished():
            state = await get_task(client.session, handle.task_id)
            return state if state.status != "working" else None

        state = await wait_for(finished, what="the task to finish")
        assert state.status == "completed", state
        answer = state.result["structuredContent"]
        assert answer["run_id"] == run_id and answer["state"] == "completed"
        assert answer["outputs"]["build"]["result"] == {"passed": True}
        assert state.result["isError"] is False


async def test_cancelling_the_task_cancels_the_run(runs, project, temporal_env):
    gate_tool(project)
    write_directive(
        project / ".ai" / "directives" / "two_steps.md",
        directive_md(
            '<step name="build"><tool_call tool="gate"></tool_call></step>'
            '<step name="publish"><tool_call tool="filesystem.write"><param name="path">notes/published.txt'
            '</param><param name="content">published</param></tool_call></step>',
            name="two_steps",
            permissions='<execute resource="tool" id="gate" /><write resource="filesystem" path="notes/**" />',
        ),
    )
    server = build_server(temporal_env.client, project, task_queue=runs.task_queue)
    async with Client(server, extensions=[Tasks()]) as client:
        handle = await start_task(client, {"item_type": "directive", "action": "run", "item_id": "two_steps"})
        run_id = handle.task_id.removeprefix("run:")
        await client.session.send_request(CancelTask(params=TaskIdParams(taskId=handle.task_id)), Result)
        # Cancellation is cooperative: the step in flight finishes, nothing after it starts.
        (project / "gate.open").write_text("")

        async def cancelled():
            return (await runs.status(run_id)).status == "cancelled"

        await wait_for(cancelled, what="the run to be cancelled")
        state = await get_task(client.session, handle.task_id)
        assert state.status == "cancelled" and state.result is None
        assert not (project / "notes" / "published.txt").exists()


async def test_a_run_waiting_for_approval_is_a_working_task_until_a_human_decides(
    runs, project, temporal_env
):
    write_directive(
        project / ".ai" / "directives" / "guarded_write.md",
        directive_md(
            '<step name="write"><tool_call tool="filesystem.write"><param name="path">notes/guarded.txt'
            '</param><param name="content">written</param></tool_call></step>',
            name="guarded_write",
            permissions='<write resource="filesystem" path="notes/**" />',
            extra_meta='<approvals timeout="600"><tool>filesystem.write</tool></approvals>',
        ),
    )
    alice = approver("alice")  # trusted before the run starts: the run records its approvers then
    server = build_server(temporal_env.client, project, task_queue=runs.task_queue)
    async with Client(server, extensions=[Tasks()]) as client:
        handle = await start_task(
            client, {"item_type": "directive", "action": "run", "item_id": "guarded_write"}
        )
        run_id = handle.task_id.removeprefix("run:")

        async def waits_for_approval():
            state = await get_task(client.session, handle.task_id)
            return state if "approv" in (state.status_message or "") else None

        state = await wait_for(waits_for_approval, what="the task to say it waits for an approval")
        assert state.status == "working" and state.poll_interval_ms == 5000
        assert not (project / "notes" / "guarded.txt").exists()
        request = (await runs.status(run_id)).approvals[0].request_id
        await runs.decide_approval(run_id, request, True, by=alice, reason="looked fine")
        state = await wait_for(lambda: _terminal(client, handle.task_id), what="the task to complete")
        assert state.status == "completed" and state.result["structuredContent"]["state"] == "completed"
        assert (project / "notes" / "guarded.txt").read_text() == "written"


async def test_a_slow_call_becomes_a_task_and_the_client_gets_its_result(runs, project, temporal_env):
    gate_tool(project)
    server = build_server(temporal_env.client, project, task_queue=runs.task_queue)
    async with Client(server, extensions=[Tasks()]) as client:
        # A run whose grants include the gate: the agent step of a directive made for it.
        write_directive(
            project / ".ai" / "directives" / "agent_gate.md",
            directive_md(
                '<step name="work"><action>call the gate</action></step>',
                name="agent_gate",
                permissions='<execute resource="tool" id="gate" />',
            ),
        )
        handle = await start_task(
            client, {"item_type": "directive", "action": "run", "item_id": "agent_gate"}
        )
        state = await wait_for(
            lambda: _terminal(client, handle.task_id), what="the run to wait for its agent"
        )
        answer = state.result["structuredContent"]
        assert answer["state"] == "awaiting_agent" and answer["current_step"]["name"] == "work"
        run_id = answer["run_id"]

        call = {"item_type": "tool", "action": "call", "run_id": run_id, "item_id": "gate"}
        call_handle = await start_task(client, call)
        assert call_handle.task_id.startswith(f"call:{run_id}:")
        assert (await get_task(client.session, call_handle.task_id)).status == "working"
        (project / "gate.open").write_text("")
        state = await wait_for(lambda: _terminal(client, call_handle.task_id), what="the call to finish")
        assert state.status == "completed"
        assert state.result["structuredContent"]["status"] == "ok"
        assert state.result["structuredContent"]["result"] == {"passed": True}
        # A call that finishes within the wait is answered as usual, task-capable client or not.
        resolved = await client.call_tool("execute", call)
        assert resolved.structured_content["status"] == "ok"


async def _terminal(client: Client, task_id: str) -> TaskState | None:
    state = await get_task(client.session, task_id)
    return state if state.status in ("completed", "failed", "cancelled") else None


async def test_clients_without_the_extension_get_no_task_and_cannot_ask_for_one(runs, project, temporal_env):
    gate_tool(project)
    server = build_server(temporal_env.client, project, task_queue=runs.task_queue)
    async with Client(server) as plain, Client(server, extensions=[Tasks()]) as tasking:
        answer = await execute(plain, {**RUN_GATED, "parameters": {}, "wait_seconds": 1})
        assert answer["state"] == "running" and answer["run_id"].startswith("run-gated_build-")
        handle = await start_task(tasking, RUN_GATED)
        missing = await tasking.session.call_tool(
            "execute", {"item_type": "directive", "action": "run", "item_id": "nope"}, allow_claimed=True
        )
        assert missing.structured_content["error"] == "ItemNotFound"  # a mistake is an answer, not a task
        assert missing.is_error  # and an error, as the tool answers it without tasks
        with pytest.raises(MCPError) as refused:
            await get_task(plain.session, handle.task_id)
        assert refused.value.error.code == -32021
        with pytest.raises(MCPError) as unknown:
            await get_task(tasking.session, "run:run-nope-0")
        assert unknown.value.error.code == -32602
        with pytest.raises(MCPError) as foreign:
            await get_task(tasking.session, "something-else")
        assert foreign.value.error.code == -32602
        (project / "gate.open").write_text("")
