"""The Kiwi worker: DirectiveRun workflows and every activity, on one task queue."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

from temporalio.client import Client
from temporalio.common import VersioningBehavior, WorkerDeploymentVersion
from temporalio.service import RPCError
from temporalio.worker import UnsandboxedWorkflowRunner, Worker, WorkerDeploymentConfig
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from activities.api import ApiToolActivities
from activities.approvals import ApprovalActivities
from activities.audit import AuditActivities
from activities.commands import CommandActivities
from activities.container import ContainerToolActivities
from activities.directives import DirectiveActivities
from activities.filesystem import FilesystemActivities
from activities.gittools import GitActivities
from activities.items import ItemActivities
from activities.mcp import McpActivities
from kiwi.contracts import TASK_QUEUE
from kiwi.health import bind_health, serve_health
from kiwi.loopwatch import LoopWatch
from kiwi.seal import SealInterceptor, seal_key
from kiwi.upstream.pool import McpPool
from workers.answer_limit import AnswerLimit
from workers.drain import DrainNotice
from workflows.directive_run import DirectiveRun

WORKFLOWS = [DirectiveRun]
# A dead worker's cached runs move to another worker after this long (see build_worker).
STICKY_SCHEDULE_TO_START = timedelta(seconds=3)
MAX_CACHED_WORKFLOWS = 300
# How long a stopping worker lets in-flight activities finish before cancelling them (`kiwi worker
# --drain-seconds`). An orchestrator must wait longer than this before it kills the process.
DEFAULT_DRAIN = timedelta(seconds=30)
VERSIONING_BEHAVIORS = {
    "pinned": VersioningBehavior.PINNED,
    "auto-upgrade": VersioningBehavior.AUTO_UPGRADE,
}


def build_id() -> str:
    """This code's build id: a digest of the workflow and kiwi sources.

    Without one the SDK works a digest out of the code of every module loaded (over a thousand here,
    compiled again when no bytecode is cached): a fifth of a second of CPU before a new worker polls.
    """
    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for folder in ("workflows", "kiwi"):
        for path in sorted((root / folder).rglob("*.py")):
            digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    return f"kiwi-{digest.hexdigest()[:20]}"


def activities(pool: McpPool) -> list:
    fs, commands, git, audit = FilesystemActivities(), CommandActivities(), GitActivities(), AuditActivities()
    items = ItemActivities()
    return [
        fs.read_file,
        fs.write_file,
        fs.list_directory,
        fs.read_many,
        fs.create_directory,
        fs.delete_path,
        fs.move_path,
        commands.run_command,
        commands.run_local_tool,
        ApiToolActivities().call_api_tool,
        ContainerToolActivities().run_container_tool,
        git.git_status,
        git.git_diff,
        git.git_commit,
        git.git_commit_plan,
        git.git_checkpoint,
        git.git_rollback,
        audit.write_audit_records,
        DirectiveActivities().resolve_directive,
        items.search_items,
        items.load_item,
        McpActivities(pool).mcp_operation,
        ApprovalActivities().notify_approvers,
    ]


class KiwiWorker(Worker):
    """A Temporal worker that also owns the MCP client pool, closed when the worker shuts down."""

    def __init__(self, client: Client, *, mcp_pool: McpPool, **kwargs: object) -> None:
        super().__init__(client, **kwargs)  # type: ignore[arg-type]
        self.mcp_pool = mcp_pool

    async def shutdown(self) -> None:
        try:
            await super().shutdown()
        finally:
            await self.mcp_pool.close()


# The workflow verifies approvers' Ed25519 signatures (pure computation). cryptography's Rust
# extension can be loaded once per process, so the sandbox must pass it through, not re-import it.
SANDBOX = SandboxedWorkflowRunner(
    restrictions=SandboxRestrictions.default.with_passthrough_modules("cryptography", "_cffi_backend")
)


def deployment_config(
    deployment_name: str, build_id: str, behavior: str = "pinned"
) -> WorkerDeploymentConfig:
    """Worker Versioning: this worker serves ``deployment_name`` at ``build_id``.

    ``pinned`` (the default) keeps each run on the build it started on until it ends; ``auto-upgrade``
    moves running runs to the deployment's current build at their next workflow task, so every change to
    workflow code must then sit behind ``workflow.patched`` (see README, "Upgrading workers").
    """
    return WorkerDeploymentConfig(
        version=WorkerDeploymentVersion(deployment_name=deployment_name, build_id=build_id),
        use_worker_versioning=True,
        default_versioning_behavior=VERSIONING_BEHAVIORS[behavior],
    )


def build_worker(
    client: Client,
    task_queue: str = TASK_QUEUE,
    *,
    sandboxed: bool = False,
    drain: timedelta = timedelta(),
    deployment: WorkerDeploymentConfig | None = None,
    threaded: bool = False,
    remote_activities: bool = True,
) -> KiwiWorker:
    """A worker tuned so a dead worker's runs move to another within seconds.

    A short sticky schedule-to-start timeout sends a dead worker's workflow tasks back to the
    shared queue quickly instead of waiting on its sticky queue.

    ``sandboxed`` runs workflows in the Python SDK's sandbox, which re-imports the workflow module
    for every run and crosses into the sandbox (an ``exec``) for every payload it converts: about a
    third of a short run's time and most of the time a new worker needs to take over waiting runs.
    The workflow code here is Kiwi's own, not the user's, so the sandbox's determinism checks run
    where that code changes: the test suite's workers and the history replays are sandboxed.

    ``drain`` is how long shutdown waits for in-flight activities before cancelling them; polling stops
    at once, so the activities' workflows carry on with another worker.

    Workflow tasks run on the worker's event loop (the SDK's ``debug_mode``, which does only that when
    workflows are not sandboxed) unless ``threaded`` (or ``sandboxed``): the SDK's default hands each one to
    a thread pool and back, ~0.2 ms per workflow task on a 2-core host (a proxied call takes two: 0.45 of
    the 1.0 ms Kiwi added to it, #20). What the thread bought is the SDK's deadlock detection, a workflow task failed after 2 s
    (the thread itself runs on); ``kiwi.loopwatch`` logs a stuck loop and where it is stuck instead. The
    workflow code is Kiwi's own, no user code runs in it.

    ``remote_activities=False``: a worker that runs workflow tasks (and their local activities) only, leaving
    the activities a run schedules to other workers (Temporal's split of workflow and activity workers).
    """
    pool = McpPool()
    return KiwiWorker(
        client,
        mcp_pool=pool,
        task_queue=task_queue,
        workflows=WORKFLOWS,
        activities=activities(pool),
        workflow_runner=SANDBOX if sandboxed else UnsandboxedWorkflowRunner(),
        sticky_queue_schedule_to_start_timeout=STICKY_SCHEDULE_TO_START,
        # Waiting runs need no cache; a smaller cache bounds memory with many runs waiting.
        max_cached_workflows=MAX_CACHED_WORKFLOWS,
        max_concurrent_activities=50,
        # Heartbeats carry long upstream MCP calls' progress to the agent: send them within a second.
        max_heartbeat_throttle_interval=timedelta(seconds=1),
        graceful_shutdown_timeout=drain,
        deployment_config=deployment,
        # (A deployment names its own build.)
        build_id=None if deployment else build_id(),
        interceptors=[*sealing(client), AnswerLimit(), DrainNotice()],
        debug_mode=inline_workflow_tasks(sandboxed=sandboxed, threaded=threaded),
        no_remote_activities=not remote_activities,
    )


def sealing(client: Client) -> list[SealInterceptor]:
    """The seal check (kiwi/seal.py) for a worker whose client does not already bring it: a worker never
    runs what it cannot tell came from Kiwi."""
    held = [i for i in client.config()["interceptors"] if isinstance(i, SealInterceptor)]
    for seals in held:
        seals.key  # noqa: B018 - read now: a worker with a bad key stops before it polls, naming the key
    # (The client's worker interceptors apply to its workers.)
    return [] if held else [SealInterceptor(seal_key())]


def inline_workflow_tasks(*, sandboxed: bool, threaded: bool) -> bool:
    """Whether a worker built with these options runs workflow tasks on its event loop."""
    return not (sandboxed or threaded)


async def run_worker(
    client: Client,
    task_queue: str = TASK_QUEUE,
    stop: asyncio.Event | None = None,
    *,
    sandboxed: bool = False,
    drain: timedelta = timedelta(),
    health: tuple[str, int] | None = None,
    deployment: WorkerDeploymentConfig | None = None,
    started: Callable[[], None] | None = None,
    threaded: bool = False,
) -> None:
    """Run a worker until ``stop`` is set, then drain (see :func:`build_worker`).

    ``started`` is called once the worker polls (a process watching for its start line knows it takes
    work from then on).

    ``health`` (host, port) serves ``/healthz`` and ``/readyz`` there until the worker has stopped:
    ready while the worker polls and Temporal answers; not ready before, while the server does not
    answer, and while the worker drains.
    """
    listener = bind_health(*health) if health else None
    worker = build_worker(
        client, task_queue, sandboxed=sandboxed, drain=drain, deployment=deployment, threaded=threaded
    )
    watch = (
        LoopWatch().watching()
        if inline_workflow_tasks(sandboxed=sandboxed, threaded=threaded)
        else contextlib.nullcontext()
    )
    stop = stop or asyncio.Event()
    stopped = asyncio.Event()

    async def ready() -> bool:
        if not worker.is_running or stop.is_set():
            return False
        # Polling needs the server: while it does not answer, this worker takes no work.
        try:
            return await client.service_client.check_health(timeout=timedelta(seconds=2))
        except RPCError:
            return False

    probes = asyncio.create_task(serve_health(listener, ready, stopped)) if listener else None
    try:
        async with watch, worker:
            if started is not None:
                started()
            await stop.wait()
    finally:
        stopped.set()
        if probes is not None:
            await probes
