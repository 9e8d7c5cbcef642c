"""The ``mcp`` item type of the front end: find and read tools of the configured MCP servers.

Search and load only list tools (through the front end's own pool, cached per the server's
schema TTL); calls always go through a run or the client's session workflow, where the policy
and the audit apply.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kiwi.errors import KiwiError
from kiwi.upstream.pool import McpPool, McpUnavailable


class McpCatalog:
    def __init__(self, project_root: Path, pool: McpPool | None = None) -> None:
        self.root = str(project_root)
        self.pool = pool or McpPool()
        # The server being listed now (servers are listed one at a time): whose stderr a line is.
        self.current = ""

    async def _tools(self, server: str) -> list[dict[str, Any]]:
        self.current = server
        config = self.pool.config(self.root, server)
        try:
            return await self.pool.list_tools(self.root, config)
        except McpUnavailable as exc:
            raise KiwiError(str(exc), hint=f"check the '{server}' entry of mcp_registry.yaml") from None

    async def search(self, query: str, limit: int = 10) -> dict[str, Any]:
        """Tools whose name or description contains every word of ``query``, across all servers."""
        registry = self.pool.registry(self.root)
        words = [w.lower() for w in query.split()]
        results: list[dict[str, Any]] = []
        unavailable: dict[str, str] = dict(registry.skipped)
        for name, config in sorted(registry.servers.items()):
            try:
                tools = await self._tools(name)
            except KiwiError as exc:
                unavailable[name] = exc.message
                continue
            for tool in tools:
                text = f"{name} {tool['name']} {tool.get('description', '')} {config.description}".lower()
                if all(w in text for w in words):
                    results.append(
                        {
                            "item_type": "mcp",
                            "item_id": f"{name}.{tool['name']}",
                            "server": name,
                            "tool": tool["name"],
                            "description": tool.get("description", ""),
                        }
                    )
        return {"results": results[:limit], "unavailable": unavailable}

    async def load(self, item_id: str) -> dict[str, Any]:
        """A server's tools (``item_id`` = server) or one tool's schema (``server.tool``)."""
        server, _, tool = item_id.partition(".")
        if not server:
            raise KiwiError("load(item_type='mcp') needs item_id: a server name or SERVER.TOOL")
        config = self.pool.config(self.root, server)
        tools = await self._tools(server)
        if tool:
            found = next((t for t in tools if t["name"] == tool), None)
            if found is None:
                raise KiwiError(
                    f"MCP server '{server}' offers no tool '{tool}'",
                    hint=f"its tools: {', '.join(t['name'] for t in tools) or 'none'}",
                )
            return {"item_type": "mcp", "item_id": item_id, "server": server, "tool": found}
        return {
            "item_type": "mcp",
            "item_id": server,
            "server": server,
            "description": config.description,
            "transport": config.type,
            "tools": [{**t, "name": f"{server}.{t['name']}"} for t in tools],
        }

    @staticmethod
    def tool_id(item_id: str, parameters: dict[str, Any]) -> str:
        """``server.tool`` from ``item_id``, or from ``item_id=server`` with ``parameters['tool']`` (the seed's form)."""
        if "." in item_id:
            return item_id
        tool = parameters.pop("tool", None)
        if not item_id or not isinstance(tool, str) or not tool:
            raise KiwiError(
                "execute(item_type='mcp', action='call') needs item_id='SERVER.TOOL' "
                "(or item_id='SERVER' with parameters.tool)"
            )
        return f"{item_id}.{tool}"
