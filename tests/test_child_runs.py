"""Child runs (directive.run): the intersection of grants, escalation denied or narrowed, and recorded."""

from __future__ import annotations

import json

from temporalio.worker import Replayer

from activities.audit import read_audit
from kiwi.contracts import DIRECTIVE_ATTR, PROJECT_ATTR
from kiwi.converter import data_converter
from tests.helpers import directive_md, wait_for, write, write_directive
from workers.main import SANDBOX, WORKFLOWS

WRITE = (
    '<step name="{name}"><tool_call tool="filesystem.write"><param name="path">{path}</param>'
    '<param name="content">{content}</param></tool_call></step>'
)


def setup(project, parent_body: str) -> None:
    ai = project / ".ai" / "directives"
    write_directive(
        ai / "writer.md",
        directive_md(
            WRITE.format(name="write", path="notes/{who}.txt", content="by {who}"),
            name="writer",
            permissions='<write resource="filesystem" path="notes/**"/>',
            inputs='<input name="who" type="string" required="true"/>',
        ),
    )
    write_directive(
        ai / "greedy.md",
        directive_md(
            WRITE.format(name="write", path="notes/greedy.txt", content="greedy")
            + '<step name="finish"><action>Try things, then finish.</action></step>',
            name="greedy",
            permissions='<write resource="filesystem" path="notes/**"/><write resource="filesystem" path="src/**"/>'
            '<execute resource="shell" commands="npm"/>',
        ),
    )
    write_directive(
        ai / "parent.md",
        directive_md(
            parent_body,
            name="parent",
            permissions='<write resource="filesystem" path="notes/**"/><execute resource="tool" id="directive.run"/>',
        ),
    )


async def test_a_step_runs_a_child_and_gets_its_outputs(runs, project):
    setup(
        project,
        '<step name="delegate"><tool_call tool="directive.run"><param name="directive">writer</param>'
        '<param name="inputs">{"who": "kid"}</param></tool_call></step>',
    )
    write_directive(
        project / ".ai" / "directives" / "parent.md",
        (project / ".ai" / "directives" / "parent.md")
        .read_text()
        .replace('<param name="inputs">{"who": "kid"}</param>', '<param name="inputs">{child_inputs}</param>')
        .replace("<inputs>\n", '<inputs>\n<input name="child_inputs" type="object" required="true"/>\n'),
    )
    run_id = await runs.start("parent", {"child_inputs": {"who": "kid"}})
    result = await runs.handle(run_id).result()
    assert result.status == "completed"
    child = result.outputs["delegate"]["result"]
    assert child["status"] == "completed" and child["run_id"].startswith("run-writer-")
    assert (project / "notes" / "kid.txt").read_text() == "by kid"
    status = await runs.status(run_id)
    assert [(c.directive, c.status) for c in status.children] == [("writer", "completed")]
    assert any(r["event"] == "child_started" for r in read_audit(str(project), run_id))
    # The child is this project's run from its start, as a run a client starts is.
    described = await runs.handle(child["run_id"]).describe()
    assert described.typed_search_attributes.get(PROJECT_ATTR) == str(project)
    assert described.typed_search_attributes.get(DIRECTIVE_ATTR) == "writer"
    # The parent's history (a child started behind its patch) replays on this code.
    await Replayer(
        workflows=WORKFLOWS, data_converter=data_converter, workflow_runner=SANDBOX
    ).replay_workflow(await runs.handle(run_id).fetch_history())


async def test_a_child_asking_for_more_than_its_parent_is_denied_and_recorded(runs, project):
    setup(project, '<step name="work"><action>Delegate.</action></step>')
    run_id = await runs.start("parent", {})
    await wait_for(lambda: _waiting(runs, run_id), what="parent to wait")
    result = await runs.call_tool(run_id, "directive.run", {"directive": "greedy"})
    assert result.status == "denied"
    assert "write src/**" in result.reason and "shell npm" in result.reason
    assert await runs.list_runs(directive="greedy") == []
    assert not (project / "notes" / "greedy.txt").exists()
    await runs.cancel(run_id)

    async def recorded():
        return [r for r in read_audit(str(project), run_id) if r["event"] == "escalation_attempt"]

    attempt = (await wait_for(recorded, what="escalation audit record"))[0]
    assert attempt["outcome"] == "denied" and "write src/**" in attempt["excess"]


async def test_escalation_can_be_configured_to_run_with_the_intersection(runs, project):
    write(project / ".ai" / "config" / "agent_harness.yaml", "child_runs:\n  on_escalation: intersect\n")
    setup(project, '<step name="work"><action>Delegate.</action></step>')
    run_id = await runs.start("parent", {})
    await wait_for(lambda: _waiting(runs, run_id), what="parent to wait")
    started = await runs.call_tool(run_id, "directive.run", {"directive": "greedy"})
    assert started.status == "ok" and set(started.result["narrowed"]) == {
        "read src/**",
        "write src/**",
        "shell npm",
    }
    child_id = started.result["run_id"]
    await wait_for(lambda: _waiting(runs, child_id), what="child to wait")
    assert (project / "notes" / "greedy.txt").read_text() == "greedy"
    outside = await runs.call_tool(child_id, "filesystem.write", {"path": "src/a.py", "content": "x"})
    assert outside.status == "denied" and not (project / "src").exists()
    shell = await runs.call_tool(child_id, "shell.run", {"command": "npm test"})
    assert shell.status == "denied"
    inside = await runs.call_tool(child_id, "filesystem.write", {"path": "notes/b.txt", "content": "ok"})
    assert inside.status == "ok"
    assert [(c.run_id, c.status) for c in (await runs.status(run_id)).children] == [(child_id, "running")]
    await runs.complete_step(child_id, "finish", {"done": True})

    async def child_done():
        children = (await runs.status(run_id)).children
        return children if children[0].status != "running" else None

    children = await wait_for(child_done, what="the parent to see its child finish")
    assert [(c.run_id, c.status) for c in children] == [(child_id, "completed")]


async def _waiting(runs, run_id):
    return (await runs.status(run_id)).status == "awaiting_agent"


async def test_cancelling_a_run_cancels_the_child_runs_it_started_unless_kept(runs, project):
    # A new-user trial: `kiwi cancel PARENT` left the child the agent had started from it waiting for the
    # agent, its parent's work gone. The CLI cancels it (and its own children) with the parent now.
    from tests.helpers import kiwi_cli, start_parent_with_child, write_parent_and_child

    write_parent_and_child(project, helper_steps=("help", "more"))
    parent, child = await start_parent_with_child(runs)
    grandchild = (await runs.call_tool(child, "directive.run", {"directive": "helper"})).result["run_id"]
    address = ["--address", runs.client.service_client.config.target_host, "--task-queue", runs.task_queue]
    code, out, err = await kiwi_cli("cancel", parent, "--json", *address, cwd=project)
    assert code == 0, err
    assert json.loads(out)["children_cancelled"] == [child, grandchild]
    for run_id in (parent, child, grandchild):
        assert (await runs.handle(run_id).result()).status == "cancelled"
    reasons = [r["reason"] for r in read_audit(str(project), child) if r["event"] == "cancel_requested"]
    assert reasons == [f"its parent run {parent} was cancelled (cancelled from the CLI)"]
    # The cancelled parent lists its child as it is now (found by the s18 trial: still 'running').
    assert [(c.run_id, c.status) for c in (await runs.status(parent)).children] == [(child, "cancelled")]

    # --keep-children leaves them running, as a parent that completes does.
    kept_parent, kept_child = await start_parent_with_child(runs)
    code, out, err = await kiwi_cli("cancel", kept_parent, "--keep-children", "--json", *address, cwd=project)
    assert code == 0 and json.loads(out)["children_cancelled"] == [], err
    assert (await runs.handle(kept_parent).result()).status == "cancelled"
    assert (await runs.status(kept_child)).status == "awaiting_agent"
    await runs.cancel(kept_child)
