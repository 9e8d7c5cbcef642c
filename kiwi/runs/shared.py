"""What the parts of RunClient share: limits and waits, typed answers, and the helpers that turn
Temporal's errors into Kiwi's."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowExecutionStatus, WorkflowHandle, WorkflowUpdateStage
from temporalio.service import RPCError, RPCStatusCode

from kiwi.contracts import RunSnapshot, RunStatus, RunTrust, ToolCallResult, ToolContext
from kiwi.errors import InputInvalid, KiwiError, RunNotFound, TemporalUnavailable
from kiwi.items.directive import Directive
from kiwi.policy import PermissionSet
from kiwi.toolargs import oversized_command, unsendable


@dataclass
class StartedRun:
    run_id: str
    directive: Directive
    context: ToolContext | None = None
    # The grants the run has (the declared ones only when a trusted key signed the directive).
    grants: PermissionSet | None = None
    trust: RunTrust | None = None
    # The run its idempotency key had already started (nothing was started now).
    existing: bool = False


# Arguments over this size (JSON) make a call large: one large call per run is in flight from a client.
LARGE_ARGUMENT_BYTES = 32_000
# How many times a call the run refused as busy (RunBusy: its task took as many call arguments as it may)
# is sent again before the caller is told; each task takes about 1 MB of arguments.
BUSY_RESENDS = 100
# How long a call Temporal refuses for the updates already in flight on its run (RESOURCE_EXHAUSTED: at most
# 10 per execution by default) is sent again before the caller is told the run is busy. The update id makes a
# resend the same call: nothing runs twice.
IN_FLIGHT_SECONDS = 60.0
# How long, and for how many runs, a client keeps a run's snapshot for its refused calls' hints.
SNAPSHOT_SECONDS = 60.0
SNAPSHOTS = 256
# Not-found hints kept with each kept snapshot (one per tool name called).
HINTS_KEPT = 64
# Where the run's directive file is, kept with the hints (no tool has this name: it holds a NUL).
DIRECTIVE_PATH_KEY = "\0directive path"
# How often a client compares the session's base policy with the project's files, and how long it waits
# for a session it ended to close (see RunClient._session_current).
SESSION_CHECK_SECONDS = 1.0
SESSION_RECHECKS = 5
SESSION_END_SECONDS = 30.0
# How long a status query goes unanswered before the run is looked at for a workflow task that keeps failing.
STALL_LOOK_SECONDS = 1.0


_PENDING_STATES = {1: "scheduled", 2: "started", 3: "cancel requested", 4: "paused", 5: "pause requested"}


# (seconds waited, seconds the caller will wait, what the upstream server last reported or "")
Progress = Callable[[float, float, str], Awaitable[None]]


# The least a call's answer is waited for, whatever wait_seconds says: time for the run to take the call or
# refuse it (a finished run, a call id it never had), which a 'pending' answer would hide.
MIN_WAIT_SECONDS = 1.0


async def _wait(
    result: Awaitable[Any],
    wait_seconds: float,
    on_progress: Progress | None,
    upstream: Callable[[], Awaitable[str]] | None = None,
) -> Any:
    """``result`` if it arrives within ``wait_seconds``, else None.

    Every second, ``on_progress`` hears how long it has waited (always increasing, as MCP progress
    must) and what an external MCP server working on the call last reported, if any.
    """
    # (At least MIN_WAIT_SECONDS: with 0 the update was never sent, or a poll never asked, and a call to a
    # finished run, or a call id that does not exist, answered 'pending' all the same: review s33.)
    wait_seconds = max(wait_seconds, MIN_WAIT_SECONDS)
    task = asyncio.ensure_future(result)
    loop = asyncio.get_running_loop()
    started = loop.time()
    while True:
        remaining = wait_seconds - (loop.time() - started)
        if remaining <= 0:
            # The SDK answers a cancelled wait with an error of its own (the call goes on in the run):
            # taken here, or each pending answer left "Task exception was never retrieved" in the log.
            task.add_done_callback(_outcome_taken)
            task.cancel()
            return None
        done, _ = await asyncio.wait({task}, timeout=min(1.0, remaining))
        if done:
            return task.result()
        if on_progress is not None:
            await on_progress(loop.time() - started, wait_seconds, await upstream() if upstream else "")


def _base_policy(snapshot: RunSnapshot) -> str:
    """What of a session's snapshot is its base policy (not who started it, nor when)."""
    parts = snapshot.model_dump(mode="json", include={"grants", "limits", "local_tools", "mcp_servers"})
    parts["mcps"] = snapshot.directive.metadata.tools.model_dump(mode="json")
    return json.dumps(parts, sort_keys=True, default=str)


def _held_hint(run_id: str, message: str) -> str:
    """For a run held by the agent's own question (help escalate), the command that answers it: the run's
    refusal names only `kiwi resume`, which lets the run carry on with the question unanswered."""
    asked = re.search(r"\(escalation ([\w.-]+)", message)
    if asked is None:
        # (Any other hold: a human's resume lets it go on. Second README trial s36: the hint was empty.)
        return (
            f"a human looks at the run (`kiwi status {run_id}`) and lets it carry on with `kiwi resume {run_id}`; "
            "until then, wait or ask for help (help(action='escalate'))"
            if "held" in message or "stuck" in message or "awaiting_human" in message
            else ""
        )
    return (
        f"a human answers the question with `kiwi decide {run_id} {asked.group(1)} OPTION` (`kiwi status "
        f"{run_id}` lists its options), and the run carries on with the answer"
    )


def _outcome_taken(task: asyncio.Future[Any]) -> None:
    """Retrieve a task's outcome nobody awaits (a cancelled wait's error), so none is logged as lost."""
    if not task.cancelled():
        task.exception()


async def _accepted_then_answered(handle: WorkflowHandle, update: Any, arg: Any, update_id: str) -> Any:
    """An update's answer: accepted by the run, then answered. Both are what a caller waits for within its
    ``wait_seconds`` (see :func:`_wait`): a call the run makes in the workflow task that takes it (a local
    activity, an external MCP server's call) is accepted only once that task completes, after the call."""
    started = await handle.start_update(
        update, arg, id=update_id, wait_for_stage=WorkflowUpdateStage.ACCEPTED
    )
    return await started.result()


# The first workflow task is over: completed, or the execution already handed over or closed.
_FIRST_TASK_OVER = (
    EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TIMED_OUT,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCELED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TERMINATED,
)


def _pending(tool: str, run_id: str, call_id: str, wait_seconds: float) -> ToolCallResult:
    return ToolCallResult(
        status="pending",
        tool=tool,
        result={"call_id": call_id, "run_id": run_id},
        reason=f"still running after {wait_seconds:g}s; it goes on in the run",
        hint=f"poll with execute(item_type='run', action='poll', run_id='{run_id}', item_id='{call_id}'), "
        "or watch the run's status",
    )


def _unsendable(tool: str, arguments: Any, size: int | None = None) -> ToolCallResult | None:
    """Arguments the workflow could not even be asked about (over Temporal's payload limit, not an object):
    answered here, since an update that large would leave the run retrying it."""
    # The run refuses (and audits) every other wrong argument itself.
    problem = unsendable(tool, arguments, size) or oversized_command(tool, arguments)
    if problem is None:
        return None
    return ToolCallResult(
        status="error", tool=tool, error_type=InputInvalid.type, reason=problem.reason, hint=problem.hint
    )


def _quote(value: str) -> str:
    return value.replace("\\", "\\\\").replace("'", "\\'")


def _translate(exc: RPCError, run_id: str) -> KiwiError:
    if exc.status == RPCStatusCode.NOT_FOUND:
        return RunNotFound(f"no run '{run_id}'", hint="list runs with `kiwi runs`")
    cut_off = exc.status in (
        RPCStatusCode.UNAVAILABLE,
        RPCStatusCode.CANCELLED,
        RPCStatusCode.DEADLINE_EXCEEDED,
    )
    # (A connection the server dropped mid-request comes back from the SDK's core as "transport error".)
    if cut_off or exc.message == "transport error":
        return TemporalUnavailable(
            f"Temporal did not answer: {exc.message}",
            hint="try again in a moment (`kiwi doctor` checks the server)",
        )
    return KiwiError(f"Temporal refused the request: {exc.message}")


# How many executions of a run (continue-as-new) poll looks back through for a call's answer.
POLL_EXECUTIONS = 20
# The memo key of a project's session that names the execution of the session it replaced.
REPLACES = "kiwi_replaces"
# How long a decision's sender watches the run take it before saying it is sent but not yet taken.
DECISION_WAIT_SECONDS = 15.0
# A child run's status in its ended parent's status, from how Temporal closed it (when it has no KiwiStatus).
_CLOSED_AS = {
    WorkflowExecutionStatus.COMPLETED: "completed",
    WorkflowExecutionStatus.FAILED: "failed",
    WorkflowExecutionStatus.CANCELED: "cancelled",
    WorkflowExecutionStatus.TERMINATED: "terminated",
    WorkflowExecutionStatus.TIMED_OUT: "timed_out",
}
# The prefix of a failed workflow task's cause, left out when the cause stands in for an empty message.
_FAILED_CAUSE = "WORKFLOW_TASK_FAILED_CAUSE_"
# How long a status query is waited for before the run is taken to have no worker answering for it.
QUERY_SECONDS = 5.0
# After a status query went unanswered, how long the client takes the worker to be gone without asking again.
UNANSWERED_SECONDS = 15.0
# A poller Temporal last saw this long ago is gone (a live worker polls again at once, at most every 70 s).
POLLER_SEEN_SECONDS = 90.0


def _approval_answered(status: RunStatus, request_id: str) -> bool:
    return any(a.request_id == request_id and a.status != "pending" for a in status.approvals)


def _escalation_answered(status: RunStatus, request_id: str) -> bool:
    return any(d.request_id == request_id and d.answer for d in status.decisions)


def _aborted(exc: RPCError) -> bool:
    """Whether Temporal dropped an update it had admitted but the run had not accepted (its worker went away, or
    its workflow task failed): UNAVAILABLE, which the server gives no detail of but its message."""
    return exc.status == RPCStatusCode.UNAVAILABLE and "update was aborted" in exc.message
