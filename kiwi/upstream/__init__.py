"""Upstream MCP servers: their configuration, the worker's connection pool, search over their tools."""
