"""Durable MCP Tasks (the ``io.modelcontextprotocol/tasks`` extension, SEP-2663) backed by Temporal.

When a client declares the extension on its request (2026-07-28), ``execute`` may answer with a task
handle (``resultType: "task"``) instead of its result:

- ``execute(directive, run)``: the run starts and the answer is at once a task ``run:{run_id}``. The
  task works while the run runs by itself (automatic steps, calls waiting for approval) and completes
  when the run first needs its agent (an agent step) or ends; its result is what ``execute`` answers
  without a task (run id, state, current step with instructions). A run cancelled before that makes
  the task ``cancelled``; ``tasks/cancel`` cancels the run.
- ``execute(tool, call, run_id)``: a call still running after ``wait_seconds`` (default 2 s with
  tasks) becomes a task ``call:{run_id}:{call_id}`` instead of Kiwi's ``pending`` answer; it
  completes with the call's result. Its id names the Workflow Update that carries the call.

The task id is all the state there is: ``tasks/get`` and ``tasks/cancel`` read the run from Temporal,
so any front end answers them, before or after a restart. Clients that do not declare the extension
get Kiwi's own ``pending`` and ``poll`` as before.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.extension import Extension, MethodBinding
from mcp.server.mcpserver.server import require_client_extension
from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR, INVALID_PARAMS, CallToolRequestParams, RequestParams
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import Field
from temporalio.client import WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from kiwi.contracts import TERMINAL, RunStatus, ToolCallResult
from kiwi.errors import KiwiError, RunInOtherProject, RunNotFound
from mcp_frontend.answers import next_move

if TYPE_CHECKING:
    from mcp_frontend.link import TemporalLink

TASKS = "io.modelcontextprotocol/tasks"
# With a task to fall back on, a call answers with one after this long unless the caller asked otherwise.
TASK_CALL_WAIT = 2.0
WORKING_POLL_MS = 1000
WAITING_POLL_MS = 5000


class TaskParams(RequestParams):
    task_id: str = Field(alias="taskId")


class UpdateTaskParams(TaskParams):
    input_responses: dict[str, Any] = Field(default_factory=dict, alias="inputResponses")


def client_takes_tasks(ctx: ServerRequestContext[Any, Any]) -> bool:
    """Whether this request's client declared the tasks extension (on a wire that can carry a task)."""
    if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
        return False
    capabilities = ctx.session.client_capabilities
    return bool(capabilities and capabilities.extensions and TASKS in capabilities.extensions)


def run_task_id(run_id: str) -> str:
    return f"run:{run_id}"


def call_task_id(run_id: str, call_id: str) -> str:
    return f"call:{run_id}:{call_id}"


def parse_task_id(task_id: str) -> tuple[str, str, str]:
    """``(kind, run_id, call_id)`` of a task id this server made; INVALID_PARAMS for anything else."""
    kind, _, rest = task_id.partition(":")
    run_id, _, call_id = rest.partition(":")
    if kind == "run" and run_id and not call_id:
        return kind, run_id, ""
    if kind == "call" and run_id and call_id and ":" not in call_id:
        return kind, run_id, call_id
    raise MCPError(code=INVALID_PARAMS, message=f"Failed to retrieve task: no task '{task_id}'")


class KiwiTasks(Extension):
    """The tasks extension: a ``tools/call`` interceptor for ``execute`` and ``tasks/get|update|cancel``."""

    identifier = TASKS

    def __init__(self, link: TemporalLink, client_name: str) -> None:
        self.link = link
        self.client_name = client_name

    def methods(self) -> list[MethodBinding]:
        versions = frozenset(MODERN_PROTOCOL_VERSIONS)
        return [
            MethodBinding("tasks/get", TaskParams, self.get, protocol_versions=versions),
            MethodBinding("tasks/update", UpdateTaskParams, self.update, protocol_versions=versions),
            MethodBinding("tasks/cancel", TaskParams, self.cancel, protocol_versions=versions),
        ]

    # ------------------------------------------------------------------ creating tasks
    async def intercept_tool_call(
        self, params: CallToolRequestParams, ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        arguments = params.arguments or {}
        if params.name != "execute" or not client_takes_tasks(ctx):
            return await call_next(ctx)
        item_type, action = arguments.get("item_type"), arguments.get("action")
        if item_type == "directive" and action == "run":
            return await self._start_run(arguments)
        if item_type in ("tool", "mcp") and action == "call" and arguments.get("run_id"):
            # The handler is called with these very params: a shorter wait, then a task.
            arguments.setdefault("wait_seconds", TASK_CALL_WAIT)
            return _call_as_task(await call_next(ctx))
        return await call_next(ctx)

    async def _start_run(self, arguments: dict[str, Any]) -> HandlerResult:
        parameters = arguments.get("parameters") or {}
        key = arguments.get("idempotency_key")
        try:
            runs = await self.link.runs()
            started = await runs.launch(
                str(arguments.get("item_id") or ""),
                parameters if isinstance(parameters, dict) else {},
                idempotency_key=key if isinstance(key, str) else None,
                client_name=self.client_name,
            )
        except KiwiError as exc:
            # Answered as the tool answers it, in the seeds' error shape; never started a second time.
            from mcp_frontend.answers import error_shape

            shape = error_shape("directive", "run", str(arguments.get("item_id") or ""), exc)
            return _tool_result(shape, is_error=True)
        # start_workflow returned: the run is durable in Temporal, so tasks/get resolves now. The seed
        # asks nothing of the run itself, so it answers at once even with every worker busy or down.
        now = _iso(None)
        return {
            "resultType": "task",
            "taskId": run_task_id(started.run_id),
            "status": "working",
            "statusMessage": f"run {started.run_id} started",
            "createdAt": now,
            "lastUpdatedAt": now,
            "ttlMs": None,
            "pollIntervalMs": WORKING_POLL_MS,
        }

    # ------------------------------------------------------------------ tasks/*
    async def get(self, ctx: ServerRequestContext[Any, Any], params: TaskParams) -> dict[str, Any]:
        require_client_extension(ctx, TASKS)
        kind, run_id, call_id = parse_task_id(params.task_id)
        task = await (self._run_task(run_id) if kind == "run" else self._call_task(run_id, call_id))
        return {"resultType": "complete", **task}

    async def update(self, ctx: ServerRequestContext[Any, Any], params: UpdateTaskParams) -> dict[str, Any]:
        require_client_extension(ctx, TASKS)
        _, run_id, _ = parse_task_id(params.task_id)
        await self._described(run_id)  # an unknown task is an error, as the spec asks
        # Kiwi's tasks never ask for input (a run task ends when the run needs its agent, before any
        # escalation; approvals are never asked of a client), so no response is outstanding to apply.
        return {"resultType": "complete"}

    async def cancel(self, ctx: ServerRequestContext[Any, Any], params: TaskParams) -> dict[str, Any]:
        require_client_extension(ctx, TASKS)
        kind, run_id, _ = parse_task_id(params.task_id)
        await self._described(run_id)
        if kind == "run":
            try:
                await (await self.link.runs()).cancel(run_id, "cancelled through its MCP task")
            except KiwiError as exc:
                raise MCPError(code=INVALID_PARAMS, message=f"Failed to cancel task: {exc.message}") from None
        # A call inside a run cannot be withdrawn once the run admitted it: cancellation is
        # cooperative, so the ack stands and the call's task ends with the call.
        return {"resultType": "complete"}

    # ------------------------------------------------------------------ task views
    async def _described(self, run_id: str) -> Any:
        try:
            runs = await self.link.runs()
            # (Another project's run is not this client's task: update and cancel said it existed, review s35.)
            await runs.check_project(run_id)
            return await runs.handle(run_id).describe()
        except RunInOtherProject:
            raise MCPError(
                code=INVALID_PARAMS, message=f"Failed to retrieve task: no run '{run_id}' in this project"
            ) from None
        except RPCError as exc:
            if exc.status != RPCStatusCode.NOT_FOUND:
                raise MCPError(code=INTERNAL_ERROR, message=f"Temporal refused: {exc.message}") from None
            raise MCPError(
                code=INVALID_PARAMS, message=f"Failed to retrieve task: no run '{run_id}'"
            ) from None
        except KiwiError as exc:
            raise MCPError(code=INTERNAL_ERROR, message=f"Failed to retrieve task: {exc.message}") from None

    async def _status(self, run_id: str) -> RunStatus:
        try:
            return await (await self.link.runs()).status(run_id)
        except RunNotFound:
            raise MCPError(
                code=INVALID_PARAMS, message=f"Failed to retrieve task: no run '{run_id}'"
            ) from None
        except KiwiError as exc:
            raise MCPError(code=INTERNAL_ERROR, message=f"Failed to retrieve task: {exc.message}") from None

    async def _run_task(self, run_id: str) -> dict[str, Any]:
        description = await self._described(run_id)
        status = await self._status(run_id)
        task = _times(description, run_task_id(run_id))
        if _needed_agent(status) or (status.status in TERMINAL and status.status != "cancelled"):
            return {**task, "status": "completed", "result": _tool_result(run_answer(status))}
        if status.status == "cancelled":
            return {**task, "status": "cancelled", "statusMessage": status.error or "the run was cancelled"}
        waiting = status.status == "awaiting_approval" or bool(status.waiting_for)
        return {
            **task,
            "status": "working",
            "statusMessage": status.waiting_for or f"running step {_step_name(status)}",
            "pollIntervalMs": WAITING_POLL_MS if waiting else WORKING_POLL_MS,
        }

    async def _call_task(self, run_id: str, call_id: str) -> dict[str, Any]:
        description = await self._described(run_id)
        task = _times(description, call_task_id(run_id, call_id))
        runs = await self.link.runs()
        try:
            answer = await runs.poll_call(run_id, call_id, wait_seconds=0.2)
        except KiwiError as exc:
            raise MCPError(code=INVALID_PARAMS, message=f"Failed to retrieve task: {exc.message}") from None
        if answer.status != "pending":
            return {**task, "status": "completed", "result": _tool_result(answer.model_dump())}
        if description.status != WorkflowExecutionStatus.RUNNING:
            return {**task, "status": "cancelled", "statusMessage": "the run ended before the call did"}
        status = await self._status(run_id)
        waiting = [a for a in status.approvals if a.status == "pending"]
        message = (
            f"waits for a human to approve it ({waiting[-1].request_id}, until {waiting[-1].expires_at})"
            if waiting
            else "the call is running in the run"
        )
        return {
            **task,
            "status": "working",
            "statusMessage": message,
            "pollIntervalMs": WAITING_POLL_MS if waiting else WORKING_POLL_MS,
        }


def run_answer(status: RunStatus) -> dict[str, Any]:
    """What a finished run task holds: what the agent needs to carry on with the run."""
    answer: dict[str, Any] = {
        "run_id": status.run_id,
        "directive": status.directive,
        "state": status.status,
        "current_step": status.current_step.model_dump() if status.current_step else None,
        "outputs": {s.name: s.outputs for s in status.steps if s.outputs},
    }
    if status.error:
        answer["error"] = status.error
    if status.waiting_for:
        answer["waiting_for"] = status.waiting_for
    answer["instructions"] = next_move(status)
    return answer


def _needed_agent(status: RunStatus) -> bool:
    """Whether the run has reached a step that waits for its agent: the task's work is done then."""
    return any(s.mode == "agent" and s.status not in ("pending", "skipped") for s in status.steps)


def _step_name(status: RunStatus) -> str:
    return status.current_step.name if status.current_step else "(none)"


def _tool_result(answer: dict[str, Any], is_error: bool = False) -> dict[str, Any]:
    """A ``CallToolResult`` on the wire, as the tool itself would have answered."""
    return {
        "resultType": "complete",
        "content": [
            {"type": "text", "text": json.dumps(answer, indent=2 if is_error else None, default=str)}
        ],
        "structuredContent": answer,
        "isError": is_error,
    }


def _iso(moment: datetime | None) -> str:
    return (moment or datetime.now(UTC)).astimezone(UTC).isoformat().replace("+00:00", "Z")


def _times(description: Any, task_id: str) -> dict[str, Any]:
    return {
        "taskId": task_id,
        "createdAt": _iso(description.start_time),
        "lastUpdatedAt": _iso(description.close_time),
        "ttlMs": None,
    }


def _call_as_task(result: HandlerResult) -> HandlerResult:
    """A ``pending`` call answer becomes a task handle for that call; any other answer stays as it is."""
    structured = getattr(result, "structured_content", None)
    if not isinstance(structured, dict) or structured.get("status") != "pending":
        return result
    pending = ToolCallResult.model_validate(structured)
    ids = pending.result if isinstance(pending.result, dict) else {}
    run_id, call_id = ids.get("run_id"), ids.get("call_id")
    if not run_id or not call_id:
        return result
    now = _iso(None)
    return {
        "resultType": "task",
        "taskId": call_task_id(str(run_id), str(call_id)),
        "status": "working",
        "statusMessage": pending.reason,
        "createdAt": now,
        "lastUpdatedAt": now,
        "ttlMs": None,
        "pollIntervalMs": WORKING_POLL_MS,
    }
