"""A small MCP server (the official Python SDK) whose process dies once, in the middle of calls.

``wait`` calls hang until ``crash`` ends the process, which it does once ``expected`` of them are in
flight (and only once: it leaves its marker file behind, argument 1). After the crash every call answers
at once. The batch test uses it for a transport failure that hits every call of a batch.
"""

import asyncio
import os
import sys
from pathlib import Path

from mcp.server.mcpserver import MCPServer

marker = Path(sys.argv[1])
server = MCPServer(name="crashy")
in_flight = 0
arrived = asyncio.Condition()


@server.tool(description="Answer with the text; before the crash, hang until it")
async def wait(text: str) -> str:
    global in_flight
    if not marker.exists():
        async with arrived:
            in_flight += 1
            arrived.notify_all()
        await asyncio.Event().wait()  # ended by the crash
    return f"after the crash: {text}"


@server.tool(description="Once `expected` wait calls are in flight, end this process (the first time only)")
async def crash(expected: int) -> str:
    if marker.exists():
        return "crashed before"
    async with arrived:
        await arrived.wait_for(lambda: in_flight >= expected)
    marker.write_text("crashed\n")
    os._exit(1)


server.run("stdio")
