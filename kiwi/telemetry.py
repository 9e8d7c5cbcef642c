"""OpenTelemetry for Kiwi's processes: one trace from the agent's MCP request to the upstream tool.

Off unless asked for: ``KIWI_OTEL=1`` (what ``kiwi dev --otel`` sets) or an OTLP endpoint in
``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` turns it on (and
``OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`` alone turns metrics on, not traces);
``OTEL_SDK_DISABLED=true`` keeps it off. Everything else is the standard ``OTEL_*`` settings the
OpenTelemetry SDK reads itself: service name, resource attributes, sampler, headers, timeouts, and
``OTEL_EXPORTER_OTLP_PROTOCOL`` (``http/protobuf``, the default, or ``grpc``).

Traces: the MCP SDK continues a client's ``_meta.traceparent`` (server spans) and injects the
context into the requests it sends upstream (client spans); Temporal's ``TracingInterceptor`` carries
it through the client, the workflow and the activities. Kiwi's interceptor differs in one place: a
Workflow Update (every tool call) is a child of the caller's span, not of the span that started the
run, so an agent's request and everything it caused form one trace.

Metrics: Temporal's SDK metrics and Kiwi's own (``kiwi_*``, recorded through Temporal's replay-safe
metric meter) are exported over OTLP by Temporal's runtime.
"""

from __future__ import annotations

import atexit
import os
import sys
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from kiwi.errors import KiwiError

ON_VARIABLE = "KIWI_OTEL"
DEFAULT_HTTP_ENDPOINT = "http://127.0.0.1:4318"
DEFAULT_GRPC_ENDPOINT = "http://127.0.0.1:4317"
PROTOCOLS = ("http/protobuf", "grpc")

_active: dict[str, Any] = {}


def wanted(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process should export traces and metrics (see the module's docstring)."""
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    # (A metrics endpoint alone asks for metrics: trial F28, it turned nothing on.)
    return traces_wanted(env) or bool(env.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"))


def traces_wanted(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process should export traces: KIWI_OTEL, or an endpoint that traces go to (the general
    one or the traces one; a metrics endpoint alone turns metrics on, not traces to a default collector)."""
    env = os.environ if environ is None else environ
    if env.get(ON_VARIABLE, "").strip().lower() in ("1", "true", "on", "yes"):
        return True
    return bool(env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


def active() -> bool:
    """Whether :func:`setup` turned telemetry on in this process."""
    return bool(_active)


def protocol(signal: str = "TRACES", environ: Mapping[str, str] | None = None) -> str:
    env = os.environ if environ is None else environ
    value = (
        env.get(f"OTEL_EXPORTER_OTLP_{signal}_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL") or ""
    ).strip() or "http/protobuf"
    if value not in PROTOCOLS:
        raise KiwiError(
            f"OTEL_EXPORTER_OTLP_PROTOCOL is {value!r}; Kiwi exports OTLP as one of {', '.join(PROTOCOLS)}",
            hint="set OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf (port 4318) or grpc (port 4317)",
        )
    return value


def metrics_endpoint(environ: Mapping[str, str] | None = None) -> tuple[str, bool]:
    """Where Temporal's runtime sends metrics, and whether over HTTP (the SDK's rules for the URL)."""
    env = os.environ if environ is None else environ
    http = protocol("METRICS", env) == "http/protobuf"
    explicit = env.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")
    if explicit:
        return explicit, http
    base = env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or (
        DEFAULT_HTTP_ENDPOINT if http else DEFAULT_GRPC_ENDPOINT
    )
    return (base.rstrip("/") + "/v1/metrics" if http else base), http


def _headers(environ: Mapping[str, str]) -> dict[str, str]:
    raw = environ.get("OTEL_EXPORTER_OTLP_METRICS_HEADERS") or environ.get("OTEL_EXPORTER_OTLP_HEADERS") or ""
    headers = {}
    for part in raw.split(","):
        key, sep, value = part.partition("=")
        if sep and key.strip():
            from urllib.parse import unquote

            headers[key.strip()] = unquote(value.strip())
    return headers


def setup(service: str) -> bool:
    """Turn traces and metrics on for this process when :func:`wanted`; call before the first
    Temporal client is made. Idempotent. Returns whether telemetry is on."""
    if _active:
        return True
    if not wanted():
        return False
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME") or service})
    provider = tracer_provider(resource)
    if traces_wanted() and os.environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() != "none":
        provider.add_span_processor(BatchSpanProcessor(ScrubbingExporter(_span_exporter())))
    trace.set_tracer_provider(provider)
    _active["tracer_provider"] = provider
    if os.environ.get("OTEL_METRICS_EXPORTER", "").strip().lower() != "none":
        _start_runtime_metrics(service)
    atexit.register(shutdown)
    return True


def tracer_provider(resource: Any) -> Any:
    """Kiwi's tracer provider: no attribute shortened when it is set, before the exporter scrubs it (a token
    cut by OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT was exported in part: review s30); ScrubbingExporter shortens
    them to that limit after scrubbing."""
    from opentelemetry.sdk.trace import SpanLimits, TracerProvider

    unset = SpanLimits.UNSET
    return TracerProvider(
        resource=resource, span_limits=SpanLimits(max_attribute_length=unset, max_span_attribute_length=unset)
    )


class ScrubbingExporter:
    """A span exporter that hands ``inner`` each span without the secret values this process resolved (and
    without credential query values): an upstream error quoting its key reached the MCP client span's status
    as it was, while the run and the agent got ``[secret NAME]`` (kiwi.upstream.pool.scrub_text)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def export(self, spans: Any) -> Any:
        # (Always: credential query values are redacted before any secret is resolved too, review s30.)
        return self.inner.export([_scrubbed(span) for span in spans])

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


def _scrubbed(span: Any) -> Any:
    from opentelemetry.sdk.trace import Event, ReadableSpan
    from opentelemetry.trace import Link, Status

    from kiwi.upstream.pool import scrub_text

    limit = _attribute_limit()

    def text(v: str) -> str:
        return scrub_text(v)[:limit] if limit else scrub_text(v)

    def value(v: Any) -> Any:
        if isinstance(v, str):
            return text(v)
        if isinstance(v, list | tuple):  # (a sequence attribute: strings scrubbed one by one)
            return tuple(text(x) if isinstance(x, str) else x for x in v)
        return v

    def values(attributes: Any) -> dict[str, Any]:
        return {k: value(v) for k, v in (attributes or {}).items()}

    status = span.status
    if status.description:
        status = Status(status.status_code, scrub_text(status.description))
    return ReadableSpan(
        name=scrub_text(span.name),
        context=span.context,
        parent=span.parent,
        resource=span.resource,
        attributes=values(span.attributes),
        events=[Event(e.name, values(e.attributes), e.timestamp) for e in span.events],
        links=[Link(link.context, values(link.attributes)) for link in span.links],
        kind=span.kind,
        status=status,
        start_time=span.start_time,
        end_time=span.end_time,
        instrumentation_scope=span.instrumentation_scope,
    )


def _span_exporter() -> Any:
    if protocol() == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        except ImportError:
            raise KiwiError(
                "OTLP over gRPC needs the package opentelemetry-exporter-otlp-proto-grpc",
                hint="pip install 'kiwi-runtime[otel-grpc]', or export over HTTP "
                "(OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf)",
            ) from None
        return OTLPSpanExporter()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    if not (
        os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    ):
        return OTLPSpanExporter(endpoint=DEFAULT_HTTP_ENDPOINT + "/v1/traces")
    return OTLPSpanExporter()


def _start_runtime_metrics(service: str) -> None:
    """Temporal's runtime exports its metrics and Kiwi's (recorded through its metric meters)."""
    from temporalio.runtime import OpenTelemetryConfig, Runtime, TelemetryConfig

    url, http = metrics_endpoint()
    # Temporal's core names the metrics' resource (service.name) and every data point (service_name) from
    # OTEL_SERVICE_NAME, else "temporal-core-sdk": every Kiwi process's metrics landed under that name.
    os.environ.setdefault("OTEL_SERVICE_NAME", service)
    runtime = Runtime(
        telemetry=TelemetryConfig(
            metrics=OpenTelemetryConfig(
                url=url,
                http=http,
                headers=_headers(os.environ),
                metric_periodicity=timedelta(
                    milliseconds=int(os.environ.get("OTEL_METRIC_EXPORT_INTERVAL") or 10_000)
                ),
                durations_as_seconds=True,
            ),
            # (The core's own service_name on every data point said "temporal-core-sdk": the process's name
            # is the resource's, from OTEL_SERVICE_NAME above, and on every point through global_tags.)
            attach_service_name=False,
            global_tags={"service_name": os.environ["OTEL_SERVICE_NAME"]},
        )
    )
    Runtime.set_default(runtime, error_if_already_set=False)


def describe_endpoint() -> str:
    """Where traces go, for a start-up line."""
    kind = protocol()
    url = (
        os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or (DEFAULT_HTTP_ENDPOINT if kind == "http/protobuf" else DEFAULT_GRPC_ENDPOINT)
    )
    return f"{url} ({kind})"


# How long a process that ends waits for its last spans to be sent (trial F9: a collector that is down held
# every CLI command ~7 s, the exporter retrying).
FLUSH_SECONDS = 2.0


def shutdown(wait: float = FLUSH_SECONDS) -> None:
    """Flush what is buffered (spans end with the process otherwise), for at most ``wait`` seconds."""
    provider = _active.pop("tracer_provider", None)
    if provider is None:
        return
    import threading

    flushing = threading.Thread(target=provider.shutdown, name="kiwi-otel-flush", daemon=True)
    flushing.start()
    flushing.join(wait)
    if flushing.is_alive():
        # (What turned traces on, which is what turns them off: README trial s39 set KIWI_OTEL=1 alone and was
        # told to unset OTEL_EXPORTER_OTLP_ENDPOINT.)
        on = [
            name
            for name in (ON_VARIABLE, "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            if os.environ.get(name)
        ] or ["OTEL_EXPORTER_OTLP_ENDPOINT"]
        sys.stderr.write(
            f"kiwi: the last traces were not sent: {describe_endpoint()} took none within {wait:g} s (is the "
            f"collector running? unset {' and '.join(on)} to turn traces off)\n"
        )
        sys.stderr.flush()


def interceptors() -> list[Any]:
    """The Temporal client (and worker) interceptors: Kiwi's tracing one when telemetry is on."""
    if not _active:
        return []
    from kiwi.tracing import KiwiTracingInterceptor

    return [KiwiTracingInterceptor()]


def trace_url(trace_id: str) -> str:
    """Where an operator opens a trace: ``KIWI_TRACE_URL`` with ``{trace_id}`` (e.g. Jaeger's
    ``http://127.0.0.1:16686/trace/{trace_id}``), the id after a slash when it has no ``{trace_id}`` (README
    trial s39: `http://x/trace` printed that link alone, with no id), else ""."""
    template = os.environ.get("KIWI_TRACE_URL", "").strip()
    if not template or not trace_id:
        return ""
    if "{trace_id}" not in template:
        return f"{template.rstrip('/')}/{trace_id}"
    return template.replace("{trace_id}", trace_id)


def _attribute_limit() -> int | None:
    """OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT (or its span form), applied after scrubbing; None when unset."""
    for name in ("OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT", "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT"):
        raw = os.environ.get(name, "").strip()
        if raw.isdigit():
            return int(raw)
    return None
