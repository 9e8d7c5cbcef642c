"""A handshake-era (2025-11-25) MCP server written by hand to attack Kiwi's own stdio transport.

Like tests/servers/raw_server.py (no SDK, every line chosen by the test), with the attacks of
tests/test_review_attacks_s13.py as tools: ``nested`` (a line of JSON nested far past Python's recursion
limit, then its answer), ``string_id`` (answers, and reports progress, with the id echoed as a string, as
the TypeScript SDK accepts), ``bad_code`` (an error answer whose ``code`` is not an integer), ``hold``
(a progress report on arrival, its ``message`` argument as the report's message, then no answer until a
``release`` call), ``release``, ``deaf`` (answers,
then never reads its input again), ``pid`` (its process id), ``chatter``
(a flood of log notices and forged progress reports, then its answer), ``bad_result`` (a result that is
no CallToolResult), ``spawn`` (forks a helper into its process group that outlives it; the server itself
exits when its input ends).
"""

import json
import os
import signal
import sys

TOOLS = [
    {"name": name, "description": name, "inputSchema": {"type": "object"}}
    for name in (
        "nested",
        "string_id",
        "bad_code",
        "hold",
        "release",
        "deaf",
        "pid",
        "chatter",
        "bad_result",
        "spawn",
    )
]


def send(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def text(request_id, value: str) -> None:
    send({"jsonrpc": "2.0", "id": request_id, "result": {"content": [{"type": "text", "text": value}]}})


held = None  # the id of a hold call waiting for release

for line in sys.stdin:
    message = json.loads(line)
    method, request_id = message.get("method"), message.get("id")
    if method == "initialize":
        result = {
            "protocolVersion": "2025-11-25",
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "hostile", "version": "1"},
        }
        send({"jsonrpc": "2.0", "id": request_id, "result": result})
    elif method == "tools/list":
        send({"jsonrpc": "2.0", "id": request_id, "result": {"tools": TOOLS}})
    elif method == "tools/call":
        params = message["params"]
        name, args = params["name"], params.get("arguments") or {}
        if name == "nested":
            depth = int(args.get("depth", 100_000))
            sys.stdout.write("[" * depth + "]" * depth + "\n")
            text(request_id, "after nesting")
        elif name == "string_id":
            token = (params.get("_meta") or {}).get("progressToken")
            if token is not None:
                progress = {"progressToken": str(token), "progress": 1, "total": 1, "message": "half"}
                send({"jsonrpc": "2.0", "method": "notifications/progress", "params": progress})
            text(str(request_id), "string id")
        elif name == "bad_code":
            error = {"code": args.get("code"), "message": "broken error"}
            send({"jsonrpc": "2.0", "id": request_id, "error": error})
        elif name == "hold":
            held = request_id
            token = params["_meta"]["progressToken"]
            send(
                {
                    "jsonrpc": "2.0",
                    "method": "notifications/progress",
                    "params": {"progressToken": token, "progress": 0, "message": args.get("message")},
                }
            )
        elif name == "release":
            text(held, "released")
            text(request_id, "release")
        elif name == "deaf":
            text(request_id, "deaf")
            while True:  # never reads its input again (SIGTERM ends it)
                signal.pause()
        elif name == "chatter":
            for i in range(int(args.get("count", 20_000))):
                note = {"level": "info", "data": f"note {i}"}
                send({"jsonrpc": "2.0", "method": "notifications/message", "params": note})
                forged = {"progressToken": i, "progress": 0.5}
                send({"jsonrpc": "2.0", "method": "notifications/progress", "params": forged})
            text(request_id, "chatted")
        elif name == "bad_result":
            send({"jsonrpc": "2.0", "id": request_id, "result": {"content": "no list"}})
        elif name == "spawn":
            child = os.fork()
            if child == 0:  # a helper in the server's process group that outlives it, deaf to its input
                os.close(0)
                os.close(1)
                while True:
                    signal.pause()
            text(request_id, str(child))
        elif name == "pid":
            text(request_id, str(os.getpid()))
    elif method is not None and request_id is not None:
        send({"jsonrpc": "2.0", "id": request_id, "error": {"code": -32601, "message": "Method not found"}})
