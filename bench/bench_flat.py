"""Cost that stays flat as work grows (#20): per-call CPU along one long run and with many runs open,
worker memory and the run list with 10,000 runs waiting.

    .venv/bin/python bench/bench_flat.py [--runs 10000] [--long 3000] [--calls 300] [--concurrency 25]

On a `kiwi worker` process and the tuned dev server:
1. one run makes ``--long`` sequential ``filesystem.write`` calls (continuing-as-new every 1,000 updates,
   the default); worker and server CPU per call are printed per window of 500 calls, and the last
   window's figure as a ratio of the first's;
2. ``--calls`` calls on a fresh run with 1, 100, 1,000 and ``--runs`` runs open (the others wait for
   the agent); CPU per call at each, as a ratio of the first;
3. with all ``--runs`` waiting: the worker's RSS (target <= 300 MB at 10,000) and the run list
   (``RunClient.list_runs``, what `kiwi runs` and MCP ``search(item_type="run")`` call) p50/p99
   (target p50 <= 100 ms at 10,000).
Starting 10,000 runs takes a few minutes on two cores.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from temporalio.client import Client  # noqa: E402

from bench.common import (  # noqa: E402
    cpu_seconds,
    gather_limited,
    notes_directive,
    pct,
    rss_mb,
    scratch_project,
    start_worker,
    stop_worker,
    tuned_dev_server,
    wait_directive,
)
from kiwi.converter import data_converter
from kiwi.items.store import ItemStore  # noqa: E402
from kiwi.runs import RunClient  # noqa: E402
from kiwi.seal import seal_interceptors  # noqa: E402
from tests.helpers import write  # noqa: E402

WINDOW = 500
OPEN_STEPS = (1, 100, 1000)


class CpuMeter:
    """CPU seconds used by the worker and the Temporal server since the last ``take``."""

    def __init__(self, worker_pid: int, server_pid: int) -> None:
        self.pids = (worker_pid, server_pid)
        self.last = self._now()

    def _now(self) -> tuple[float, float]:
        return cpu_seconds(self.pids[0]), cpu_seconds(self.pids[1])

    def take(self, calls: int) -> tuple[float, float]:
        """(worker, server) milliseconds of CPU per call since the last take."""
        now = self._now()
        per_call = tuple((b - a) / calls * 1000 for a, b in zip(self.last, now, strict=True))
        self.last = now
        return per_call  # type: ignore[return-value]


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--runs", type=int, default=10000, help="runs open at the end (waiting for the agent)"
    )
    parser.add_argument("--long", type=int, default=3000, help="calls made by the one long run")
    parser.add_argument("--calls", type=int, default=300, help="calls measured at each number of open runs")
    parser.add_argument("--concurrency", type=int, default=25, help="concurrent starters")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        scratch_project(root)
        write(
            root / ".ai" / "config" / "agent_harness.yaml",
            "rate_limits:\n  filesystem.write: 10000000\nloop_detection:\n  repeat_threshold: 1000000\n"
            "  max_warnings: 1000000\n",
        )
        wait_directive(root)
        notes_directive(root)
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
            meter = CpuMeter(worker.pid, server.process.pid)

            async def calls_on(run_id: str, first: int, count: int) -> None:
                for i in range(first, first + count):
                    result = await runs.call_tool(
                        run_id, "filesystem.write", {"path": f"notes/n{i % 100}.txt", "content": str(i)}
                    )
                    assert result.status == "ok", result

            # 1. One long run, window by window.
            long_run = await runs.start("notes", {})
            await calls_on(long_run, 0, 1)
            meter.take(1)
            windows = []
            for start in range(0, args.long, WINDOW):
                count = min(WINDOW, args.long - start)
                await calls_on(long_run, start, count)
                windows.append(meter.take(count))
            continued = (await runs.status(long_run)).continued
            await runs.cancel(long_run)

            # 2. Calls on a fresh run with more and more runs open.
            waiting: list[str] = []
            by_open = []
            started_at, start_seconds = 0, 0.0
            for target in sorted({*OPEN_STEPS, args.runs}):
                if target > args.runs:
                    continue
                t0 = time.perf_counter()
                more = target - 1 - len(waiting)
                waiting += await gather_limited(
                    args.concurrency, [runs.start("wait", {}) for _ in range(more)]
                )
                await all_waiting(client, len(waiting))
                start_seconds += time.perf_counter() - t0
                await quiet(worker.pid)
                started_at = len(waiting)
                probe = await runs.start("notes", {})
                await calls_on(probe, 0, 1)
                meter.take(1)
                await calls_on(probe, 0, args.calls)
                by_open.append((target, meter.take(args.calls)))
                await runs.cancel(probe)
                waiting_probe = await runs.start("wait", {})  # keeps the count of open runs at target
                waiting.append(waiting_probe)

            # 3. Memory and the run list with everything open.
            await all_waiting(client, len(waiting))
            memory = rss_mb(worker.pid)
            listed = []
            for _ in range(30):
                t0 = time.perf_counter()
                rows = await runs.list_runs()
                listed.append((time.perf_counter() - t0) * 1000)
            assert len(rows) == 50 or args.runs < 50, len(rows)  # newest 50 of this project
            filtered = []
            for _ in range(30):
                t0 = time.perf_counter()
                await runs.list_runs(status="awaiting_agent", directive="wait", limit=10)
                filtered.append((time.perf_counter() - t0) * 1000)
        finally:
            await stop_worker(worker)
            server.stop()

    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    print(f"1. one run, {args.long} sequential filesystem.write calls (continued-as-new {continued} times):")
    for i, (w, s) in enumerate(windows):
        print(
            f"   calls {i * WINDOW + 1:5d}-{min((i + 1) * WINDOW, args.long):5d}: worker {w:5.2f} ms  server {s:5.2f} ms per call"
        )
    print(
        f"   last window / first: worker {windows[-1][0] / windows[0][0]:.2f}x  server "
        f"{windows[-1][1] / windows[0][1]:.2f}x   (flat: ~1.0x)"
    )
    print(
        f"2. {args.calls} calls on a fresh run with N runs open (started {started_at} in {start_seconds:.0f} s):"
    )
    for target, (w, s) in by_open:
        print(
            f"   {target:6d} open: worker {w:5.2f} ms  server {s:5.2f} ms per call   "
            f"({w / by_open[0][1][0]:.2f}x, {s / by_open[0][1][1]:.2f}x of 1 open)"
        )
    print(f"3. with {len(waiting) + 0} runs waiting for the agent:")
    print(f"   worker RSS {memory:.0f} MB   (target <= 300 MB at 10,000)")
    print(
        f"   run list (kiwi runs: newest 50 of this project) p50 {pct(listed, 0.5):.1f} ms  p99 "
        f"{pct(listed, 0.99):.1f} ms   (target p50 <= 100 ms at 10,000)"
    )
    print(
        f"   run list filtered (status awaiting_agent, directive wait, 10) p50 {pct(filtered, 0.5):.1f} ms  "
        f"p99 {pct(filtered, 0.99):.1f} ms"
    )


async def quiet(pid: int) -> None:
    """Until the worker is idle (under 5% of a core for half a second): runs just started finish their
    first audit flush (within a second of waiting) before calls are measured beside them."""
    while True:
        before = cpu_seconds(pid)
        await asyncio.sleep(0.5)
        if cpu_seconds(pid) - before < 0.025:
            return


async def all_waiting(client: Client, count: int) -> None:
    """Until ``count`` runs of the wait directive show awaiting_agent (visibility is eventually consistent)."""
    query = "WorkflowType = 'DirectiveRun' AND KiwiDirective = 'wait' AND KiwiStatus = 'awaiting_agent'"
    while (await client.count_workflows(query)).count < count:
        await asyncio.sleep(0.5)


if __name__ == "__main__":
    asyncio.run(main())
