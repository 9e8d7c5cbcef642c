"""A run with thousands of tool calls: it continues-as-new under the hood and callers never notice.

.venv/bin/python bench/bench_long_run.py [--calls 3000]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from temporalio.client import Client  # noqa: E402

from activities.audit import read_audit  # noqa: E402
from bench.common import scratch_project, tuned_dev_server  # noqa: E402
from kiwi.converter import data_converter
from kiwi.items.store import ItemStore  # noqa: E402
from kiwi.runs import RunClient  # noqa: E402
from kiwi.seal import seal_interceptors  # noqa: E402
from workers.main import build_worker  # noqa: E402


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=3000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        scratch_project(root)
        (root / ".ai" / "config" / "agent_harness.yaml").write_text(
            "rate_limits:\n  filesystem.write: 100000\nloop_detection:\n  repeat_threshold: 1000000\n"
            "  max_warnings: 1000000\n"
        )
        server = tuned_dev_server(root)
        await server.start()
        try:
            client = await Client.connect(
                server.address, data_converter=data_converter, interceptors=seal_interceptors()
            )
            runs = RunClient(client, ItemStore(root))
            async with build_worker(client):
                run_id = await runs.start("hello_kiwi", {"name": "Long"})
                while (await runs.status(run_id)).status != "awaiting_agent":
                    await asyncio.sleep(0.05)
                t0 = time.perf_counter()
                for i in range(args.calls):
                    result = await runs.call_tool(
                        run_id, "filesystem.write", {"path": f"notes/{i % 50}.txt", "content": str(i)}
                    )
                    assert result.status == "ok", result
                elapsed = time.perf_counter() - t0
                status = await runs.status(run_id)
                await runs.complete_step(run_id, "confirm", {"ok": True})
                result = await runs.handle(run_id).result()
            records = read_audit(str(root), run_id)
        finally:
            server.stop()
    calls = sum(1 for r in records if r["event"] == "tool_call")
    gapless = [r["seq"] for r in records] == list(range(1, len(records) + 1))
    print(
        f"{args.calls} agent calls in one run: {elapsed:.1f} s ({args.calls / elapsed:.0f} calls/s), "
        f"continued-as-new {status.continued} times"
    )
    print(
        f"run {result.status}; calls counted {result.calls}; audit records for calls {calls}; "
        f"sequence gapless: {gapless}"
    )


if __name__ == "__main__":
    asyncio.run(main())
