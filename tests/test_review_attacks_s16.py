"""Review s16: attacks on "a held run holds its running child runs" (PARENT_HOLDS_CHILDREN), as a hostile
agent would make them against the real stack (a Temporal dev server, the sandboxed worker, real files). The
agent calls tools through RunClient and can send any signal to any workflow; it cannot sign as an approver.

Tried, and the outcome:

- a grandchild started before the hold (parent -> child -> grandchild, all from the agent): held with the
  parent; ``resume_with_children`` lifts all three. Safe.
- a child that continued-as-new before the hold (``workflow.info().parent`` survives continue-as-new), and
  a parent that continued-as-new after starting its child (its child records travel in the carried
  state): the child still holds. Safe.
- a child a parent's STEP runs (the parent waits for it) while the agent loops in the parent: held. Safe.
- re-sticking the parent during the resume cascade: the agent loops the parent into ``stuck`` again right
  after the approver's resume is taken and before ``kiwi resume`` reaches the child; the child (still held,
  so the new notice changed nothing) was then resumed by the cascade and ran free while its parent was
  stuck. Fixed: the cascade skips a child whose parent is held again when it signs for it
  (kiwi/runs.py), and a child held for its parent renews its hold (new hold id) on a new notice from it,
  so a resume signed for the old hold is refused (workflows, behind PARENT_HOLDS_CHILDREN).
- answering a child's own escalation while it is held for its parent (``awaiting_human``): the signed
  answer released the child, though it was held for its parent, not for the question. Fixed: an answer
  lifts only a hold of the run's own (behind PARENT_HOLDS_CHILDREN); the parent's resume lifts the rest.
- a child's own hold whose text the agent chooses (an escalation's reason and id) made to read as the
  parent-hold reason: ``kiwi resume PARENT`` does not lift it (kiwi writes the prefix). Safe.
- a child held for its own question (or loop) when the parent held: the parent's notice was dropped, so
  the human's answer to the child (or its resume) alone freed it while the parent was held. Fixed: the
  notice is kept (parent_hold_pending) and lifting the own hold holds the child for its parent instead.
- (the other side) a parent a human released alone (its question answered): `kiwi resume PARENT` refused
  and left the children held for it, though their reason names that command. Fixed: it resumes them.
- calls streamed to the child while the agent loops the parent into `stuck`: the child holds before the
  parent's call even answers (the notice leaves with the task that held the parent); bounded. Safe.
- odd ``parent_held`` payloads (wrong types, a huge parent id, a status outside the held ones), a notice
  to a finished child and to the project's session workflow: no workflow task fails, the runs carry on,
  and no hold follows. Safe.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from temporalio.service import RPCError

from activities.audit import read_audit
from kiwi.contracts import ParentHeld, parent_hold_reason
from kiwi.errors import DecisionRefused, RunStateConflict
from kiwi.keys import human_message, sign_bytes
from kiwi.runs import RunClient
from tests.helpers import (
    approver,
    awaiting_step,
    directive_md,
    start_parent_with_child,
    wait_for,
    write,
    write_directive,
    write_parent_and_child,
)
from workflows.directive_run import DirectiveRun

pytestmark = pytest.mark.temporal

READS = '<read resource="filesystem" path="notes/**"/>'
RUNS = '<execute resource="tool" id="directive.run"/>'


_family = write_parent_and_child


async def _child(runs: RunClient, parent: str, directive: str = "helper") -> str:
    return (await runs.call_tool(parent, "directive.run", {"directive": directive})).result["run_id"]


async def _stick(runs: RunClient, run_id: str) -> None:
    """The agent loops in ``run_id`` until it is stuck."""
    for _ in range(2):  # (after a resume, the first repeat is already a warning: the window remembers)
        await asyncio.wait_for(runs.call_tool(run_id, "filesystem.read", {"path": "notes/a.txt"}), 60)
        if (await runs.status(run_id)).status == "stuck":
            return
    raise AssertionError(f"{run_id} did not get stuck")


async def _held(runs: RunClient, run_id: str, status: str = "stuck"):
    async def probe():
        now = await runs.status(run_id)
        return now if now.status == status else None

    return await wait_for(probe, what=f"{run_id} to be {status}")


async def _renewed(runs: RunClient, run_id: str, hold_id: str):
    async def probe():
        now = await runs.status(run_id)
        return now if now.hold_id not in ("", hold_id) else None

    return await wait_for(probe, what=f"{run_id} to renew its hold on its parent's new notice")


async def _refused(runs: RunClient, run_id: str) -> None:
    with pytest.raises(RunStateConflict):
        await asyncio.wait_for(runs.call_tool(run_id, "filesystem.read", {"path": "notes/b.txt"}), 60)


async def _no_failed_tasks(runs: RunClient, run_id: str) -> None:
    """The run took every signal it was sent (they are in its history) and no workflow task failed."""
    events = json.loads((await runs.handle(run_id).fetch_history()).to_json())["events"]
    kinds = [e["eventType"] for e in events]
    assert kinds.count("EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED") >= 3, kinds
    assert "EVENT_TYPE_WORKFLOW_TASK_FAILED" not in kinds, [e for e in events if "Failed" in e["eventType"]]


async def test_attack_a_grandchild_started_before_the_hold_is_held_and_resumed_with_it(runs, project):
    """Attack: the agent starts a child, and from it a grandchild, then loops the parent until it is stuck
    and carries on in the grandchild. Safe: the hold goes down the family; resuming the parent lifts all."""
    approver("alice")
    _family(project)
    parent, child = await start_parent_with_child(runs)
    grandchild = await _child(runs, child)
    await awaiting_step(runs, grandchild, "help")
    await _stick(runs, parent)
    held = await _held(runs, grandchild)
    assert held.hold_reason == parent_hold_reason(child, "stuck"), held.hold_reason
    await _refused(runs, grandchild)
    with pytest.raises(RunStateConflict):
        await runs.complete_step(grandchild, "help", {"done": True})
    assert await runs.resume_with_children(parent, "looked", by="alice") == (True, [child, grandchild])
    assert (await runs.status(grandchild)).status == "awaiting_agent"


async def test_attack_a_child_that_continued_as_new_still_holds(runs, project):
    """Attack: the agent makes its child continue-as-new first (a new Temporal run of it), hoping the new run
    no longer knows its parent and ignores the notice. Safe: the parent survives continue-as-new."""
    _family(project, helper_steps=("one", "two"), harness="runs:\n  continue_as_new_after_updates: 2\n")
    parent = await runs.start("boss", {})
    await awaiting_step(runs, parent, "lead")
    child = await _child(runs, parent)
    await awaiting_step(runs, child, "one")
    await runs.call_tool(child, "filesystem.read", {"path": "notes/a.txt"})
    await runs.complete_step(child, "one", {"done": True})
    await awaiting_step(runs, child, "two")
    assert (await runs.status(child)).continued >= 1
    await _stick(runs, parent)
    held = await _held(runs, child)
    assert held.hold_reason == parent_hold_reason(parent, "stuck")
    await _refused(runs, child)


async def test_attack_a_parent_that_continued_as_new_still_holds_its_child(runs, project):
    """Attack: the parent continues-as-new after starting the child (the Temporal run that started the child
    is closed), then the agent loops the parent. Safe: the new run still holds the child it carries."""
    _family(project, boss_steps=("lead", "more"), harness="runs:\n  continue_as_new_after_updates: 2\n")
    parent = await runs.start("boss", {})
    await awaiting_step(runs, parent, "lead")
    child = await _child(runs, parent)
    await runs.complete_step(parent, "lead", {"done": True})
    await awaiting_step(runs, parent, "more")
    assert (await runs.status(parent)).continued >= 1
    await awaiting_step(runs, child, "help")
    await _stick(runs, parent)
    await _held(runs, child)
    await _refused(runs, child)


async def test_attack_a_child_the_parents_step_runs_is_held_while_the_agent_loops_in_the_parent(
    runs, project
):
    """Attack: the parent's own step runs a child (the parent waits for it); meanwhile the agent calls tools
    in the parent until it is stuck, and goes on in the child. Safe: the child holds too."""
    _family(project)
    write_directive(
        project / ".ai" / "directives" / "stepper.md",
        directive_md(
            '<step name="delegate"><tool_call tool="directive.run"><param name="directive">helper</param>'
            "</tool_call></step>",
            name="stepper",
            permissions=READS + RUNS,
        ),
    )
    parent = await runs.start("stepper", {})

    async def started():
        return [c.run_id for c in (await runs.status(parent)).children]

    (child,) = await wait_for(started, what="the step's child to start")
    await awaiting_step(runs, child, "help")
    await _stick(runs, parent)
    held = await _held(runs, child)
    assert held.hold_reason == parent_hold_reason(parent, "stuck")
    await _refused(runs, child)


async def test_attack_resticking_the_parent_during_the_resume_cascade_frees_no_child(
    runs, project, monkeypatch
):
    """Attack: right after the approver's resume of the parent is taken, and before `kiwi resume` gets to the
    child, the agent loops the parent into `stuck` again. The child is still held from the first hold (the
    second notice found it held), its reason still names the parent, so the cascade used to resume it: the
    agent went on in the child while the parent was stuck. Safe: a child whose parent is held again is not
    resumed; the parent's next resume lifts both."""
    approver("alice")
    _family(project)
    parent, child = await start_parent_with_child(runs)
    await _stick(runs, parent)
    before = await _held(runs, child)
    real = RunClient._resume_one

    async def resume_then_agent_loops(self, run_id, reason, by, **kwargs):
        taken = await real(self, run_id, reason, by, **kwargs)
        if run_id == parent:
            await _stick(runs, parent)  # the agent, in the window
        return taken

    monkeypatch.setattr(RunClient, "_resume_one", resume_then_agent_loops)
    assert await runs.resume_with_children(parent, "looked", by="alice") == (True, [])
    assert (await runs.status(parent)).status == "stuck"
    assert (await runs.status(child)).status == "stuck"
    await _refused(runs, child)
    monkeypatch.setattr(RunClient, "_resume_one", real)
    renewed = await _renewed(runs, child, before.hold_id)
    assert renewed.hold_reason == parent_hold_reason(parent, "stuck")
    assert await runs.resume_with_children(parent, "looked again", by="alice") == (True, [child])


async def test_attack_a_resume_signed_for_a_childs_hold_before_its_parent_held_again_is_refused(
    runs, project
):
    """Attack (the other order of the race above): the cascade has read the child's hold and checked the
    parent is not held; the agent then loops the parent into `stuck` again, and the notice reaches the child
    before the approver's signed resume does. Safe: the child renews its hold on the new notice, so the
    resume signed for the old hold is refused and the child stays held."""
    approver("alice")
    _family(project)
    parent, child = await start_parent_with_child(runs)
    await _stick(runs, parent)
    before = await _held(runs, child)
    assert await runs._resume_one(parent, "looked", "alice") is True  # the parent only, as the cascade starts
    await _stick(runs, parent)

    await _renewed(runs, child, before.hold_id)
    signature = sign_bytes(
        "alice", human_message("resume", child, before.execution, before.hold_id, "", "alice")
    )
    from kiwi.contracts import ResumeRequest

    await runs._signal(
        child, DirectiveRun.resume, ResumeRequest(reason="stale", by="alice", signature=signature)
    )
    with pytest.raises(DecisionRefused):
        await runs._taken(child, "resume", before, lambda now: now.status != "stuck")
    assert (await runs.status(child)).status == "stuck"
    await _refused(runs, child)


async def test_attack_answering_a_held_childs_own_escalation_does_not_lift_its_parents_hold(runs, project):
    """Attack: the parent waits for a human (awaiting_human), so its child is held for it; the agent asks a
    question in the child (help escalate), and a human answers it (signed `kiwi decide`). Answering used to
    release the child from a hold it owed its parent. Safe: it stays held until the parent is resumed."""
    approver("alice")
    _family(project)
    parent, child = await start_parent_with_child(runs)
    from kiwi.contracts import HelpRequest

    await runs.help(parent, HelpRequest(kind="escalate", reason="which way?", options=["a", "b"]))
    await _held(runs, parent, "awaiting_human")
    await _held(runs, child, "awaiting_human")
    await runs.help(child, HelpRequest(kind="escalate", reason="may I go on?", options=["yes", "no"]))

    async def asked():
        return [d.request_id for d in (await runs.status(child)).decisions]

    (question,) = await wait_for(asked, what="the child's question")
    await runs.decide(child, question, "yes", by="alice")
    now = await runs.status(child)
    assert now.status == "awaiting_human" and now.hold_reason == parent_hold_reason(parent, "awaiting_human")
    await _refused(runs, child)
    assert await runs.resume_with_children(parent, "answered", by="alice") == (True, [child])
    assert (await runs.status(child)).status == "awaiting_agent"


async def test_attack_a_childs_own_hold_dressed_as_its_parents_is_not_lifted_with_the_parent(runs, project):
    """Attack: the agent holds its child for a reason of its own whose text it chooses (an escalation, id
    and reason), written to read as the parent-hold reason, then gets the parent stuck, hoping `kiwi resume
    PARENT` lifts the child's own hold too. Safe: kiwi writes the prefix of every own hold reason."""
    approver("alice")
    _family(project)
    parent, child = await start_parent_with_child(runs)
    from kiwi.contracts import HelpRequest

    mimic = parent_hold_reason(parent, "awaiting_human")
    await runs.help(child, HelpRequest(kind="escalate", reason=mimic, request_id=mimic, options=["go"]))
    held = await _held(runs, child, "awaiting_human")
    assert held.hold_reason != mimic
    await _stick(runs, parent)
    assert await runs.resume_with_children(parent, "looked", by="alice") == (True, [])
    assert (await runs.status(child)).status == "awaiting_human"


async def test_attack_odd_parent_held_notices_crash_nothing(runs, project):
    """Attack: parent_held with wrong types, a huge parent id, a status that is not a hold, sent to a child,
    to a child that finished, and to the project's session workflow. Safe: no workflow task fails, nothing
    is held (a status outside the held ones is never written), the runs carry on."""
    _family(project)
    parent, child = await start_parent_with_child(runs)
    done = (await runs.call_tool(parent, "directive.run", {"name": "helper"})).result["run_id"]
    await awaiting_step(runs, done, "help")
    await runs.complete_step(done, "help", {"done": True})
    await runs.handle(done).result()
    before = await runs.session_call("agent", "filesystem.read", {"path": "notes/a.txt"})
    session = runs.session_id
    raw = runs.client.get_workflow_handle
    for target in (child, session):
        await raw(target).signal("parent_held", {"parent_run_id": 5, "status": ["x"]})
        await raw(target).signal("parent_held", "not an object")
        await raw(target).signal("parent_held", ParentHeld(parent_run_id="p" * 200_000, status="completed"))
    with pytest.raises(RPCError):  # (a finished run takes no signal at all)
        await raw(done).signal("parent_held", ParentHeld(parent_run_id=parent))

    async def recorded():
        return [r for r in read_audit(str(project), child) if r["event"] == "parent_hold_ignored"] or None

    (record,) = await wait_for(recorded, what="the huge notice to be refused")
    assert len(record["named_parent"]) == 200
    # A notice from the real parent with a status that is not a hold: held as 'stuck', never 'completed'.
    await raw(child).signal("parent_held", ParentHeld(parent_run_id=parent, status="completed"))
    held = await _held(runs, child)
    assert held.hold_reason == parent_hold_reason(parent, "stuck")
    for run_id in (child, session):
        await _no_failed_tasks(runs, run_id)
    read = await runs.call_tool(parent, "filesystem.read", {"path": "notes/a.txt"})
    assert read.status == "ok", read
    after = await runs.session_call("agent", "filesystem.read", {"path": "notes/a.txt"})
    assert (after.status, after.error_type) == (before.status, before.error_type), after


async def test_attack_a_child_held_for_its_own_question_is_not_freed_by_the_answer_while_its_parent_is_held(
    runs, project
):
    """Attack: the agent asks a question in the child first (its own hold), then loops the parent into
    `stuck`: the parent's notice found the child already held and was dropped, so a human answering the
    child's question let the agent on in the child while the parent was stuck. Safe: the notice is kept,
    the answer holds the child for its parent instead, and `kiwi resume PARENT` then lifts both."""
    approver("alice")
    _family(project)
    parent, child = await start_parent_with_child(runs)
    from kiwi.contracts import HelpRequest

    await runs.help(child, HelpRequest(kind="escalate", reason="may I go on?", options=["yes", "no"]))
    held = await _held(runs, child, "awaiting_human")
    await _stick(runs, parent)

    async def deferred():
        return [r for r in read_audit(str(project), child) if r["event"] == "parent_hold_deferred"] or None

    await wait_for(deferred, what="the child to keep its parent's notice")
    (question,) = [d.request_id for d in (await runs.status(child)).decisions]
    await runs.decide(child, question, "yes", by="alice")
    now = await runs.status(child)
    assert now.status == "stuck" and now.hold_reason == parent_hold_reason(parent, "stuck"), now
    assert now.hold_id != held.hold_id
    await _refused(runs, child)
    assert await runs.resume_with_children(parent, "looked", by="alice") == (True, [child])
    assert (await runs.status(child)).status == "awaiting_agent"


async def test_a_child_held_for_a_parent_a_human_already_released_is_resumed_by_kiwi_resume_parent(
    runs, project
):
    """Not an escape, the other side: the parent waits for a human's answer, its child holds for it; the
    answer releases the parent only, and the child's reason says `kiwi resume PARENT` resumes it, which
    refused (the parent was no longer held) and left it held. Now it resumes the children held for the
    parent; a child is still never freed by the answer alone."""
    approver("alice")
    _family(project)
    parent, child = await start_parent_with_child(runs)
    from kiwi.contracts import HelpRequest

    await runs.help(parent, HelpRequest(kind="escalate", reason="which way?", options=["a"]))
    await _held(runs, parent, "awaiting_human")
    await _held(runs, child, "awaiting_human")
    await runs.decide(parent, "decision-1", "a", by="alice")
    assert (await runs.status(parent)).status == "awaiting_agent"
    assert (await runs.status(child)).status == "awaiting_human"
    await _refused(runs, child)
    assert await runs.resume_with_children(parent, "answered", by="alice") == (False, [child])
    assert (await runs.status(child)).status == "awaiting_agent"
    with pytest.raises(RunStateConflict):  # (nothing held any more: the command says so)
        await runs.resume_with_children(parent, "again", by="alice")


async def test_attack_calls_streamed_to_the_child_while_the_parent_gets_stuck_stop_within_moments(
    runs, project
):
    """Attack: the agent streams calls to its child while it loops the parent into `stuck`, to get as many
    through as it can before the child holds. Bounded: the parent's notice leaves with the workflow task
    that held it, before the parent's call answers, and the child takes it in its next task; every child
    call after that is refused. (Calls the child admitted before it are not undone, as in any held run.)"""
    _family(project)
    for i in range(400):
        write(project / "notes" / f"c{i}.txt", str(i))
    parent = await runs.start("boss", {})
    await awaiting_step(runs, parent, "lead")
    child = await _child(runs, parent)
    await awaiting_step(runs, child, "help")
    loop = asyncio.get_running_loop()
    sent: list[tuple[float, str]] = []

    async def stream() -> None:
        for i in range(400):
            at = loop.time()
            try:
                result = await runs.call_tool(child, "filesystem.read", {"path": f"notes/c{i}.txt"})
            except RunStateConflict:
                sent.append((at, "refused"))
                return
            sent.append((at, result.status))

    streaming = asyncio.ensure_future(stream())
    await awaiting_step(runs, child, "help")  # (a round trip: the stream is under way)
    await _stick(runs, parent)
    stuck_at = loop.time()
    await asyncio.wait_for(streaming, 60)
    assert sent[-1][1] == "refused", sent[-3:]
    after = [status for at, status in sent if at > stuck_at and status == "ok"]
    assert len(after) <= 5, f"{len(after)} child calls sent after the parent was stuck still ran"
    assert sent[-1][0] - stuck_at < 5
    await _refused(runs, child)
