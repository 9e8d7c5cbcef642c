"""The Temporal floor under a Kiwi call: an update on a bare workflow, with and without a no-op local activity.

Kiwi's proxied call is an update whose handler runs a local activity; these are the same two
round trips with nothing of Kiwi's in them, measured on the same server, so a benchmark can say
how much of its latency is Kiwi's and how much is the SDK's and the server's.
"""

from __future__ import annotations

import time
import uuid
from datetime import timedelta

from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.worker import UnsandboxedWorkflowRunner, Worker


@activity.defn
async def floor_noop(value: str) -> str:
    return value


@workflow.defn
class FloorWorkflow:
    def __init__(self) -> None:
        self.done = False

    @workflow.run
    async def run(self) -> None:
        await workflow.wait_condition(lambda: self.done)

    @workflow.update
    async def plain(self, value: str) -> str:
        return value

    @workflow.update
    async def local(self, value: str) -> str:
        return await workflow.execute_local_activity(floor_noop, value, start_to_close_timeout=timedelta(seconds=10))

    @workflow.signal
    def stop(self) -> None:
        self.done = True


async def update_floor(client: Client, calls: int) -> dict[str, list[float]]:
    """Sequential latencies (ms) of ``calls`` bare updates, "plain" and "local", on an in-process worker.

    Each kind gets its own workflow, and at most 1,000 calls: Temporal allows 2,000 updates per run.
    """
    queue = f"floor-{uuid.uuid4().hex[:8]}"
    samples: dict[str, list[float]] = {"plain": [], "local": []}
    async with Worker(client, task_queue=queue, workflows=[FloorWorkflow], activities=[floor_noop],
                      workflow_runner=UnsandboxedWorkflowRunner()):
        for name, values in samples.items():
            handle = await client.start_workflow(FloorWorkflow.run, id=f"{queue}-{name}", task_queue=queue)
            for i in range(10 + min(calls, 1000)):
                t0 = time.perf_counter()
                await handle.execute_update(name, f"m{i}")
                if i >= 10:
                    values.append((time.perf_counter() - t0) * 1000)
            await handle.signal(FloorWorkflow.stop)
            await handle.result()
    return samples
