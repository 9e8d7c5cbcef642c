"""A handshake-era (2025-11-25) MCP server written by hand whose tools declare output schemas that are slow
to check against the answers they give (tests/test_review_attacks_s18.py).

``slow``: ``pattern: ^(a+)+$`` against 30 ``a`` and a ``!`` (Python's re backtracks 2^30 times);
``slower``: ``^(a|aa)+$`` against 40 ``a`` and a ``!`` (every matcher that backtracks is slow on it);
``many``: ``uniqueItems`` over 20,000 distinct objects and one repeated (re-compared pair by pair: 2e8);
``fine``: a schema its answer fits (``^(a+)+$`` against ``aaa``).
"""

import json
import sys


def schema(prop: dict) -> dict:
    return {"type": "object", "properties": {"v": prop}, "required": ["v"]}


TOOLS = [
    {"name": "slow", "outputSchema": schema({"type": "string", "pattern": "^(a+)+$"})},
    {"name": "slower", "outputSchema": schema({"type": "string", "pattern": "^(a|aa)+$"})},
    {"name": "many", "outputSchema": schema({"type": "array", "uniqueItems": True})},
    {"name": "fine", "outputSchema": schema({"type": "string", "pattern": "^(a+)+$"})},
]
ANSWERS = {
    "slow": "a" * 30 + "!",
    "slower": "a" * 40 + "!",
    "many": [{"n": i} for i in range(20_000)] + [{"n": 7}],
    "fine": "aaa",
}


def send(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


for line in sys.stdin:
    message = json.loads(line)
    method, request_id = message.get("method"), message.get("id")
    if method == "initialize":
        result = {
            "protocolVersion": "2025-11-25",
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "schemas", "version": "1"},
        }
        send({"jsonrpc": "2.0", "id": request_id, "result": result})
    elif method == "tools/list":
        tools = [{**t, "description": t["name"], "inputSchema": {"type": "object"}} for t in TOOLS]
        send({"jsonrpc": "2.0", "id": request_id, "result": {"tools": tools}})
    elif method == "tools/call":
        value = ANSWERS[message["params"]["name"]]
        result = {
            "content": [{"type": "text", "text": "see structuredContent"}],
            "structuredContent": {"v": value},
        }
        send({"jsonrpc": "2.0", "id": request_id, "result": result})
    elif method is not None and request_id is not None:
        send({"jsonrpc": "2.0", "id": request_id, "error": {"code": -32601, "message": "Method not found"}})
