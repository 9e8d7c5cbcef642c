"""What a new user following the README meets when something goes wrong: each error names the real cause
and the fix, on the command line and in the MCP front end's answers."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from mcp.client import Client

from kiwi.errors import McpServerMissing
from mcp_frontend.server import build_server
from tests.helpers import awaiting_step, data, directive_md, kiwi_cli, wait_for, write, write_directive

RUN_ID = re.compile(r"run-[a-z_]+-[0-9a-f]{10}")


def connection(runs) -> list[str]:
    return ["--address", runs.client.service_client.config.target_host, "--task-queue", runs.task_queue]


def clock_server(project: Path) -> None:
    write(
        project / ".ai" / "config" / "mcp_registry.yaml",
        f"""\
mcps:
  clock:
    command: {sys.executable}
    args: ["-m", "mcp_server_time", "--local-timezone", "UTC"]
""",
    )


def edit_after_signing(path: Path) -> None:
    """What a user does to a signed directive: changes a word, and does not sign it again."""
    path.write_text(path.read_text().replace("Some prose before the block.", "Some other prose."))


def tick_directive(project: Path) -> Path:
    """A signed directive `tick`: its step `now` asks the clock server the time, then `look` waits for the agent."""
    return write_directive(
        project / ".ai" / "directives" / "tick.md",
        directive_md(
            '<step name="now"><tool_call tool="clock.get_current_time"><param name="timezone">UTC</param>'
            '</tool_call></step><step name="look" mode="agent"><action>look at the time</action></step>',
            name="tick",
            tools='<tools><mcp name="clock"><tool name="get_current_time"/></mcp></tools>',
            permissions='<execute resource="mcp" name="clock" actions="get_current_time"/>',
        ),
    )


async def test_a_directive_edited_after_signing_says_so_and_how_to_sign_it_again(runs, project, temporal_env):
    clock_server(project)
    tick = tick_directive(project)
    edit_after_signing(tick)
    sign_again = "`kiwi sign .ai/directives/tick.md`"

    # The command line: the run fails at its first step, and says it is the signature, not the MCP server.
    code, out, err = await kiwi_cli("run", "tick", "--wait", *connection(runs))
    assert code == 1, out + err
    assert "mcp_registry.yaml" not in out + err
    assert "directive 'tick' was changed after it was signed" in out and sign_again in out, out
    run_id = RUN_ID.search(out).group(0)
    code, out, _ = await kiwi_cli("status", run_id, *connection(runs))
    assert code == 0 and "hint: directive 'tick' was changed after it was signed" in out and sign_again in out
    code, out, _ = await kiwi_cli("status", run_id, "--json", *connection(runs))
    assert sign_again in json.loads(out)["hint"]

    # The MCP front end: the run answer carries the error and the same fix, for a human to make.
    server = build_server(temporal_env.client, project, task_queue=runs.task_queue)
    async with Client(server) as client:
        started = data(
            await client.call_tool(
                "execute", {"item_type": "directive", "action": "run", "item_id": "tick", "parameters": {}}
            )
        )
        assert started.get("error") != "McpServerMissing", started
        assert started["state"] == "failed" and "clock.get_current_time" in started["error"]
        assert "was changed after it was signed" in started["hint"]
        assert f"{sign_again} (a command a human runs)" in started["hint"]
        status = data(
            await client.call_tool(
                "execute", {"item_type": "run", "action": "status", "run_id": started["run_id"]}
            )
        )
        assert "was changed after it was signed" in status["hint"]

    # Signed again, it runs with its own grants.
    code, _, err = await kiwi_cli("sign", ".ai/directives/tick.md")
    assert code == 0, err
    code, out, err = await kiwi_cli("run", "tick", "--wait", *connection(runs))
    assert code == 0 and "awaiting_agent" in out, out + err


async def test_a_call_refused_because_the_directive_was_edited_names_the_signature(
    runs, project, temporal_env
):
    jot = write_directive(
        project / ".ai" / "directives" / "jot.md",
        directive_md(
            '<step name="write" mode="agent"><action>write notes/a.md</action></step>',
            name="jot",
            permissions='<write resource="filesystem" path="notes/**"/>',
        ),
    )
    edit_after_signing(jot)
    run_id = await runs.start("jot", {})
    await awaiting_step(runs, run_id, "write")
    code, out, _ = await kiwi_cli(
        "call",
        "filesystem.write",
        '{"path": "notes/a.md", "content": "x"}',
        "--run",
        run_id,
        *connection(runs),
    )
    assert code == 1 and "denied" in out
    assert "hint: directive 'jot' was changed after it was signed" in out, out
    assert "`kiwi sign .ai/directives/jot.md`" in out and "to <permissions>" not in out
    server = build_server(temporal_env.client, project, task_queue=runs.task_queue)
    async with Client(server) as client:
        call = {"path": "notes/a.md", "content": "x"}
        refused = data(
            await client.call_tool(
                "execute",
                {
                    "item_type": "tool",
                    "action": "call",
                    "item_id": "filesystem.write",
                    "run_id": run_id,
                    "parameters": call,
                },
            )
        )
    assert refused["status"] == "denied" and "was changed after it was signed" in refused["hint"]
    assert "`kiwi sign .ai/directives/jot.md` (a command a human runs)" in refused["hint"]
    assert not (project / "notes" / "a.md").exists()


async def test_a_call_outside_a_run_refused_names_agent_harness_not_permissions(runs, project):
    code, out, _ = await kiwi_cli(
        "call", "filesystem.write", '{"path": "notes/x.md", "content": "x"}', *connection(runs)
    )
    assert code == 1 and "denied" in out
    assert "<permissions>" not in out, out
    assert (
        'merge `internal_tools: {filesystem: {write: ["notes/**"]}}` into .ai/config/agent_harness.yaml'
        in out
    )
    assert "`kiwi run NAME`" in out and "--run RUN_ID" in out
    assert not (project / "notes" / "x.md").exists()
    # The line names the program the call ran, not a placeholder (README trial s35).
    code, out, _ = await kiwi_cli("call", "shell.run", '{"command": "wc -l README.md"}', *connection(runs))
    assert code == 1 and "merge `internal_tools: {shell: {allowed_commands: [wc]}}`" in out, out
    code, out, _ = await kiwi_cli("call", "kiwi-mcp.search", '{"query": "hello"}', *connection(runs))
    assert code == 1 and "outside a run, use `kiwi search` instead" in out, out
    # A run's id typed where the tool goes: said to be a run's id, and where it goes (README trial s33).
    code, out, _ = await kiwi_cli("call", "run-hello_kiwi-0123456789", "{}", *connection(runs))
    assert code == 1 and "no tool 'run-hello_kiwi-0123456789' outside a run" in out, out
    assert "is a run's id, not a tool's: the run goes in --run" in out, out


async def cancelled_run(runs) -> str:
    """A run of the README's example, cancelled while it waits for the agent."""
    run_id = await runs.start("hello_kiwi", {"name": "Ada"})
    await awaiting_step(runs, run_id, "confirm")
    await runs.cancel(run_id)
    await wait_for(lambda: _is(runs, run_id, "cancelled"), what="the run to be cancelled")
    return run_id


async def test_commands_on_a_cancelled_run_say_it_was_cancelled(runs, project):
    run_id = await cancelled_run(runs)
    for argv in (
        ("call", "filesystem.read", '{"path": "notes/hello.md"}', "--run", run_id),
        ("complete-step", run_id, "confirm", "--output", "confirmed=true"),
        ("cancel", run_id),
    ):
        code, out, err = await kiwi_cli(*argv, *connection(runs))
        assert code == 1 and f"run {run_id} was cancelled" in err, (argv, out, err)
        assert "completed" not in err, (argv, err)


async def test_a_run_that_ended_before_its_start_asked_for_its_servers_blames_them_only_when_they_were_missing(
    runs, project
):
    """README trial s37: a modified directive's first step (its grant now refused) ended the run before the start
    asked it for its MCP servers; the answer from the ended run held none, so every required server counted as
    missing and `kiwi run` said "fix mcp_registry.yaml", where the fix was `kiwi sign`. Asked of real ended runs:
    a server counts as missing only when the run says a required one was."""
    from kiwi.runs.starting import missing_servers

    clock_server(project)
    for name, server in (("tick", "clock"), ("nowhere", "nowhere")):
        path = write_directive(
            project / ".ai" / "directives" / f"{name}.md",
            directive_md(
                f'<step name="now"><tool_call tool="{server}.get_current_time"><param name="timezone">UTC</param>'
                "</tool_call></step>",
                name=name,
                tools=f'<tools><mcp name="{server}" required="true"><tool name="get_current_time"/></mcp></tools>',
                permissions=f'<execute resource="mcp" name="{server}" actions="get_current_time"/>',
            ),
        )
        if name == "tick":
            edit_after_signing(path)
    tick = await runs.start("tick", {})
    with pytest.raises(McpServerMissing) as refused:  # (the start itself says so, however the race goes)
        await runs.start("nowhere", {})
    nowhere = re.search(r"run-nowhere-\w+", refused.value.message).group(0)
    for run_id in (tick, nowhere):
        await wait_for(lambda run_id=run_id: _is(runs, run_id, "failed"), what=f"{run_id} to fail")
    ended = await runs.tool_context(tick)  # (the run has ended: its status alone answers)
    assert not ended.mcps and "clock.get_current_time" in ended.error, ended
    assert missing_servers(runs.store.load_directive("tick")[0], ended) == []
    ended = await runs.tool_context(nowhere)
    assert "MCP server 'nowhere' is not available" in ended.error, ended
    assert missing_servers(runs.store.load_directive("nowhere")[0], ended) == ["nowhere"]


async def _is(runs, run_id: str, wanted: str) -> bool:
    return (await runs.status(run_id)).status == wanted


async def test_status_of_a_cancelled_run_shows_no_step_waiting_for_the_agent(runs, project):
    run_id = await cancelled_run(runs)
    code, out, err = await kiwi_cli("status", run_id, *connection(runs))
    assert code == 0, err
    assert "awaiting_agent" not in out and "complete this step" not in out, out
    assert re.search(r"confirm\s+cancelled\s+agent", out), out
    # Why it was cancelled (the reason went to the audit trail alone: review s36).
    assert "  cancelled: cancelled by request" in out, out
    code, out, _ = await kiwi_cli("status", run_id, "--json", *connection(runs))
    shown = json.loads(out)
    assert shown["status"] == "cancelled" and shown["current_step"]["status"] == "cancelled"
    assert [s["status"] for s in shown["steps"]] == ["completed", "completed", "cancelled"]
    assert shown["cancel_reason"] == "cancelled by request", shown


async def test_status_shows_the_deadline_in_local_time_and_why_the_run_was_cancelled(runs, project):
    code, out, err = await kiwi_cli(
        "run", "hello_kiwi", "--input", "name=Ada", "--deadline", "3600", *connection(runs)
    )
    assert code == 0, err
    run_id = RUN_ID.search(out).group(0)
    await awaiting_step(runs, run_id, "confirm")
    # In local time with how far off, as approvals and `kiwi runs` show times (review s36: ISO in UTC here).
    code, out, err = await kiwi_cli("status", run_id, *connection(runs))
    assert re.search(r"  deadline: \d{4}-\d\d-\d\d \d\d:\d\d:\d\d \(\d+m\d\ds from now\)", out), out
    code, _, err = await kiwi_cli(
        "cancel", run_id, "--reason", "wrong input: Ada is Grace", *connection(runs)
    )
    assert code == 0, err
    await wait_for(lambda: _is(runs, run_id, "cancelled"), what="the run to be cancelled")
    code, out, err = await kiwi_cli("status", run_id, *connection(runs))
    assert code == 0 and "  cancelled: wrong input: Ada is Grace" in out, (out, err)


async def test_a_tool_the_run_does_not_have_lists_what_it_may_call(runs, project, temporal_env):
    clock_server(project)
    write_directive(
        project / ".ai" / "directives" / "tick.md",
        directive_md(
            '<step name="look" mode="agent"><action>look at the time</action></step>',
            name="tick",
            tools='<tools><mcp name="clock"/></tools>',
            permissions='<execute resource="mcp" name="clock" actions="get_current_time"/>'
            '<read resource="filesystem" path="notes/**"/>',
        ),
    )
    run_id = await runs.start("tick", {})
    await awaiting_step(runs, run_id, "look")
    code, out, _ = await kiwi_cli("call", "wordcount", '{"text": "a b"}', "--run", run_id, *connection(runs))
    assert code == 1 and "ToolNotFound" in out
    (listed,) = re.findall(r"hint: tools this run can call: (.*)", out)
    # What its grants allow, the granted tool of its MCP server included; nothing it is not granted.
    assert listed.split(", ") == ["filesystem.read", "filesystem.list", "clock.get_current_time"], out

    # The same over MCP, and outside a run: the base policy's tools.
    server = build_server(temporal_env.client, project, task_queue=runs.task_queue)
    async with Client(server) as client:
        missing = data(
            await client.call_tool(
                "execute",
                {
                    "item_type": "tool",
                    "action": "call",
                    "item_id": "nope",
                    "run_id": run_id,
                    "parameters": {},
                },
            )
        )
        assert missing["error_type"] == "ToolNotFound" and "clock.get_current_time" in missing["hint"]
        assert "shell.run" not in missing["hint"] and "word_count" not in missing["hint"]
    code, out, _ = await kiwi_cli("call", "nope", "{}", *connection(runs))
    (listed,) = re.findall(r"hint: tools you can call outside a run: (.*)", out)
    assert listed.split(", ") == [
        "filesystem.read",
        "filesystem.list",
        "shell.run",
        "git.status",
        "git.diff",
        "word_count",
    ], out
    # A near miss names the tool meant (README trial s36: the list alone, for `wordcount`).
    code, out, _ = await kiwi_cli("call", "wordcount", '{"text": "a b"}', *connection(runs))
    assert code == 1 and "hint: did you mean word_count? tools you can call outside a run: " in out, out
    code, out, err = await kiwi_cli("call", "filesystem.read", '{"pth": "notes/a.md"}', *connection(runs))
    assert code == 1 and "argument 'path' is required (got 'pth': send it as 'path')" in err, out + err


def test_kiwi_show_of_an_mcp_tool_or_server_prints_text_unless_json(project, capsys):
    from kiwi.cli import main as kiwi

    clock_server(project)
    capsys.readouterr()
    assert kiwi(["show", "clock.convert_time", "--type", "mcp"]) == 0
    out = capsys.readouterr().out
    assert not out.lstrip().startswith("{") and '"inputSchema"' not in out, out
    assert out.startswith("mcp tool clock.convert_time  [server clock]\n  Convert time between timezones\n")
    assert "  input time (string, required) Time to convert in 24-hour format (HH:MM)\n" in out
    assert kiwi(["show", "clock", "--type", "mcp"]) == 0
    out = capsys.readouterr().out
    assert "tool clock.get_current_time: Get current time in a specific timezone" in out
    assert '"tools"' not in out
    assert kiwi(["show", "clock.convert_time", "--type", "mcp", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["tool"]["name"] == "convert_time"


async def test_kiwi_run_exits_1_when_the_run_it_shows_has_already_failed(runs, project):
    """README trial s34: `kiwi run` without --wait printed `failed` and exited 0, so a script took the run for
    started and well. A run that failed within its first task (a step the run refuses) exits 1; one that waits
    for the agent exits 0."""
    write_directive(
        project / ".ai" / "directives" / "outside.md",
        directive_md(
            '<step name="w"><tool_call tool="filesystem.write"><param name="path">elsewhere/a.txt</param>'
            '<param name="content">x</param></tool_call></step>',
            name="outside",
            permissions='<write resource="filesystem" path="notes/**"/>',
        ),
    )
    code, out, err = await kiwi_cli("run", "outside", *connection(runs))
    assert code == 1 and "failed" in out, out + err
    code, out, err = await kiwi_cli("run", "hello_kiwi", "--input", "name=Ada", *connection(runs))
    assert code == 0 and RUN_ID.search(out), out + err


async def test_a_steps_mcp_result_shows_its_content_not_its_meta(runs, project):
    """README trial s38: `kiwi run --wait` and `kiwi status` showed an MCP step's result as `{"_meta":
    {"io.modelcontextprotocol/serverInfo": ...`, cut before the time it answered. The line shows the answer's
    structured content (or text); --json keeps the whole."""
    clock_server(project)
    tick_directive(project)
    code, out, err = await kiwi_cli("run", "tick", "--wait", *connection(runs))
    assert code == 0, out + err
    (line,) = [row for row in out.splitlines() if row.strip().startswith("result = ")]
    assert '"timezone": "UTC"' in line and "_meta" not in line, out
    code, out, _ = await kiwi_cli("status", RUN_ID.search(out).group(0), "--json", *connection(runs))
    assert code == 0 and "structuredContent" in out, out
