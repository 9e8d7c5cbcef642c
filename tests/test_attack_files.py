"""File access attacks through the real stack (Temporal dev server, sandboxed worker), as the agent sends them:
a directive granted ``write **`` still cannot touch protected places or reach through a symlink, not even one
swapped in while its calls run; every refusal is in the audit trail and nothing changes on disk."""

from __future__ import annotations

import subprocess
from datetime import UTC, datetime
from pathlib import Path

from activities.audit import read_audit
from tests.helpers import SECRET, Swapper, directive_md, snapshot, wait_for, write_directive

EVERYTHING = directive_md(
    '<step name="work"><action>Edit whatever the task needs.</action></step>',
    name="everything",
    permissions='<write resource="filesystem" path="**"/>',
)


async def start(runs, project: Path) -> str:
    write_directive(project / ".ai" / "directives" / "everything.md", EVERYTHING)
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    run_id = await runs.start("everything", {})

    async def waiting():
        return (await runs.status(run_id)).status == "awaiting_agent"

    await wait_for(waiting, what="the run to wait for the agent")
    return run_id


def project_files(project: Path) -> dict:
    """Everything in the project but the audit trail, which the run itself appends to."""
    return {k: v for k, v in snapshot(project).items() if not k.startswith(".ai/logs")}


async def test_write_everything_cannot_touch_protected_places_or_follow_links(
    runs, project, tmp_path_factory
):
    outside = tmp_path_factory.mktemp("outside")
    (outside / "secret").write_text(SECRET)
    run_id = await start(runs, project)
    (project / "link_out").symlink_to(outside, target_is_directory=True)
    (project / "notes").mkdir(exist_ok=True)
    day = datetime.now(UTC).date().isoformat()  # the run's audit file (it may not be flushed yet)
    before, outside_before = project_files(project), snapshot(outside)

    attacks = [
        ("filesystem.write", {"path": ".git/config", "content": "[core]\n\tfsmonitor = touch /tmp/pwned\n"}),
        ("filesystem.write", {"path": ".ai/config/agent_harness.yaml", "content": "rate_limits: {}\n"}),
        ("filesystem.write", {"path": f".ai/logs/audit/{day}/{run_id}.jsonl", "content": "{}\n"}),
        ("filesystem.write", {"path": ".ai/tools/x/main.py", "content": "import os\nos.system('id')\n"}),
        ("filesystem.write", {"path": "notes/../.git/hooks/pre-commit", "content": "#!/bin/sh\nid\n"}),
        ("filesystem.delete", {"path": ".ai/logs"}),
        ("filesystem.delete", {"path": ".ai"}),  # not protected itself, but it holds .ai/logs
        ("filesystem.move", {"source": ".ai", "destination": "old_ai"}),
        ("filesystem.read", {"path": "link_out/secret"}),
        ("filesystem.write", {"path": "link_out/planted", "content": "x"}),
        ("filesystem.list", {"path": "link_out"}),
    ]
    for tool, args in attacks:
        result = await runs.call_tool(run_id, tool, args)
        assert result.status == "denied", (tool, args, result)
        assert "protected place" in result.reason or "symbolic link" in result.reason, result.reason
    listing = await runs.call_tool(run_id, "filesystem.list", {"path": "."})
    entries = {e["name"]: e for e in listing.result["entries"]}
    assert entries["link_out"] == {"name": "link_out", "type": "symlink", "size": None}
    assert entries[".git"] == {"name": ".git", "type": None, "size": None}
    assert project_files(project) == before and snapshot(outside) == outside_before

    # The allowed twin still works.
    assert (
        await runs.call_tool(run_id, "filesystem.write", {"path": "notes/ok.md", "content": "ok"})
    ).status == "ok"
    await runs.cancel(run_id)

    async def audited():
        calls = [r for r in read_audit(str(project), run_id) if r["event"] == "tool_call"]
        return calls if len(calls) == len(attacks) + 2 else None

    calls = await wait_for(audited, what="the calls in the audit trail")
    assert [c["decision"] for c in calls[: len(attacks)]] == ["denied"] * len(attacks)
    assert all(
        "protected place" in c["reason"] or "symbolic link" in c["reason"] for c in calls[: len(attacks)]
    )
    assert [c["decision"] for c in calls[len(attacks) :]] == ["allowed", "allowed"]


async def test_a_symlink_swapped_in_while_the_agent_calls_gets_nothing_out(runs, project, tmp_path_factory):
    outside = tmp_path_factory.mktemp("outside")
    (outside / "secret").write_text(SECRET)
    run_id = await start(runs, project)
    outside_before = snapshot(outside)
    results = []
    with Swapper(project, outside, "dir") as swapper:
        for i in range(40):
            results.append(await runs.call_tool(run_id, "filesystem.read", {"path": "victim/secret"}))
            results.append(await runs.call_tool(run_id, "filesystem.list", {"path": "victim"}))
            results.append(
                await runs.call_tool(
                    run_id, "filesystem.write", {"path": "victim/secret", "content": f"agent {i}"}
                )
            )
            assert snapshot(outside) == outside_before
    assert swapper.swaps > 0
    for result in results:
        assert result.status in ("ok", "denied", "error"), result
        assert SECRET not in str(result.result) and SECRET not in result.reason
        if result.status == "denied":
            assert "symbolic link" in result.reason
    assert snapshot(outside) == outside_before
    await runs.cancel(run_id)
