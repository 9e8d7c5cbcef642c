"""Serve an MCP SDK server over stdio as a server of the handshake era (2025-11-25 and before) does.

The npm servers speak that era; the Python SDK's servers speak 2026-07-28 to any client that opens with
it. Here the client's ``server/discover`` probe (which would open a 2026-07-28 connection) is answered
"method not found" before the server sees it, so the client falls back to ``initialize``: the test
servers started with ``--handshake`` get the calls Kiwi makes the short way (kiwi/upstream/stdio.py).
"""

import anyio
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage
from mcp.types import METHOD_NOT_FOUND, ErrorData, JSONRPCError


def serve_handshake_era(server) -> None:
    """Run ``server`` (an ``MCPServer``) over stdio, handshake era only."""
    anyio.run(_serve, server._lowlevel_server)


async def _serve(lowlevel) -> None:
    async with stdio_server() as (read_stream, write_stream):
        to_server, server_reads = anyio.create_memory_object_stream(0)

        async def sieve() -> None:
            async with to_server:
                async for item in read_stream:
                    message = getattr(item, "message", None)
                    if getattr(message, "method", None) == "server/discover":
                        error = ErrorData(code=METHOD_NOT_FOUND, message="Method not found")
                        await write_stream.send(
                            SessionMessage(JSONRPCError(jsonrpc="2.0", id=message.id, error=error))
                        )
                        continue
                    await to_server.send(item)

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(sieve)
            await lowlevel.run(server_reads, write_stream, lowlevel.create_initialization_options())
            tasks.cancel_scope.cancel()
