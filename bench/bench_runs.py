"""Run benchmark on the tuned dev server: a 3-step automatic directive, start -> completed.

    .venv/bin/python bench/bench_runs.py [--runs 40] [--concurrency 10]

Prints p50/p99 latency of sequential runs and sustained runs/s with concurrent starters,
with the machine's load average, against the issue's targets (p50 <= 150 ms, >= 20 runs/s).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from temporalio.client import Client  # noqa: E402

from bench.common import (  # noqa: E402
    cpu_seconds,
    pct,
    scratch_project,
    start_worker,
    stop_worker,
    tuned_dev_server,
)
from kiwi.converter import data_converter
from kiwi.items.store import ItemStore  # noqa: E402
from kiwi.runs import RunClient  # noqa: E402
from kiwi.seal import seal_interceptors  # noqa: E402
from tests.helpers import directive_md, write_directive  # noqa: E402
from workers.main import build_worker  # noqa: E402

STEPS = "\n".join(
    f'<step name="w{i}"><tool_call tool="filesystem.write"><param name="path">out/{{tag}}-{i}.txt</param>'
    f'<param name="content">step {i}</param></tool_call></step>'
    for i in range(3)
)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument(
        "--worker-process",
        action="store_true",
        help="run the worker as its own `kiwi worker` process, as deployed",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        scratch_project(root)
        write_directive(
            root / ".ai" / "directives" / "three.md",
            directive_md(
                STEPS,
                name="three",
                permissions='<write resource="filesystem" path="out/**"/>',
                inputs='<input name="tag" type="string" required="true"/>',
            ),
        )
        server = tuned_dev_server(root)
        await server.start()
        try:
            client = await Client.connect(
                server.address, data_converter=data_converter, interceptors=seal_interceptors()
            )
            runs = RunClient(client, ItemStore(root))
            worker = await start_worker(server.address) if args.worker_process else None
            async with build_worker(client) if worker is None else contextlib.nullcontext():

                async def one(tag: str) -> float:
                    t0 = time.perf_counter()
                    run_id = await runs.start("three", {"tag": tag})
                    result = await runs.handle(run_id).result()
                    assert result.status == "completed"
                    return (time.perf_counter() - t0) * 1000

                for i in range(3):
                    await one(f"warm{i}")
                latencies = [await one(f"seq{i}") for i in range(args.runs)]
                sem = asyncio.Semaphore(args.concurrency)

                async def limited(tag: str) -> float:
                    async with sem:
                        return await one(tag)

                t0 = time.perf_counter()
                cpu0 = (
                    cpu_seconds(),
                    cpu_seconds(server.process.pid),
                    cpu_seconds(worker.pid) if worker else 0,
                )
                await asyncio.gather(*(limited(f"par{i}") for i in range(args.runs * 2)))
                elapsed = time.perf_counter() - t0
                client_cpu = cpu_seconds() - cpu0[0]
                worker_cpu = cpu_seconds(worker.pid) - cpu0[2] if worker else 0.0
                server_cpu = cpu_seconds(server.process.pid) - cpu0[1]
            if worker is not None:
                await stop_worker(worker)
        finally:
            server.stop()
    print(
        f"3-step automatic directive, {args.runs} sequential runs "
        f"(load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores)"
    )
    print(f"start -> completed p50: {pct(latencies, 0.5):7.1f} ms   (target <= 150 ms)")
    print(f"start -> completed p99: {pct(latencies, 0.99):7.1f} ms")
    print(
        f"sustained, {args.concurrency} concurrent starters: {args.runs * 2 / elapsed:6.1f} runs/s   "
        "(target >= 20 runs/s)"
    )
    per_run = 1000 / (args.runs * 2)
    print(
        f"CPU per run in the sustained phase: Temporal server {server_cpu * per_run:.0f} ms, "
        + (
            f"worker process {worker_cpu * per_run:.0f} ms, starters {client_cpu * per_run:.0f} ms"
            if args.worker_process
            else f"starters + in-process worker {client_cpu * per_run:.0f} ms"
        )
    )


if __name__ == "__main__":
    asyncio.run(main())
