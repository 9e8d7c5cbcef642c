"""Directive runs on a real Temporal dev server: steps, agent waits, the call path, bad input."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from datetime import datetime
from types import SimpleNamespace
from zoneinfo import ZoneInfo

import pytest
from temporalio.client import WorkflowExecutionStatus

from activities.audit import read_audit
from kiwi.contracts import ResumeRequest, session_workflow_id
from kiwi.errors import InputInvalid, ItemNotFound, KiwiError, RunNotFound, RunStateConflict
from tests.helpers import approver, directive_md, wait_for, write, write_directive
from workflows.directive_run.options import RECENT_RESULTS


async def hello_that_continues_every(runs, project, updates: int) -> str:
    """A hello_kiwi run waiting at 'confirm' that continues-as-new every ``updates`` updates, with writes
    neither rate-limited nor taken for a loop."""
    write(
        project / ".ai" / "config" / "agent_harness.yaml",
        f"runs:\n  continue_as_new_after_updates: {updates}\nloop_detection:\n  repeat_threshold: 1000\n"
        "rate_limits:\n  filesystem.write: 1000\n",
    )
    run_id = await runs.start("hello_kiwi", {"name": "Flo"})
    await awaiting(runs, run_id, "confirm")
    return run_id


async def awaiting(runs, run_id, step):
    async def probe():
        status = await runs.status(run_id)
        assert status.status not in ("failed", "timed_out"), status.error
        return (
            status
            if status.current_step and status.current_step.name == step and status.status == "awaiting_agent"
            else None
        )

    return await wait_for(probe, what=f"{run_id} to wait on {step}")


async def test_hello_kiwi_runs_auto_steps_then_waits_for_the_agent(runs, project):
    run_id = await runs.start("hello_kiwi", {"name": "Ada"})
    assert run_id.startswith("run-hello_kiwi-")
    status = await awaiting(runs, run_id, "confirm")
    assert (project / "notes" / "hello.md").read_text() == "Hello, Ada! Kiwi wrote this file."
    counted = next(s for s in status.steps if s.name == "count_words")
    assert counted.outputs["result"] == {"words": 6, "lines": 1}
    assert "Read notes/hello.md" in status.current_step.action and "greets Ada" in status.current_step.action

    read = await runs.call_tool(run_id, "filesystem.read", {"path": "notes/hello.md"})
    assert read.status == "ok" and read.result["content"].startswith("Hello, Ada")

    done = await runs.complete_step(run_id, "confirm", {"confirmed": True})
    assert done.status == "completed" and done.next_step is None
    result = await runs.handle(run_id).result()
    assert result.status == "completed" and result.outputs["confirm"] == {"confirmed": True}

    events = [r["event"] for r in read_audit(str(project), run_id)]
    assert events.count("tool_call") == 3 and events[-1] == "run_finished"
    # The history this code just wrote replays on this code (what a new worker does after a crash).
    from temporalio.worker import Replayer

    from kiwi.converter import data_converter
    from workers.main import SANDBOX, WORKFLOWS

    history = await runs.handle(run_id).fetch_history()
    # What the Temporal UI's timeline shows: each activity's summary names the call.
    summaries = [
        json.loads(e.user_metadata.summary.data)
        for e in history.events
        # Filesystem calls run as local activities: their summary is on the marker event.
        if (
            e.HasField("activity_task_scheduled_event_attributes")
            or e.HasField("marker_recorded_event_attributes")
        )
        and e.user_metadata.HasField("summary")
    ]
    assert "filesystem.write notes/hello.md" in summaries and "filesystem.read notes/hello.md" in summaries, (
        summaries
    )
    await Replayer(
        workflows=WORKFLOWS, data_converter=data_converter, workflow_runner=SANDBOX
    ).replay_workflow(history)
    assert [r["seq"] for r in read_audit(str(project), run_id)] == list(range(1, len(events) + 1))


async def test_denied_calls_are_refused_audited_and_nothing_happens(runs, project):
    run_id = await runs.start("hello_kiwi", {"name": "Bo"})
    await awaiting(runs, run_id, "confirm")
    (project / "secret.txt").write_text("top secret")
    (project / "notes" / "link.txt").symlink_to(project.parent)
    cases = [
        ("filesystem.read", {"path": "../outside.txt"}, "leaves the project root"),
        ("filesystem.read", {"path": "/etc/passwd"}, "absolute path"),
        ("filesystem.read", {"path": "secret.txt"}, "read not allowed on 'secret.txt'"),
        ("filesystem.write", {"path": "src/a.py", "content": "x"}, "write not allowed"),
        ("filesystem.read", {"path": "notes/link.txt/etc"}, "outside the project root"),
        ("shell.run", {"command": "git status"}, "not in the allowlist"),
        ("shell.run", {"command": "git status; rm -rf /"}, "refused"),
    ]
    grants_named = 0
    for tool, args, reason in cases:
        result = await runs.call_tool(run_id, tool, args)
        assert result.status == "denied", (tool, args, result)
        assert reason in result.reason
        if "to <permissions>" in result.hint:
            grants_named += 1
            # Said to the agent, whose own edit of the directive would unsign it (a new-user trial did so,
            # and its next run had the base policy only): the change is a human's, signed again.
            assert "a human makes that change to the directive and signs it again (`kiwi sign " in result.hint
            assert ".ai/directives/hello_kiwi.md`)" in result.hint, result.hint
    assert grants_named == 3  # (the read of secret.txt, the write under src/, git in the shell)
    assert not (project / "src").exists()
    missing = await runs.call_tool(run_id, "nope.tool", {})
    assert missing.status == "error" and missing.error_type == "ToolNotFound"
    await runs.cancel(run_id, "test over")
    await wait_for(lambda: _status_is(runs, run_id, "cancelled"), what="cancel")
    audit = [
        r for r in read_audit(str(project), run_id) if r["event"] == "tool_call" and r["origin"] == "agent"
    ]
    assert [r["decision"] for r in audit] == ["denied"] * len(cases) + ["error"]
    assert audit[2]["hint"] == 'add <read resource="filesystem" path="secret.txt"/> to <permissions>'


async def _status_is(runs, run_id, name):
    return (await runs.status(run_id)).status == name


async def test_a_missing_tools_hint_is_kept_per_tool_and_bounded(runs, project):
    """The client works out a not-found hint once per tool while it keeps the run's snapshot (#20: it was
    worked out on every refused call), and keeps at most HINTS_KEPT of them per run."""
    from kiwi.runs.shared import HINTS_KEPT

    run_id = await runs.start("hello_kiwi", {"name": "Cy"})
    await awaiting(runs, run_id, "confirm")
    first = await runs.call_tool(run_id, "nope.tool", {})
    assert first.error_type == "ToolNotFound"
    assert first.hint.startswith("tools this run can call: ") and "filesystem.read" in first.hint
    again = await runs.call_tool(run_id, "nope.tool", {})
    assert again.hint == first.hint
    for i in range(HINTS_KEPT + 5):
        other = await runs.call_tool(run_id, f"nope{i}.tool", {})
        assert other.hint == first.hint  # (every name this run lacks has the same list)
    assert len(runs._snapshots[run_id][2]) == HINTS_KEPT
    # Outside a run (the project's session), the hint names the base policy's tools.
    outside = await runs.session_call("cli", "nope.tool", {})
    assert outside.hint.startswith("tools you can call outside a run: ")


async def test_bad_input_is_a_typed_error_and_starts_nothing(runs, project):
    with pytest.raises(ItemNotFound):
        await runs.start("no_such_directive", {})
    with pytest.raises(InputInvalid, match="required input 'name'"):
        await runs.start("hello_kiwi", {})
    with pytest.raises(InputInvalid, match="unknown input 'nmae'"):
        await runs.start("hello_kiwi", {"nmae": "x", "name": "y"})
    assert await runs.list_runs(directive="hello_kiwi") == []
    run_id = await runs.start("hello_kiwi", {"name": "Cy"})
    await awaiting(runs, run_id, "confirm")
    with pytest.raises(RunStateConflict, match="step 'write_greeting' is not waiting.*'confirm' is"):
        await runs.complete_step(run_id, "write_greeting", {})
    await runs.complete_step(run_id, "confirm", {})
    await runs.handle(run_id).result()
    with pytest.raises(RunStateConflict, match="has finished"):
        await runs.call_tool(run_id, "filesystem.read", {"path": "notes/hello.md"})


async def test_same_idempotency_key_returns_the_same_run(runs, project):
    first = await runs.launch("hello_kiwi", {"name": "Di"}, idempotency_key="ticket-42")
    second = await runs.launch("hello_kiwi", {"name": "Di"}, idempotency_key="ticket-42")
    assert first.run_id == second.run_id
    assert (first.existing, second.existing) == (False, True)
    assert len(await runs.list_runs(directive="hello_kiwi")) >= 1
    # Review s34: with the file changed since (its signature gone, a grant added), the key's run was answered
    # with the file's trust and grants, not those it runs with.
    path = project / ".ai" / "directives" / "hello_kiwi.md"
    signed = path.read_text()
    path.write_text(
        "\n".join(line for line in signed.splitlines() if "kiwi:signed" not in line).replace(
            '<read resource="filesystem" path="notes/**" />',
            '<read resource="filesystem" path="notes/**" /><read resource="filesystem" path="**" />',
        )
    )
    changed = await runs.launch("hello_kiwi", {"name": "Di"}, idempotency_key="ticket-42")
    assert changed.existing and changed.trust == first.trust and first.trust.grants == "declared", (
        changed.trust
    )
    assert changed.grants == first.grants and "**" not in changed.grants.fs_read, changed.grants
    path.write_text(signed)
    # README trial s34: the same key with other inputs answered the old run as if it had started them.
    with pytest.raises(
        InputInvalid, match=r"names run run-hello_kiwi-\w+, started with other inputs \(they differ in name\)"
    ):
        await runs.launch("hello_kiwi", {"name": "Jo"}, idempotency_key="ticket-42")
    code, out, err = await kiwi_cli(
        "run",
        "hello_kiwi",
        "--input",
        "name=Di",
        "--idempotency-key",
        "ticket-42",
        "--address",
        runs.client.service_client.config.target_host,
        "--task-queue",
        runs.task_queue,
    )
    assert code == 0 and out.startswith(f"existing run {first.run_id}: idempotency key 'ticket-42'"), (
        out + err
    )
    assert "started" not in out.splitlines()[0].split(":")[0]
    where = ["--address", runs.client.service_client.config.target_host, "--task-queue", runs.task_queue]
    code, out, err = await kiwi_cli(
        "run", "hello_kiwi", "--input", "name=Di", "--idempotency-key", "ticket-42", "--json", *where
    )
    assert code == 0 and json.loads(out)["existing"] is True, out + err
    code, out, err = await kiwi_cli(
        "run", "hello_kiwi", "--input", "name=Di", "--idempotency-key", " ", *where
    )
    assert code == 2 and "an idempotency key is some text, not empty" in err, out + err
    # A key whose run has ended answers that run too (it was Temporal's bare "Workflow execution already started").
    await awaiting(runs, first.run_id, "confirm")
    await runs.complete_step(first.run_id, "confirm", {"confirmed": True})
    await runs.handle(first.run_id).result()
    again = await runs.launch("hello_kiwi", {"name": "Di"}, idempotency_key="ticket-42")
    assert (again.run_id, again.existing) == (first.run_id, True)
    with pytest.raises(InputInvalid, match="started with other inputs"):
        await runs.launch("hello_kiwi", {"name": "Jo"}, idempotency_key="ticket-42")


async def test_conditions_templating_and_step_outputs(runs, project):
    body = """
    <step name="probe">
      <tool_call tool="word_count"><param name="text">{text}</param></tool_call>
    </step>
    <step name="long_only" condition="steps.probe.outputs.result.words > 3">
      <tool_call tool="filesystem.write">
        <param name="path">notes/long.txt</param><param name="content">{steps.probe.outputs.result.words} words</param>
      </tool_call>
    </step>
    <step name="short_only" condition="steps.probe.outputs.result.words &lt;= 3 and not inputs.force">
      <tool_call tool="filesystem.write">
        <param name="path">notes/short.txt</param><param name="content">short</param>
      </tool_call>
    </step>"""
    write_directive(
        project / ".ai" / "directives" / "cond.md",
        directive_md(
            body,
            name="cond",
            permissions='<write resource="filesystem" path="notes/**"/>'
            '<execute resource="tool" id="word_count"/>',
            inputs='<input name="text" type="string" required="true"/><input name="force" type="boolean" default="false"/>',
        ),
    )
    run_id = await runs.start("cond", {"text": "one two three four five"})
    result = await runs.handle(run_id).result()
    assert result.status == "completed"
    assert (project / "notes" / "long.txt").read_text() == "5 words"
    assert not (project / "notes" / "short.txt").exists()
    status = await runs.status(run_id)
    assert {s.name: s.status for s in status.steps} == {
        "probe": "completed",
        "long_only": "completed",
        "short_only": "skipped",
    }


async def test_rate_limit_and_loop_warnings(runs, project):
    write(
        project / ".ai" / "config" / "agent_harness.yaml",
        "rate_limits:\n  filesystem.write: 3\nloop_detection:\n  repeat_threshold: 3\n  max_warnings: 100\n",
    )
    run_id = await runs.start("hello_kiwi", {"name": "Ed"})
    await awaiting(runs, run_id, "confirm")
    # write_greeting already used one of the three writes.
    results = [
        await runs.call_tool(run_id, "filesystem.write", {"path": f"notes/{i}.txt", "content": "x"})
        for i in range(3)
    ]
    assert [r.status for r in results] == ["ok", "ok", "rate_limited"]
    assert not (project / "notes" / "2.txt").exists()
    repeated = [await runs.call_tool(run_id, "filesystem.read", {"path": "notes/hello.md"}) for _ in range(3)]
    assert repeated[-1].warnings and "same call" in repeated[-1].warnings[0]
    assert not repeated[0].warnings


async def test_concurrent_callers_across_continue_as_new_each_call_runs_once(runs, project, monkeypatch):
    # Callers that meet the draining run (RunContinuing) wait for its successor and send again; the
    # run de-duplicates by update id, so every call lands exactly once, none lost, none doubled.
    run_id = await hello_that_continues_every(runs, project, 10)
    # They wait for the execution that refused them to close, never for the one running after it (which a
    # refusal naming no execution left them to guess, and they waited out 30 s for the successor to close).
    waited: list[str] = []
    closed = runs._closed

    async def recorded(run: str, execution: str, deadline: float) -> None:
        waited.append(execution)
        await closed(run, execution, deadline)

    monkeypatch.setattr(runs, "_closed", recorded)

    async def caller(c: int) -> list[str]:
        statuses = []
        for i in range(4):
            result = await runs.call_tool(
                run_id, "filesystem.write", {"path": f"notes/c{c}-{i}.txt", "content": f"{c}-{i}"}
            )
            statuses.append(result.status)
        return statuses

    outcomes = await asyncio.gather(*(caller(c) for c in range(24)))
    assert all(s == "ok" for statuses in outcomes for s in statuses), outcomes
    status = await runs.status(run_id)
    assert status.continued >= 2
    assert status.calls == 2 + 24 * 4  # hello_kiwi's own write + read, then each agent call once
    written = sorted(p.name for p in (project / "notes").glob("c*.txt"))
    assert written == sorted(f"c{c}-{i}.txt" for c in range(24) for i in range(4))
    assert waited, "no caller met the run continuing as new"
    for execution in set(waited):
        ended = await runs.client.get_workflow_handle(run_id, run_id=execution).describe()
        assert ended.status == WorkflowExecutionStatus.CONTINUED_AS_NEW, (execution, ended.status)


async def test_more_calls_at_once_than_temporal_keeps_in_flight_wait_their_turn(temporal_env, project):
    """24 callers on one run on a loaded host (s36): Temporal refuses an update past the 10 it keeps in flight
    for one execution (RESOURCE_EXHAUSTED), the SDK's own retries ran out, and the call failed with "Temporal
    refused the request". That is backpressure: the call is sent again under the same update id until the run
    takes it, and each is made once; so is one Temporal dropped when the worker came back. (No worker while
    the calls arrive, and a client whose SDK retries for 2 s,
    not 10, make the refusal certain and quick.)"""
    from temporalio.client import Client
    from temporalio.service import RetryConfig, RPCError, RPCStatusCode

    from tests.helpers import awaiting_step, run_client
    from workers.main import build_worker

    kiwis = temporal_env.client.config()  # (Kiwi's converter and seal, as every Kiwi client has)
    impatient = await Client.connect(
        temporal_env.client.service_client.config.target_host,
        namespace=temporal_env.client.namespace,
        data_converter=kiwis["data_converter"],
        interceptors=kiwis["interceptors"],
        retry_config=RetryConfig(max_elapsed_time_millis=2000),
    )
    runs = run_client(impatient, project)
    async with build_worker(temporal_env.client, runs.task_queue, sandboxed=True):
        run_id = await runs.start("hello_kiwi", {"name": "x"})
        await awaiting_step(runs, run_id, "confirm")
    refused = 0
    service = impatient.workflow_service
    send = service.update_workflow_execution

    async def counted(*args, **kwargs):  # (what the server answers, counted on its way back)
        nonlocal refused
        try:
            return await send(*args, **kwargs)
        except RPCError as exc:
            refused += exc.status == RPCStatusCode.RESOURCE_EXHAUSTED
            raise

    service.update_workflow_execution = counted
    calls = [
        asyncio.create_task(
            runs.call_tool(run_id, "filesystem.write", {"path": f"notes/c{i}.txt", "content": f"{i}"})
        )
        for i in range(12)
    ]

    async def seen() -> int | None:
        return refused or None

    await wait_for(seen, what="a call Temporal refused for the updates in flight")
    async with build_worker(temporal_env.client, runs.task_queue, sandboxed=True):
        results = await asyncio.gather(*calls)
        assert [r.status for r in results] == ["ok"] * 12, results
        assert (await runs.status(run_id)).calls == 2 + 12  # hello_kiwi's write and read, then each call once
    assert sorted(p.name for p in (project / "notes").glob("c*.txt")) == sorted(
        f"c{i}.txt" for i in range(12)
    )


async def test_a_call_sent_again_long_after_it_ran_is_answered_not_run_again(runs, project):
    # Temporal can deliver a finished call again to a later execution (temporalio/temporal#6375), as a
    # client re-sending under the same update id does: after continue-as-new and more calls than the run
    # keeps results for, the run still knows the call ran and answers with its number instead of running it.
    run_id = await hello_that_continues_every(runs, project, 10)
    args = {"path": "notes/once.txt", "content": "first"}
    first = await runs.call_tool(run_id, "filesystem.write", args, update_id="resent-call")
    assert first.status == "ok"
    for i in range(RECENT_RESULTS + 5):
        await runs.call_tool(run_id, "filesystem.write", {"path": f"notes/n{i}.txt", "content": "x"})
    (project / "notes" / "once.txt").write_text("changed since")
    before = await runs.status(run_id)
    assert before.continued >= 5

    again = await runs.call_tool(run_id, "filesystem.write", args, update_id="resent-call")
    assert again.status == "error" and again.error_type == "RunStateConflict"
    assert f"already ran as call #{first.call_seq}" in again.reason
    assert (await runs.status(run_id)).calls == before.calls
    assert (project / "notes" / "once.txt").read_text() == "changed since"


async def test_a_run_past_its_continue_as_new_limit_finishes_when_its_last_step_is_completed(runs, project):
    # The run used to continue-as-new after its last step, waiting for complete_step to return, while
    # complete_step waited for the run to finish: neither ever did.
    write(project / ".ai" / "config" / "agent_harness.yaml", "runs:\n  continue_as_new_after_updates: 2\n")
    run_id = await runs.start("hello_kiwi", {"name": "Flo"})
    await awaiting(runs, run_id, "confirm")
    for _ in range(3):
        assert (await runs.call_tool(run_id, "filesystem.read", {"path": "notes/hello.md"})).status == "ok"
    done = await asyncio.wait_for(runs.complete_step(run_id, "confirm", {"confirmed": True}), 60)
    assert done.status == "completed" and done.next_step is None
    assert (await runs.handle(run_id).result()).status == "completed"


async def test_a_call_sent_while_the_run_drains_for_continue_as_new_lands_once_in_the_successor(
    runs, project
):
    # A call waiting for approval keeps the run draining (it continues-as-new only when every handler
    # has finished); a call sent meanwhile is refused as 'continuing', waits for the successor run and
    # is sent again there: it runs once, after the approved call, in the new execution.
    tidy_that_continues_after_two_calls(project)
    run_id = await runs.start("tidy", {})
    await awaiting(runs, run_id, "work")
    delete = asyncio.create_task(runs.call_tool(run_id, "filesystem.delete", {"path": "notes/old.txt"}))

    async def pending():
        return [a for a in (await runs.status(run_id)).approvals if a.status == "pending"] or None

    (request,) = await wait_for(pending, what="the approval request")
    first = await runs.call_tool(run_id, "filesystem.write", {"path": "notes/a.txt", "content": "a"})
    assert first.status == "ok"  # the second update: the run now drains, waiting on the delete
    late = asyncio.create_task(
        runs.call_tool(run_id, "filesystem.write", {"path": "notes/b.txt", "content": "b"})
    )
    await runs.decide_approval(run_id, request.request_id, True, by="alice")
    assert (await delete).status == "ok"
    assert (await late).status == "ok"
    status = await runs.status(run_id)
    assert status.continued >= 1 and status.calls == 3
    assert (project / "notes" / "b.txt").read_text() == "b" and not (project / "notes" / "old.txt").exists()


def tidy_that_continues_after_two_calls(project) -> None:
    """A 'tidy' directive whose runs continue-as-new after two calls; deleting needs alice's approval."""
    write(
        project / ".ai" / "config" / "agent_harness.yaml",
        "runs:\n  continue_as_new_after_updates: 2\napprovals:\n  tools: [filesystem.delete]\n",
    )
    approver("alice")
    grants = '<read resource="filesystem" path="**"/><write resource="filesystem" path="notes/**"/>'
    write_directive(
        project / ".ai" / "directives" / "tidy.md",
        directive_md('<step name="work"><action>Tidy.</action></step>', name="tidy", permissions=grants),
    )
    write(project / "notes" / "old.txt", "old")


async def test_long_runs_continue_as_new_and_callers_never_notice(runs, project):
    run_id = await hello_that_continues_every(runs, project, 15)
    for i in range(50):
        result = await runs.call_tool(
            run_id, "filesystem.write", {"path": f"notes/n{i}.txt", "content": str(i)}
        )
        assert result.status == "ok", result
    status = await runs.status(run_id)
    assert status.continued >= 2 and status.calls == 52
    await runs.complete_step(run_id, "confirm", {"ok": True})
    result = await runs.handle(run_id).result()
    assert result.status == "completed" and result.calls == 52
    records = read_audit(str(project), run_id)
    assert [r["seq"] for r in records] == list(range(1, len(records) + 1))
    assert sum(1 for r in records if r["event"] == "tool_call") == 52


async def kiwi_cli(*argv: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """Run the real `kiwi` command line in a child process (``env``: variables added)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "kiwi",
        *argv,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, **(env or {})},
    )
    out, err = await proc.communicate()
    return proc.returncode, out.decode(), err.decode()


async def test_cli_run_status_complete_and_audit(runs, project, temporal_env):
    target = temporal_env.client.service_client.config.target_host
    common = ["--address", target, "--task-queue", runs.task_queue]
    code, out, err = await kiwi_cli("run", "hello_kiwi", "--input", "name=Gus", "--wait", "--json", *common)
    assert code == 0, err
    status = json.loads(out)
    assert status["status"] == "awaiting_agent" and status["current_step"]["name"] == "confirm"
    run_id = status["run_id"]
    code, out, err = await kiwi_cli("complete-step", run_id, "confirm", "--output", "confirmed=true", *common)
    assert code == 0 and "run is completed" in out, err
    code, out, _ = await kiwi_cli("status", run_id, "--json", *common)
    assert json.loads(out)["steps"][2]["outputs"] == {"confirmed": True}
    code, out, _ = await kiwi_cli("audit", run_id, env={"TZ": "Asia/Kolkata"})
    assert code == 0 and "run_finished" in out
    assert out.splitlines()[0].split() == ["SEQ", "TIME", "EVENT", "DECISION", "TOOL/STEP", "DETAIL"], out
    # Times in local time, as every time the CLI prints as text (README trial s39: UTC here alone).
    first = next(r for r in read_audit(str(project), run_id) if r["event"] == "run_started")
    local = datetime.fromisoformat(first["time"]).astimezone(ZoneInfo("Asia/Kolkata"))
    assert f"{local:%Y-%m-%d %H:%M:%S}." in out.splitlines()[1], (first["time"], out)
    # What each call was asked and by whom, then its answer (README trial s38: only the result showed).
    code, out, _ = await kiwi_cli("audit", run_id, "--event", "tool_call")
    rows = out.splitlines()[1:]
    assert code == 0 and rows and all(" tool_call " in row for row in rows), out
    assert any("filesystem.write" in row and "notes/hello.md [step] ->" in row for row in rows), out
    code, out, err = await kiwi_cli("audit", run_id, "--decision", "denied", "--json")
    assert code == 0 and json.loads(out) == [], out
    assert "no record of this trail has decision 'denied'" in err, err
    code, out, err = await kiwi_cli("audit", run_id, "--event", "toolcall")
    assert "no record of this trail has event 'toolcall'; did you mean 'tool_call'?" in err, err
    code, out, _ = await kiwi_cli("runs", "--status", "completed", *common)
    assert run_id in out
    code, _, err = await kiwi_cli("complete-step", run_id, "confirm", *common)
    assert code == 1 and "has finished" in err
    code, _, err = await kiwi_cli("run", "hello_kiwi", *common)
    assert code == 1 and "required input 'name'" in err and "Traceback" not in err


async def test_calls_outside_a_run_go_through_the_session_and_base_policy(runs, project):
    (project / "readme.txt").write_text("hi")
    read = await runs.session_call("alice", "filesystem.read", {"path": "readme.txt"})
    assert read.status == "ok" and read.result["content"] == "hi"
    write_ = await runs.session_call("alice", "filesystem.write", {"path": "x.txt", "content": "no"})
    assert write_.status == "denied" and not (project / "x.txt").exists()
    counted = await runs.session_call("alice", "word_count", {"text": "a b c"})
    assert counted.status == "ok" and counted.result["words"] == 3
    blocked = await runs.session_call("alice", "shell.run", {"command": "sudo ls"})
    assert blocked.status == "denied" and "blocked" in blocked.reason
    session = session_workflow_id(project)
    status = await runs.status(session)
    assert status.calls == 4 and status.status == "awaiting_agent"

    async def audited():
        found = [
            (r["decision"], r["client"])
            for r in read_audit(str(project), session)
            if r["event"] == "tool_call"
        ]
        return found if len(found) == 4 else None

    assert [d for d, _ in await wait_for(audited, what="session audit records")] == [
        "allowed",
        "denied",
        "allowed",
        "denied",
    ]


async def test_a_new_client_name_does_not_reset_the_sessions_rate_budget(runs, project):
    """The attack: exhaust the base policy's budget, then call again under another --client name."""
    write(
        project / ".ai" / "config" / "agent_harness.yaml",
        "internal_tools:\n  filesystem:\n    read: ['**']\nrate_limits:\n  filesystem.read: 2\n",
    )
    (project / "readme.txt").write_text("hi")
    for client in ("alice", "alice"):
        assert (await runs.session_call(client, "filesystem.read", {"path": "readme.txt"})).status == "ok"
    again = await runs.session_call("mallory-new-name", "filesystem.read", {"path": "readme.txt"})
    assert again.status == "rate_limited" and "filesystem.read" in again.reason
    status = await runs.status(session_workflow_id(project))
    assert [c.status for c in status.last_calls] == ["ok", "ok", "rate_limited"]


async def test_the_session_follows_the_base_policy_the_project_files_give_now(runs, project, monkeypatch):
    # A new-user trial: after a line added to internal_tools (or `kiwi tools accept`), calls outside a run
    # were still refused by the policy the project's session started with, until someone cancelled the
    # session; a grant taken out of internal_tools went on being honoured the same way.
    import kiwi.runs.starting

    harness = project / ".ai" / "config" / "agent_harness.yaml"
    (project / "readme.txt").write_text("hi")
    write(harness, "internal_tools:\n  filesystem:\n    read: ['docs/**']\n")
    before = await runs.session_call("agent", "filesystem.read", {"path": "readme.txt"})
    assert before.status == "denied", before
    # Granted a moment later, well inside the client's check interval: the refusal makes it look again.
    write(harness, "internal_tools:\n  filesystem:\n    read: ['**']\n")
    granted = await runs.session_call("agent", "filesystem.read", {"path": "readme.txt"})
    assert granted.status == "ok" and granted.result["content"] == "hi", granted
    # Taken out again: refused from the client's next look (made at every call here).
    monkeypatch.setattr(kiwi.runs.starting, "SESSION_CHECK_SECONDS", 0.0)
    write(harness, "internal_tools:\n  filesystem:\n    read: ['docs/**']\n")
    revoked = await runs.session_call("agent", "filesystem.read", {"path": "readme.txt"})
    assert revoked.status == "denied", revoked
    # One session after the other, each taking on the last one's count: denied, denied (the old policy),
    # then ok and denied in the sessions that replaced it.
    assert (await runs.status(session_workflow_id(project))).calls == 4


async def test_the_session_is_no_run_waiting_for_work(runs, project):
    # A new-user trial: `kiwi runs --status awaiting_agent` (how the walkthrough finds work) listed the
    # project's session, and `kiwi status` of it said to complete its step, which ended the session.
    from kiwi.cli.progress import answers

    (project / "readme.txt").write_text("hi")
    write(
        project / ".ai" / "config" / "agent_harness.yaml",
        "internal_tools:\n  filesystem:\n    read: ['**']\n",
    )
    assert (await runs.session_call("agent", "filesystem.read", {"path": "readme.txt"})).status == "ok"
    run_id = await runs.start("hello_kiwi", {"name": "Ada"})
    await awaiting(runs, run_id, "confirm")
    session = session_workflow_id(project)

    async def listed() -> list[str] | None:
        ids = [r["run_id"] for r in await runs.list_runs(status="awaiting_agent")]
        return ids if run_id in ids else None  # (visibility catches up with the run)

    assert await wait_for(listed, what="the run listed") == [run_id]
    listed = await runs.list_runs(status="awaiting_agent", sessions=True)  # `kiwi runs --sessions`
    assert {r["run_id"] for r in listed} == {run_id, session}
    told = answers(await runs.status(session))
    assert len(told) == 1 and "the project's session" in told[0] and "complete-step" not in told[0], told
    assert "complete-step" in answers(await runs.status(run_id))[0]


async def test_a_limited_list_of_runs_leaves_the_session_out_before_it_counts(runs, project):
    """README trial s34: `kiwi runs --limit 1` answered nothing when the first execution Temporal listed was
    the project's session (filtered out after the limit was taken)."""
    run_id = await runs.start("hello_kiwi", {"name": "Ada"})
    await awaiting(runs, run_id, "confirm")
    (project / "readme.txt").write_text("hi")
    assert (await runs.session_call("agent", "filesystem.read", {"path": "readme.txt"})).status == "ok"
    session = session_workflow_id(project)

    async def session_first() -> bool:
        return [r["run_id"] for r in await runs.list_runs(limit=1, sessions=True)] == [session]

    await wait_for(session_first, what="the newer session listed first")
    assert [r["run_id"] for r in await runs.list_runs(limit=1)] == [run_id]


async def test_loop_warnings_stop_the_run_as_stuck_until_a_human_resumes_it(runs, project):
    write(
        project / ".ai" / "config" / "agent_harness.yaml",
        "loop_detection:\n  repeat_threshold: 2\n  max_warnings: 2\n",
    )
    approver("ops")
    run_id = await runs.start("hello_kiwi", {"name": "Lo"})
    await awaiting(runs, run_id, "confirm")
    same = {"path": "notes/hello.md"}
    results = [await runs.call_tool(run_id, "filesystem.read", same) for _ in range(3)]
    assert [bool(r.warnings) for r in results] == [False, True, True]
    status = await runs.status(run_id)
    assert status.status == "stuck" and "kiwi resume" in status.waiting_for
    assert status.continued == 0  # waking to flush the audit must not continue-as-new

    async def listed():  # the visibility store catches up with the search attribute a moment later
        return [r["run_id"] for r in await runs.list_runs(status="stuck")] == [run_id]

    await wait_for(listed, what="the stuck run in `kiwi runs --status stuck`")
    with pytest.raises(RunStateConflict, match="must resume it"):
        await runs.call_tool(run_id, "filesystem.read", {"path": "notes/hello.md"})
    with pytest.raises(RunStateConflict, match="must resume it"):
        await runs.complete_step(run_id, "confirm", {})
    # The agent (or a tool it runs) sending the resume signal itself: refused, recorded, still stuck.
    await runs.handle(run_id).signal("resume", ResumeRequest(reason="I am fine", by="ops"))
    refused = await wait_for(lambda: _refused(runs, run_id), what="the unsigned resume to be refused")
    assert refused[0].by == "ops" and "not signed by ops's key" in refused[0].reason
    assert (await runs.status(run_id)).status == "stuck"
    await runs.resume(run_id, "looked at it", by="ops")
    await wait_for(lambda: _status_is(runs, run_id, "awaiting_agent"), what="resume")
    assert (await runs.call_tool(run_id, "filesystem.list", {"path": "notes"})).status == "ok"
    assert (await runs.complete_step(run_id, "confirm", {})).status == "completed"


async def test_an_agent_stuck_too_often_goes_to_a_human(runs, project):
    from kiwi.contracts import HelpRequest

    run_id = await runs.start("hello_kiwi", {"name": "Hu"})
    await awaiting(runs, run_id, "confirm")
    await runs.help(run_id, HelpRequest(kind="stuck", reason="tests keep failing", attempts=2))
    assert (await runs.status(run_id)).status == "awaiting_agent"
    await runs.help(run_id, HelpRequest(kind="stuck", reason="still failing", attempts=5))
    status = await wait_for(lambda: _held(runs, run_id), what="awaiting_human")
    assert "5 attempts: still failing" in status.waiting_for
    assert [h.kind for h in status.help] == ["stuck", "stuck"]

    async def listed():  # the visibility store catches up with the search attribute a moment later
        return run_id in [r["run_id"] for r in await runs.list_runs(status="awaiting_human")]

    await wait_for(listed, what="the held run in `kiwi runs --status awaiting_human`")


async def _held(runs, run_id):
    status = await runs.status(run_id)
    return status if status.status == "awaiting_human" else None


async def _refused(runs, run_id):
    return (await runs.status(run_id)).refused_decisions


async def test_a_pending_call_is_polled_after_the_run_continued_as_new(runs, project):
    """The call answered 'pending', finished in the execution that then continued-as-new: its answer is
    still there for poll (and for an MCP task), read from the execution that ran it."""
    tidy_that_continues_after_two_calls(project)
    run_id = await runs.start("tidy", {})
    await awaiting(runs, run_id, "work")
    pending = await runs.call_tool_waiting(
        run_id, "filesystem.delete", {"path": "notes/old.txt"}, client_name="agent", wait_seconds=0.5
    )
    assert pending.status == "pending"
    call_id = pending.result["call_id"]
    first = await runs.call_tool(run_id, "filesystem.write", {"path": "notes/a.txt", "content": "a"})
    assert first.status == "ok"  # the second update: the run drains, then continues-as-new
    (request,) = [a for a in (await runs.status(run_id)).approvals if a.status == "pending"]
    await runs.decide_approval(run_id, request.request_id, True, by="alice")

    async def continued():
        return (await runs.status(run_id)).continued >= 1

    await wait_for(continued, what="the run to continue-as-new")
    answer = await runs.poll_call(run_id, call_id, wait_seconds=5)
    assert answer.status == "ok" and answer.tool == "filesystem.delete", answer
    assert not (project / "notes" / "old.txt").exists()
    with pytest.raises(KiwiError, match=f"run {run_id} has no call 'nope'"):
        await runs.poll_call(run_id, "nope", wait_seconds=1)
    with pytest.raises(RunNotFound):
        await runs.poll_call("run-none-0", call_id, wait_seconds=1)


def test_a_request_temporal_cut_off_is_told_apart_from_a_refusal():
    """A request cut off or unanswered (the server restarting) is TemporalUnavailable, which callers retry;
    any other RPC error stays a refusal. (The chaos bench's players stopped on 'Temporal refused the
    request: context canceled' while the dev server was killed.)"""
    from temporalio.service import RPCError, RPCStatusCode

    from kiwi.errors import TemporalUnavailable
    from kiwi.runs.shared import _translate

    for status in (RPCStatusCode.UNAVAILABLE, RPCStatusCode.CANCELLED, RPCStatusCode.DEADLINE_EXCEEDED):
        cut = _translate(RPCError("context canceled", status, b""), "run-x")
        assert isinstance(cut, TemporalUnavailable) and "try again" in cut.hint, cut
    dropped = _translate(RPCError("transport error", RPCStatusCode.UNKNOWN, b""), "run-x")
    assert isinstance(dropped, TemporalUnavailable), dropped
    odd = _translate(RPCError("something else", RPCStatusCode.UNKNOWN, b""), "run-x")
    assert type(odd) is KiwiError, odd
    refused = _translate(RPCError("namespace not found", RPCStatusCode.INVALID_ARGUMENT, b""), "run-x")
    assert (
        type(refused) is KiwiError and refused.message == "Temporal refused the request: namespace not found"
    )


async def test_refused_calls_outside_a_run_look_at_the_session_a_bounded_number_of_times(
    runs, project, monkeypatch
):
    # Each refusal makes the client compare the session's base policy with the files (two reads of the
    # session): an agent's stream of refused calls must not turn into as many reads.
    import kiwi.runs.starting

    (project / "readme.txt").write_text("hi")
    looks = 0
    compare = kiwi.runs.starting._base_policy

    def counted(snapshot):
        nonlocal looks
        looks += 1
        return compare(snapshot)

    kiwi.runs.starting._base_policy = counted
    # The client's clock stands still: every call falls in the same second, whatever this host's speed.
    monkeypatch.setattr(kiwi.runs.starting, "time", SimpleNamespace(monotonic=lambda: 1000.0))
    try:
        first = ""
        for _ in range(20):
            refused = await runs.session_call("agent", "filesystem.write", {"path": "x.txt", "content": "no"})
            assert refused.status == "denied"
            first = first or (await runs.handle(runs.session_id).describe()).run_id
    finally:
        kiwi.runs.starting._base_policy = compare
    # Nothing changed in the files: the session those looks compared is the one that took the first call
    # (a policy read back from its history that differed from the files' would replace it on every look).
    assert (await runs.handle(runs.session_id).describe()).run_id == first
    # The first call's look (no session yet: the files' policy alone), then two comparisons (the files' policy
    # and the session's) for each of at most SESSION_RECHECKS looks after refusals: each of the 19 refusals
    # after it had one before.
    assert looks == 1 + 2 * kiwi.runs.starting.SESSION_RECHECKS, looks


async def test_a_call_outside_a_run_waiting_for_approval_is_listed_with_the_others(runs, project):
    # `kiwi approvals` lists the session's requests too: the session is left out of `kiwi runs` only.
    write(
        project / ".ai" / "config" / "agent_harness.yaml",
        "internal_tools:\n  filesystem:\n    write: ['notes/**']\napprovals:\n  tools: [filesystem.write]\n",
    )
    waiting = await runs.session_call(
        "agent", "filesystem.write", {"path": "notes/x.txt", "content": "x"}, wait_seconds=0.5
    )
    assert waiting.status == "pending", waiting

    async def listed():
        found = [a for a in await runs.pending_approvals() if a["run_id"] == runs.session_id]
        return found or None

    (request,) = await wait_for(listed, what="the session's approval request listed")
    assert request["tool"] == "filesystem.write"
    assert not (project / "notes" / "x.txt").exists()
    await runs.cancel(runs.session_id)


async def test_a_deadline_that_passes_during_an_automatic_step_ends_the_run_before_its_next_call(
    runs, project
):
    """README trial s34: `kiwi run slow --deadline 5` of automatic steps that took 20 s completed: the deadline was
    checked only while a step waited for the agent. It is checked before each call of an automatic step too (a
    call already running is not stopped: its own timeout bounds it)."""
    from tests.helpers import write_slow_steps

    write_slow_steps(project)
    run_id = await runs.start("slow", {}, deadline_seconds=1.0)
    with pytest.raises(Exception):  # noqa: B017 - the run timed out; its status says why
        await runs.handle(run_id).result()
    status = await runs.status(run_id)
    assert status.status == "timed_out", status
    assert status.error == "run deadline of 1s passed before step 'write' called filesystem.write", (
        status.error
    )
    assert not (project / "notes" / "late.txt").exists()
    assert status.calls == 1
