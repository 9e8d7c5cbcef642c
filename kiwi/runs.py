"""Starting and steering directive runs: the thin client the CLI and the MCP front end share.

It resolves and validates a directive, binds its inputs, builds the run snapshot, starts the
``DirectiveRun`` workflow idempotently, and turns Temporal errors into Kiwi's typed errors.
It holds no run state of its own.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import hashlib
import json
import math
import re
import time
import uuid
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from temporalio.api.enums.v1 import EventType, IndexedValueType, WorkflowTaskFailedCause
from temporalio.api.operatorservice.v1 import ListSearchAttributesRequest
from temporalio.client import (
    Client,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowHistoryEventFilterType,
    WorkflowQueryFailedError,
    WorkflowUpdateFailedError,
    WorkflowUpdateStage,
)
from temporalio.common import (
    SearchAttributePair,
    TypedSearchAttributes,
    WorkflowIDConflictPolicy,
    WorkflowIDReusePolicy,
)
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from kiwi.auditlog import read_audit
from kiwi.contracts import (
    PENDING_APPROVAL_ATTR,
    PROJECT_ATTR,
    SEARCH_ATTRIBUTES,
    STATUS_ATTR,
    TASK_QUEUE,
    TERMINAL,
    ApprovalRequest,
    CallToolRequest,
    CancelRequest,
    CompleteStepRequest,
    CompleteStepResult,
    DecisionAnswer,
    DirectiveRunInput,
    DirectiveRunResult,
    HelpRequest,
    ResumeRequest,
    RunSnapshot,
    RunState,
    RunStatus,
    RunTrust,
    ToolCallResult,
    ToolContext,
    ToolContextRequest,
    is_session,
    parent_hold_reason,
    run_workflow_id,
    session_workflow_id,
)
from kiwi.errors import (
    DecisionRefused,
    InputInvalid,
    KiwiError,
    McpServerMissing,
    RunBusy,
    RunContinuing,
    RunFinished,
    RunInOtherProject,
    RunNotFound,
    RunStateConflict,
    RunTimedOut,
    TemporalUnavailable,
    ToolNotFound,
    display_path,
)
from kiwi.explain import not_found_hint, trust_hint
from kiwi.guards import summarise_call
from kiwi.items.directive import Directive
from kiwi.items.store import ItemStore
from kiwi.keys import default_key, human_message, load_private, sign_bytes
from kiwi.policy import BUILTIN_TOOLS, PermissionSet
from kiwi.seal import progress_sealed
from kiwi.snapshot import build_session_snapshot, build_snapshot, signed_decision
from kiwi.toolargs import arguments_bytes, inner_call, oversized_command, unsendable
from kiwi.upstream.pool import scrub_text
from workflows.directive_run import DirectiveRun
from workflows.directive_run.options import HELD


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


class RunClient:
    """Starts and steers the runs of one project (``store.project_root``).

    Runs are tagged with their project (the ``KiwiProject`` search attribute) when they start; the
    client lists and acts only on its own project's runs, unless ``all_projects``.
    """

    def __init__(
        self, client: Client, store: ItemStore, task_queue: str = TASK_QUEUE, *, all_projects: bool = False
    ) -> None:
        self.client = client
        self.store = store
        self.task_queue = task_queue
        self.all_projects = all_projects
        self.project = str(store.project_root)
        self._attributes_ready: bool | None = None
        self._projects: dict[str, str] = {}  # run id -> its project, as recorded at its start
        self._large_calls: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        # run id -> (when read, its snapshot, the not-found hints made from it by tool), for the hints of
        # refused calls (see snapshot_of).
        self._snapshots: collections.OrderedDict[str, tuple[float, RunSnapshot | None, dict[str, str]]] = (
            collections.OrderedDict()
        )
        # The project's session (calls outside a run; see session_call), and when its base policy was last
        # compared with the project's files (see _session_current).
        self.session_id = session_workflow_id(store.project_root)
        self._session_checked = -math.inf
        self._session_rechecks: collections.deque[float] = collections.deque()
        # When a status query on this task queue last went unanswered (see answered_status).
        self._unanswered_at = -math.inf

    async def project_of(self, run_id: str) -> str:
        """The project a run belongs to ("" for a run started without one, e.g. before projects existed)."""
        if run_id not in self._projects:
            try:
                description = await self.handle(run_id).describe()
            except RPCError:
                return ""  # no such run (yet): the operation itself says so
            owner = description.typed_search_attributes.get(PROJECT_ATTR) or ""
            info = description.raw_description.workflow_execution_info
            if not owner and info.HasField("parent_execution"):
                # A child run (directive.run) belongs to its parent's project.
                owner = await self.project_of(info.parent_execution.workflow_id)
            self._projects[run_id] = owner
        return self._projects[run_id]

    async def check_project(self, run_id: str) -> None:
        """Refuse to act on another project's run (unless this client serves all projects)."""
        if self.all_projects:
            return
        owner = await self.project_of(run_id)
        if owner and owner != self.project:
            raise RunInOtherProject(
                f"run {run_id} belongs to the project {owner}, not to {self.project}",
                hint=f"run the command from {owner}, or pass --project {owner} (or --all-projects)",
                owner=owner,
            )

    # ---------------------------------------------------------------- start
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
            # (A run that ended before it answered has no contexts: its required servers count as missing.)
            missing = [
                d.name
                for d in directive.metadata.tools.mcps
                if d.required and not (d.name in context.mcps and context.mcps[d.name].available)
            ]
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

    async def execution(self, run_id: str) -> str:
        """The run's execution (its first run id): what a human's signature names, read without a worker."""
        try:
            description = await self.handle(run_id).describe()
        except RPCError as exc:
            raise _translate(exc, run_id) from None
        return description.raw_description.workflow_execution_info.first_run_id

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

    # ---------------------------------------------------------------- steer
    def handle(self, run_id: str) -> WorkflowHandle:
        return self.client.get_workflow_handle(run_id, result_type=DirectiveRunResult)

    async def status(self, run_id: str) -> RunStatus:
        status = await self._status(run_id)
        assert status is not None  # (no rpc_timeout: a query that is not answered raises)
        return status

    async def _status(self, run_id: str, rpc_timeout: timedelta | None = None) -> RunStatus | None:
        """The run's status as `kiwi status` shows it; with ``rpc_timeout``, None when no worker answers
        within it (the client's own timeout comes back as CANCELLED, the server's "no poller" as
        FAILED_PRECONDITION)."""
        await self.check_project(run_id)
        query = asyncio.ensure_future(self.handle(run_id).query(DirectiveRun.status, rpc_timeout=rpc_timeout))
        try:
            # A run whose workflow task keeps failing answers a query only once Temporal gives up on it (20 s):
            # a query not answered within a second looks whether that is why.
            done, _ = await asyncio.wait({query}, timeout=STALL_LOOK_SECONDS)
            if not done and await self._task_failing(run_id):
                raise await self._stalled(run_id)
            status = await query
        except WorkflowQueryFailedError as exc:
            if "failed state" not in str(exc):
                raise
            raise await self._stalled(run_id) from None
        except RPCError as exc:
            if "failed state" in (exc.message or ""):
                raise await self._stalled(run_id) from None
            unanswered = (
                RPCStatusCode.CANCELLED,
                RPCStatusCode.DEADLINE_EXCEEDED,
                RPCStatusCode.FAILED_PRECONDITION,
            )
            if rpc_timeout is not None and exc.status in unanswered:
                return None
            raise _translate(exc, run_id) from None
        finally:
            query.cancel()  # (a no-op once answered; the question dropped when the caller stops waiting)
        await self._children_now(status)
        return self._shown(status)

    async def _task_failing(self, run_id: str) -> bool:
        """Whether the run's workflow task has failed and waits to be tried again (its attempt past the first)."""
        try:
            described = await self.handle(run_id).describe()
        except RPCError:
            return False
        pending = described.raw_description.pending_workflow_task
        return described.raw_description.HasField("pending_workflow_task") and pending.attempt > 1

    async def _stalled(self, run_id: str) -> KiwiError:
        """A run whose workflow task keeps failing (a payload its worker cannot read, a worker that cannot
        decode its state): why, from the last failure in its history, instead of Temporal's "Workflow Task
        in failed state" (the reason was only in the worker's log). A task that timed out (a worker too
        busy or stuck to answer in time) says so: it has no failure to show."""
        why, timed_out, cause = "", 0, ""
        with contextlib.suppress(RPCError):
            async for event in self.handle(run_id).fetch_history_events():
                if event.HasField("workflow_task_failed_event_attributes"):
                    attributes = event.workflow_task_failed_event_attributes
                    cause = WorkflowTaskFailedCause.Name(attributes.cause).removeprefix(_FAILED_CAUSE)
                    why = attributes.failure.message or cause.lower().replace("_", " ")
                elif event.HasField("workflow_task_timed_out_event_attributes"):
                    timed_out += 1
        if not why and timed_out:
            why = f"its workflow task timed out ({timed_out}x): the worker is too busy or stuck to answer"
        if cause == "NON_DETERMINISTIC_ERROR" or "Nondeterminism" in why:
            # Retrying never helps here: the same code fails on the same history.
            return KiwiError(
                f"run {run_id} cannot take its next step: its history does not replay with the code of the "
                f"worker that took it: {scrub_text(why)[:500]}",
                hint="a worker of another Kiwi build is polling its task queue (runs need workers of the build "
                "that started them or a later one: stop the other, or use Worker Versioning, see Upgrading "
                "workers in the README); if every worker runs the same build, it is a bug in Kiwi: keep the "
                f"run's history (`temporal workflow show --workflow-id {run_id} --output json`) for the report",
            )
        return KiwiError(
            f"run {run_id} cannot take its next step: its worker fails it"
            + (f": {scrub_text(why)[:500]}" if why else ""),
            hint="fix what it says (every Kiwi process needs the same KIWI_PAYLOAD_STORE, for one); the worker "
            "retries the step, and the run goes on from where it was",
        )

    async def _children_now(self, status: RunStatus) -> None:
        """An ended run's children it last saw running, as Temporal has them now: the run stopped watching
        them when it ended (a cancelled parent listed the child its cancel had cancelled as running)."""
        if status.status not in TERMINAL:
            return
        for child in status.children:
            if child.status != "running":
                continue
            try:
                described = await self.handle(child.run_id).describe()
            except RPCError:
                continue
            if described.status in (None, WorkflowExecutionStatus.RUNNING):
                continue
            # (A run cancelled by kiwi cancel completes, its own status saying "cancelled".)
            attributes = described.typed_search_attributes
            child.status = attributes.get(STATUS_ATTR) or _CLOSED_AS.get(described.status, child.status)

    def _shown(self, status: RunStatus) -> RunStatus:
        """A run's own status as `kiwi status` shows it: the fix for a run failed on a refusal, ended steps."""
        if status.status == "failed" and status.last_calls and status.last_calls[-1].status == "denied":
            # Failed on a refused call: when the run lacks its own grants, that is the cause to fix.
            status.hint = trust_hint(status.trust, status.directive, self.directive_path(status.directive))
        if status.status in TERMINAL and status.status != "completed":
            # The run records a step it stopped in as it was (awaiting_agent, running): an ended run's
            # step says how the run ended instead of waiting for an agent nobody will hear.
            for view in (*status.steps, status.current_step):
                if view is not None and view.status in ("running", "awaiting_agent"):
                    view.status = status.status
                    view.action = ""
        return status

    def directive_path(self, name: str) -> str:
        """The directive's file as a user types it (relative to the project), for the commands hints name."""
        with contextlib.suppress(KiwiError, OSError):
            return display_path(self.store.find("directive", name).path, self.store.project_root)
        return f".ai/directives/{name}.md"

    async def snapshot_of(self, run_id: str) -> RunSnapshot | None:
        """The snapshot the run's latest execution started with, without its inputs (read from its history,
        no worker needed).

        Kept for SNAPSHOT_SECONDS (at most SNAPSHOTS runs): an agent repeating refused calls costs the server
        one history read, not one per call. (Only hints are made from it; a run id reused by a new run
        within that time gets the earlier run's hints.)"""
        return (await self._kept_snapshot(run_id))[1]

    async def _kept_snapshot(self, run_id: str) -> tuple[float, RunSnapshot | None, dict[str, str]]:
        now = time.monotonic()
        kept = self._snapshots.get(run_id)
        if kept is not None and now - kept[0] < SNAPSHOT_SECONDS:
            return kept
        snapshot = await self._read_snapshot(run_id)
        if snapshot is not None and snapshot.inputs:
            # Kept without the run's inputs: no hint reads them, and an agent's may be megabytes a run
            # (the payload store takes them), which SNAPSHOTS runs' worth would hold in this process.
            snapshot = snapshot.model_copy(update={"inputs": {}})
        kept = self._snapshots[run_id] = (now, snapshot, {})
        self._snapshots.move_to_end(run_id)
        while len(self._snapshots) > SNAPSHOTS:
            self._snapshots.popitem(last=False)
        return kept

    async def _read_snapshot(self, run_id: str) -> RunSnapshot | None:
        try:
            async for event in self.handle(run_id).fetch_history_events(page_size=1):
                payloads = event.workflow_execution_started_event_attributes.input.payloads
                (started,) = await self.client.data_converter.decode(payloads, [DirectiveRunInput])
                return started.snapshot
        except RPCError as exc:
            raise _translate(exc, run_id) from None
        return None

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

    async def resume(self, run_id: str, reason: str = "", by: str | None = None) -> bool:
        """Let a held run carry on, signed with the approver key ``by`` (default: your only key), and the
        child runs it held with it (see :meth:`resume_with_children`).

        True when the run took it (see ``_taken``); DecisionRefused when it refused it."""
        return (await self.resume_with_children(run_id, reason, by))[0]

    async def resume_with_children(
        self, run_id: str, reason: str = "", by: str | None = None
    ) -> tuple[bool, list[str]]:
        """:meth:`resume`, and the run ids of the child runs (and theirs) resumed with it: a run that is held
        holds its running children (PARENT_HOLDS_CHILDREN), and each of those is resumed here, signed for
        itself, once the parent took its own resume. A child held for a reason of its own stays held. A
        parent no longer held resumes only the children it held: (False, their ids)."""
        try:
            taken = await self._resume_one(run_id, reason, by)
        except (RunStateConflict, RunFinished):
            # Not held any more (a human answered its question or resumed it alone; it was cancelled): the
            # children it held may still be, their reason naming this command. Resume those; else say why not.
            children = await self._resume_children(run_id, reason, by)
            if children:
                return False, children
            raise
        if not taken:
            return False, []
        return True, await self._resume_children(run_id, reason, by)

    async def _resume_children(self, run_id: str, reason: str, by: str | None) -> list[str]:
        """Resume each running child of ``run_id`` held for it (and theirs); the ids resumed."""
        resumed: list[str] = []
        for child in (await self.status(run_id)).children:
            if child.status != "running":
                continue
            try:
                now = await self.status(child.run_id)
                if now.status not in HELD or now.hold_reason != parent_hold_reason(run_id, now.status):
                    continue  # (held for a reason of its own, or not held)
                # Read after the child's hold: the agent may have looped the parent into a hold again since
                # its resume was taken, and its child then stays held. A parent held again after this read
                # sends the child a new notice, which renews its hold: the resume below, signed for the hold
                # read above, is then refused, or lifts it before the notice holds the child again.
                if (await self.status(run_id)).status in HELD:
                    continue
                why = reason or f"its parent run {run_id} was resumed"
                if not await self._resume_one(child.run_id, why, by, status=now):
                    continue
            except KiwiError:
                continue  # (gone, finished, or it refused a resume signed for a hold it renewed: still held)
            resumed += [child.run_id, *await self._resume_children(child.run_id, reason, by)]
        return resumed

    async def _resume_one(
        self, run_id: str, reason: str, by: str | None, *, status: RunStatus | None = None
    ) -> bool:
        """Resume one run, signed for its hold as ``status`` (default: read now) shows it."""
        by = default_key(by, option="--as")
        load_private(by)
        status = status or await self.status(run_id)
        if status.status in TERMINAL:
            raise RunFinished(
                f"run {run_id} has finished ({status.status}); there is nothing to resume",
                hint=f"see `kiwi status {run_id}`; start a new run to go on",
            )
        if status.status not in HELD:
            raise RunStateConflict(
                f"run {run_id} is {status.status}, not stopped; resume lets a stuck or awaiting_human run "
                "carry on",
                hint=f"see `kiwi status {run_id}`",
            )
        signature = sign_bytes(by, human_message("resume", run_id, status.execution, status.hold_id, "", by))
        await self._signal(
            run_id, DirectiveRun.resume, ResumeRequest(reason=reason, by=by, signature=signature)
        )
        return await self._taken(run_id, "resume", status, lambda now: now.hold_id != status.hold_id)

    async def decide_approval(
        self, run_id: str, request_id: str, approved: bool, *, by: str | None = None, reason: str = ""
    ) -> ApprovalRequest:
        """Approve or reject a pending call, signed with the approver's key ``by`` (default: your only key).

        Answers the request as the run recorded it. The run accepts the decision only when ``by`` is
        a trusted approver and the signature covers this run, request, call hash and answer. The
        answer's status is the decision once the run took it, "pending" while no worker has taken it;
        a decision the run refused raises DecisionRefused with the run's reason.
        """
        by = default_key(by, option="--as")
        load_private(by)  # no key, no decision: say so before asking the run anything
        status = await self.answered_status(run_id)
        if status is None:
            return await self._decide_without_worker(run_id, request_id, approved, by, reason)
        request = next((a for a in status.approvals if a.request_id == request_id), None)
        if request is None:
            pending = ", ".join(a.request_id for a in status.approvals if a.status == "pending") or "none"
            raise KiwiError(
                f"run {run_id} has no approval request '{request_id}' (pending: {pending})",
                hint=f"see `kiwi status {run_id}`",
            )
        if request.status != "pending":
            raise RunStateConflict(f"{request_id} is already {request.status}")
        if by == request.requested_by:
            raise KiwiError(f"'{by}' made this call and cannot approve it", hint="another person must decide")
        await self._signal(
            run_id,
            DirectiveRun.decide_approval,
            signed_decision(run_id, status.execution, request, approved, by, reason),
        )
        taken = await self._taken(run_id, request_id, status, lambda now: _approval_answered(now, request_id))
        return request.model_copy(
            update={"status": ("approved" if approved else "rejected") if taken else "pending"}
        )

    async def answered_status(self, run_id: str, *, polled: bool | None = None) -> RunStatus | None:
        """The run's status, or None when no worker answers for it soon (none polls its task queue, or one
        that Temporal saw lately no longer answers within QUERY_SECONDS). ``polled``: ``worker_polls()``,
        when the caller asked it already."""
        if not (await self.worker_polls() if polled is None else polled):
            return None
        if time.monotonic() - self._unanswered_at < UNANSWERED_SECONDS:
            # (One query just went unanswered: the next run's would too. `kiwi approvals` with a worker just
            # stopped waited QUERY_SECONDS for each run with a pending request.)
            return None
        status = await self._status(run_id, timedelta(seconds=QUERY_SECONDS))
        self._unanswered_at = time.monotonic() if status is None else -math.inf
        return status

    async def worker_polls(self) -> bool:
        """Whether a worker polls this client's task queue for workflow tasks (a query waits for one: with
        none, ``status`` hung for 30 s, then failed). True when Temporal will not say."""
        from temporalio.api.enums.v1 import TaskQueueType
        from temporalio.api.taskqueue.v1 import TaskQueue
        from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest

        try:
            described = await self.client.workflow_service.describe_task_queue(
                DescribeTaskQueueRequest(
                    namespace=self.client.namespace,
                    task_queue=TaskQueue(name=self.task_queue),
                    task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
                ),
                timeout=timedelta(seconds=5),
            )
        except RPCError:
            return True
        now = time.time()
        return any(now - p.last_access_time.ToSeconds() < POLLER_SEEN_SECONDS for p in described.pollers)

    async def approvals_without_worker(self, run_id: str) -> tuple[str, list[ApprovalRequest]]:
        """The run's execution and its pending approval requests, with no worker to ask: which are pending
        is the run's own KiwiPendingApproval (Temporal keeps it), what each asks is its ``approval_requested``
        audit record (written within a second of the request). A request whose record is not written yet
        is left out."""
        await self.check_project(run_id)
        try:
            description = await self.handle(run_id).describe()
        except RPCError as exc:
            raise _translate(exc, run_id) from None
        if description.status != WorkflowExecutionStatus.RUNNING:
            raise RunFinished(
                f"{await self._how_it_ended(run_id, description.status)}; it waits for no approval"
            )
        ids = [
            i for i in (description.typed_search_attributes.get(PENDING_APPROVAL_ATTR) or "").split(",") if i
        ]
        asked = {
            r.get("request_id"): r
            for r in read_audit(str(self.store.project_root), run_id)
            if r.get("event") == "approval_requested"
        }
        pending = [
            ApprovalRequest(
                request_id=i,
                tool=str(asked[i].get("tool", "")),
                args_hash=str(asked[i].get("args_hash", "")),
                summary=summarise_call(str(asked[i].get("tool", "")), asked[i].get("arguments") or {}),
                requested_by=str(asked[i].get("requested_by", "")),
                requested_at=str(asked[i].get("time", "")),
                expires_at=str(asked[i].get("expires_at", "")),
            )
            for i in ids
            if i in asked and asked[i].get("args_hash")
        ]
        return description.run_id or "", pending

    async def _decide_without_worker(
        self, run_id: str, request_id: str, approved: bool, by: str, reason: str
    ) -> ApprovalRequest:
        """decide_approval with no worker polling: the request from the audit trail, the signal sent (the
        run takes it, and checks its signature, when a worker runs); answered as still pending."""
        execution, pending = await self.approvals_without_worker(run_id)
        request = next((a for a in pending if a.request_id == request_id), None)
        if request is None:
            shown = ", ".join(a.request_id for a in pending) or "none whose record is written"
            raise KiwiError(
                f"no worker is running to answer for run {run_id}, and it has no pending approval request "
                f"'{request_id}' (pending: {shown})",
                hint="start a worker (`kiwi dev` or `kiwi worker`) and see `kiwi status "
                f"{run_id}`; its audit trail (`kiwi audit {run_id}`) lists the requests",
            )
        if by == request.requested_by:
            raise KiwiError(f"'{by}' made this call and cannot approve it", hint="another person must decide")
        await self._signal(
            run_id,
            DirectiveRun.decide_approval,
            signed_decision(run_id, execution, request, approved, by, reason),
        )
        return request

    async def decide(
        self, run_id: str, request_id: str, option: str, *, by: str | None = None, note: str = ""
    ) -> bool:
        """Answer an escalation, signed with the approver key ``by`` (default: your only key).

        True when the run took it (see ``_taken``); DecisionRefused when it refused it."""
        by = default_key(by, option="--as")
        load_private(by)
        status = await self.status(run_id)
        request = next((d for d in status.decisions if d.request_id == request_id), None)
        if request is None:
            raise KiwiError(
                f"run {run_id} has no escalation '{request_id}'", hint=f"see `kiwi status {run_id}`"
            )
        if request.answer:
            raise RunStateConflict(f"{request_id} was already answered: {request.answer}")
        if request.options and option not in request.options:
            raise InputInvalid(
                f"'{option}' is not an option of {request_id}; options: {', '.join(request.options)}"
            )
        signature = sign_bytes(by, human_message("decide", run_id, status.execution, request_id, option, by))
        await self._signal(
            run_id,
            DirectiveRun.decide,
            DecisionAnswer(request_id=request_id, option=option, by=by, note=note, signature=signature),
        )
        return await self._taken(
            run_id, request_id, status, lambda now: _escalation_answered(now, request_id)
        )

    async def cancel(
        self, run_id: str, reason: str = "cancelled by request", *, children: bool = True
    ) -> list[str]:
        """Cancel a run and, unless ``children`` is False, the child runs it started that still run (and
        theirs), each with a reason naming the run cancelled. The run ids of the children cancelled.

        A child outlives a parent that completes (the agent may still be working in it); one whose parent is
        cancelled was left running before, its parent's work gone."""
        running = await self._running_children(run_id) if children else []
        await self._signal(run_id, DirectiveRun.cancel, CancelRequest(reason=reason))
        cancelled: list[str] = []
        why = f"its parent run {run_id} was cancelled" + (f" ({reason})" if reason else "")
        for child in running:
            with contextlib.suppress(KiwiError):  # (it finished meanwhile)
                cancelled += [child, *await self.cancel(child, why)]
        return cancelled

    async def _running_children(self, run_id: str) -> list[str]:
        """The child runs ``run_id`` started that have not closed (Temporal's own record: no worker needed)."""
        try:
            description = await self.handle(run_id).describe()
        except RPCError:
            return []  # (the cancel itself says what is wrong with the run id)
        return [child.workflow_id for child in description.raw_description.pending_children]

    async def _taken(
        self, run_id: str, subject: str, before: RunStatus, taken: Callable[[RunStatus], bool]
    ) -> bool:
        """Watch the run take a human decision just signalled: a signal itself never says if it was refused.

        True once ``taken(status)`` holds; DecisionRefused with the run's reason when a new refusal of
        ``subject`` appears in its status; False when no worker took it within DECISION_WAIT_SECONDS
        (the signal is durable: the run takes it when a worker runs).
        """
        seen = {(r.by, r.reason, r.at) for r in before.refused_decisions if r.request_id == subject}
        loop = asyncio.get_running_loop()
        deadline, delay = loop.time() + DECISION_WAIT_SECONDS, 0.05
        while True:
            now = await self.status(run_id)
            refused = [
                r
                for r in now.refused_decisions
                if r.request_id == subject and (r.by, r.reason, r.at) not in seen
            ]
            if refused:
                raise DecisionRefused(
                    f"run {run_id} refused the decision on {subject} by '{refused[-1].by}': {refused[-1].reason}",
                    hint=f"`kiwi status {run_id}` lists refused decisions; `kiwi audit {run_id}` has them too",
                )
            if taken(now):
                return True
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.5)

    async def _signal(self, run_id: str, signal: Callable[..., Any], arg: Any) -> None:
        await self.check_project(run_id)
        try:
            await self.handle(run_id).signal(signal, arg)
        except RPCError as exc:
            raise await self._closed_or_missing(exc, run_id) from None

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

    async def list_runs(
        self,
        status: str | None = None,
        directive: str | None = None,
        limit: int = 50,
        *,
        sessions: bool = False,
    ) -> list[dict[str, Any]]:
        """This project's runs (every project's with ``all_projects``), newest first; the projects' sessions
        (the workflows taking calls made outside a run) only with ``sessions``."""
        clauses = ["WorkflowType = 'DirectiveRun'", f"TaskQueue = '{_quote(self.task_queue)}'"]
        if await self._check_search_attributes():
            if status:
                clauses.append(f"KiwiStatus = '{_quote(status)}'")
            if directive:
                clauses.append(f"KiwiDirective = '{_quote(directive)}'")
            if not self.all_projects:
                clauses.append(self._project_clause())

        async def listed(row: dict[str, Any]) -> bool:
            if not sessions and is_session(row["run_id"], row["directive"]):
                return False
            if self.all_projects:
                return True
            if not row["project"]:
                row["project"] = await self.project_of(row["run_id"])
            return row["project"] == self.project or not self._attributes_ready

        # (Filtered as they come, up to `limit` kept: `kiwi runs --limit 1` answered nothing when the first
        # execution listed was the project's session.)
        return await self._listed(" AND ".join(clauses), limit, status, keep=listed)

    async def pending_approvals(self, limit: int = 200) -> list[dict[str, Any]]:
        """Every pending approval request of this project's running runs (or every project's)."""
        clauses = [
            "WorkflowType = 'DirectiveRun'",
            f"TaskQueue = '{_quote(self.task_queue)}'",
            "ExecutionStatus = 'Running'",
            "KiwiPendingApproval IS NOT NULL",
            "KiwiPendingApproval != ''",
        ]
        if not await self._check_search_attributes():
            raise KiwiError(
                "the search attributes Kiwi needs are not registered on this Temporal server",
                hint="start the server with `kiwi dev` (it registers them)",
            )
        if not self.all_projects:
            clauses.append(self._project_clause())
        pending = []
        polled = await self.worker_polls()
        for row in await self._listed(" AND ".join(clauses), limit, None):
            row["project"] = row["project"] or await self.project_of(row["run_id"])
            if not self.all_projects and row["project"] != self.project:
                continue
            try:
                status = await self.answered_status(row["run_id"], polled=polled)
                if status is not None:
                    approvals = status.approvals
                else:
                    # (No worker to answer a query: from what Temporal and the audit trail keep.)
                    approvals = (await self.approvals_without_worker(row["run_id"]))[1]
            except KiwiError:
                continue  # finished since it was listed: nothing to decide now
            pending += [
                {
                    "run_id": row["run_id"],
                    "directive": row["directive"],
                    "project": row["project"],
                    **a.model_dump(mode="json"),
                }
                for a in approvals
                if a.status == "pending"
            ]
        return pending

    def _project_clause(self) -> str:
        """This project's runs, and child runs, which carry no KiwiProject: they are their parent's
        (the caller keeps those whose parent is this project's)."""
        return f"(KiwiProject = '{_quote(self.project)}' OR (KiwiProject IS NULL AND ParentWorkflowId IS NOT NULL))"

    async def _listed(
        self,
        query: str,
        limit: int,
        status: str | None,
        keep: Callable[[dict[str, Any]], Awaitable[bool]] | None = None,
    ) -> list[dict[str, Any]]:
        """The executions ``query`` lists, Temporal's order (running ones first, then the latest closed), up to
        ``limit`` of those ``keep`` keeps."""
        runs: list[dict[str, Any]] = []
        # (With ``keep``, pages of about what is kept: the first page is often all of it.)
        pages = {"limit": None, "page_size": min(limit + 10, 1000)} if keep else {"limit": limit}
        async for execution in self.client.list_workflows(query, **pages):
            if len(runs) >= limit:
                break
            attrs = execution.typed_search_attributes
            run_status = attrs.get(SEARCH_ATTRIBUTES[1]) if self._attributes_ready else None
            runs.append(
                {
                    "run_id": execution.id,
                    "directive": attrs.get(SEARCH_ATTRIBUTES[0])
                    if self._attributes_ready
                    else execution.id.split("-")[1],
                    "status": run_status or execution.status.name.lower() if execution.status else "",
                    "step": attrs.get(SEARCH_ATTRIBUTES[2]) if self._attributes_ready else "",
                    "started": execution.start_time.isoformat() if execution.start_time else "",
                    "closed": execution.close_time.isoformat() if execution.close_time else "",
                    "project": attrs.get(PROJECT_ATTR) or "",
                    "pending_approval": attrs.get(PENDING_APPROVAL_ATTR) or "",
                }
            )
            last = runs[-1]
            if (status and not self._attributes_ready and last["status"] != status) or (
                keep is not None and not await keep(last)
            ):
                runs.pop()
        return runs

    async def activities(self, run_id: str) -> list[dict[str, Any]]:
        """The run's activities in flight, with their attempt (2 and up: retried, e.g. after a crash)."""
        await self.check_project(run_id)
        try:
            description = await self.handle(run_id).describe()
        except RPCError as exc:
            raise _translate(exc, run_id) from None
        out = []
        for pending in description.raw_description.pending_activities:
            failure = pending.last_failure.message if pending.HasField("last_failure") else ""
            out.append(
                {
                    "activity": pending.activity_type.name,
                    "attempt": pending.attempt,
                    "state": _PENDING_STATES.get(int(pending.state), "unknown"),
                    "last_failure": failure,
                    "last_worker": pending.last_worker_identity,
                }
            )
        return out


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
        return ""
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
