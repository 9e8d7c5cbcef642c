"""Many runs waiting for approval at once: worker memory, and time from approving all to all finished.

    .venv/bin/python bench/bench_approvals.py [--runs 1000] [--concurrency 25]

Each run's one automatic step deletes a file, which agent_harness.yaml puts behind an approval.
Once every run shows its pending request, the worker's RSS is read, then every request is approved
(the ``decide_approval`` signal, as `temporal workflow signal` or `kiwi approve` sends it) and the
time until all runs have completed is reported.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from temporalio.client import Client  # noqa: E402

from bench.common import (  # noqa: E402
    gather_limited,
    rss_mb,
    scratch_project,
    start_worker,
    stop_worker,
    tuned_dev_server,
)
from kiwi.cli.keys import ensure_key  # noqa: E402
from kiwi.contracts import ApprovalRequest  # noqa: E402
from kiwi.converter import data_converter
from kiwi.items.store import ItemStore  # noqa: E402
from kiwi.runs import RunClient
from kiwi.seal import seal_interceptors  # noqa: E402
from kiwi.snapshot import signed_decision  # noqa: E402
from tests.helpers import directive_md, write, write_directive  # noqa: E402


def phase(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


async def main() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=25)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        scratch_project(root)
        write(root / ".ai" / "config" / "agent_harness.yaml", "approvals:\n  tools: [filesystem.delete]\n")
        write_directive(
            root / ".ai" / "directives" / "clean.md",
            directive_md(
                '<step name="clean"><tool_call tool="filesystem.delete"><param name="path">notes/{n}.txt</param>'
                "</tool_call></step>",
                name="clean",
                permissions='<write resource="filesystem" path="notes/**"/>',
                inputs='<input name="n" type="string" required="true"/>',
            ),
        )
        for n in range(args.runs):
            write(root / "notes" / f"{n}.txt", "x")
        server = tuned_dev_server(root)
        await server.start()
        try:
            worker = await start_worker(server.address)
        except BaseException:
            server.stop()  # (a worker that did not start leaves no dev server behind)
            raise
        try:
            client = await Client.connect(
                server.address, data_converter=data_converter, interceptors=seal_interceptors()
            )
            runs = RunClient(client, ItemStore(root))
            phase(f"starting {args.runs} runs")
            ids = await gather_limited(
                args.concurrency, [runs.start("clean", {"n": str(n)}) for n in range(args.runs)]
            )
            phase("waiting until every run shows its approval request")

            async def pending(run_id: str) -> ApprovalRequest:
                while True:
                    status = await runs.status(run_id)
                    waiting = [a for a in status.approvals if a.status == "pending"]
                    if waiting:
                        return waiting[0]
                    await asyncio.sleep(0.1)

            requests = await gather_limited(args.concurrency, [pending(r) for r in ids])
            memory = rss_mb(worker.pid)
            phase("approving all of them")
            t0 = time.perf_counter()
            approver = ensure_key()[0]  # made by `kiwi init`, trusted to sign and approve

            async def approve(run_id: str, request: ApprovalRequest) -> None:
                decision = signed_decision(run_id, await runs.execution(run_id), request, True, approver)
                await runs.handle(run_id).signal("decide_approval", decision)

            await gather_limited(
                args.concurrency, [approve(r, q) for r, q in zip(ids, requests, strict=True)]
            )
            results = await gather_limited(args.concurrency, [runs.handle(r).result() for r in ids])
            finished = time.perf_counter() - t0
            assert all(r.status == "completed" for r in results)
            assert not any((root / "notes").iterdir())
        finally:
            await stop_worker(worker)
            server.stop()
    print(
        f"{args.runs} runs waiting for approval (load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores)"
    )
    print(f"worker RSS with all {args.runs} waiting: {memory:.0f} MB")
    print(f"approving all {args.runs} -> all completed: {finished:.1f} s ({args.runs / finished:.0f} runs/s)")


if __name__ == "__main__":
    asyncio.run(main())
