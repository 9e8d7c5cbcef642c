"""Secrets never leave the worker: ${VAR} values of MCP servers are scrubbed from everything a run
records or shows (results, errors, tool descriptions and schemas, audit, history, worker logs), and
secret-looking argument keys are redacted in audit and history."""

from __future__ import annotations

import json
import logging
import sys
import uuid

import pytest

from activities.audit import read_audit
from kiwi.guards import LEFT_OUT, REDACT_VALUES, REDACTED, is_secret_key, redact
from kiwi.upstream.pool import install_log_scrubber, remember_secrets
from tests.helpers import awaiting_step, directive_md, wait_for, write, write_directive

# An upstream server that puts what it was started with everywhere it can: descriptions, schema
# defaults, JSON-RPC error messages and tool errors.
LEAKY_SERVER = """
import os
import sys
from mcp.server.mcpserver import MCPServer
from mcp.shared.exceptions import MCPError

TOKEN = os.environ["UPSTREAM_TOKEN"]
print(f"leaky server starting with token {TOKEN}", file=sys.stderr, flush=True)
server = MCPServer(name="leaky")

@server.tool(description=f"Says who it is; authenticated with {TOKEN}")
def whoami(note: str = TOKEN) -> str:
    return f"token {TOKEN}, note {note}"

@server.tool(description="Refuses every request")
def refuse() -> str:
    raise MCPError(code=-32602, message=f"bad params for token {TOKEN}")

@server.tool(description="Fails")
def explode() -> str:
    raise RuntimeError(f"exploded holding {TOKEN}")

server.run("stdio")
"""


@pytest.mark.parametrize(
    ("key", "secret"),
    [
        ("password", True),
        ("db_passwd", True),
        ("pwd", True),
        ("api_key", True),
        ("apiKey", True),
        ("x-api-key", True),
        ("access_key", True),
        ("AWS_SECRET_ACCESS_KEY", True),
        ("client_secret", True),
        ("auth", True),
        ("auth_header", True),
        ("Authorization", True),
        ("bearer", True),
        ("cookie", True),
        ("Set-Cookie", True),
        ("session", True),
        ("refresh_token", True),
        ("private_key", True),
        ("credentials", True),
        ("passphrase", True),
        ("path", False),
        ("author", False),
        ("authority", False),
        ("session_id", False),
        ("sessionId", False),
        ("private", False),
        ("signature", False),
        ("key", False),
        ("topic", False),
        ("content", False),
        ("description", False),
        ("keyword", False),
    ],
)
def test_secret_looking_keys_are_redacted_and_ordinary_ones_kept(key, secret):
    assert is_secret_key(key) is secret
    assert (redact({key: "v"})[key] == REDACTED) is secret


def test_values_with_an_auth_scheme_are_redacted_wherever_they_are():
    assert redact({"headers": ["Bearer abcdefgh12345"], "note": "bearer of news"}) == {
        "headers": [REDACTED],
        "note": "bearer of news",
    }


def test_a_record_keeps_a_bounded_number_of_argument_values_and_nothing_past_them():
    """1.5 MB of arguments can be 750,000 values; copying them all held the worker's event loop 0.3 s."""
    hidden = f"past-{uuid.uuid4().hex}"
    args = {"items": [[] for _ in range(50)], "more": {f"k{i}": i for i in range(20)}, "late": hidden}
    kept = redact(args, limit=60)
    assert kept["items"] == [[]] * 50
    assert list(kept["more"]) == [f"k{i}" for i in range(8)] + [LEFT_OUT]  # 1 + 50 + 1 + 8 = 60 values
    assert kept["more"][LEFT_OUT] == "12 more keys left out"
    assert kept[LEFT_OUT] == "1 more keys left out" and hidden not in str(kept)
    assert redact(list(range(5)), limit=3) == [0, 1, 2, f"{LEFT_OUT} 2 more items left out"]
    # Secrets are redacted within the bound as before; the default bound keeps an ordinary call whole.
    assert redact({"token": "abc", "x": ["Bearer abcdefgh12345"]}, limit=3) == {
        "token": REDACTED,
        "x": [REDACTED],
    }
    huge = [[] for _ in range(750_000)]
    assert (
        len(redact(huge)) == REDACT_VALUES + 1
        and redact(huge)[-1] == f"{LEFT_OUT} 740000 more items left out"
    )


def test_worker_logs_never_show_known_secrets_or_credential_query_values(caplog):
    install_log_scrubber()
    secret = f"s3cr3t-{uuid.uuid4().hex}"
    remember_secrets({"KIWI_LOG_SECRET": secret})
    log = logging.getLogger("kiwi.upstream.pool")
    with caplog.at_level(logging.INFO):
        log.warning("connect to https://api.example.com/mcp?api_key=%s&x=1 failed", "AKIA-unknown-value")
        log.info("env has %s", secret)
        try:
            raise RuntimeError(f"failed with {secret}")
        except RuntimeError:
            log.exception("call failed")
    assert "AKIA-unknown-value" not in caplog.text and "api_key=[redacted]&x=1" in caplog.text
    assert secret not in caplog.text and "[secret KIWI_LOG_SECRET]" in caplog.text
    assert "failed with [secret KIWI_LOG_SECRET]" in caplog.text  # the traceback too


async def test_a_secret_appears_nowhere_a_run_records_or_shows(runs, project, monkeypatch, caplog, capfd):
    secret = f"tok-{uuid.uuid4().hex}"
    monkeypatch.setenv("KIWI_TEST_SECRET", secret)
    script = write(project / "leaky_server.py", LEAKY_SERVER)
    write(
        project / ".ai" / "config" / "mcp_registry.yaml",
        f"""\
mcps:
  leaky:
    command: {sys.executable}
    args: ["{script}"]
    env:
      UPSTREAM_TOKEN: ${{KIWI_TEST_SECRET}}
  broken:
    command: {sys.executable}
    cwd: /nonexistent/${{KIWI_TEST_SECRET}}/server
""",
    )
    write_directive(
        project / ".ai" / "directives" / "peek.md",
        directive_md(
            '<step name="work"><action>Look around.</action></step>',
            name="peek",
            tools='<tools><mcp name="leaky" required="true"/><mcp name="broken"/></tools>',
            permissions='<execute resource="mcp" name="leaky" actions="*"/>'
            '<execute resource="mcp" name="broken" actions="*"/>',
        ),
    )
    caplog.set_level(logging.INFO)
    run_id = await runs.start("peek", {})
    context = await runs.tool_context(run_id)
    await awaiting_step(runs, run_id, "work")
    shown = json.dumps(context.model_dump())
    assert "authenticated with [secret KIWI_TEST_SECRET]" in shown  # descriptions and schema defaults
    assert (
        not context.mcps["broken"].available and "[secret KIWI_TEST_SECRET]" in context.mcps["broken"].error
    )
    calls = {
        tool: await runs.call_tool(run_id, tool, {})
        for tool in ("leaky.whoami", "leaky.refuse", "leaky.explode", "broken.anything")
    }
    assert calls["leaky.whoami"].status == "ok"
    assert (
        calls["leaky.refuse"].status == "error"
        and "bad params for token [secret" in calls["leaky.refuse"].reason
    )
    assert calls["leaky.explode"].status == "error" and calls["leaky.explode"].error_type == "ToolFailed"
    assert calls["broken.anything"].error_type == "McpUnavailable"
    # What the server printed to its stderr reaches the worker's stderr scrubbed (a thread copies it).
    printed: list[str] = []

    async def scrubbed_line() -> bool:
        printed.append(capfd.readouterr().err)
        return "leaky server starting with token [secret KIWI_TEST_SECRET]" in "".join(printed)

    await wait_for(scrubbed_line, what="the server's stderr line, scrubbed, on the worker's stderr")
    status = await runs.status(run_id)
    await runs.cancel(run_id, "done")
    history = await runs.handle(run_id).fetch_history()
    recorded = {
        "results": json.dumps([c.model_dump() for c in calls.values()]),
        "tool context": shown,
        "status": status.model_dump_json(),
        "audit": json.dumps(read_audit(str(project), run_id)),
        "history": "\n".join(str(event) for event in history.events),
        "worker logs": caplog.text,
        "worker stderr (the server's)": "".join(printed),
    }
    for where, text in recorded.items():
        assert secret not in text, f"the secret leaked into the {where}"
    assert "[secret KIWI_TEST_SECRET]" in recorded["history"]


async def test_a_secret_an_agent_sends_in_a_calls_arguments_is_scrubbed_from_the_audit_trail(project):
    """README trial s33: `kiwi call everything.echo '{"message": "token is SECRET"}'` wrote the server's secret
    into the audit trail's record of the call (the answer was scrubbed). The audit writer scrubs every record
    of the secrets the worker resolved, as results are."""
    from temporalio.testing import ActivityEnvironment

    from activities.audit import AuditActivities
    from kiwi.contracts import AuditBatch

    secret = f"sk-{uuid.uuid4().hex}"
    remember_secrets({"DEMO_TOKEN": secret})
    record = {
        "seq": 1,
        "time": "2026-11-27T00:00:00+00:00",
        "event": "tool_call",
        "tool": "everything.echo",
        "arguments": {"message": f"token is {secret} ok", "nested": [secret]},
    }
    await ActivityEnvironment().run(
        AuditActivities().write_audit_records,
        AuditBatch(project_root=str(project), run_id="run-x-0123456789", records=[record]),
    )
    (written,) = read_audit(str(project), "run-x-0123456789")
    assert written["arguments"] == {
        "message": "token is [secret DEMO_TOKEN] ok",
        "nested": ["[secret DEMO_TOKEN]"],
    }
    assert (
        secret
        not in (project / ".ai" / "logs" / "audit" / "2026-11-27" / "run-x-0123456789.jsonl").read_text()
    )
