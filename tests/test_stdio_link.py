"""Kiwi's own stdio transport and its short tools/call path (kiwi/upstream/stdio.py), against real servers.

A proxied call to a stdio server of the handshake era (the npm servers, 2025-11-25) skips the MCP SDK's
request machinery: one JSON line out, its answer picked out of the pipe as it arrives. What the SDK did for
that call must still happen: progress reports, timeouts that retire the connection and tell the server,
the end of the server's output failing the calls in flight, requests the server sends in the middle of a
call answered, structured content checked against the tool's output schema, the server started with no
more of the worker's environment than the SDK gave it, and stopped (process group and all) when the
connection closes. tests/servers/raw_server.py misbehaves on request; server-everything is the real thing.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

import pytest

from kiwi.upstream import stdio
from kiwi.upstream.pool import McpPool, McpRefused, McpUnavailable
from tests.helpers import wait_for
from tests.test_mcp_servers import EVERYTHING, SERVERS, registry, text_of

RAW_SERVER = SERVERS / "raw_server.py"


@pytest.fixture
async def raw(project, tmp_path, monkeypatch):
    """A pool, the raw server's config and the log of every line the server received; the pool is closed
    after the test."""
    monkeypatch.setenv("AI_USER_SPACE", str(tmp_path / "user"))
    log = tmp_path / "raw.log"
    args = json.dumps([str(RAW_SERVER), str(log)])
    registry(
        project,
        f'mcps:\n  raw:\n    command: "{sys.executable}"\n    args: {args}\n    timeout: 2\n'
        "    env:\n      GIVEN: yes\n",
    )
    pool = McpPool()
    yield pool, pool.config(str(project), "raw"), log
    await pool.close()


def _received(log) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()]


async def _call(pool, project, config, tool, args=None, progress=None) -> dict:
    result, _ = await pool.call_tool(str(project), config, tool, args or {}, progress)
    return result


async def test_a_handshake_era_server_takes_the_short_path_and_a_modern_one_the_sdk(
    project, tmp_path, monkeypatch
):
    monkeypatch.setenv("AI_USER_SPACE", str(tmp_path / "user"))
    registry(
        project,
        f"mcps:\n  everything:\n    command: node\n    args: ['{EVERYTHING}', 'stdio']\n"
        f'  time:\n    command: "{sys.executable}"\n    args: ["-m", "mcp_server_time", "--local-timezone", "UTC"]\n',
    )
    pool = McpPool()
    try:
        everything = pool.config(str(project), "everything")
        assert text_of(await _call(pool, project, everything, "echo", {"message": "hi"})) == "Echo: hi"
        assert (await pool.connection(str(project), everything)).short_calls()
        # Concurrent calls on the one connection each get their own answer.
        answers = await asyncio.gather(
            *(_call(pool, project, everything, "echo", {"message": f"m{i}"}) for i in range(40))
        )
        assert [text_of(a) for a in answers] == [f"Echo: m{i}" for i in range(40)]
        # Structured content is checked against the tool's output schema on this path too, and passes.
        structured = await _call(
            pool, project, everything, "get-structured-content", {"location": "New York"}
        )
        assert structured["structuredContent"]["temperature"] == 33

        time_server = pool.config(str(project), "time")
        result = await _call(pool, project, time_server, "get_current_time", {"timezone": "UTC"})
        assert '"timezone": "UTC"' in text_of(result)
        connection = await pool.connection(str(project), time_server)
        assert connection.client.protocol_version == "2026-07-28" and not connection.short_calls()
    finally:
        await pool.close()


async def test_progress_reports_reach_the_call_in_order(project, raw):
    pool, config, _ = raw
    reports = []

    async def progress(value, total, message):
        reports.append((value, total, message))

    assert text_of(await _call(pool, project, config, "progress", {}, progress)) == "done"
    assert reports == [(1.0, 3.0, "step 1"), (2.0, 3.0, "step 2"), (3.0, 3.0, "step 3")]


async def test_a_timeout_tells_the_server_and_retires_the_connection(project, raw):
    pool, config, log = raw
    with pytest.raises(McpRefused, match="no answer within") as refused:
        await _call(pool, project, config, "hang")
    assert refused.value.type == "ToolTimeout"  # (not sent again: the server may have done it)
    hang = next(m for m in _received(log) if m.get("params", {}).get("name") == "hang")

    async def cancelled() -> list[dict]:
        # (The retired connection closes in the background: the server may log the notice a moment later.)
        return [m for m in _received(log) if m.get("method") == "notifications/cancelled"]

    notices = await wait_for(cancelled, what="the server to log the cancel notice")
    assert [m["params"]["requestId"] for m in notices] == [hang["id"]]
    # The next call goes to a fresh server process; the old one was stopped (its log shows a second start).
    assert text_of(await _call(pool, project, config, "echo", {"text": "after"})) == "after"
    assert [m["method"] for m in _received(log) if m.get("method") == "initialize"] == ["initialize"] * 2


async def test_a_server_dying_mid_call_fails_that_call_and_the_next_reconnects(project, raw):
    pool, config, log = raw
    assert text_of(await _call(pool, project, config, "echo", {"text": "before"})) == "before"
    with pytest.raises(McpUnavailable):
        await _call(pool, project, config, "exit")
    assert text_of(await _call(pool, project, config, "echo", {"text": "after"})) == "after"


async def test_the_server_may_ask_the_client_in_the_middle_of_a_call(project, raw):
    """A request from the server (here ``ping``) during a short call reaches the SDK, which answers it."""
    pool, config, log = raw
    assert text_of(await _call(pool, project, config, "ping")) == "the client answered ping"
    assert {"jsonrpc": "2.0", "id": "server-ping", "result": {}} in _received(log)


async def test_structured_content_breaking_the_output_schema_is_refused(project, raw):
    pool, config, _ = raw
    with pytest.raises(McpRefused, match="answer was refused"):
        await _call(pool, project, config, "bad_structure")
    # The call ran and the connection is sound: it stays.
    assert text_of(await _call(pool, project, config, "echo", {"text": "still"})) == "still"


async def test_attack_an_endless_line_cannot_fill_the_workers_memory(project, raw, monkeypatch):
    """A hostile server writing without newlines: past MAX_LINE_BYTES the connection is closed and the call
    fails, instead of the worker buffering until it runs out of memory."""
    monkeypatch.setattr(stdio, "MAX_LINE_BYTES", 4 * 1024 * 1024)
    pool, config, _ = raw
    with pytest.raises(McpUnavailable, match="Connection closed"):  # (not a timeout: the line ended it)
        await _call(pool, project, config, "flood")
    assert text_of(await _call(pool, project, config, "echo", {"text": "after"})) == "after"


async def test_attack_the_server_gets_no_more_of_the_workers_environment_than_the_sdk_gave(
    project, raw, monkeypatch
):
    monkeypatch.setenv("KIWI_WORKER_SECRET", "s3cr3t-value")
    pool, config, _ = raw
    names = set(text_of(await _call(pool, project, config, "env")).split())
    assert "KIWI_WORKER_SECRET" not in names and "GIVEN" in names
    # (LC_CTYPE: Python sets it in its own environment when it starts under the C locale, PEP 538.)
    assert names <= {"HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER", "GIVEN", "LC_CTYPE"}


async def test_a_server_ignoring_the_end_of_its_input_and_sigterm_is_killed_on_close(project, raw):
    pool, config, _ = raw
    assert text_of(await _call(pool, project, config, "sticky")) == "sticky"
    link = (await pool.connection(str(project), config)).link
    assert link is not None and link.pid is not None
    await pool.close()
    with pytest.raises(ProcessLookupError):
        os.kill(link.pid, 0)
