"""An `execute` tool call that proxies filesystem.read inside a run, end to end over stdio, against
reading the same file through @modelcontextprotocol/server-filesystem directly from the same client.

    scripts/test -k nothing   # once, to install tests/npm
    .venv/bin/python bench/bench_mcp_read.py [--calls 200]
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

from mcp.client import Client  # noqa: E402
from mcp.client.stdio import StdioServerParameters  # noqa: E402
from temporalio.client import Client as TemporalClient  # noqa: E402

from bench.common import pct, scratch_project, tuned_dev_server  # noqa: E402
from kiwi.converter import data_converter
from kiwi.seal import seal_interceptors  # noqa: E402
from workers.main import build_worker  # noqa: E402

SERVER_FS = (
    Path(__file__).resolve().parents[1]
    / "tests"
    / "npm"
    / "node_modules"
    / "@modelcontextprotocol"
    / "server-filesystem"
    / "dist"
    / "index.js"
)


async def timed(calls: int, fn) -> list[float]:
    for _ in range(5):
        await fn()
    samples = []
    for _ in range(calls):
        t0 = time.perf_counter()
        await fn()
        samples.append((time.perf_counter() - t0) * 1000)
    return samples


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    if not SERVER_FS.exists():
        raise SystemExit("run scripts/test once first: it installs tests/npm (server-filesystem)")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        scratch_project(root)
        # The benchmark repeats one call on purpose; loop detection would (rightly) stop it.
        (root / ".ai" / "config" / "agent_harness.yaml").write_text(
            "loop_detection:\n  repeat_threshold: 1000000\n  max_warnings: 1000000\n"
        )
        (root / "notes").mkdir()
        (root / "notes" / "hello.md").write_text("Hello from a file.\n" * 20)
        server = tuned_dev_server(root)
        await server.start()
        try:
            temporal = await TemporalClient.connect(
                server.address, data_converter=data_converter, interceptors=seal_interceptors()
            )
            async with build_worker(temporal):
                kiwi_mcp = StdioServerParameters(
                    command=sys.executable,
                    args=["-m", "kiwi", "mcp", "--address", server.address],
                    cwd=str(root),
                )
                async with Client(kiwi_mcp) as client:
                    started = await client.call_tool(
                        "execute",
                        {
                            "item_type": "directive",
                            "action": "run",
                            "item_id": "hello_kiwi",
                            "parameters": {"name": "Bench"},
                        },
                    )
                    run_id = started.structured_content["run_id"]

                    async def proxied() -> None:
                        result = await client.call_tool(
                            "execute",
                            {
                                "item_type": "tool",
                                "action": "call",
                                "run_id": run_id,
                                "item_id": "filesystem.read",
                                "parameters": {"path": "notes/hello.md"},
                            },
                        )
                        assert result.structured_content.get("status") == "ok", result.structured_content

                    kiwi_ms = await timed(args.calls, proxied)
            direct_params = StdioServerParameters(command="node", args=[str(SERVER_FS), str(root)])
            async with Client(direct_params) as direct:
                tools = {t.name for t in (await direct.list_tools()).tools}
                name = "read_text_file" if "read_text_file" in tools else "read_file"

                async def straight() -> None:
                    result = await direct.call_tool(name, {"path": str(root / "notes" / "hello.md")})
                    assert not result.is_error

                direct_ms = await timed(args.calls, straight)
        finally:
            server.stop()
    print(
        f"{args.calls} sequential reads over stdio (load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores)"
    )
    print(
        f"Kiwi execute -> run policy -> filesystem.read activity: p50 {pct(kiwi_ms, 0.5):6.1f} ms  "
        f"p99 {pct(kiwi_ms, 0.99):6.1f} ms"
    )
    print(
        f"server-filesystem {name} directly:               p50 {pct(direct_ms, 0.5):6.1f} ms  "
        f"p99 {pct(direct_ms, 0.99):6.1f} ms"
    )
    print(f"ratio (p50): {pct(kiwi_ms, 0.5) / pct(direct_ms, 0.5):.1f}x")


if __name__ == "__main__":
    asyncio.run(main())
