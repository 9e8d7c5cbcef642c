"""The Kiwi worker: DirectiveRun workflows and every activity, on one task queue."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio.client import Client
from temporalio.worker import UnsandboxedWorkflowRunner, Worker
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from activities.api import ApiToolActivities
from activities.approvals import ApprovalActivities
from activities.audit import AuditActivities
from activities.commands import CommandActivities, GitActivities
from activities.container import ContainerToolActivities
from activities.directives import DirectiveActivities
from activities.filesystem import FilesystemActivities
from activities.mcp import McpActivities
from kiwi.contracts import TASK_QUEUE
from kiwi.upstream.pool import McpPool
from workflows.directive_run import DirectiveRun

WORKFLOWS = [DirectiveRun]
# A dead worker's cached runs move to another worker after this long (see build_worker).
STICKY_SCHEDULE_TO_START = timedelta(seconds=3)
MAX_CACHED_WORKFLOWS = 300


def activities(pool: McpPool) -> list:
    fs, commands, git, audit = FilesystemActivities(), CommandActivities(), GitActivities(), AuditActivities()
    return [
        fs.read_file,
        fs.write_file,
        fs.list_directory,
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
        git.git_checkpoint,
        git.git_rollback,
        audit.write_audit_records,
        DirectiveActivities().resolve_directive,
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


def build_worker(client: Client, task_queue: str = TASK_QUEUE, *, sandboxed: bool = False) -> KiwiWorker:
    """A worker tuned so a dead worker's runs move to another within seconds.

    A short sticky schedule-to-start timeout sends a dead worker's workflow tasks back to the
    shared queue quickly instead of waiting on its sticky queue.

    ``sandboxed`` runs workflows in the Python SDK's sandbox, which re-imports the workflow module
    for every run and crosses into the sandbox (an ``exec``) for every payload it converts: about a
    third of a short run's time and most of the time a new worker needs to take over waiting runs.
    The workflow code here is Kiwi's own, not the user's, so the sandbox's determinism checks run
    where that code changes: the test suite's workers and the history replays are sandboxed.
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
    )


async def run_worker(
    client: Client,
    task_queue: str = TASK_QUEUE,
    stop: asyncio.Event | None = None,
    *,
    sandboxed: bool = False,
) -> None:
    worker = build_worker(client, task_queue, sandboxed=sandboxed)
    async with worker:
        await (stop.wait() if stop else asyncio.Event().wait())
