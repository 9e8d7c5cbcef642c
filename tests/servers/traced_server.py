"""A small MCP server (the official Python SDK) that exports its own spans over OTLP/HTTP.

The SDK continues the trace context a client sends in ``_meta`` (``traceparent``), so its server span
for a ``tools/call`` lands in the caller's trace: the tracing tests read it from their OTLP receiver to
show the upstream server received the same trace. Argument: the OTLP endpoint (``http://host:port``);
then ``--handshake`` to serve as a 2025-11-25 server (tests/servers/handshake.py), whose calls Kiwi makes
the short way (kiwi/upstream/stdio.py).
"""

import os
import sys
import time

from mcp.server.mcpserver import MCPServer
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

provider = TracerProvider(resource=Resource.create({"service.name": "upstream"}))
provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=sys.argv[1] + "/v1/traces")))
trace.set_tracer_provider(provider)

server = MCPServer(name="traced")


@server.tool(description="Echo the text back")
def echo(text: str) -> str:
    return f"echo: {text}"


@server.tool(
    description="Append a line (this process's id) to the marker file; the first call then hangs (to be killed)"
)
def hold(marker: str) -> str:
    with open(marker, "a") as f:
        f.write(f"called {os.getpid()}\n")
    with open(marker) as f:
        calls = len(f.readlines())
    if calls == 1:
        time.sleep(600)
    return f"call {calls}"


if "--handshake" in sys.argv[2:]:
    from handshake import serve_handshake_era

    serve_handshake_era(server)
else:
    server.run("stdio")
