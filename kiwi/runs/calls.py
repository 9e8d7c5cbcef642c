"""Agent calls into a run: sent as updates, answered or pending, followed across continue-as-new.

A part of :class:`kiwi.runs.RunClient`, which mixes it in."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from temporalio.client import (
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowHistoryEventFilterType,
    WorkflowUpdateFailedError,
)
from temporalio.service import RPCError, RPCStatusCode

from kiwi.contracts import (
    CallToolRequest,
    CompleteStepRequest,
    CompleteStepResult,
    HelpRequest,
    ToolCallResult,
    is_session,
)
from kiwi.errors import (
    InputInvalid,
    KiwiError,
    RunBusy,
    RunContinuing,
    RunFinished,
    RunStateConflict,
    RunTimedOut,
    ToolNotFound,
)
from kiwi.explain import not_found_hint, trust_hint
from kiwi.policy import BUILTIN_TOOLS
from kiwi.runs.shared import (
    _FIRST_TASK_OVER,
    BUSY_RESENDS,
    DIRECTIVE_PATH_KEY,
    HINTS_KEPT,
    IN_FLIGHT_SECONDS,
    LARGE_ARGUMENT_BYTES,
    POLL_EXECUTIONS,
    REPLACES,
    Progress,
    _aborted,
    _accepted_then_answered,
    _held_hint,
    _pending,
    _translate,
    _unsendable,
    _wait,
)
from kiwi.seal import progress_sealed
from kiwi.toolargs import arguments_bytes, inner_call
from workflows.directive_run import DirectiveRun


class RunCalls:
    """Agent calls into a run: sent as updates, answered or pending, followed across continue-as-new."""

    async def call_tool(
        self,
        run_id: str,
        tool: str,
        arguments: dict[str, Any],
        client_name: str = "cli",
        update_id: str | None = None,
    ) -> ToolCallResult:
        size = arguments_bytes(arguments)
        if (refused := _unsendable(tool, arguments, size)) is not None:
            return refused
        request = CallToolRequest(tool=tool, arguments=arguments, client=client_name)
        async with self._argument_room(run_id, size or 0):
            result = await self._update(run_id, DirectiveRun.call_tool, request, update_id)
        return self._why_not_found(await self._explained(run_id, result, arguments))

    async def _explained(
        self, run_id: str, result: ToolCallResult, arguments: dict[str, Any]
    ) -> ToolCallResult:
        """A refused call's hint names the real fix (see kiwi.explain), from the run's snapshot: a tool the
        run does not have lists the tools it may call; a directive whose <permissions> would allow the call
        but which runs without them (changed after signing, unsigned) is signed again, not given more."""
        unknown = result.error_type == ToolNotFound.type
        if result.status != "denied" and not unknown:
            return result
        try:
            _, snap, hints = await self._kept_snapshot(run_id)
        except (KiwiError, ValueError):
            snap = None  # (a snapshot that cannot be read: the run's own answer stands)
        if snap is None:
            return result
        if unknown:
            # (Worked out once per tool while the snapshot is kept: an agent repeating the call gets it
            # again without the walk over every tool the run has.)
            hint = hints.get(result.tool)
            if hint is None:
                hint = not_found_hint(result.tool, snap, outside_run=run_id == self.session_id)
                if len(hints) < HINTS_KEPT:  # (an agent trying names by the thousand holds no more)
                    hints[result.tool] = hint
            result.hint = hint or result.hint
            return result
        if snap.trust.grants != "base":
            if "to <permissions>" in result.hint and run_id != self.session_id:
                # An agent that took "add ... to <permissions>" at its word (execute(directive, update))
                # unsigned the directive: its next run had the base policy only.
                if (path := hints.get(DIRECTIVE_PATH_KEY)) is None:  # (found once while the snapshot is kept)
                    path = hints[DIRECTIVE_PATH_KEY] = self.directive_path(snap.directive.name)
                result.hint += (
                    f"; a human makes that change to the directive and signs it again (`kiwi sign {path}`): "
                    "changed without it, it runs with the base policy only"
                )
            return result
        directive = snap.directive
        hint = trust_hint(snap.trust, directive.name, self.directive_path(directive.name))
        declared = directive.grants().check(
            result.tool, arguments, blocked_commands=snap.limits.blocked_commands
        )
        result.hint = hint if declared.allowed else f"{result.hint}; also: {hint}"
        return result

    @contextlib.asynccontextmanager
    async def _argument_room(self, run_id: str, size: int) -> AsyncIterator[None]:
        """One call with large arguments in flight per run from this client. Temporal hands a run the
        calls admitted for it together, in one workflow task of at most 4 MB, and ends the run when they
        do not fit: ten calls of 900 KB sent at once did that. ``size``: the arguments' JSON bytes."""
        if size <= LARGE_ARGUMENT_BYTES:
            yield
            return
        lock = self._large_calls.get(run_id)
        if lock is None:  # (held weakly: gone once no call holds or waits for it)
            lock = self._large_calls[run_id] = asyncio.Lock()
        async with lock:
            yield

    def _why_not_found(self, result: ToolCallResult) -> ToolCallResult:
        """A call of a tool the run does not have: when the project holds a manifest with that id that
        cannot run (docker, mcp, invalid), the hint says so instead of leaving the agent to guess."""
        if result.error_type != ToolNotFound.type or "." in result.tool:
            return result
        with contextlib.suppress(KiwiError, OSError):
            for record in self.store.list_items("tool"):
                if record.item_id == result.tool and not record.valid:
                    result.hint = f"tool '{result.tool}' is in the project but cannot run: " + "; ".join(
                        record.problems[:2]
                    )
        return result

    async def complete_step(self, run_id: str, step: str, outputs: dict[str, Any]) -> CompleteStepResult:
        return await self._update(
            run_id, DirectiveRun.complete_step, CompleteStepRequest(step=step, outputs=outputs), None
        )

    async def help(self, run_id: str, request: HelpRequest) -> None:
        await self._signal(run_id, DirectiveRun.help, request)

    async def _closed_or_missing(self, exc: RPCError, run_id: str) -> KiwiError:
        """A signal to a closed run is "not found" to Temporal: say it has finished, and how."""
        if exc.status == RPCStatusCode.NOT_FOUND:
            try:
                description = await self.handle(run_id).describe()
            except RPCError:
                return _translate(exc, run_id)
            if description.status != WorkflowExecutionStatus.RUNNING:
                return RunFinished(
                    f"{await self._how_it_ended(run_id, description.status)}; it takes no more signals",
                    hint=f"see `kiwi status {run_id}` and `kiwi audit {run_id}`; start a new run to go on",
                )
        return _translate(exc, run_id)

    async def _ended_during_call(self, run_id: str) -> RunFinished | None:
        """A call whose run ended before answering it (Temporal says only "the workflow completed before
        the update"): how the run ended, and why when it failed."""
        try:
            description = await self.handle(run_id).describe()
        except RPCError:
            return None
        if description.status == WorkflowExecutionStatus.RUNNING:
            return None
        why = ""
        if description.status == WorkflowExecutionStatus.FAILED:
            try:
                await self.handle(run_id).result(follow_runs=False)
            except WorkflowFailureError as exc:
                why = f": {getattr(exc.cause, 'message', '') or exc.cause}"
            except (RPCError, KiwiError, ValueError):
                pass
        return RunFinished(
            f"{await self._how_it_ended(run_id, description.status)} before answering this call{why}",
            hint=f"see `kiwi status {run_id}` and `kiwi audit {run_id}`; start a new run to go on",
        )

    async def _how_it_ended(self, run_id: str, closed: WorkflowExecutionStatus | None) -> str:
        """ "run X was cancelled" or "run X has finished (failed)": a run cancelled or failed in Kiwi's terms
        returns normally, so Temporal calls it completed; its result says how it really ended."""
        how = closed.name.lower() if closed else "closed"
        if closed == WorkflowExecutionStatus.COMPLETED:
            # (A result that cannot be read, one kept in a payload store that no longer has it say, leaves
            # Temporal's word: the answer is that the run ended, never the read's error.)
            with contextlib.suppress(RPCError, WorkflowFailureError, KiwiError, ValueError):
                how = (await self.handle(run_id).result(follow_runs=False)).status
        elif closed == WorkflowExecutionStatus.FAILED:
            # A run past its deadline fails with RunTimedOut: `kiwi status` says timed_out, and so does this.
            try:
                await self.handle(run_id).result(follow_runs=False)
            except WorkflowFailureError as exc:
                if getattr(exc.cause, "type", None) == RunTimedOut.type:
                    how = "timed_out"
            except (RPCError, KiwiError, ValueError):
                pass
        cancelled = how in ("cancelled", "canceled")
        return f"run {run_id} was cancelled" if cancelled else f"run {run_id} has finished ({how})"

    async def _update(
        self,
        run_id: str,
        update: Callable[..., Any],
        arg: Any,
        update_id: str | None,
        wait_seconds: float | None = None,
        on_progress: Progress | None = None,
    ) -> Any:
        """Send an update; with ``wait_seconds``, answer ``None`` if it has not finished by then."""
        await self.check_project(run_id)
        handle = self.handle(run_id)
        update_id = update_id or uuid.uuid4().hex
        busy = 0
        attempt = 0
        crowded_since: float | None = None
        while attempt < 20:
            attempt += 1
            try:
                if wait_seconds is None:
                    return await handle.execute_update(update, arg, id=update_id)
                return await _wait(
                    _accepted_then_answered(handle, update, arg, update_id),
                    wait_seconds,
                    on_progress,
                    functools.partial(self.upstream_progress, run_id, getattr(arg, "tool", None)),
                )
            except WorkflowUpdateFailedError as exc:
                cause = exc.cause
                kind = getattr(cause, "type", "") or ""
                message = getattr(cause, "message", "") or str(cause)
                if kind == RunContinuing.type:
                    refused_by = next((d for d in getattr(cause, "details", ()) if isinstance(d, str)), None)
                    await self._await_successor(run_id, refused_by)
                    continue
                if kind == RunBusy.type and busy < BUSY_RESENDS:
                    # The run's task took as many call arguments as it may: a later task takes this one.
                    busy += 1
                    attempt -= 1  # (not an attempt: the run took the call's place in a later task)
                    await asyncio.sleep(min(0.01 * busy, 0.2))
                    continue
                if kind == RunFinished.type:
                    raise RunFinished(message) from None
                if kind == RunStateConflict.type:
                    raise RunStateConflict(message, hint=_held_hint(run_id, message)) from None
                if kind == InputInvalid.type:
                    raise InputInvalid(message) from None
                if (ended := await self._ended_during_call(run_id)) is not None:
                    raise ended from None
                raise KiwiError(message) from None
            except RPCError as exc:
                # The run continued-as-new between our send and its acceptance: send it again
                # to the new run. The workflow de-duplicates by update id, so nothing runs twice.
                # Which it was is asked of Temporal (describe), never read from the error's text.
                if exc.status == RPCStatusCode.RESOURCE_EXHAUSTED or _aborted(exc):
                    # Backpressure, not a failure: as many updates as Temporal lets one execution have are in
                    # flight (24 callers at once on one run met it on a loaded host), or the server dropped the
                    # ones it held when the run's worker went away. The run has not taken the call: sent again,
                    # under the same update id, until it does, then the run is said to be busy.
                    crowded_since = crowded_since or time.monotonic()
                    if time.monotonic() - crowded_since > IN_FLIGHT_SECONDS:
                        raise RunBusy(
                            f"run {run_id} has as many calls in flight as Temporal lets one run have: {exc.message}",
                            hint="send fewer calls to the run at once, or send this one again when others "
                            "have answered",
                        ) from None
                    attempt -= 1  # (not an attempt: the run has not seen the call)
                    await asyncio.sleep(0.2)
                    continue
                if exc.status != RPCStatusCode.NOT_FOUND:
                    raise _translate(exc, run_id) from None
                try:
                    description = await handle.describe()
                except RPCError:
                    raise _translate(exc, run_id) from None
                if description.status != WorkflowExecutionStatus.RUNNING:
                    ended = await self._how_it_ended(run_id, description.status)
                    raise RunFinished(f"{ended}; start a new run") from None
                continue
        raise RunStateConflict(f"run {run_id} kept continuing while the call was sent; try again")

    async def first_task_done(self, run_id: str, deadline: float = 10.0) -> bool:
        """Wait until the run's first workflow task has completed: a long poll on its history, not a query.
        False only when ``deadline`` passed first (no worker took it); a history that cannot be read is left
        to the status query that follows.

        A query sent while a workflow task runs is answered through one more workflow task, scheduled for
        it alone (three more events in the run's history and a replay on every worker that takes it over);
        reading the status once this first task is done costs nothing of the kind."""
        handle = self.handle(run_id)
        try:
            async with asyncio.timeout(deadline):
                async for event in handle.fetch_history_events(wait_new_event=True):
                    if event.event_type in _FIRST_TASK_OVER:
                        return True
        except TimeoutError:
            return False
        except RPCError:
            pass
        return True

    async def _await_successor(
        self, run_id: str, execution: str | None = None, deadline: float = 30.0
    ) -> None:
        """Wait until the execution that refused us as 'continuing' (``execution``, which the refusal names) has
        closed, so the next send reaches its successor at once (a long poll on its close event, not a
        sleep-and-retry loop). The latest execution was waited for when the refusal named none: by the time
        the answer came it could be the successor already, and the call waited out the whole deadline (30 s)
        before it was sent again."""
        if execution is not None:
            await self._closed(run_id, execution, deadline)
            return
        try:
            described = await self.handle(run_id).describe()
        except RPCError:
            return
        if described.status != WorkflowExecutionStatus.RUNNING:
            return  # already closed: the latest execution is the successor
        await self._closed(run_id, described.run_id, deadline)

    async def _closed(self, run_id: str, execution: str, deadline: float) -> None:
        """Wait (at most ``deadline`` seconds) until that execution of the run has closed: a long poll on
        its close event, not a sleep-and-retry loop."""
        closing = self.client.get_workflow_handle(run_id, run_id=execution)
        with contextlib.suppress(RPCError, TimeoutError):
            async with asyncio.timeout(deadline):
                async for _ in closing.fetch_history_events(
                    wait_new_event=True, event_filter_type=WorkflowHistoryEventFilterType.CLOSE_EVENT
                ):
                    break

    async def call_tool_waiting(
        self,
        run_id: str,
        tool: str,
        arguments: dict[str, Any],
        *,
        client_name: str,
        wait_seconds: float,
        on_progress: Progress | None = None,
        idempotency_key: str | None = None,
    ) -> ToolCallResult:
        """A tool call that answers ``pending`` (with a call id to poll) if it takes longer than ``wait_seconds``.

        With ``idempotency_key`` the call's id (its Workflow Update id) comes from the run, the key, the tool
        and its arguments, so sending the same call again, from this front end or another after one died mid-call, joins the
        call already made (Temporal deduplicates updates by id) instead of calling the tool again.
        """
        size = arguments_bytes(arguments)
        if (refused := _unsendable(tool, arguments, size)) is not None:
            return refused
        # The key is bound to the call itself: the same key with another tool or other arguments is
        # another call, never the earlier call's answer.
        call_id = (
            "call-"
            + hashlib.sha256(
                f"{run_id}\0{idempotency_key}\0{tool}\0{json.dumps(arguments, sort_keys=True, default=str)}".encode()
            ).hexdigest()[:32]
            if idempotency_key
            else uuid.uuid4().hex
        )
        request = CallToolRequest(tool=tool, arguments=arguments, client=client_name)
        async with self._argument_room(run_id, size or 0):
            result = await self._update(
                run_id, DirectiveRun.call_tool, request, call_id, wait_seconds, on_progress
            )
        if result is not None:
            return self._why_not_found(await self._explained(run_id, result, arguments))
        pending = _pending(tool, run_id, call_id, wait_seconds)
        if (waiting := await self.waiting_approval(run_id, tool, arguments)) is not None:
            pending.reason = (
                f"waits for a human to approve it ({waiting.request_id}, until {waiting.expires_at}); it runs "
                "only if approved"
            )
        return pending

    async def waiting_approval(self, run_id: str, tool: str, arguments: dict[str, Any]) -> Any:
        """The approval request the run's latest pending call of ``tool`` waits on (None: none, or the run's
        status cannot be read now). kiwi-mcp.execute waits on the call it makes (a tool, or directive.run)."""
        names = {tool, inner_call(tool, arguments)[0]}
        with contextlib.suppress(KiwiError):
            waiting = [
                a for a in (await self.status(run_id)).approvals if a.status == "pending" and a.tool in names
            ]
            return waiting[-1] if waiting else None
        return None

    async def poll_call(
        self, run_id: str, call_id: str, *, wait_seconds: float, on_progress: Progress | None = None
    ) -> ToolCallResult:
        """The answer of an earlier call that came back ``pending``."""
        await self.check_project(run_id)
        execution: str | None = None  # the latest first, then the ones it continued from
        for _ in range(POLL_EXECUTIONS):
            update = self.handle(run_id).get_update_handle(
                call_id, workflow_run_id=execution, result_type=ToolCallResult
            )
            try:
                result = await _wait(
                    update.result(), wait_seconds, on_progress, lambda: self.upstream_progress(run_id)
                )
            except RPCError as exc:
                if exc.status != RPCStatusCode.NOT_FOUND:
                    raise _translate(exc, run_id) from None
                # Not in this execution: the call may have finished in the one it continued from.
                execution = await self._continued_from(run_id, execution)
                if execution is None:
                    raise KiwiError(
                        f"run {run_id} has no call '{call_id}'",
                        hint="poll with the call_id of a call of this run that answered 'pending'; a call that "
                        "answered 'pending' before the run took it (Temporal unreachable for its whole wait) "
                        "was not made: send it again, with an idempotency_key to be safe",
                    ) from None
                continue
            return result if result is not None else _pending("", run_id, call_id, wait_seconds)
        raise KiwiError(f"run {run_id}: call '{call_id}' not found in its last {POLL_EXECUTIONS} executions")

    async def _continued_from(self, run_id: str, execution: str | None) -> str | None:
        """The execution that ``execution`` (None: the latest) of the run continued from, if any."""
        handle = self.client.get_workflow_handle(run_id, run_id=execution)
        try:
            async for event in handle.fetch_history_events(page_size=1):
                started = event.workflow_execution_started_event_attributes
                if started.continued_execution_run_id:
                    return started.continued_execution_run_id
                # A project's session that replaced an ended one (the base policy changed): that one next.
                replaced = started.memo.fields.get(REPLACES) if is_session(run_id) else None
                if replaced is None:
                    return None
                value = self.client.data_converter.payload_converter.from_payloads([replaced])[0]
                return value if isinstance(value, str) and value else None
        except RPCError as exc:
            raise _translate(exc, run_id) from None
        return None

    async def upstream_progress(self, run_id: str, tool: str | None = None) -> str:
        """What an external MCP server last reported for a long call in this run ("" if nothing).

        Long upstream calls are heartbeating activities whose heartbeat details carry the server's
        progress notifications; ``tool`` narrows it to calls to that tool's server.
        """
        if tool in BUILTIN_TOOLS:
            return ""  # Kiwi's own tools talk to no upstream server: nothing to describe the run for
        server = (tool or "").partition(".")[0]
        try:
            description = await self.handle(run_id).describe()
        except RPCError:
            return ""
        for pending in description.raw_description.pending_activities:
            kind = pending.activity_type.name
            if (
                not (kind.startswith("mcp.") and kind.endswith(".call_tool"))
                or (server and kind != f"mcp.{server}.call_tool")
                or not pending.heartbeat_details.payloads
            ):
                continue
            try:
                detail = self.client.data_converter.payload_converter.from_payload(
                    pending.heartbeat_details.payloads[0], dict
                )
            except Exception:  # noqa: BLE001 - progress is a courtesy; a detail we cannot read is skipped
                continue
            if not progress_sealed(detail, run_id, description.run_id, pending.activity_id):
                continue  # (recorded from outside Kiwi, by the activity's id: never shown to the agent)
            total = detail.get("total")
            done = f"{detail.get('progress', 0):g}" + (
                f"/{total:g}" if isinstance(total, int | float) else ""
            )
            return f"{kind.split('.')[1]}: {detail.get('message') or 'progress'} ({done})"
        return ""
