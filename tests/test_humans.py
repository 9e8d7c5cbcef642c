"""Humans in the loop: approvals (signals and timers), escalations, git checkpoints and rollback."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
from datetime import datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from mcp.client import Client
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import WorkflowFailureError, WorkflowUpdateStage

from activities.audit import read_audit
from kiwi.contracts import ApprovalDecision, ApprovalRequest, CallToolRequest, HelpRequest
from kiwi.errors import InputInvalid, KiwiError, RunStateConflict
from kiwi.guards import digest
from kiwi.keys import create_key
from kiwi.runs import RunClient
from kiwi.snapshot import signed_decision
from mcp_frontend.server import build_server
from tests.helpers import approver, directive_md, run_client, wait_for, write, write_directive
from workers.main import build_worker

KIWI = (sys.executable, "-m", "kiwi")

HARNESS = "approvals:\n  tools: [filesystem.delete, git.rollback]\n  timeout_seconds: 3600\n"
GRANTS = (
    '<read resource="filesystem" path="**"/><write resource="filesystem" path="notes/**"/>'
    '<execute resource="tool" id="git.checkpoint"/><execute resource="tool" id="git.rollback"/>'
)


def setup(
    project: Path,
    harness: str = HARNESS,
    body: str = '<step name="work"><action>Tidy notes.</action></step>',
    extra_meta: str = "",
) -> None:
    write(project / ".ai" / "config" / "agent_harness.yaml", harness)
    for name in ("alice", "bob"):
        approver(name)
    write_directive(
        project / ".ai" / "directives" / "tidy.md",
        directive_md(body, name="tidy", permissions=GRANTS, extra_meta=extra_meta),
    )
    write(project / "notes" / "old.txt", "old")


def readme_ui_views(project: Path) -> dict[str, str]:
    """The Temporal UI filters of the README's 'Views in the Temporal UI' table, for ``project``."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    table = readme.split("<!-- ui-views -->", 1)[1].split("\n\n", 1)[0]
    views = {}
    for line in table.strip().splitlines()[2:]:
        name, query = (cell.strip() for cell in line.strip("|").split("|"))
        views[name] = query.strip("`").replace("/home/you/project", str(project))
    assert len(views) == 5, views
    return views


async def status_is(runs: RunClient, run_id: str, wanted: str):
    status = await runs.status(run_id)
    return status if status.status == wanted else None


async def pending_approval(runs: RunClient, run_id: str):
    status = await status_is(runs, run_id, "awaiting_approval")
    return status and [a for a in status.approvals if a.status == "pending"]


async def agent_waits(runs: RunClient, run_id: str):
    return await status_is(runs, run_id, "awaiting_agent")


async def test_an_approved_call_runs_and_the_decision_is_recorded(runs, project):
    setup(project)
    run_id = await runs.start("tidy", {}, client_name="agent-7")
    await wait_for(lambda: agent_waits(runs, run_id), what="the agent step")
    call = asyncio.create_task(
        runs.call_tool(run_id, "filesystem.delete", {"path": "notes/old.txt"}, client_name="agent-7")
    )
    (request,) = await wait_for(lambda: pending_approval(runs, run_id), what="the approval request")
    assert request.tool == "filesystem.delete" and request.requested_by == "agent-7"
    status = await runs.status(run_id)
    assert f"kiwi approve {run_id} {request.request_id}" in status.waiting_for
    assert (project / "notes" / "old.txt").exists()
    with pytest.raises(KiwiError, match="no signing key 'agent-7'"):
        await runs.decide_approval(run_id, request.request_id, True, by="agent-7")
    # What the Temporal UI shows an approver (the run's current details): the request, its call hash
    # (the one the signed decision must name) and the command that answers it.
    metadata = await runs.handle(run_id).query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
    details = metadata.current_details
    assert f"Waiting for approval `{request.request_id}` of {request.summary}" in details, details
    assert f"args_hash `{request.args_hash}`" in details and len(request.args_hash) >= 16
    assert f"`kiwi approve {run_id} {request.request_id}`" in details
    # The README's Temporal UI views, run as written: this run is in exactly the ones that fit it.
    views = readme_ui_views(project)

    async def views_with_the_run():
        found = set()
        for name, query in views.items():
            if [w async for w in runs.client.list_workflows(f"WorkflowId = '{run_id}' AND {query}")]:
                found.add(name)
        wanted = {"waiting for an approval", "one directive's runs that are still open", "one project's runs"}
        return found if found == wanted else None

    await wait_for(views_with_the_run, what=f"the README's views to list {run_id} where it belongs")
    # A key of one's own that nobody trusts signs a decision the run refuses: the command says so.
    create_key("mallory")
    refused = await asyncio.create_subprocess_exec(
        *KIWI,
        "approve",
        run_id,
        request.request_id,
        "--by",
        "mallory",
        "--address",
        runs.client.service_client.config.target_host,
        "--task-queue",
        runs.task_queue,
        cwd=project,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await refused.communicate()
    assert refused.returncode == 1 and not out, (out, err)
    assert f"run {run_id} refused the decision on {request.request_id} by 'mallory'" in err.decode()
    assert "Traceback" not in err.decode()
    after = await runs.status(run_id)
    assert [a.status for a in after.approvals] == ["pending"]
    assert [(r.request_id, r.by) for r in after.refused_decisions] == [(request.request_id, "mallory")]
    cli = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "kiwi",
        "approve",
        run_id,
        request.request_id,
        "--by",
        "alice",
        "--reason",
        "old notes can go",
        "--address",
        runs.client.service_client.config.target_host,
        "--task-queue",
        runs.task_queue,
        cwd=project,
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await cli.communicate()
    assert cli.returncode == 0 and f"approved {request.request_id}: filesystem.delete" in out.decode()
    result = await asyncio.wait_for(call, timeout=30)
    assert result.status == "ok" and not (project / "notes" / "old.txt").exists()
    assert (await runs.status(run_id)).status == "awaiting_agent"
    with pytest.raises(RunStateConflict, match="already approved"):
        await runs.decide_approval(run_id, request.request_id, False, by="bob")
    await runs.complete_step(run_id, "work", {})
    await runs.handle(run_id).result()
    decided = [r for r in read_audit(str(project), run_id) if r["event"] == "approval_decided"]
    assert [(r["decision"], r["by"], r["reason"]) for r in decided] == [
        ("approved", "alice", "old notes can go")
    ]


async def test_a_rejected_call_never_runs_and_a_changed_call_needs_its_own_approval(runs, project):
    # The rule comes from the directive this time, not the harness.
    setup(
        project,
        harness="approvals:\n  tools: []\n",
        extra_meta='<approvals timeout="600"><tool>filesystem.del*</tool></approvals>',
    )
    run_id = await runs.start("tidy", {})
    await wait_for(lambda: agent_waits(runs, run_id), what="the agent step")
    first = asyncio.create_task(runs.call_tool(run_id, "filesystem.delete", {"path": "notes/old.txt"}))
    (request,) = await wait_for(lambda: pending_approval(runs, run_id), what="the first request")
    assert (
        datetime.fromisoformat(request.expires_at) - datetime.fromisoformat(request.requested_at)
    ).seconds == 600
    # An approver who saw other arguments: the run refuses that decision and keeps waiting.
    await runs.handle(run_id).signal(
        "decide_approval",
        ApprovalDecision(request_id=request.request_id, approved=True, by="alice", args_hash="0" * 16),
    )

    async def refused():
        return [r for r in read_audit(str(project), run_id) if r["event"] == "approval_decision_refused"]

    (record,) = await wait_for(refused, what="the mismatched decision to be refused")
    assert "changed call needs a new approval" in record["reason"]
    assert (await runs.status(run_id)).approvals[0].status == "pending"
    await runs.decide_approval(run_id, request.request_id, False, by="alice", reason="keep it")
    rejected = await asyncio.wait_for(first, timeout=30)
    assert (
        rejected.status == "denied"
        and rejected.error_type == "ApprovalRejected"
        and "keep it" in rejected.reason
    )
    assert (project / "notes" / "old.txt").exists()
    changed = asyncio.create_task(runs.call_tool(run_id, "filesystem.delete", {"path": "notes/other.txt"}))
    second = await wait_for(lambda: pending_approval(runs, run_id), what="a new request for the changed call")
    assert second[0].request_id != request.request_id and second[0].args_hash != request.args_hash
    await runs.cancel(run_id)
    assert (await asyncio.wait_for(changed, timeout=30)).error_type == "ApprovalCancelled"


async def test_a_run_waiting_for_approval_survives_its_worker_and_is_approved_while_none_runs(
    temporal_env, project
):
    setup(
        project,
        body='<step name="clean"><tool_call tool="filesystem.delete"><param name="path">notes/old.txt'
        "</param></tool_call></step>",
    )
    runs = run_client(temporal_env.client, project)
    async with build_worker(temporal_env.client, runs.task_queue, sandboxed=True):
        run_id = await runs.start("tidy", {})
        (request,) = await wait_for(lambda: pending_approval(runs, run_id), what="the approval request")
    # No worker now: the approval is a signal the server keeps (as `temporal workflow signal` would send it).
    decision = signed_decision(run_id, await runs.execution(run_id), request, True, "alice")
    await runs.handle(run_id).signal("decide_approval", decision)
    assert (project / "notes" / "old.txt").exists()
    async with build_worker(temporal_env.client, runs.task_queue, sandboxed=True):
        result = await runs.handle(run_id).result()
    assert result.status == "completed" and not (project / "notes" / "old.txt").exists()


async def test_an_unanswered_approval_times_out_as_denied(time_skipping_env, project):
    setup(project)
    runs = run_client(time_skipping_env.client, project)
    async with build_worker(time_skipping_env.client, runs.task_queue, sandboxed=True):
        run_id = await runs.start("tidy", {})
        await wait_for(lambda: agent_waits(runs, run_id), what="the agent step")
        update = await runs.handle(run_id).start_update(
            "call_tool",
            # (The request as Kiwi's clients send it: a seal covers the request model's own JSON.)
            CallToolRequest(tool="filesystem.delete", arguments={"path": "notes/old.txt"}),
            id="the-call",
            wait_for_stage=WorkflowUpdateStage.ACCEPTED,
        )
        await wait_for(lambda: pending_approval(runs, run_id), what="the approval request")
        await time_skipping_env.sleep(timedelta(hours=1, minutes=1))  # the one-hour timeout, skipped
        result = await update.result()
        assert result["status"] == "denied" and result["error_type"] == "ApprovalTimedOut"
        assert (await runs.status(run_id)).status == "awaiting_agent"
        await runs.cancel(run_id)
        await runs.handle(run_id).result()
    assert (project / "notes" / "old.txt").exists()


async def test_an_approval_timeout_fires_while_no_worker_runs(temporal_env, project):
    setup(
        project,
        harness="approvals:\n  tools: [filesystem.delete]\n  timeout_seconds: 2\n",
        body='<step name="clean"><tool_call tool="filesystem.delete"><param name="path">notes/old.txt'
        "</param></tool_call></step>",
    )
    runs = run_client(temporal_env.client, project)
    async with build_worker(temporal_env.client, runs.task_queue, sandboxed=True):
        run_id = await runs.start("tidy", {})
        (request,) = await wait_for(lambda: pending_approval(runs, run_id), what="the approval request")

    async def expired():
        history = await runs.handle(run_id).fetch_history()
        started = {
            e.event_id
            for e in history.events
            if e.HasField("timer_started_event_attributes")
            and f"approval {request.request_id} expires" in str(e.user_metadata)
        }
        return any(
            e.HasField("timer_fired_event_attributes")
            and e.timer_fired_event_attributes.started_event_id in started
            for e in history.events
        )

    await wait_for(expired, what="the approval timer to fire on the server, no worker up")
    async with build_worker(temporal_env.client, runs.task_queue, sandboxed=True):
        with pytest.raises(WorkflowFailureError) as failed:
            await runs.handle(run_id).result()
    assert "ApprovalTimedOut" in str(failed.value.cause) or "timed out" in str(failed.value.cause)
    assert (project / "notes" / "old.txt").exists()
    # What the Temporal UI shows as the run's result: a Kiwi error saying what happened, no Python stack.
    history = await runs.handle(run_id).fetch_history()
    (closed,) = [e for e in history.events if e.HasField("workflow_execution_failed_event_attributes")]
    failure = closed.workflow_execution_failed_event_attributes.failure
    assert f"approval {request.request_id}" in failure.message and "timed out" in failure.message, failure
    assert failure.application_failure_info.type == "StepFailed" or "ApprovalTimedOut" in str(failure)
    assert not failure.stack_trace and "Traceback" not in str(failure) and 'File "' not in str(failure)


async def test_an_escalation_waits_for_a_human_decision_that_goes_back_to_the_agent(runs, project):
    setup(project)
    run_id = await runs.start("tidy", {})
    await wait_for(lambda: agent_waits(runs, run_id), what="the agent step")
    await runs.help(
        run_id,
        HelpRequest(
            kind="escalate", reason="two ways to tidy", options=["archive", "delete"], request_id="decision-x"
        ),
    )
    held = await wait_for(
        lambda: status_is(runs, run_id, "awaiting_human"), what="the run to wait for a human"
    )
    assert f"kiwi decide {run_id} decision-x OPTION" in held.waiting_for
    # `kiwi status` says the answer releases the run (README trial s38: its next line said to resume it).
    from kiwi.cli.progress import answers

    lines = answers(held)
    assert f"answer with `kiwi decide {run_id} decision-x archive|delete`" in lines[0], lines
    assert "answering the escalation (above) lets the run go on with the answer" in lines[1], lines
    with pytest.raises(RunStateConflict) as held_call:
        await runs.call_tool(run_id, "filesystem.read", {"path": "notes/old.txt"})
    # The refusal names the command that answers the question, not only `kiwi resume` (which lets the run
    # carry on with it unanswered): a new-user trial followed the refusal and left the question open.
    assert f"`kiwi decide {run_id} decision-x OPTION`" in held_call.value.hint
    # ...and so does the refusal itself (s18 trial: it said "a human must resume it", its hint kiwi decide).
    assert f"a human answers it with `kiwi decide {run_id} decision-x OPTION`" in held_call.value.message
    with pytest.raises(InputInvalid, match="archive, delete"):
        await runs.decide(run_id, "decision-x", "burn", by="bob")
    await runs.decide(run_id, "decision-x", "archive", by="bob", note="keep history")
    back = await wait_for(lambda: agent_waits(runs, run_id), what="the run to carry on")
    assert [(d.answer, d.by, d.note) for d in back.decisions] == [("archive", "bob", "keep history")]
    assert (await runs.call_tool(run_id, "filesystem.read", {"path": "notes/old.txt"})).status == "ok"


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, text=True).stdout


async def test_checkpoint_and_approved_rollback_on_a_real_repository(runs, project):
    setup(project)
    write(project / ".gitignore", "build/\n.ai/logs/\n.ai/.cache/\n")
    git(project, "init", "-q", "-b", "main")
    git(project, "-c", "user.email=t@example.com", "-c", "user.name=t", "add", ".")
    git(project, "-c", "user.email=t@example.com", "-c", "user.name=t", "commit", "-q", "-m", "base")
    write(project / "notes" / "old.txt", "edited, not committed")
    write(project / "notes" / "draft.txt", "untracked")
    write(project / "build" / "out.bin", "ignored")
    head, index_status = git(project, "rev-parse", "HEAD"), git(project, "status", "--porcelain")
    run_id = await runs.start("tidy", {})
    await wait_for(lambda: agent_waits(runs, run_id), what="the agent step")
    made = await runs.call_tool(run_id, "git.checkpoint", {"message": "before tidying"})
    assert made.status == "ok" and made.result["available"], made
    assert git(project, "rev-parse", "HEAD") == head and git(project, "status", "--porcelain") == index_status
    assert "draft.txt" in git(project, "ls-tree", "-r", "--name-only", made.result["commit"])
    assert "out.bin" not in git(project, "ls-tree", "-r", "--name-only", made.result["commit"])
    write(project / "notes" / "old.txt", "ruined")
    (project / "notes" / "draft.txt").unlink()
    write(project / "notes" / "new.txt", "created after the checkpoint")
    rollback = asyncio.create_task(
        runs.call_tool(run_id, "git.rollback", {"checkpoint": made.result["checkpoint"]})
    )
    (request,) = await wait_for(lambda: pending_approval(runs, run_id), what="rollback to ask for approval")
    assert (project / "notes" / "new.txt").exists()
    await runs.decide_approval(run_id, request.request_id, True, by="alice")
    rolled = await asyncio.wait_for(rollback, timeout=30)
    assert rolled.status == "ok" and rolled.result["removed"] == ["notes/new.txt"]
    # The files it changed, not every file of the checkpoint (review s36: "restored" counted them all).
    assert rolled.result["restored_files"] == ["notes/draft.txt", "notes/old.txt"], rolled.result
    assert rolled.result["restored"] == 2, rolled.result
    assert (project / "notes" / "old.txt").read_text() == "edited, not committed"
    assert (project / "notes" / "draft.txt").read_text() == "untracked"
    assert (project / "build" / "out.bin").read_text() == "ignored"
    assert git(project, "rev-parse", "HEAD") == head and git(project, "status", "--porcelain") == index_status
    assert [c["checkpoint"] for c in (await runs.status(run_id)).checkpoints] == [made.result["checkpoint"]]


async def test_attack_a_rollback_restores_and_removes_only_what_the_run_may_write(runs, project):
    """Hostile review s36: a run granted `write notes/**` took a checkpoint; the human then edited the tracked
    src/app.py and made src/new_feature.py; the agent's approved rollback made src/app.py the checkpoint's and
    deleted the human's new file, which no checkpoint held. A rollback now restores and removes only what the
    run may write, and names what else it left as it is."""
    setup(project)
    write(project / ".gitignore", ".ai/logs/\n.ai/.cache/\n")
    write(project / "src" / "app.py", "v1\n")
    git(project, "init", "-q", "-b", "main")
    git(project, "-c", "user.email=t@example.com", "-c", "user.name=t", "add", ".")
    git(project, "-c", "user.email=t@example.com", "-c", "user.name=t", "commit", "-q", "-m", "base")
    run_id = await runs.start("tidy", {})
    await wait_for(lambda: agent_waits(runs, run_id), what="the agent step")
    made = await runs.call_tool(run_id, "git.checkpoint", {"message": "before"})
    assert made.status == "ok" and made.result["available"], made
    write(project / "src" / "app.py", "v2 human work\n")  # (the human's, outside the run's grants)
    write(project / "src" / "new_feature.py", "human's new file\n")
    write(project / "notes" / "old.txt", "the agent's edit")  # (the run's to write: notes/**)
    write(project / "notes" / "scratch.txt", "the agent's new file")
    rollback = asyncio.create_task(runs.call_tool(run_id, "git.rollback", {}))
    (request,) = await wait_for(lambda: pending_approval(runs, run_id), what="rollback to ask for approval")
    await runs.decide_approval(run_id, request.request_id, True, by="alice")
    rolled = await asyncio.wait_for(rollback, timeout=30)
    assert rolled.status == "ok", rolled
    assert (project / "src" / "app.py").read_text() == "v2 human work\n"
    assert (project / "src" / "new_feature.py").read_text() == "human's new file\n"
    assert (project / "notes" / "old.txt").read_text() == "old"
    assert not (project / "notes" / "scratch.txt").exists()
    assert rolled.result["removed"] == ["notes/scratch.txt"], rolled.result
    assert rolled.result["restored_files"] == ["notes/old.txt"], rolled.result
    assert rolled.result["left_outside_grants"] == ["src/app.py", "src/new_feature.py"], rolled.result


async def test_help_checkpoint_says_whether_the_run_takes_one(runs, project, temporal_env):
    """README trial s33: help(action='checkpoint') answered 'checkpoint_recorded ... a git checkpoint is
    taken' for a run whose grants refused it (the audit trail said help_checkpoint_denied, no ref was made):
    the agent counted on a checkpoint it did not have. Now a refused one is an error saying why (no grant, a
    held run), and a granted one says it is taken and where it is listed."""
    setup(project)
    write(project / ".gitignore", ".ai/logs/\n.ai/.cache/\n")
    git(project, "init", "-q", "-b", "main")
    server = build_server(temporal_env.client, project, task_queue=runs.task_queue, client_name="agent-9")
    async with Client(server) as client:

        async def call(tool: str, **arguments):
            result = await client.call_tool(tool, arguments)
            return result.structured_content or json.loads(result.content[0].text)

        granted = (await call("execute", item_type="directive", action="run", item_id="tidy"))["run_id"]
        asked = await call("help", action="checkpoint", run_id=granted, reason="before the big edit")
        assert asked["status"] == "checkpoint_requested" and "'checkpoints'" in asked["message"], asked

        async def listed():
            return (await runs.status(granted)).checkpoints

        (made,) = await wait_for(listed, what="the checkpoint the agent asked for")
        assert git(project, "rev-parse", "--verify", f"refs/kiwi/checkpoints/{made['checkpoint']}").strip()
        ungranted = (
            await call(
                "execute", item_type="directive", action="run", item_id="hello_kiwi", parameters={"name": "A"}
            )
        )["run_id"]
        refused = await call("help", action="checkpoint", run_id=ungranted, reason="save me")
        assert refused["error"] == "PermissionDenied", refused
        assert refused["message"] == "no checkpoint taken: tool 'git.checkpoint' is not granted", refused
        assert "git.checkpoint" in refused["hint"], refused
        held = await call("help", action="escalate", run_id=granted, reason="which way?", options=["a", "b"])
        assert held["status"] == "escalated"
        await wait_for(
            lambda: status_is(runs, granted, "awaiting_human"), what="the escalation to hold the run"
        )
        refused = await call("help", action="checkpoint", run_id=granted, reason="while held")
        assert refused["error"] == "RunStateConflict" and "is awaiting_human" in refused["message"], refused
        assert f"kiwi resume {granted}" in refused["hint"], refused
    assert len((await runs.status(granted)).checkpoints) == 1
    assert not (await runs.status(ungranted)).checkpoints


async def test_checkpoints_outside_git_are_unavailable_and_auto_mode_checkpoints_writes(runs, project):
    setup(project, extra_meta='<git_checkpoint mode="auto"/>')
    run_id = await runs.start("tidy", {})
    await wait_for(lambda: agent_waits(runs, run_id), what="the agent step")
    outside = await runs.call_tool(run_id, "git.checkpoint", {})
    assert outside.status == "ok" and outside.result["available"] is False
    assert "not a git repository" in outside.result["reason"]
    await runs.cancel(run_id)
    git(project, "init", "-q", "-b", "main")
    run_id = await runs.start("tidy", {})
    await wait_for(lambda: agent_waits(runs, run_id), what="the agent step")
    wrote = await runs.call_tool(run_id, "filesystem.write", {"path": "notes/a.txt", "content": "a"})
    assert wrote.status == "ok"
    checkpoints = (await runs.status(run_id)).checkpoints
    assert [c["why"] for c in checkpoints] == ["after filesystem.write"]
    assert "notes/a.txt" in git(project, "ls-tree", "-r", "--name-only", checkpoints[0]["commit"])


async def test_the_agent_cannot_approve_through_mcp_and_the_webhook_tells_approvers(
    runs, project, temporal_env
):
    received: list[dict] = []

    class Hook(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - the http.server API
            received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args):
            pass

    hook = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=hook.serve_forever, daemon=True).start()
    try:
        setup(
            project,
            harness=HARNESS + f"  webhook: http://127.0.0.1:{hook.server_address[1]}/approvals\n",
            extra_meta="<deviation_rules><ask_first>deleting notes</ask_first></deviation_rules>",
        )
        server = build_server(temporal_env.client, project, task_queue=runs.task_queue, client_name="agent-9")
        async with Client(server) as client:
            started = (
                await client.call_tool(
                    "execute", {"item_type": "directive", "action": "run", "item_id": "tidy"}
                )
            ).structured_content
            run_id = started["run_id"]
            (rule,) = started["deviation_rules"]
            assert rule["rule"] == "ask_first" and "deleting notes" in rule["when"]
            assert f"help(action='escalate', run_id='{run_id}'" in rule["do"]
            pending = (
                await client.call_tool(
                    "execute",
                    {
                        "item_type": "tool",
                        "action": "call",
                        "run_id": run_id,
                        "item_id": "filesystem.delete",
                        "parameters": {"path": "notes/old.txt"},
                        "wait_seconds": 0.5,
                    },
                )
            ).structured_content
            assert pending["status"] == "pending" and "approve" in pending["reason"]
            (request,) = await wait_for(lambda: pending_approval(runs, run_id), what="the approval request")
            attempt = await client.call_tool(
                "execute",
                {"item_type": "run", "action": "approve", "run_id": run_id, "item_id": request.request_id},
            )
            assert attempt.is_error
            assert (await runs.status(run_id)).approvals[0].status == "pending"

            async def posted():
                return received

            await wait_for(posted, what="the webhook POST")
            assert (
                received[0]["request_id"] == request.request_id and received[0]["tool"] == "filesystem.delete"
            )
            assert received[0]["approve"] == f"kiwi approve {run_id} {request.request_id}"
            await runs.cancel(run_id)
    finally:
        hook.shutdown()


async def test_a_call_outside_a_run_waiting_for_approval_answers_pending_and_is_polled(
    runs, project, temporal_env
):
    # Outside a run the call goes to the project's session; one that waits for a human must not hold the
    # MCP request until the human decides (clients time out): it answers 'pending' with the session's
    # run id and a call id, as a call in a run does, and polling gives the answer once approved.
    setup(
        project,
        harness=HARNESS + "internal_tools:\n  filesystem:\n    allowed_paths: [notes]\n",
    )
    server = build_server(temporal_env.client, project, task_queue=runs.task_queue, client_name="agent-9")
    async with Client(server) as client:
        pending = (
            await client.call_tool(
                "execute",
                {
                    "item_type": "tool",
                    "action": "call",
                    "item_id": "filesystem.delete",
                    "parameters": {"path": "notes/old.txt"},
                    "wait_seconds": 0.5,
                },
            )
        ).structured_content
        assert pending["status"] == "pending" and "approve" in pending["reason"], pending
        session, call_id = pending["result"]["run_id"], pending["result"]["call_id"]
        assert session.startswith("session-")
        assert (project / "notes" / "old.txt").exists()
        (request,) = await wait_for(lambda: pending_approval(runs, session), what="the approval request")
        await runs.decide_approval(session, request.request_id, True, by="alice")
        done = (
            await client.call_tool(
                "execute",
                {
                    "item_type": "run",
                    "action": "poll",
                    "run_id": session,
                    "item_id": call_id,
                    "wait_seconds": 30,
                },
            )
        ).structured_content
        assert done["status"] == "ok", done
        assert not (project / "notes" / "old.txt").exists()


async def test_approvals_are_listed_and_sent_while_no_worker_runs(temporal_env, project):
    """Found by the s18 README trial: with no worker running, `kiwi approvals` hung 30 s and listed nothing
    and `kiwi approve` failed ("no poller seen"), though the README says a decision is sent and taken when a
    worker runs. Without a worker that answers, the pending requests come from what Temporal keeps (the
    run's KiwiPendingApproval) and the audit trail (what each asks); the signed decision is sent, and the
    run takes it once a worker runs."""
    from kiwi.auditlog import read_audit

    setup(
        project,
        body='<step name="clean"><tool_call tool="filesystem.delete"><param name="path">notes/old.txt'
        "</param></tool_call></step>",
    )
    runs = run_client(temporal_env.client, project)

    async def requested():
        return [r for r in read_audit(str(project), run_id) if r["event"] == "approval_requested"] or None

    async with build_worker(temporal_env.client, runs.task_queue, sandboxed=True):
        run_id = await runs.start("tidy", {})
        (request,) = await wait_for(lambda: pending_approval(runs, run_id), what="the approval request")
        await wait_for(requested, what="the approval request's audit record")
    # A status query unanswered (the worker just stopped, Temporal still lists its poller) is asked once: the
    # next question of the same client takes the worker to be gone (each waited QUERY_SECONDS before).
    asked: list[str] = []
    status_of = runs._status

    async def counted(run: str, rpc_timeout=None):
        asked.append(run)
        return await status_of(run, rpc_timeout)

    runs._status = counted
    listed = await runs.pending_approvals()
    assert [(a["run_id"], a["request_id"], a["tool"], a["args_hash"]) for a in listed] == [
        (run_id, request.request_id, "filesystem.delete", request.args_hash)
    ]
    assert "notes/old.txt" in listed[0]["summary"]
    # (Read from the audit record's redacted copy, which it says: review s36, second round.)
    assert listed[0]["summary"].endswith(
        "with a worker running, `kiwi approvals` shows the whole call; deny what you cannot read]"
    )
    sent = await runs.decide_approval(run_id, request.request_id, True, by="alice")
    assert sent.status == "pending" and sent.request_id == request.request_id
    # What the command says then names the worker to start on the run's own task queue, whichever queue the
    # command was given (README trial s39: `kiwi dev` was named while it ran, on another queue).
    from kiwi.cli.runs import _not_taken
    from kiwi.items.store import ItemStore
    from kiwi.runs import RunClient

    said = await _not_taken(
        RunClient(temporal_env.client, ItemStore(project), task_queue="kiwi"), run_id, "it"
    )
    assert (
        f"on its task queue '{runs.task_queue}': `kiwi dev` or `kiwi worker --task-queue {runs.task_queue}`"
        in said
    )
    with pytest.raises(KiwiError, match="no pending approval request 'approval-99'"):
        await runs.decide_approval(run_id, "approval-99", True, by="alice")
    assert len(asked) <= 1, asked
    assert (project / "notes" / "old.txt").exists()
    async with build_worker(temporal_env.client, runs.task_queue, sandboxed=True):
        result = await runs.handle(run_id).result()
    assert result.status == "completed" and not (project / "notes" / "old.txt").exists()
    decided = [r for r in read_audit(str(project), run_id) if r["event"] == "approval_decided"]
    assert [(r["request_id"], r.get("by") or r.get("decided_by")) for r in decided] == [
        (request.request_id, "alice")
    ]


async def test_kiwi_run_wait_stops_when_the_run_waits_for_an_approval(runs, project):
    """Found by the s18 README trial: `kiwi run --wait` of a run whose step waits for an approval printed a
    line every 30 s until the approval timed out (an hour by default): a script using it hung. It stops as
    the run waits for someone, says for what and how to answer, and exits 0."""
    from tests.helpers import kiwi_cli

    setup(
        project,
        body='<step name="clean"><tool_call tool="filesystem.delete"><param name="path">notes/old.txt'
        "</param></tool_call></step>",
    )
    where = ["--address", runs.client.service_client.config.target_host, "--task-queue", runs.task_queue]
    code, out, err = await asyncio.wait_for(kiwi_cli("run", "tidy", "--wait", *where, cwd=project), 120)
    assert code == 0, out + err
    assert "awaiting_approval" in out and "kiwi approve" in out, out
    (run_id,) = [r["run_id"] for r in await runs.list_runs(directive="tidy")]
    assert (await runs.status(run_id)).status == "awaiting_approval"
    await runs.cancel(run_id)


async def test_a_signed_decision_that_comes_before_its_request_is_kept_for_it(runs, project):
    """A status read while a workflow task ran can show what that task did before the task failed; the
    task's next attempt takes the human's signal first (Temporal hands signals to a task before activity
    results), before the request it answers exists. The chaos bench lost an approval so: refused as 'no
    approval request', sent once, waited for for ever. Kept only when a trusted approver signed it."""
    setup(project)
    run_id = await runs.start("tidy", {})
    await wait_for(lambda: agent_waits(runs, run_id), what="the agent step")
    execution = await runs.execution(run_id)
    call = {"path": "notes/old.txt"}
    coming = ApprovalRequest(
        request_id="approval-1",
        tool="filesystem.delete",
        args_hash=digest(["filesystem.delete", call]),
        summary="",
        requested_by="",
        requested_at="",
        expires_at="",
    )
    handle = runs.handle(run_id)
    # Not kept: an unsigned rejection, and one signed by a key nobody trusts (an agent's own).
    await handle.signal(
        "decide_approval", ApprovalDecision(request_id="approval-1", approved=False, by="alice", args_hash=coming.args_hash)
    )  # fmt: skip
    create_key("mallory")
    await handle.signal("decide_approval", signed_decision(run_id, execution, coming, False, "mallory"))
    await handle.signal("decide_approval", signed_decision(run_id, execution, coming, True, "alice"))

    async def refused():
        records = read_audit(str(project), run_id)
        refusals = [r for r in records if r["event"] == "approval_decision_refused"]
        return refusals if len(refusals) == 2 else None

    refusals = await wait_for(refused, what="the unsigned and the untrusted decisions to be refused")
    assert [(r["by"], r["reason"]) for r in refusals] == [
        ("alice", "no approval request 'approval-1'"),
        ("mallory", "no approval request 'approval-1'"),
    ], refusals
    # The call it approves runs without waiting for anyone; the file is gone.
    result = await asyncio.wait_for(runs.call_tool(run_id, "filesystem.delete", call), timeout=60)
    assert result.status == "ok", result
    assert not (project / "notes" / "old.txt").exists()
    status = await runs.status(run_id)
    assert [(a.request_id, a.status, a.decided_by) for a in status.approvals] == [
        ("approval-1", "approved", "alice")
    ]

    async def decided():
        records = read_audit(str(project), run_id)
        return [r for r in records if r["event"] == "approval_decided"] or None

    (record,) = await wait_for(decided, what="the decision in the audit trail")
    assert (record["request_id"], record["decision"], record["by"]) == ("approval-1", "approved", "alice")
    # A request number below the run's latest call never comes (review s22 F-6: re-sent old decisions could
    # fill the keeping): refused, not kept.
    past = coming.model_copy(update={"request_id": "approval-0"})
    await handle.signal("decide_approval", signed_decision(run_id, execution, past, True, "alice"))

    async def past_refused():
        records = read_audit(str(project), run_id)
        return [r for r in records if r.get("request_id") == "approval-0"] or None

    (gone,) = await wait_for(past_refused, what="the decision on a past request to be refused")
    assert (gone["event"], gone["reason"]) == (
        "approval_decision_refused",
        "no approval request 'approval-0'",
    )
    # The same approver's decision signed for other arguments is kept too, and refused when its request
    # comes: the call waits for a decision on what it really does.
    write(project / "notes" / "new.txt", "new")
    other = coming.model_copy(
        update={
            "request_id": "approval-2",
            "args_hash": digest(["filesystem.delete", {"path": "notes/x.txt"}]),
        }
    )
    await handle.signal("decide_approval", signed_decision(run_id, execution, other, True, "alice"))
    waiting = asyncio.create_task(runs.call_tool(run_id, "filesystem.delete", {"path": "notes/new.txt"}))
    (pending,) = await wait_for(lambda: pending_approval(runs, run_id), what="the second call to wait")
    assert pending.request_id == "approval-2"

    async def mismatch():
        records = read_audit(str(project), run_id)
        return [r for r in records if "other arguments" in r.get("reason", "")] or None

    (last,) = await wait_for(mismatch, what="the decision on other arguments to be refused")
    assert (last["event"], last["request_id"], last["by"]) == (
        "approval_decision_refused",
        "approval-2",
        "alice",
    )
    await runs.decide_approval(run_id, "approval-2", False, by="bob")
    assert (await asyncio.wait_for(waiting, timeout=30)).error_type == "ApprovalRejected"
    assert (project / "notes" / "new.txt").exists()
    # Two signed early decisions, a rejection then an approval (the approval sent twice): the first decides,
    # as during the wait; the later one is refused and audited (review s22 F-2: the last one won).
    third = coming.model_copy(
        update={
            "request_id": "approval-3",
            "args_hash": digest(["filesystem.delete", {"path": "notes/new.txt"}]),
        }
    )
    await handle.signal("decide_approval", signed_decision(run_id, execution, third, False, "bob"))
    approval = signed_decision(run_id, execution, third, True, "alice")
    for _ in range(2):
        await handle.signal("decide_approval", approval)
    rejected = await asyncio.wait_for(
        runs.call_tool(run_id, "filesystem.delete", {"path": "notes/new.txt"}), 60
    )
    assert rejected.error_type == "ApprovalRejected" and "by bob" in rejected.reason, rejected
    assert (project / "notes" / "new.txt").exists()

    async def overruled():
        records = read_audit(str(project), run_id)
        return [
            r for r in records if r.get("request_id") == "approval-3" and r["event"].startswith("approval_")
        ]

    async def settled():
        records = await overruled()
        return records if any(r["event"] == "approval_decision_refused" for r in records) else None

    records = await wait_for(settled, what="the later early decision to be refused")
    assert [(r["event"], r.get("by"), r.get("reason", "")[:30]) for r in records] == [
        ("approval_requested", None, ""),
        ("approval_decided", "bob", ""),
        ("approval_decision_refused", "alice", "approval-3 is already rejected"),
    ], records


def audit_flushes(history) -> list[int]:
    """How many records each audit flush of a run wrote, in order (from its local activities' markers)."""
    counts = []
    for event in history.events:
        if not event.HasField("marker_recorded_event_attributes"):
            continue
        details = event.marker_recorded_event_attributes.details
        if "data" not in details or "result" not in details:
            continue
        data = json.loads(details["data"].payloads[0].data)
        if data.get("activity_type") == "write_audit_records":
            counts.append(json.loads(details["result"].payloads[0].data))
    return counts


async def test_a_decision_is_taken_when_its_call_waits_so_both_orders_write_the_same_batches(runs, project):
    """Review s22 F-6: a kept decision was taken while the approval's audit flush still waited for the lock
    (right after a step transition), so it landed in another batch than the same decision taken during the
    wait: one order of events on the worker, another on replay. A decision is now taken only once its call
    waits, after that flush: the runs' audit flushes are the same whichever came first."""
    body = (
        '<step name="work"><action>Tidy notes.</action></step><step name="clean"><tool_call '
        'tool="filesystem.delete"><param name="path">notes/old.txt</param></tool_call></step>'
    )
    setup(project, body=body, harness=HARNESS + "runs:\n  audit_batch_size: 2\n")
    flushes = {}
    for early in (True, False):
        write(project / "notes" / "old.txt", "old")
        run_id = await runs.start("tidy", {})
        await wait_for(lambda run_id=run_id: agent_waits(runs, run_id), what="the agent step")
        execution, handle = await runs.execution(run_id), runs.handle(run_id)
        coming = ApprovalRequest(
            request_id=f"approval-{(await runs.status(run_id)).calls + 1}",
            tool="filesystem.delete",
            args_hash=digest(["filesystem.delete", {"path": "notes/old.txt"}]),
            summary="", requested_by="", requested_at="", expires_at="",
        )  # fmt: skip
        decision = signed_decision(run_id, execution, coming, True, "alice")
        if early:
            await handle.signal("decide_approval", decision)
        await runs.complete_step(run_id, "work", {})
        if not early:
            await wait_for(
                lambda run_id=run_id: pending_approval(runs, run_id), what="the step's call to wait"
            )
            await handle.signal("decide_approval", decision)
        assert (await asyncio.wait_for(handle.result(), 60)).status == "completed"
        assert not (project / "notes" / "old.txt").exists()
        flushes[early] = audit_flushes(await handle.fetch_history())
    assert flushes[True] == flushes[False], flushes
    assert len(flushes[True]) >= 3, flushes


async def test_attack_a_call_in_the_runs_first_task_still_needs_its_approval(runs, project):
    """Found by a CI flake (s24): a call_tool update in a run's first workflow task (sent with the start, or
    handed to the successor of a continue-as-new) is handled before run() starts, where the run switched its
    approvals on: the call that needs a human's approval ran without one. Update-with-start puts it there."""
    from tests.helpers import call_with_start

    setup(project)
    run_id, update = await call_with_start(
        runs, "tidy", {}, "firsttask", "filesystem.delete", {"path": "notes/old.txt"}
    )

    async def waiting():
        return [a for a in (await runs.status(run_id)).approvals if a.status == "pending"]

    (request,) = await wait_for(waiting, what="the call to wait for approval")
    assert request.tool == "filesystem.delete" and (project / "notes" / "old.txt").exists()
    # (The step started after the call asked: the run said awaiting_agent while it waited for a human.)
    assert (await runs.status(run_id)).status == "awaiting_approval"
    await runs.decide_approval(run_id, request.request_id, False, by="alice")
    result = await update.result()
    assert result.status == "denied" and (project / "notes" / "old.txt").exists(), result
    assert (await runs.status(run_id)).status == "awaiting_agent"
    await runs.cancel(run_id)


async def test_a_rollback_to_no_checkpoint_is_refused_before_it_asks_a_human(runs, project):
    """README trial s33: `git.rollback {"checkpoint": "refs/heads/master"}` (or `main~1`) under the default
    approval rule asked a human to approve it, and only then failed (refs/heads/master with "no checkpoint",
    not the README's "is not a Kiwi checkpoint"). A name that is no checkpoint's is refused when the call is
    admitted: no approval request, InputInvalid naming the shapes a checkpoint has."""
    setup(project)  # (approvals: git.rollback)
    git(project, "init", "-q", "-b", "main")
    run_id = await runs.start("tidy", {})
    await wait_for(lambda: agent_waits(runs, run_id), what="the agent step")
    for name in ("refs/heads/main", "main~1", "run-tidy-0123456789/../1"):
        rolled = await asyncio.wait_for(runs.call_tool(run_id, "git.rollback", {"checkpoint": name}), 30)
        assert (rolled.status, rolled.error_type) == ("error", "InputInvalid"), rolled
        assert rolled.reason == f"git.rollback: '{name}' is not a Kiwi checkpoint", rolled
        assert "RUN/N, or refs/kiwi/checkpoints/RUN/N" in rolled.hint, rolled
    status = await runs.status(run_id)
    assert status.status == "awaiting_agent" and not status.approvals, status
    # A name shaped like one still asks (the human decides on the exact call), and fails if there is none.
    rollback = asyncio.create_task(runs.call_tool(run_id, "git.rollback", {"checkpoint": f"{run_id}/7"}))
    (request,) = await wait_for(lambda: pending_approval(runs, run_id), what="the rollback to ask")
    await runs.decide_approval(run_id, request.request_id, True, by="alice")
    rolled = await asyncio.wait_for(rollback, 30)
    assert rolled.error_type == "CheckpointNotFound" and f"no checkpoint '{run_id}/7'" in rolled.reason, (
        rolled
    )


async def test_kiwi_call_waiting_for_approval_says_so_and_names_the_command(runs, project):
    """README trial s33: `kiwi call git.rollback ... --run RUN` (approval needed by default) printed nothing
    while it waited: a hung command to a new user. Now a line on stderr says what it waits for and the
    command that answers it, and the answer comes once a human approves."""
    setup(project)
    git(project, "init", "-q", "-b", "main")
    run_id = await runs.start("tidy", {})
    await wait_for(lambda: agent_waits(runs, run_id), what="the agent step")
    call = await asyncio.create_subprocess_exec(
        *KIWI, "call", "filesystem.delete", '{"path": "notes/old.txt"}', "--run", run_id, "--client", "ops-desk",
        "--address", runs.client.service_client.config.target_host, "--task-queue", runs.task_queue,
        cwd=project, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        notice = (await asyncio.wait_for(call.stderr.readline(), 60)).decode()
        (request,) = await wait_for(lambda: pending_approval(runs, run_id), what="the call to ask")
        assert notice.startswith(
            f"kiwi call: filesystem.delete waits for a human to approve it ({request.request_id}"
        )
        assert f"`kiwi approve {run_id} {request.request_id}`" in notice, notice
        assert (project / "notes" / "old.txt").exists()
        await runs.decide_approval(run_id, request.request_id, True, by="alice")
        out, err = await asyncio.wait_for(call.communicate(), 60)
    finally:
        if call.returncode is None:
            call.kill()
            await call.wait()
    assert call.returncode == 0 and out.decode().startswith("ok: filesystem.delete"), (out, err)
    assert not (project / "notes" / "old.txt").exists()
    # (--client names the caller in the audit trail in a run too: `kiwi call --run` always said "cli".)
    from activities.audit import read_audit

    async def recorded():
        return [r for r in read_audit(str(project), run_id) if r.get("event") == "tool_call"]

    (record,) = await wait_for(recorded, what="the call's audit record")
    assert record["client"] == "ops-desk", record


async def test_attack_a_rollback_reaches_only_kiwi_checkpoints(runs, project):
    """A rollback took any ref: `git.rollback {"checkpoint": "refs/heads/B"}` made the project's files those of
    any commit, protected ones (the harness policy) too, and a branch is something shell git can make. Only
    refs below refs/kiwi/checkpoints are checkpoints now."""
    setup(project, harness="approvals:\n  tools: []\n")
    git(project, "init", "-q", "-b", "main")
    git(project, "-c", "user.email=t@example.com", "-c", "user.name=t", "add", ".")
    git(project, "-c", "user.email=t@example.com", "-c", "user.name=t", "commit", "-q", "-m", "base")
    policy = (project / ".ai" / "config" / "agent_harness.yaml").read_text()
    git(project, "checkout", "-q", "-b", "evil")
    write(project / ".ai" / "config" / "agent_harness.yaml", "approvals:\n  tools: []\n# rewritten\n")
    git(project, "-c", "user.email=t@example.com", "-c", "user.name=t", "commit", "-qam", "evil")
    git(project, "checkout", "-q", "main")
    # (Branches and tags named like a checkpoint: rev-parse finds refs/heads/refs/kiwi/checkpoints/X too.)
    git(project, "branch", "refs/kiwi/checkpoints/tidy/99", "evil")
    git(project, "tag", "refs/kiwi/checkpoints/tidy/98", "evil")
    run_id = await runs.start("tidy", {})
    await wait_for(lambda: agent_waits(runs, run_id), what="the agent step")
    made = await runs.call_tool(run_id, "git.checkpoint", {"message": "mine"})
    assert made.status == "ok" and made.result["available"], made
    for name in (
        "refs/heads/evil",
        "evil",
        "refs/kiwi/checkpoints/../../heads/evil",
        "evil^{commit}",
        "main~0",
        "tidy/99",
        "refs/kiwi/checkpoints/tidy/98",
    ):
        rolled = await runs.call_tool(run_id, "git.rollback", {"checkpoint": name})
        assert rolled.status != "ok", (name, rolled)
        assert "is not a Kiwi checkpoint" in rolled.reason or "no checkpoint" in rolled.reason, (name, rolled)
    assert (project / ".ai" / "config" / "agent_harness.yaml").read_text() == policy
    full = await runs.call_tool(
        run_id, "git.rollback", {"checkpoint": f"refs/kiwi/checkpoints/{made.result['checkpoint']}"}
    )
    assert full.status == "ok" and full.result["available"], full


async def test_a_run_cancelled_while_its_step_waits_for_an_approval_ends_cancelled(runs, project):
    """Second README trial s35: `kiwi cancel` of a run whose automatic step waited for an approval ended it
    `failed` ("filesystem.write denied: approval approval-1 cancelled"), so scripts and `kiwi run --wait` took
    it for a failure. It ends cancelled, the call never made."""
    setup(
        project,
        body='<step name="clean"><tool_call tool="filesystem.delete"><param name="path">notes/old.txt'
        "</param></tool_call></step>",
    )
    run_id = await runs.start("tidy", {})
    await pending_approval(runs, run_id)
    await runs.cancel(run_id, "not today")
    result = await runs.handle(run_id).result()
    assert result.status == "cancelled", result
    assert (await runs.status(run_id)).status == "cancelled"
    assert (project / "notes" / "old.txt").exists()


async def test_attack_a_call_padded_past_the_summary_is_shown_whole_to_its_approver(runs, project):
    """Hostile review s36: the approval summary was the Temporal UI's, cut at 200 characters with no mark. An
    agent sent `rm notes/tmp.txt` + 240 spaces + `notes/important.md`; `kiwi approvals` showed `shell.run rm
    notes/tmp.txt`, the human approved, and notes/important.md was gone. And a tool other than filesystem.*
    and shell.run (here git.rollback, whose checkpoint the agent picks) showed no argument at all. The
    approver now reads the words the command runs and every argument."""
    from tests.helpers import kiwi_cli

    setup(
        project,
        harness="approvals:\n  tools: [shell.run, git.rollback]\n",
        body='<step name="work"><action>Tidy notes.</action></step>',
    )
    write_directive(
        project / ".ai" / "directives" / "tidy.md",
        directive_md(
            '<step name="work"><action>Tidy notes.</action></step>',
            name="tidy",
            permissions=GRANTS + '<execute resource="shell" commands="rm"/>',
        ),
    )
    write(project / "notes" / "tmp.txt", "scratch")
    write(project / "notes" / "important.md", "keep me")
    run_id = await runs.start("tidy", {})
    await wait_for(lambda: agent_waits(runs, run_id), what="the agent step")
    padded = "rm notes/tmp.txt" + " " * 240 + "notes/important.md"
    call = asyncio.create_task(runs.call_tool(run_id, "shell.run", {"command": padded}))
    (request,) = await wait_for(lambda: pending_approval(runs, run_id), what="the call to ask")
    assert request.summary == "shell.run rm notes/tmp.txt notes/important.md", request.summary
    where = ("--address", runs.client.service_client.config.target_host, "--task-queue", runs.task_queue)
    code, out, _ = await kiwi_cli("approvals", *where, cwd=project)
    assert code == 0 and f"{request.request_id}: shell.run rm notes/tmp.txt notes/important.md" in out, out
    await runs.decide_approval(run_id, request.request_id, False, by="alice")
    assert (await call).status == "denied"
    assert (project / "notes" / "important.md").read_text() == "keep me"
    rollback = asyncio.create_task(runs.call_tool(run_id, "git.rollback", {"checkpoint": f"{run_id}/7"}))
    (request,) = await wait_for(lambda: pending_approval(runs, run_id), what="the rollback to ask")
    assert request.summary == f'git.rollback {{"checkpoint": "{run_id}/7"}}', request.summary
    await runs.decide_approval(run_id, request.request_id, False, by="alice")
    assert (await rollback).status == "denied"


async def test_attack_a_misspelt_tool_in_the_harness_approvals_holds_runs_until_mended(runs, project):
    """README trial s36: `approvals.tools: [git.rollback, shell.rn]` failed `kiwi validate` and `kiwi doctor`,
    yet `kiwi call shell.run` answered ok and a run went past its shell step with no approval asked: the rule the
    human wrote held nothing. Runs and calls outside a run are refused, naming the typo, until it is mended."""
    from kiwi.errors import InputInvalid as Refused

    setup(project, harness="approvals:\n  tools: [git.rollback, shell.rn]\n")
    with pytest.raises(Refused, match=r"'shell\.rn' is no tool of Kiwi's: did you mean shell\.run\?"):
        await runs.start("tidy", {})
    with pytest.raises(Refused, match="agent_harness.yaml names a tool that is none"):
        await runs.session_call("agent", "filesystem.read", {"path": "notes/old.txt"})
    write(
        project / ".ai" / "config" / "agent_harness.yaml", "approvals:\n  tools: [git.rollback, shell.run]\n"
    )
    run_id = await runs.start("tidy", {})
    await wait_for(lambda: agent_waits(runs, run_id), what="the agent step")


@pytest.mark.parametrize("stuck_first", [True, False], ids=["stuck-then-escalate", "escalate-then-stuck"])
async def test_a_stuck_agents_hold_is_lifted_by_a_resume_not_by_an_answer(runs, project, stuck_first):
    """README trial s36: an agent that said it was stuck (5 attempts) was held until a human resumes the run, as
    the README says; it then escalated an unrelated question, and the human's answer released the run: the
    agent's own question lifted the hold its being stuck made. In the other order the stuck hold was not kept.
    Now the answer is taken and the run stays held for the stuck agent until `kiwi resume`."""
    setup(project)
    run_id = await runs.start("tidy", {})
    await wait_for(lambda: agent_waits(runs, run_id), what="the agent step")
    stuck = HelpRequest(kind="stuck", reason="the notes will not sort", attempts=5)
    question = HelpRequest(kind="escalate", reason="a or b?", options=["a", "b"], request_id="decision-q")
    for request in (stuck, question) if stuck_first else (question, stuck):
        await runs.help(run_id, request)
    held = await wait_for(lambda: status_is(runs, run_id, "awaiting_human"), what="the run to be held")
    from tests.helpers import kiwi_cli

    where = ("--address", runs.client.service_client.config.target_host, "--task-queue", runs.task_queue)
    code, out, err = await kiwi_cli("decide", run_id, "decision-q", "a", "--as", "bob", *where, cwd=project)
    # (It says the run stays held, and what lets it go on: second trial s36.)
    assert code == 0 and "answered decision-q: a; the run stays held (the agent is stuck" in out, out + err
    assert f"`kiwi resume {run_id}` lets it carry on" in out, out

    async def answered():
        status = await runs.status(run_id)
        return status if [d.answer for d in status.decisions] == ["a"] else None

    held = await wait_for(answered, what="the answer to be taken")
    assert held.status == "awaiting_human" and "the agent is stuck after 5 attempts" in held.waiting_for, held
    # The agent's call is refused with a hint that says who lets the run go on (second trial s36: none).
    with pytest.raises(RunStateConflict) as refused:
        await runs.call_tool(run_id, "filesystem.read", {"path": "notes/old.txt"})
    assert f"`kiwi resume {run_id}`" in refused.value.hint, refused.value
    assert await runs.resume(run_id, "looked at it", by="alice")
    await wait_for(lambda: agent_waits(runs, run_id), what="the run to carry on")


async def test_an_agent_whose_run_waits_for_an_approval_is_told_so_not_to_complete_the_step(
    runs, project, temporal_env
):
    """README trial s37: execute(directive, run) of a directive whose automatic step's delete waits for a human
    answered state awaiting_approval with instructions to do the step's action and complete it, and named no
    request. The instructions now say what it waits for and that the agent polls; the request is named."""
    from tests.helpers import execute
    from tests.test_cli_first_day import approval_directive

    approval_directive(project)
    server = build_server(temporal_env.client, project, task_queue=runs.task_queue)
    async with Client(server) as client:
        started = await execute(
            client,
            {
                "item_type": "directive",
                "action": "run",
                "item_id": "tidy",
                "parameters": {},
                "wait_seconds": 30,
            },
        )
        assert started["state"] == "awaiting_approval", started
        told = started["instructions"]
        assert "waits for a human to approve approval-1: filesystem.delete notes/old.txt" in told, told
        assert "complete_step" not in told and "action='status'" in told, told
        assert "approval of filesystem.delete notes/old.txt" in started["waiting_for"], started
