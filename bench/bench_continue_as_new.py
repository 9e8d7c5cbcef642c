"""Calls across continue-as-new under load: Kiwi's run versus a bare workflow doing the same hand-over.

A long run continues-as-new every N updates (``runs.continue_as_new_after_updates``). Callers must not
notice, and #20 asks that cost stays flat across it. This bench sends ``--calls`` calls from ``--callers``
concurrent callers to one run that continues-as-new every ``--every`` updates, and prints calls/s, the
longest gap with no call completing (the hand-over stall) and the slowest call. The same load goes to a
bare workflow that drains the same way (validator refuses while draining, waits for every handler,
ends that workflow task with a 1 ms timer so the completions are committed first, continues-as-new; its callers wait for the draining execution to close, as Kiwi's client does), so what
the SDK and server cost across continue-as-new is measured beside what Kiwi costs, in one run.

    .venv/bin/python bench/bench_continue_as_new.py [--calls 600] [--callers 10] [--every 200]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from temporalio import activity, workflow  # noqa: E402
from temporalio.client import Client, WorkflowHistoryEventFilterType, WorkflowUpdateFailedError  # noqa: E402
from temporalio.exceptions import ApplicationError  # noqa: E402
from temporalio.worker import UnsandboxedWorkflowRunner, Worker  # noqa: E402

from bench import common  # noqa: E402
from kiwi.converter import data_converter
from kiwi.items.store import ItemStore  # noqa: E402
from kiwi.runs import RunClient  # noqa: E402
from kiwi.seal import seal_interceptors  # noqa: E402
from tests.helpers import write  # noqa: E402
from workers.main import build_worker  # noqa: E402


@activity.defn
async def bare_write(value: str) -> str:
    return value


@dataclass
class BareInput:
    every: int
    updates_before: int = 0


@workflow.defn
class BareContinuing:
    """The hand-over Kiwi does, with nothing else: count updates, drain, continue-as-new."""

    def __init__(self) -> None:
        self.updates = 0
        self.draining = False
        self.done = False

    @workflow.run
    async def run(self, arg: BareInput) -> None:
        await workflow.wait_condition(lambda: self.done or self.updates >= arg.every)
        if self.done:
            return
        self.draining = True
        await workflow.wait_condition(workflow.all_handlers_finished)
        # As Kiwi does: the completions in a workflow task of their own (temporalio/temporal#6375).
        await workflow.sleep(timedelta(milliseconds=1))
        workflow.continue_as_new(BareInput(every=arg.every))

    @workflow.update
    async def call(self, value: str) -> str:
        self.updates += 1
        return await workflow.execute_local_activity(
            bare_write, value, start_to_close_timeout=timedelta(seconds=10)
        )

    @call.validator
    def _validate(self, value: str) -> None:
        if self.draining:
            raise ApplicationError("continuing", type="RunContinuing")

    @workflow.signal
    def stop(self) -> None:
        self.done = True


async def bare_call(client: Client, workflow_id: str, value: str) -> None:
    handle = client.get_workflow_handle(workflow_id)
    while True:
        try:
            await handle.execute_update(BareContinuing.call, value)
            return
        except WorkflowUpdateFailedError:
            described = await handle.describe()
            draining = client.get_workflow_handle(workflow_id, run_id=described.run_id)
            async for _ in draining.fetch_history_events(
                wait_new_event=True, event_filter_type=WorkflowHistoryEventFilterType.CLOSE_EVENT
            ):
                break


async def load(calls: int, callers: int, fn) -> tuple[float, float, float]:
    """Calls/s, the longest stretch with no call finishing (ms) and the slowest call (ms)."""
    finished: list[float] = []
    slowest = 0.0

    async def caller(offset: int) -> None:
        nonlocal slowest
        for i in range(offset, calls, callers):
            t0 = time.perf_counter()
            await fn(i)
            finished.append(time.perf_counter())
            slowest = max(slowest, finished[-1] - t0)

    t0 = time.perf_counter()
    await asyncio.gather(*(caller(c) for c in range(callers)))
    stamps = [t0, *sorted(finished)]
    gap = max(b - a for a, b in zip(stamps, stamps[1:], strict=False))
    return calls / (stamps[-1] - t0), gap * 1000, slowest * 1000


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=600)
    parser.add_argument("--callers", type=int, default=10)
    parser.add_argument("--every", type=int, default=200, help="continue-as-new after this many updates")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        common.scratch_project(root)
        write(
            root / ".ai" / "config" / "agent_harness.yaml",
            f"runs:\n  continue_as_new_after_updates: {args.every}\n  audit_batch_size: 200\n"
            "rate_limits:\n  filesystem.write: 1000000\n"
            "loop_detection:\n  repeat_threshold: 100000\n  max_warnings: 100000\n",
        )
        common.notes_directive(root)
        server = common.tuned_dev_server(root)
        await server.start()
        try:
            temporal = await Client.connect(
                server.address, data_converter=data_converter, interceptors=seal_interceptors()
            )
            queue = f"bare-{uuid.uuid4().hex[:8]}"
            async with Worker(
                temporal,
                task_queue=queue,
                workflows=[BareContinuing],
                activities=[bare_write],
                workflow_runner=UnsandboxedWorkflowRunner(),
            ):
                bare_id = f"{queue}-run"
                await temporal.start_workflow(
                    BareContinuing.run, BareInput(every=args.every), id=bare_id, task_queue=queue
                )
                bare = await load(args.calls, args.callers, lambda i: bare_call(temporal, bare_id, f"n{i}"))
                await temporal.get_workflow_handle(bare_id).signal(BareContinuing.stop)
            async with build_worker(temporal):
                runs = RunClient(temporal, ItemStore(root))
                run_id = await runs.start("notes", {})

                async def kiwi_call(i: int) -> None:
                    result = await runs.call_tool(
                        run_id, "filesystem.write", {"path": f"notes/n{i % 50}.txt", "content": str(i)}
                    )
                    assert result.status == "ok", result

                kiwi_figures = await load(args.calls, args.callers, kiwi_call)
                continued = (await runs.status(run_id)).continued
                await runs.cancel(run_id)
        finally:
            server.stop()
    print(
        f"{args.calls} calls from {args.callers} callers, continue-as-new every {args.every} updates "
        f"(Kiwi's run continued {continued} times)"
    )
    for name, (rate, gap, slowest) in (("bare workflow", bare), ("Kiwi filesystem.write", kiwi_figures)):
        print(f"{name:22s} {rate:6.0f} calls/s  longest stall {gap:7.1f} ms  slowest call {slowest:7.1f} ms")
    print(
        f"ratio Kiwi / bare: throughput {kiwi_figures[0] / bare[0]:.2f}x, stall {kiwi_figures[1] / bare[1]:.2f}x"
    )


if __name__ == "__main__":
    asyncio.run(main())
