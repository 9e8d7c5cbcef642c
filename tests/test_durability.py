"""Runs survive crashes: a killed worker, a killed dev server; deadlines on a time-skipping server;
committed histories still replay."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import uuid
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from temporalio.client import Client, WorkflowFailureError
from temporalio.worker import Replayer

from kiwi.contracts import HelpRequest
from kiwi.converter import data_converter
from kiwi.errors import KiwiError, RunFinished
from kiwi.items.store import ItemStore
from kiwi.runs import RunClient
from kiwi.seal import seal_interceptors
from tests.helpers import (
    awaiting_step,
    directive_md,
    kiwi_worker,
    loopback_dev_server,
    start_parent_with_child,
    wait_for,
    write,
    write_directive,
    write_parent_and_child,
)
from workers.main import SANDBOX, WORKFLOWS, build_id, build_worker
from workflows.directive_run import CURRENT

HISTORIES = Path(__file__).parent / "histories"
TICK = """import pathlib


def main(label: str) -> dict:
    with pathlib.Path("ticks.log").open("a") as handle:
        handle.write(label + "\\n")
    return {"ticked": label}
"""


def tick_project(project: Path) -> None:
    write(
        project / ".ai" / "tools" / "tick" / "tool.yaml",
        "tool_id: tick\ntool_type: python\nexecutor:\n  entrypoint: main.py\nparameters:\n"
        "  - name: label\n    type: string\n    required: true\nmutates_state: true\n",
    )
    write(project / ".ai" / "tools" / "tick" / "main.py", TICK)
    body = """
    <step name="first"><tool_call tool="tick"><param name="label">first</param></tool_call></step>
    <step name="review"><action>Look at ticks.log and say ok.</action></step>
    <step name="second"><tool_call tool="tick"><param name="label">second</param></tool_call></step>"""
    write_directive(
        project / ".ai" / "directives" / "ticker.md",
        directive_md(body, name="ticker", permissions='<execute resource="tool" id="tick"/>'),
    )


async def test_kill_9_worker_mid_run_new_worker_finishes_without_repeating_steps(temporal_env, project):
    tick_project(project)
    address = temporal_env.client.service_client.config.target_host
    queue = f"kiwi-kill-{uuid.uuid4().hex[:8]}"
    runs = RunClient(temporal_env.client, ItemStore(project), task_queue=queue)
    worker = await kiwi_worker(address, queue)
    try:
        run_id = await runs.start("ticker", {})
        await awaiting_step(runs, run_id, "review")
        os.killpg(worker.pid, signal.SIGKILL)
        await worker.wait()
        worker = await kiwi_worker(address, queue)
        done = await asyncio.wait_for(runs.complete_step(run_id, "review", {"ok": True}), 60)
        assert done.next_step == "second"
        result = await runs.handle(run_id).result()
        assert result.outputs["second"]["result"] == {"ticked": "second"}
        assert (project / "ticks.log").read_text().splitlines() == ["first", "second"]
        # Both workers named their build by a digest of Kiwi's sources (the SDK's default digests the
        # code of every module loaded, a fifth of a second before a new worker polls).
        builds = {
            e.workflow_task_completed_event_attributes.worker_version.build_id
            async for e in runs.handle(run_id).fetch_history_events()
            if e.HasField("workflow_task_completed_event_attributes")
        }
        assert builds == {build_id()}
    finally:
        if worker.returncode is None:
            os.killpg(worker.pid, signal.SIGTERM)
            await worker.wait()


async def test_dev_server_killed_and_restarted_on_its_sqlite_file_keeps_waiting_runs(project, tmp_path):
    tick_project(project)
    server = loopback_dev_server(tmp_path)
    await server.start()
    queue = "kiwi-restart"
    try:
        client = await Client.connect(
            server.address, data_converter=data_converter, interceptors=seal_interceptors()
        )
        runs = RunClient(client, ItemStore(project), task_queue=queue)
        async with build_worker(client, queue, sandboxed=True):
            run_id = await runs.start("ticker", {})
            await awaiting_step(runs, run_id, "review")
        os.killpg(server.process.pid, signal.SIGKILL)
        server.process.wait()
        await server.start()
        client = await Client.connect(
            server.address, data_converter=data_converter, interceptors=seal_interceptors()
        )
        runs = RunClient(client, ItemStore(project), task_queue=queue)
        async with build_worker(client, queue, sandboxed=True):
            await awaiting_step(runs, run_id, "review")
            await runs.complete_step(run_id, "review", {"ok": True})
            result = await runs.handle(run_id).result()
        assert result.status == "completed"
        assert (project / "ticks.log").read_text().splitlines() == ["first", "second"]
    finally:
        server.stop()


async def test_a_three_day_deadline_times_out_in_milliseconds(time_skipping_env, project):
    queue = f"kiwi-ts-{uuid.uuid4().hex[:8]}"
    runs = RunClient(time_skipping_env.client, ItemStore(project), task_queue=queue)
    async with build_worker(time_skipping_env.client, queue, sandboxed=True):
        run_id = await runs.start("hello_kiwi", {"name": "Tess"}, deadline_seconds=3 * 24 * 3600)
        started = asyncio.get_running_loop().time()
        await awaiting_step(runs, run_id, "confirm")
        # The status says when it times out (README trial s36: nothing showed the deadline).
        status = await runs.status(run_id)
        started_at = (await runs.handle(run_id).describe()).start_time
        deadline = datetime.fromisoformat(status.deadline_at)
        assert abs((deadline - started_at).total_seconds() - 3 * 24 * 3600) < 60, (
            status.deadline_at,
            started_at,
        )
        await time_skipping_env.sleep(timedelta(days=3, minutes=1))
        with pytest.raises(WorkflowFailureError) as info:
            await runs.handle(run_id).result()
        assert info.value.cause.type == "RunTimedOut"
        assert "deadline of 259200s passed while step 'confirm' waited" in info.value.cause.message
        assert asyncio.get_running_loop().time() - started < 60
        assert (await runs.status(run_id)).status == "timed_out"
        # What an agent or operator acting on it is told says the same (it said "has finished (failed)").
        with pytest.raises(RunFinished) as late:
            await runs.complete_step(run_id, "confirm", {"ok": True})
        assert f"run {run_id} has finished (timed_out)" in late.value.message


@pytest.mark.parametrize("history", sorted(HISTORIES.glob("*.json")), ids=lambda p: p.stem)
async def test_committed_histories_replay(history):
    replayer = Replayer(workflows=WORKFLOWS, data_converter=data_converter, workflow_runner=SANDBOX)
    from temporalio.client import WorkflowHistory

    await replayer.replay_workflow(WorkflowHistory.from_json(history.stem, json.loads(history.read_text())))


def test_there_are_committed_histories():
    assert len(list(HISTORIES.glob("*.json"))) >= 1, (
        "record one with: KIWI_RECORD_HISTORY=1 scripts/test -k record"
    )


@pytest.mark.skipif(
    not os.environ.get("KIWI_RECORD_HISTORY"), reason="set KIWI_RECORD_HISTORY=1 to re-record"
)
async def test_record_history(runs, project):
    """Record tests/histories/hello_kiwi-{newest patch id}.json after an intended workflow change.

    Older recordings stay: they are what runs started by older code replay against."""
    run_id = await runs.start("hello_kiwi", {"name": "Replay"})
    await awaiting_step(runs, run_id, "confirm")
    await runs.call_tool(run_id, "filesystem.read", {"path": "notes/hello.md"})
    await runs.call_tool(run_id, "filesystem.read", {"path": "../nope"})
    await runs.call_tool(
        run_id, "shell.run", {"command": "ls", "timeout": "abc"}
    )  # refused before scheduling
    await runs.help(run_id, HelpRequest(kind="checkpoint", reason="not granted"))  # denied: no git.checkpoint
    await runs.call_tool(run_id, "kiwi-mcp.search", {"query": "hello"})  # denied: no kiwi-mcp grant
    await runs.complete_step(run_id, "confirm", {"confirmed": True})
    await runs.handle(run_id).result()
    await _save_history(runs.handle(run_id), "hello_kiwi", project)


@pytest.mark.skipif(
    not os.environ.get("KIWI_RECORD_HISTORY"), reason="set KIWI_RECORD_HISTORY=1 to re-record"
)
async def test_record_continued_history(runs, project):
    """Record the first execution of a run that continues-as-new after two calls, so the way a run
    hands over to its successor (tests/histories/hello_kiwi-continued-{patch id}.json) replays too."""
    write(project / ".ai" / "config" / "agent_harness.yaml", "runs:\n  continue_as_new_after_updates: 2\n")
    run_id = await runs.start("hello_kiwi", {"name": "Replay"})
    await awaiting_step(runs, run_id, "confirm")
    first = (await runs.handle(run_id).describe()).run_id
    for _ in range(3):
        await runs.call_tool(run_id, "filesystem.read", {"path": "notes/hello.md"})
    assert (await runs.status(run_id)).continued >= 1
    await runs.complete_step(run_id, "confirm", {"confirmed": True})
    await runs.handle(run_id).result()
    # The first execution (it hands over) and the last (it finishes after its limit was reached).
    for handle, name in (
        (runs.client.get_workflow_handle(run_id, run_id=first), "continued"),
        (runs.handle(run_id), "continued-last"),
    ):
        await _save_history(handle, f"hello_kiwi-{name}", project)


@pytest.mark.skipif(
    not os.environ.get("KIWI_RECORD_HISTORY"), reason="set KIWI_RECORD_HISTORY=1 to re-record"
)
async def test_record_held_family_history(runs, project):
    """Record a parent run that holds (its loop warnings) with a child the agent started, which it holds
    too (PARENT_HOLDS_CHILDREN), both resumed by an approver and finished: the parent's signal to its
    child, and the child's hold and resume, replay (tests/histories/held_{parent,child}-{patch id}.json)."""
    from tests.helpers import approver

    approver("alice")
    write_parent_and_child(project)
    parent, child = await start_parent_with_child(runs)
    for _ in range(2):
        await runs.call_tool(parent, "filesystem.read", {"path": "notes/hello.md"})

    async def child_held():
        return (await runs.status(child)).status == "stuck"

    await wait_for(child_held, what="the child to hold with its parent")
    assert (await runs.resume_with_children(parent, "looked at it", by="alice")) == (True, [child])
    await runs.complete_step(child, "help", {"done": True})
    await runs.handle(child).result()
    await runs.complete_step(parent, "lead", {"done": True})
    await runs.handle(parent).result()
    for run_id, name in ((parent, "held_parent"), (child, "held_child")):
        await _save_history(runs.handle(run_id), name, project)


@pytest.mark.skipif(
    not os.environ.get("KIWI_RECORD_HISTORY"), reason="set KIWI_RECORD_HISTORY=1 to re-record"
)
async def test_record_held_again_history(runs, project):
    """Record two children of a parent held twice (PARENT_HOLDS_CHILDREN): one held for it renews its hold
    on the second notice and is not freed by answering its own question; one held for its own question keeps
    the parent's notice and holds for the parent once answered. Both resumed by a human and finished
    (tests/histories/held_{again,deferred}-{patch id}.json)."""
    from kiwi.contracts import parent_hold_reason
    from tests.helpers import approver

    approver("alice")
    write_parent_and_child(project)
    parent = await runs.start("boss", {})
    await awaiting_step(runs, parent, "lead")
    again = (await runs.call_tool(parent, "directive.run", {"directive": "helper"})).result["run_id"]
    deferred = (await runs.call_tool(parent, "directive.run", {"name": "helper"})).result["run_id"]
    for child in (again, deferred):
        await awaiting_step(runs, child, "help")
    await runs.help(deferred, HelpRequest(kind="escalate", reason="may I?", options=["yes"]))

    async def held(run_id, status, reason=None):
        async def probe():
            now = await runs.status(run_id)
            return now if now.status == status and (reason is None or now.hold_reason == reason) else None

        return await wait_for(probe, what=f"{run_id} to be {status}")

    await held(deferred, "awaiting_human")
    for _ in range(2):
        await runs.call_tool(parent, "filesystem.read", {"path": "notes/hello.md"})
    first = await held(again, "stuck")
    assert await runs._resume_one(parent, "only the parent", "alice")
    await runs.help(parent, HelpRequest(kind="escalate", reason="which way?", options=["on"]))
    await held(again, "awaiting_human", parent_hold_reason(parent, "awaiting_human"))
    assert (await runs.status(again)).hold_id != first.hold_id
    await runs.help(again, HelpRequest(kind="escalate", reason="and me?", options=["yes"]))
    await wait_for(lambda: _decisions(runs, again), what="the question")
    await runs.decide(again, "decision-1", "yes", by="alice")
    await runs.decide(deferred, "decision-1", "yes", by="alice")
    await held(deferred, "awaiting_human", parent_hold_reason(parent, "awaiting_human"))
    assert (await runs.status(again)).status == "awaiting_human"
    assert await runs.resume_with_children(parent, "both", by="alice") == (True, [again, deferred])
    for child in (again, deferred):
        await runs.complete_step(child, "help", {"done": True})
        await runs.handle(child).result()
    await runs.decide(parent, "decision-1", "on", by="alice")
    await runs.complete_step(parent, "lead", {"done": True})
    await runs.handle(parent).result()
    for run_id, name in ((again, "held_again"), (deferred, "held_deferred")):
        await _save_history(runs.handle(run_id), name, project)


@pytest.mark.skipif(
    not os.environ.get("KIWI_RECORD_HISTORY"), reason="set KIWI_RECORD_HISTORY=1 to re-record"
)
async def test_record_early_approval_history(runs, project):
    """Record a run that keeps a signed approval sent before its call asked for it (EARLY_APPROVALS) and
    applies it when the call asks (tests/histories/early_approval-{patch id}.json)."""
    from kiwi.contracts import ApprovalRequest
    from kiwi.guards import digest
    from kiwi.snapshot import signed_decision
    from tests.helpers import approver

    approver("alice")
    write(project / ".ai" / "config" / "agent_harness.yaml", "approvals:\n  tools: [filesystem.delete]\n")
    write(project / "notes" / "old.txt", "old")
    run_id = await runs.start("hello_kiwi", {"name": "Replay"})
    await awaiting_step(runs, run_id, "confirm")
    execution, handle = await runs.execution(run_id), runs.handle(run_id)
    args = {"path": "notes/old.txt"}
    coming = ApprovalRequest(
        request_id=f"approval-{(await runs.status(run_id)).calls + 1}", tool="filesystem.delete", args_hash=digest(["filesystem.delete", args]),
        summary="", requested_by="", requested_at="", expires_at="",
    )  # fmt: skip
    await handle.signal("decide_approval", signed_decision(run_id, execution, coming, True, "alice"))
    assert (await runs.call_tool(run_id, "filesystem.delete", args)).status == "ok"
    await runs.complete_step(run_id, "confirm", {"confirmed": True})
    assert (await runs.handle(run_id).result()).status == "completed"
    await _save_history(runs.handle(run_id), "early_approval", project)


@pytest.mark.skipif(
    not os.environ.get("KIWI_RECORD_HISTORY"), reason="set KIWI_RECORD_HISTORY=1 to re-record"
)
async def test_record_ticker_history(runs, project):
    """Record a run whose agent step waits after an activity's result (the first step's tool), completed by
    the agent (tests/histories/ticker-{patch id}.json): the source of the merged history below."""
    tick_project(project)
    run_id = await runs.start("ticker", {})
    await awaiting_step(runs, run_id, "review")
    await runs.complete_step(run_id, "review", {"ok": True})
    assert (await runs.handle(run_id).result()).status == "completed"
    await _save_history(runs.handle(run_id), "ticker", project)


@pytest.mark.skipif(
    not os.environ.get("KIWI_RECORD_HISTORY"), reason="set KIWI_RECORD_HISTORY=1 to re-record"
)
async def test_record_first_task_call_history(runs, project):
    """Record a run whose first workflow task carries a call (update-with-start), handled before run() starts
    (FIRST_TASK_RULES: the run's rules are in force from its first activation), then completed
    (tests/histories/first_task_call-{patch id}.json)."""
    from tests.helpers import call_with_start

    write(project / "notes" / "first.md", "before the run\n")
    run_id, update = await call_with_start(
        runs, "hello_kiwi", {"name": "Replay"}, "firsttask", "filesystem.read", {"path": "notes/first.md"}
    )
    answer = await update.result()
    assert answer.status == "ok", answer
    await awaiting_step(runs, run_id, "confirm")
    await runs.complete_step(run_id, "confirm", {"confirmed": True})
    assert (await runs.handle(run_id).result()).status == "completed"
    await _save_history(runs.handle(run_id), "first_task_call", project)


def merge_into_previous_task(history: dict, update: str) -> dict:
    """``history`` as a worker that had run ahead would have recorded it: the workflow task that accepted
    the first ``update`` taken into the task before it, so the activity result that task took and the
    update arrive together (the chaos bench's `KeyError: 'review'`: a worker that answered a status query had
    taken the result, the agent saw the step waiting, and one task then carried both). Event ids are
    renumbered and every reference to one follows."""
    events = history["events"]
    index = {e["eventId"]: n for n, e in enumerate(events)}
    accepted = next(
        n
        for n, e in enumerate(events)
        if e["eventType"] == "EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED"
        and e["workflowExecutionUpdateAcceptedEventAttributes"]["acceptedRequest"]["input"]["name"] == update
    )
    completed = max(
        n for n in range(accepted) if events[n]["eventType"] == "EVENT_TYPE_WORKFLOW_TASK_COMPLETED"
    )
    later_task = events[completed]["workflowTaskCompletedEventAttributes"]
    earlier = max(
        n
        for n in range(index[later_task["scheduledEventId"]])
        if events[n]["eventType"] == "EVENT_TYPE_WORKFLOW_TASK_COMPLETED"
    )
    earlier_task = events[earlier]["workflowTaskCompletedEventAttributes"]
    dropped = {index[later_task["scheduledEventId"]], index[later_task["startedEventId"]], completed}
    order = [n for n in range(earlier + 1) if n not in dropped] + [accepted]
    order += [n for n in range(earlier + 1, len(events)) if n not in dropped and n != accepted]
    new_id = {events[old]["eventId"]: str(position + 1) for position, old in enumerate(order)}
    # What pointed at the dropped task points at the one it was merged into.
    new_id[events[completed]["eventId"]] = new_id[events[earlier]["eventId"]]
    new_id[later_task["scheduledEventId"]] = new_id[earlier_task["scheduledEventId"]]
    new_id[later_task["startedEventId"]] = new_id[earlier_task["startedEventId"]]

    def renumber(node):
        if isinstance(node, dict):
            return {
                k: new_id.get(v, v) if k.endswith("EventId") and isinstance(v, str) else renumber(v)
                for k, v in node.items()
            }
        if isinstance(node, list):
            return [renumber(v) for v in node]
        return node

    merged = [renumber(events[n]) for n in order]
    for position, event in enumerate(merged):
        event["eventId"] = str(position + 1)
    return {**history, "events": merged}


async def test_a_step_completed_in_the_task_that_made_it_wait_replays():
    """STEP_AWAITED: complete_step's validator saw its step waiting; on replay the update may come before
    the activity result that made the step wait, in one task. The handler waits for the step, so the
    history replays (the handler looked the step up at once: KeyError, a run no worker could take again)."""
    from temporalio.client import WorkflowHistory

    source = json.loads((HISTORIES / f"ticker-{CURRENT}.json").read_text())
    merged = merge_into_previous_task(source, "complete_step")
    types = [e["eventType"].removeprefix("EVENT_TYPE_") for e in merged["events"]]
    accepted = types.index("WORKFLOW_EXECUTION_UPDATE_ACCEPTED")
    # One task took the tool's result and accepted the update, which the step's wait came from.
    assert types[accepted - 4 : accepted + 1] == [
        "ACTIVITY_TASK_COMPLETED",
        "WORKFLOW_TASK_SCHEDULED",
        "WORKFLOW_TASK_STARTED",
        "WORKFLOW_TASK_COMPLETED",
        "WORKFLOW_EXECUTION_UPDATE_ACCEPTED",
    ]
    replayer = Replayer(workflows=WORKFLOWS, data_converter=data_converter, workflow_runner=SANDBOX)
    await replayer.replay_workflow(WorkflowHistory.from_json("merged", merged))


async def test_status_of_a_run_whose_history_does_not_replay_says_what_to_do(
    temporal_env, project, monkeypatch
):
    """A run whose workflow tasks fail with a nondeterminism error (a worker of other code took it) said "fix
    what it says ... the worker retries the step": it never goes on by retrying. Its status says what it is
    and what an operator does about it."""
    from tests.helpers import run_client, wait_for
    from workflows.directive_run import DirectiveRun

    runs = run_client(temporal_env.client, project)
    async with build_worker(temporal_env.client, runs.task_queue, sandboxed=True):
        run_id = await runs.start("hello_kiwi", {"name": "Replay"})
        await awaiting_step(runs, run_id, "confirm")
    # Another build's code: it publishes nothing where this run's history has its search attributes.
    monkeypatch.setattr(DirectiveRun, "_publish", lambda self, *args, **kwargs: None)
    async with build_worker(temporal_env.client, runs.task_queue, sandboxed=False):
        await runs.help(run_id, HelpRequest(kind="checkpoint", reason="a new task for the other code"))

        async def stalled():
            # (Temporal answers a query with "failed state" once the task has failed a few times in a row;
            # before that, the query waits on it.)
            try:
                await runs._status(run_id, rpc_timeout=timedelta(seconds=3))
            except KiwiError as exc:
                return exc if "cannot take its next step" in exc.message else None
            return None

        error = await wait_for(stalled, timeout=90, what="the status to say why the run cannot go on")
    assert "its history does not replay with the code of the worker that took it" in error.message, error
    assert "Nondeterminism" in error.message
    assert "Upgrading workers" in error.hint and "retries" not in error.hint
    await runs.handle(run_id).terminate("test over")


def _approved_rollbacks(project, more: str = "") -> None:
    """A project whose `tidy` directive takes checkpoints and rolls back, each rollback approved by alice."""
    from tests.helpers import approver, directive_md, write_directive

    approver("alice")
    write(project / ".ai" / "config" / "agent_harness.yaml", "approvals:\n  tools: [git.rollback]\n")
    write_directive(
        project / ".ai" / "directives" / "tidy.md",
        directive_md(
            '<step name="work"><action>Tidy notes.</action></step>',
            name="tidy",
            permissions='<read resource="filesystem" path="**"/><execute resource="tool" id="git.checkpoint"/>'
            f'<execute resource="tool" id="git.rollback"/>{more}',
        ),
    )


async def _save_history(handle, name: str, project) -> None:
    """Write ``handle``'s history to tests/histories/{name}-{patch id}.json, with the test's temporary
    folder replaced so no machine path is committed."""
    history = json.loads((await handle.fetch_history()).to_json())
    target = HISTORIES / f"{name}-{CURRENT}.json"
    target.write_text(json.dumps(_scrub(history, str(project), "/project"), indent=1))
    assert str(project) not in target.read_text()


async def _decisions(runs, run_id):
    return (await runs.status(run_id)).decisions


def _scrub(node, old: str, new: str):
    import base64

    if isinstance(node, dict):
        if set(node) >= {"metadata", "data"} and isinstance(node["data"], str):
            try:
                text = base64.b64decode(node["data"]).decode("utf-8")
            except (ValueError, UnicodeDecodeError):
                return node
            return {**node, "data": base64.b64encode(text.replace(old, new).encode()).decode()}
        return {k: _scrub(v, old, new) for k, v in node.items()}
    if isinstance(node, list):
        return [_scrub(v, old, new) for v in node]
    if isinstance(node, str):
        return node.replace(old, new)
    return node


@pytest.mark.skipif(
    not os.environ.get("KIWI_RECORD_HISTORY"), reason="set KIWI_RECORD_HISTORY=1 to re-record"
)
async def test_record_shell_options_history(runs, project):
    """Record a run whose agent runs `ls --co .` (ls refuses the abbreviation as ambiguous) and `diff
    --paginate A B` (it runs pr): allowed before KNOWN_OPTIONS, refused since
    (tests/histories/shell_options-{patch id}.json; the one recorded by the code before it is
    shell_options_before-...)."""
    write(project / "notes" / "a.txt", "a\n")
    write(project / "notes" / "b.txt", "b\n")
    write_directive(
        project / ".ai" / "directives" / "shell_options.md",
        directive_md(
            '<step name="work"><action>Work.</action></step>',
            name="shell_options",
            permissions=(
                '<read resource="filesystem" path="**"/><execute resource="shell" commands="ls,diff"/>'
            ),
        ),
    )
    run_id = await runs.start("shell_options", {})
    await awaiting_step(runs, run_id, "work")
    for argv in (["ls", "--co", "."], ["diff", "--paginate", "notes/a.txt", "notes/b.txt"]):
        await runs.call_tool(run_id, "shell.run", {"argv": argv})
    await runs.complete_step(run_id, "work", {"done": True})
    assert (await runs.handle(run_id).result()).status == "completed"
    await _save_history(runs.handle(run_id), "shell_options", project)


@pytest.mark.skipif(
    not os.environ.get("KIWI_RECORD_HISTORY"), reason="set KIWI_RECORD_HISTORY=1 to re-record"
)
async def test_record_git_add_trees_history(runs, project):
    """Record tests/histories/git_add_trees-{patch id}.json: the agent's `git add -N .` and `git add src` with
    write **, the first refused since GIT_ADD_TREES (review s35: it put a tool's .env in the index). (git_add_open-
    {patch id}.json is the same run recorded by the code before the rule, 95d6b8d, where both were allowed.)"""
    import subprocess

    write(project / "src" / "app.py", "print(1)\n")
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    write_directive(
        project / ".ai" / "directives" / "stager.md",
        directive_md(
            '<step name="work"><action>Work.</action></step>',
            name="stager",
            permissions=(
                '<read resource="filesystem" path="**"/><write resource="filesystem" path="**"/>'
                '<execute resource="shell" commands="git"/>'
            ),
        ),
    )
    run_id = await runs.start("stager", {})
    await awaiting_step(runs, run_id, "work")
    for argv in (["git", "add", "-N", "."], ["git", "add", "src"]):
        await runs.call_tool(run_id, "shell.run", {"argv": argv})
    await runs.complete_step(run_id, "work", {"done": True})
    assert (await runs.handle(run_id).result()).status == "completed"
    await _save_history(runs.handle(run_id), "git_add_trees", project)


@pytest.mark.skipif(
    not os.environ.get("KIWI_RECORD_HISTORY"), reason="set KIWI_RECORD_HISTORY=1 to re-record"
)
async def test_record_null_cwd_history(runs, project):
    """Record tests/histories/null_cwd-{patch id}.json: shell.run with `"cwd": null`, the project's root since
    NULL_CWD (refused before: null_cwd_open-{patch id}.json, recorded by the code before the rule, 95d6b8d)."""
    write_directive(
        project / ".ai" / "directives" / "rooted.md",
        directive_md(
            '<step name="work"><action>Work.</action></step>',
            name="rooted",
            permissions='<read resource="filesystem" path="**"/><execute resource="shell" commands="echo"/>',
        ),
    )
    run_id = await runs.start("rooted", {})
    await awaiting_step(runs, run_id, "work")
    await runs.call_tool(run_id, "shell.run", {"command": "echo rooted", "cwd": None})
    await runs.complete_step(run_id, "work", {"done": True})
    assert (await runs.handle(run_id).result()).status == "completed"
    await _save_history(runs.handle(run_id), "null_cwd", project)


@pytest.mark.skipif(
    not os.environ.get("KIWI_RECORD_HISTORY"), reason="set KIWI_RECORD_HISTORY=1 to re-record"
)
async def test_record_cancelled_approval_history(runs, project):
    """Record tests/histories/cancelled_approval-{patch id}.json: a run cancelled while its automatic step's call
    waits for an approval, which ends cancelled since CANCELLED_NOT_FAILED (failed before:
    cancelled_approval_open-{patch id}.json, recorded by the code before the rule, 95d6b8d)."""
    from tests.helpers import approver

    approver("alice")
    write(project / ".ai" / "config" / "agent_harness.yaml", "approvals:\n  tools: [filesystem.delete]\n")
    write(project / "notes" / "old.txt", "old")
    write_directive(
        project / ".ai" / "directives" / "tidy.md",
        directive_md(
            '<step name="clean"><tool_call tool="filesystem.delete"><param name="path">notes/old.txt'
            "</param></tool_call></step>",
            name="tidy",
            permissions='<read resource="filesystem" path="**"/><write resource="filesystem" path="notes/**"/>',
        ),
    )
    run_id = await runs.start("tidy", {})

    async def pending():
        return [a for a in (await runs.status(run_id)).approvals if a.status == "pending"]

    await wait_for(pending, what="the call to wait for approval")
    await runs.cancel(run_id, "not today")
    with contextlib.suppress(WorkflowFailureError):
        await runs.handle(run_id).result()
    await _save_history(runs.handle(run_id), "cancelled_approval", project)


@pytest.mark.skipif(
    not os.environ.get("KIWI_RECORD_HISTORY"), reason="set KIWI_RECORD_HISTORY=1 to re-record"
)
async def test_record_first_task_approval_history(runs, project):
    """Record a run whose first task carries a call that waits for approval while the step starts, then is
    approved (tests/histories/first_task_approval-{patch id}.json; APPROVAL_STATUS_KEPT: the run stays
    awaiting_approval; the one recorded by the code before it is first_task_approval_before-...)."""
    from tests.helpers import approver, call_with_start

    approver("alice")
    write(project / ".ai" / "config" / "agent_harness.yaml", "approvals:\n  tools: [filesystem.delete]\n")
    write(project / "notes" / "old.txt", "old")
    write_directive(
        project / ".ai" / "directives" / "tidy.md",
        directive_md(
            '<step name="confirm"><action>Tidy notes.</action></step>',
            name="tidy",
            permissions='<read resource="filesystem" path="**"/><write resource="filesystem" path="notes/**"/>',
        ),
    )
    run_id, update = await call_with_start(
        runs, "tidy", {}, "approvalfirst", "filesystem.delete", {"path": "notes/old.txt"}
    )

    async def pending():
        return [a for a in (await runs.status(run_id)).approvals if a.status == "pending"]

    (request,) = await wait_for(pending, what="the call to wait for approval")
    await runs.decide_approval(run_id, request.request_id, True, by="alice")
    assert (await update.result()).status == "ok"
    await awaiting_step(runs, run_id, "confirm")
    await runs.complete_step(run_id, "confirm", {"confirmed": True})
    assert (await runs.handle(run_id).result()).status == "completed"
    await _save_history(runs.handle(run_id), "first_task_approval", project)


@pytest.mark.skipif(
    not os.environ.get("KIWI_RECORD_HISTORY"), reason="set KIWI_RECORD_HISTORY=1 to re-record"
)
async def test_record_rollback_refused_history(runs, project):
    """Record tests/histories/rollback_refused-{patch id}.json: git.rollback of names that are no checkpoint's,
    refused when admitted (kiwi.toolargs.ROLLBACK_SHAPE), then a name shaped like one, approved, not found.
    (rollback_shape-kiwi-run-changes-2026-11-26d.json is the same run recorded by the code before the rule,
    756dc30, where the first call asked for approval: it replays without the rule.)"""
    import subprocess

    from tests.test_humans import pending_approval

    _approved_rollbacks(project)
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=project, check=True)
    run_id = await runs.start("tidy", {})
    await awaiting_step(runs, run_id, "work")
    for name in ("refs/heads/main", "main~1"):
        refused = await runs.call_tool(run_id, "git.rollback", {"checkpoint": name})
        assert refused.error_type == "InputInvalid", refused
    rollback = asyncio.create_task(runs.call_tool(run_id, "git.rollback", {"checkpoint": f"{run_id}/3"}))
    (request,) = await wait_for(lambda: pending_approval(runs, run_id), what="the rollback to ask")
    await runs.decide_approval(run_id, request.request_id, True, by="alice")
    assert (await asyncio.wait_for(rollback, 60)).error_type == "CheckpointNotFound"
    await runs.complete_step(run_id, "work", {"done": True})
    await runs.handle(run_id).result()
    await _save_history(runs.handle(run_id), "rollback_refused", project)


@pytest.mark.skipif(
    not os.environ.get("KIWI_RECORD_HISTORY"), reason="set KIWI_RECORD_HISTORY=1 to re-record"
)
async def test_record_rollback_named_history(runs, project):
    """Record tests/histories/rollback_named-{patch id}.json: a run denying .env takes a checkpoint (which leaves
    .env out since CHECKPOINT_DENIALS), asks `git.rollback {}`, which names the checkpoint in its approval since
    ROLLBACK_NAMED, takes another checkpoint while it waits, and is approved. (rollback_unnamed-{patch id}.json
    is the same run recorded by the code before the rules, 519b808: it replays without them.)"""
    import subprocess

    from tests.test_humans import pending_approval

    _approved_rollbacks(
        project,
        '<write resource="filesystem" path="notes/**"/><deny resource="filesystem" path=".env"/>',
    )
    write(project / ".env", "TOKEN=x\n")
    write(project / "notes" / "a.md", "one\n")
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=project, check=True)
    run_id = await runs.start("tidy", {})
    await awaiting_step(runs, run_id, "work")
    await runs.call_tool(run_id, "git.checkpoint", {"message": "first"})
    rollback = asyncio.create_task(runs.call_tool(run_id, "git.rollback", {}))
    (request,) = await wait_for(lambda: pending_approval(runs, run_id), what="the rollback to ask")
    write(project / "notes" / "a.md", "two\n")
    await runs.call_tool(run_id, "git.checkpoint", {"message": "second"})
    await runs.decide_approval(run_id, request.request_id, True, by="alice")
    assert (await asyncio.wait_for(rollback, 60)).status == "ok"
    await runs.complete_step(run_id, "work", {"done": True})
    await runs.handle(run_id).result()
    await _save_history(runs.handle(run_id), "rollback_named", project)


@pytest.mark.skipif(
    not os.environ.get("KIWI_RECORD_HISTORY"), reason="set KIWI_RECORD_HISTORY=1 to re-record"
)
async def test_record_args_closed_history(runs, project):
    """Record tests/histories/args_closed-{patch id}.json: built-in calls with an argument they do not take,
    refused when admitted (kiwi.toolargs.ARGS_CLOSED), then a read of 3 bytes (max_bytes, which the run dropped
    before the rule). (args_open-{patch id}.json is the run of this test's first version recorded by the code
    before the rule, b0c7f2c: a read with max_bytes 5 read the whole file and the misspelt content wrote an empty
    file; it replays without the rule.)"""

    write(project / "notes" / "a.md", "# A note\n")
    write_directive(
        project / ".ai" / "directives" / "notes.md",
        directive_md(
            '<step name="work"><action>Read and write notes.</action></step>',
            name="notes",
            permissions='<read resource="filesystem" path="notes/**"/><write resource="filesystem" path="notes/**"/>',
        ),
    )
    run_id = await runs.start("notes", {})
    await awaiting_step(runs, run_id, "work")
    for tool, arguments in (
        ("filesystem.read", {"path": "notes/a.md", "offset": 5}),
        ("filesystem.write", {"path": "notes/b.md", "contnet": "x"}),
    ):
        refused = await runs.call_tool(run_id, tool, arguments)
        assert refused.error_type == "InputInvalid", refused
    head = await runs.call_tool(run_id, "filesystem.read", {"path": "notes/a.md", "max_bytes": 3})
    assert head.result["content"] == "# A" and head.result["truncated"], head
    assert not (project / "notes" / "b.md").exists()
    await runs.complete_step(run_id, "work", {"done": True})
    await runs.handle(run_id).result()
    await _save_history(runs.handle(run_id), "args_closed", project)


@pytest.mark.skipif(
    not os.environ.get("KIWI_RECORD_HISTORY"), reason="set KIWI_RECORD_HISTORY=1 to re-record"
)
async def test_record_child_protected_history(runs, project):
    """Record tests/histories/child_protected-{patch id}.json: a parent granted `read **` starts (on
    `on_escalation: intersect`) a child declaring `read .git/config`, which the child is not given
    (kiwi.policy.PROTECTED_NARROWED: an escalation, narrowed). (child_open-{patch id}.json is the same run
    recorded by the code before the rule, b0c7f2c, where the child kept the grant: it replays without the rule.)"""
    (project / ".git").mkdir()
    write(project / ".git" / "config", "[core]\n")
    write(project / ".ai" / "config" / "agent_harness.yaml", "child_runs:\n  on_escalation: intersect\n")
    for name, step, grants in (
        (
            "boss",
            "lead",
            '<read resource="filesystem" path="**"/><execute resource="tool" id="directive.run"/>',
        ),
        ("helper", "help", '<read resource="filesystem" path=".git/config"/>'),
    ):
        write_directive(
            project / ".ai" / "directives" / f"{name}.md",
            directive_md(
                f'<step name="{step}"><action>{step}</action></step>', name=name, permissions=grants
            ),
        )
    parent = await runs.start("boss", {})
    await awaiting_step(runs, parent, "lead")
    child = (await runs.call_tool(parent, "directive.run", {"directive": "helper"})).result["run_id"]
    await awaiting_step(runs, child, "help")
    read = await runs.call_tool(child, "filesystem.read", {"path": ".git/config"})
    assert read.status == "denied", read
    await runs.complete_step(child, "help", {"done": True})
    await runs.handle(child).result()
    await runs.complete_step(parent, "lead", {"done": True})
    await runs.handle(parent).result()
    await _save_history(runs.handle(parent), "child_protected", project)


@pytest.mark.skipif(
    not os.environ.get("KIWI_RECORD_HISTORY"), reason="set KIWI_RECORD_HISTORY=1 to re-record"
)
async def test_record_deadline_calls_history(runs, project):
    """Record tests/histories/deadline_calls-{patch id}.json: a run whose deadline passes during an automatic
    step's call, timed out before the next step's call (DEADLINE_BETWEEN_CALLS). (deadline_open-{patch id}.json
    is the same run recorded by the code before the rule, b0c7f2c, where it completed: it replays without it.)"""
    from tests.helpers import write_slow_steps

    write_slow_steps(project)
    run_id = await runs.start("slow", {}, deadline_seconds=1.0)
    with pytest.raises(Exception):  # noqa: B017 - the run timed out
        await runs.handle(run_id).result()
    assert (await runs.status(run_id)).status == "timed_out"
    await _save_history(runs.handle(run_id), "deadline_calls", project)


@pytest.mark.skipif(
    not os.environ.get("KIWI_RECORD_HISTORY"), reason="set KIWI_RECORD_HISTORY=1 to re-record"
)
async def test_record_rollback_scoped_history(runs, project):
    """Record tests/histories/rollback_scoped-{patch id}.json: a checkpoint, then an approved git.rollback whose
    request carries the run's write grants since ROLLBACK_GRANTS (rollback_open-{patch id}.json is the same run
    recorded by the code before the rule, f353add, whose request carried none)."""
    import subprocess

    from tests.helpers import approver, directive_md, write_directive
    from tests.test_humans import pending_approval

    approver("alice")
    write(project / ".ai" / "config" / "agent_harness.yaml", "approvals:\n  tools: [git.rollback]\n")
    write(project / ".gitignore", ".ai/logs/\n.ai/.cache/\n")
    write(project / "notes" / "old.txt", "old")
    write_directive(
        project / ".ai" / "directives" / "tidy.md",
        directive_md(
            '<step name="work"><action>Tidy notes.</action></step>',
            name="tidy",
            permissions='<read resource="filesystem" path="**"/><write resource="filesystem" path="notes/**"/>'
            '<execute resource="tool" id="git.checkpoint"/><execute resource="tool" id="git.rollback"/>',
        ),
    )
    git = ["git", "-c", "user.email=t@example.com", "-c", "user.name=t"]
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=project, check=True)
    subprocess.run([*git, "add", "."], cwd=project, check=True)
    subprocess.run([*git, "commit", "-q", "-m", "base"], cwd=project, check=True)
    run_id = await runs.start("tidy", {})
    await awaiting_step(runs, run_id, "work")
    assert (await runs.call_tool(run_id, "git.checkpoint", {"message": "before"})).status == "ok"
    write(project / "notes" / "old.txt", "edited")
    rollback = asyncio.create_task(runs.call_tool(run_id, "git.rollback", {}))
    (request,) = await wait_for(lambda: pending_approval(runs, run_id), what="the rollback to ask")
    await runs.decide_approval(run_id, request.request_id, True, by="alice")
    assert (await asyncio.wait_for(rollback, 60)).status == "ok"
    await runs.complete_step(run_id, "work", {"done": True})
    await runs.handle(run_id).result()
    await _save_history(runs.handle(run_id), "rollback_scoped", project)


@pytest.mark.skipif(
    not os.environ.get("KIWI_RECORD_HISTORY"), reason="set KIWI_RECORD_HISTORY=1 to re-record"
)
async def test_record_command_words_history(runs, project):
    """Record tests/histories/command_words-{patch id}.json: a step's `sort {file}` run with an input holding a
    space, one word of the command since COMMAND_WORDS (command_open-{patch id}.json is the same run recorded by
    the code before the rule, b083a12, where the input became two words)."""
    write(project / "src" / "a b.txt", "pear\napple\n")
    write_directive(
        project / ".ai" / "directives" / "sorter.md",
        directive_md(
            '<step name="sorted"><tool_call tool="shell.run"><param name="command">sort {file}</param>'
            '</tool_call></step><step name="look"><action>Look at the result.</action></step>',
            name="sorter",
            permissions='<read resource="filesystem" path="**"/><execute resource="shell" commands="sort"/>',
            inputs='<input name="file" type="string" required="true"/>',
        ),
    )
    run_id = await runs.start("sorter", {"file": "src/a b.txt"})
    await awaiting_step(runs, run_id, "look")
    await runs.complete_step(run_id, "look", {"done": True})
    await runs.handle(run_id).result()
    await _save_history(runs.handle(run_id), "command_words", project)


@pytest.mark.skipif(
    not os.environ.get("KIWI_RECORD_HISTORY"), reason="set KIWI_RECORD_HISTORY=1 to re-record"
)
async def test_record_stuck_kept_history(runs, project):
    """Record tests/histories/stuck_kept-{patch id}.json: an agent stuck past the attempts a human is asked
    after, then an escalation answered: held until resumed since STUCK_HOLD_KEPT (stuck_open-{patch id}.json is
    the same run recorded by the code before the rule, a09a354, where the answer released it)."""
    from kiwi.contracts import HelpRequest
    from tests.helpers import approver

    approver("alice")
    write_directive(
        project / ".ai" / "directives" / "tidy.md",
        directive_md(
            '<step name="work"><action>Tidy notes.</action></step>',
            name="tidy",
            permissions='<read resource="filesystem" path="**"/>',
        ),
    )
    run_id = await runs.start("tidy", {})
    await awaiting_step(runs, run_id, "work")
    await runs.help(run_id, HelpRequest(kind="stuck", reason="cannot sort", attempts=5))
    await runs.help(
        run_id, HelpRequest(kind="escalate", reason="a or b?", options=["a", "b"], request_id="d-1")
    )
    await runs.decide(run_id, "d-1", "a", by="alice")

    async def answered():
        status = await runs.status(run_id)
        return status if [d.answer for d in status.decisions] == ["a"] else None

    if (await wait_for(answered, what="the answer")).status == "awaiting_human":
        await runs.resume(run_id, "looked", by="alice")
    await awaiting_step(runs, run_id, "work")
    await runs.complete_step(run_id, "work", {"done": True})
    await runs.handle(run_id).result()
    await _save_history(runs.handle(run_id), "stuck_kept", project)


@pytest.mark.skipif(
    not os.environ.get("KIWI_RECORD_HISTORY"), reason="set KIWI_RECORD_HISTORY=1 to re-record"
)
async def test_record_number_options_history(runs, project):
    """Record tests/histories/number_options-{patch id}.json: `ls -1 notes` and `head -5 notes/x.txt`, taken as
    options since NUMBER_OPTIONS (number_open-{patch id}.json is the same run recorded by the code before the
    rule, 123c16a, which refused them as paths)."""
    write(project / "notes" / "x.txt", "a\nb\n")
    write_directive(
        project / ".ai" / "directives" / "lister.md",
        directive_md(
            '<step name="work"><action>Work.</action></step>',
            name="lister",
            permissions='<read resource="filesystem" path="notes/**"/><execute resource="shell" commands="ls,head"/>',
        ),
    )
    run_id = await runs.start("lister", {})
    await awaiting_step(runs, run_id, "work")
    for argv in (["ls", "-1", "notes/x.txt"], ["head", "-5", "notes/x.txt"]):
        await runs.call_tool(run_id, "shell.run", {"argv": argv})
    await runs.complete_step(run_id, "work", {"done": True})
    await runs.handle(run_id).result()
    await _save_history(runs.handle(run_id), "number_options", project)


@pytest.mark.skipif(
    not os.environ.get("KIWI_RECORD_HISTORY"), reason="set KIWI_RECORD_HISTORY=1 to re-record"
)
async def test_record_commit_bound_history(runs, project):
    """Record tests/histories/commit_bound-{patch id}.json: a run whose git.commit needs approval writes a note,
    asks to commit it (its content fixed and shown in the approval since COMMIT_BOUND), changes the note while
    the approval waits, and is approved: the commit takes the content shown. (commit_unbound-{patch id}.json is
    the same run recorded by the code before the rule, cdde03c: it replays without it.)"""
    from tests.test_humans import pending_approval
    from tests.test_review_attacks_s38 import _approved_commits

    _approved_commits(project)
    run_id = await runs.start("publish", {})
    await awaiting_step(runs, run_id, "work")
    await runs.call_tool(run_id, "filesystem.write", {"path": "notes/a.md", "content": "reviewed\n"})
    commit = asyncio.create_task(
        runs.call_tool(run_id, "git.commit", {"message": "notes", "paths": ["notes"]})
    )
    (request,) = await wait_for(lambda: pending_approval(runs, run_id), what="the commit to ask")
    await runs.call_tool(run_id, "filesystem.write", {"path": "notes/a.md", "content": "changed\n"})
    await runs.decide_approval(run_id, request.request_id, True, by="alice")
    assert (await asyncio.wait_for(commit, 60)).status == "ok"
    await runs.complete_step(run_id, "work", {"done": True})
    await runs.handle(run_id).result()
    await _save_history(runs.handle(run_id), "commit_bound", project)


@pytest.mark.skipif(
    not os.environ.get("KIWI_RECORD_HISTORY"), reason="set KIWI_RECORD_HISTORY=1 to re-record"
)
async def test_record_child_bound_history(runs, project):
    """Record tests/histories/child_bound-{patch id}.json: a run drafting directives writes `draft`, asks to run it
    (the child read from the file and shown in the approval since CHILD_BOUND), and is approved; the child ends.
    (child_unbound-{patch id}.json is the same run recorded by the code before the rule, cdde03c: the child was
    read once approved; it replays without the rule.)"""
    from tests.test_humans import pending_approval
    from tests.test_review_attacks_s38 import AUTHOR, _draft, gated

    gated(project, "author", AUTHOR, "directive.run")
    run_id = await runs.start("author", {})
    await awaiting_step(runs, run_id, "work")
    draft = _draft("draft", "reviewed")
    await runs.call_tool(run_id, "filesystem.write", {"path": ".ai/directives/draft.md", "content": draft})
    call = asyncio.create_task(runs.call_tool(run_id, "directive.run", {"directive": "draft"}))
    (request,) = await wait_for(lambda: pending_approval(runs, run_id), what="the child to ask")
    await runs.decide_approval(run_id, request.request_id, True, by="alice")
    child = (await asyncio.wait_for(call, 60)).result["run_id"]
    await awaiting_step(runs, child, "reviewed")
    await runs.complete_step(child, "reviewed", {"done": True})
    await runs.handle(child).result()
    await runs.complete_step(run_id, "work", {"done": True})
    await runs.handle(run_id).result()
    await _save_history(runs.handle(run_id), "child_bound", project)


@pytest.mark.skipif(
    not os.environ.get("KIWI_RECORD_HISTORY"), reason="set KIWI_RECORD_HISTORY=1 to re-record"
)
async def test_record_help_checkpoint_call_history(runs, project):
    """Record tests/histories/help_checkpoint_call-{patch id}.json: the agent asks help(checkpoint) twice in a run
    whose harness limits git.checkpoint to one call (since HELP_CHECKPOINT_CALL each is the git.checkpoint call:
    the second refused by the limit). (help_checkpoint_direct-{patch id}.json is the same run recorded by the code
    before the rule, cdde03c: both checkpoints were taken; it replays without the rule.)"""
    import subprocess

    from kiwi.contracts import HelpRequest
    from tests.helpers import directive_md, write_directive

    write(project / ".ai" / "config" / "agent_harness.yaml", "rate_limits:\n  git.checkpoint: 1\n")
    write_directive(
        project / ".ai" / "directives" / "ckpt.md",
        directive_md(
            '<step name="work" mode="agent"><action>Work.</action></step>',
            name="ckpt",
            permissions='<write resource="filesystem" path="notes/**"/><execute resource="tool" id="git.checkpoint"/>',
        ),
    )
    write(project / ".gitignore", ".ai/logs/\n.ai/.cache/\n")
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=project, check=True)
    run_id = await runs.start("ckpt", {})
    await awaiting_step(runs, run_id, "work")
    for n in (1, 2):
        await runs.help(run_id, HelpRequest(kind="checkpoint", reason=f"help {n}"))
    await runs.complete_step(run_id, "work", {"done": True})
    await runs.handle(run_id).result()
    await _save_history(runs.handle(run_id), "help_checkpoint_call", project)


@pytest.mark.skipif(
    not os.environ.get("KIWI_RECORD_HISTORY"), reason="set KIWI_RECORD_HISTORY=1 to re-record"
)
async def test_record_child_deadline_history(runs, project):
    """Record tests/histories/child_deadline-{patch id}.json: a run started with a deadline starts a child (given
    what is left of the deadline since CHILD_DEADLINE), which ends, and the run ends. (child_no_deadline-{patch
    id}.json is the same run recorded by the code before the rule, cdde03c: it replays without it.)"""
    from tests.helpers import write_parent_and_child

    write_parent_and_child(project)
    parent = await runs.start("boss", {}, deadline_seconds=3600)
    await awaiting_step(runs, parent, "lead")
    child = (await runs.call_tool(parent, "directive.run", {"directive": "helper"})).result["run_id"]
    await awaiting_step(runs, child, "help")
    await runs.complete_step(child, "help", {"done": True})
    await runs.handle(child).result()
    await runs.complete_step(parent, "lead", {"done": True})
    await runs.handle(parent).result()
    await _save_history(runs.handle(parent), "child_deadline", project)


@pytest.mark.skipif(
    not os.environ.get("KIWI_RECORD_HISTORY"), reason="set KIWI_RECORD_HISTORY=1 to re-record"
)
async def test_record_commit_index_history(runs, project):
    """Record tests/histories/commit_index_refused-{patch id}.json: an agent granted shell git and `write src/**`
    runs `git commit -m x` (no path), refused since GIT_COMMIT_INDEX, then `git commit -m y -- src/app.py`.
    (commit_index_taken-{patch id}.json is the same run recorded by the code before the rule, cdde03c: the first
    commit ran; it replays without the rule.)"""
    import subprocess

    from tests.test_attack_shell import agent_run, shell

    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    write(project / "src" / "app.py", "v1\n")
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=project, check=True)
    subprocess.run([*git, "add", "src"], cwd=project, check=True)
    subprocess.run([*git, "commit", "-qm", "base"], cwd=project, check=True)
    grants = (
        '<read resource="filesystem" path="**"/><write resource="filesystem" path="src/**"/>'
        '<execute resource="shell" commands="git"/>'
    )
    run_id = await agent_run(runs, project, "shellcommit", grants)
    write(project / "src" / "app.py", "v2\n")
    await shell(runs, run_id, "git", "commit", "-m", "x")
    await shell(runs, run_id, "git", "commit", "-m", "y", "--", "src/app.py")
    await runs.complete_step(run_id, "work", {"done": True})
    await runs.handle(run_id).result()
    await _save_history(runs.handle(run_id), "commit_index_refused", project)


@pytest.mark.skipif(
    not os.environ.get("KIWI_RECORD_HISTORY"), reason="set KIWI_RECORD_HISTORY=1 to re-record"
)
async def test_record_ended_approvals_history(runs, project):
    """Record tests/histories/ended_approvals_cancelled-{patch id}.json: the agent asks a git.commit that waits for
    approval and completes the run's last step meanwhile; since ENDED_APPROVALS the approval is cancelled as the
    run ends. (ended_approvals_waited-{patch id}.json is the same run recorded by the code before the rule,
    cdde03c: the run waited, the approval came after the run's end and the commit was made.)"""
    from tests.test_humans import pending_approval
    from tests.test_review_attacks_s38 import _approved_commits

    _approved_commits(project)
    run_id = await runs.start("publish", {})
    await awaiting_step(runs, run_id, "work")
    await runs.call_tool(run_id, "filesystem.write", {"path": "notes/a.md", "content": "late\n"})
    commit = asyncio.create_task(
        runs.call_tool(run_id, "git.commit", {"message": "late", "paths": ["notes"]})
    )
    (request,) = await wait_for(lambda: pending_approval(runs, run_id), what="the commit to ask")
    await runs.complete_step(run_id, "work", {"done": True})
    if any(a.status == "pending" for a in (await runs.status(run_id)).approvals):
        await runs.decide_approval(run_id, request.request_id, True, by="alice")  # (the code before the rule)
    await asyncio.wait_for(commit, 60)
    await runs.handle(run_id).result()
    await _save_history(runs.handle(run_id), "ended_approvals_cancelled", project)


@pytest.mark.skipif(
    not os.environ.get("KIWI_RECORD_HISTORY"), reason="set KIWI_RECORD_HISTORY=1 to re-record"
)
async def test_record_cwd_whole_history(runs, project):
    """Record tests/histories/cwd_whole_refused-{patch id}.json: under `read data/**` and `read .`, the agent runs dd
    (a program Kiwi does not model) in the root, refused since CWD_WHOLE, then in data/. (cwd_whole_ran-{patch
    id}.json is the same run recorded by the code before the rule, cdde03c: the first dd ran; it replays without it.)"""
    from tests.test_attack_shell import agent_run, shell
    from tests.test_review_attacks_s38 import root_secret_and_data

    run_id = await agent_run(runs, project, "peek", root_secret_and_data(project))
    await shell(runs, run_id, "dd", "if=secret.json", "status=none")
    await shell(runs, run_id, "dd", "if=config.json", "status=none", cwd="data")
    await runs.complete_step(run_id, "work", {"done": True})
    await runs.handle(run_id).result()
    await _save_history(runs.handle(run_id), "cwd_whole_refused", project)


@pytest.mark.skipif(
    not os.environ.get("KIWI_RECORD_HISTORY"), reason="set KIWI_RECORD_HISTORY=1 to re-record"
)
async def test_record_child_windows_history(runs, project):
    """Record tests/histories/child_windows_counted-{patch id}.json: under `filesystem.write: 3/hour` a child writes
    twice and ends, then its parent writes three times (since CHILD_WINDOWS the child's writes count: one goes
    through). (child_windows_forgot-{patch id}.json is the same run recorded by the code before the rule, cdde03c:
    all three went through; it replays without the rule.)"""
    from tests.test_child_budget import _parent_and_kid

    _parent_and_kid(project, "3/hour")
    run_id = await runs.start("parent", {})
    await awaiting_step(runs, run_id, "work")
    kid = (await runs.call_tool(run_id, "directive.run", {"directive": "kid"})).result["run_id"]
    await awaiting_step(runs, kid, "wait")
    for i in range(2):
        await runs.call_tool(kid, "filesystem.write", {"path": f"notes/k{i}", "content": "x"})
    await runs.complete_step(kid, "wait", {"done": True})
    await runs.handle(kid).result()
    for i in range(3):
        await runs.call_tool(run_id, "filesystem.write", {"path": f"notes/p{i}", "content": "x"})
    await runs.complete_step(run_id, "work", {"done": True})
    await runs.handle(run_id).result()
    await _save_history(runs.handle(run_id), "child_windows_counted", project)


@pytest.mark.skipif(
    not os.environ.get("KIWI_RECORD_HISTORY"), reason="set KIWI_RECORD_HISTORY=1 to re-record"
)
async def test_record_step_hint_history(runs, project):
    """Record tests/histories/step_hint_said-{patch id}.json: a step's shell.run is refused (no shell grant) and the
    run fails, its error carrying the refusal's hint since STEP_HINT. (step_hint_unsaid-{patch id}.json is the same
    run recorded by the code before the rule, cdde03c; it replays without it.)"""
    from tests.helpers import directive_md, write_directive

    body = '<step name="sorted"><tool_call tool="shell.run"><param name="command">sort notes.txt</param></tool_call></step>'
    write_directive(
        project / ".ai" / "directives" / "sorter.md",
        directive_md(body, name="sorter", permissions='<read resource="filesystem" path="**"/>'),
    )
    run_id = await runs.start("sorter", {})
    with pytest.raises(WorkflowFailureError):
        await runs.handle(run_id).result()
    await _save_history(runs.handle(run_id), "step_hint_said", project)


@pytest.mark.skipif(
    not os.environ.get("KIWI_RECORD_HISTORY"), reason="set KIWI_RECORD_HISTORY=1 to re-record"
)
async def test_record_child_held_history(runs, project):
    """Record tests/histories/child_held_kept-{patch id}.json: under `filesystem.write: 4/hour` a parent's child
    starts a grandchild and ends; another child writes twice and fails; the parent writes four times (since
    CHILD_HELD the grandchild's slot stays held and the failed child's writes count: one goes through).
    (child_held_gave_back-{patch id}.json is the same run recorded by the code before the rule, 85ed92d: all four
    went through; it replays without the rule.)"""
    from tests.helpers import directive_md, write_directive
    from tests.test_child_budget import PARENT, _parent_and_kid

    _parent_and_kid(project, "4/hour", fails=True)
    write_directive(
        project / ".ai" / "directives" / "mid.md",
        directive_md('<step name="work"><action>Delegate.</action></step>', name="mid", permissions=PARENT),
    )
    run_id = await runs.start("parent", {})
    await awaiting_step(runs, run_id, "work")
    mid = (await runs.call_tool(run_id, "directive.run", {"directive": "mid"})).result["run_id"]
    await awaiting_step(runs, mid, "work")
    grandchild = (await runs.call_tool(mid, "directive.run", {"directive": "kid"})).result["run_id"]
    await awaiting_step(runs, grandchild, "wait")
    await runs.complete_step(mid, "work", {"done": True})
    await runs.handle(mid).result()
    await runs.call_tool(grandchild, "filesystem.write", {"path": "notes/g0", "content": "x"})
    kid = (await runs.call_tool(run_id, "directive.run", {"directive": "kid"})).result["run_id"]
    await awaiting_step(runs, kid, "wait")
    for i in range(2):
        await runs.call_tool(kid, "filesystem.write", {"path": f"notes/k{i}", "content": "x"})
    await runs.complete_step(kid, "wait", {"done": True})
    with pytest.raises(WorkflowFailureError):
        await runs.handle(kid).result()
    await wait_for(lambda: _child_ended(runs, run_id, kid), what="the parent to see its child fail")
    for i in range(4):
        await runs.call_tool(run_id, "filesystem.write", {"path": f"notes/p{i}", "content": "x"})
    await runs.cancel(grandchild)
    await runs.complete_step(run_id, "work", {"done": True})
    await runs.handle(run_id).result()
    await _save_history(runs.handle(run_id), "child_held_kept", project)


async def _child_ended(runs, run_id: str, kid: str) -> bool:
    return any(c.run_id == kid and c.status == "failed" for c in (await runs.status(run_id)).children)
