"""Review attacks (session 11) on the task budget (workflows/directive_run/task_budget.py), the MCP pool's
connection handling (kiwi/upstream/pool.py) and rate limits of kiwi-mcp.execute, against the real stack:
a Temporal dev server, real MCP servers, a real project. Calls are made to land in one workflow task the
way tests/test_batches.py does (admitted while no worker runs)."""

from __future__ import annotations

import asyncio
import os
import sys
import uuid

import pytest
from temporalio.client import WorkflowExecutionStatus

from kiwi.errors import KiwiError
from kiwi.items.store import ItemStore
from kiwi.runs import RunClient
from kiwi.upstream.pool import McpPool, McpRefused, McpUnavailable
from tests.helpers import write
from tests.test_batches import _admitted, _run_waiting
from tests.test_kiwi_mcp_tools import kiwi_directive
from tests.test_mcp_servers import SERVERS, registry, text_of
from tests.test_review_attacks_s10 import _ledger_run, _lines, _replays
from workers.main import build_worker


async def _terminated_reason(runs: RunClient, run_id: str) -> str:
    """Why Temporal ended the run (its terminated event's reason, and a failed task's message), if it did."""
    reasons = []
    async for event in runs.handle(run_id).fetch_history_events():
        if event.HasField("workflow_task_failed_event_attributes"):
            reasons.append(event.workflow_task_failed_event_attributes.failure.message[:200])
        if event.HasField("workflow_execution_terminated_event_attributes"):
            reasons.append(event.workflow_execution_terminated_event_attributes.reason)
    return "; ".join(reasons)


# ---------------------------------------------------------------- task budget: what it does not count


async def test_loads_of_large_items_in_one_task_do_not_end_the_run(temporal_env, project):
    """Attack: kiwi-mcp.load reads an item in a local activity that does not go through ``_within_budget``:
    its answer (a marker in the task) is not reserved or counted, only the update's completion is. Three
    loads of ~950 KB knowledge items admitted together: three markers (2.85 MB) plus three completions
    (2.85 MB, all counted as fitting) in one task's completion: Temporal ends the run."""
    for n in "abc":
        write(
            project / ".ai" / "knowledge" / f"big-{n}.md",
            f"---\nzettel_id: big-{n}\ntitle: big {n}\n---\n" + n * 950_000 + "\n",
        )
    kiwi_directive(project, "loader", '<execute resource="kiwi-mcp" action="load"/>')
    queue = f"kiwi-s11-{uuid.uuid4().hex[:8]}"
    runs, run_id = await _run_waiting(temporal_env, project, queue, "loader")
    calls = [("kiwi-mcp.load", {"item_type": "knowledge", "item_id": f"big-{n}"}) for n in "abc"]
    tasks = await _admitted(runs, run_id, calls)
    async with build_worker(temporal_env.client, queue, sandboxed=True):
        done, _ = await asyncio.wait(tasks, timeout=60)
        described = await runs.handle(run_id).describe()
        reason = await _terminated_reason(runs, run_id)
        assert described.status == WorkflowExecutionStatus.RUNNING, (described.status, reason)
        assert len(done) == 3, reason
        results = [t.result() for t in tasks]
        assert [r.result["content"].count(n) >= 950_000 for r, n in zip(results, "abc", strict=True)] == [
            True
        ] * 3, [r.reason for r in results]
    await _replays(runs, run_id)


async def test_large_calls_from_several_clients_admitted_together_do_not_end_the_run(
    temporal_env, project, tmp_path
):
    """Attack: each RunClient sends one large call per run at a time, but every `kiwi call` process and every
    front end has a RunClient of its own. Five clients each send a call of 900 KB while the run's worker is
    away: the run's next task is handed all five (4.5 MB), and its answer echoes every update it accepts or
    refuses (RunBusy), request and all: Temporal ended the run (GrpcMessageTooLarge). Arguments of 256 KB
    and more now travel as references to the payload store (kiwi/payloads.py)."""
    runs, run_id, queue, ledger = await _ledger_run(temporal_env, project, tmp_path)
    tasks = []
    for i, n in enumerate("abcde"):
        client = RunClient(temporal_env.client, ItemStore(project), task_queue=queue)
        tasks += await _admitted(client, run_id, [("ledger.length", {"tag": n * (900_000 + i)})])
    async with build_worker(temporal_env.client, queue, sandboxed=True):
        done, _ = await asyncio.wait(tasks, timeout=60)
        described = await runs.handle(run_id).describe()
        reason = await _terminated_reason(runs, run_id)
        assert described.status == WorkflowExecutionStatus.RUNNING, (described.status, reason)
        assert len(done) == len(tasks) == 5, reason
        results = [t.result() for t in tasks]
        assert [text_of(r.result) for r in results] == [f"{900_000 + i} characters" for i in range(5)]
        assert sorted(_lines(ledger)) == [f"length {900_000 + i}" for i in range(5)]
    await _replays(runs, run_id)


# ---------------------------------------------------------------- pool: a hostile server's answers

# The ledger server, plus a tool whose listing promises structured content (an output schema) its answers
# never carry: the MCP client refuses each answer with a RuntimeError, raised inside the pool's _using.
HOSTILE_SERVER = """
import runpy, sys
from pathlib import Path

sys.argv = [sys.argv[0], *sys.argv[1:]]
source = Path({ledger!r}).read_text().replace('server.run("stdio")', "pass")
namespace = runpy._run_module_code(source, {{}}, "__ledger__")
server, _note, ledger = namespace["server"], namespace["_note"], namespace["ledger"]


@server.tool(description="Note the call; answer text only (the listing promises structured content)")
async def shape(tag: str) -> str:
    _note("shape", tag)
    return "plain " + tag


listed = server.list_tools


async def list_tools():
    schema = {{"type": "object", "properties": {{"n": {{"type": "integer"}}}}, "required": ["n"]}}
    return [t.model_copy(update={{"output_schema": schema}}) if t.name == "shape" else t for t in await listed()]


server.list_tools = list_tools


@server.tool(description="Note the call; the first call with this tag stops the server's event loop for good")
async def freeze(tag: str) -> str:
    first = f"freeze {{tag}}\\n" not in (ledger.read_text() if ledger.exists() else "")
    _note("freeze", tag)
    if first:
        import time

        time.sleep(3600)
    return "thawed " + tag


@server.tool(description="w" * {wide})
async def wide(tag: str) -> str:
    return tag


server.run("stdio")
"""


def _hostile_script(wide: int = 10) -> str:
    return HOSTILE_SERVER.format(ledger=str(SERVERS / "ledger_server.py"), wide=wide)


def _hostile_pool(project, tmp_path, monkeypatch, extra: str = ""):
    monkeypatch.setenv(
        "AI_USER_SPACE", str(tmp_path.with_name(tmp_path.name + "-user"))
    )  # (beside the project)
    ledger = tmp_path / "ledger.txt"
    script = tmp_path / "hostile_server.py"
    script.write_text(_hostile_script())
    registry(
        project,
        f'mcps:\n  ledger:\n    command: "{sys.executable}"\n    args: ["{script}", "{ledger}"]\n{extra}',
    )
    pool = McpPool()
    return pool, pool.config(str(project), "ledger"), ledger


async def _text(pool, project, config, tool, args) -> str:
    result, _ = await pool.call_tool(str(project), config, tool, args)
    return text_of(result)


async def test_an_answer_the_client_refuses_leaves_the_calls_in_flight_beside_it(
    project, tmp_path, monkeypatch
):
    """Attack: the server lists a tool with an output schema and answers it without structured content. The
    MCP client refuses that answer (a RuntimeError, not an MCPError), and the pool took any such exception
    for a broken transport: it dropped the shared connection, stopping the stdio server under the calls of
    other runs in flight on it. Their answers were lost and their retries ran again calls the server did.
    Now the refused answer is the call's own failure (ToolFailed, not retried) and the connection stays."""
    pool, config, ledger = _hostile_pool(project, tmp_path, monkeypatch)
    release = ledger.with_suffix(".release")
    os.mkfifo(release)
    try:
        server_pid = await _text(pool, project, config, "pid", {"tag": "before"})
        held = asyncio.create_task(_text(pool, project, config, "hold", {"tag": "b"}))
        writer = await asyncio.wait_for(asyncio.to_thread(open, release, "w"), 30)
        with pytest.raises(McpRefused, match="structured content"):
            await _text(pool, project, config, "shape", {"tag": "a"})
        try:  # only now, after the refused answer came back, may the held call answer
            writer.write("go\n")
            writer.close()
        except BrokenPipeError:
            pass  # (the server is gone)
        assert await asyncio.wait_for(held, 30) == "held b until go"
        assert await _text(pool, project, config, "pid", {"tag": "after"}) == server_pid
    finally:
        await pool.close()


# The ledger server over streamable HTTP on a loopback port.
HTTP_LEDGER = """
import runpy, sys
from pathlib import Path

source = Path({ledger!r}).read_text().replace('server.run("stdio")', "pass")
namespace = runpy._run_module_code(source, {{}}, "__ledger__")
namespace["server"].run("streamable-http", host="127.0.0.1", port={port})
"""


async def test_an_http_servers_error_answer_keeps_the_shared_session(project, tmp_path, monkeypatch):
    """Attack: for a server reached over HTTP, the pool retires the shared connection on every MCP error that
    is not permanent, not only on the HTTP errors of a lost session: a tool that answers a JSON-RPC internal
    error (the connection is sound) makes every run's next call open a new session. An agent that calls such
    a tool in a loop resets, for every other run on the worker, whatever the server keeps per session, and
    each call pays a new handshake."""
    import httpx

    from kiwi.devserver import free_port
    from tests.helpers import wait_for

    monkeypatch.setenv(
        "AI_USER_SPACE", str(tmp_path.with_name(tmp_path.name + "-user"))
    )  # (beside the project)
    port = free_port()
    script = tmp_path / "http_ledger.py"
    script.write_text(HTTP_LEDGER.format(ledger=str(SERVERS / "ledger_server.py"), port=port))
    ledger = tmp_path / "ledger.txt"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(script), str(ledger), stderr=asyncio.subprocess.DEVNULL
    )
    pool = McpPool()
    try:

        async def up() -> bool:
            try:
                async with httpx.AsyncClient() as client:
                    await client.get(f"http://127.0.0.1:{port}/mcp", timeout=1)
                return True
            except httpx.TransportError:
                return False

        await wait_for(up, what="the ledger server over HTTP")
        registry(
            project, f"mcps:\n  ledger:\n    type: streamable-http\n    url: http://127.0.0.1:{port}/mcp\n"
        )
        config = pool.config(str(project), "ledger")
        _, before = await pool.call_tool(str(project), config, "count", {"tag": "before"})
        with pytest.raises(McpUnavailable, match="internal error e"):
            await pool.call_tool(str(project), config, "error", {"tag": "e"})
        _, after = await pool.call_tool(str(project), config, "count", {"tag": "after"})
        assert after is before, "a new connection (a new session) after a tool's error answer"
    finally:
        await pool.close()
        proc.kill()
        await proc.wait()


# ---------------------------------------------------------------- task budget: a hostile server's tool list


async def _admitted_updates(runs: RunClient, run_id: str, update, arg, count: int) -> list[asyncio.Task]:
    """``count`` updates ``update(arg)``, sent, once the server admitted each (no worker runs them yet)."""
    from tests.test_batches import wait_admitted

    tasks = []
    for i in range(count):
        update_id = f"upd-{i}-{uuid.uuid4().hex[:6]}"
        tasks.append(asyncio.create_task(runs._update(run_id, update, arg, update_id)))
        await wait_admitted(runs, run_id, update_id, f"update {i}")
    return tasks


async def test_a_servers_large_tool_list_asked_for_together_does_not_end_the_run(
    temporal_env, project, tmp_path, monkeypatch
):
    """Attack (a hostile MCP server): the server lists a tool with a 450 KB description (a run takes at
    most 512 KB of a server's listing; more fails the run's start, see the next test). The run holds it in
    its state, and the ``tool_context`` update (what each front end asks a run for when a session starts)
    answers it whole. Ten front ends ask at once while the worker is away: ten answers of 450 KB were one
    task's completion, and Temporal ended the run; now the answers wait for tasks with room for them."""
    from kiwi.contracts import ToolContextRequest
    from tests.test_mcp_servers import mcp_directive
    from workflows.directive_run import DirectiveRun

    monkeypatch.setenv(
        "AI_USER_SPACE", str(tmp_path.with_name(tmp_path.name + "-user"))
    )  # (beside the project)
    script = tmp_path / "hostile_server.py"
    script.write_text(_hostile_script(wide=450_000))
    registry(
        project,
        f'mcps:\n  ledger:\n    command: "{sys.executable}"\n    args: ["{script}", "{tmp_path / "l.txt"}"]\n',
    )
    mcp_directive(
        project,
        "wide",
        tools='<mcp name="ledger" required="true"/>',
        permissions='<execute resource="mcp" name="ledger" actions="*"/>',
        body='<step name="work"><action>Call.</action></step>',
    )
    queue = f"kiwi-s11-{uuid.uuid4().hex[:8]}"
    runs, run_id = await _run_waiting(temporal_env, project, queue, "wide")
    tasks = await _admitted_updates(runs, run_id, DirectiveRun.tool_context, ToolContextRequest(), 10)
    async with build_worker(temporal_env.client, queue, sandboxed=True):
        done, _ = await asyncio.wait(tasks, timeout=60)
        described = await runs.handle(run_id).describe()
        reason = await _terminated_reason(runs, run_id)
        assert described.status == WorkflowExecutionStatus.RUNNING, (described.status, reason)
        assert len(done) == 10, reason
        assert all(t.result().mcps["ledger"].available for t in tasks)
    await _replays(runs, run_id)


# ---------------------------------------------------------------- rate limits of kiwi-mcp.execute


def _count(i: int) -> dict:
    return {"tool_name": "word_count", "parameters": {"text": "a " * (i + 1)}}


async def test_execute_spellings_and_nesting_do_not_get_past_a_kiwi_mcp_limit(runs, project):
    """Attack: a limit on ``kiwi-mcp.*`` (it counts the execute, not the tool it makes). The agent spreads
    its calls over both spellings (execute, run) and tries to nest an execute inside an execute (whose
    inner admission would skip the patterns the outer one counted): nesting is refused, and two calls in
    all get through, the third refused."""
    from tests.test_kiwi_mcp_tools import agent_run
    from tests.test_review_attacks_s9 import PARENT, WORD_COUNT, harness

    harness(project, "rate_limits:\n  'kiwi-mcp.*': 2\n  '*': 10\n")
    kiwi_directive(project, "limited", PARENT + WORD_COUNT)
    run_id = await agent_run(runs, "limited")
    nested = await runs.call_tool(
        run_id, "kiwi-mcp.execute", {"tool_name": "kiwi-mcp.run", "parameters": _count(1)}
    )
    assert (nested.status, nested.error_type) == ("error", "InputInvalid"), nested
    first = await runs.call_tool(run_id, "kiwi-mcp.run", _count(0))
    second = await runs.call_tool(run_id, "kiwi-mcp.execute", _count(1))
    assert (first.status, second.status) == ("ok", "ok"), (first, second)
    third = await runs.call_tool(run_id, "kiwi-mcp.run", _count(2))
    assert third.status == "rate_limited" and "kiwi-mcp.*" in third.reason, third
    # The tool itself, called directly, is under `*` only.
    assert (await runs.call_tool(run_id, "word_count", {"text": "b"})).status == "ok"
    await runs.cancel(run_id)


async def test_execute_does_not_get_past_a_rate_window(runs, project):
    """Attack: windows (``N/minute``) on ``*`` and on the other spelling ``kiwi-mcp.run``: the execute counts
    under kiwi-mcp.run's window, and a delegated call counts once under ``*``'s."""
    from tests.test_kiwi_mcp_tools import agent_run
    from tests.test_review_attacks_s9 import PARENT, WORD_COUNT, harness

    harness(project, "rate_limits:\n  '*': 3/minute\n  kiwi-mcp.run: 1/minute\n")
    kiwi_directive(project, "windowed", PARENT + WORD_COUNT)
    run_id = await agent_run(runs, "windowed")
    first = await runs.call_tool(run_id, "kiwi-mcp.execute", _count(0))
    second = await runs.call_tool(run_id, "kiwi-mcp.execute", _count(1))
    assert first.status == "ok", first
    assert second.status == "rate_limited" and "kiwi-mcp.run" in second.reason, second
    # `*`'s window holds the one delegated call (a refused call is not counted): two more, then none.
    statuses = [(await runs.call_tool(run_id, "word_count", {"text": t})).status for t in "bcd"]
    assert statuses == ["ok", "ok", "rate_limited"], statuses
    await runs.cancel(run_id)


# ---------------------------------------------------------------- task budget across continue-as-new


async def test_large_answers_across_continue_as_new_are_answered_once(temporal_env, project, tmp_path):
    """Attack: four calls answering ~440 KB each as sent (one batch of 1.76 MB, the most a batch answers)
    admitted together, in a run that continues as new after every two calls: answers too large to hold for a
    resend, in one task beside the batch's marker, while the run drains and hands over. Each call runs once, each caller gets its whole answer, the run goes on and replays."""
    runs, run_id, queue, ledger = await _ledger_run(
        temporal_env, project, tmp_path, harness="runs:\n  continue_as_new_after_updates: 2\n"
    )
    calls = [("ledger.big", {"tag": f"{n}{i}", "size": 220_000}) for i, n in enumerate("abcd")]
    tasks = await _admitted(runs, run_id, calls)
    async with build_worker(temporal_env.client, queue, sandboxed=True):
        done, _ = await asyncio.wait(tasks, timeout=90)
        reason = await _terminated_reason(runs, run_id)
        assert len(done) == 4, reason
        results = [t.result() for t in tasks]
        assert [r.status for r in results] == ["ok"] * 4, [r.reason for r in results]
        assert [text_of(r.result) for r in results] == [n * 220_000 for n in "abcd"]
        assert sorted(_lines(ledger)) == sorted(f"big {n}{i}" for i, n in enumerate("abcd"))
        after = await runs.call_tool(run_id, "ledger.count", {"tag": "after"})
        assert after.status == "ok" and after.call_seq == 5, after
        assert (await runs.status(run_id)).continued >= 1
    await _replays(runs, run_id)


async def test_servers_large_tool_lists_do_not_end_the_runs_that_declare_them(
    temporal_env, project, tmp_path, monkeypatch
):
    """Attack (hostile MCP servers): three servers each list a tool with a 1.3 MB description (a listing is
    cut at 1.9 MB; each of these passes). The run fetches the three listings in its first task, as local
    activities outside the task budget: three markers of 1.3 MB in one completion, and Temporal ends every
    run that declares them. The run must not be ended: it goes on (or says which server it cannot use)."""
    from tests.helpers import wait_for
    from tests.test_mcp_servers import mcp_directive

    monkeypatch.setenv(
        "AI_USER_SPACE", str(tmp_path.with_name(tmp_path.name + "-user"))
    )  # (beside the project)
    script = tmp_path / "hostile_server.py"
    script.write_text(_hostile_script(wide=1_300_000))
    names = ("alpha", "beta", "gamma")
    registry(
        project,
        "mcps:\n"
        + "".join(
            f'  {n}:\n    command: "{sys.executable}"\n    args: ["{script}", "{tmp_path / n}.txt"]\n'
            for n in names
        ),
    )
    mcp_directive(
        project,
        "wide",
        tools="".join(f'<mcp name="{n}"/>' for n in names),
        permissions="".join(f'<execute resource="mcp" name="{n}" actions="*"/>' for n in names),
        body='<step name="work"><action>Call.</action></step>',
    )
    queue = f"kiwi-s11-{uuid.uuid4().hex[:8]}"
    runs = RunClient(temporal_env.client, ItemStore(project), task_queue=queue)
    async with build_worker(temporal_env.client, queue, sandboxed=True):
        try:
            run_id = await runs.start("wide", {})
        except KiwiError as exc:  # the start waits for the run's tool context, from its first task
            started = [w async for w in temporal_env.client.list_workflows(f"TaskQueue = '{queue}'")]
            reason = await _terminated_reason(runs, started[0].id) if started else ""
            pytest.fail(f"the run did not start: {exc} ({reason})")

        async def settled():
            described = await runs.handle(run_id).describe()
            if described.status != WorkflowExecutionStatus.RUNNING:
                return described.status
            async for event in runs.handle(run_id).fetch_history_events():
                if event.HasField("workflow_task_failed_event_attributes"):
                    return "task failed"
            status = (await runs.status(run_id)).status
            return status if status in ("awaiting_agent", "failed") else None

        outcome = await wait_for(settled, timeout=60, what="the run to settle")
        reason = await _terminated_reason(runs, run_id)
        assert outcome in ("awaiting_agent", "failed"), (outcome, reason)


# ---------------------------------------------------------------- step results carried by the run


@pytest.mark.parametrize("size", [700_000, 200_000])
async def test_a_steps_large_call_results_do_not_end_the_run_when_it_continues(temporal_env, project, size):
    """Attack: a step that runs its own calls kept each result in the run's state (``prerun_results``, and
    again in its outputs), with no bound: three reads of 700 KB files made the state ~4 MB, and once the
    run continued-as-new (or completed) the hand-over was past what Temporal takes: stuck for good. Now a
    step's results count toward what a run holds (1,000,000 bytes): past it the step fails at once, naming
    the fix; within it (three reads of 200 KB) the run continues as new with them."""
    from temporalio.client import WorkflowFailureError

    from kiwi.contracts import STATUS_ATTR
    from tests.helpers import directive_md, wait_for, write_directive

    for n in "abc":
        write(project / "notes" / f"{n}.md", n * size)
    body = (
        '<step name="read">'
        + "".join(
            f'<tool_call tool="filesystem.read"><param name="path">notes/{n}.md</param></tool_call>'
            for n in "abc"
        )
        + '</step><step name="work"><action>Go on.</action></step>'
    )
    text = directive_md(body, name="reader", permissions='<read resource="filesystem" path="notes/**"/>')
    write_directive(project / ".ai" / "directives" / "reader.md", text)
    write(project / ".ai" / "config" / "agent_harness.yaml", "runs:\n  continue_as_new_after_updates: 1\n")
    queue = f"kiwi-s11-{uuid.uuid4().hex[:8]}"
    runs = RunClient(temporal_env.client, ItemStore(project), task_queue=queue)
    async with build_worker(temporal_env.client, queue, sandboxed=True):
        run_id = await runs.start("reader", {})
        if size > 300_000:
            with pytest.raises(WorkflowFailureError) as failed:
                await asyncio.wait_for(runs.handle(run_id).result(), 60)
            assert failed.value.cause.type == "StepFailed"
            assert "a run holds at most 1,000,000" in failed.value.cause.message
            return
        first_execution = (await runs.handle(run_id).describe()).run_id

        async def published(status: str):
            described = await runs.handle(run_id).describe()
            if described.status != WorkflowExecutionStatus.RUNNING:
                return described.status
            return described.typed_search_attributes.get(STATUS_ATTR) == status or None

        assert await wait_for(lambda: published("awaiting_agent"), what="the agent step") is True
        call = asyncio.ensure_future(runs.call_tool(run_id, "filesystem.list", {"path": "notes"}))
        done, _ = await asyncio.wait({call}, timeout=30)
        reason = await _terminated_reason(runs, run_id)
        assert done and call.result().status == "ok", reason

        async def handed_over():
            described = await runs.handle(run_id).describe()
            if described.run_id != first_execution:  # continued as new: the successor is the latest
                return (
                    "continued" if described.status == WorkflowExecutionStatus.RUNNING else described.status
                )
            if described.status != WorkflowExecutionStatus.RUNNING:
                return described.status
            failed = await _terminated_reason(runs, run_id)  # its hand-over task failing, again and again
            return f"stuck: {failed}" if failed else None

        outcome = await wait_for(handed_over, timeout=30, what="the run to continue as new")
        assert outcome == "continued", outcome
        closed = await runs.client.get_workflow_handle(run_id, run_id=first_execution).describe()
        assert closed.status == WorkflowExecutionStatus.CONTINUED_AS_NEW
        await wait_for(lambda: published("awaiting_agent"), what="the successor to wait for the agent")
        status = await runs.status(run_id)  # (its answer: the run's state, its steps' outputs with it)
        assert status.continued >= 1, status
        assert not await _terminated_reason(runs, run_id)


async def _hostile_run(temporal_env, project, tmp_path, monkeypatch, extra: str = ""):
    """A run that may call the hostile server (as 'ledger'), waiting for the agent on a queue with no worker."""
    from tests.test_mcp_servers import mcp_directive

    monkeypatch.setenv(
        "AI_USER_SPACE", str(tmp_path.with_name(tmp_path.name + "-user"))
    )  # (beside the project)
    ledger = tmp_path / "ledger.txt"
    script = tmp_path / "hostile_server.py"
    script.write_text(_hostile_script())
    registry(
        project,
        f'mcps:\n  ledger:\n    command: "{sys.executable}"\n    args: ["{script}", "{ledger}"]\n{extra}',
    )
    mcp_directive(
        project,
        "hostile",
        tools='<mcp name="ledger" required="true"/>',
        permissions='<execute resource="mcp" name="ledger" actions="*"/>',
        body='<step name="work"><action>Call.</action></step>',
    )
    queue = f"kiwi-s11-{uuid.uuid4().hex[:8]}"
    runs, run_id = await _run_waiting(temporal_env, project, queue, "hostile")
    return runs, run_id, queue, ledger


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_a_hung_server_replaced_after_a_timeout_is_stopped(
    temporal_env, project, tmp_path, monkeypatch
):
    """Attack (a hostile MCP server): one call stops the server's event loop for good, so every call on that
    connection hangs. The call times out and answers ToolTimeout at once; it is never sent again (the server
    read it, and may have done it). Later calls go to a fresh server process, and the hung one is ended, not
    leaked. (Before, the call's answer waited for the hung connection to close, past its local activity's
    time: Temporal retried it, and the call ran again on a fresh server.)"""
    from tests.helpers import wait_for

    runs, run_id, queue, ledger = await _hostile_run(
        temporal_env, project, tmp_path, monkeypatch, extra="    timeout: 2\n"
    )
    hung = 0
    try:
        async with build_worker(temporal_env.client, queue, sandboxed=True):
            first = await runs.call_tool(run_id, "ledger.pid", {"tag": "before"})
            hung = int(text_of(first.result))
            frozen = await asyncio.wait_for(runs.call_tool(run_id, "ledger.freeze", {"tag": "f"}), 60)
            assert frozen.status == "error" and frozen.error_type == "ToolTimeout", frozen
            assert "ledger.freeze: no answer within 2s" in frozen.reason, frozen
            after = await runs.call_tool(run_id, "ledger.pid", {"tag": "after"})
            assert int(text_of(after.result)) != hung
            assert [line for line in _lines(ledger) if line.startswith("freeze")] == ["freeze f"]

            async def gone() -> bool:
                return not _alive(hung)

            await wait_for(gone, timeout=30, what="the hung server's process to end")
    finally:
        if hung and _alive(hung):
            os.kill(hung, 9)  # (else this test's event loop waits for it at its end)


# ---------------------------------------------------------------- child runs started together


async def test_child_runs_of_a_large_directive_started_together_do_not_end_the_run(temporal_env, project):
    """Attack: directive.run of a directive whose step text is ~800 KB. The child starts with its snapshot
    (the parsed directive, 802 KB) as its input, a command of the parent's task that the task budget does
    not count. Six such calls admitted together: their resolutions (regular activities) finish together
    and the six starts went out in one task of ~4.8 MB: Temporal ended the parent (five, 4.0 MB, just fit).
    A snapshot of 256 KB or more now travels as a reference to the payload store (kiwi/payloads.py)."""
    from tests.helpers import directive_md, write_directive

    fat = directive_md(
        f'<step name="work"><action>{"x" * 800_000}</action></step>', name="fat", permissions=""
    )
    write_directive(project / ".ai" / "directives" / "fat.md", fat)
    parent = directive_md(
        '<step name="work"><action>Delegate.</action></step>',
        name="parent",
        permissions='<execute resource="tool" id="directive.run"/>',
    )
    write_directive(project / ".ai" / "directives" / "parent.md", parent)
    queue = f"kiwi-s11-{uuid.uuid4().hex[:8]}"
    runs, run_id = await _run_waiting(temporal_env, project, queue, "parent")
    tasks = await _admitted(runs, run_id, [("directive.run", {"directive": "fat"})] * 6)
    async with build_worker(temporal_env.client, queue, sandboxed=True):
        done, _ = await asyncio.wait(tasks, timeout=90)
        reason = await _terminated_reason(runs, run_id)
        assert (await runs.handle(run_id).describe()).status == WorkflowExecutionStatus.RUNNING, reason
        assert len(done) == 6, reason
        results = [t.result() for t in tasks]
        assert [r.status for r in results] == ["ok"] * 6, [r.reason for r in results]
        for r in results:
            await runs.cancel(r.result["run_id"])
    await _replays(runs, run_id)


async def test_an_answer_the_client_refuses_does_not_run_its_neighbour_twice(
    temporal_env, project, tmp_path, monkeypatch
):
    """The same attack through a run: a call held at the server and the refused one, admitted together (one
    batch). The refusal (a RuntimeError, taken for a broken transport: McpUnavailable, retried) dropped the
    connection and stopped the server under the held call, whose item came back for a retry, and each retry
    of the refused call stopped the server again. Seen: 'hold b' ran three times at the server and its caller
    was told it failed ('Connection closed'); 'shape a' ran seven times, stopping the server each time."""
    from tests.helpers import wait_for

    runs, run_id, queue, ledger = await _hostile_run(temporal_env, project, tmp_path, monkeypatch)
    release = ledger.with_suffix(".release")
    os.mkfifo(release)
    tasks = await _admitted(runs, run_id, [("ledger.hold", {"tag": "b"}), ("ledger.shape", {"tag": "a"})])
    async with build_worker(temporal_env.client, queue, sandboxed=True):
        # (Opening the FIFO returns once the server opened it: the held call is running at the server.)
        writer = await asyncio.wait_for(asyncio.to_thread(open, release, "w"), 30)

        async def settled() -> list[str] | None:
            lines = _lines(ledger)
            return lines if "shape a" in lines else None

        await wait_for(settled, what="the refused call")

        # The refused call ran (its answer comes back with the batch's): now the held one may answer.
        writer.write("go\n")
        writer.close()
        results = await asyncio.wait_for(asyncio.gather(*tasks), 60)
        assert results[1].error_type == "ToolFailed" and "structured content" in results[1].reason, results[1]
    assert _lines(ledger).count("hold b") == 1, _lines(ledger)
    assert results[0].status == "ok", results[0]
    assert _lines(ledger).count("shape a") == 1, _lines(ledger)
