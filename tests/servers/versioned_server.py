"""A small MCP server (the official Python SDK) whose one tool's schema comes from a file.

The tests change the file and restart the server to show a schema change reaching a run.
"""

import json
import sys
from pathlib import Path

from mcp.server.mcpserver import MCPServer

schema_file = Path(sys.argv[1])
fields = json.loads(schema_file.read_text())
server = MCPServer(name="versioned")

if "volume" in fields:

    @server.tool(description="Order a drink")
    def order(drink: str, volume: int) -> str:
        return f"{volume} ml of {drink}"
else:

    @server.tool(description="Order a drink")
    def order(drink: str) -> str:
        return f"one {drink}"


server.run("stdio")
