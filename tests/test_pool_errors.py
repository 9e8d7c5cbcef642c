"""One call's failure on a shared upstream connection ends that call, not the calls in flight beside it.

The worker's pool shares one connection per server and project among every run on the worker. Any MCP
error used to drop it (for stdio, stop the server process): calls of other runs in flight on it lost their
answers, and their retries ran again calls the server had already done. Against a real MCP server (the
ledger server, which writes a line for every call it runs): an error answer leaves the connection as it
is; a call past the server's timeout retires the connection (the next call opens a fresh one, the old one
closes when its last call ends); only a broken transport drops it. Each runs against the server on both
protocol eras: 2026-07-28 (the MCP SDK's client makes the call) and 2025-11-25 (Kiwi's short tools/call
path over its own stdio transport, kiwi/upstream/stdio.py)."""

from __future__ import annotations

import asyncio
import json
import os
import sys

import pytest

from kiwi.upstream.pool import McpPool, McpRefused, McpUnavailable
from tests.test_mcp_servers import SERVERS, registry, text_of
from tests.test_review_attacks_s10 import _answers, _ledger_run, _lines
from workers.main import build_worker

LEDGER_SERVER = SERVERS / "ledger_server.py"


ERAS = {"modern": [], "handshake": ["--handshake"]}


@pytest.fixture(params=sorted(ERAS))
def era(request):
    return request.param


@pytest.fixture
def ledger(tmp_path, monkeypatch):
    monkeypatch.setenv("AI_USER_SPACE", str(tmp_path / "user"))
    return tmp_path / "ledger.txt"


def _pool(project, ledger, extra: str = "", era: str = "modern"):
    args = json.dumps([str(LEDGER_SERVER), str(ledger), *ERAS[era]])
    registry(project, f'mcps:\n  ledger:\n    command: "{sys.executable}"\n    args: {args}\n{extra}')
    pool = McpPool()
    return pool, pool.config(str(project), "ledger")


async def _short(pool, project, config) -> bool:
    """Whether the pool's connection to the server takes Kiwi's short tools/call path."""
    return (await pool.connection(str(project), config)).short_calls()


async def _text(pool, project, config, tool, args) -> str:
    result, _ = await pool.call_tool(str(project), config, tool, args)
    return text_of(result)


async def test_an_error_answer_leaves_the_calls_in_flight_beside_it(project, ledger, era):
    pool, config = _pool(project, ledger, era=era)
    release = ledger.with_suffix(".release")
    os.mkfifo(release)
    try:
        server_pid = await _text(pool, project, config, "pid", {"tag": "before"})
        assert await _short(pool, project, config) == (era == "handshake")
        held = asyncio.create_task(_text(pool, project, config, "hold", {"tag": "b"}))
        # Opening the FIFO returns once the server opened it: the held call is running at the server.
        writer = await asyncio.wait_for(asyncio.to_thread(open, release, "w"), 30)
        with writer:
            with pytest.raises(McpUnavailable, match="internal error a"):
                await _text(pool, project, config, "error", {"tag": "a"})
            writer.write("go\n")  # only now, after the error came back, may the held call answer
        assert await asyncio.wait_for(held, 30) == "held b until go"
        assert ledger.read_text().splitlines() == ["hold b", "error a"]
        assert await _text(pool, project, config, "pid", {"tag": "after"}) == server_pid
    finally:
        await pool.close()


async def test_a_call_past_the_timeout_retires_its_connection(project, ledger, era):
    pool, config = _pool(project, ledger, "    timeout: 1\n", era)
    try:
        first = await _text(pool, project, config, "pid", {"tag": "before"})
        assert await _short(pool, project, config) == (era == "handshake")
        with pytest.raises(McpRefused, match="no answer within 1s") as refused:
            await _text(pool, project, config, "slow", {"tag": "s", "seconds": 60})
        assert refused.value.type == "ToolTimeout"  # (never sent again: the server may have done it)
        # The server may be stuck: the next call goes to a fresh connection (a new process), and the old
        # one, with no call left in flight, is closed (its process has ended).
        assert await _text(pool, project, config, "pid", {"tag": "after"}) != first
        with pytest.raises(ProcessLookupError):
            os.kill(int(first), 0)
    finally:
        await pool.close()


async def test_a_batched_call_past_the_timeout_retires_its_connection(temporal_env, project, tmp_path):
    """In a batch too: the MCP client's timeout fires before the batch's own bound, so the connection whose
    server may be stuck is retired, not kept for every later call to time out on; the slow call answers
    ToolTimeout and is not made again (since s18: before, it was made again alone and ran twice)."""
    runs, run_id, queue, ledger = await _ledger_run(temporal_env, project, tmp_path, extra="    timeout: 2\n")
    calls = [("ledger.pid", {"tag": "p"}), ("ledger.slow", {"tag": "s", "seconds": 60})]
    first, slow = await _answers(temporal_env, runs, run_id, queue, calls)
    assert slow.status == "error" and slow.error_type == "ToolTimeout", slow
    assert _lines(ledger).count("slow s") == 1
    async with build_worker(temporal_env.client, queue, sandboxed=True):
        after = await runs.call_tool(run_id, "ledger.pid", {"tag": "q"})
    assert text_of(after.result) != text_of(first.result)


async def test_a_server_that_exits_at_start_is_said_to_and_where_its_reason_is(project, tmp_path):
    # A new-user trial: a server whose script is missing was "unavailable: ExceptionGroup: unhandled
    # errors in a TaskGroup (1 sub-exception)"; node's own "Cannot find module" went only to stderr.
    registry(
        project, f'mcps:\n  gone:\n    command: node\n    args: ["{tmp_path / "missing.js"}", "stdio"]\n'
    )
    pool = McpPool()
    try:
        with pytest.raises(McpUnavailable) as refused:
            await pool.connection(str(project), pool.config(str(project), "gone"))
    finally:
        await pool.close()
    said = str(refused.value)
    assert "MCP server 'gone' exited at start (exit code 1)" in said, said
    assert "its stderr says why" in said and "ExceptionGroup" not in said
