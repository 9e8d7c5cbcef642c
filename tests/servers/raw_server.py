"""An MCP server of the handshake era (2025-11-25) written by hand, line by line, to misbehave on request.

No SDK: it answers ``initialize``, ``tools/list`` and ``tools/call`` itself, so a test decides exactly what
goes down the pipe, which is what Kiwi's own stdio transport (kiwi/upstream/stdio.py) must survive. Every
line it receives is appended to the log (argument 1), so a test can see what the client sent (a
``notifications/cancelled`` after a timeout, its answer to the server's own ``ping``).

Tools: ``echo`` (answers its text), ``env`` (the names in its environment), ``progress`` (three progress
reports, then its answer), ``hang`` (never answers), ``flood`` (an endless line), ``exit`` (the process
ends mid-call), ``ping`` (asks the client ``ping`` and answers once the client answered), ``bad_structure``
(structured content that breaks its own output schema), ``sticky`` (from then on the process ignores the
end of its input and SIGTERM alike).
"""

import json
import os
import signal
import sys

log = open(sys.argv[1], "a", buffering=1)  # noqa: SIM115 - open for the process's life

TOOLS = [
    {"name": name, "description": name, "inputSchema": {"type": "object"}}
    for name in ("echo", "env", "progress", "hang", "flood", "exit", "ping", "sticky")
] + [
    {
        "name": "bad_structure",
        "description": "structured content that breaks the schema",
        "inputSchema": {"type": "object"},
        "outputSchema": {"type": "object", "properties": {"n": {"type": "number"}}, "required": ["n"]},
    }
]


def send(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def text(request_id, value: str) -> None:
    send({"jsonrpc": "2.0", "id": request_id, "result": {"content": [{"type": "text", "text": value}]}})


waiting_ping = None  # the id of a tools/call waiting for the client's answer to our ping
sticky = False

for line in sys.stdin:
    log.write(line)
    message = json.loads(line)
    method, request_id = message.get("method"), message.get("id")
    if method is None and request_id == "server-ping" and waiting_ping is not None:
        text(waiting_ping, "the client answered ping")
        waiting_ping = None
    elif method == "initialize":
        send(
            {
                "jsonrpc": "2.0",
                "id": request_id,
                "result": {
                    "protocolVersion": "2025-11-25",
                    "capabilities": {"tools": {}},
                    "serverInfo": {"name": "raw", "version": "1"},
                },
            }
        )
    elif method == "tools/list":
        send({"jsonrpc": "2.0", "id": request_id, "result": {"tools": TOOLS}})
    elif method == "ping":
        send({"jsonrpc": "2.0", "id": request_id, "result": {}})
    elif method == "tools/call":
        params = message["params"]
        name, args = params["name"], params.get("arguments") or {}
        if name == "echo":
            text(request_id, str(args.get("text", "")))
        elif name == "env":
            text(request_id, " ".join(sorted(os.environ)))
        elif name == "progress":
            token = params["_meta"]["progressToken"]
            for step in (1, 2, 3):
                send(
                    {
                        "jsonrpc": "2.0",
                        "method": "notifications/progress",
                        "params": {
                            "progressToken": token,
                            "progress": step,
                            "total": 3,
                            "message": f"step {step}",
                        },
                    }
                )
            text(request_id, "done")
        elif name == "flood":
            while True:
                sys.stdout.write("x" * 65536)
                sys.stdout.flush()
        elif name == "exit":
            os._exit(3)
        elif name == "ping":
            waiting_ping = request_id
            send({"jsonrpc": "2.0", "id": "server-ping", "method": "ping"})
        elif name == "bad_structure":
            result = {"content": [{"type": "text", "text": "n"}], "structuredContent": {"n": "not a number"}}
            send({"jsonrpc": "2.0", "id": request_id, "result": result})
        elif name == "sticky":
            sticky = True
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            text(request_id, "sticky")
        # hang: no answer, ever
    elif method is not None and request_id is not None:
        send({"jsonrpc": "2.0", "id": request_id, "error": {"code": -32601, "message": "Method not found"}})

while sticky:
    signal.pause()
