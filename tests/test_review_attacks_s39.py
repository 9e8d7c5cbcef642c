"""Attacks from the hostile reviews of session 39, each sent through the real stack."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.helpers import wait_for
from tests.test_mcp_servers import mcp_directive, registry, waiting
from tests.test_secret_forms import _fragments
from tests.test_tool_types import audited_calls

TOKEN = "ghp_Q8w7E6r5T4y3U2i1O0pAsDfGhJkL9z8X7c6V"


@pytest.fixture
def reflecting() -> Iterator[int]:
    """An HTTP server on 127.0.0.1 answering every POST 200 `application/json` with a body that is no JSON and
    holds the request's X-Api-Key header at both ends, as a proxy reflecting the request into a broken answer
    would; its port."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            key = self.headers.get("X-Api-Key", "")
            raw = ("{" + key + " not json " + "P" * 200 + " tail " + key).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


async def test_an_http_servers_malformed_answer_shows_no_part_of_a_reflected_secret(
    runs, project, reflecting, monkeypatch
):
    """Hostile review s39: an HTTP MCP server's answer that is no JSON failed the SDK's parse, whose message
    quotes the body cut to its head and tail; the header's token reflected at both ends of the body was no
    longer whole where it was scrubbed, and head and tail together rebuilt it in the agent's answer, the audit
    trail, the worker's log and the run's history. What pydantic quotes is no longer shown."""
    monkeypatch.setenv("KIWI_S39_KEY", TOKEN)
    registry(
        project,
        "mcps:\n  webbad:\n    type: streamable-http\n"
        f"    url: http://127.0.0.1:{reflecting}/mcp\n    headers: {{X-Api-Key: '${{KIWI_S39_KEY}}'}}\n",
    )
    mcp_directive(
        project,
        "probe",
        tools='<mcp name="webbad"><tool>x</tool></mcp>',
        permissions='<execute resource="mcp" name="webbad" actions="x"/>',
        body='<step name="work"><action>Call it.</action></step>',
    )
    run_id = await runs.start("probe", {})
    await wait_for(lambda: waiting(runs, run_id), what="the agent step")

    failed = await runs.call_tool(run_id, "webbad.x", {})

    assert failed.status == "error" and "MCP server 'webbad' is unavailable" in failed.reason, failed
    await runs.cancel(run_id, "done")
    audit = await audited_calls(project, run_id, 1)
    history = await runs.handle(run_id).fetch_history()
    for where, text in {
        "history": "\n".join(str(event) for event in history.events),
        "audit": json.dumps(audit),
        "answer": failed.model_dump_json(),
    }.items():
        seen = [piece for piece in _fragments(TOKEN) if piece in text]
        assert not seen, f"part of the secret reached the {where}: {seen}"
    assert "Invalid JSON" in failed.reason and "input_value not shown" in failed.reason, failed.reason
