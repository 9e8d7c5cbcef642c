"""The Kiwi worker: DirectiveRun workflows and every activity, on one task queue."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio.client import Client
from temporalio.worker import Worker

from activities.audit import AuditActivities
from activities.commands import CommandActivities, GitActivities
from activities.directives import DirectiveActivities
from activities.filesystem import FilesystemActivities
from kiwi.contracts import TASK_QUEUE
from workflows.directive_run import DirectiveRun

WORKFLOWS = [DirectiveRun]


def activities() -> list:
    fs, commands, git, audit = FilesystemActivities(), CommandActivities(), GitActivities(), AuditActivities()
    return [fs.read_file, fs.write_file, fs.list_directory, fs.create_directory, fs.delete_path, fs.move_path,
            commands.run_command, commands.run_local_tool, git.git_status, git.git_diff, git.git_commit,
            audit.write_audit_records, DirectiveActivities().resolve_directive]


def build_worker(client: Client, task_queue: str = TASK_QUEUE) -> Worker:
    """A worker tuned so a dead worker's runs move to another within seconds.

    A short sticky schedule-to-start timeout sends a dead worker's workflow tasks back to the
    shared queue quickly instead of waiting on its sticky queue.
    """
    return Worker(
        client,
        task_queue=task_queue,
        workflows=WORKFLOWS,
        activities=activities(),
        sticky_queue_schedule_to_start_timeout=timedelta(seconds=3),
        # Waiting runs need no cache; a smaller cache bounds memory with many runs waiting.
        max_cached_workflows=300,
        max_concurrent_activities=50,
    )


async def run_worker(client: Client, task_queue: str = TASK_QUEUE, stop: asyncio.Event | None = None) -> None:
    worker = build_worker(client, task_queue)
    async with worker:
        await (stop.wait() if stop else asyncio.Event().wait())
