"""Tracing through Temporal: the interceptor Kiwi's clients and workers use, and the workflow side.

Temporal's ``TracingInterceptor`` makes every span of a workflow a child of the span that started the
run, and only links a Workflow Update to its caller. A Kiwi run lives for hours and every tool call is
an update, so Kiwi parents an update's spans on the caller's context instead: the agent's MCP
request, the front end, the update, Kiwi's decision, the activity and the upstream call form one trace.
Workflow spans are zero-length and never made while replaying (the interceptor's rule), so a replay
adds no spans and workflow code stays deterministic.
"""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import opentelemetry.trace
import temporalio.activity
import temporalio.worker
import temporalio.workflow
from temporalio.contrib.opentelemetry import TracingInterceptor, TracingWorkflowInboundInterceptor
from temporalio.contrib.opentelemetry._context import attached_context
from temporalio.contrib.opentelemetry.workflow import completed_span

HEADER = "_tracer-data"


class KiwiWorkflowTracing(TracingWorkflowInboundInterceptor):
    """Updates (tool calls) join their caller's trace; everything else as Temporal's interceptor does."""

    async def handle_update_handler(self, input: temporalio.worker.HandleUpdateInput) -> Any:
        header = input.headers.get(self.header_key)
        if header is None:
            return await super().handle_update_handler(input)
        carrier = self.payload_converter.from_payloads([header])[0]
        context = self._set_on_context(self.text_map_propagator.extract(carrier))
        with attached_context(context):
            # The span is made through the interceptor's own path (its time, its replay rule); its
            # context comes back as the header it would add to an outbound call.
            made = SimpleNamespace(headers={})
            self._completed_span(
                f"HandleUpdate:{input.update}", kind=opentelemetry.trace.SpanKind.SERVER, add_to_outbound=made
            )
        span_header = made.headers.get(self.header_key)
        if span_header is not None:
            inner = self.payload_converter.from_payloads([span_header])[0]
            context = self._set_on_context(self.text_map_propagator.extract(inner))
        with attached_context(context):
            return await temporalio.worker.WorkflowInboundInterceptor.handle_update_handler(self, input)


class _ActivityAttempt(temporalio.worker.ActivityInboundInterceptor):
    """Runs inside the activity's span: marks which attempt it is, so a retry reads as one."""

    async def execute_activity(self, input: temporalio.worker.ExecuteActivityInput) -> Any:
        info = temporalio.activity.info()
        span = opentelemetry.trace.get_current_span()
        span.set_attribute("temporal.activity.attempt", info.attempt)
        if info.attempt > 1:
            span.add_event("retry", {"temporal.activity.attempt": info.attempt})
        return await super().execute_activity(input)


class KiwiTracingInterceptor(TracingInterceptor):
    def intercept_activity(
        self, next: temporalio.worker.ActivityInboundInterceptor
    ) -> temporalio.worker.ActivityInboundInterceptor:
        return super().intercept_activity(_ActivityAttempt(next))

    def workflow_interceptor_class(
        self, input: temporalio.worker.WorkflowInterceptorClassInput
    ) -> type[TracingWorkflowInboundInterceptor]:
        super().workflow_interceptor_class(input)
        return KiwiWorkflowTracing


# ---------------------------------------------------------------- workflow side (deterministic)


def traced_here() -> bool:
    """Whether this workflow runs on a worker with Kiwi's tracing (telemetry on)."""
    return TracingWorkflowInboundInterceptor._from_context() is not None


def workflow_span(name: str, attributes: dict[str, Any]) -> None:
    """A zero-length span in the trace of the call being handled; nothing when tracing is off or
    while replaying."""
    if TracingWorkflowInboundInterceptor._from_context() is None:
        return
    completed_span(
        name,
        attributes={
            k: v for k, v in attributes.items() if isinstance(v, str | int | float | bool) and v != ""
        },
    )


def current_ids() -> dict[str, str]:
    """Trace and span ids of the current span (an audit record's link to its trace), or {}."""
    context = opentelemetry.trace.get_current_span().get_span_context()
    if not context.is_valid:
        return {}
    return {"trace_id": format(context.trace_id, "032x"), "span_id": format(context.span_id, "016x")}


def started_trace_id() -> str:
    """The trace a run was started in (from its start header, so the same on replay), or ""."""
    payload = temporalio.workflow.info().headers.get(HEADER)
    if payload is None:
        return ""
    try:
        carrier = json.loads(payload.data)
        parts = str(carrier.get("traceparent", "")).split("-")
    except (ValueError, AttributeError):
        return ""
    return parts[1] if len(parts) == 4 and len(parts[1]) == 32 else ""


# Audit record keys as span attributes: OpenTelemetry's GenAI / MCP names where they exist.
SPAN_ATTRIBUTES = {
    "tool": "gen_ai.tool.name",
    "run_id": "kiwi.run_id",
    "directive": "kiwi.directive",
    "step": "kiwi.step",
    "origin": "kiwi.origin",
    "client": "kiwi.client",
    "call_seq": "kiwi.call_seq",
    "decision": "kiwi.decision",
    "reason": "kiwi.reason",
    "error_type": "error.type",
    "request_id": "kiwi.approval.request_id",
    "status": "kiwi.status",
    "duration_ms": "kiwi.duration_ms",
    "warnings": "kiwi.warnings",
}


def audit_span(record: dict[str, Any]) -> None:
    """An audit record as a span in the current trace: ``kiwi.tool_call`` with its decision and reason,
    ``kiwi.approval_requested``, ``kiwi.loop_warning``, ... (nothing when tracing is off)."""
    if (
        record.get("event") == "tool_call"
        and record.get("decision") == "allowed"
        and not record.get("warnings")
    ):
        # An allowed call is in the trace already (its activity's spans, and the front end's span says
        # the decision); a span per routine call would cost every call.
        return
    attributes = {"kiwi.event": str(record.get("event", ""))}
    for key, name in SPAN_ATTRIBUTES.items():
        if key in record:
            attributes[name] = record[key]
    if record.get("tool"):
        attributes["gen_ai.operation.name"] = "execute_tool"
    workflow_span(f"kiwi.{record.get('event', 'record')}", attributes)
