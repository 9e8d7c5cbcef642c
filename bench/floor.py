"""The Temporal floor under Kiwi's figures: the same round trips on a bare workflow, with nothing of Kiwi's.

Kiwi's proxied call is an update whose handler runs a local activity; ``update_floor`` times a
bare update and one running a no-op local activity on the same server. Recovery after kill -9 is
an update to each waiting run on a new worker; ``python -m bench.floor --address A --task-queue Q``
is a worker process for :class:`FloorWorkflow` tuned like ``kiwi worker``, so a benchmark can do the
same to bare workflows and say how much of its time is Kiwi's and how much the SDK's and server's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from workers.main import MAX_CACHED_WORKFLOWS, STICKY_SCHEDULE_TO_START


@activity.defn
async def floor_noop(value: str) -> str:
    return value


class JsonRpc:
    """The protocol by hand: one request line out, lines read until its answer."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.next_id = 0
        self.lock = asyncio.Lock()  # one request at a time: answers are read in order

    @classmethod
    async def start(cls, index: Path) -> JsonRpc:
        """server-everything (``index``: its index.js) over stdio, initialized."""
        process = await asyncio.create_subprocess_exec(
            "node",
            str(index),
            "stdio",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            limit=2**24,
        )
        rpc = cls(process)
        await rpc.request(
            "initialize",
            {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "bench", "version": "1"},
            },
        )
        await rpc.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return rpc

    async def send(self, message: dict) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write((json.dumps(message) + "\n").encode())
        await self.process.stdin.drain()

    async def request(self, method: str, params: dict) -> dict:
        assert self.process.stdout is not None
        async with self.lock:
            self.next_id += 1
            await self.send({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params})
            while True:
                answer = json.loads(await self.process.stdout.readline())
                if answer.get("id") == self.next_id:
                    return answer

    async def stop(self) -> None:
        self.process.kill()
        await self.process.wait()


class RawUpstreamFloor:
    """The same upstream call made without the MCP SDK's client: one JSON-RPC line out, its answer line in
    (design option 1 for #20's proxied p50: Kiwi's own client for ``tools/call`` on stdio connections)."""

    def __init__(self, rpc: JsonRpc) -> None:
        self.rpc = rpc

    @activity.defn(name="floor_upstream_raw")
    async def call(self, value: str) -> dict:
        answer = await self.rpc.request("tools/call", {"name": "echo", "arguments": {"message": value}})
        return answer["result"]


class UpstreamFloor:
    """The same upstream call Kiwi proxies, from a bare workflow: one MCP client session, no Kiwi."""

    def __init__(self, session) -> None:
        self.session = session

    @activity.defn(name="floor_upstream")
    async def call(self, value: str) -> dict:
        result = await self.session.call_tool("echo", {"message": value})
        return result.model_dump(mode="json", by_alias=True, exclude_none=True)


@workflow.defn
class FloorWorkflow:
    def __init__(self) -> None:
        self.done = False
        self.recorded = 0

    @workflow.run
    async def run(self) -> None:
        await workflow.wait_condition(lambda: self.done)

    @workflow.update
    async def plain(self, value: str) -> str:
        return value

    @workflow.update
    async def local(self, value: str) -> str:
        return await workflow.execute_local_activity(
            floor_noop, value, start_to_close_timeout=timedelta(seconds=10)
        )

    @workflow.update
    async def upstream(self, value: str) -> dict:
        """The update Kiwi's proxied call is, minus Kiwi: a local activity making the MCP call."""
        return await workflow.execute_local_activity(
            "floor_upstream", value, start_to_close_timeout=timedelta(seconds=10), result_type=dict
        )

    @workflow.update
    async def raw(self, value: str) -> dict:
        """``upstream`` with the MCP call made by hand (:class:`RawUpstreamFloor`)."""
        return await workflow.execute_local_activity(
            "floor_upstream_raw", value, start_to_close_timeout=timedelta(seconds=10), result_type=dict
        )

    @workflow.update
    async def finish(self, value: str) -> str:
        """Like ``complete_step`` on a one-step run: answers, and the workflow completes."""
        self.done = True
        return value

    @workflow.signal
    def record(self, answer: dict) -> None:
        """#20's design option "the front end makes the call": the caller asked ``plain`` for the decision,
        made the call itself and hands the run its answer here, without waiting for it to land."""
        self.recorded += 1

    @workflow.query
    def ready(self) -> bool:
        return True

    @workflow.signal
    def stop(self) -> None:
        self.done = True


@workflow.defn
class AuditedFloorWorkflow(FloorWorkflow):
    """FloorWorkflow plus what Kiwi's audit trail adds to a waiting run, and nothing else of Kiwi's: a
    local activity in its first workflow task (a run's first records are written as it starts waiting)
    and one in its last (its last records, written before it completes). Its handlers are FloorWorkflow's."""

    @workflow.run
    async def run(self) -> None:
        await workflow.execute_local_activity(
            floor_noop, "started", start_to_close_timeout=timedelta(seconds=10)
        )
        await workflow.wait_condition(lambda: self.done)
        await workflow.execute_local_activity(
            floor_noop, "finished", start_to_close_timeout=timedelta(seconds=10)
        )


@contextlib.asynccontextmanager
async def floor_callers(
    client: Client, *, everything: Path | None = None, address: str | None = None
) -> AsyncIterator[dict[str, Callable[[int], Awaitable[Any]]]]:
    """One bare workflow per kind, and a caller for each: "plain" (a bare update), "local" (an update
    running a no-op local activity) and, with ``everything`` (server-everything's index.js), "upstream"
    (an update whose local activity makes the same ``echo`` call Kiwi proxies, over a session of its own),
    "raw" (the same call written and read by hand, no MCP SDK client, over a server process of its own) and
    "decided" (#20's design option: a bare update for the decision, the call made by hand from the caller's
    process, its answer handed to the workflow by a signal nothing waits for) and "recorded" (the same with
    the signal awaited: the answer is in the run's history before the caller has it).
    ``caller(i)`` makes one update. With ``address`` the worker is a process of its own (as `kiwi worker`
    is with --worker-process: a process woken for each call costs more than one already running), else it
    runs in this process. A bench times the callers interleaved with Kiwi's calls, so drift in the host's
    load hits both sides alike. (Temporal allows 2,000 updates per workflow: keep below.)"""
    queue = f"floor-{uuid.uuid4().hex[:8]}"
    kinds = ["plain", "local"] + (
        ["upstream", "raw", "decided", "recorded"] if everything is not None else []
    )
    async with contextlib.AsyncExitStack() as stack:
        if address is not None:
            proc = await start_floor_worker(address, queue, everything)
            stack.push_async_callback(_stop, proc)
        else:
            activities: list[Any] = [floor_noop]
            if everything is not None:
                activities += await _upstream_activities(stack, everything)
            await stack.enter_async_context(
                Worker(
                    client,
                    task_queue=queue,
                    workflows=[FloorWorkflow],
                    activities=activities,
                    workflow_runner=UnsandboxedWorkflowRunner(),
                )
            )
        handles = {
            kind: await client.start_workflow(FloorWorkflow.run, id=f"{queue}-{kind}", task_queue=queue)
            for kind in kinds
        }

        def caller(kind: str) -> Callable[[int], Awaitable[Any]]:
            async def call(i: int) -> Any:
                return await handles[kind].execute_update(kind, f"m{i}")

            return call

        callers = {kind: caller(kind) for kind in kinds}
        records: set[asyncio.Task[None]] = set()
        if everything is not None:
            # The caller's own server process: the call made where the agent's request arrives.
            rpc = await JsonRpc.start(everything)
            stack.push_async_callback(rpc.stop)

            async def decided(i: int) -> Any:
                await handles["decided"].execute_update("plain", f"m{i}")
                answer = await rpc.request("tools/call", {"name": "echo", "arguments": {"message": f"m{i}"}})
                record = asyncio.ensure_future(
                    handles["decided"].signal(FloorWorkflow.record, answer["result"])
                )
                records.add(record)
                record.add_done_callback(records.discard)
                return answer["result"]

            async def recorded(i: int) -> Any:
                # The same, with the answer in the run's history before the caller has it: the signal awaited.
                await handles["recorded"].execute_update("plain", f"m{i}")
                answer = await rpc.request("tools/call", {"name": "echo", "arguments": {"message": f"m{i}"}})
                await handles["recorded"].signal(FloorWorkflow.record, answer["result"])
                return answer["result"]

            callers["decided"] = decided
            callers["recorded"] = recorded
        try:
            yield callers
        finally:
            await asyncio.gather(*records)
            for handle in handles.values():
                await handle.signal(FloorWorkflow.stop)


async def _upstream_activities(stack: contextlib.AsyncExitStack, everything: Path) -> list[Any]:
    """The "upstream" and "raw" activities, each over a server-everything process of its own."""
    session = await stack.enter_async_context(_everything(everything))
    rpc = await JsonRpc.start(everything)
    stack.push_async_callback(rpc.stop)
    return [UpstreamFloor(session).call, RawUpstreamFloor(rpc).call]


def _everything(index: Path):
    from mcp.client import Client as McpClient
    from mcp.client.stdio import StdioServerParameters

    return McpClient(StdioServerParameters(command="node", args=[str(index), "stdio"]))


async def _stop(proc: asyncio.subprocess.Process) -> None:
    from bench.common import stop_worker

    await stop_worker(proc)


async def floor_rates(
    client: Client, calls: int, callers: int, *, everything: Path | None = None, address: str | None = None
) -> dict[str, float]:
    """Updates/s of "local" (and, with ``everything``, "upstream") updates sent by ``callers`` concurrent
    callers sharing a fresh workflow, at most 1,000 calls each (see :func:`floor_callers`)."""
    rates: dict[str, float] = {}
    async with floor_callers(client, everything=everything, address=address) as call:
        for kind in ["local"] + (["upstream"] if everything is not None else []):
            share = min(calls, 1000) // callers

            async def one_caller(kind: str = kind, share: int = share) -> None:
                for i in range(share):
                    await call[kind](i)

            t0 = time.perf_counter()
            await asyncio.gather(*(one_caller() for _ in range(callers)))
            rates[kind] = share * callers / (time.perf_counter() - t0)
    return rates


async def start_floor_worker(
    address: str, task_queue: str, everything: Path | None = None
) -> asyncio.subprocess.Process:
    """A worker process for :class:`FloorWorkflow` (stop it with ``bench.common.stop_worker``); with
    ``everything``, it also serves the "upstream" update's activity over its own MCP session."""
    # (A PYTHONPATH already set is kept after the checkout's: bench_phases.py adds its timing hooks so.)
    path = [str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p)}
    extra = ["--everything", str(everything)] if everything is not None else []
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench.floor",
        "--address",
        address,
        "--task-queue",
        task_queue,
        *extra,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
        start_new_session=True,
        env=env,
    )
    line = await proc.stdout.readline()
    if b"ready" not in line:
        raise RuntimeError(f"the floor worker did not start (exit code {await proc.wait()})")
    return proc


async def _serve(address: str, task_queue: str, everything: Path | None) -> None:
    from kiwi.converter import data_converter

    # Kiwi's data converter, as the bench's callers use: the floor differs from Kiwi by Kiwi's work only.
    client = await Client.connect(address, data_converter=data_converter)
    async with contextlib.AsyncExitStack() as stack:
        activities: list[Any] = [floor_noop]
        if everything is not None:
            activities += await _upstream_activities(stack, everything)
        # The same tuning as kiwi worker.
        async with Worker(
            client,
            task_queue=task_queue,
            workflows=[FloorWorkflow, AuditedFloorWorkflow],
            activities=activities,
            workflow_runner=UnsandboxedWorkflowRunner(),
            max_cached_workflows=MAX_CACHED_WORKFLOWS,
            sticky_queue_schedule_to_start_timeout=STICKY_SCHEDULE_TO_START,
        ):
            print("floor worker ready", flush=True)
            await asyncio.Event().wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="a worker process for bench.floor.FloorWorkflow")
    parser.add_argument("--address", required=True)
    parser.add_argument("--task-queue", required=True)
    parser.add_argument("--everything", type=Path, help="server-everything's index.js: serve 'upstream' too")
    options = parser.parse_args()
    asyncio.run(_serve(options.address, options.task_queue, options.everything))
