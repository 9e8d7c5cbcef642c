"""Capability enforcement inside real runs: each attack denied, audited, nothing written or run;
each allowed twin still works."""

from __future__ import annotations

import subprocess
from datetime import timedelta

import pytest

from activities.audit import read_audit
from kiwi.errors import ItemInvalid
from kiwi.harness import load_harness
from tests.helpers import awaiting_step, directive_md, run_client, wait_for, write, write_directive
from workers.main import build_worker

GUARDED = directive_md(
    '<step name="work"><action>Work inside src/*.ts and run git.</action></step>',
    name="guarded",
    permissions='<read resource="filesystem" path="src/**"/><write resource="filesystem" path="src/*.ts"/>'
    '<write resource="filesystem" path="out/**"/><execute resource="shell" commands="git,echo"/>'
    # git reads every file of the repository, and a command runs in a folder it may read.
    '<read resource="filesystem" path="**"/>',
)


async def start(runs, project):
    write_directive(project / ".ai" / "directives" / "guarded.md", GUARDED)
    (project / "src" / "a").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    run_id = await runs.start("guarded", {})

    async def waiting():
        return (await runs.status(run_id)).status == "awaiting_agent"

    await wait_for(waiting, what="guarded to wait")
    return run_id


@pytest.mark.parametrize(
    ("attack", "twin"),
    [
        (
            ("filesystem.write", {"path": "src/a/b.ts", "content": "x"}),
            ("filesystem.write", {"path": "src/b.ts", "content": "x"}),
        ),
        (
            ("filesystem.write", {"path": "src/../../x.ts", "content": "x"}),
            ("filesystem.write", {"path": "src/./c.ts", "content": "x"}),
        ),
        (("shell.run", {"command": "git status; rm -rf /"}), ("shell.run", {"command": "git status"})),
        (("shell.run", {"command": "echo $(id)"}), ("shell.run", {"command": "echo id"})),
        (("shell.run", {"command": "echo `id`"}), ("shell.run", {"command": "echo 'id'"})),
        (("shell.run", {"command": "git init && git status"}), ("shell.run", {"argv": ["git", "status"]})),
        (
            ("shell.run", {"command": "echo hi > out/x"}),
            ("shell.run", {"argv": ["echo", "hi", ">", "out/x"]}),
        ),
        (("shell.run", {"command": "ls"}), ("shell.run", {"command": "echo ls"})),
    ],
)
async def test_attacks_are_denied_and_audited_and_their_twins_work(runs, project, attack, twin):
    run_id = await start(runs, project)
    tool, args = attack
    denied = await runs.call_tool(run_id, tool, args)
    assert denied.status == "denied", denied
    assert not (project / "src" / "a" / "b.ts").exists() and not (project / "out" / "x").exists()
    allowed = await runs.call_tool(run_id, *twin)
    assert allowed.status == "ok", allowed
    if twin[0] == "shell.run":
        assert allowed.result["exit_code"] == 0
    if twin[1].get("argv", [""])[0] == "echo":
        # '>' was an argument, not a redirection: it was printed and no file was written.
        assert allowed.result["stdout"].strip() == "hi > out/x" and not (project / "out" / "x").exists()
    await runs.cancel(run_id)

    async def audited():
        calls = [r for r in read_audit(str(project), run_id) if r["event"] == "tool_call"]
        return calls if len(calls) == 2 else None

    calls = await wait_for(audited, what="audit records")
    assert [c["decision"] for c in calls] == ["denied", "allowed"]
    assert calls[0]["reason"] == denied.reason


async def test_the_101st_write_is_rate_limited(runs, project):
    run_id = await start(runs, project)
    for i in range(100):
        assert (
            await runs.call_tool(run_id, "filesystem.write", {"path": f"out/{i}", "content": "x"})
        ).status == "ok"
    limited = await runs.call_tool(run_id, "filesystem.write", {"path": "out/100", "content": "x"})
    assert limited.status == "rate_limited" and "100" in limited.reason
    assert not (project / "out" / "100").exists() and len(list((project / "out").iterdir())) == 100
    assert (await runs.call_tool(run_id, "filesystem.read", {"path": "src/a"})).status == "error"


def test_rate_limits_per_window_and_per_server_are_read_from_the_harness(project, tmp_path):
    write(
        project / ".ai" / "config" / "agent_harness.yaml",
        "rate_limits:\n  filesystem.write: 2/minute\n  shell.run: 7\n"
        "internal_tools:\n  mcps:\n    supabase:\n      rate_limit: 100/minute\n"
        "    github:\n      require_approval: [create_pull_request]\n",
    )
    limits = load_harness(project, tmp_path / "user").limits
    assert limits.rate_windows == {"filesystem.write": (2, 60.0), "supabase.*": (100, 60.0)}
    assert "filesystem.write" not in limits.rate_limits and limits.rate_limits["shell.run"] == 7
    assert "github.create_pull_request" in limits.approval_tools
    write(
        project / ".ai" / "config" / "agent_harness.yaml",
        "internal_tools:\n  mcps:\n    supabase:\n      rate_limit: 100/fortnight\n",
    )
    with pytest.raises(ItemInvalid) as info:
        load_harness(project, tmp_path / "user")
    assert "internal_tools.mcps.supabase.rate_limit is '100/fortnight'" in str(info.value)
    assert "100/minute" in str(info.value)


async def test_a_per_minute_limit_refuses_until_the_window_moves_on(time_skipping_env, project):
    write(project / ".ai" / "config" / "agent_harness.yaml", "rate_limits:\n  filesystem.write: 2/minute\n")
    runs = run_client(time_skipping_env.client, project)
    async with build_worker(time_skipping_env.client, runs.task_queue, sandboxed=True):
        run_id = await runs.start("hello_kiwi", {"name": "Rita"})  # its first step writes notes/hello.md
        await awaiting_step(runs, run_id, "confirm")
        write_note = {"path": "notes/extra.md", "content": "x"}
        assert (await runs.call_tool(run_id, "filesystem.write", write_note)).status == "ok"
        limited = await runs.call_tool(run_id, "filesystem.write", {"path": "notes/more.md", "content": "x"})
        assert limited.status == "rate_limited" and limited.error_type == "RateLimited"
        assert limited.reason == "rate limit for filesystem.write is 2 calls per 60s"
        assert limited.hint.startswith("try again in ") and not (project / "notes" / "more.md").exists()
        await time_skipping_env.sleep(timedelta(seconds=61))
        again = await runs.call_tool(run_id, "filesystem.write", {"path": "notes/more.md", "content": "x"})
        assert again.status == "ok" and (project / "notes" / "more.md").read_text() == "x"
        await runs.cancel(run_id)
        await runs.handle(run_id).result()


async def test_a_directive_with_entity_expansion_never_starts(runs, project):
    bomb = (
        "```xml\n<!DOCTYPE d [<!ENTITY a 'aaaaaaaaaa'><!ENTITY b '&a;&a;&a;&a;&a;&a;&a;&a;'>]>\n"
        "<directive name='bomb' version='1.0.0'><metadata><description>&b;</description></metadata>"
        "<process><step name='s'><action>x</action></step></process></directive>\n```\n"
    )
    write(project / ".ai" / "directives" / "bomb.md", bomb)
    with pytest.raises(ItemInvalid, match="DTDs and entity declarations are not allowed"):
        await runs.start("bomb", {})
    assert await runs.list_runs(directive="bomb") == []
