"""Starting runs and the project's session: snapshots, idempotent starts, session calls.

A part of :class:`kiwi.runs.RunClient`, which mixes it in."""

from __future__ import annotations

import contextlib
import hashlib
import time
import uuid
from typing import Any

from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import ListSearchAttributesRequest
from temporalio.client import (
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowQueryFailedError,
)
from temporalio.common import (
    SearchAttributePair,
    TypedSearchAttributes,
    WorkflowIDConflictPolicy,
    WorkflowIDReusePolicy,
)
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError

from kiwi.contracts import (
    PROJECT_ATTR,
    SEARCH_ATTRIBUTES,
    TERMINAL,
    CancelRequest,
    DirectiveRunInput,
    DirectiveRunResult,
    RunSnapshot,
    RunState,
    ToolCallResult,
    ToolContext,
    ToolContextRequest,
    run_workflow_id,
)
from kiwi.errors import InputInvalid, KiwiError, McpServerMissing, RunFinished, RunNotFound, ToolNotFound
from kiwi.items.directive import Directive
from kiwi.runs.shared import (
    REPLACES,
    SESSION_CHECK_SECONDS,
    SESSION_END_SECONDS,
    SESSION_RECHECKS,
    Progress,
    StartedRun,
    _base_policy,
)
from kiwi.snapshot import build_session_snapshot, build_snapshot
from workflows.directive_run import DirectiveRun


class RunStarting:
    """Starting runs and the project's session: snapshots, idempotent starts, session calls."""

    def snapshot(
        self,
        name: str,
        inputs: dict[str, Any],
        run_id: str,
        client_name: str = "cli",
        deadline_seconds: float | None = None,
    ) -> RunSnapshot:
        return build_snapshot(
            self.store,
            name,
            inputs,
            run_id,
            client_name=client_name,
            deadline_seconds=deadline_seconds,
            search_attributes=self._attributes_ready or False,
        )

    async def start(
        self,
        name: str,
        inputs: dict[str, Any],
        *,
        idempotency_key: str | None = None,
        client_name: str = "cli",
        deadline_seconds: float | None = None,
    ) -> str:
        """Start a run and return its id. The same idempotency key returns the existing run."""
        return (
            await self.launch(
                name,
                inputs,
                idempotency_key=idempotency_key,
                client_name=client_name,
                deadline_seconds=deadline_seconds,
            )
        ).run_id

    async def launch(
        self,
        name: str,
        inputs: dict[str, Any],
        *,
        idempotency_key: str | None = None,
        client_name: str = "cli",
        deadline_seconds: float | None = None,
    ) -> StartedRun:
        """Start a run; also return the directive it runs and, when it declares MCP servers, its tool context."""
        await self._check_search_attributes()
        short = (
            # (The project too: another project's agent using the same name and key gets a run of its own.)
            hashlib.sha256(f"{self.project}\0{name}\0{idempotency_key}".encode()).hexdigest()[:10]
            if idempotency_key
            else uuid.uuid4().hex[:10]
        )
        run_id = run_workflow_id(name, short)
        snap = self.snapshot(name, inputs, run_id, client_name, deadline_seconds)
        directive = snap.directive
        attributes = None
        if snap.search_attributes:
            attributes = TypedSearchAttributes(
                [
                    SearchAttributePair(SEARCH_ATTRIBUTES[0], directive.name),
                    SearchAttributePair(SEARCH_ATTRIBUTES[1], "running"),
                    SearchAttributePair(PROJECT_ATTR, self.project),
                ]
            )
        try:
            handle = await self._start_run(snap, idempotency_key, attributes)
        except WorkflowAlreadyStartedError:
            # The key's run has ended (a key's id is never reused): that run is the answer, as a running one is.
            handle = self.client.get_workflow_handle(run_id)
            ended = True
        else:
            ended = False
        if idempotency_key and not self.all_projects:
            # A start with a running run's id answers that run (USE_EXISTING): were the id another project's
            # (its runs started before the id named the project), its agent would be handed this run, and
            # could call tools in it with its grants, on its files. Whose run it is, is read from the run
            # itself, never taken from this start.
            self._projects.pop(handle.id, None)
            if (owner := await self.project_of(handle.id)) and owner != self.project:
                raise InputInvalid(
                    f"the idempotency key {idempotency_key!r} of directive '{name}' is taken by a run of "
                    "another project",
                    hint="start it with another idempotency_key",
                )
        # (The start's answer says whether it started a run or found the key's: the SDK keeps it on the handle.)
        response = getattr(handle, "_start_workflow_response", None)
        existing = ended or (
            bool(idempotency_key) and response is not None and not getattr(response, "started", True)
        )
        earlier = await self._start_snapshot(handle) if existing else None
        if earlier is not None and earlier.inputs != snap.inputs:
            # README trial s34: the same key with other inputs answered the old run as if it were the new one.
            given = earlier.inputs
            differ = sorted(k for k in {*given, *snap.inputs} if given.get(k) != snap.inputs.get(k))
            raise InputInvalid(
                f"the idempotency key {idempotency_key!r} of directive '{name}' names run {handle.id}, started "
                f"with other inputs (they differ in {', '.join(differ)}): a key answers the run it started",
                hint="start the new run with another idempotency key; the same key and inputs answer that run",
            )
        # The key's run answers with what it runs with, not what the directive's file gives now (review s34:
        # a file changed or re-signed since showed trust and grants the run does not have).
        ran = earlier or snap
        directive = ran.directive
        context = None
        if directive.metadata.tools.mcps:
            context = await self.tool_context(handle.id)
            missing = missing_servers(directive, context)
            if context.status == "failed" and missing:
                raise McpServerMissing(
                    f"run {handle.id} failed at its start: {context.error}",
                    hint="fix mcp_registry.yaml or the server, or mark the <mcp> "
                    'required="false" in the directive',
                )
            # Failed for another reason (a step's call refused, say): the run's status says why.
        if snap.search_attributes:
            self._projects[handle.id] = self.project
        return StartedRun(
            run_id=handle.id,
            directive=ran.directive,
            context=context,
            grants=ran.grants,
            trust=ran.trust,
            existing=existing,
        )

    async def _start_run(
        self, snap: RunSnapshot, idempotency_key: str | None, attributes: TypedSearchAttributes | None
    ) -> WorkflowHandle:
        """Start the run ``snap`` describes (with an idempotency key, the key's run if it runs)."""
        directive = snap.directive
        return await self.client.start_workflow(
            DirectiveRun.run,
            DirectiveRunInput(snapshot=snap),
            id=snap.run_id,
            task_queue=self.task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE
            if idempotency_key
            else WorkflowIDReusePolicy.ALLOW_DUPLICATE,
            search_attributes=attributes,
            static_summary=f"{directive.name} v{directive.version}: {directive.metadata.description}"[:200],
            static_details=f"Inputs: {', '.join(f'{k}={v!r}' for k, v in snap.inputs.items()) or 'none'}\n\n"
            f"Directive file: {snap.source_path}\n\nContent hash: {snap.content_hash}",
        )

    async def _start_snapshot(self, handle: WorkflowHandle) -> RunSnapshot | None:
        """What the run was started with (its first event's input), or None when it cannot be read."""
        try:
            async for event in handle.fetch_history_events(page_size=1):
                started = event.workflow_execution_started_event_attributes
                (given,) = await self.client.data_converter.decode(
                    list(started.input.payloads), [DirectiveRunInput]
                )
                return given.snapshot
        except (RPCError, ValueError, TypeError):
            return None
        return None

    async def tool_context(self, run_id: str) -> ToolContext:
        """The MCP tool context a run fetched at its start; waits until it is ready."""
        try:
            return await self._update(run_id, DirectiveRun.tool_context, ToolContextRequest(), None)
        except (RunFinished, RunNotFound):
            # The run ended before the question arrived (a required server was missing, say);
            # Temporal answers an update to a closed run as "not found".
            status = await self.status(run_id)
            return ToolContext(run_id=run_id, status=status.status, error=status.error)

    async def _check_search_attributes(self) -> bool:
        if self._attributes_ready is None:
            try:
                response = await self.client.operator_service.list_search_attributes(
                    ListSearchAttributesRequest(namespace=self.client.namespace)
                )
                registered = response.custom_attributes
                self._attributes_ready = all(
                    registered.get(a.name) == IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD
                    for a in SEARCH_ATTRIBUTES
                )
            except RPCError:
                self._attributes_ready = False
        return self._attributes_ready

    def session_snapshot(self, client_name: str) -> RunSnapshot:
        """A project's session: the harness's base policy, one step that waits forever."""
        return build_session_snapshot(
            self.store, client_name, search_attributes=self._attributes_ready or False
        )

    async def session_call(
        self,
        client_name: str,
        tool: str,
        arguments: dict[str, Any],
        *,
        wait_seconds: float | None = None,
        on_progress: Progress | None = None,
        idempotency_key: str | None = None,
    ) -> ToolCallResult:
        """A tool call outside any directive run: through the client's session workflow and base policy.

        The session is started (snapshot, harness read) only when it is not running yet, so a
        busy session costs one Workflow Update per call, like a run. With ``wait_seconds`` a call still
        running then (waiting for an approval, a slow tool) answers ``pending`` with the session's run id
        and a call id to poll, as a call in a run does.
        """
        # One session per project, whatever the client calls itself: a new client name is no new budget.
        run_id = self.session_id

        async def send() -> ToolCallResult:
            if wait_seconds is None:
                return await self.call_tool(run_id, tool, arguments, client_name=client_name)
            return await self.call_tool_waiting(
                run_id,
                tool,
                arguments,
                client_name=client_name,
                wait_seconds=wait_seconds,
                on_progress=on_progress,
                idempotency_key=idempotency_key,
            )

        await self._session_current(client_name)
        try:
            answer = await send()
            if answer.status != "denied" and answer.error_type != ToolNotFound.type:
                return answer
            # Refused: by the base policy the project's files give now, or by the one the session started
            # with (a tool accepted, a line added to internal_tools a moment ago)? Asked again once if so.
            if not await self._session_current(client_name, now=True):
                return answer
        except (RunNotFound, RunFinished):
            pass
        await self._check_search_attributes()
        snap = self.session_snapshot(client_name)
        carried, replaced = await self._session_carry(run_id)
        await self.client.start_workflow(
            DirectiveRun.run,
            DirectiveRunInput(snapshot=snap, state=carried),
            id=snap.run_id,
            task_queue=self.task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            # (Where poll_call looks for a call the ended session answered: see _continued_from.)
            memo={REPLACES: replaced} if replaced else None,
            search_attributes=TypedSearchAttributes([SearchAttributePair(PROJECT_ATTR, self.project)])
            if snap.search_attributes
            else None,
            static_summary=f"session of {client_name}: calls outside a directive run",
        )
        return await send()

    async def _session_current(self, client_name: str, *, now: bool = False) -> bool:
        """End the project's session when the base policy it runs with is no longer the one its files give
        (agent_harness.yaml, mcp_registry.yaml, trusted keys, tools), so the next call starts one with
        theirs, with what the ended one carries on (see :meth:`_session_carry`). Looked at once per
        SESSION_CHECK_SECONDS (``now``: at once, at most SESSION_RECHECKS times a second); True when it ended
        it. A grant taken out of ``internal_tools`` holds from then on, as a grant put in does."""
        clock = time.monotonic()
        if not now and clock - self._session_checked < SESSION_CHECK_SECONDS:
            return False
        if now:
            # After refusals: at most SESSION_RECHECKS a second (an agent's stream of refused calls costs the
            # client no more reads of the session than that).
            while self._session_rechecks and clock - self._session_rechecks[0] >= 1.0:
                self._session_rechecks.popleft()
            if len(self._session_rechecks) >= SESSION_RECHECKS:
                return False
            self._session_rechecks.append(clock)
        self._session_checked = clock
        try:
            wanted: str | None = _base_policy(self.session_snapshot(client_name))
        except (KiwiError, ValueError):
            # The files give no policy now (a misspelt key while a grant was taken out, say): the session ends
            # rather than go on with the one it started with, and the next start says what is wrong.
            wanted = None
        try:
            described = await self.handle(self.session_id).describe()
            if described.status != WorkflowExecutionStatus.RUNNING:
                return False  # (none running: the next call starts one from the files)
            running = await self._read_snapshot(self.session_id)
        except (RPCError, KiwiError, ValueError):
            return False  # (an unreadable session: the call itself says what is wrong)
        if running is None or _base_policy(running) == wanted:
            return False
        # That execution alone: another client may have started its successor already.
        ending = self.client.get_workflow_handle(self.session_id, run_id=described.run_id)
        with contextlib.suppress(RPCError):
            await ending.signal(DirectiveRun.cancel, CancelRequest(reason="the base policy changed"))
        await self._closed(self.session_id, described.run_id, SESSION_END_SECONDS)
        self._snapshots.pop(self.session_id, None)
        return True

    async def _session_carry(self, run_id: str) -> tuple[RunState | None, str]:
        """What a project's new session starts from: the budget its last session ended with, the calls it
        answered by update id (one sent again with its idempotency_key is answered, not made twice), its loop
        detection and hold, its running child runs and its audit records' numbering; and that session's
        execution ("" if none).

        Completing or cancelling the session must not be a way to a fresh budget.
        """
        try:
            described = await self.handle(run_id).describe()
            last_one = self.client.get_workflow_handle(
                run_id, run_id=described.run_id, result_type=DirectiveRunResult
            )
            if described.status == WorkflowExecutionStatus.RUNNING:
                # Another client started the successor since this one saw the session end: the start joins
                # it (nothing to carry). Its result, waited for below, would come when it ends, i.e. never.
                # One still closing (cancelled, its calls in flight finishing) is waited for, as before.
                # (Unreadable: waited for, never taken for a successor, which would start one afresh.)
                with contextlib.suppress(RPCError, WorkflowQueryFailedError):
                    if (await last_one.query(DirectiveRun.status)).status not in TERMINAL:
                        return None, ""
            last = await last_one.result(follow_runs=False)
        except (RPCError, WorkflowFailureError):
            return None, ""  # none yet, or it failed or was terminated: nothing to carry
        state = RunState(
            call_counts=last.call_counts,
            rate_times=last.rate_times,
            call_seq=last.calls,
            recent_updates=last.recent_updates,
            update_seqs=last.update_seqs,
            loop_hashes=last.loop_hashes,
            result_hashes=last.result_hashes,
            loop_warnings=last.loop_warnings,
            children=[c for c in last.children if c.status == "running"],
            window_reserved=last.window_reserved,
            audit_seq=last.audit_seq,
            stored_refusals=last.stored_refusals,
        )
        if last.hold_reason:
            # Ended while held (stuck in a loop, say): the new session is held until a human resumes it.
            state.status, state.held_from, state.holds = "stuck", "awaiting_agent", 1
            state.hold_reason = f"{last.hold_reason}, in the session this one replaced"
        return state, described.run_id


def missing_servers(directive: Directive, context: ToolContext) -> list[str]:
    """The required MCP servers ``directive`` declares that its run looked for and did not find. A run that ended
    before the question arrived answers with its status alone (:meth:`RunStarting.tool_context`): its servers
    count as missing when that status's error names one as unavailable (README trial s37: a modified directive's
    first step, refused, ended the run first, and the start said "fix mcp_registry.yaml" where the fix was
    `kiwi sign`)."""
    required = [d.name for d in directive.metadata.tools.mcps if d.required]
    if not context.mcps:
        return [name for name in required if f"MCP server '{name}' is" in context.error]
    return [name for name in required if name in context.mcps and not context.mcps[name].available]
