"""Front ends scale out: two `kiwi mcp --http --stateless` processes serve the same runs; one MCP client
whose requests a load balancer spreads over both (and moves off one that dies) completes its run, and a
call whose front end dies mid-call is sent again through the other without running twice."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections import Counter

import httpx
import httpx2
import pytest
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client

from tests.helpers import agent_directive, distinct_ports, execute, wait_for, write

pytestmark = pytest.mark.temporal

PUBLIC = "kiwi.lb.test"


class RoundRobin(httpx2.AsyncBaseTransport):
    """A load balancer in the client: each request goes to the next front end, keeping the public Host
    header; a front end that refuses connections is taken out, as a balancer's health check would."""

    def __init__(self, ports: list[int]) -> None:
        self.ports = list(ports)
        self.sent: Counter[int] = Counter()
        self.turn = 0
        self.inner = httpx2.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        while self.ports:
            port = self.ports[self.turn % len(self.ports)]
            self.turn += 1
            request.url = request.url.copy_with(host="127.0.0.1", port=port)
            try:
                response = await self.inner.handle_async_request(request)
            except httpx2.ConnectError:
                self.ports.remove(port)
                continue
            self.sent[port] += 1
            return response
        raise httpx2.ConnectError("no front end left", request=request)

    async def aclose(self) -> None:
        await self.inner.aclose()


TOKEN = "scale-out-token"


async def start_front_end(
    address: str, queue: str, project, port: int, *, proxied: bool = True
) -> asyncio.subprocess.Process:
    # Names for a proxy need a token (a loopback bind behind a proxy protects nothing); clients that
    # reach the front ends directly on loopback need neither.
    env = (
        {**os.environ, "KIWI_MCP_ALLOWED_HOSTS": PUBLIC, "KIWI_MCP_TOKEN": TOKEN}
        if proxied
        else dict(os.environ)
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "kiwi",
        "mcp",
        "--http",
        "--stateless",
        "--port",
        str(port),
        "--address",
        address,
        "--task-queue",
        queue,
        cwd=str(project),
        env=env,
        start_new_session=True,
        stderr=asyncio.subprocess.DEVNULL,
    )

    async def ready() -> bool:
        try:
            async with httpx.AsyncClient(timeout=5) as http:
                return (await http.get(f"http://127.0.0.1:{port}/readyz")).status_code == 200
        except httpx.TransportError:
            return False

    await wait_for(ready, timeout=60, what=f"kiwi mcp --http on {port}")
    return proc


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_one_client_through_two_stateless_front_ends_completes_its_run(
    temporal_env, runs, project, mode
):
    address = temporal_env.client.service_client.config.target_host
    ports = distinct_ports(2)  # (two free_port() calls may hand out the same port: CI s34)
    fronts = [await start_front_end(address, runs.task_queue, project, port) for port in ports]
    balancer = RoundRobin(ports)
    try:
        http = httpx2.AsyncClient(
            transport=balancer,
            timeout=httpx2.Timeout(30, read=120),
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
        async with (
            http,
            Client(streamable_http_client(f"http://{PUBLIC}/mcp", http_client=http), mode=mode) as client,
        ):
            started = await execute(
                client,
                {
                    "item_type": "directive",
                    "action": "run",
                    "item_id": "hello_kiwi",
                    "parameters": {"name": "Lb"},
                },
            )
            assert started["state"] == "awaiting_agent", started
            run_id = started["run_id"]
            read = await execute(
                client,
                {
                    "item_type": "tool",
                    "action": "call",
                    "run_id": run_id,
                    "item_id": "filesystem.read",
                    "parameters": {"path": "notes/hello.md"},
                },
            )
            assert read.get("status") == "ok", read
            assert "Hello, Lb" in read["result"]["content"]
            # Both front ends have answered this one client by now.
            assert all(balancer.sent[port] > 0 for port in ports), balancer.sent

            # One front end dies (kill -9); the balancer sends everything to the other.
            os.killpg(fronts[0].pid, signal.SIGKILL)
            await fronts[0].wait()
            status = await execute(client, {"item_type": "run", "action": "status", "run_id": run_id})
            assert status["status"] == "awaiting_agent", status
            done = await execute(
                client,
                {
                    "item_type": "run",
                    "action": "complete_step",
                    "run_id": run_id,
                    "parameters": {"step": "confirm", "outputs": {"confirmed": True}},
                },
            )
            assert done["state"] == "completed", done
        assert balancer.ports == [ports[1]]
        result = await asyncio.wait_for(runs.handle(run_id).result(), 60)
        assert result.outputs["confirm"] == {"confirmed": True}
    finally:
        for proc in fronts:
            if proc.returncode is None:
                os.killpg(proc.pid, signal.SIGKILL)
                await proc.wait()


# A tool that stays in flight until the test lets it go, logging when it starts and when it ends.
HOLD = """import pathlib
import time


def main(label: str) -> dict:
    log = pathlib.Path("calls.log")
    with log.open("a") as handle:
        handle.write(label + " started\\n")
    deadline = time.monotonic() + 120
    while not pathlib.Path("go").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    with log.open("a") as handle:
        handle.write(label + " finished\\n")
    return {"done": label}
"""


async def test_a_call_whose_front_end_dies_mid_call_is_sent_again_through_another_and_runs_once(
    temporal_env, runs, project
):
    write(
        project / ".ai" / "tools" / "hold" / "tool.yaml",
        "tool_id: hold\ntool_type: python\nexecutor:\n  entrypoint: main.py\nparameters:\n"
        "  - name: label\n    type: string\n    required: true\nmutates_state: true\n",
    )
    write(project / ".ai" / "tools" / "hold" / "main.py", HOLD)
    agent_directive(project, ["hold"], name="holder")
    address = temporal_env.client.service_client.config.target_host
    ports = distinct_ports(2)  # (two free_port() calls may hand out the same port: CI s34)
    fronts = [await start_front_end(address, runs.task_queue, project, port, proxied=False) for port in ports]
    urls = [f"http://127.0.0.1:{port}/mcp" for port in ports]
    log = project / "calls.log"
    call = {
        "item_type": "tool",
        "action": "call",
        "item_id": "hold",
        "parameters": {"label": "once"},
        "idempotency_key": "hold-once",
        "wait_seconds": 120,
    }
    try:

        async def first_agent() -> None:
            async with Client(urls[0]) as first:
                started = await execute(
                    first, {"item_type": "directive", "action": "run", "item_id": "holder", "parameters": {}}
                )
                assert started["state"] == "awaiting_agent", started
                call["run_id"] = started["run_id"]
                await execute(first, call)

        agent = asyncio.create_task(first_agent())

        async def tool_started() -> bool:
            return log.exists() and log.read_text().splitlines() == ["once started"]

        await wait_for(tool_started, timeout=60, what="the tool to start")
        os.killpg(fronts[0].pid, signal.SIGKILL)
        await fronts[0].wait()
        # The agent's client loses its call with the front end (whatever error its transport makes of it).
        with pytest.raises(Exception):  # noqa: B017, PT011
            await asyncio.wait_for(agent, 60)

        (project / "go").write_text("")
        async with Client(urls[1]) as second:
            answer = await execute(second, call)
        assert answer["status"] == "ok", answer
        assert answer["result"] == {"done": "once"}
        # The second send joined the first call: the tool ran once.
        assert log.read_text().splitlines() == ["once started", "once finished"]
    finally:
        for proc in fronts:
            if proc.returncode is None:
                os.killpg(proc.pid, signal.SIGKILL)
                await proc.wait()
