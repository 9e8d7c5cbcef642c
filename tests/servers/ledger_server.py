"""A small MCP server (the official Python SDK) that keeps a ledger of the calls it ran.

Every call appends a line ``TOOL TAG`` to the ledger file (argument 1) before it does anything else, so a
test counts how many times each call really ran, whatever the run answered. The review attacks on batched
calls use it: a slow call beside quick ones, large answers, a secret in answers and errors. ``hold``
answers once a line is written to the FIFO ``LEDGER.release``, so a test knows a call is in flight (its
write returns once the server opened the FIFO) and decides when it ends, without waiting on a clock.

With ``--handshake`` after the ledger it is a server of the handshake era (2025-11-25 and before, as the npm
servers are; tests/servers/handshake.py), and Kiwi's short ``tools/call`` path (kiwi/upstream/stdio.py)
serves its calls instead of the SDK's request machinery.
"""

import asyncio
import os
import sys
from pathlib import Path

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.shared.exceptions import MCPError
from mcp.types import INTERNAL_ERROR, INVALID_PARAMS

ledger = Path(sys.argv[1])
server = MCPServer(name="ledger")


def _note(tool: str, tag: str) -> None:
    with ledger.open("a") as f:
        f.write(f"{tool} {tag}\n")


@server.tool(description="Note the call; answer at once")
async def count(tag: str) -> str:
    _note("count", tag)
    return f"counted {tag}"


@server.tool(
    description="Note the call; the first call with this tag answers after `seconds`, later ones at once"
)
async def slow(tag: str, seconds: float) -> str:
    first = f"slow {tag}\n" not in (ledger.read_text() if ledger.exists() else "")
    _note("slow", tag)
    if first:
        await asyncio.sleep(seconds)
    return f"slept {tag}"


@server.tool(description="Note the call; answer with `size` characters")
async def big(tag: str, size: int) -> str:
    _note("big", tag)
    return tag[0] * size


@server.tool(description="Note the call; answer with the server's token (from its environment)")
async def token(tag: str) -> str:
    _note("token", tag)
    return f"token is {os.environ.get('LEDGER_TOKEN', '')}"


@server.tool(description="Note the call; fail with a message naming the server's token")
async def fail(tag: str) -> str:
    _note("fail", tag)
    raise ToolError(f"refused with token {os.environ.get('LEDGER_TOKEN', '')}")


@server.tool(description="Note the call; refuse it (a JSON-RPC error) with a message of `size` characters")
async def refuse(tag: str, size: int) -> str:
    _note("refuse", tag)
    raise MCPError(code=INVALID_PARAMS, message="r" * size)


@server.tool(description="Note the call; answer once a line is written to the FIFO LEDGER.release")
async def hold(tag: str) -> str:
    _note("hold", tag)
    line = await asyncio.to_thread(lambda: ledger.with_suffix(".release").read_text())
    return f"held {tag} until {line.strip()}"


@server.tool(description="Note the call; answer with a JSON-RPC internal error (the connection is sound)")
async def error(tag: str) -> str:
    _note("error", tag)
    raise MCPError(code=INTERNAL_ERROR, message=f"internal error {tag}")


@server.tool(description="Note the call (its tag's length only); answer with that length")
async def length(tag: str) -> str:
    _note("length", str(len(tag)))
    return f"{len(tag)} characters"


@server.tool(description="Answer with this server process's id")
async def pid(tag: str) -> str:
    return str(os.getpid())


if "--handshake" in sys.argv[2:]:
    from handshake import serve_handshake_era

    serve_handshake_era(server)
else:
    server.run("stdio")
