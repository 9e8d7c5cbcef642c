"""Many runs waiting for the agent: worker memory, and recovery after kill -9 of the worker.

    .venv/bin/python bench/bench_waiting.py [--runs 1000] [--concurrency 25] [--agents 200]

Starts N runs of a one-step agent directive on a worker process, reads the worker's RSS once all
wait, kills the worker with SIGKILL, starts a new one, completes every step, and reports how long
after the new worker started all runs were done. Targets: RSS <= 250 MB at 1,000 runs; all done
<= 10 s after the new worker starts. Then it does the same to as many bare workflows
(bench/floor.py: an update that completes the workflow, nothing of Kiwi's) as the floor, and to bare
workflows that also run a no-op local activity in their first and last workflow tasks, where Kiwi
writes its audit records (AuditedFloorWorkflow): what the audit trail's design costs, apart from Kiwi's code.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from temporalio.client import Client  # noqa: E402

from bench.common import (
    cpu_seconds,
    gather_limited,
    rss_mb,
    scratch_project,
    start_worker,
    stop_worker,
    tuned_dev_server,  # noqa: E402
    wait_directive,
)
from bench.floor import AuditedFloorWorkflow, FloorWorkflow, start_floor_worker  # noqa: E402
from kiwi.converter import data_converter
from kiwi.devserver import DevServer  # noqa: E402
from kiwi.items.store import ItemStore  # noqa: E402
from kiwi.runs import RunClient  # noqa: E402
from kiwi.seal import seal_interceptors  # noqa: E402


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=25, help="concurrent starters")
    parser.add_argument(
        "--agents",
        type=int,
        default=200,
        help="agents completing their steps at the same time after the crash",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        scratch_project(root)
        wait_directive(root)
        server = tuned_dev_server(root)
        await server.start()
        worker = await start_worker(server.address)
        try:
            client = await Client.connect(
                server.address, data_converter=data_converter, interceptors=seal_interceptors()
            )
            runs = RunClient(client, ItemStore(root))
            snapshot = runs.snapshot("wait", {}, "run-wait-x")
            assert snapshot.directive.steps[0].name == "decide"
            t0 = time.perf_counter()
            ids = await gather_limited(args.concurrency, [runs.start("wait", {}) for _ in range(args.runs)])
            started = time.perf_counter() - t0

            async def waiting(run_id: str) -> None:
                while (await runs.status(run_id)).status != "awaiting_agent":
                    await asyncio.sleep(0.1)

            await gather_limited(args.concurrency, [waiting(r) for r in ids])
            memory = rss_mb(worker.pid)
            await stop_worker(worker, signal.SIGKILL)
            worker = await start_worker(server.address)
            t1 = time.perf_counter()
            cpu0 = cpu_seconds(), cpu_seconds(worker.pid), cpu_seconds(server.process.pid)
            await gather_limited(args.agents, [runs.complete_step(r, "decide", {"ok": True}) for r in ids])
            recovered = time.perf_counter() - t1
            cpu = [
                cpu_seconds() - cpu0[0],
                cpu_seconds(worker.pid) - cpu0[1],
                cpu_seconds(server.process.pid) - cpu0[2],
            ]
            floor = await recovery_floor(client, server, args)
            audited = await recovery_floor(client, server, args, AuditedFloorWorkflow)
        finally:
            await stop_worker(worker)
            server.stop()
    print(f"{args.runs} runs (load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores)")
    print(
        f"started in {started:.1f} s ({args.runs / started:.0f} runs/s with {args.concurrency} concurrent starters)"
    )
    print(
        f"worker RSS with all {args.runs} waiting for the agent: {memory:.0f} MB   (target <= 250 MB at 1,000)"
    )
    print(
        f"after kill -9 and a new worker, {args.agents} agents at a time completing steps: all {args.runs} "
        f"completed in {recovered:.1f} s   (target <= 10 s)"
    )
    print(
        f"CPU in that phase: worker {cpu[1]:.1f} s, Temporal server {cpu[2]:.1f} s, agents (this process) {cpu[0]:.1f} s"
    )
    print(
        f"floor, {args.runs} bare workflows the same way (one update each completes it, nothing of Kiwi's): "
        f"{floor[0]:.1f} s; CPU worker {floor[1]:.1f} s, Temporal server {floor[2]:.1f} s"
    )
    print(
        f"floor with Kiwi's audit writes (a no-op local activity in the first and the last task): "
        f"{audited[0]:.1f} s; CPU worker {audited[1]:.1f} s, Temporal server {audited[2]:.1f} s"
    )
    print(
        f"#20: recovery {recovered / floor[0]:.2f}x the bare workflows (target <= 1.15x), "
        f"{recovered / audited[0]:.2f}x the ones writing as Kiwi's audit trail does"
    )


async def recovery_floor(
    client: Client, server: DevServer, args: argparse.Namespace, kind: type = FloorWorkflow
) -> tuple[float, float, float]:
    """Seconds (and worker, server CPU seconds) for a new worker to finish ``args.runs`` bare waiting
    workflows of ``kind`` after kill -9 of the worker that had them cached."""
    queue = f"floor-recovery-{kind.__name__}"
    worker = await start_floor_worker(server.address, queue)
    try:
        handles = await gather_limited(
            args.concurrency,
            [
                client.start_workflow(kind.run, id=f"floor-{kind.__name__}-{i}", task_queue=queue)
                for i in range(args.runs)
            ],
        )
        await gather_limited(args.concurrency, [h.query(kind.ready) for h in handles])
        await stop_worker(worker, signal.SIGKILL)
        worker = await start_floor_worker(server.address, queue)
        t0 = time.perf_counter()
        cpu0 = cpu_seconds(worker.pid), cpu_seconds(server.process.pid)
        await gather_limited(args.agents, [h.execute_update(kind.finish, "ok") for h in handles])
        return (
            time.perf_counter() - t0,
            cpu_seconds(worker.pid) - cpu0[0],
            cpu_seconds(server.process.pid) - cpu0[1],
        )
    finally:
        await stop_worker(worker)


if __name__ == "__main__":
    asyncio.run(main())
