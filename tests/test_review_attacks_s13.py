"""Review s13: a hostile or broken stdio MCP server against Kiwi's own stdio transport (kiwi/upstream/stdio.py).

Each test is the attack, by a real server process (tests/servers/hostile_stdio_server.py, a handshake-era
server written by hand, so the short ``tools/call`` path is the one under attack), and what must hold: the
transport is no weaker than the MCP SDK's own stdio client, and keeps what the README promises (one call's
failure does not end the calls of other runs in flight on the shared connection).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys

import pytest

from kiwi.upstream.pool import McpConnection, McpPool, McpRefused, McpUnavailable
from kiwi.upstream.stdio import SDK_BACKLOG
from tests.helpers import wait_for
from tests.test_mcp_servers import SERVERS, registry, text_of

HOSTILE_SERVER = SERVERS / "hostile_stdio_server.py"


@pytest.fixture
async def hostile(project, tmp_path, monkeypatch):
    """A pool and the hostile server's config (a 3 s timeout); the pool is closed after the test."""
    monkeypatch.setenv("AI_USER_SPACE", str(tmp_path / "user"))
    args = json.dumps([str(HOSTILE_SERVER)])
    registry(
        project, f'mcps:\n  hostile:\n    command: "{sys.executable}"\n    args: {args}\n    timeout: 3\n'
    )
    pool = McpPool()
    yield pool, pool.config(str(project), "hostile")
    await pool.close()


@contextlib.asynccontextmanager
async def _a_call_held_at_the_server(pool, project, config):
    """A ``hold`` call in flight at the server while the body runs; then it is released and must answer,
    from the same server process as before (the connection was neither dropped nor retired under it)."""
    arrived = asyncio.Event()

    async def progress(value, total, message):
        arrived.set()

    pid = text_of(await _call(pool, project, config, "pid"))
    held = asyncio.create_task(_call(pool, project, config, "hold", {}, progress))
    await asyncio.wait_for(arrived.wait(), 5)  # the hold call is at the server
    yield
    assert text_of(await _call(pool, project, config, "release")) == "release"
    assert text_of(await asyncio.wait_for(held, 5)) == "released"
    assert text_of(await _call(pool, project, config, "pid")) == pid


async def _call(pool, project, config, tool, args=None, progress=None) -> dict:
    result, _ = await pool.call_tool(str(project), config, tool, args or {}, progress)
    return result


async def test_attack_json_nested_past_the_recursion_limit_does_not_wedge_the_connection(project, hostile):
    """A line nested 100 000 deep makes ``json.loads`` raise RecursionError (not a ValueError). It escaped
    ``pipe_data_received`` with the buffer untrimmed: every later chunk ran the lines before it again and
    stopped at it again, so no answer ever came through (each call timed out and its retry ran it again).
    The SDK's client parses with pydantic, whose recursion limit is a validation error. The line must be
    passed over like any other line that is not JSON-RPC, and the answer after it reach the call."""
    pool, config = hostile
    assert text_of(await _call(pool, project, config, "nested")) == "after nesting"
    assert text_of(await _call(pool, project, config, "nested", {"depth": 10})) == "after nesting"


async def test_attack_an_id_echoed_as_a_string_still_answers_the_call(project, hostile):
    """A server that echoes the request id as a string (``"1099511627777"``), and the progress token too:
    the SDK correlates both (``coerce_request_id``, as the TypeScript SDK does), so such a server worked
    through the SDK's client. The short path matched only integer ids: every call timed out, retired the
    connection, and was run again by its retry. It must get its answer and its progress report."""
    pool, config = hostile
    reports = []

    async def progress(value, total, message):
        reports.append((value, total, message))

    assert (await pool.connection(str(project), config)).short_calls()
    assert text_of(await _call(pool, project, config, "string_id", {}, progress)) == "string id"
    assert reports == [(1.0, 1.0, "half")]


@pytest.mark.parametrize("code", ["E_FAIL", None, 1e400, [1]])
async def test_attack_an_error_with_a_code_that_is_no_integer_leaves_the_calls_beside_it(
    project, hostile, code
):
    """An error answer whose ``code`` is a string, null, a number past float range or a list: ``int()`` of
    it raised ValueError/TypeError/OverflowError out of the short path, which the pool took for a broken
    transport and dropped the connection, stopping the server under the calls of other runs in flight on
    it (their retries ran again calls it had done). The SDK's client never surfaced such a line as an
    exception. It must fail that call alone, as an error answer does (README), and leave the server as it
    is: the call held at the server gets its answer, from the same process."""
    pool, config = hostile
    async with _a_call_held_at_the_server(pool, project, config):
        with pytest.raises(McpUnavailable, match="broken error"):
            await _call(pool, project, config, "bad_code", {"code": code})


async def test_attack_a_server_that_stops_reading_cannot_fill_the_workers_memory(project, hostile):
    """A server that never reads its input again: every request line was queued on the pipe transport
    without waiting for it to drain, so each call's arguments (and each timeout's cancel notice) stayed in
    the worker's memory for as long as the server lived, with no bound. The SDK's client awaits the pipe
    (``process.stdin.send``). The link must wait for the pipe to drain (within the call's timeout): what
    it holds for the server stays near one line, however many calls are made."""
    pool, config = hostile
    # (A first call has the SDK list the tools, whose output schemas it checks answers against.)
    assert text_of(await _call(pool, project, config, "pid"))
    assert text_of(await _call(pool, project, config, "deaf")) == "deaf"
    link = (await pool.connection(str(project), config)).link
    assert link is not None
    big = {"name": "pid", "arguments": {"blob": "x" * (1 << 20)}}
    outcomes = await asyncio.gather(
        *(link.request("tools/call", big, timeout=1) for _ in range(12)), return_exceptions=True
    )
    assert all("timed out" in str(o) for o in outcomes), outcomes
    queued = link._transport.get_pipe_transport(0).get_write_buffer_size()
    assert queued < 3 << 20, f"{queued} bytes queued for a server that does not read"


@pytest.mark.parametrize("short", [True, False], ids=["short-path", "sdk-path"])
async def test_attack_a_result_that_is_no_call_tool_result_leaves_the_calls_beside_it(
    project, hostile, monkeypatch, short
):
    """An answer whose result is a dict but no CallToolResult (``content`` a string): its pydantic
    ValidationError, a ValueError, reached the pool's catch-all for broken transports, which dropped the
    connection and stopped the server under the other runs' calls in flight (on both paths: the SDK's
    ``call_tool`` raises the same error). It is an answer the client refuses: that call fails as
    ToolFailed (it ran: not retried), and the call held at the server still gets its answer."""
    pool, config = hostile
    if not short:  # (the SDK's call, as with tracing on or a 2026-07-28 server)
        monkeypatch.setattr(McpConnection, "short_calls", lambda self: False)
    async with _a_call_held_at_the_server(pool, project, config):
        with pytest.raises(McpRefused, match="malformed result: content") as refused:
            await _call(pool, project, config, "bad_result")
        assert refused.value.type == "ToolFailed"


async def test_attack_a_flood_of_notices_during_a_short_call_neither_deadlocks_nor_piles_up(project, hostile):
    """Thousands of lines for the SDK (log notices, progress reports with forged tokens) ahead of a short
    call's answer: the pipe is paused while the SDK's backlog is full, and the answer behind them must
    still arrive (the SDK draining the backlog resumes the pipe), with the backlog bounded."""
    pool, config = hostile
    link = (await pool.connection(str(project), config)).link
    most = 0

    async def watch():
        nonlocal most
        while True:
            most = max(most, len(link._for_sdk))
            await asyncio.sleep(0)

    watcher = asyncio.create_task(watch())
    try:
        answers = await asyncio.gather(
            *(_call(pool, project, config, "chatter", {"count": 1500}) for _ in range(2))
        )
    finally:
        watcher.cancel()
    assert [text_of(a) for a in answers] == ["chatted", "chatted"]
    # The pipe was paused (the backlog reached SDK_BACKLOG), and held at most about one read past it.
    assert SDK_BACKLOG <= most < 5000, most


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie, killed but not yet reaped by init, is not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


async def test_attack_a_helper_left_in_the_servers_process_group_is_stopped_with_it(project, hostile):
    """A server forks a helper into its process group (which ignores the end of its input) and exits
    cleanly when its stdin closes. The README promises the whole process group is stopped with the
    connection: after the pool closes, the helper must not run on."""
    pool, config = hostile
    child = int(text_of(await _call(pool, project, config, "spawn")))
    try:
        assert _running(child)
        await pool.close()
        # (Since s19 the connection's end kills the server's whole group, leader gone or not: kiwi/lifetime.py.)
        await wait_for(lambda: _stopped(child), what="the helper to be stopped with its server", timeout=10)
    finally:
        if _running(child):
            os.kill(child, signal.SIGKILL)


async def _stopped(pid: int) -> bool:
    return not _running(pid)
