"""Session 18: attacks on limits a run had no default for. Each test is the attack against the real stack
(a Temporal dev server, a real worker); it fails while the hole is open."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from kiwi.contracts import RunLimits
from tests.helpers import directive_md, wait_for, write, write_directive
from tests.test_kiwi_mcp_tools import agent_run, kiwi_directive
from tests.test_review_attacks_s10 import _replays

FORK = '<execute resource="tool" id="directive.run"/><write resource="filesystem" path="notes/**"/>'
QUICK_CHILD = (
    '<step name="write"><tool_call tool="filesystem.write"><param name="path">notes/child.txt</param>'
    '<param name="content">from the child</param></tool_call></step>'
)


async def test_attack_a_run_starts_child_runs_without_end_when_the_harness_names_no_limit(runs, project):
    """Attack: the project's harness sets no limit on directive.run (kiwi init's file did not); a directive
    that may start child runs, its children too, let the agent start runs without end, each a workflow on
    the server and the worker. Safe: directive.run has a default per-run limit (20); a child it starts may
    use half of what is left, so the tree of runs stays bounded however deep the agent goes. On the way: a
    child that made no call of a limited pattern gave back none of the half held for it (its missing count
    read as all used), so a run could start only 4 children one after another under a limit of 20."""
    default = RunLimits().rate_limits["directive.run"]
    assert default == 20
    kiwi_directive(project, "fork", FORK)
    write_directive(
        project / ".ai" / "directives" / "quick.md",
        directive_md(
            QUICK_CHILD,
            name="quick",
            inputs='<input name="n" type="integer"/>',  # (each call differs: loop detection stays quiet)
            permissions='<write resource="filesystem" path="notes/**"/>',
        ),
    )
    run_id = await agent_run(runs, "fork")
    # The first child is another fork the agent drives: it gets half (rounded up) of the 19 left.
    child = await runs.call_tool(run_id, "directive.run", {"directive": "fork"})
    assert child.status == "ok", child
    child_id = child.result["run_id"]
    await wait_for(lambda: _awaiting(runs, child_id), what="the child run to wait for the agent")
    for index in range(10):
        await _start_quick(runs, child_id, index)
    refused = await runs.call_tool(child_id, "directive.run", {"directive": "quick", "inputs": {"n": 10}})
    assert refused.status == "rate_limited", f"the child started an 11th run of its own: {refused}"
    assert "rate limit for directive.run is 10 calls per run" in refused.reason, refused.reason
    # The parent keeps the other 9 while the child runs.
    for index in range(9):
        await _start_quick(runs, run_id, index)
    refused = await runs.call_tool(run_id, "directive.run", {"directive": "quick", "inputs": {"n": 9}})
    assert refused.status == "rate_limited", f"the parent started a run past the limit: {refused}"
    assert "directive.run" in refused.reason
    await runs.cancel(run_id)


async def _start_quick(runs, run_id: str, index: int) -> None:
    """One more child run of ``run_id``, waited for until it has ended (a running child holds back half of
    what is left of its parent's limits; its end gives back what it did not use)."""
    started = await runs.call_tool(run_id, "directive.run", {"directive": "quick", "inputs": {"n": index}})
    assert started.status == "ok", (index, started)
    child = started.result["run_id"]

    async def ended():
        return [
            c for c in (await runs.status(run_id)).children if c.run_id == child and c.status == "completed"
        ]

    await wait_for(ended, what=f"child run {child} of {run_id} to end")


async def _awaiting(runs, run_id: str) -> bool:
    return (await runs.status(run_id)).status == "awaiting_agent"


# ============================================================ the project's own files as code


def _planted(marker) -> str:
    """A json.py that records where it ran, then stands in for the real json module (the tool still works)."""
    return (
        "import importlib, os, sys\n"
        f"open({str(marker)!r}, 'w').write(str(os.getpid()))\n"
        "_first = sys.path.pop(0)\n"
        "del sys.modules[__name__]\n"
        "sys.modules[__name__] = importlib.import_module('json')\n"
        "sys.path.insert(0, _first)\n"
    )


EVERYTHING = '<write resource="filesystem" path="**"/>\n<execute resource="tool" id="word_count"/>'


async def _run_that_planted(runs, project, marker, permissions: str = EVERYTHING) -> str:
    """A run (its directive granting ``permissions``) whose agent wrote json.py (``_planted``) at the root."""
    kiwi_directive(project, "everything", permissions)
    run_id = await agent_run(runs, "everything")
    wrote = await runs.call_tool(run_id, "filesystem.write", {"path": "json.py", "content": _planted(marker)})
    assert wrote.status == "ok", wrote
    return run_id


async def test_attack_a_module_the_agent_writes_at_the_root_runs_in_every_later_python_tool(
    runs, project, tmp_path_factory
):
    """Attack: a run granted ``write **`` writes json.py at the project root (no protected place covers
    it). Python tools ran as ``python -c RUNNER entry`` in the project, and ``-c`` puts the working folder
    first on the import path: the runner's own ``import json`` ran the agent's file, as the worker's user,
    in every later python tool call of any run or session (kiwi init's word_count among them): it could
    write protected files and read the signing keys. Safe: tools run with ``-P``; the planted file is never
    imported and the tool answers as usual."""
    marker = tmp_path_factory.mktemp("outside") / "ran"
    run_id = await _run_that_planted(runs, project, marker)
    counted = await runs.call_tool(run_id, "word_count", {"text": "two words"})
    assert counted.status == "ok", counted
    assert "2" in str(counted.result), counted.result
    assert not marker.exists(), "the agent's json.py ran inside the python tool"
    await runs.cancel(run_id)


async def test_attack_a_module_the_agent_writes_at_the_root_runs_in_a_python_mcp_server(
    runs, project, tmp_path_factory
):
    """Attack: ``kiwi dev`` runs from the project, as the README says; stdio MCP servers started with the
    worker's working folder, so a ``python -m`` server (mcp-server-time here) imported the json.py an agent
    wrote at the project root the next time it started (a new worker, an idle timeout, a crash). Safe: a
    server with no ``cwd`` of its own starts in an empty folder of Kiwi's; the planted file never runs."""
    import os
    import sys

    assert os.getcwd() == str(project)  # (the worker's working folder is the project, as under kiwi dev)
    marker = tmp_path_factory.mktemp("outside") / "ran"
    write(
        project / ".ai" / "config" / "mcp_registry.yaml",
        f"mcps:\n  clock:\n    command: {sys.executable}\n"
        '    args: ["-m", "mcp_server_time", "--local-timezone", "UTC"]\n',
    )
    await runs.cancel(await _run_that_planted(runs, project, marker))
    # The server starts for the first time now, for a run that uses it.
    write_directive(
        project / ".ai" / "directives" / "clock_user.md",
        directive_md(
            '<step name="work"><action>Tell the time.</action></step>',
            name="clock_user",
            tools='<tools><mcp name="clock" required="true"/></tools>',
            permissions='<execute resource="mcp" name="clock" actions="*"/>',
        ),
    )
    run_id = await agent_run(runs, "clock_user")
    told = await runs.call_tool(run_id, "clock.get_current_time", {"timezone": "UTC"})
    assert told.status == "ok", told
    assert "datetime" in str(told.result), told.result
    assert not marker.exists(), "the agent's json.py ran inside the MCP server"
    await runs.cancel(run_id)


# ============================================================ an older signed directive written back


async def test_attack_the_agent_writes_back_an_older_signed_directive_from_git(
    runs, project, temporal_env, monkeypatch
):
    """Attack: a human narrowed a directive (v1.1.0 may write notes/** only, where v1.0.0 could write
    anything) and signed it. With the session's base policy (git and reading) the agent reads v1.0.0 from
    git's history and sends it back whole, signature line included, as ``execute(directive, update)``:
    the signature was valid (it says who wrote the content, not that it is current), and the next run had
    v1.0.0's grants again. Safe: what an agent writes is saved unsigned and runs with the base policy; the
    agent cannot delete the signed file either (its id would be free for an older version)."""
    import subprocess

    from mcp.client import Client

    from mcp_frontend.server import build_server
    from tests.helpers import data

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=project, check=True, capture_output=True, text=True).stdout

    git("init", "-q")
    git("config", "user.email", "human@example.com")
    git("config", "user.name", "human")
    body = (
        '<step name="w"><tool_call tool="filesystem.write"><param name="path">escaped.txt</param>'
        '<param name="content">outside notes</param></tool_call></step>'
    )
    path = project / ".ai" / "directives" / "tests" / "deploy.md"
    write_directive(
        path, directive_md(body, name="deploy", permissions='<write resource="filesystem" path="**"/>')
    )
    git("add", "-A")
    git("commit", "-qm", "deploy 1.0.0")
    write_directive(
        path,
        directive_md(
            body, name="deploy", version="1.1.0", permissions='<write resource="filesystem" path="notes/**"/>'
        ),
    )
    git("commit", "-qam", "deploy 1.1.0: writes notes/ only")
    server = build_server(temporal_env.client, project, task_queue=runs.task_queue)
    async with Client(server) as client:

        async def execute(**arguments):
            return data(await client.call_tool("execute", arguments))

        shown = await execute(
            item_type="tool",
            action="call",
            item_id="shell.run",
            parameters={"argv": ["git", "show", "HEAD~1:.ai/directives/tests/deploy.md"]},
        )
        # (Since s19 the object's path is checked as a read: .ai/directives is a protected place. An agent
        # may still know the old text some other way, e.g. from a copy elsewhere: the write-back is the attack.)
        assert shown["status"] == "denied" and "'.ai/directives'" in shown["reason"], shown
        old = git("show", "HEAD~1:.ai/directives/tests/deploy.md")
        assert old.startswith("<!-- kiwi:signed:") and 'path="**"' in old
        saved = await execute(
            item_type="directive", action="update", item_id="deploy", parameters={"content": old}
        )
        assert saved["status"] == "updated" and "dropped" in saved["signature"], saved
        started = await execute(item_type="directive", action="run", item_id="deploy")
        assert started["trust"]["grants"] == "base", started["trust"]
        assert started["state"] == "failed", started
        assert not (project / "escaped.txt").exists()
        # Nor can the agent remove the file a human signs to take the id back from the registry later.
        git("checkout", "-q", "--", ".ai/directives/tests/deploy.md")
        refused = await execute(
            item_type="directive", action="delete", item_id="deploy", parameters={"confirm": True}
        )
        assert refused["error"] == "PermissionDenied", refused
        assert path.exists()


async def test_attack_the_agent_writes_kiwi_devs_settings_at_the_project_root(runs, project):
    """Attack: ``kiwi dev`` reads temporal-dev.yml from the folder it starts in, the project. With ``write
    **`` the agent wrote one that binds the dev server (no auth) to every interface, or puts its database
    in the project where ``read **`` reads every run of every project it serves. Safe: the file is a
    protected place, refused by the run and by the filesystem activity alike, by name or through a copy, in
    any folder; so is a .ai folder below the root (commands run below it take it for the project's)."""
    kiwi_directive(
        project,
        "settings",
        '<write resource="filesystem" path="**"/><read resource="filesystem" path="**"/>'
        '<execute resource="shell" commands="cp"/>',
    )
    run_id = await agent_run(runs, "settings")
    text = "temporal:\n  ip: 0.0.0.0\n  db_file: notes/temporal.db\n"
    for path in ("temporal-dev.yml", "./TEMPORAL-DEV.YML"):
        wrote = await runs.call_tool(run_id, "filesystem.write", {"path": path, "content": text})
        assert wrote.status == "denied", (path, wrote)
        assert "protected" in wrote.reason + wrote.hint, wrote
    staged = await runs.call_tool(run_id, "filesystem.write", {"path": "notes/dev.yml", "content": text})
    assert staged.status == "ok", staged
    copied = await runs.call_tool(run_id, "shell.run", {"argv": ["cp", "notes/dev.yml", "temporal-dev.yml"]})
    assert copied.status == "denied", copied
    assert not (project / "temporal-dev.yml").exists()
    # The same name in a sub-folder too (a command run there reads that one: second s18 review).
    nested = await runs.call_tool(
        run_id, "filesystem.write", {"path": "notes/temporal-dev.yml", "content": text}
    )
    assert nested.status == "denied", nested
    assert not (project / "notes" / "temporal-dev.yml").exists()
    inner = await runs.call_tool(
        run_id, "filesystem.write", {"path": "src/.ai/config/trusted_keys.yaml", "content": "x"}
    )
    assert inner.status == "denied" and "protected place 'src/.ai'" in inner.reason, inner
    await runs.cancel(run_id)
    # The refusals are behind their patch in the run's history, and it replays on this code.
    history = await _replays(runs, run_id)
    assert "kiwi-dev-config-protected" in str(history.events)


# ============================================================ a hostile upstream server's output schema


async def _server_run(runs, project, server: str, script: str, *, timeout: float) -> str:
    """A run waiting for the agent that may call every tool of the stdio server ``tests/servers/SCRIPT``."""
    import sys

    path = Path(__file__).parent / "servers" / script
    write(
        project / ".ai" / "config" / "mcp_registry.yaml",
        f"mcps:\n  {server}:\n    command: {sys.executable}\n    args: [{str(path)!r}]\n    timeout: {timeout:g}\n",
    )
    write_directive(
        project / ".ai" / "directives" / f"uses_{server}.md",
        directive_md(
            BODY_NOTE,
            name=f"uses_{server}",
            tools=f'<tools><mcp name="{server}" required="true"/></tools>',
            permissions=f'<execute resource="mcp" name="{server}" actions="*"/>',
        ),
    )
    return await agent_run(runs, f"uses_{server}")


async def test_attack_an_upstream_servers_output_schema_holds_the_worker(runs, project):
    """Attack: an MCP server's tool declares an outputSchema whose ``pattern`` backtracks (``^(a+)+$``) and
    answers 30 ``a`` and a ``!``. The SDK checked the answer with Python's re on the worker's event loop:
    every run of the worker stopped for minutes (hours at 40 characters), and the server's timeout could not
    fire. ``uniqueItems`` over 20,000 objects compared every pair. Safe: the check runs with a deadline
    (patterns on the regex module with a timeout, unique items in linear time); each call answers as a
    refused answer naming the problem, another run's calls go on, and an answer that fits still passes."""
    run_id = await _server_run(runs, project, "schemas", "schema_server.py", timeout=5)
    expected = {
        "slow": "does not match '^(a+)+$'",
        "slower": "took more than 1s to match",
        "many": "has non-unique elements",
    }
    for tool, problem in expected.items():
        answer = await asyncio.wait_for(runs.call_tool(run_id, f"schemas.{tool}", {}), 60)
        assert answer.status == "error", (tool, answer)
        assert problem in answer.reason, (tool, answer.reason)
    fine = await runs.call_tool(run_id, "schemas.fine", {})
    assert fine.status == "ok", fine
    assert fine.result["structuredContent"] == {"v": "aaa"}
    await runs.cancel(run_id)


def test_unique_items_are_compared_as_jsonschema_compares_them():
    """The linear uniqueItems: 1 and 1.0 are the same item, True and 1 are not, key order does not count."""
    from kiwi.upstream.schemacheck import output_validator

    check = output_validator("t", {"type": "array", "uniqueItems": True})

    def unique(items):
        return not list(check.iter_errors(items))

    assert unique([1, True, 0, False, "1", None, [1], {"a": 1}])
    assert not unique([1, 1.0])
    assert not unique([{"a": 1, "b": [2]}, {"b": [2.0], "a": 1}])
    assert unique([[1, 2], [2, 1]])


# ============================================================ one item file against the index


async def test_attack_one_deeply_nested_knowledge_file_breaks_every_clients_index(
    runs, project, temporal_env, capsys
):
    """Attack: with ``write **`` (or ``.ai/knowledge/**``) the agent writes a knowledge file whose front
    matter nests 50,000 levels deep. Parsing it ran out of Python's recursion, an exception the item index
    did not expect: search, load, execute and help failed for every client of the project, and ``kiwi
    search`` and ``kiwi validate`` ended in a traceback. Safe: YAML nests at most MAX_YAML_DEPTH levels; the
    file is one invalid item that validate names, and everything else answers."""
    from mcp.client import Client

    from kiwi.cli import main as kiwi_main
    from mcp_frontend.server import build_server
    from tests.helpers import data

    kiwi_directive(project, "everything", EVERYTHING)
    run_id = await agent_run(runs, "everything")
    bomb = "---\nzettel_id: bomb\ntitle: t\nx: " + "[" * 50_000 + "]" * 50_000 + "\n---\nbody\n"
    wrote = await runs.call_tool(
        run_id, "filesystem.write", {"path": ".ai/knowledge/bomb.md", "content": bomb}
    )
    assert wrote.status == "ok", wrote
    await runs.cancel(run_id)
    server = build_server(temporal_env.client, project, task_queue=runs.task_queue)
    async with Client(server) as client:
        found = await client.call_tool("search", {"item_type": "directive", "query": "hello"})
        assert not found.is_error, found
        assert "hello_kiwi" in [r["item_id"] for r in data(found)["results"]]
        loaded = await client.call_tool("load", {"item_type": "directive", "item_id": "hello_kiwi"})
        assert not loaded.is_error and data(loaded)["item_id"] == "hello_kiwi", loaded
        helped = await client.call_tool("help", {"topic": "tools"})
        assert not helped.is_error, helped
    capsys.readouterr()
    assert kiwi_main(["validate", ".ai"]) != 0
    shown = capsys.readouterr()
    assert "bomb.md" in shown.out + shown.err and "nested more than 100 levels deep" in shown.out + shown.err
    assert "Traceback" not in shown.err


def test_a_dtd_hidden_in_another_encoding_is_refused():
    """Found by the s18 review (defence in depth): the <!DOCTYPE>/<!ENTITY> check ran on the text's UTF-8
    bytes, but lxml read a document that declared UTF-16 as UTF-16: the declaration hidden between NULs
    passed the check and its internal entities expanded in attributes. Now the parser reads UTF-8 whatever
    the document declares, text with a NUL is refused, and a DTD the parser found is refused again."""
    import pytest

    from kiwi.items.xmlsafe import XmlRefused, parse_xml

    doc = (
        '<?xml version="1.0" encoding="UTF-16"?><!DOCTYPE d [<!ENTITY a "AAAA"><!ENTITY b "&a;&a;&a;">]>'
        '<d name="&b;">&b;</d>'
    )
    hidden = doc.encode("utf-16-le").decode("latin-1")
    with pytest.raises(XmlRefused, match="NUL character"):
        parse_xml(hidden)
    head = '<?xml version="1.0" encoding="IBM037"?>'
    ebcdic = head + doc.split("?>", 1)[1].encode("cp037").decode("latin-1")
    with pytest.raises(XmlRefused):
        parse_xml(ebcdic)
    with pytest.raises(XmlRefused, match="DTDs and entity declarations are not allowed"):
        parse_xml(doc)
    assert parse_xml('<?xml version="1.0" encoding="UTF-8"?><d a="é">ü</d>').get("a") == "é"


async def test_attack_an_upstream_servers_progress_message_is_kept_whole_in_every_heartbeat(runs, project):
    """Found by the s18 review: a long upstream call's progress reports become its activity's heartbeat
    details, which Temporal keeps and the front end reads while the call runs; a server's message went in
    whole (200 KB here, up to what a line may hold). Safe: a message is cut at PROGRESS_MESSAGE_CHARS."""
    from activities.mcp import PROGRESS_MESSAGE_CHARS

    run_id = await _server_run(runs, project, "hostile", "hostile_stdio_server.py", timeout=120)
    held = await runs.call_tool_waiting(
        run_id, "hostile.hold", {"message": "m" * 200_000}, client_name="agent", wait_seconds=0.5
    )
    assert held.status == "pending", held

    async def reported():
        return await runs.upstream_progress(run_id, "hostile.hold") or None

    shown = await wait_for(reported, what="the held call's progress report")
    assert "m" * 100 in shown and len(shown) < PROGRESS_MESSAGE_CHARS + 100, len(shown)
    released = await runs.call_tool(run_id, "hostile.release", {})
    assert released.status == "ok", released
    await runs.cancel(run_id)


async def test_a_flood_of_readiness_probes_makes_one_check_at_a_time():
    """Noticed in session 17: once Temporal answered, each /readyz probe made a health check of its own (up
    to 3 s each), however many arrived at once. Probes that arrive while a check runs share its answer."""
    from kiwi.health import HealthApp

    started, release = [], asyncio.Event()

    async def ready() -> bool:
        started.append(1)
        await release.wait()
        return True

    app = HealthApp(ready)

    async def probe() -> int:
        sent: list[dict] = []

        async def send(message: dict) -> None:
            sent.append(message)

        await app({"type": "http", "path": "/readyz", "method": "GET"}, None, send)
        return sent[0]["status"]

    probes = [asyncio.create_task(probe()) for _ in range(50)]
    while not started:
        await asyncio.sleep(0)  # (one loop turn at a time until the first check has begun)
    for _ in range(10):
        await asyncio.sleep(0)
    release.set()
    assert await asyncio.gather(*probes) == [200] * 50
    assert len(started) == 1
    assert await probe() == 200 and len(started) == 2  # (a later probe checks again)


# ============================================================ the payload store


def _just_under(threshold: int, index: int) -> int:
    """A content length whose filesystem.write arguments are 40 bytes under ``threshold`` as JSON."""
    from workflows.directive_run.task_budget import json_bytes

    probe = {"path": "notes/big.md", "content": f"{index:02d}"}
    return threshold - 40 - json_bytes(probe) + 2


async def test_attack_refused_calls_with_large_arguments_fill_the_payload_store(
    runs, project, temporal_env, capsys
):
    """Found by the s18 review: arguments of 256 KB and more are stored (kiwi.payloads) before the run
    decides on the call, and the run's history names them, so prune keeps them. An agent refused each time
    (a write it may not make, 300 KB of content, each call different so loop detection stays quiet) filled
    the store without end. Safe: after STORED_REFUSALS such calls a run refuses more in the update's validator,
    before any history names them, and prune removes their files; small calls still get the run's answer."""
    import os
    import time

    from kiwi.cli import main as kiwi_main
    from kiwi.errors import InputInvalid
    from kiwi.payloads import THRESHOLD_BYTES, store_folder
    from workflows.directive_run.options import STORED_ARGUMENT_BYTES, STORED_REFUSALS

    assert STORED_ARGUMENT_BYTES == THRESHOLD_BYTES
    kiwi_directive(project, "reader", '<read resource="filesystem" path="**"/>')
    run_id = await agent_run(runs, "reader")
    folder = store_folder()

    def stored() -> set:
        return {p for p in folder.rglob("*") if p.is_file()} if folder.exists() else set()

    before = stored()
    for index in range(STORED_REFUSALS):
        # Half of them just under the threshold as arguments, over it as the stored request (the wrapper's
        # bytes): counted too (second s18 review: 262,143 bytes of arguments went uncounted).
        size = 300_000 if index % 2 else _just_under(STORED_ARGUMENT_BYTES, index)
        content = f"{index:02d}" + "x" * (size - 2)
        refused = await runs.call_tool(
            run_id, "filesystem.write", {"path": "notes/big.md", "content": content}
        )
        assert refused.status == "denied", (index, refused)
    kept = stored() - before
    assert len(kept) >= STORED_REFUSALS
    with pytest.raises(InputInvalid, match=f"this run has taken {STORED_REFUSALS} calls with arguments"):
        await runs.call_tool(run_id, "filesystem.write", {"path": "notes/big.md", "content": "y" * 300_000})
    orphans = stored() - before - kept
    assert orphans, "the refused call's arguments were not stored at all"
    small = await runs.call_tool(run_id, "filesystem.write", {"path": "notes/small.md", "content": "z"})
    assert small.status == "denied", small
    # Prune (files made two days old, past its one day) removes the refused call's arguments, keeps the run's.
    day_ago = time.time() - 2 * 86400
    for path in kept | orphans:
        os.utime(path, (day_ago, day_ago))
    where = ["--address", temporal_env.client.service_client.config.target_host]
    where += ["--namespace", temporal_env.client.namespace]
    capsys.readouterr()
    assert await asyncio.to_thread(kiwi_main, ["payloads", "prune", "--older-than", "1", *where]) == 0
    assert not any(p.exists() for p in orphans)
    assert all(p.exists() for p in kept)
    await runs.cancel(run_id)


async def test_a_call_past_its_servers_timeout_is_made_once_and_says_so(temporal_env, project, tmp_path):
    """Found by the s18 README trial: a call to a server with ``timeout: 3`` that takes longer answered
    ``error 1: Activity timed out`` after 24 s: its local activity ran out of time, Temporal retried it, and
    the server's operation ran again each time. Safe: the call's own timeout comes first and answers
    ToolTimeout naming the timeout, and the call is never sent again (the server may have done it)."""
    from tests.test_review_attacks_s10 import _answers, _ledger_run, _lines

    runs, run_id, queue, ledger = await _ledger_run(temporal_env, project, tmp_path, extra="    timeout: 2\n")
    (answer,) = await _answers(
        temporal_env, runs, run_id, queue, [("ledger.slow", {"tag": "s", "seconds": 30})]
    )
    assert answer.status == "error" and answer.error_type == "ToolTimeout", answer
    assert "ledger.slow: no answer within 2s (the server's timeout in mcp_registry.yaml)" in answer.reason
    assert _lines(ledger) == ["slow s"]


async def test_a_server_whose_command_is_missing_fails_once_without_a_traceback(project):
    """Found by the s18 README trial: an MCP server whose command does not exist (and one that exits at
    start) was tried three times at every run and session start, each attempt a full traceback in `kiwi
    dev`'s output (31 in one trial). A missing command fails at once, not retried; every McpUnavailable is
    a BENIGN failure (its message says why, without a stack trace); one that may heal is still retried."""
    import sys

    from temporalio.api.enums.v1 import ApplicationErrorCategory
    from temporalio.exceptions import ApplicationError
    from temporalio.testing import ActivityEnvironment

    from activities.mcp import McpActivities
    from kiwi.contracts import McpListToolsRequest
    from kiwi.upstream.pool import McpPool

    write(
        project / ".ai" / "config" / "mcp_registry.yaml",
        "mcps:\n  ghost:\n    command: /nonexistent/kiwi-ghost-server\n"
        f"  crashy:\n    command: {sys.executable}\n    args: ['-c', 'raise SystemExit(3)']\n",
    )
    pool = McpPool()
    acts = McpActivities(pool)
    try:
        for server, lasting, says in (
            ("ghost", True, "could not start: /nonexistent/kiwi-ghost-server not found"),
            ("crashy", False, "exited at start (exit code 3)"),
        ):
            with pytest.raises(ApplicationError) as failed:
                await ActivityEnvironment().run(
                    acts.list_tools, McpListToolsRequest(project_root=str(project), server=server)
                )
            assert failed.value.type == "McpUnavailable" and says in failed.value.message
            assert failed.value.non_retryable is lasting, server
            assert failed.value.category == ApplicationErrorCategory.APPLICATION_ERROR_CATEGORY_BENIGN
    finally:
        await pool.close()


# ============================================================ second review: git, folders, directive files


def _git(project, *args: str) -> str:
    import subprocess

    return subprocess.run(
        ["git", "-c", "user.name=h", "-c", "user.email=h@example.com", "-c", "commit.gpgsign=false", *args],
        cwd=project,
        check=True,
        capture_output=True,
        text=True,
    ).stdout


async def test_attack_shell_commands_rewrite_protected_places_and_signed_directives(runs, project):
    """Found by the second s18 review. A signed directive grants ``write **`` and the shell's git and cp.
    git's paths were checked as single names, never as the trees they are: ``git restore --source=HEAD~1
    -- .ai`` and ``:(icase).AI/CONFIG`` brought back the harness and trusted keys of an older commit,
    ``temporal-dev.ym?`` and ``git checkout REV`` the rest; ``git mv .ai .ai_old`` then ``git mv fake .ai``
    swapped in the agent's own .ai (its trusted keys); ``cp src/temporal-dev.yml .`` checked the folder
    only; and a plain write of an older signed directive (or ``git restore`` of one) brought its grants
    back. Safe: every one is refused, naming the protected place; ordinary git and cp still work."""
    write_directive(
        project / ".ai" / "directives" / "deploy.md",
        directive_md(BODY_NOTE, name="deploy", permissions='<write resource="filesystem" path="**"/>'),
    )
    _git(project, "init", "-q")
    _git(project, "add", "-A")
    _git(project, "commit", "-qm", "one")
    write_directive(
        project / ".ai" / "directives" / "deploy.md",
        directive_md(
            BODY_NOTE,
            name="deploy",
            version="1.1.0",
            permissions='<write resource="filesystem" path="notes/**"/>',
        ),
    )
    _git(project, "add", "-A")
    _git(project, "commit", "-qm", "two")
    old_deploy = _git(project, "show", "HEAD~1:.ai/directives/deploy.md")
    kiwi_directive(
        project,
        "refactor",
        '<write resource="filesystem" path="**"/><read resource="filesystem" path="**"/>'
        '<execute resource="shell" commands="git,cp"/>',
    )
    run_id = await agent_run(runs, "refactor")
    before = {
        p: p.read_bytes() for p in (project / ".ai").rglob("*") if p.is_file() and "logs" not in p.parts
    }
    for command in (
        "git restore --source=HEAD~1 -- .ai",
        "git restore --source=HEAD~1 -- :(icase).AI/CONFIG",
        "git checkout HEAD~1 -- temporal-dev.ym?",
        "git checkout HEAD~1",
        "git reset --hard HEAD~1",
        "git rm -r --cached -q .ai",
        "git mv .ai .ai_old",
        "git restore -s HEAD~1 .ai/directives/deploy.md",
        "cp notes/temporal-dev.yml .",
        "cp -b -S l notes/x temporal-dev.ym",
        "cp -t . notes/temporal-dev.yml",
    ):
        refused = await runs.call_tool(run_id, "shell.run", {"command": command})
        assert refused.status == "denied", (command, refused)
    wrote = await runs.call_tool(
        run_id, "filesystem.write", {"path": ".ai/directives/deploy.md", "content": old_deploy}
    )
    assert wrote.status == "denied" and "protected place '.ai/directives'" in wrote.reason, wrote
    after = {p: p.read_bytes() for p in (project / ".ai").rglob("*") if p.is_file() and "logs" not in p.parts}
    assert after == before
    assert not (project / "temporal-dev.yml").exists()
    # What a refactoring directive does with git and cp still works.
    write(project / "notes" / "a.md", "a\n")
    for command in (
        "git status --porcelain",
        "git checkout -b other",
        "cp notes/a.md notes/b.md",
        "cp notes/a.md .",
    ):
        done = await runs.call_tool(run_id, "shell.run", {"command": command})
        assert done.status == "ok" and done.result["exit_code"] == 0, (command, done)
    await runs.cancel(run_id)
    history = await _replays(runs, run_id)
    assert "kiwi-shell-paths-whole" in str(history.events)


BODY_NOTE = '<step name="work"><action>Work.</action></step>'


def test_an_output_schema_with_unevaluated_properties_is_checked_in_time():
    """Found by the second s18 review: jsonschema works out unevaluatedProperties with Python's re over
    patternProperties, outside the keywords the deadline bounds: `^(a+)+$` against 28 characters took 8 s of
    the worker's loop. unevaluatedProperties/Items are not checked; the rest of the schema is, in time."""
    from kiwi.upstream.schemacheck import output_validator

    check = output_validator(
        "t",
        {
            "type": "object",
            "unevaluatedProperties": False,
            "patternProperties": {"^(a+)+$": {"type": "string"}},
        },
    )
    # (Unbounded, the unevaluatedProperties walk ran out the deadline and the next keyword raised CheckTooSlow.)
    problems = list(check.iter_errors({"a" * 30 + "!": 1, "aaa": 2}))
    assert [p.message for p in problems] == ["2 is not of type 'string'"]


async def test_attack_rewrite_then_delete_a_signed_directive_or_copy_a_user_one_beside_it(
    runs, project, temporal_env, monkeypatch, tmp_path_factory
):
    """Found by the second s18 review: the agent could not delete a signed directive, but could rewrite it
    (saved unsigned) and then delete it, its id free for the registry's version with the grants a human had
    removed; and `load(copy_to_project=true)` of a user-space directive of the same id (broad grants) wrote
    a second file beside the project's (narrow), and won by its path. Safe: a directive that was signed when
    the agent rewrote it stays the human's to delete; a copy beside a project item of the same id is refused."""
    from mcp.client import Client

    from mcp_frontend.server import build_server
    from tests.helpers import data

    user = tmp_path_factory.mktemp("user-ai")
    monkeypatch.setenv("AI_USER_SPACE", str(user))
    narrow = '<read resource="filesystem" path="notes/**"/>'
    write_directive(
        project / ".ai" / "directives" / "ops" / "deploy.md",
        directive_md(BODY_NOTE, name="deploy", permissions=narrow),
    )
    write_directive(
        user / "directives" / "deploy.md",
        directive_md(BODY_NOTE, name="deploy", permissions='<write resource="filesystem" path="**"/>'),
    )
    server = build_server(temporal_env.client, project, task_queue=runs.task_queue)
    async with Client(server) as client:

        async def execute(**arguments):
            return data(await client.call_tool("execute", arguments))

        copied = data(
            await client.call_tool(
                "load",
                {"item_type": "directive", "item_id": "deploy", "source": "user", "copy_to_project": True},
            )
        )
        assert copied.get("error") == "InputInvalid" and "already in the project" in copied["message"], copied
        assert [p.name for p in (project / ".ai" / "directives").rglob("deploy.md")] == ["deploy.md"]
        rewritten = await execute(
            item_type="directive",
            action="update",
            item_id="deploy",
            parameters={"content": directive_md(BODY_NOTE, name="deploy", permissions=narrow)},
        )
        assert rewritten["status"] == "updated", rewritten
        # The answer says the rewrite unsigned it (README trial s39: warnings were empty).
        assert any(
            "the directive was signed, and what an agent writes is not" in w for w in rewritten["warnings"]
        )
        refused = await execute(
            item_type="directive", action="delete", item_id="deploy", parameters={"confirm": True}
        )
        assert refused["error"] == "PermissionDenied" and "only a human deletes it" in refused["message"], (
            refused
        )
        assert (project / ".ai" / "directives" / "ops" / "deploy.md").exists()
        # A directive the agent made itself, never signed, it may still delete.
        made = await execute(
            item_type="directive",
            action="create",
            item_id="draft",
            parameters={"content": directive_md(BODY_NOTE, name="draft")},
        )
        assert made["status"] == "created", made
        gone = await execute(
            item_type="directive", action="delete", item_id="draft", parameters={"confirm": True}
        )
        assert gone["status"] == "deleted", gone


async def test_attack_a_module_the_agent_writes_runs_in_a_python_a_bash_tool_starts(
    runs, project, tmp_path_factory
):
    """Found by the second s18 review: `-P` kept the agent's json.py out of python tools, but a human's bash
    tool that runs `python3 -m json.tool` (in the project, as tools run) imported it. Tools run with
    PYTHONSAFEPATH=1: no Python they start imports from its working folder."""
    import sys

    from tests.helpers import write

    marker = tmp_path_factory.mktemp("outside") / "ran"
    tool = project / ".ai" / "tools" / "ops" / "pretty"
    write(
        tool / "tool.yaml",
        "tool_id: pretty\ntool_type: bash\nversion: '1.0.0'\ncategory: ops\ndescription: Pretty-prints JSON\n"
        "executor:\n  entrypoint: run.sh\nmutates_state: false\n",
    )
    write(tool / "run.sh", f"echo '{{\"a\": 1}}' | {sys.executable} -m json.tool\n")
    grants = '<write resource="filesystem" path="**"/>\n<execute resource="tool" id="pretty"/>'
    run_id = await _run_that_planted(runs, project, marker, grants)
    called = await runs.call_tool(run_id, "pretty", {})
    assert called.status == "ok" and called.result == {"a": 1}, called
    assert not marker.exists(), "the agent's json.py ran in the Python the bash tool started"
    await runs.cancel(run_id)
