"""OpenTelemetry: one trace from the agent's MCP request to the upstream server, read off real OTLP.

The front end (`kiwi mcp --http`), the worker (`kiwi worker`) and an upstream MCP server run as their
own processes and export OTLP over HTTP to a receiver this test runs on loopback; the receiver decodes
the protobuf requests, and the assertions walk the spans' parent links.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from temporalio.worker import Replayer

from kiwi import telemetry
from kiwi.auditlog import read_audit
from kiwi.devserver import free_port
from kiwi.items.store import ItemStore
from kiwi.metrics import AUDIT_FLUSH_LAG, MCP_CONNECTIONS, RUNS_STARTED, TOOL_CALL_DURATION, TOOL_CALLS
from kiwi.runs import RunClient
from kiwi.tracing import KiwiTracingInterceptor
from kiwi.upstream import stdio
from tests.helpers import (
    OtlpReceiver,
    data,
    directive_md,
    kiwi_cli,
    kiwi_mcp_http,
    kiwi_worker,
    wait_for,
    write,
    write_directive,
)
from workers.main import SANDBOX, WORKFLOWS

SERVERS = Path(__file__).parent / "servers"

pytestmark = pytest.mark.temporal


EXPECTED = {
    "tools/call execute",
    "StartWorkflowUpdate:call_tool",
    "HandleUpdate:call_tool",
    "StartActivity:mcp.traced.call_tool",
    "RunActivity:mcp.traced.call_tool",
    "MCP send tools/call echo",
    "tools/call echo",
}


def traceparent() -> tuple[str, str, str]:
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return trace_id, span_id, f"00-{trace_id}-{span_id}-01"


def received(check):
    async def probe():
        return check()

    return probe


def one(spans: list[dict[str, Any]], name: str, **where: Any) -> dict[str, Any]:
    found = [
        s for s in spans if s["name"] == name and all(s["attributes"].get(k) == v for k, v in where.items())
    ]
    assert len(found) == 1, (
        name,
        where,
        [(s["service"], s["name"], s["span_id"], s["parent_id"]) for s in spans],
    )
    return found[0]


def traced_project(project: Path, endpoint: str, timeout: int = 30, era: str = "modern") -> None:
    """``era``: "handshake" serves the traced server as a 2025-11-25 server, whose calls Kiwi's worker makes
    the short way (kiwi/upstream/stdio.py), making the MCP SDK client's span itself; "modern" (2026-07-28)
    leaves the call to the SDK's client."""
    tool = project / ".ai" / "tools" / "debug" / "show_trace"
    write(
        tool / "tool.yaml",
        "tool_id: show_trace\ntool_type: python\nversion: '1.0.0'\ncategory: debug\n"
        "description: The trace context the tool process was given\n"
        "executor:\n  type: python\n  entrypoint: main.py\nmutates_state: false\nparameters: []\n",
    )
    write(
        tool / "main.py", "import os\n\n\ndef main() -> str:\n    return os.environ.get('TRACEPARENT', '')\n"
    )
    write(
        project / ".ai" / "config" / "mcp_registry.yaml",
        f"""\
mcps:
  traced:
    command: {sys.executable}
    args: ["{SERVERS / "traced_server.py"}", "{endpoint}"{', "--handshake"' if era == "handshake" else ""}]
    timeout: {timeout}
""",
    )
    write_directive(
        project / ".ai" / "directives" / "traced.md",
        directive_md(
            '<step name="work"><action>Echo something.</action></step>',
            name="traced",
            tools='<tools><mcp name="traced" required="true"/></tools>',
            permissions='<execute resource="mcp" name="traced" actions="echo,hold"/>'
            '<execute resource="tool" id="show_trace"/>',
        ),
    )


def stop(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        os.killpg(proc.pid, signal.SIGTERM)


async def test_one_trace_from_the_agent_request_to_the_upstream_server(temporal_env, project, monkeypatch):
    from mcp.client import Client

    with OtlpReceiver() as otlp:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", otlp.url)
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
        monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "500")
        traced_project(project, otlp.url, era="handshake")
        address = temporal_env.client.service_client.config.target_host
        queue = f"kiwi-otel-{uuid.uuid4().hex[:8]}"
        runs = RunClient(temporal_env.client, ItemStore(project), task_queue=queue)
        worker = await kiwi_worker(address, queue)
        try:
            async with (
                kiwi_mcp_http(temporal_env, runs, project, free_port()) as (url, _),
                Client(url) as agent,
            ):
                start_trace, _, start_parent = traceparent()
                started = data(
                    await agent.call_tool(
                        "execute",
                        {"item_type": "directive", "action": "run", "item_id": "traced"},
                        meta={"traceparent": start_parent},
                    )
                )
                run_id = started["run_id"]
                await wait_for(lambda: _waits(runs, run_id), what="the run waiting for the agent", timeout=60)
                assert (await runs.status(run_id)).trace_id == start_trace
                code, out, err = await kiwi_cli(
                    "status",
                    run_id,
                    "--address",
                    address,
                    "--task-queue",
                    queue,
                    env={"KIWI_TRACE_URL": "http://127.0.0.1:16686/trace/{trace_id}"},
                )
                assert code == 0, err
                assert f"Trace: http://127.0.0.1:16686/trace/{start_trace}" in out

                # An allowed call to the upstream server.
                trace_id, agent_span, parent = traceparent()
                called = data(
                    await agent.call_tool(
                        "execute",
                        {
                            "item_type": "tool",
                            "action": "call",
                            "run_id": run_id,
                            "item_id": "traced.echo",
                            "parameters": {"text": "hi"},
                        },
                        meta={"traceparent": parent},
                    )
                )
                assert called["status"] == "ok", called
                await wait_for(
                    received(lambda: {s["name"] for s in otlp.trace(trace_id)} >= EXPECTED),
                    what="the spans of every process",
                    timeout=30,
                )

                # A local tool's process is given the call's trace (TRACEPARENT).
                tool_trace, _, tool_parent = traceparent()
                shown = data(
                    await agent.call_tool(
                        "execute",
                        {"item_type": "tool", "action": "call", "run_id": run_id, "item_id": "show_trace"},
                        meta={"traceparent": tool_parent},
                    )
                )
                assert shown["status"] == "ok" and f"00-{tool_trace}-" in str(shown["result"]), shown

                # A denied call: the refusal is in its trace, and nothing ran.
                denied_trace, _, denied_parent = traceparent()
                refused = data(
                    await agent.call_tool(
                        "execute",
                        {
                            "item_type": "tool",
                            "action": "call",
                            "run_id": run_id,
                            "item_id": "filesystem.write",
                            "parameters": {"path": "x.txt", "content": "no"},
                        },
                        meta={"traceparent": denied_parent},
                    )
                )
                assert refused["status"] == "denied", refused
                await wait_for(
                    received(
                        lambda: (
                            {"kiwi.tool_call", "tools/call execute"}
                            <= {s["name"] for s in otlp.trace(denied_trace)}
                        )
                    ),
                    what="the denial's span",
                    timeout=30,
                )
                # A refused call's tool is what the agent sent: no metric label keeps it (hostile review s39: a
                # secret sent as a tool's name went out unscrubbed in kiwi_tool_calls, in every export after).
                made_up = "nosuch.zz-agent-text-9f8e7d"
                await agent.call_tool(
                    "execute", {"item_type": "tool", "action": "call", "run_id": run_id, "item_id": made_up}
                )
                await wait_for(
                    received(lambda: ("tool", "mcp (not made)") in otlp.labels.get(TOOL_CALLS, set())),
                    what="the refused calls' tool_calls label",
                    timeout=30,
                )
                tools = {v for k, v in otlp.labels[TOOL_CALLS] if k == "tool"}
                assert "traced.echo" in tools and "filesystem (not made)" in tools, tools
                assert not any("zz-agent-text" in v for _, v in otlp.labels[TOOL_CALLS]), otlp.labels[
                    TOOL_CALLS
                ]
                # Temporal's runtime metrics went out over OTLP too.
                await wait_for(received(lambda: bool(otlp.metrics)), what="metrics", timeout=30)
                assert any(name.startswith("temporal_") for name in otlp.metrics), otlp.metrics
                # Under Kiwi's service names, not the SDK core's default (s19 trial).
                assert otlp.metric_services and not any(
                    s.endswith("temporal-core-sdk") for s in otlp.metric_services
                ), otlp.metric_services
                # And Kiwi's own, from the run's records, the audit flushes and the MCP pool.
                kiwi_metrics = {
                    TOOL_CALLS,
                    TOOL_CALL_DURATION,
                    RUNS_STARTED,
                    AUDIT_FLUSH_LAG,
                    MCP_CONNECTIONS,
                }
                await wait_for(
                    received(lambda: kiwi_metrics <= otlp.metrics),
                    what=f"Kiwi's metrics (seen: {sorted(otlp.metrics)})",
                    timeout=30,
                )

                await runs.cancel(run_id)
                # The run writes its last audit records as it ends.
                await runs.handle(run_id).result()
        finally:
            stop(worker)
            await worker.wait()

        spans = otlp.trace(trace_id)
        front = one(spans, "tools/call execute")
        assert front["service"] == "kiwi-frontend" and front["parent_id"] == agent_span
        assert front["attributes"]["gen_ai.tool.name"] == "traced.echo"
        assert front["attributes"]["kiwi.run_id"] == run_id
        update = one(spans, "StartWorkflowUpdate:call_tool")
        assert update["service"] == "kiwi-frontend" and update["parent_id"] == front["span_id"]
        handled = one(spans, "HandleUpdate:call_tool")
        assert handled["service"] == "kiwi-worker" and handled["parent_id"] == update["span_id"]
        # A routine allowed call has no span of its own: its activity's spans and the front end's say it.
        assert front["attributes"]["kiwi.decision"] == "ok"
        assert not [s for s in spans if s["name"] == "kiwi.tool_call"]
        scheduled = one(spans, "StartActivity:mcp.traced.call_tool")
        assert scheduled["parent_id"] == handled["span_id"]
        ran = one(spans, "RunActivity:mcp.traced.call_tool")
        assert ran["service"] == "kiwi-worker" and ran["parent_id"] == scheduled["span_id"]
        sent = one(spans, "MCP send tools/call echo")
        assert sent["service"] == "kiwi-worker" and sent["parent_id"] == ran["span_id"]
        # Made by Kiwi's short tools/call path (its request ids start at 2**40; the SDK's count up from 0).
        assert int(sent["attributes"]["jsonrpc.request.id"]) > stdio.FIRST_ID
        upstream = one(spans, "tools/call echo")
        assert upstream["service"] == "upstream" and upstream["parent_id"] == sent["span_id"]

        refusal = one(otlp.trace(denied_trace), "kiwi.tool_call")
        assert refusal["attributes"]["kiwi.decision"] == "denied"
        assert "filesystem.write" in refusal["attributes"]["gen_ai.tool.name"]
        assert refusal["attributes"]["kiwi.reason"]
        assert not [s for s in otlp.trace(denied_trace) if s["name"].startswith("StartActivity")]

        # Audit records carry the trace of the call that made them.
        records = {r["tool"]: r for r in read_audit(str(project), run_id) if r.get("event") == "tool_call"}
        assert records["traced.echo"]["trace_id"] == trace_id
        assert records["filesystem.write"]["trace_id"] == denied_trace

        # Replaying the run's history with tracing on makes no spans.
        history = await temporal_env.client.get_workflow_handle(run_id).fetch_history()
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        replayer = Replayer(
            workflows=WORKFLOWS,
            workflow_runner=SANDBOX,
            interceptors=[KiwiTracingInterceptor(provider.get_tracer("replay"))],
            data_converter=temporal_env.client.data_converter,
        )
        await replayer.replay_workflow(history)
        assert exporter.get_finished_spans() == ()


async def test_a_worker_killed_mid_call_retries_the_activity_in_the_same_trace(
    temporal_env, project, monkeypatch, tmp_path
):
    from mcp.client import Client

    marker = tmp_path / "hold-calls"
    with OtlpReceiver() as otlp:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", otlp.url)
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
        # Over the local-activity limit: a heartbeating activity another worker retries.
        traced_project(project, otlp.url, timeout=120)
        address = temporal_env.client.service_client.config.target_host
        queue = f"kiwi-otel-{uuid.uuid4().hex[:8]}"
        runs = RunClient(temporal_env.client, ItemStore(project), task_queue=queue)
        monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "service.instance.id=first")
        worker = await kiwi_worker(address, queue)
        try:
            run_id = await runs.start("traced", {})
            await wait_for(lambda: _waits(runs, run_id), what="the run waiting for the agent", timeout=60)
            async with (
                kiwi_mcp_http(temporal_env, runs, project, free_port()) as (url, _),
                Client(url) as agent,
            ):
                trace_id, _, parent = traceparent()
                call = asyncio.create_task(
                    agent.call_tool(
                        "execute",
                        {
                            "item_type": "tool",
                            "action": "call",
                            "run_id": run_id,
                            "item_id": "traced.hold",
                            "parameters": {"marker": str(marker)},
                            "wait_seconds": 120,
                        },
                        meta={"traceparent": parent},
                    )
                )
                await wait_for(
                    received(
                        lambda: (
                            marker.exists()
                            and "StartActivity:mcp.traced.call_tool"
                            in {s["name"] for s in otlp.trace(trace_id)}
                        )
                    ),
                    what="the first attempt running",
                    timeout=60,
                )
                os.killpg(worker.pid, signal.SIGKILL)
                await worker.wait()
                monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "service.instance.id=second")
                worker = await kiwi_worker(address, queue)
                answer = data(await asyncio.wait_for(call, 120))
                assert answer["status"] == "ok" and "call 2" in str(answer["result"]), answer
                await wait_for(
                    received(
                        lambda: (
                            "RunActivity:mcp.traced.call_tool" in {s["name"] for s in otlp.trace(trace_id)}
                            and "tools/call execute" in {s["name"] for s in otlp.trace(trace_id)}
                        )
                    ),
                    what="the retried attempt's span",
                    timeout=30,
                )
                await runs.cancel(run_id)
        finally:
            stop(worker)
            await worker.wait()
            # The first attempt's server (its own session; its call hangs in a sleep that never reads the
            # closed input) dies with the killed worker on Linux; elsewhere stop it, or it stays ten minutes.
            for line in marker.read_text().splitlines() if marker.exists() else []:
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(line.split()[-1]), signal.SIGKILL)
        spans = otlp.trace(trace_id)
        scheduled = one(spans, "StartActivity:mcp.traced.call_tool")
        assert scheduled["instance"] == "first"
        retried = one(spans, "RunActivity:mcp.traced.call_tool")
        assert retried["instance"] == "second" and retried["parent_id"] == scheduled["span_id"]
        assert retried["attributes"]["temporal.activity.attempt"] == 2
        upstream = [s for s in spans if s["name"] == "tools/call hold"]
        assert [s["parent_id"] for s in upstream] == [one(spans, "MCP send tools/call hold")["span_id"]]


async def _waits(runs: RunClient, run_id: str) -> bool:
    return (await runs.status(run_id)).status == "awaiting_agent"


def test_telemetry_is_off_unless_asked_for():
    assert not telemetry.wanted({})
    assert telemetry.wanted({"KIWI_OTEL": "1"})
    assert telemetry.wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"})
    assert not telemetry.wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true"})
    # A metrics endpoint alone: metrics, not traces to a default collector (trial F28: nothing at all).
    metrics_only = {"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://c:4318/v1/metrics"}
    assert telemetry.wanted(metrics_only) and not telemetry.traces_wanted(metrics_only)
    assert telemetry.traces_wanted({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"})


async def test_a_metrics_endpoint_alone_sends_the_workers_metrics_and_no_traces(temporal_env, project):
    """Trial F28: OTEL_EXPORTER_OTLP_METRICS_ENDPOINT alone turned nothing on."""
    address = temporal_env.client.service_client.config.target_host
    with OtlpReceiver() as otlp:
        worker = await kiwi_worker(
            address,
            f"kiwi-metrics-{uuid.uuid4().hex[:8]}",
            env={
                "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": f"{otlp.url}/v1/metrics",
                "OTEL_METRIC_EXPORT_INTERVAL": "300",
            },
        )
        try:
            await wait_for(received(lambda: bool(otlp.metrics)), timeout=60, what="the worker's metrics")
        finally:
            stop(worker)
            await worker.wait()
        assert any(name.startswith("temporal") for name in otlp.metrics), otlp.metrics
        assert otlp.spans == []


def test_metrics_endpoint_follows_the_otlp_settings():
    assert telemetry.metrics_endpoint({}) == ("http://127.0.0.1:4318/v1/metrics", True)
    assert telemetry.metrics_endpoint({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318/"}) == (
        "http://c:4318/v1/metrics",
        True,
    )
    assert telemetry.metrics_endpoint({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}) == (
        "http://127.0.0.1:4317",
        False,
    )


def test_an_unknown_otlp_protocol_names_the_ones_that_work():
    from kiwi.errors import KiwiError

    with pytest.raises(KiwiError, match="http/protobuf, grpc"):
        telemetry.protocol(environ={"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"})


async def _kiwi_run(runs, project, **env: str) -> tuple[int, str, str]:
    """`kiwi run hello_kiwi` against the test's worker, with ``env`` (the OTLP settings) added."""
    address = runs.client.service_client.config.target_host
    return await kiwi_cli(
        "run",
        "hello_kiwi",
        "--input",
        "name=otel",
        "--address",
        address,
        "--task-queue",
        runs.task_queue,
        cwd=project,
        env=env,
    )


async def test_otlp_over_grpc_when_the_protocol_says_so(temporal_env, runs, project):
    """`OTEL_EXPORTER_OTLP_PROTOCOL=grpc`: the CLI's span of starting a run reaches a gRPC receiver."""
    from concurrent import futures

    import grpc
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

    got: list[ExportTraceServiceRequest] = []

    class Traces(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(self, request, context):  # noqa: N802 - the generated name
            got.append(request)
            return trace_service_pb2.ExportTraceServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Traces(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        code, out, err = await _kiwi_run(
            runs,
            project,
            OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{port}",
            OTEL_EXPORTER_OTLP_PROTOCOL="grpc",
            OTEL_SERVICE_NAME="kiwi-cli-test",
        )
        assert code == 0, err
    finally:
        server.stop(None)
    receiver = OtlpReceiver()
    for request in got:
        receiver._spans(request)
    started = one(receiver.spans, "StartWorkflow:DirectiveRun")
    assert started["service"] == "kiwi-cli-test"


async def test_a_collector_that_is_down_holds_a_command_only_briefly_and_is_named(
    temporal_env, runs, project
):
    """Trial F9: with OTLP set and the collector down, every CLI command waited ~7 s at its end while the
    exporter retried. The last spans get telemetry.FLUSH_SECONDS; then the command ends, saying where its
    traces did not go and how to turn them off. (A closed port: nothing listens there.)"""
    from kiwi import telemetry
    from kiwi.devserver import free_port

    closed = free_port()
    code, out, err = await _kiwi_run(
        runs,
        project,
        OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{closed}",
        OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
    )
    assert code == 0, err
    assert (
        f"the last traces were not sent: http://127.0.0.1:{closed} (http/protobuf) took none within "
        f"{telemetry.FLUSH_SECONDS:g} s" in err
    ), err
    assert "unset OTEL_EXPORTER_OTLP_ENDPOINT to turn traces off" in err
    # Turned on by KIWI_OTEL alone, the default collector's address: that is what to unset (README trial s39).
    code, out, err = await _kiwi_run(
        runs, project, KIWI_OTEL="1", OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf"
    )
    assert code == 0 and "unset KIWI_OTEL to turn traces off" in err, err


def test_a_trace_url_without_its_placeholder_gets_the_id_after_a_slash(monkeypatch):
    """README trial s39: KIWI_TRACE_URL=http://x/trace made `kiwi status` print `Trace: http://x/trace`, no id."""
    from kiwi.telemetry import trace_url

    monkeypatch.setenv("KIWI_TRACE_URL", "http://x/trace/")
    assert trace_url("4bf92f3577b34da6a3ce929d0e0e4736") == "http://x/trace/4bf92f3577b34da6a3ce929d0e0e4736"
    monkeypatch.setenv("KIWI_TRACE_URL", "http://x/ui?trace={trace_id}&view=1")
    assert trace_url("ab12") == "http://x/ui?trace=ab12&view=1"
    assert trace_url("") == ""
