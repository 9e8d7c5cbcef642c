"""Review s30 of where a secret goes: the forms it comes back in, and the places text is cut before it is
scrubbed. Each test is an attack or failure the review proved, and the safe outcome. The first runs against
the real stack (a Temporal server, Kiwi's worker, a real HTTP server); the rest call the scrubbers Kiwi runs
on every result, error, log line, server stderr line and exported span."""

from __future__ import annotations

import asyncio
import base64
import html
import json
import logging
import os
import re
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from temporalio.exceptions import ApplicationError

from kiwi.upstream import pool
from tests.helpers import agent_directive, loopback_http, wait_for
from tests.test_tool_types import api_tool, audited_calls, started

TOKEN = "kiwi-s30-token-5d1e9b07c4a2"


def _fragments(secret: str, size: int = 8) -> list[str]:
    """Every piece of ``secret`` ``size`` characters long: none may be seen."""
    return [secret[i : i + size] for i in range(len(secret) - size + 1)]


def _stderr_copied(monkeypatch, write) -> list[str]:
    """What Kiwi's copier of stdio servers' stderr hands on (pool._copy_scrubbed, the pieces it emits) of what
    ``write`` writes to the pipe, called with the pipe's writing end."""
    shown: list[str] = []
    monkeypatch.setattr(pool, "_STDERR_SINK", shown.append)
    read_fd, write_fd = os.pipe()
    copier = threading.Thread(target=pool._copy_scrubbed, args=(read_fd,))
    copier.start()
    with os.fdopen(write_fd, "wb") as server:
        write(server)
    copier.join(60)
    assert not copier.is_alive()
    return shown


@pytest.fixture
def echoing() -> Iterator[int]:
    """An HTTP server on 127.0.0.1 that answers 404 with the path it was asked for, as framework error pages
    do ("Cannot GET /path"); its port."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            raw = f"Cannot GET {urllib.parse.unquote(self.path)}".encode()
            self.send_response(404)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

    with loopback_http(Handler) as port:
        yield port


async def test_an_error_body_cut_across_a_secret_shows_no_part_of_it(runs, project, echoing, monkeypatch):
    """The API tool's URL holds its token in the path (`/bot${TOKEN}/{method}`, Telegram's form); the server's
    404 page echoes the path. The agent pads `method` so that the last 300 characters of the body, which the
    error quotes, begin inside the token: the tail was cut before it was scrubbed, so most of the token
    reached the agent, the audit trail and the run's history. Now the body is scrubbed first."""
    monkeypatch.setenv("KIWI_S30_API_TOKEN", TOKEN)
    api_tool(
        project,
        "bot",
        f"method: GET\nurl: http://127.0.0.1:{echoing}/bot${{KIWI_S30_API_TOKEN}}/{{method}}\n",
        "- {name: method, type: string, required: true}\n",
    )
    agent_directive(project, ["bot"], hosts=f"127.0.0.1:{echoing}")
    run_id = await started(runs)
    padding = "x" * (300 - 1 - len(TOKEN) // 2)  # (the cut falls in the token's middle)

    failed = await runs.call_tool(run_id, "bot", {"method": padding})

    assert failed.status == "error" and "404" in failed.reason and padding[:50] in failed.reason, failed
    await runs.cancel(run_id, "done")
    audit = await audited_calls(project, run_id, 1)
    history = await runs.handle(run_id).fetch_history()
    for where, text in {
        "history": "\n".join(str(event) for event in history.events),
        "audit": json.dumps(audit),
        "result": failed.model_dump_json(),
    }.items():
        seen = [piece for piece in _fragments(TOKEN) if piece in text]
        assert not seen, f"part of the secret reached the {where}: {seen}"


@pytest.fixture
def known(monkeypatch) -> dict[str, str]:
    """The secrets this process has resolved, empty for the test."""
    secrets: dict[str, str] = {}
    monkeypatch.setattr(pool, "KNOWN_SECRETS", secrets)
    return secrets


def test_a_secret_read_from_a_file_is_scrubbed_without_its_last_newline(known):
    """A secret file's value keeps its newline; the server strips it and echoes the token in a 401."""
    pool.remember_secrets({"GH_TOKEN": "ghp_R2d2C3po4Bb8Ee1Ff0Aa9\n"})

    assert pool.scrub_text("401 Bad credentials for ghp_R2d2C3po4Bb8Ee1Ff0Aa9") == (
        "401 Bad credentials for [secret GH_TOKEN]"
    )


@pytest.mark.parametrize(
    "shown",
    [
        lambda s: urllib.parse.quote(s, safe=""),
        lambda s: re.sub(r"%[0-9A-F]{2}", lambda m: m.group(0).lower(), urllib.parse.quote(s, safe="")),
        lambda s: urllib.parse.quote(s),  # (a path's `/` kept)
        lambda s: json.dumps(s).replace("/", "\\/"),  # (PHP's escaping)
        lambda s: json.dumps(s).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026"),
        lambda s: base64.b64encode(f"deploy:{s}".encode()).decode(),  # (an HTTP Basic header's value)
        lambda s: base64.urlsafe_b64encode(f"x{s}yz".encode()).decode(),
        lambda s: f"<p>{html.escape(s)}</p>",
    ],
    ids=["percent", "percent-lower", "path", "slash-escaped", "go-json", "basic", "base64url", "html"],
)
def test_a_secret_echoed_in_another_encoding_is_scrubbed(known, shown):
    """An upstream echoes a secret as its own code writes it: percent-encoded in lower case or keeping `/`,
    JSON with `\\/` or Go's `\\u003c`, in an HTTP Basic header, in base64 at any offset, HTML-escaped."""
    secret = "wJalrXUtnFEMI/K7MDENG+bPxRfi<&>CYEXAMPLEKEY"
    pool.remember_secrets({"AWS_SECRET": secret})
    text = f"upstream said: {shown(secret)}"

    scrubbed = pool.scrub_text(text)

    # (Left: the words around it, and in base64 the few characters that also hold the bytes beside it.)
    assert "[secret AWS_SECRET]" in scrubbed, scrubbed
    assert len(scrubbed.replace("[secret AWS_SECRET]", "")) <= len("upstream said: ") + 14, scrubbed
    assert not [piece for piece in _fragments(secret) if piece in scrubbed], scrubbed


def test_a_url_that_is_a_secret_is_scrubbed_in_the_urls_made_from_it(known):
    """`url: ${ZAP_MCP_URL}`: the whole URL is the secret, and the key is a segment of its path. The SSE
    server names another endpoint with the key in its path, and httpx writes the host in lower case: both
    reached the worker's log in clear. A URL's password and query values are scrubbed too."""
    pool.remember_secrets(
        {
            "ZAP_MCP_URL": "http://LOCALHOST:8080/api/mcp/s/k3yZ9aQ7wE4rT1yU6iO0/sse",
            "DB_URL": "postgresql://kiwi:hunter2-Db-Pass@db.internal:5432/app?sslkey=kq83hd72jfye",
        }
    )

    lines = [
        "POST http://127.0.0.1:40735/api/mcp/s/k3yZ9aQ7wE4rT1yU6iO0/messages/?session_id=abc",
        "GET http://localhost:8080/api/mcp/s/k3yZ9aQ7wE4rT1yU6iO0/sse",
        "auth failed for hunter2-Db-Pass",
        "bad key kq83hd72jfye",
    ]

    for line in lines:
        scrubbed = pool.scrub_text(line)
        assert "k3yZ9aQ7wE4rT1yU6iO0" not in scrubbed and "hunter2-Db-Pass" not in scrubbed, scrubbed
        assert "kq83hd72jfye" not in scrubbed and "[secret " in scrubbed, scrubbed
    assert pool.scrub_text("messages/?session_id=abc api mcp") == "messages/?session_id=abc api mcp"


@pytest.mark.parametrize(
    ("text", "hidden"),
    [
        ("https://h/x?refresh_token=r3fr35h&x=1", "r3fr35h"),
        ("https://h/x?client_secret=cl13nt&x=1", "cl13nt"),
        ("https://h/cb#access_token=fr4gm3nt", "fr4gm3nt"),
        ("https://b.s3/k?X-Amz-Signature=d34db33f&X-Amz-Security-Token=s3ss10n", "d34db33f"),
        ("postgresql://app:p4ssw0rd@db:5432/x", "p4ssw0rd"),
        # (Review s30, third round: names the second round's narrower rule let through.)
        ("https://apim.example/x?subscription-key=5f1c2e3d4b5a6978", "5f1c2e3d4b5a6978"),
        ("https://h/x?x-api-key=x4p1k3y&secret_key=s3cr3tk3y", "x4p1k3y"),
        ("DefaultEndpointsProtocol=https;AccountName=acme;AccountKey=Zm9vYmFy==", "Zm9vYmFy"),
        ("postgresql://app:S3cr#tPass@db:5432/app", "tPass"),
        ("postgresql://app:2024#Winter@db/x", "Winter"),  # (digits first: no port, review s30, fourth round)
        ("https://h/x?primary_key=pr1m4ryk3y", "pr1m4ryk3y"),
    ],
)
def test_credentials_in_a_url_are_redacted_whatever_their_source(known, text, hidden):
    """Credential query values the scrubber missed (a prefixed name, a fragment, S3's signature) and a URL's
    password, redacted where no secret is known (a log line, an error, a span)."""
    assert hidden not in pool.scrub_text(text) and "[redacted]" in pool.scrub_text(text)


def test_a_servers_stderr_is_scrubbed_across_the_cut_of_a_long_line_and_line_by_line(known, monkeypatch):
    """A stdio server's stderr was scrubbed 64 kB at a time and a line at a time: a token the cut split, and a
    PEM key printed a line at a time, reached the worker's log in clear."""
    token = "ghp_R2d2C3po4Bb8Ee1Ff0Aa9"
    key = "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcw\nggSjAgEAAoIBAQC7VJTUt9Us8cKj\n"
    pool.remember_secrets({"DEMO_TOKEN": token, "DEMO_KEY": key})

    def write(server) -> None:
        server.write(b"x" * (65_536 - 10) + f"TOKEN={token}\n".encode())  # (the cut in the token)
        # (Review s30, second round: a token wholly in the first piece, across where the piece is cut, which is
        # the longest form of a known secret before the piece's end.)
        longest = max(len(text.encode()) for text, _ in pool._secret_forms(pool.KNOWN_SECRETS))
        for at in (
            65_536 - longest - len(token) + 1,
            65_536 - longest - len(token) // 2,
            65_536 - longest - 1,
        ):
            server.write(b"y" * at + token.encode() + b"z" * 70_000 + b"\n")
        server.write(f"my key:\n{key}".encode())

    printed = "".join(_stderr_copied(monkeypatch, write))
    assert printed.count("x") == 65_536 - 10 and "TOKEN=[secret DEMO_TOKEN]" in printed, printed[-200:]
    assert printed.count("[secret DEMO_TOKEN]") == 4 and printed.count("z") == 3 * 70_000
    assert not [piece for piece in _fragments(token) if piece in printed]
    assert (
        "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcw" not in printed
        and "ggSjAgEAAoIBAQC7VJTUt9Us8cKj" not in printed
    )


def test_spans_are_scrubbed_before_any_secret_is_known_and_in_sequences(known):
    """The exporter scrubbed nothing until the process had resolved a secret (a span's `?api_key=` stayed),
    and never a sequence attribute or a link's attributes."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import Link, StatusCode

    from kiwi.telemetry import ScrubbingExporter

    sink = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(ScrubbingExporter(sink)))
    tracer = provider.get_tracer("s30")
    with tracer.start_as_current_span("first") as first:
        pass
    with tracer.start_as_current_span(
        "GET https://h/x?api_key=L1T3RALK3Y",
        links=[Link(first.get_span_context(), {"url": "https://h/?token=L1NKT0K3N"})],
    ) as span:
        span.set_attribute("urls", ("https://h/?token=S3QT0K3N", "plain"))
        span.set_status(StatusCode.ERROR, "refused https://h/?api_key=L1T3RALK3Y")
    exported = sink.get_finished_spans()[-1]

    shown = json.dumps(
        {
            "name": exported.name,
            "status": exported.status.description,
            "attributes": {k: list(v) if isinstance(v, tuple) else v for k, v in exported.attributes.items()},
            "links": [dict(link.attributes) for link in exported.links],
        }
    )
    for value in ("L1T3RALK3Y", "S3QT0K3N", "L1NKT0K3N"):
        assert value not in shown, shown
    assert "plain" in shown


def test_the_secret_forms_stay_few_enough_to_scrub_every_log_line(known):
    """What each secret adds to the forms every log line is searched for stays bounded (a log line is
    scrubbed on every record the process makes)."""
    pool.remember_secrets({f"S{i}": f"secret-value-{i:02d}-{'k' * 20}" for i in range(10)})

    forms = pool._secret_forms(pool.KNOWN_SECRETS)

    assert 10 < len(forms) <= 10 * 40, len(forms)
    assert all(len(text) >= 4 for text, _ in forms)


def test_a_url_secrets_password_is_scrubbed_decoded_as_it_is_sent(known):
    """Review s30, second round: `https://user:p%40ss%2Fw0rd-secret-123@host/sse` sends the password decoded
    (`p@ss/w0rd-secret-123`, in an HTTP Basic header), and only its encoded form was scrubbed."""
    pool.remember_secrets({"MCP_URL": "https://user:p%40ss%2Fw0rd-secret-123@mcp.example.com/sse"})

    said = pool.scrub_text("password authentication failed for p@ss/w0rd-secret-123")
    basic = pool.scrub_text("Basic " + base64.b64encode(b"user:p@ss/w0rd-secret-123").decode())

    assert "w0rd-secret" not in said and "[secret MCP_URL]" in said, said
    assert "[secret MCP_URL]" in basic, basic


def test_a_json_secrets_key_is_scrubbed_once_the_server_has_read_it(known):
    """A service account's file is one secret, a JSON document; a server that read it prints its private key,
    whole or a line at a time, which was no form of the document."""
    body = "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcw\nggSjAgEAAoIBAQC7VJTUt9Us8cKjMzEfYyjiWA4R"
    key = f"-----BEGIN PRIVATE KEY-----\n{body}\n-----END PRIVATE KEY-----\n"
    pool.remember_secrets({"SA_JSON": json.dumps({"type": "service_account", "private_key": key})})

    for text in (f"failed to load key: {key}", "line: ggSjAgEAAoIBAQC7VJTUt9Us8cKjMzEfYyjiWA4R"):
        scrubbed = pool.scrub_text(text)
        assert "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcw" not in scrubbed, scrubbed
        assert "ggSjAgEAAoIBAQC7VJTUt9Us8cKjMzEfYyjiWA4R" not in scrubbed, scrubbed


def test_no_ordinary_word_of_a_secret_replaces_text_in_results(known):
    """Review s30, second round: a URL secret's query values (`format=json`, `debug=true`), a weak URL
    password and a PEM key's armor line were each scrubbed wherever they were: results stopped being valid
    JSON. The key in the same URL, and a credential-named value, are scrubbed."""
    pool.remember_secrets(
        {
            "MCP_URL": "https://mcp.example.com/mcp?api_key=sk_live_51HqLyjWDarjtT1zdp7dc&format=json&debug=true",
            "PEM": "-----BEGIN RSA PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcw\n-----END RSA PRIVATE KEY-----",
        }
    )
    result = {
        "ok": True,
        "format": "json",
        "note": "-----BEGIN RSA PRIVATE KEY----- is a header",
        "flag": "true",
    }

    scrubbed = pool.scrub(result)

    assert scrubbed == result, scrubbed
    assert pool.scrub_text("key sk_live_51HqLyjWDarjtT1zdp7dc") == "key [secret MCP_URL]"


@pytest.mark.parametrize(
    "text",
    [
        "https://h/list?sort_key=name",
        "https://h/?monkey=1&turkey=a",
        "https://h/?pageToken=x",
        "http://host:8080?email=a@b.com",
    ],
)
def test_ordinary_query_values_are_not_redacted(known, text):
    """Review s30, second round: the widened credential names redacted `sort_key`, `monkey`, a page cursor,
    and an address's `@` read as a URL's password."""
    assert pool.scrub_text(text) == text


def test_a_secret_from_a_non_utf8_environment_breaks_no_log_line(known, caplog):
    """A value read from a non-UTF-8 environment holds lone surrogates (`\\udcff`): percent-encoding it raised,
    and every log record of the process with it, as the log factory scrubs each one."""
    pool.remember_secrets({"RAW": "r4w-s3cr3t-\udcff-value"})

    assert pool.scrub_text("got r4w-s3cr3t-\udcff-value") == "got [secret RAW]"
    with caplog.at_level("WARNING"):
        logging.getLogger("kiwi.test").warning("plain line")
    assert "plain line" in caplog.text


def test_an_error_quoting_a_servers_answer_is_scrubbed_before_it_is_cut(known):
    """Review s30, second round: a malformed answer of a stdio server, and a value its output schema refused,
    were quoted cut at 200 characters, then scrubbed: 24 of a token's 40 characters reached the agent."""
    from kiwi.upstream.schemacheck import _short
    from kiwi.upstream.stdio import _shown

    token = "ghp_16C7e42F292c6912E7710c838347Ae178B4a"
    pool.remember_secrets({"TOKEN": token})
    answer = ["x" * 180, token]

    for shown in (_shown(answer), _short(answer)):
        assert not [piece for piece in _fragments(token) if piece in shown], shown


async def test_a_local_tools_output_cut_at_its_limit_is_no_result(known, tmp_path, monkeypatch):
    """Review s30, second round: a local tool's output was cut at max_output_bytes, then scrubbed: a token it
    printed across the limit reached the result in part. Output past the limit now fails the call, saying so,
    and a failing tool's cut last line is left out of its message."""
    from activities.commands import CommandActivities
    from kiwi.contracts import LocalToolRequest, LocalToolSpec

    token = "ghp_16C7e42F292c6912E7710c838347Ae178B4a"
    monkeypatch.setenv("DEMO_TOKEN", token)
    (tmp_path / "tools").mkdir()
    script = tmp_path / "tools" / "leak.sh"
    script.write_text('printf "%0980d" 0\necho "token=$DEMO_TOKEN"\nexit "${1:-0}"\n')
    spec = LocalToolSpec(
        tool_id="leak", tool_type="bash", entrypoint=str(script), required_environment=["DEMO_TOKEN"]
    )
    request = LocalToolRequest(project_root=str(tmp_path), tool=spec, max_output_bytes=1000)

    with pytest.raises(ApplicationError) as failed:
        await CommandActivities().run_local_tool(request)

    assert "printed more than 1,000 bytes" in str(failed.value), failed.value
    assert not [piece for piece in _fragments(token) if piece in str(failed.value)]


async def test_an_approval_webhooks_secret_stays_in_the_worker(runs, project, monkeypatch):
    """A Slack-style webhook URL is itself a credential, and `approvals.webhook` went into the run's snapshot and
    the notice's activity input as written: into the history. `${NAME}` in it is now filled in by the worker,
    where the notice is sent; the history holds the placeholder."""
    from tests.test_humans import HARNESS, agent_waits, pending_approval, setup

    received: list[str] = []

    class Hook(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            self.rfile.read(int(self.headers["Content-Length"]))
            received.append(self.path)
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    hook = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=hook.serve_forever, daemon=True).start()
    monkeypatch.setenv("KIWI_S30_HOOK", "T0AAA-B0BBB-c0ccccccccccccccc")
    try:
        port = hook.server_address[1]
        setup(project, harness=HARNESS + f"  webhook: http://127.0.0.1:{port}/services/${{KIWI_S30_HOOK}}\n")
        (project / "notes").mkdir(exist_ok=True)
        (project / "notes" / "old.txt").write_text("old\n")
        run_id = await runs.start("tidy", {})
        await wait_for(lambda: agent_waits(runs, run_id), what="the agent step")
        deleting = asyncio.create_task(runs.call_tool(run_id, "filesystem.delete", {"path": "notes/old.txt"}))
        await wait_for(lambda: pending_approval(runs, run_id), what="the approval request")

        async def posted():
            return received

        await wait_for(posted, what="the webhook POST")
        assert received == ["/services/T0AAA-B0BBB-c0ccccccccccccccc"], received
        await runs.cancel(run_id, "done")
        deleting.cancel()
        history = "\n".join(str(event) for event in (await runs.handle(run_id).fetch_history()).events)
        assert "T0AAA-B0BBB-c0ccccccccccccccc" not in history
        assert "/services/${KIWI_S30_HOOK}" in history
    finally:
        hook.shutdown()
        hook.server_close()


def test_a_json_secrets_public_values_stay_and_its_short_credentials_go(known):
    """Review s30, third round: every key-like value of a service account's file became a part (its project,
    its client e-mail, Google's public token URI), so ordinary results lost them; and a short password in a
    JSON secret was no part at all. Now the values of its credential-named keys are parts, whatever their
    look, and only they."""
    pool.remember_secrets(
        {
            "SA": json.dumps(
                {
                    "project_id": "acme-prod-20240101",
                    "token_uri": "https://oauth2.googleapis.com/token",
                    "client_email": "bot@acme-prod-20240101.iam.gserviceaccount.com",
                    "password": "Tr0ub4dor&3",
                }
            ),  # fmt: skip
            "BEARER": "Bearer sk-live-4f9a1c7e2b8d6a3f0e5c9b7a",
            "HOOK": "https://hooks.example.com/acme-prod-eu-west-1/T0AAAB0BBBc0cccccccccccc",
        }
    )
    result = {
        "project": "acme-prod-20240101",
        "uri": "https://oauth2.googleapis.com/token",
        "region": "acme-prod-eu-west-1",
    }

    assert pool.scrub(result) == result
    assert pool.scrub_text("login failed: Tr0ub4dor&3") == "login failed: [secret SA]"
    assert (
        pool.scrub_text("upstream rejected sk-live-4f9a1c7e2b8d6a3f0e5c9b7a")
        == "upstream rejected [secret BEARER]"
    )
    assert pool.scrub_text("posted to /T0AAAB0BBBc0cccccccccccc") == "posted to /[secret HOOK]"


def test_a_malformed_answer_is_described_without_the_value_pydantic_quotes(known):
    """Review s30, third round: a server's malformed tools/list failed pydantic's validation, whose message
    quotes the value it refused shortened (head and tail), so a token's tail reached the run's history."""
    from pydantic import BaseModel, ValidationError

    token = "ghp_16C7e42F292c6912E7710c838347Ae178B4a"
    pool.remember_secrets({"TOKEN": token})

    class Tool(BaseModel):
        description: str

    with pytest.raises(ValidationError) as refused:
        Tool.model_validate({"description": ["Authorization: Bearer " + token + "x" * 300, "x"]})
    said = pool._describe(refused.value, "docs")

    assert "is unavailable: its answer is malformed: description" in said, said
    assert not [piece for piece in _fragments(token) if piece in said], said


def test_a_quote_in_a_secret_does_not_hide_it_from_a_quoted_answer(known):
    """Review s30, third round: a malformed answer is quoted with repr, which escapes a `'` in a password (a
    string that also holds `"`), and the escaped form was no form of the secret."""
    from kiwi.upstream.stdio import _shown

    pool.remember_secrets({"DB_PASSWORD": "k9'Fq2-pL7mZ-x4Rt8"})

    shown = _shown({"text": 'login failed for "app" with password k9\'Fq2-pL7mZ-x4Rt8'})

    assert "pL7mZ" not in shown and "[secret DB_PASSWORD]" in shown, shown


def test_spans_are_not_shortened_before_they_are_scrubbed(known, monkeypatch):
    """Review s30, third round: with OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT set, the SDK shortened an attribute when
    it was set, cutting a token the exporter then could not find. Kiwi's provider shortens nothing; the
    exporter shortens to the limit once it has scrubbed."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from kiwi.telemetry import ScrubbingExporter, tracer_provider

    monkeypatch.setenv("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "120")
    token = "ghp_8Kx2LqM4nR7tW1yZ3bC6dF9gH0jK5"
    pool.remember_secrets({"TOKEN": token})
    sink = InMemorySpanExporter()
    provider = tracer_provider(Resource.create({}))
    provider.add_span_processor(SimpleSpanProcessor(ScrubbingExporter(sink)))
    with provider.get_tracer("s30").start_as_current_span("call") as span:
        span.set_attribute("error.detail", "y" * 100 + f" token={token}")

    (exported,) = sink.get_finished_spans()
    shown = exported.attributes["error.detail"]
    assert not [piece for piece in _fragments(token, 6) if piece in shown], shown
    assert len(shown) == 120 and shown.startswith("y" * 100), shown


def test_a_credential_no_secret_names_is_not_split_at_the_cut_of_a_long_line(known, monkeypatch):
    """Review s30, third round: with no secret known, a `?X-Amz-Signature=...` the 64 kB cut split was printed in
    two halves, neither of which the pattern found. The cut now falls after a blank or a quote before it."""
    line = (
        b"x" * (65_536 - 30) + b" GET https://b.s3/k?X-Amz-Signature=6c5b4a39281706f5e4d3c2b1a0 " + b"y" * 100
    )

    printed = "".join(_stderr_copied(monkeypatch, lambda server: server.write(line)))
    assert "X-Amz-Signature=[redacted]" in printed and "6c5b4a39" not in printed and "f5e4d3c2" not in printed
    assert printed.count("x") == 65_536 - 30 and printed.count("y") == 100


def test_a_pretty_printed_json_secrets_words_are_no_parts(known):
    """Review s30, fourth round: a secret's key-like words were parts, and a pretty-printed service account's
    words are its quoted values (`"acme-prod-20240101",`): a result naming the project lost it. Only a secret
    that is neither JSON nor a URL gives its words; a webhook URL under a JSON secret's `webhook_url` is a part."""
    document = {
        "project_id": "acme-prod-20240101",
        "webhook_url": "https://hooks.example/T0A/B0B/c0c0c0c0c0c0",
    }
    pool.remember_secrets({"GCP": json.dumps(document, indent=2)})
    result = {"content": [{"type": "text", "text": '{"project": "acme-prod-20240101", "region": "eu"}'}]}

    assert pool.scrub(result) == result
    assert (
        pool.scrub_text("posting to https://hooks.example/T0A/B0B/c0c0c0c0c0c0") == "posting to [secret GCP]"
    )


def test_a_secret_that_repeats_itself_does_not_hold_a_servers_stderr(known, monkeypatch):
    """Review s30, fourth round: a secret whose text repeats (`abcabc...`) in a line without a newline walked the
    cut back to the start of every piece, and the whole stream was held (and scanned again) until its end. The
    cut goes back no further than twice the longest form: the pieces go out as they come."""
    pool.remember_secrets({"REPEATING": "abcabcabcabc"})

    shown = _stderr_copied(monkeypatch, lambda server: server.write(b"abc" * 200_000))

    assert len(shown) > 5, len(shown)
    assert max(len(piece) for piece in shown) < 2 * 65_536, max(len(piece) for piece in shown)
    assert "abcabcabcabc" not in "".join(shown)


def test_a_log_record_that_cannot_be_formatted_shows_no_secret_and_raises_nothing(known, capsys):
    """Review s30, fourth round: the fallback for a record whose arguments do not format raised out of the
    logger for an argument whose repr fails, and left dict arguments unscrubbed for logging's own report."""
    pool.remember_secrets({"KEY": "sk-live-SECRETVALUE1234567890"})

    class Unprintable:
        def __repr__(self) -> str:
            raise ValueError("no repr")

    record = logging.LogRecord("kiwi.test", logging.INFO, __file__, 1, "%(a)s %(b)s", None, None)
    record.args = {"a": "sk-live-SECRETVALUE1234567890"}
    pool.SecretLogFilter().filter(record)
    other = logging.LogRecord("kiwi.test", logging.INFO, __file__, 1, "%s %s", (Unprintable(),), None)
    pool.SecretLogFilter().filter(other)

    assert record.args == {"a": "'[secret KEY]'"}, record.args
    assert other.args == ("<unprintable>",), other.args


@pytest.mark.parametrize(
    "shown",
    [
        lambda s: html.escape(s).replace("&#x27;", "&#39;"),  # (Go's html/template, Ruby's CGI)
        lambda s: html.escape(s).replace("&#x27;", "&#039;"),  # (PHP's htmlspecialchars)
        lambda s: re.sub(
            r"\\u[0-9a-f]{4}", lambda m: "\\u" + m.group(0)[2:].upper(), json.dumps(s)
        ),  # (Java)
        lambda s: json.dumps(s, ensure_ascii=False),
        lambda s: urllib.parse.quote(urllib.parse.quote(s, safe=""), safe=""),  # (a URL inside a query value)
    ],
    ids=["html-39", "html-039", "json-upper-hex", "json-characters", "percent-twice"],
)
def test_a_secret_echoed_in_the_encodings_review_s30_left_is_scrubbed(known, shown):
    """Review s30, fourth round, left these: a quote as `&#39;`, a `\\u` escape in upper-case hex, JSON with its
    characters as they are, and percent-encoding twice. A secret holding a quote, a non-ASCII letter and a
    `/` is found in each."""
    secret = "p@ss'wörd-Zk83/Hd72\"Jf-9q4T"
    pool.remember_secrets({"DB_PASSWORD": secret})

    scrubbed = pool.scrub_text(f"upstream said: {shown(secret)}.")

    assert "[secret DB_PASSWORD]" in scrubbed, scrubbed
    assert not [piece for piece in _fragments(secret) if piece in scrubbed], scrubbed
