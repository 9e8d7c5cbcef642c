"""The Temporal floor under Kiwi's figures: the same round trips on a bare workflow, with nothing of Kiwi's.

Kiwi's proxied call is an update whose handler runs a local activity; ``update_floor`` times a
bare update and one running a no-op local activity on the same server. Recovery after kill -9 is
an update to each waiting run on a new worker; ``python -m bench.floor --address A --task-queue Q``
is a worker process for :class:`FloorWorkflow` tuned like ``kiwi worker``, so a benchmark can do the
same to bare workflows and say how much of its time is Kiwi's and how much the SDK's and server's.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path

from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from workers.main import MAX_CACHED_WORKFLOWS, STICKY_SCHEDULE_TO_START


@activity.defn
async def floor_noop(value: str) -> str:
    return value


class UpstreamFloor:
    """The same upstream call Kiwi proxies, from a bare workflow: one MCP client session, no Kiwi."""

    def __init__(self, session) -> None:
        self.session = session

    @activity.defn(name="floor_upstream")
    async def call(self, value: str) -> dict:
        result = await self.session.call_tool("echo", {"message": value})
        return result.model_dump(mode="json", by_alias=True, exclude_none=True)


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
        return await workflow.execute_local_activity(
            floor_noop, value, start_to_close_timeout=timedelta(seconds=10)
        )

    @workflow.update
    async def upstream(self, value: str) -> dict:
        """The update Kiwi's proxied call is, minus Kiwi: a local activity making the MCP call."""
        return await workflow.execute_local_activity(
            "floor_upstream", value, start_to_close_timeout=timedelta(seconds=10), result_type=dict
        )

    @workflow.update
    async def finish(self, value: str) -> str:
        """Like ``complete_step`` on a one-step run: answers, and the workflow completes."""
        self.done = True
        return value

    @workflow.query
    def ready(self) -> bool:
        return True

    @workflow.signal
    def stop(self) -> None:
        self.done = True


async def update_floor(
    client: Client, calls: int, callers: int, upstream=None
) -> tuple[dict[str, list[float]], float | dict[str, float]]:
    """Sequential latencies (ms) of ``calls`` bare updates, "plain" and "local", on an in-process worker,
    and the rate (updates/s) of "local" updates sent by ``callers`` concurrent callers.

    With ``upstream`` (an open MCP client session to server-everything), also "upstream": the update
    running a local activity that makes the same ``echo`` call Kiwi proxies; the rate is then a dict
    by kind ("local", "upstream"). Each kind gets its own workflow, and at most 1,000 calls: Temporal
    allows 2,000 updates per run.
    """
    queue = f"floor-{uuid.uuid4().hex[:8]}"
    samples: dict[str, list[float]] = {"plain": [], "local": []}
    activities = [floor_noop]
    if upstream is not None:
        samples["upstream"] = []
        activities.append(UpstreamFloor(upstream).call)
    async with Worker(
        client,
        task_queue=queue,
        workflows=[FloorWorkflow],
        activities=activities,
        workflow_runner=UnsandboxedWorkflowRunner(),
    ):
        for name, values in samples.items():
            handle = await client.start_workflow(FloorWorkflow.run, id=f"{queue}-{name}", task_queue=queue)
            for i in range(10 + min(calls, 1000)):
                t0 = time.perf_counter()
                await handle.execute_update(name, f"m{i}")
                if i >= 10:
                    values.append((time.perf_counter() - t0) * 1000)
            await handle.signal(FloorWorkflow.stop)
        rates: dict[str, float] = {}
        for kind in ["local"] + (["upstream"] if upstream is not None else []):
            shared = await client.start_workflow(
                FloorWorkflow.run, id=f"{queue}-callers-{kind}", task_queue=queue
            )

            async def caller(count: int, kind: str = kind, shared=shared) -> None:
                for i in range(count):
                    await shared.execute_update(kind, f"c{i}")

            share = min(calls, 1000) // callers
            t0 = time.perf_counter()
            await asyncio.gather(*(caller(share) for _ in range(callers)))
            rates[kind] = share * callers / (time.perf_counter() - t0)
            await shared.signal(FloorWorkflow.stop)
    return samples, (rates if upstream is not None else rates["local"])


async def start_floor_worker(address: str, task_queue: str) -> asyncio.subprocess.Process:
    """A worker process for :class:`FloorWorkflow` (stop it with ``bench.common.stop_worker``)."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench.floor",
        "--address",
        address,
        "--task-queue",
        task_queue,
        stdout=asyncio.subprocess.PIPE,
        start_new_session=True,
        env=env,
    )
    await proc.stdout.readline()
    return proc


async def _serve(address: str, task_queue: str) -> None:
    client = await Client.connect(address)
    # The same tuning as kiwi worker.
    async with Worker(
        client,
        task_queue=task_queue,
        workflows=[FloorWorkflow],
        activities=[floor_noop],
        workflow_runner=UnsandboxedWorkflowRunner(),
        max_cached_workflows=MAX_CACHED_WORKFLOWS,
        sticky_queue_schedule_to_start_timeout=STICKY_SCHEDULE_TO_START,
    ):
        print("floor worker ready", flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="a worker process for bench.floor.FloorWorkflow")
    parser.add_argument("--address", required=True)
    parser.add_argument("--task-queue", required=True)
    options = parser.parse_args()
    asyncio.run(_serve(options.address, options.task_queue))
