"""Proxied ``server-everything`` ``echo`` inside a run versus the same call made directly.

Both sides use the same Python MCP client library against the same stdio server. The proxied
call is ``RunClient.call_tool`` (a Workflow Update) -> policy, rate limit, loop check -> local
activity ``mcp.everything.call_tool`` -> the worker's pooled connection -> audit. Sequential
p50/p99, then 10 concurrent callers (calls/s). For scale it also prints the floor under every
proxied call on the same server (bench/floor.py: a bare update, and one running a no-op local
activity), the same Kiwi update refused by policy before any activity runs, and Kiwi's update sent
straight to a run without RunClient (the caller's side of Kiwi). Each kind of call has a run of its own,
as each floor has a workflow of its own (Temporal's time per update grows with the updates an execution has
taken). ``--pin`` gives the worker processes
(and the MCP servers they start) a core of their own and the Temporal server and callers the others.

    .venv/bin/python bench/bench_mcp_proxy.py [--calls 300] [--callers 10] [--worker-process [--pin]]
    .venv/bin/python bench/bench_mcp_proxy.py --tracing [--calls 300]

``--tracing`` measures only the cost of OpenTelemetry: the same proxied call to a traced and an untraced
worker process running side by side, calls alternating between them, the traced side's spans exported
over OTLP/HTTP to a sink on loopback. Target (#16): traced p50 <= 1.10x untraced.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mcp.client import Client  # noqa: E402
from mcp.client.stdio import StdioServerParameters  # noqa: E402
from temporalio.client import Client as TemporalClient  # noqa: E402

from bench import common  # noqa: E402
from bench.floor import floor_callers, floor_rates  # noqa: E402
from kiwi.contracts import CallToolRequest  # noqa: E402
from kiwi.converter import data_converter
from kiwi.items.store import ItemStore  # noqa: E402
from kiwi.runs import RunClient  # noqa: E402
from kiwi.seal import seal_interceptors  # noqa: E402
from tests.helpers import write_directive  # noqa: E402
from workers.main import build_worker  # noqa: E402
from workflows.directive_run.workflow import DirectiveRun  # noqa: E402

EVERYTHING = (
    Path(__file__).resolve().parents[1]
    / "tests"
    / "npm"
    / "node_modules"
    / "@modelcontextprotocol"
    / "server-everything"
    / "dist"
    / "index.js"
)
DIRECTIVE = """# echo bench

```xml
<directive name="echo_bench" version="1.0.0">
  <metadata>
    <description>Echo through Kiwi</description>
    <permissions><execute resource="mcp" name="everything" actions="echo"/><read resource="filesystem" path="notes/**"/></permissions>
    <tools><mcp name="everything" required="true"><tool>echo</tool></mcp></tools>
  </metadata>
  <process><step name="work"><action>Echo many times.</action></step></process>
</directive>
```
"""


async def sequential(calls: int, fn) -> list[float]:
    for i in range(10):
        await fn(i)
    samples = []
    for i in range(calls):
        t0 = time.perf_counter()
        await fn(i)
        samples.append((time.perf_counter() - t0) * 1000)
    return samples


async def interleaved(calls: int, kinds: dict) -> dict[str, list[float]]:
    """Sequential latencies (ms) of ``calls`` calls of each kind, the kinds taking turns call by call, in
    a shuffled order each round (what ran just before a call moves its latency by up to 1 ms here: the
    same kind measured after a no-op update and after another upstream call differed by that much)."""
    samples: dict[str, list[float]] = {name: [] for name in kinds}
    order = list(kinds.items())
    shuffle = random.Random(20).shuffle
    for i in range(-10, calls):
        shuffle(order)
        for name, fn in order:
            t0 = time.perf_counter()
            await fn(i)
            if i >= 0:
                samples[name].append((time.perf_counter() - t0) * 1000)
    return samples


async def concurrent(calls: int, callers: int, fn) -> float:
    """Calls per second with ``callers`` callers sharing ``calls`` calls."""

    async def caller(offset: int) -> None:
        for i in range(offset, calls, callers):
            await fn(i)

    t0 = time.perf_counter()
    await asyncio.gather(*(caller(c) for c in range(callers)))
    return calls / (time.perf_counter() - t0)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--callers", type=int, default=10)
    parser.add_argument(
        "--worker-process",
        action="store_true",
        help="run the worker (and so the MCP pool) as its own `kiwi worker` process, as deployed",
    )
    parser.add_argument(
        "--tracing",
        action="store_true",
        help="measure only tracing's cost: proxied calls with tracing off and on, worker processes",
    )
    parser.add_argument(
        "--pin",
        action="store_true",
        help="with --worker-process: give the workers (and their MCP servers) a core of their own, the "
        "server and the callers the others, from the sequential calls on",
    )
    args = parser.parse_args()
    if args.pin and not args.worker_process:
        parser.error("--pin needs --worker-process")
    if not EVERYTHING.exists():
        raise SystemExit("run scripts/test once first: it installs tests/npm (server-everything)")
    if args.tracing:
        await tracing_cost(args.calls)
        return
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        _project(root)
        server = common.tuned_dev_server(root)
        await server.start()
        worker = None
        try:
            temporal = await TemporalClient.connect(
                server.address, data_converter=data_converter, interceptors=seal_interceptors()
            )
            direct_params = StdioServerParameters(command="node", args=[str(EVERYTHING), "stdio"])
            worker = await common.start_worker(server.address) if args.worker_process else None
            # The floor's worker runs where Kiwi's does: its own process with --worker-process, else here.
            where = {"everything": EVERYTHING, "address": server.address if worker else None}
            async with build_worker(temporal) if worker is None else contextlib.nullcontext():
                rates = await floor_rates(temporal, args.calls, args.callers, **where)
                floor_rate, bare_rate = rates["local"], rates["upstream"]
                runs = RunClient(temporal, ItemStore(root))
                run_id = await runs.start("echo_bench", {})
                # A run of its own for each kind of call, as the floor has a workflow of its own for each:
                # Temporal's own time per update grows with the updates an execution has taken (the floor's
                # p50 went from 6.2 to 8.6 ms over 800 updates), so a run taking three kinds of call was
                # measured later in that growth than the floor it was set against.
                refused_run = await runs.start("echo_bench", {})
                read_run = await runs.start("echo_bench", {})

                async def proxied(i: int) -> None:
                    result = await runs.call_tool(run_id, "everything.echo", {"message": f"m{i}"})
                    assert result.status == "ok", result

                async def refused(i: int) -> None:
                    # The same update, refused by the policy before any activity runs.
                    result = await runs.call_tool(refused_run, "everything.nothing", {"message": f"m{i}"})
                    assert result.error_type == "ToolNotFound", result

                async def read(i: int) -> None:
                    # The built-in filesystem.read, the other proxied call #20 names (a local activity too).
                    result = await runs.call_tool(read_run, "filesystem.read", {"path": "notes/hello.md"})
                    assert result.status == "ok", result

                # Sequential latencies, one call of each kind in turn: drift in the host's load hits the
                # floor and Kiwi alike (measured one kind after another, ratios swung by 0.1-0.2x).
                # The same update sent straight to the run (a run of its own, as many calls as each kind):
                # what the p50 owes to RunClient, the caller's side of Kiwi.
                direct_run = await runs.start("echo_bench", {})

                async def update(i: int) -> None:
                    request = CallToolRequest(
                        tool="everything.echo", arguments={"message": f"m{i}"}, client="cli"
                    )
                    result = await runs.handle(direct_run).execute_update(DirectiveRun.call_tool, request)
                    assert result.status == "ok", result

                async with floor_callers(temporal, **where) as floor_call:
                    kinds = {
                        **floor_call,
                        "kiwi": proxied,
                        "refused": refused,
                        "read": read,
                        "update": update,
                    }
                    if args.pin:
                        for call in kinds.values():  # (every process started: Kiwi's pool starts its server)
                            await call(-1)
                        mine = os.getpid()
                        workers = [
                            pid
                            for pid in common.children(mine)
                            if pid == worker.pid
                            or b"bench.floor" in Path(f"/proc/{pid}/cmdline").read_bytes()
                        ]
                        pinned = common.pin_processes(workers, [mine, server.process.pid])
                    samples = await interleaved(min(args.calls, 900), kinds)
                for done in (direct_run, refused_run, read_run):
                    await runs.cancel(done)
                floor = {k: samples[k] for k in ("plain", "local", "upstream", "raw", "decided", "recorded")}
                kiwi_ms, refused_ms, read_ms = samples["kiwi"], samples["refused"], samples["read"]
                await runs.cancel(run_id)
                read_run = await runs.start("echo_bench", {})
                read_rate = await concurrent(args.calls, args.callers, read)
                await runs.cancel(read_run)
                # The callers share a fresh run, as the floor's callers share a fresh workflow: what a
                # continue-as-new inside the window costs is bench_continue_as_new.py's figure.
                run_id = await runs.start("echo_bench", {})
                await proxied(0)
                pids = [os.getpid(), server.process.pid] + ([worker.pid] if worker else [])
                cpu0 = [common.cpu_seconds(p) for p in pids]
                kiwi_rate = await concurrent(args.calls, args.callers, proxied)
                cpu = [
                    (common.cpu_seconds(p) - c) / args.calls * 1000 for p, c in zip(pids, cpu0, strict=True)
                ]
                continued = (await runs.status(run_id)).continued
                await runs.cancel(run_id)
            if worker is not None:
                await common.stop_worker(worker)
            async with Client(direct_params) as direct:

                async def straight(i: int) -> None:
                    result = await direct.call_tool("echo", {"message": f"m{i}"})
                    assert not result.is_error

                direct_ms = await sequential(args.calls, straight)
                direct_rate = await concurrent(args.calls, args.callers, straight)
        finally:
            if worker is not None and worker.returncode is None:  # (a bench that failed leaves none running)
                await common.stop_worker(worker)
            server.stop()
    print(
        f"{args.calls} echo calls over stdio (load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores)"
    )
    print(
        f"proxied through a run: p50 {common.pct(kiwi_ms, 0.5):6.1f} ms  p99 {common.pct(kiwi_ms, 0.99):6.1f} ms  "
        f"{kiwi_rate:6.0f} calls/s with {args.callers} callers"
    )
    print(
        f"direct:                p50 {common.pct(direct_ms, 0.5):6.1f} ms  p99 {common.pct(direct_ms, 0.99):6.1f} ms  "
        f"{direct_rate:6.0f} calls/s with {args.callers} callers"
    )
    print(
        f"floor, bare update on the same server: p50 {common.pct(floor['plain'], 0.5):6.1f} ms; with a no-op local "
        f"activity: p50 {common.pct(floor['local'], 0.5):6.1f} ms  p99 {common.pct(floor['local'], 0.99):6.1f} ms  "
        f"{floor_rate:6.0f} updates/s with {args.callers} callers"
    )
    print(
        f"bare workflow making the same upstream call (update + local activity + MCP echo, no Kiwi): "
        f"p50 {common.pct(floor['upstream'], 0.5):6.1f} ms  {bare_rate:6.0f} calls/s with {args.callers} callers"
    )
    print(
        f"bare workflow making the same call by hand (no MCP SDK client; #20's design option 1): "
        f"p50 {common.pct(floor['raw'], 0.5):6.1f} ms, {common.pct(floor['raw'], 0.5) / common.pct(floor['local'], 0.5):.2f}x "
        f"the no-op local-activity update, leaving Kiwi "
        f"{1.15 * common.pct(floor['local'], 0.5) - common.pct(floor['raw'], 0.5):.1f} ms for the 1.15x target"
    )
    print(
        f"proxied filesystem.read:   p50 {common.pct(read_ms, 0.5):6.1f} ms  p99 {common.pct(read_ms, 0.99):6.1f} ms  "
        f"{read_rate:6.0f} calls/s with {args.callers} callers"
    )
    print(
        f"Kiwi's update refused by policy (no activity): p50 {common.pct(refused_ms, 0.5):6.1f} ms  "
        f"p99 {common.pct(refused_ms, 0.99):6.1f} ms"
    )
    where = (
        f"worker + pool process {cpu[2]:.1f} ms, callers (this process) {cpu[0]:.1f} ms"
        if args.worker_process
        else f"callers + worker + pool (this process) {cpu[0]:.1f} ms"
    )
    print(f"CPU per proxied call with {args.callers} callers: Temporal server {cpu[1]:.1f} ms, {where}")
    if continued:
        print(f"(the callers' run continued-as-new {continued} times inside the window)")
    local = common.pct(floor["local"], 0.5)
    update_ms = samples["update"]
    print(
        f"the same update sent straight to a run (no RunClient): p50 {common.pct(update_ms, 0.5):6.1f} ms, "
        f"{common.pct(update_ms, 0.5) / local:.2f}x the no-op local-activity update; RunClient's share "
        f"{common.pct(kiwi_ms, 0.5) - common.pct(update_ms, 0.5):+.2f} ms"
    )
    decided, recorded = common.pct(floor["decided"], 0.5), common.pct(floor["recorded"], 0.5)
    print(
        f"design option, the front end makes the call (a bare update decides, the call is made by hand from the "
        f"caller, a signal records its answer): p50 {decided:6.1f} ms, {decided / local:.2f}x the no-op "
        f"local-activity update; {recorded:6.1f} ms, {recorded / local:.2f}x with the signal awaited before "
        "the caller has the answer"
    )
    if args.pin:
        print(f"timed calls pinned: {pinned}")
    print(
        f"#20 ratios to the floor: proxied p50 {common.pct(kiwi_ms, 0.5) / local:.2f}x the no-op local-activity "
        f"update (target <= 1.15x); throughput {kiwi_rate / floor_rate:.2f}x its updates/s (target >= 0.8x); "
        f"refused p50 {common.pct(refused_ms, 0.5) / common.pct(floor['plain'], 0.5):.2f}x a bare update "
        f"(target <= 1.1x); filesystem.read p50 {common.pct(read_ms, 0.5) / local:.2f}x and throughput "
        f"{read_rate / floor_rate:.2f}x"
    )
    print(
        f"Kiwi's own share: proxied p50 {common.pct(kiwi_ms, 0.5) / common.pct(floor['upstream'], 0.5):.2f}x and "
        f"throughput {kiwi_rate / bare_rate:.2f}x the bare workflow making the same upstream call"
    )
    print(
        f"ratio (p50): {common.pct(kiwi_ms, 0.5) / common.pct(direct_ms, 0.5):.1f}x   "
        f"throughput ratio: {direct_rate / kiwi_rate:.1f}x"
    )


def _project(root: Path) -> None:
    common.scratch_project(root)
    (root / ".ai" / "config" / "agent_harness.yaml").write_text(
        "rate_limits:\n  'mcp.*': 1000000\nruns:\n  audit_batch_size: 200\nloop_detection:\n"
        "  repeat_threshold: 100000\n  max_warnings: 100000\n"
    )
    (root / ".ai" / "config" / "mcp_registry.yaml").write_text(
        f"mcps:\n  everything:\n    command: node\n    args: ['{EVERYTHING}', 'stdio']\n"
    )
    write_directive(root / ".ai" / "directives" / "echo_bench.md", DIRECTIVE)
    (root / "notes").mkdir(exist_ok=True)
    (root / "notes" / "hello.md").write_text("# Hello\n\nA note read by the bench.\n")


class _Sink(BaseHTTPRequestHandler):
    """An OTLP/HTTP endpoint that takes everything and keeps nothing (counts requests)."""

    requests = 0

    def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        _Sink.requests += 1
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


async def tracing_cost(calls: int) -> None:
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    from kiwi.tracing import KiwiTracingInterceptor

    sink = ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{sink.server_address[1]}"
    # The callers trace too, as an agent's client would: every call carries a traceparent.
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint + "/v1/traces")))
    tracer = provider.get_tracer("bench")
    samples: dict[str, list[float]] = {"off": [], "on": []}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        _project(root)
        server = common.tuned_dev_server(root)
        await server.start()
        try:
            plain = await TemporalClient.connect(
                server.address, data_converter=data_converter, interceptors=seal_interceptors()
            )
            traced = await TemporalClient.connect(
                server.address,
                data_converter=data_converter,
                interceptors=[*seal_interceptors(), KiwiTracingInterceptor(tracer)],
            )
            # Both workers at once, each on its own task queue, and the calls alternate between a traced
            # run and an untraced one: drift in the host's load hits both sides alike.
            workers = {
                "off": await common.start_worker(
                    server.address, {"OTEL_SDK_DISABLED": "true"}, queue="bench-off"
                ),
                "on": await common.start_worker(
                    server.address, {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint}, queue="bench-on"
                ),
            }
            try:
                runs = {
                    "off": RunClient(plain, ItemStore(root), task_queue="bench-off"),
                    "on": RunClient(traced, ItemStore(root), task_queue="bench-on"),
                }
                run_ids = {mode: await runs[mode].start("echo_bench", {}) for mode in runs}

                async def call(mode: str, i: int) -> float:
                    t0 = time.perf_counter()
                    if mode == "on":
                        with tracer.start_as_current_span("agent call"):
                            result = await runs[mode].call_tool(
                                run_ids[mode], "everything.echo", {"message": f"m{i}"}
                            )
                    else:
                        result = await runs[mode].call_tool(
                            run_ids[mode], "everything.echo", {"message": f"m{i}"}
                        )
                    assert result.status == "ok", result
                    return (time.perf_counter() - t0) * 1000

                for i in range(20):
                    await call("off", i)
                    await call("on", i)
                for i in range(calls):
                    order = ("off", "on") if i % 2 == 0 else ("on", "off")
                    for mode in order:
                        samples[mode].append(await call(mode, i))
                for mode in runs:
                    await runs[mode].cancel(run_ids[mode])
            finally:
                for worker in workers.values():
                    await common.stop_worker(worker)
        finally:
            server.stop()
            provider.shutdown()
            sink.shutdown()
    trace.get_tracer_provider()  # nothing global was set: the bench's tracer is its own
    off, on = common.pct(samples["off"], 0.5), common.pct(samples["on"], 0.5)
    print(
        f"{len(samples['off'])} proxied echo calls each way, worker processes "
        f"(load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores); OTLP requests received: {_Sink.requests}"
    )
    print(f"tracing off: p50 {off:6.1f} ms  p99 {common.pct(samples['off'], 0.99):6.1f} ms")
    print(f"tracing on:  p50 {on:6.1f} ms  p99 {common.pct(samples['on'], 0.99):6.1f} ms")
    print(f"#16 ratio: traced p50 {on / off:.2f}x untraced (target <= 1.10x)")


if __name__ == "__main__":
    asyncio.run(main())
