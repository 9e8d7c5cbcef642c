"""The MCP front end with a real MCP client: in memory, over stdio, and over streamable HTTP."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys

import httpx
from mcp.client import Client
from mcp.client.stdio import StdioServerParameters

from kiwi.cli import main as kiwi_main
from kiwi.cli.keys import ensure_key
from kiwi.devserver import free_port
from mcp_frontend.server import build_server
from tests.helpers import data, wait_for


async def agent_session(client: Client) -> str:
    """What an agent does: find, load, run, call through the run, complete the step, see it done."""
    listed = {t.name: t for t in (await client.list_tools()).tools}
    assert set(listed) == {"search", "load", "execute", "help"}
    assert listed["search"].annotations.read_only_hint is True
    assert (
        listed["execute"].annotations.destructive_hint is True
        and not listed["execute"].annotations.read_only_hint
    )
    # execute shows one example per action it takes, and says where a run id goes.
    schema = listed["execute"].input_schema["properties"]
    for action in schema["action"]["enum"]:
        assert f"action='{action}'" in listed["execute"].description, action
    for item_type in schema["item_type"]["enum"]:
        assert f"item_type='{item_type}'" in listed["execute"].description, item_type
    assert "not the run id" in schema["item_id"]["description"]
    # Output schemas the client checks every answer against (an answer that does not fit fails the call).
    assert listed["search"].output_schema["required"] == ["results"]
    assert listed["load"].output_schema["required"] == ["item_type", "item_id"]
    assert {"run_id", "state", "status", "result", "current_step"} <= set(
        listed["execute"].output_schema["properties"]
    )
    assert {"help", "status", "request_id"} <= set(listed["help"].output_schema["properties"])
    found = data(await client.call_tool("search", {"item_type": "directive", "query": "greeting"}))
    assert found["results"][0]["item_id"] == "hello_kiwi"
    # search reports the item space with the value load takes ('local' is an alias of 'project').
    space = found["results"][0]["source"]
    assert space == "project"
    for source in (space, "local"):
        same = data(
            await client.call_tool(
                "load", {"item_type": "directive", "item_id": "hello_kiwi", "source": source}
            )
        )
        assert same["source"] == "project" and same["item_id"] == "hello_kiwi"
    loaded = data(await client.call_tool("load", {"item_type": "directive", "item_id": "hello_kiwi"}))
    assert [p["mode"] for p in loaded["steps_plan"]] == ["auto", "auto", "agent"]
    started = data(
        await client.call_tool(
            "execute",
            {
                "item_type": "directive",
                "action": "run",
                "item_id": "hello_kiwi",
                "parameters": {"name": "Mo"},
            },
        )
    )
    run_id = started["run_id"]
    assert started["state"] == "awaiting_agent" and started["current_step"]["name"] == "confirm"
    read = data(
        await client.call_tool(
            "execute",
            {
                "item_type": "tool",
                "action": "call",
                "run_id": run_id,
                "item_id": "filesystem.read",
                "parameters": {"path": "notes/hello.md"},
            },
        )
    )
    assert read.get("status") == "ok", read
    assert "Hello, Mo" in read["result"]["content"]
    denied = data(
        await client.call_tool(
            "execute",
            {
                "item_type": "tool",
                "action": "call",
                "run_id": run_id,
                "item_id": "filesystem.write",
                "parameters": {"path": "../escape.txt", "content": "x"},
            },
        )
    )
    assert denied["status"] == "denied"
    # A complete_step naming no step is the agent's input to fix (it was a bare KiwiError).
    stepless = data(
        await client.call_tool(
            "execute", {"item_type": "run", "action": "complete_step", "run_id": run_id, "parameters": {}}
        )
    )
    assert stepless["error"] == "InputInvalid" and "parameters.step" in stepless["message"], stepless
    # Wrongly typed, as agents send them: each an InputInvalid naming the field and its shape (they were an
    # unhandled pydantic error: "Error executing tool execute", nothing more, in a README trial).
    for parameters, says in (
        ({"step": "confirm", "outputs": "yes"}, "parameters.outputs is the text 'yes'; it is an object"),
        ({"step": "confirm", "outputs": ["confirmed"]}, "parameters.outputs is an array; it is an object"),
        ({"step": ["confirm"], "outputs": {}}, "the step's name (a string), not an array"),
    ):
        wrong = data(
            await client.call_tool(
                "execute",
                {"item_type": "run", "action": "complete_step", "run_id": run_id, "parameters": parameters},
            )
        )
        assert wrong["error"] == "InputInvalid" and says in wrong["message"], wrong
        assert "parameters={'step'" in wrong["hint"], wrong
    # The run's id where the tool's goes (README trial s33: "no tool 'run-...' in this run", sent outside any
    # run): the answer says the call was made outside a run and where the run's id goes.
    for where in ({}, {"run_id": run_id}):
        misplaced = data(
            await client.call_tool(
                "execute",
                {"item_type": "tool", "action": "call", "item_id": run_id, "parameters": {}, **where},
            )
        )
        assert misplaced["error_type"] == "ToolNotFound", misplaced
        said = "in this run" if where else "outside a run (the base policy's tools)"
        assert misplaced["reason"] == f"no tool '{run_id}' {said}", misplaced
        assert misplaced["hint"].startswith(f"'{run_id}' is a run's id, not a tool's: the run goes in run_id")
    unnamed = data(
        await client.call_tool("execute", {"item_type": "run", "action": "poll", "run_id": run_id})
    )
    assert unnamed["error"] == "InputInvalid" and unnamed["message"].startswith("poll needs item_id"), unnamed
    done = data(
        await client.call_tool(
            "execute",
            {
                "item_type": "run",
                "action": "complete_step",
                "run_id": run_id,
                "parameters": {"step": "confirm", "outputs": {"confirmed": True}},
            },
        )
    )
    assert done["state"] == "completed"
    # wait_seconds 0 on a finished run, and a poll of a call id the run never had: each says so (they
    # answered 'pending' with a call id to poll, for a call never sent: review s33).
    late = data(
        await client.call_tool(
            "execute",
            {
                "item_type": "tool",
                "action": "call",
                "run_id": run_id,
                "item_id": "filesystem.read",
                "parameters": {"path": "notes/hello.md"},
                "wait_seconds": 0,
            },
        )
    )
    assert late.get("status") != "pending" and late["error"] == "RunFinished", late
    unknown = data(
        await client.call_tool(
            "execute",
            {
                "item_type": "run",
                "action": "poll",
                "run_id": run_id,
                "item_id": "zzz-no-call",
                "wait_seconds": 0,
            },
        )
    )
    assert unknown.get("status") != "pending" and "has no call 'zzz-no-call'" in unknown["message"], unknown
    return run_id


def kiwi_mcp_stdio(temporal_env, runs, project) -> StdioServerParameters:
    """`kiwi mcp` as an MCP client config would start it, against the test's Temporal and queue."""
    address = temporal_env.client.service_client.config.target_host
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "kiwi", "mcp", "--address", address, "--task-queue", runs.task_queue],
        cwd=str(project),
        env={**os.environ},
    )


async def test_in_memory_agent_flow_and_error_shape(runs, project, temporal_env):
    server = build_server(temporal_env.client, project, task_queue=runs.task_queue)
    async with Client(server) as client:
        await agent_session(client)
        answer = await client.call_tool(
            "execute", {"item_type": "directive", "action": "run", "item_id": "nope"}
        )
        assert answer.is_error, "an error must come back with isError: true"
        missing = data(answer)
        assert missing["error"] == "ItemNotFound" and missing["item_id"] == "nope" and missing["hint"]
        bad = data(
            await client.call_tool(
                "execute",
                {"item_type": "directive", "action": "run", "item_id": "hello_kiwi", "parameters": {}},
            )
        )
        assert bad["error"] == "InputInvalid" and "required input 'name'" in bad["message"]
        signal_ = data(
            await client.call_tool("help", {"action": "stuck", "run_id": "run-none-x", "reason": "r"})
        )
        assert signal_["error"] == "RunNotFound"
        # No run named: a typed InputInvalid, not the generic KiwiError (README trial s39).
        unnamed = data(await client.call_tool("help", {"action": "stuck", "reason": "r"}))
        assert unnamed["error"] == "InputInvalid" and "needs run_id" in unnamed["message"], unnamed
        # Hints name the MCP call an agent can make, not a command line it cannot reach.
        assert "search(item_type='run')" in signal_["hint"] and "`kiwi runs`" not in signal_["hint"]
        assert "search(item_type=" in missing["hint"] and "`kiwi search`" not in missing["hint"], missing
        guidance = data(await client.call_tool("help", {"topic": "tools"}))
        assert "word_count" in guidance["help"]


async def test_every_action_in_memory(runs, project, temporal_env):
    server = build_server(temporal_env.client, project, task_queue=runs.task_queue)
    async with Client(server) as client:

        async def call(tool, **arguments):
            return data(await client.call_tool(tool, arguments))

        valid = await call("execute", item_type="directive", action="validate", item_id="hello_kiwi")
        assert valid["valid"] is True and [s["mode"] for s in valid["steps"]] == ["auto", "auto", "agent"]
        run_id = (
            await call(
                "execute",
                item_type="directive",
                action="run",
                item_id="hello_kiwi",
                parameters={"name": "Al"},
                idempotency_key="k1",
            )
        )["run_id"]
        again = await call(
            "execute",
            item_type="directive",
            action="run",
            item_id="hello_kiwi",
            parameters={"name": "Al"},
            idempotency_key="k1",
        )
        assert again["run_id"] == run_id
        assert (await call("search", item_type="run", status="awaiting_agent"))["results"][0][
            "run_id"
        ] == run_id
        assert (await call("search", item_type="knowledge", query="temporal workflow", source="local"))[
            "results"
        ][0]["item_id"] == "kiwi-directives"
        escalated = await call(
            "help", action="escalate", run_id=run_id, reason="need escalate", options=["ship", "wait"]
        )
        assert escalated["status"] == "escalated" and escalated["request_id"] in escalated["message"]
        checkpoint = await call("help", action="checkpoint", run_id=run_id, reason="need checkpoint")
        # (hello_kiwi grants no git.checkpoint, and the escalation holds the run: no checkpoint, said so.)
        assert checkpoint["error"] == "PermissionDenied" and "no checkpoint taken" in checkpoint["message"]
        session = await call(
            "execute", item_type="tool", action="call", item_id="word_count", parameters={"text": "one two"}
        )
        assert session["status"] == "ok" and session["result"]["words"] == 2
        # The seeds' execute(tool, run) is the same call.
        ran = await call(
            "execute", item_type="tool", action="run", item_id="word_count", parameters={"text": "a b c"}
        )
        assert ran["status"] == "ok" and ran["result"]["words"] == 3
        refused = await call(
            "execute",
            item_type="tool",
            action="call",
            item_id="filesystem.write",
            parameters={"path": "notes/x.md", "content": "x"},
        )
        assert refused["status"] == "denied" and "agent_harness.yaml" in refused["hint"], refused
        assert "<permissions>" not in refused["hint"]
        assert 'internal_tools: {filesystem: {write: ["notes/**"]}}' in refused["hint"]
        status = await call("execute", item_type="run", action="status", run_id=run_id)
        assert [h["kind"] for h in status["help"]] == ["escalate", "checkpoint"]
        assert status["status"] == "awaiting_human"
        assert [(d["request_id"], d["options"]) for d in status["decisions"]] == [
            (escalated["request_id"], ["ship", "wait"])
        ]
        assert (await call("execute", item_type="run", action="cancel", run_id=run_id))[
            "status"
        ] == "cancel_requested"

        async def cancelled():
            return (await call("execute", item_type="run", action="status", run_id=run_id))[
                "status"
            ] == "cancelled"

        await wait_for(cancelled, what="cancel")
        wrong = await call("execute", item_type="run", action="create", item_id="x")
        assert wrong["error"] == "KiwiError" and "does not apply" in wrong["message"]
        guidance = await call("help", topic="tools")
        assert '"text"' in guidance["help"]  # word_count's real parameter schema


async def test_stdio_end_to_end_with_the_kiwi_mcp_command(runs, project, temporal_env):
    params = kiwi_mcp_stdio(temporal_env, runs, project)
    async with Client(params) as client:
        run_id = await agent_session(client)
    assert (await runs.status(run_id)).status == "completed"


async def test_http_refuses_foreign_origin_and_missing_token(runs, project, temporal_env):
    address = temporal_env.client.service_client.config.target_host
    port = free_port()
    env = {**os.environ, "KIWI_MCP_TOKEN": "s3cret"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "kiwi",
        "mcp",
        "--http",
        "--port",
        str(port),
        "--address",
        address,
        "--task-queue",
        runs.task_queue,
        cwd=str(project),
        env=env,
        start_new_session=True,
        stderr=asyncio.subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}/mcp"
    init = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"},
        },
    }
    headers = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
    try:
        async with httpx.AsyncClient(timeout=10) as http:

            async def up():
                try:
                    return (await http.post(url, json=init, headers=headers)).status_code
                except httpx.TransportError:
                    return None

            assert await wait_for(up, what="MCP HTTP server") == 401
            ok = await http.post(url, json=init, headers={**headers, "authorization": "Bearer s3cret"})
            assert ok.status_code == 200
            foreign = await http.post(
                url,
                json=init,
                headers={**headers, "authorization": "Bearer s3cret", "origin": "http://evil.example"},
            )
            assert foreign.status_code == 403
            wrong = await http.post(url, json=init, headers={**headers, "authorization": "Bearer nope"})
            assert wrong.status_code == 401
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        await proc.wait()


async def test_front_end_restarted_mid_run_the_agent_carries_on_with_the_same_run(
    runs, project, temporal_env
):
    params = kiwi_mcp_stdio(temporal_env, runs, project)
    async with Client(params) as first:
        started = data(
            await first.call_tool(
                "execute",
                {
                    "item_type": "directive",
                    "action": "run",
                    "item_id": "hello_kiwi",
                    "parameters": {"name": "Re"},
                },
            )
        )
    run_id = started["run_id"]
    # The first front-end process has exited; a new one knows nothing but the run id.
    async with Client(params) as second:
        status = data(
            await second.call_tool("execute", {"item_type": "run", "action": "status", "run_id": run_id})
        )
        assert status["status"] == "awaiting_agent" and status["current_step"]["name"] == "confirm"
        done = data(
            await second.call_tool(
                "execute",
                {
                    "item_type": "run",
                    "action": "complete_step",
                    "run_id": run_id,
                    "parameters": {"step": "confirm"},
                },
            )
        )
        assert done["state"] == "completed"


async def test_authoring_directives_and_knowledge_writes_only_valid_items(
    runs, project, temporal_env, monkeypatch, tmp_path_factory
):
    from tests.helpers import directive_md, write

    user = tmp_path_factory.mktemp("user-ai")
    monkeypatch.setenv("AI_USER_SPACE", str(user))
    server = build_server(temporal_env.client, project, task_queue=runs.task_queue)
    good = directive_md(
        '<step name="w"><tool_call tool="filesystem.write"><param name="path">notes/made.txt</param>'
        '<param name="content">made</param></tool_call></step>',
        name="made",
        permissions='<write resource="filesystem" path="notes/**"/>',
    )
    async with Client(server) as client:

        async def execute(**arguments):
            return data(await client.call_tool("execute", arguments))

        bad = await execute(
            item_type="directive",
            action="create",
            item_id="made",
            parameters={"content": good.replace('name="w"', "")},
        )
        assert bad["error"] == "ItemInvalid" and "<step> needs a name attribute" in bad["message"]
        assert not list((project / ".ai" / "directives").rglob("made.md"))
        created = await execute(
            item_type="directive", action="create", item_id="made", parameters={"content": good}
        )
        assert created["status"] == "created" and created["path"].endswith("tests/made.md")
        again = await execute(
            item_type="directive", action="create", item_id="made", parameters={"content": good}
        )
        assert again["error"] == "InputInvalid" and "already exists" in again["message"]
        updated = await execute(
            item_type="directive",
            action="update",
            item_id="made",
            parameters={"content": good.replace(">made<", ">made twice<")},
        )
        assert updated["status"] == "updated"
        # Written by the agent, so nobody trusted signed it: it runs with the base policy only,
        # which grants no writes, and says so.
        started = await execute(item_type="directive", action="run", item_id="made")
        assert started["state"] == "failed" and started["trust"]["grants"] == "base"
        assert "not signed by a trusted key" in started["trust"]["note"] and started["permissions"] == {
            "fs_read": ["notes/**"]
        }
        assert not (project / "notes" / "made.txt").exists()
        # A human reads it and signs it: now its own grants apply.
        made = next((project / ".ai" / "directives").rglob("made.md"))
        signer = ensure_key()[0]  # this test's user space is its own: trust a key there
        assert kiwi_main(["sign", "--key", signer, str(made)]) == 0
        started = await execute(item_type="directive", action="run", item_id="made")
        assert started["state"] == "completed" and started["trust"]["trusted"] is True
        assert (project / "notes" / "made.txt").read_text() == "made twice"
        refused = await execute(item_type="directive", action="delete", item_id="made")
        assert refused["error"] == "InputInvalid" and "confirm=true" in refused["message"]
        # Signed, it is a human's decision: the agent cannot delete it (gone, its id was free for an older
        # signed version with grants the human had removed).
        refused = await execute(
            item_type="directive", action="delete", item_id="made", parameters={"confirm": True}
        )
        assert refused["error"] == "PermissionDenied", refused
        assert "directive 'made' is signed: only a human deletes it" in refused["message"]
        assert made.exists()
        # What the agent writes is saved unsigned; a directive that was signed when the agent rewrote it stays
        # the human's to delete (second s18 review: rewrite, then delete, freed its id).
        rewritten = await execute(
            item_type="directive",
            action="update",
            item_id="made",
            parameters={"content": made.read_text(encoding="utf-8").replace(">made twice<", ">made thrice<")},
        )
        assert rewritten["status"] == "updated" and "signature" in rewritten, rewritten
        assert "dropped" in rewritten["signature"] and "kiwi sign" in rewritten["signature"]
        assert not made.read_text(encoding="utf-8").startswith("<!-- kiwi:signed")
        refused = await execute(
            item_type="directive", action="delete", item_id="made", parameters={"confirm": True}
        )
        assert refused["error"] == "PermissionDenied" and "only a human deletes it" in refused["message"]
        made.unlink()  # (the human does)
        assert not list((project / ".ai" / "directives").rglob("made.md"))

        note = await execute(
            item_type="knowledge",
            action="create",
            item_id="retry-policy",
            parameters={
                "title": "Retry policies",
                "entry_type": "pattern",
                "tags": ["temporal"],
                "content": "Back off exponentially.",
            },
        )
        assert note["status"] == "created"
        # Fields of the wrong type: InputInvalid naming each (an unhandled pydantic error before).
        wrong = await execute(
            item_type="knowledge",
            action="create",
            item_id="typed-wrong",
            parameters={"title": 5, "tags": "a,b", "content": ["x"]},
        )
        assert wrong["error"] == "InputInvalid", wrong
        for says in (
            "'title' must be a valid string, got the number 5",
            "'tags' must be a valid list, got the text 'a,b'",
            "'content' must be a valid string, got an array",
        ):
            assert says in wrong["message"], wrong
        assert not list((project / ".ai" / "knowledge").rglob("typed-wrong.md"))
        # A NUL in a field (written into the file as it came, review s33), and link's arguments of the wrong
        # shape ("no knowledge '['kiwi-directives']'"): InputInvalid naming them.
        nul = await execute(
            item_type="knowledge",
            action="create",
            item_id="nul",
            parameters={"title": "T\x00", "content": "c"},
        )
        assert (
            nul["error"] == "InputInvalid" and "'title' holds a control character (U+0000)" in nul["message"]
        )
        assert not list((project / ".ai" / "knowledge").rglob("nul.md"))
        for parameters, says in (
            ({}, "knowledge link needs parameters.to, the zettel_id it links to"),
            (
                {"to": ["kiwi-directives"]},
                "parameters.to, the zettel_id it links to (a string, not an array)",
            ),
            (
                {"to": "kiwi-directives", "relation": 7},
                "parameters.relation, a relation's name (a string, not",
            ),
        ):
            wrong = await execute(
                item_type="knowledge", action="link", item_id="retry-policy", parameters=parameters
            )
            assert wrong["error"] == "InputInvalid" and says in wrong["message"], wrong
        contentless = await execute(
            item_type="directive", action="create", item_id="x", parameters={"content": 7}
        )
        assert contentless["error"] == "InputInvalid" and "not the number 7" in contentless["message"], (
            contentless
        )
        await execute(
            item_type="knowledge",
            action="update",
            item_id="retry-policy",
            parameters={"content": "Back off exponentially, with a cap."},
        )
        linked = await execute(
            item_type="knowledge", action="link", item_id="retry-policy", parameters={"to": "kiwi-directives"}
        )
        assert linked["links"] == {"references": ["kiwi-directives"]}
        loaded = data(await client.call_tool("load", {"item_type": "knowledge", "item_id": "retry-policy"}))
        assert loaded["parsed"]["body"] == "Back off exponentially, with a cap."
        assert loaded["parsed"]["tags"] == ["temporal"]

        write(
            user / "knowledge" / "shared" / "from-user.md",
            "---\nzettel_id: from-user\ntitle: From the user space\n---\nbody\n",
        )
        copied = data(
            await client.call_tool(
                "load", {"item_type": "knowledge", "item_id": "from-user", "copy_to_project": True}
            )
        )
        assert copied["source"] == "project"
        assert (project / ".ai" / "knowledge" / "shared" / "from-user.md").exists()


async def test_a_slow_call_answers_pending_with_progress_and_can_be_polled(runs, project, temporal_env):
    from tests.helpers import write, write_directive

    write(
        project / ".ai" / "tools" / "gate" / "tool.yaml",
        "tool_id: gate\ntool_type: python\nexecutor:\n  entrypoint: main.py\n",
    )
    # The tool blocks until the test opens the gate (a file), like a long build or a slow upstream.
    write(
        project / ".ai" / "tools" / "gate" / "main.py",
        "import pathlib, time\n\n\ndef main():\n    while not pathlib.Path('gate.open').exists():\n"
        "        time.sleep(0.05)\n    return {'passed': True}\n",
    )
    server = build_server(temporal_env.client, project, task_queue=runs.task_queue)
    progress: list[float] = []
    messages: list[str] = []

    async def on_progress(value, total, message):
        progress.append(value)
        messages.append(message or "")

    async with Client(server) as client:
        write_directive(
            project / ".ai" / "directives" / "gated.md",
            (project / ".ai" / "directives" / "hello_kiwi.md")
            .read_text()
            .replace('name="hello_kiwi"', 'name="gated"')
            .replace(
                '<execute resource="tool" id="word_count" />',
                '<execute resource="tool" id="word_count" /><execute resource="tool" id="gate" />',
            ),
        )
        run_id = data(
            await client.call_tool(
                "execute",
                {
                    "item_type": "directive",
                    "action": "run",
                    "item_id": "gated",
                    "parameters": {"name": "Pat"},
                },
            )
        )["run_id"]
        pending = data(
            await client.call_tool(
                "execute",
                {
                    "item_type": "tool",
                    "action": "call",
                    "item_id": "gate",
                    "run_id": run_id,
                    "wait_seconds": 2.5,
                },
                progress_callback=on_progress,
            )
        )
        assert pending["status"] == "pending" and "poll" in pending["hint"]
        assert len(progress) >= 1
        assert all("gate" in m for m in messages), messages  # the progress line names the tool
        call_id = pending["result"]["call_id"]
        (project / "gate.open").write_text("")
        done = data(
            await client.call_tool(
                "execute",
                {
                    "item_type": "run",
                    "action": "poll",
                    "run_id": run_id,
                    "item_id": call_id,
                    "wait_seconds": 30,
                },
            )
        )
        assert done["status"] == "ok" and done["result"] == {"passed": True}


NPM = __import__("pathlib").Path(__file__).parent / "npm" / "node_modules"
INSPECTOR = NPM / "@modelcontextprotocol" / "inspector-cli" / "build" / "index.js"


async def inspector(*argv: str, cwd) -> dict:
    """The MCP Inspector CLI (npm @modelcontextprotocol/inspector-cli 0.15), a third-party MCP client."""
    proc = await asyncio.create_subprocess_exec(
        "node",
        str(INSPECTOR),
        *argv,
        cwd=str(cwd),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, err.decode()
    return json.loads(out)


async def test_the_mcp_inspector_lists_and_calls_kiwi_over_stdio_and_http(runs, project, temporal_env):
    assert INSPECTOR.exists(), "scripts/test installs tests/npm (npm ci)"
    address = temporal_env.client.service_client.config.target_host
    stdio = [sys.executable, "-m", "kiwi", "mcp", "--address", address, "--task-queue", runs.task_queue]
    listed = await inspector(*stdio, "--method", "tools/list", cwd=project)
    assert sorted(t["name"] for t in listed["tools"]) == ["execute", "help", "load", "search"]
    execute = next(t for t in listed["tools"] if t["name"] == "execute")
    assert "directive" in execute["inputSchema"]["properties"]["item_type"]["enum"]
    called = await inspector(
        *stdio,
        "--method",
        "tools/call",
        "--tool-name",
        "search",
        "--tool-arg",
        "item_type=directive",
        "query=greeting",
        cwd=project,
    )
    assert "hello_kiwi" in json.dumps(called)

    port = free_port()
    server = await asyncio.create_subprocess_exec(
        *stdio,
        "--http",
        "--port",
        str(port),
        cwd=str(project),
        start_new_session=True,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        await asyncio.wait_for(server.stderr.readline(), 60)
        url = f"http://127.0.0.1:{port}/mcp"

        async def listed_over_http():
            try:
                return await inspector(url, "--transport", "http", "--method", "tools/list", cwd=project)
            except AssertionError:
                return None

        over_http = await wait_for(listed_over_http, what="the inspector over HTTP")
        assert len(over_http["tools"]) == 4
        called = await inspector(
            url,
            "--transport",
            "http",
            "--method",
            "tools/call",
            "--tool-name",
            "search",
            "--tool-arg",
            "item_type=tool",
            "query=words",
            cwd=project,
        )
        assert "word_count" in json.dumps(called)
        # And the whole agent flow with the MCP SDK's own client over streamable HTTP.
        async with Client(url) as client:
            await agent_session(client)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        await server.wait()


async def test_a_mistyped_item_type_names_the_allowed_values(project, temporal_env):
    server = build_server(temporal_env.client, project)
    async with Client(server) as client:
        answer = await client.call_tool(
            "execute", {"item_type": "directives", "action": "run", "item_id": "x"}
        )
        assert answer.is_error
        wrong = data(answer)
        assert wrong["error"] == "InputInvalid" and wrong["action"] == "run"
        assert (
            "'item_type' must be one of 'directive', 'knowledge', 'run', 'tool', 'mcp' or 'script'"
            in wrong["message"]
        )
        assert "pydantic" not in json.dumps(wrong)


async def test_stuck_past_the_limit_says_the_run_waits_for_a_human(runs, project, temporal_env):
    server = build_server(temporal_env.client, project, task_queue=runs.task_queue)
    async with Client(server) as client:
        run = {
            "item_type": "directive",
            "action": "run",
            "item_id": "hello_kiwi",
            "parameters": {"name": "Mo"},
        }
        run_id = data(await client.call_tool("execute", run))["run_id"]
        stuck = data(
            await client.call_tool(
                "help", {"action": "stuck", "run_id": run_id, "reason": "tests keep failing", "attempts": 4}
            )
        )
        assert stuck["status"] == "awaiting_human" and "waits for a human" in stuck["message"]
        assert f"kiwi resume {run_id}" in stuck["message"]

        async def held() -> bool:
            status = data(
                await client.call_tool("execute", {"item_type": "run", "action": "status", "run_id": run_id})
            )
            return status["status"] == "awaiting_human"

        await wait_for(held, timeout=20)


async def test_starting_a_run_over_mcp_adds_no_workflow_task_of_its_own(runs, project, temporal_env):
    # execute(directive, run) answers with the run's settled state. Asking the status while the run's first
    # workflow task is in flight makes Temporal schedule one more task just to answer the query; the front
    # end waits for that first task on the history (a long poll) instead, so an agent step's run is
    # exactly one workflow task until the agent acts.
    from temporalio.api.enums.v1 import EventType

    from tests.helpers import directive_md, write_directive

    write_directive(
        project / ".ai" / "directives" / "ask.md",
        directive_md('<step name="decide"><action>Decide.</action></step>', name="ask"),
    )
    server = build_server(temporal_env.client, project, task_queue=runs.task_queue)
    async with Client(server) as client:
        started = data(
            await client.call_tool("execute", {"item_type": "directive", "action": "run", "item_id": "ask"})
        )
        assert started["state"] == "awaiting_agent", started
        run_id = started["run_id"]
        kinds = [e.event_type async for e in runs.handle(run_id).fetch_history_events()]
        assert kinds.count(EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED) == 1, [
            EventType.Name(k) for k in kinds
        ]
        await runs.cancel(run_id)


async def test_a_version_asked_of_a_local_item_is_refused_not_ignored(project, temporal_env):
    """Trial F34: load(version=...) of a project item answered the file whatever the version asked."""
    server = build_server(temporal_env.client, project)
    async with Client(server) as client:
        answer = await client.call_tool(
            "load", {"item_type": "directive", "item_id": "hello_kiwi", "version": "9.9.9"}
        )
        assert answer.is_error
        refused = data(answer)
        assert refused["error"] == "InputInvalid" and "source='registry' only" in refused["message"]
        assert "load(source='registry', version=...)" in refused["hint"]
        loaded = data(await client.call_tool("load", {"item_type": "directive", "item_id": "hello_kiwi"}))
        assert loaded["parsed"]["version"] == "1.0.0"


async def test_ids_and_words_that_are_no_text_and_unexpected_failures_answer_in_the_seeds_shape(
    runs, project, temporal_env, monkeypatch
):
    """Review s33 (a careless agent): `execute(run, status)` with no run_id, and a NUL in a search's words
    or a registry item's id, answered the SDK's bare "Error executing tool X" (a traceback in the log: the
    NUL broke the registry's and Temporal's queries); a 100 KB item_id came back four times in a 400 KB
    answer. Each is InputInvalid naming the field (never echoing it), and anything Kiwi did not expect is
    answered in the seeds' shape, its traceback in the log."""
    from kiwi.items.store import ItemStore

    server = build_server(temporal_env.client, project, task_queue=runs.task_queue)
    async with Client(server) as client:

        async def call(tool: str, **arguments):
            result = await client.call_tool(tool, arguments)
            assert result.is_error, result
            return data(result)

        for action in ("status", "complete_step", "cancel"):
            missing = await call("execute", item_type="run", action=action)
            assert missing["error"] == "InputInvalid", missing
            assert missing["message"].startswith(f"{action} needs run_id"), missing
        for tool, arguments, field in (
            ("search", {"item_type": "directive", "query": "a\x00b"}, "query"),
            ("search", {"item_type": "run", "query": "a\x00b"}, "query"),
            (
                "search",
                {"item_type": "directive", "query": "x", "source": "registry", "status": "\x1b[31m"},
                "status",
            ),
            ("load", {"item_type": "directive", "item_id": "a\x00b", "source": "registry"}, "item_id"),
            ("execute", {"item_type": "run", "action": "status", "run_id": "run-\x00"}, "run_id"),
            ("help", {"action": "stuck", "run_id": "run-\x07"}, "run_id"),
        ):
            refused = await call(tool, **arguments)
            assert refused["error"] == "InputInvalid", (tool, refused)
            assert refused["message"].startswith(f"'{field}' holds a control character"), refused
            assert "\x00" not in json.dumps(refused, ensure_ascii=False), refused
        # An unknown guidance topic says so (it got the general text as if it were the topic's).
        guided = data(await client.call_tool("help", {"action": "guidance", "topic": "permisions"}))
        assert guided["help"].startswith("No guidance topic 'permisions'; the topics are: "), guided
        assert "permissions" in guided["help"].splitlines()[0]
        huge = await call("load", item_type="directive", item_id="x" * 100_000)
        assert (
            huge["error"] == "InputInvalid"
            and huge["message"] == "'item_id' is 100,000 characters; it may be 256 at most"
        )
        assert len(json.dumps(huge)) < 1000, len(json.dumps(huge))

        def broken(*args, **kwargs):
            raise RuntimeError("an index Kiwi did not expect to fail")

        monkeypatch.setattr(ItemStore, "search", broken)
        failed = await call("search", item_type="directive", query="hello")
        assert failed["error"] == "KiwiError", failed
        assert failed["message"] == "Kiwi could not answer this call (RuntimeError); its log has the details"
        assert "did not expect" not in json.dumps(failed)


async def test_arguments_a_tool_does_not_take_are_refused_not_dropped(runs, project, temporal_env):
    """Review s33 (a careless agent): arguments the four tools do not take were dropped without a word, so
    `execute(directive, run, inputs={...})` (Kiwi MCP's name for parameters) started the run without its
    inputs, and `limit: true` or `attempts: 1e30` were taken as numbers. Each is InputInvalid naming the
    argument and where it goes, and nothing is done."""
    server = build_server(temporal_env.client, project, task_queue=runs.task_queue)
    async with Client(server) as client:
        listed = {t.name: t for t in (await client.list_tools()).tools}
        assert all(t.input_schema["additionalProperties"] is False for t in listed.values()), listed

        async def refused(tool: str, **arguments) -> dict:
            result = await client.call_tool(tool, arguments)
            assert result.is_error, result
            shown = data(result)
            assert shown["error"] == "InputInvalid", shown
            return shown

        before = data(await client.call_tool("search", {"item_type": "run"}))["results"]
        inputs = await refused(
            "execute", item_type="directive", action="run", item_id="hello_kiwi", inputs={"name": "Mo"}
        )
        assert inputs["message"].startswith("execute has no argument 'inputs'; it takes item_type, action"), (
            inputs
        )
        assert inputs["hint"].startswith("send it as 'parameters'"), inputs
        assert (inputs["item_type"], inputs["action"], inputs["item_id"]) == (
            "directive",
            "run",
            "hello_kiwi",
        )
        after = data(await client.call_tool("search", {"item_type": "run"}))["results"]
        assert after == before  # no run started without its inputs
        for tool, arguments, stray, home in (
            ("search", {"item_type": "directive", "query": "x", "limt": 5}, "limt", "limit"),
            ("load", {"item_type": "directive", "directive_name": "hello_kiwi"}, "directive_name", "item_id"),
            ("help", {"action": "stuck", "run_id": "run-x", "reasn": "tests fail"}, "reasn", "reason"),
        ):
            shown = await refused(tool, **arguments)
            assert shown["message"].startswith(f"{tool} has no argument '{stray}'; it takes "), shown
            assert shown["hint"].startswith(f"send it as '{home}'"), shown
        nameless = await refused("search", item_type="directive", **{"\x00" * 3: 1, "other": 2})
        assert nameless["message"].startswith("search has no argument '(unreadable name)' (and 1 more)"), (
            nameless
        )
        assert nameless["hint"].startswith("leave it out"), nameless
        for tool, arguments, field in (
            ("search", {"item_type": "directive", "query": "x", "limit": True}, "limit"),
            ("help", {"action": "stuck", "run_id": "run-x", "attempts": True}, "attempts"),
            ("execute", {"item_type": "run", "action": "poll", "wait_seconds": False}, "wait_seconds"),
        ):
            shown = await refused(tool, **arguments)
            assert shown["message"].startswith(f"'{field}' must be a number, got "), shown
        # Kiwi MCP's clients send project_path with every call: taken when it is this front end's project.
        same = data(
            await client.call_tool("search", {"item_type": "directive", "project_path": str(project)})
        )
        assert "results" in same and "error" not in same, same
        other = await refused("search", item_type="directive", project_path="/elsewhere")
        assert other["message"].startswith("project_path names another folder than the project"), other
        huge = await refused("help", action="stuck", run_id="run-x", attempts=10**30)
        assert huge["message"].startswith("'attempts': Input should be less than or equal to 1000000"), huge


async def test_validate_checks_a_draft_it_is_sent_without_writing_it(runs, project, temporal_env):
    """Review s33: validate with parameters.content ignored the content and answered for the saved file (or
    ItemNotFound for a new one), so a broken draft was reported valid. The draft is checked, nothing is written."""
    from tests.helpers import directive_md

    server = build_server(temporal_env.client, project, task_queue=runs.task_queue)
    good = directive_md(
        '<step name="w"><tool_call tool="filesystem.write"><param name="path">notes/made.txt</param>'
        '<param name="content">made</param></tool_call></step>',
        name="drafted",
        permissions='<write resource="filesystem" path="notes/**"/>',
    )
    async with Client(server) as client:

        async def validate(item_id: str, content) -> dict:
            return data(
                await client.call_tool(
                    "execute",
                    {
                        "item_type": "directive",
                        "action": "validate",
                        "item_id": item_id,
                        "parameters": {"content": content},
                    },
                )
            )

        checked = await validate("drafted", good)
        assert checked["valid"] is True and checked["item_id"] == "drafted", checked
        assert checked["path"] == "parameters.content (not written)"
        assert [s["step"] for s in checked["steps"]] == ["w"], checked
        broken = await validate("drafted", good.replace('name="w"', ""))
        assert broken["valid"] is False, broken
        assert any("<step> needs a name attribute" in p["message"] for p in broken["problems"]), broken
        assert all(p["path"] == "parameters.content (not written)" for p in broken["problems"]), broken
        # A hello_kiwi draft under another name: named as save_directive would refuse it.
        hello = (project / ".ai" / "directives" / "hello_kiwi.md").read_text()
        renamed = await validate("other", hello)
        assert renamed["valid"] is False, renamed
        assert "defines directive 'hello_kiwi', not 'other'" in renamed["problems"][-1]["message"], renamed
        # A step's <param> the local tool does not take (README trial s34: validated, the run failed there).
        stray = await validate("drafted", hello.replace('<param name="text">', '<param name="txt">'))
        assert stray["valid"] is False, stray
        assert any(
            p["message"].endswith(
                "word_count has no parameter 'txt'; it takes text (did you mean <param name=\"text\">?)"
            )
            for p in stray["problems"]
        ), stray
        notext = await validate("drafted", {"a": 1})
        assert notext["error"] == "InputInvalid" and "not an object" in notext["message"], notext
        # The saved file is still what validate without content checks; the draft was never written.
        saved = data(
            await client.call_tool(
                "execute", {"item_type": "directive", "action": "validate", "item_id": "hello_kiwi"}
            )
        )
        assert saved["valid"] is True and saved["path"].endswith("hello_kiwi.md"), saved
    assert not list((project / ".ai").rglob("drafted.md"))
