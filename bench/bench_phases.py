"""Where a proxied call's time goes, phase by phase, Kiwi's worker beside the bare floor's (#20).

    .venv/bin/python bench/bench_phases.py [--calls 300] [--kind echo|read|refused] [--kiwi-threaded] [--floor-inline]

Both workers run as processes of their own with timing hooks (a ``sitecustomize`` this bench writes to a
temporary folder) around the SDK's bridge to its Rust core: when an activation reaches Python, when its
completion leaves, when a local activity's task reaches Python and when its answer leaves. The calls of
both kinds alternate; the runs' histories give the server's side of each workflow task (when it handed the
task out, when the completion arrived). Printed per kind (p50 over the calls): the server to Python, each
Python phase (the update's activation, the core's hand-off to the local activity, the activity, the
hand-off back, the answer's activation) and Python back to the server.

``--kind``: ``echo`` (a proxied server-everything echo against the bare workflow's hand-written call,
``raw``), ``read`` (filesystem.read against a no-op local activity) or ``refused`` (a call Kiwi refuses
before any activity against a bare update). Measured on 2026-11-25 (echo, 300 calls): the server's parts
were the same for both (1.6 ms to Python, 0.9-1.0 ms back); Kiwi's Python took 4.4 ms against 3.4 ms,
+0.36 ms in the update's activation, +0.34 ms in the local activity, +0.27 ms in the answer's activation.

Kiwi's worker runs workflow tasks on its event loop, the floor's on the SDK's threads (its default), unless
``--kiwi-threaded`` / ``--floor-inline``. Measured on 2026-11-26 (echo, 300 calls), Kiwi's share: +0.52 ms as
shipped, +0.98 ms both on threads, +1.03 ms both on their loops (the thread hand-offs: ~0.45 ms a call).
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import os
import random
import statistics
import sys
import tempfile
import textwrap
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from temporalio.api.enums.v1 import EventType  # noqa: E402
from temporalio.client import Client  # noqa: E402

from bench import common  # noqa: E402
from bench.bench_mcp_proxy import EVERYTHING, _project  # noqa: E402
from bench.floor import floor_callers  # noqa: E402
from kiwi.converter import data_converter
from kiwi.items.store import ItemStore  # noqa: E402
from kiwi.runs import RunClient  # noqa: E402
from kiwi.seal import seal_interceptors  # noqa: E402

HOOKS = """
import os
if os.environ.get("KIWI_PHASES_OUT"):
    import threading, time
    import temporalio.bridge.worker as bridge

    _out = open(f"{os.environ['KIWI_PHASES_OUT']}.{os.getpid()}", "w", buffering=1 << 16)
    _lock = threading.Lock()

    def _note(kind, jobs=""):
        with _lock:
            _out.write(f"{time.time_ns()} {kind} {jobs}\\n")
            _out.flush()

    _W = bridge.Worker
    _poll_act, _done_act = _W.poll_workflow_activation, _W.complete_workflow_activation
    _poll_task, _done_task = _W.poll_activity_task, _W.complete_activity_task

    async def poll_workflow_activation(self, *a, **k):
        act = await _poll_act(self, *a, **k)
        _note("act_in", ",".join(j.WhichOneof("variant") for j in act.jobs))
        return act

    async def complete_workflow_activation(self, completion, *a, **k):
        _note("act_out")
        return await _done_act(self, completion, *a, **k)

    async def poll_activity_task(self, *a, **k):
        task = await _poll_task(self, *a, **k)
        _note("la_in")
        return task

    async def complete_activity_task(self, completion, *a, **k):
        _note("la_out")
        return await _done_task(self, completion, *a, **k)

    _W.poll_workflow_activation, _W.complete_workflow_activation = poll_workflow_activation, complete_workflow_activation
    _W.poll_activity_task, _W.complete_activity_task = poll_activity_task, complete_activity_task
"""

# Kiwi's call of each kind, and the floor's update it is set against.
KINDS = {
    "echo": ("everything.echo", lambda i: {"message": f"m{i}"}, "raw"),
    "read": ("filesystem.read", lambda i: {"path": "notes/hello.md"}, "local"),
    "refused": ("everything.nothing", lambda i: {"message": f"m{i}"}, "plain"),
}
WITH_ACTIVITY = ["server -> Python", "update's activation", "core -> activity", "activity", "core -> activation",
                 "answer's activation", "Python -> server"]  # fmt: skip
WITHOUT = ["server -> Python", "update's activation", "Python -> server"]


def _notes(folder: Path, pid: int) -> list[tuple[int, str, str]]:
    lines = (folder / f"t.{pid}").read_text().splitlines()
    return [
        (int(t), kind, jobs)
        for t, kind, *rest in (line.split(" ", 2) for line in lines)
        for jobs in [rest[0] if rest else ""]
    ]


def _phases(
    notes: list[tuple[int, str, str]], history: list[tuple[int, str]], activity: bool
) -> dict[str, list[float]]:
    """Per workflow task that took an update: the server's and the worker's phases, in ms."""
    tasks, started = [], None
    for at, kind in history:
        if kind.endswith("WORKFLOW_TASK_STARTED"):
            started = at
        elif kind.endswith("WORKFLOW_TASK_COMPLETED") and started is not None:
            tasks.append((started, at))
            started = None
    times = [n[0] for n in notes]
    want = 6 if activity else 2
    out: dict[str, list[float]] = defaultdict(list)
    names = WITH_ACTIVITY if activity else WITHOUT
    for begin, end in tasks:
        inside = notes[bisect.bisect_left(times, begin) : bisect.bisect_right(times, end)]
        if len(inside) != want or inside[0][2] != "do_update":
            continue  # not one update's task alone (the run's first tasks, a timer, a flush)
        marks = [begin, *(n[0] for n in inside), end]
        for name, a, b in zip(names, marks[:-1], marks[1:], strict=True):
            out[name].append((b - a) / 1e6)
        out["total"].append((end - begin) / 1e6)
    return out


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--kind", choices=sorted(KINDS), default="echo")
    parser.add_argument(
        "--kiwi-threaded",
        action="store_true",
        help="Kiwi's worker with --threaded (each workflow task on a thread, as the SDK does by default)",
    )
    parser.add_argument(
        "--floor-inline",
        action="store_true",
        help="the floor's worker with its workflow tasks on its event loop, as Kiwi's (TEMPORAL_DEBUG=1)",
    )
    args = parser.parse_args()
    if not EVERYTHING.exists():
        raise SystemExit("run scripts/test once first: it installs tests/npm (server-everything)")
    tool, arguments, floor_kind = KINDS[args.kind]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "site").mkdir()
        (folder / "site" / "sitecustomize.py").write_text(textwrap.dedent(HOOKS))
        root = folder / "project"
        root.mkdir()
        _project(root)
        os.environ["KIWI_PHASES_OUT"] = str(folder / "t")
        os.environ["PYTHONPATH"] = str(folder / "site")  # (the floor's worker keeps it after the checkout)
        repo = str(Path(__file__).resolve().parents[1])
        server = common.tuned_dev_server(root)
        await server.start()
        try:
            worker = await common.start_worker(
                server.address,
                {"PYTHONPATH": os.pathsep.join([str(folder / "site"), repo])},
                "kiwi",
                *(["--threaded"] if args.kiwi_threaded else []),
            )
        except BaseException:
            server.stop()  # (a worker that did not start leaves no dev server behind)
            raise
        if args.floor_inline:
            os.environ["TEMPORAL_DEBUG"] = "1"  # (read by the SDK's worker in the floor's process)
        try:
            client = await Client.connect(
                server.address, data_converter=data_converter, interceptors=seal_interceptors()
            )
            runs = RunClient(client, ItemStore(root))
            run_id = await runs.start("echo_bench", {})

            async def kiwi(i: int) -> None:
                await runs.call_tool(run_id, tool, arguments(i))

            async with floor_callers(client, everything=EVERYTHING, address=server.address) as floor:
                order = [("kiwi", kiwi), ("floor", floor[floor_kind])]
                for i in range(-10, args.calls):
                    random.shuffle(order)
                    for _, call in order:
                        await call(i)
                floor_ids = [w.id async for w in client.list_workflows("WorkflowType='FloorWorkflow'")]
                floor_handle = client.get_workflow_handle(
                    next(w for w in floor_ids if w.endswith("-" + floor_kind))
                )
                histories = {}
                for name, handle in (("kiwi", runs.handle(run_id)), ("floor", floor_handle)):
                    histories[name] = [
                        (e.event_time.ToNanoseconds(), EventType.Name(e.event_type))
                        async for e in handle.fetch_history_events()
                    ]
            await runs.cancel(run_id)
            time.sleep(0.5)  # (the hooks' last lines reach their files)
            pids = sorted(int(p.name.split(".")[1]) for p in folder.glob("t.*"))
            by_pid = {pid: _notes(folder, pid) for pid in pids}
        finally:
            await common.stop_worker(worker)
            server.stop()
    activity = args.kind != "refused"
    kiwi_notes = by_pid[worker.pid]
    floor_notes = next(notes for pid, notes in by_pid.items() if pid != worker.pid)
    phases = {
        "kiwi": _phases(kiwi_notes, histories["kiwi"], activity),
        "floor": _phases(floor_notes, histories["floor"], activity),
    }
    print(
        f"{args.calls} calls of each: Kiwi's {tool} and the floor's '{floor_kind}' update (p50, ms); workflow "
        f"tasks: Kiwi's {'on threads' if args.kiwi_threaded else 'on its event loop'}, the floor's "
        f"{'on its event loop' if args.floor_inline else 'on threads (the SDK default)'}"
    )
    print(f"{'phase':24s} {'Kiwi':>8s} {'floor':>8s} {'Kiwi - floor':>13s}")
    for name in [*(WITH_ACTIVITY if activity else WITHOUT), "total"]:
        k, f = statistics.median(phases["kiwi"][name]), statistics.median(phases["floor"][name])
        print(f"{name:24s} {k:8.2f} {f:8.2f} {k - f:+13.2f}")
    print(f"(tasks measured: Kiwi {len(phases['kiwi']['total'])}, floor {len(phases['floor']['total'])})")


if __name__ == "__main__":
    asyncio.run(main())
