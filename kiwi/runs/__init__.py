"""Starting and steering directive runs: the thin client the CLI and the MCP front end share.

It resolves and validates a directive, binds its inputs, builds the run snapshot, starts the
``DirectiveRun`` workflow idempotently, and turns Temporal errors into Kiwi's typed errors.
It holds no run state of its own.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import math
import time
import weakref
from datetime import timedelta

from temporalio.api.enums.v1 import WorkflowTaskFailedCause
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle, WorkflowQueryFailedError
from temporalio.service import RPCError, RPCStatusCode

from kiwi.contracts import (
    PROJECT_ATTR,
    STATUS_ATTR,
    TASK_QUEUE,
    TERMINAL,
    DirectiveRunInput,
    DirectiveRunResult,
    RunSnapshot,
    RunStatus,
    session_workflow_id,
)
from kiwi.errors import KiwiError, RunInOtherProject, display_path
from kiwi.explain import trust_hint
from kiwi.items.store import ItemStore
from kiwi.runs.calls import RunCalls
from kiwi.runs.listing import RunListing
from kiwi.runs.shared import (
    _CLOSED_AS,
    _FAILED_CAUSE,
    POLLER_SEEN_SECONDS,
    QUERY_SECONDS,
    SNAPSHOT_SECONDS,
    SNAPSHOTS,
    STALL_LOOK_SECONDS,
    UNANSWERED_SECONDS,
    _translate,
)
from kiwi.runs.starting import RunStarting
from kiwi.runs.steering import RunSteering
from kiwi.upstream.pool import scrub_text
from workflows.directive_run import DirectiveRun


class RunClient(RunStarting, RunCalls, RunSteering, RunListing):
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

    async def execution(self, run_id: str) -> str:
        """The run's execution (its first run id): what a human's signature names, read without a worker."""
        try:
            description = await self.handle(run_id).describe()
        except RPCError as exc:
            raise _translate(exc, run_id) from None
        return description.raw_description.workflow_execution_info.first_run_id

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
