"""Kiwi's meta-tools inside a run (kiwi-mcp.search, load, help, execute/run), gated by the
<execute resource="kiwi-mcp" action="..."/> grants: from a step, from the agent, and the attacks."""

from __future__ import annotations

import json
import os

from mcp.client.client import Client
from temporalio.worker import Replayer

from kiwi.auditlog import read_audit
from kiwi.converter import data_converter
from kiwi.items.directive import parse_directive, parse_directive_lenient
from kiwi.items.validation import ungranted_calls
from kiwi.policy import PermissionEntry, entry_problems
from mcp_frontend.server import build_server
from tests.helpers import data, directive_md, kiwi_cli, wait_for, write, write_directive
from workers.main import SANDBOX, WORKFLOWS

AGENT_STEP = '<step name="work"><action>Use Kiwi from inside the run.</action></step>'
ALL_FOUR = '<execute resource="kiwi-mcp" action="search,load,help,execute"/>'
SECRET = "sk-live-do-not-leak"


def kiwi_directive(
    project, name: str, permissions: str, body: str = AGENT_STEP, *, sign: bool = True
) -> None:
    text = directive_md(body, name=name, permissions=permissions)
    path = project / ".ai" / "directives" / f"{name}.md"
    write_directive(path, text) if sign else write(path, text)


async def agent_run(runs, name: str) -> str:
    run_id = await runs.start(name, {})
    await wait_for(lambda: _waiting(runs, run_id), what=f"{name} to wait for the agent")
    return run_id


async def _waiting(runs, run_id):
    return (await runs.status(run_id)).status == "awaiting_agent"


async def audited(project, run_id: str, count: int) -> list[dict]:
    """The run's tool_call audit records once ``count`` of them are written."""

    async def written():
        records = [r for r in read_audit(str(project), run_id) if r["event"] == "tool_call"]
        return records if len(records) >= count else None

    return await wait_for(written, what=f"{count} tool_call audit records of {run_id}")


async def test_a_step_searches_and_loads_project_items_by_itself(runs, project):
    body = (
        '<step name="find"><tool_call><mcp>kiwi-mcp</mcp><tool>search</tool>'
        "<params><query>directive run</query><item_type>knowledge</item_type><limit>3</limit></params>"
        "</tool_call></step>"
        '<step name="read"><tool_call tool="kiwi-mcp.load"><param name="item_type">knowledge</param>'
        '<param name="item_id">{steps.find.outputs.result.results.0.item_id}</param></tool_call></step>'
    )
    kiwi_directive(project, "librarian", '<execute resource="kiwi-mcp" action="search,load"/>', body)
    plan = {
        p.step: p.mode
        for p in parse_directive((project / ".ai/directives/librarian.md").read_text())[0].plan()
    }
    assert plan == {"find": "auto", "read": "auto"}
    run_id = await runs.start("librarian", {})
    result = await runs.handle(run_id).result()
    assert result.status == "completed", result
    found = result.outputs["find"]["result"]["results"]
    assert [r["item_id"] for r in found] == ["kiwi-directives"]
    assert found[0]["path"] == ".ai/knowledge/kiwi-directives.md"
    loaded = result.outputs["read"]["result"]
    assert loaded["item_id"] == "kiwi-directives" and loaded["valid"] is True
    assert loaded["content"] == (project / ".ai/knowledge/kiwi-directives.md").read_text()
    records = await audited(project, run_id, 2)
    assert [(r["tool"], r["decision"], r["origin"]) for r in records] == [
        ("kiwi-mcp.search", "allowed", "step"),
        ("kiwi-mcp.load", "allowed", "step"),
    ]
    # The history (behind its patch) replays on this code.
    await Replayer(
        workflows=WORKFLOWS, data_converter=data_converter, workflow_runner=SANDBOX
    ).replay_workflow(await runs.handle(run_id).fetch_history())


async def test_the_agent_calls_each_meta_tool_through_the_run(runs, project, temporal_env):
    kiwi_directive(
        project,
        "helper",
        ALL_FOUR + '<execute resource="tool" id="word_count"/><write resource="filesystem" path="notes/**"/>',
    )
    kiwi_directive(
        project,
        "note_taker",
        '<write resource="filesystem" path="notes/**"/>',
        '<step name="write"><tool_call tool="filesystem.write"><param name="path">notes/child.txt</param>'
        '<param name="content">from the child</param></tool_call></step>',
    )
    run_id = await agent_run(runs, "helper")

    search = await runs.call_tool(run_id, "kiwi-mcp.search", {"query": "count words", "item_type": "tool"})
    assert search.status == "ok" and search.result["results"][0]["item_id"] == "word_count"
    load = await runs.call_tool(run_id, "kiwi-mcp.load", {"item_type": "tool", "item_id": "word_count"})
    assert load.status == "ok" and "tool_id: word_count" in load.result["content"]
    legacy = await runs.call_tool(run_id, "kiwi-mcp.load", {"directive_name": "note_taker"})
    assert legacy.status == "ok" and [p["mode"] for p in legacy.result["steps_plan"]] == ["auto"]
    helped = await runs.call_tool(run_id, "kiwi-mcp.help", {"topic": "kiwi-mcp"})
    assert helped.status == "ok" and "kiwi-mcp.execute" in helped.result["help"]
    tool = await runs.call_tool(
        run_id,
        "kiwi-mcp.execute",
        {"item_type": "tool", "item_id": "word_count", "parameters": {"text": "a b c"}},
    )
    assert tool.status == "ok" and tool.result["words"] == 3, tool
    child = await runs.call_tool(
        run_id, "kiwi-mcp.execute", {"item_type": "directive", "action": "run", "item_id": "note_taker"}
    )
    assert child.status == "ok" and child.result["status"] == "started", child
    child_id = child.result["run_id"]
    assert (await runs.handle(child_id).result()).status == "completed"
    assert (project / "notes" / "child.txt").read_text() == "from the child"
    # Kiwi MCP's form: kiwi-mcp.run {"directive": NAME, "inputs": {...}}.
    again = await runs.call_tool(run_id, "kiwi-mcp.run", {"directive": "note_taker", "inputs": {}})
    assert again.status == "ok" and again.result["run_id"] != child_id
    # No loop warnings: a tool called through execute counts once.
    assert not tool.warnings
    # `kiwi call TOOL ARGS --run RUN`, as a person at a terminal steers the run.
    address = ["--address", runs.client.service_client.config.target_host, "--task-queue", runs.task_queue]
    code, out, err = await kiwi_cli(
        "call", "kiwi-mcp.search", '{"query": "greeting"}', "--run", run_id, "--json", *address, cwd=project
    )
    assert code == 0, err
    assert json.loads(out)["result"]["results"][0]["item_id"] == "hello_kiwi"

    # Through the MCP front end: the run's start answer lists the meta-tools with their schemas, and the
    # agent's execute(tool, call, run_id) reaches them.
    server = build_server(temporal_env.client, project, task_queue=runs.task_queue)
    async with Client(server) as client:
        started = data(
            await client.call_tool(
                "execute", {"item_type": "directive", "action": "run", "item_id": "helper"}
            )
        )
        listed = started["local_tools"]
        assert {"kiwi-mcp.search", "kiwi-mcp.load", "kiwi-mcp.help", "kiwi-mcp.execute"} <= set(listed)
        assert listed["kiwi-mcp.search"]["input_schema"]["required"] == ["query"]
        # Each built-in says what it does beside its schema (README trial s36: none did).
        assert all(listed[tool]["description"] for tool in listed if listed[tool]["type"] == "built-in"), (
            listed
        )
        answer = data(
            await client.call_tool(
                "execute",
                {
                    "item_type": "tool",
                    "action": "call",
                    "item_id": "kiwi-mcp.search",
                    "run_id": started["run_id"],
                    "parameters": {"query": "hello"},
                },
            )
        )
        assert answer["status"] == "ok" and "hello_kiwi" in [
            r["item_id"] for r in answer["result"]["results"]
        ]
        # Outside a run (the session's base policy) the refusal points at the front end's own tool.
        outside = data(
            await client.call_tool(
                "execute",
                {
                    "item_type": "tool",
                    "action": "call",
                    "item_id": "kiwi-mcp.search",
                    "parameters": {"query": "x"},
                },
            )
        )
        assert outside["status"] == "denied" and "front end's own search tool" in outside["hint"], outside
        await runs.cancel(started["run_id"])
    await runs.cancel(run_id)


async def test_without_its_grant_each_meta_tool_is_denied_and_audited(runs, project):
    kiwi_directive(project, "plain", '<read resource="filesystem" path="notes/**"/>')
    # Declared but unsigned: under signatures: require the base policy, which grants no meta-tool, applies.
    kiwi_directive(project, "unsigned", ALL_FOUR, sign=False)
    calls = [
        ("kiwi-mcp.search", {"query": "hello"}, "search"),
        ("kiwi-mcp.load", {"item_type": "directive", "item_id": "hello_kiwi"}, "load"),
        ("kiwi-mcp.help", {}, "help"),
        ("kiwi-mcp.execute", {"item_type": "directive", "item_id": "hello_kiwi"}, "execute"),
        ("kiwi-mcp.run", {"directive": "hello_kiwi"}, "execute"),
    ]
    for name in ("plain", "unsigned"):
        run_id = await agent_run(runs, name)
        for tool, args, action in calls:
            result = await runs.call_tool(run_id, tool, args)
            assert result.status == "denied" and result.error_type == "PermissionDenied", (name, result)
            if name == "plain":
                assert f'<execute resource="kiwi-mcp" action="{action}"/>' in result.hint, result
            else:  # it declares the grant: what it lacks is a signature
                assert "`kiwi sign .ai/directives/unsigned.md`" in result.hint, result
            assert result.result is None
        records = await audited(project, run_id, len(calls))
        assert [(r["tool"], r["decision"]) for r in records] == [(t, "denied") for t, _, _ in calls]
        assert all("kiwi-mcp" in r["hint"] for r in records)
        assert (await runs.status(run_id)).children == []
        await runs.cancel(run_id)
    assert await runs.list_runs(directive="hello_kiwi") == []


async def test_a_child_run_through_execute_cannot_gain_what_its_parent_lacks(runs, project):
    kiwi_directive(
        project,
        "parent",
        '<execute resource="kiwi-mcp" action="execute"/><write resource="filesystem" path="notes/**"/>',
    )
    kiwi_directive(
        project,
        "greedy",
        '<execute resource="kiwi-mcp" action="search,execute"/><write resource="filesystem" path="notes/**"/>'
        '<write resource="filesystem" path="src/**"/>',
    )
    run_id = await agent_run(runs, "parent")
    refused = await runs.call_tool(
        run_id, "kiwi-mcp.execute", {"item_type": "directive", "item_id": "greedy"}
    )
    assert refused.status == "denied"
    assert "kiwi-mcp search" in refused.reason and "write src/**" in refused.reason
    assert await runs.list_runs(directive="greedy") == []
    await runs.cancel(run_id)

    # Run with the intersection instead: the child has the parent's kiwi-mcp execute, never search.
    write(project / ".ai" / "config" / "agent_harness.yaml", "child_runs:\n  on_escalation: intersect\n")
    run_id = await agent_run(runs, "parent")
    started = await runs.call_tool(run_id, "kiwi-mcp.run", {"directive": "greedy"})
    assert started.status == "ok" and set(started.result["narrowed"]) == {
        "kiwi-mcp search",
        "read src/**",
        "write src/**",
    }
    child_id = started.result["run_id"]
    await wait_for(lambda: _waiting(runs, child_id), what="the child to wait")
    search = await runs.call_tool(child_id, "kiwi-mcp.search", {"query": "hello"})
    assert search.status == "denied" and 'action="search"' in search.hint
    outside = await runs.call_tool(
        child_id, "kiwi-mcp.execute", {"item_type": "directive", "item_id": "greedy"}
    )
    assert outside.status == "ok"  # execute is granted to both; the grandchild is narrowed the same way
    grandchild = outside.result["run_id"]
    await wait_for(lambda: _waiting(runs, grandchild), what="the grandchild to wait")
    assert (await runs.call_tool(grandchild, "kiwi-mcp.search", {"query": "x"})).status == "denied"
    written = await runs.call_tool(grandchild, "filesystem.write", {"path": "src/app.py", "content": "x"})
    assert written.status == "denied" and not (project / "src").exists()

    async def escalations():
        return [r for r in read_audit(str(project), run_id) if r["event"] == "escalation_attempt"]

    recorded = await wait_for(escalations, what="the escalation attempt's audit record")
    assert "kiwi-mcp search" in recorded[0]["excess"] and recorded[0]["outcome"] == "narrowed"
    for each in (grandchild, child_id, run_id):
        await runs.cancel(each)


async def test_execute_of_a_tool_the_run_is_not_granted_is_denied(runs, project):
    kiwi_directive(project, "caller", '<execute resource="kiwi-mcp" action="execute"/>')
    run_id = await agent_run(runs, "caller")
    for args in (
        {"item_type": "tool", "item_id": "word_count", "parameters": {"text": "a b"}},
        {"tool_name": "word_count", "parameters": {"text": "a b"}},
        {"item_type": "tool", "item_id": "filesystem.write", "parameters": {"path": "x.txt", "content": "x"}},
        {"item_type": "tool", "item_id": "directive.run", "parameters": {"directive": "hello_kiwi"}},
    ):
        result = await runs.call_tool(run_id, "kiwi-mcp.execute", args)
        assert result.status == "denied", (args, result)
        assert '<execute resource="tool" id=' in result.hint or "<write" in result.hint, result
    assert not (project / "x.txt").exists()
    assert await runs.list_runs(directive="hello_kiwi") == []
    records = await audited(project, run_id, 8)
    # Each attempt is two denied records: the tool itself, and the execute that asked for it.
    assert [r["tool"] for r in records][:2] == ["word_count", "kiwi-mcp.execute"]
    assert {r["decision"] for r in records} == {"denied"}
    # Calling a meta-tool through execute is refused as an argument, before anything is scheduled.
    nested = await runs.call_tool(
        run_id, "kiwi-mcp.execute", {"item_type": "tool", "item_id": "kiwi-mcp.search"}
    )
    assert nested.status == "error" and nested.error_type == "InputInvalid"
    await runs.cancel(run_id)


async def test_load_reaches_only_item_files_never_a_secret(runs, project):
    tool_dir = project / ".ai" / "tools" / "text" / "word_count"
    write(tool_dir / ".env", f"API_KEY={SECRET}\n")
    write(project / ".env", f"API_KEY={SECRET}\n")
    write(tool_dir / "credentials.yaml", f"api_key: {SECRET}\n")  # listed as a broken tool, not an item
    knowledge = project / ".ai" / "knowledge"
    # Links that look like items: the agent (or a hostile file it fetched) made them.
    os.symlink("../tools/text/word_count/.env", knowledge / "leak.md")
    os.symlink(str(project / ".env"), knowledge / "leak-abs.md")
    outside = project.parent / f"{project.name}-outside"
    write(outside / "notes.md", f"---\nzettel_id: linked\ntitle: {SECRET}\n---\n{SECRET}\n")
    os.symlink(str(outside / "notes.md"), knowledge / "linked.md")
    kiwi_directive(project, "reader", '<execute resource="kiwi-mcp" action="search,load"/>')
    run_id = await agent_run(runs, "reader")
    attempts = [
        {"item_type": "knowledge", "item_id": "leak"},
        {"item_type": "knowledge", "item_id": "leak-abs"},
        {"item_type": "knowledge", "item_id": "linked"},
        {"item_type": "tool", "item_id": ".env"},
        {"item_type": "tool", "item_id": "credentials"},
        {"tool_name": "credentials"},
        {"item_type": "tool", "item_id": "../../.env"},
        {"item_type": "knowledge", "item_id": "../config/agent_harness"},
        {"item_type": "directive", "item_id": "/etc/passwd"},
        {"zettel_id": "../../../.env"},
    ]
    for args in attempts:
        result = await runs.call_tool(run_id, "kiwi-mcp.load", args)
        assert result.status in ("denied", "error"), (args, result)
        assert result.error_type in ("PermissionDenied", "ItemNotFound"), (args, result)
        assert SECRET not in json.dumps(result.model_dump()), args
    linked = await runs.call_tool(run_id, "kiwi-mcp.load", {"item_type": "knowledge", "item_id": "linked"})
    assert linked.status == "denied" and "symbolic link" in linked.reason
    # Search does not show a linked file's text either.
    found = await runs.call_tool(run_id, "kiwi-mcp.search", {"query": SECRET.split("-")[-1]})
    assert found.status == "ok" and SECRET not in json.dumps(found.result)
    # The real item next to the secret still loads.
    real = await runs.call_tool(run_id, "kiwi-mcp.load", {"item_type": "tool", "item_id": "word_count"})
    assert real.status == "ok" and SECRET not in real.result["content"]
    await runs.cancel(run_id)


async def test_authoring_is_refused_inside_a_run(runs, project):
    kiwi_directive(project, "author", ALL_FOUR)
    run_id = await agent_run(runs, "author")
    before = sorted(p.name for p in (project / ".ai" / "directives").iterdir())
    content = directive_md(AGENT_STEP, name="evil", permissions='<execute resource="shell" commands="*"/>')
    for action, args in (
        ("create", {"item_type": "directive", "item_id": "evil", "parameters": {"content": content}}),
        ("update", {"item_type": "directive", "item_id": "author", "parameters": {"content": content}}),
        ("delete", {"item_type": "directive", "item_id": "hello_kiwi", "parameters": {"confirm": True}}),
        ("publish", {"item_type": "directive", "item_id": "hello_kiwi"}),
        ("sign", {"item_type": "directive", "item_id": "author"}),
    ):
        result = await runs.call_tool(run_id, "kiwi-mcp.execute", {**args, "action": action})
        assert result.status == "denied" and "not available inside a run" in result.reason, result
        assert "kiwi sign" in result.hint
    assert sorted(p.name for p in (project / ".ai" / "directives").iterdir()) == before
    assert "evil" not in (project / ".ai" / "directives" / "author.md").read_text()
    await runs.cancel(run_id)


async def test_bad_arguments_are_input_invalid_before_anything_is_scheduled(runs, project):
    kiwi_directive(project, "picky", ALL_FOUR)
    run_id = await agent_run(runs, "picky")
    for tool, args, named in (
        ("kiwi-mcp.search", {}, "'query'"),
        ("kiwi-mcp.search", {"query": "x", "limit": 0}, "'limit'"),
        ("kiwi-mcp.search", {"query": "x", "source": "registry"}, "source"),
        ("kiwi-mcp.search", {"query": "x", "item_type": "run"}, "'item_type'"),
        ("kiwi-mcp.load", {"item_id": "x"}, "'item_type'"),
        ("kiwi-mcp.execute", {"item_type": "directive"}, "'item_id'"),
        ("kiwi-mcp.execute", {"item_type": "knowledge", "item_id": "kiwi-directives"}, "'item_type'"),
        ("kiwi-mcp.execute", {"item_id": "hello_kiwi", "inputs": "name=Ada"}, "'inputs'"),
    ):
        result = await runs.call_tool(run_id, tool, args)
        assert result.status == "error" and result.error_type == "InputInvalid", (tool, args, result)
        assert named in result.reason and result.hint, result
    await runs.cancel(run_id)


def test_validation_names_the_kiwi_mcp_grant_a_step_needs():
    body = (
        '<step name="find"><tool_call tool="kiwi-mcp.search"><param name="query">x</param></tool_call></step>'
        '<step name="go"><tool_call><mcp>kiwi-mcp</mcp><tool>run</tool><params><directive>d</directive>'
        "</params></tool_call></step>"
        '<step name="make"><tool_call tool="kiwi-mcp.execute"><param name="action">create</param>'
        '<param name="item_id">x</param></tool_call></step>'
    )
    directive, _ = parse_directive(
        directive_md(body, permissions='<execute resource="kiwi-mcp" action="execute"/>')
    )
    problems = [p.message for p in ungranted_calls(directive, "d.md")]
    assert len(problems) == 2, problems
    assert (
        "kiwi-mcp.search" in problems[0]
        and 'add <execute resource="kiwi-mcp" action="search"/>' in problems[0]
    )
    assert "authors items" in problems[1]
    # Grants that mean nothing are errors naming the right spelling, never "all".
    typo = PermissionEntry(tag="execute", attrs={"resource": "kiwi-mcp", "action": "serch"})
    assert "did you mean search" in entry_problems(typo)[0]
    assert entry_problems(PermissionEntry(tag="execute", attrs={"resource": "kiwi-mcp"}))
    every = parse_directive(directive_md(AGENT_STEP, permissions='<execute resource="kiwi-mcp" action="*"/>'))
    grants = every[0].grants()
    assert all(grants.check_tool_id(t).allowed for t in ("kiwi-mcp.search", "kiwi-mcp.run", "kiwi-mcp.help"))
    # A tool-id grant or an MCP grant for a server called kiwi-mcp never reaches the meta-tools.
    for other in (
        '<execute resource="tool" id="*"/>',
        '<execute resource="mcp" name="kiwi-mcp" actions="*"/>',
    ):
        assert (
            not parse_directive(directive_md(AGENT_STEP, permissions=other))[0]
            .grants()
            .check_tool_id("kiwi-mcp.search")
            .allowed
        )
    # An external MCP server may not take Kiwi's own name.
    _, found = parse_directive_lenient(
        directive_md(
            AGENT_STEP, tools='<mcps><mcp name="kiwi-mcp"><tools><tool>search</tool></tools></mcp></mcps>'
        )
    )
    assert any('<mcp name="kiwi-mcp"> names Kiwi itself' in p.message for p in found if p.severity == "error")
    spelled = parse_directive(
        directive_md(AGENT_STEP, permissions='<execute resource="kiwi-mcp" actions="load"/>')
    )
    assert spelled[0].grants().kiwi_actions == ["load"]


async def test_a_kiwi_mcp_execute_waiting_for_its_calls_approval_says_so(runs, project):
    # kiwi-mcp.execute of an approval-gated tool waits on the call it makes: the 'pending' answer names
    # that approval, as it does for the tool called directly.
    from tests.helpers import approver

    write(
        project / ".ai" / "config" / "agent_harness.yaml",
        "approvals:\n  tools: [filesystem.delete]\n  timeout_seconds: 3600\n",
    )
    approver("alice")
    write(project / "notes" / "old.txt", "old")
    kiwi_directive(
        project,
        "tidy_via_kiwi",
        ALL_FOUR + '<write resource="filesystem" path="notes/**"/>',
    )
    run_id = await agent_run(runs, "tidy_via_kiwi")
    pending = await runs.call_tool_waiting(
        run_id,
        "kiwi-mcp.execute",
        {"item_type": "tool", "item_id": "filesystem.delete", "parameters": {"path": "notes/old.txt"}},
        client_name="agent",
        wait_seconds=0.5,
    )
    assert pending.status == "pending" and "waits for a human to approve it" in pending.reason, pending
    assert (project / "notes" / "old.txt").exists()
    await runs.cancel(run_id)
