"""Capability enforcement inside real runs: each attack denied, audited, nothing written or run;
each allowed twin still works."""

from __future__ import annotations

import subprocess

import pytest

from activities.audit import read_audit
from kiwi.errors import ItemInvalid
from tests.conftest import wait_for
from tests.helpers import directive_md, write

GUARDED = directive_md(
    '<step name="work"><action>Work inside src/*.ts and run git.</action></step>', name="guarded",
    permissions='<read resource="filesystem" path="src/**"/><write resource="filesystem" path="src/*.ts"/>'
                '<write resource="filesystem" path="out/**"/><execute resource="shell" commands="git,echo"/>')


async def start(runs, project):
    write(project / ".ai" / "directives" / "guarded.md", GUARDED)
    (project / "src" / "a").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    run_id = await runs.start("guarded", {})

    async def waiting():
        return (await runs.status(run_id)).status == "awaiting_agent"
    await wait_for(waiting, what="guarded to wait")
    return run_id


@pytest.mark.parametrize(("attack", "twin"), [
    (("filesystem.write", {"path": "src/a/b.ts", "content": "x"}), ("filesystem.write", {"path": "src/b.ts",
                                                                                          "content": "x"})),
    (("filesystem.write", {"path": "src/../../x.ts", "content": "x"}), ("filesystem.write", {"path": "src/./c.ts",
                                                                                              "content": "x"})),
    (("shell.run", {"command": "git status; rm -rf /"}), ("shell.run", {"command": "git status"})),
    (("shell.run", {"command": "echo $(id)"}), ("shell.run", {"command": "echo id"})),
    (("shell.run", {"command": "echo `id`"}), ("shell.run", {"command": "echo 'id'"})),
    (("shell.run", {"command": "git init && git status"}), ("shell.run", {"argv": ["git", "status"]})),
    (("shell.run", {"command": "echo hi > out/x"}), ("shell.run", {"argv": ["echo", "hi", ">", "out/x"]})),
    (("shell.run", {"command": "ls"}), ("shell.run", {"command": "echo ls"})),
])
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
        assert (await runs.call_tool(run_id, "filesystem.write", {"path": f"out/{i}", "content": "x"})).status == "ok"
    limited = await runs.call_tool(run_id, "filesystem.write", {"path": "out/100", "content": "x"})
    assert limited.status == "rate_limited" and "100" in limited.reason
    assert not (project / "out" / "100").exists() and len(list((project / "out").iterdir())) == 100
    assert (await runs.call_tool(run_id, "filesystem.read", {"path": "src/a"})).status == "error"


async def test_a_directive_with_entity_expansion_never_starts(runs, project):
    bomb = ("```xml\n<!DOCTYPE d [<!ENTITY a 'aaaaaaaaaa'><!ENTITY b '&a;&a;&a;&a;&a;&a;&a;&a;'>]>\n"
            "<directive name='bomb' version='1.0.0'><metadata><description>&b;</description></metadata>"
            "<process><step name='s'><action>x</action></step></process></directive>\n```\n")
    write(project / ".ai" / "directives" / "bomb.md", bomb)
    with pytest.raises(ItemInvalid, match="DTDs and entity declarations are not allowed"):
        await runs.start("bomb", {})
    assert await runs.list_runs(directive="bomb") == []
