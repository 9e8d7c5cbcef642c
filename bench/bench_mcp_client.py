"""Where an upstream MCP call's time goes, outside Kiwi: the MCP SDK's client against the bare protocol.

#20's proxied-call p50 target is measured against a no-op local activity; a bare workflow making the same
``echo`` call to server-everything is already 1.15-1.20x that floor. This bench times the upstream round
trip alone, after an idle gap like the one between an agent's calls (the run's update path takes 8-11 ms
on this host, so an upstream server sits idle at least that long between calls):

- ``sdk``: ``mcp.client.Client.call_tool`` over ``stdio_client`` (what Kiwi's pool, and the bench's bare
  workflow, use);
- ``jsonrpc``: the same ``tools/call`` written as one JSON line to the same kind of server process and its
  answer line read back (no session, no validation): the floor of the transport;
- ``kiwi``: Kiwi's pool (``McpPool.call_tool``), whose stdio transport sends a handshake-era server's
  ``tools/call`` the short way (kiwi/upstream/stdio.py) and checks the answer as the SDK does.

    .venv/bin/python bench/bench_mcp_client.py [--calls 150]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mcp.client import Client  # noqa: E402
from mcp.client.stdio import StdioServerParameters  # noqa: E402

from bench.bench_mcp_proxy import EVERYTHING  # noqa: E402
from bench.floor import JsonRpc  # noqa: E402
from kiwi.upstream.pool import McpPool  # noqa: E402

GAPS_MS = (0, 10, 30, 50)


async def _median_ms(call, gap_ms: int, calls: int) -> float:
    samples = []
    for _ in range(calls):
        await asyncio.sleep(gap_ms / 1000)  # the idle time between calls is what is measured against
        started = time.perf_counter()
        await call()
        samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=150)
    args = parser.parse_args()
    if not EVERYTHING.exists():
        raise SystemExit("run scripts/test once first: it installs tests/npm (server-everything)")
    rpc = await JsonRpc.start(EVERYTHING)
    project = Path(tempfile.mkdtemp(prefix="kiwi-bench-"))
    (project / ".ai" / "config").mkdir(parents=True)
    (project / ".ai" / "config" / "mcp_registry.yaml").write_text(
        f"mcps:\n  everything:\n    command: node\n    args: ['{EVERYTHING}', 'stdio']\n"
    )
    pool = McpPool(user=project / "user")
    config = pool.config(str(project), "everything")
    try:
        async with Client(StdioServerParameters(command="node", args=[str(EVERYTHING), "stdio"])) as sdk:

            async def by_sdk() -> None:
                result = await sdk.call_tool("echo", {"message": "m"})
                assert not result.is_error

            async def by_hand() -> None:
                answer = await rpc.request("tools/call", {"name": "echo", "arguments": {"message": "m"}})
                assert "result" in answer, answer

            async def by_kiwi() -> None:
                result, _ = await pool.call_tool(str(project), config, "echo", {"message": "m"})
                assert not result.get("isError"), result

            await by_kiwi()
            assert (await pool.connection(str(project), config)).short_calls()
            print(f"echo to server-everything over stdio, p50 of {args.calls} calls after each idle gap")
            for gap in GAPS_MS:
                # Two rounds each, taking turns, so drift in the host's load hits all three.
                sdk_ms, hand_ms, kiwi_ms = [], [], []
                for _ in range(2):
                    sdk_ms.append(await _median_ms(by_sdk, gap, args.calls))
                    hand_ms.append(await _median_ms(by_hand, gap, args.calls))
                    kiwi_ms.append(await _median_ms(by_kiwi, gap, args.calls))
                s, h, k = statistics.mean(sdk_ms), statistics.mean(hand_ms), statistics.mean(kiwi_ms)
                print(
                    f"idle {gap:3d} ms: MCP SDK client {s:5.2f} ms ({s / h:.2f}x), Kiwi's pool {k:5.2f} ms "
                    f"({k / h:.2f}x), JSON-RPC by hand {h:5.2f} ms"
                )
    finally:
        await pool.close()
        await rpc.stop()
        shutil.rmtree(project, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
