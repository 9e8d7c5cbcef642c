"""`kiwi mcp` over stdio without Temporal, and with a client that sends garbage: it answers, never just closes."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid

from mcp.client import Client
from mcp.client.stdio import StdioServerParameters
from temporalio.testing import WorkflowEnvironment

from kiwi.contracts import SEARCH_ATTRIBUTES
from kiwi.converter import data_converter
from kiwi.devserver import free_port, temporal_binary
from tests.helpers import data
from workers.main import build_worker


async def _line(stream: asyncio.StreamReader) -> dict:
    return json.loads(await asyncio.wait_for(stream.readline(), timeout=30))


async def test_garbage_on_stdin_gets_json_rpc_errors_and_the_session_goes_on(project):
    # Nothing listens on this port: the front end must still start and answer.
    env = {**os.environ, "KIWI_TEMPORAL_ADDRESS": f"127.0.0.1:{free_port()}"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "kiwi",
        "mcp",
        cwd=str(project),
        env=env,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        proc.stdin.write(b"this is not json {\n")
        parse = await _line(proc.stdout)
        assert parse["jsonrpc"] == "2.0" and parse["id"] is None and parse["error"]["code"] == -32700
        proc.stdin.write(b'{"hello": "world"}\n')
        invalid = await _line(proc.stdout)
        assert invalid["id"] is None and invalid["error"]["code"] == -32600
        proc.stdin.write(
            json.dumps(
                {
                    "jsonrpc": "2.0",
                    "id": 1,
                    "method": "initialize",
                    "params": {
                        "protocolVersion": "2025-06-18",
                        "capabilities": {},
                        "clientInfo": {"name": "t", "version": "1"},
                    },
                }
            ).encode()
            + b"\n"
        )
        initialized = await _line(proc.stdout)
        assert initialized["id"] == 1 and initialized["result"]["serverInfo"]["name"] == "kiwi"
    finally:
        proc.stdin.close()
        await asyncio.wait_for(proc.wait(), timeout=30)


async def test_without_temporal_items_are_served_and_runs_start_once_temporal_is_up(project):
    port = free_port()
    address = f"127.0.0.1:{port}"
    queue = f"kiwi-offline-{uuid.uuid4().hex[:8]}"
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "kiwi", "mcp", "--task-queue", queue],
        cwd=str(project),
        env={**os.environ, "KIWI_TEMPORAL_ADDRESS": address},
    )
    async with Client(params) as client:

        async def call(tool, **arguments):
            return data(await client.call_tool(tool, arguments))

        found = await call("search", item_type="directive", query="greeting")
        assert found["results"][0]["item_id"] == "hello_kiwi"
        loaded = await call("load", item_type="directive", item_id="hello_kiwi")
        assert [p["mode"] for p in loaded["steps_plan"]] == ["auto", "auto", "agent"]
        assert "word_count" in (await call("help", topic="tools"))["help"]
        refused = await call(
            "execute", item_type="directive", action="run", item_id="hello_kiwi", parameters={"name": "Ada"}
        )
        assert refused["error"] == "TemporalUnavailable"
        assert address in refused["message"] and "kiwi dev" in refused["hint"]
        status = await call("execute", item_type="run", action="status", run_id="run-hello_kiwi-x")
        assert status["error"] == "TemporalUnavailable"

        env = await WorkflowEnvironment.start_local(
            dev_server_existing_path=temporal_binary(),
            data_converter=data_converter,
            ip="127.0.0.1",
            port=port,
            search_attributes=list(SEARCH_ATTRIBUTES),
        )
        try:
            async with build_worker(env.client, queue, sandboxed=True):
                started = await call(
                    "execute",
                    item_type="directive",
                    action="run",
                    item_id="hello_kiwi",
                    parameters={"name": "Ada"},
                )
                assert started["state"] == "awaiting_agent" and started["current_step"]["name"] == "confirm"
                shown = await call("execute", item_type="run", action="status", run_id=started["run_id"])
                assert shown["status"] == "awaiting_agent"
        finally:
            await env.shutdown()
