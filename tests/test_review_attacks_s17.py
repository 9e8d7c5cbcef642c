"""Review s17: attacks on this session's changes, as a hostile agent would make them against the real stack
(a Temporal dev server, the sandboxed worker, real files): the project's session replaced when the base
policy its files give changes (RunClient._session_current / _session_carry), cancel reaching child runs,
`kiwi mcp --http` connecting lazily.

Tried, and the outcome:

- windowed rate budget across a policy change: carried. Safe.
- two front ends replacing the session at once: the second waited for the successor's result (forever).
  Fixed: _session_carry reads the execution it found; a live successor is joined.
- a pending call whose session was replaced: poll said "not made, send it again", and the same
  idempotency_key ran it twice. Fixed: answered calls carried, poll follows the replaced execution (memo).
- a stuck session ended (agent's cancel, or a harness edit) and loop warnings reset by a cancel: the
  successor was free. Fixed: loop state and the hold are carried (the successor is stuck).
- a grant taken out with a misspelt key in the harness: the old session kept the old grants. Fixed: files
  that give no policy end the session; the next call says what is wrong.
- a child run started from the session, the session replaced, then looped into stuck: the child ran on.
  Fixed: running child records (and window slots held for them) carried.
- the successor's audit records numbered from 1 again in the same file: skipped as already written. Fixed:
  audit numbering carried.
- cancel of another project's run: refused before any child is touched. Safe.
- /readyz flood while Temporal is down: probes queued on the link's lock, N x 2 s. Fixed: the time covers
  the wait for the lock.
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from kiwi.contracts import session_workflow_id
from kiwi.errors import RunInOtherProject, RunStateConflict
from kiwi.items.store import ItemStore
from kiwi.runs import RunClient
from tests.helpers import approver, wait_for, write

HARNESS = ".ai/config/agent_harness.yaml"


async def test_a_policy_change_does_not_reset_the_sessions_windowed_rate_budget(runs, project, monkeypatch):
    # The attack: the agent spends its windowed budget (2 reads a minute), then waits for anything that
    # changes the base policy (a human's unrelated harness edit) so the session is replaced, and calls again.
    # What must hold: the new session carries the old one's window; the third read is rate limited.
    import kiwi.runs.starting

    monkeypatch.setattr(kiwi.runs.starting, "SESSION_CHECK_SECONDS", 0.0)
    (project / "readme.txt").write_text("hi")
    write(
        project / HARNESS,
        "internal_tools:\n  filesystem:\n    read: ['**']\nrate_limits:\n  filesystem.read: 2/minute\n",
    )
    for _ in range(2):
        assert (await runs.session_call("agent", "filesystem.read", {"path": "readme.txt"})).status == "ok"
    write(
        project / HARNESS,
        "internal_tools:\n  filesystem:\n    read: ['**']\n    write: ['notes/**']\n"
        "rate_limits:\n  filesystem.read: 2/minute\n",
    )
    again = await runs.session_call("agent", "filesystem.read", {"path": "readme.txt"})
    assert again.status == "rate_limited", again
    assert (await runs.status(session_workflow_id(project))).calls == 3


async def test_two_front_ends_replacing_the_session_at_once_both_answer(runs, project, monkeypatch):
    # The race: two front ends (two RunClients) see the base policy change at once. B's refused call makes B
    # end the old session; before B starts its successor, A's next call has started it. B read the budget to
    # carry from "the session's" result, i.e. the successor's, which never ends: B's call (and the agent
    # behind it) hung for good. What must hold: B's call answers, by the session A started, with its policy.
    import kiwi.runs.starting

    # (B's refusal alone makes it look)
    monkeypatch.setattr(kiwi.runs.starting, "SESSION_CHECK_SECONDS", 3600.0)
    (project / "readme.txt").write_text("hi")
    write(project / HARNESS, "internal_tools:\n  filesystem:\n    read: ['docs/**']\n")
    a = runs
    b = RunClient(runs.client, ItemStore(project), task_queue=runs.task_queue)
    assert (await b.session_call("agent", "filesystem.read", {"path": "readme.txt"})).status == "denied"
    write(project / HARNESS, "internal_tools:\n  filesystem:\n    read: ['**']\n")

    looked = b._session_current

    async def then_a_calls(client_name: str, *, now: bool = False) -> bool:
        ended = await looked(client_name, now=now)
        if ended:
            # (A, whose first look finds no session running, starts the successor from the files.)
            assert (await a.session_call("agent", "filesystem.read", {"path": "readme.txt"})).status == "ok"
        return ended

    monkeypatch.setattr(b, "_session_current", then_a_calls)
    answer = await asyncio.wait_for(b.session_call("agent", "filesystem.read", {"path": "readme.txt"}), 20)
    assert answer.status == "ok", answer
    # One count each: B's two refusals by the old session, then A's ok and B's ok in the one successor.
    assert (await a.status(session_workflow_id(project))).calls == 4


async def test_cancelling_another_projects_run_cancels_none_of_its_children(runs, project, tmp_path):
    # The attack: execute(run, cancel) on a run of another project: the children are listed (describe,
    # before any project check) and cancelled in a loop that swallows Kiwi errors. What must hold: the
    # foreign run and its children are refused and left running.
    from tests.helpers import start_parent_with_child, write_parent_and_child

    write_parent_and_child(project)
    parent, child = await start_parent_with_child(runs)
    other = tmp_path / "other"
    other.mkdir()
    (other / ".ai").mkdir()
    foreign = RunClient(runs.client, ItemStore(other), task_queue=runs.task_queue)
    foreign._attributes_ready = runs._attributes_ready
    with pytest.raises(RunInOtherProject):
        await foreign.cancel(parent)
    with pytest.raises(RunInOtherProject):
        await foreign.cancel(child)
    assert (await runs.status(parent)).status not in ("cancelled",)
    assert (await runs.status(child)).status not in ("cancelled",)


SLOW_TICK = """import pathlib
import time


def main(label: str) -> dict:
    time.sleep(3)
    with pathlib.Path("ticks.log").open("a") as handle:
        handle.write(label + "\\n")
    return {"ticked": label}
"""


async def test_a_pending_call_outlives_the_session_it_ran_in(runs, project, monkeypatch):
    # The attack (or the accident): a slow mutating call outside a run answers pending; the base policy then
    # changes and the session it runs in is replaced. Polling its call id looked in the successor only, said
    # the call was never made and told the agent to send it again: with the same idempotency_key the
    # successor, which knows nothing of it, ran it a second time. What must hold: the poll answers the call
    # from the execution that ran it, and sending it again with its key does not run it twice.
    import kiwi.runs.starting
    from kiwi.contracts import session_workflow_id as sid

    write(
        project / ".ai" / "tools" / "tick" / "tool.yaml",
        "tool_id: tick\ntool_type: python\nexecutor:\n  entrypoint: main.py\nparameters:\n"
        "  - name: label\n    type: string\n    required: true\nmutates_state: true\n",
    )
    write(project / ".ai" / "tools" / "tick" / "main.py", SLOW_TICK)
    (project / "readme.txt").write_text("hi")
    write(project / HARNESS, "internal_tools:\n  tools: ['tick']\n  filesystem:\n    read: ['**']\n")
    pending = await runs.session_call(
        "agent", "tick", {"label": "once"}, wait_seconds=0.5, idempotency_key="k1"
    )
    assert pending.status == "pending", pending
    call_id = pending.result["call_id"]
    write(
        project / HARNESS,
        "internal_tools:\n  tools: ['tick']\n  filesystem:\n    read: ['**']\n    write: ['notes/**']\n",
    )
    monkeypatch.setattr(kiwi.runs.starting, "SESSION_CHECK_SECONDS", 0.0)
    assert (await runs.session_call("agent", "filesystem.read", {"path": "readme.txt"})).status == "ok"
    polled = await runs.poll_call(sid(project), call_id, wait_seconds=10)
    assert polled.status == "ok" and polled.result == {"ticked": "once"}, polled
    again = await runs.session_call("agent", "tick", {"label": "once"}, wait_seconds=10, idempotency_key="k1")
    assert again.status != "pending", again
    assert (project / "ticks.log").read_text() == "once\n"


@pytest.mark.parametrize("how", ["agent cancels it", "the base policy changes"])
async def test_a_stuck_session_stays_stuck_when_it_is_replaced(runs, project, monkeypatch, how):
    # The attack: the agent loops outside a run until loop detection holds the project's session (stuck:
    # a human's signed `kiwi resume` lets it go on). It then ends the session, with execute(run, cancel) on
    # the session's id (what MCP's execute does: RunClient.cancel), or waits for any harness edit (this
    # session's replacement on a base policy change); the next call started a fresh session, not held and
    # with no loop warnings. What must hold: the session that replaces a stuck one is stuck too.
    import kiwi.runs.starting
    from kiwi.contracts import session_workflow_id as sid

    monkeypatch.setattr(kiwi.runs.starting, "SESSION_CHECK_SECONDS", 0.0)
    approver("ops")
    (project / "readme.txt").write_text("hi")
    harness = "internal_tools:\n  filesystem:\n    read: ['**']\nloop_detection:\n  repeat_threshold: 2\n  max_warnings: 2\n"
    write(project / HARNESS, harness)
    for _ in range(3):
        await runs.session_call("agent", "filesystem.read", {"path": "readme.txt"})
    assert (await runs.status(sid(project))).status == "stuck"
    if how == "agent cancels it":
        await runs.cancel(sid(project), "cancelled by the agent")
        await runs.handle(sid(project)).result()
    else:
        write(project / HARNESS, harness + "rate_limits:\n  filesystem.list: 100\n")
    with pytest.raises(RunStateConflict, match="must resume it"):
        await runs.session_call("agent", "filesystem.read", {"path": "notes.txt"})
    assert (await runs.status(sid(project))).status == "stuck"
    # A human's signed resume lets it go on, as it would the session it replaced.
    await runs.resume(sid(project), "looked at it", by="ops")
    assert (await runs.session_call("agent", "filesystem.list", {"path": "."})).status == "ok"


async def test_cancelling_the_session_does_not_reset_its_loop_warnings(runs, project):
    # The attack: loop until one warning short of the hold, cancel the session (execute(run, cancel) on its
    # id), loop again: each new session started with no warnings, so the hold never came. What must hold:
    # the warnings carry over, and the next repeat holds the session.
    from kiwi.contracts import session_workflow_id as sid

    (project / "readme.txt").write_text("hi")
    write(
        project / HARNESS,
        "internal_tools:\n  filesystem:\n    read: ['**']\nloop_detection:\n  repeat_threshold: 2\n"
        "  max_warnings: 2\n",
    )
    for _ in range(2):
        await runs.session_call("agent", "filesystem.read", {"path": "readme.txt"})
    assert (await runs.status(sid(project))).status == "awaiting_agent"
    await runs.cancel(sid(project), "cancelled by the agent")
    await runs.handle(sid(project)).result()
    await runs.session_call("agent", "filesystem.read", {"path": "readme.txt"})
    assert (await runs.status(sid(project))).status == "stuck"


async def test_readiness_probes_flooding_a_front_end_without_temporal_each_answer_within_their_time(project):
    # The attack: /readyz takes no token. While Temporal does not answer, a flood of probes queued on the
    # link's lock, each waiting for the ones before it to spend their 2 s connecting: probe N answered after
    # N x 2 s, and an agent's run action behind them waited as long. What must hold: one attempt at a time,
    # and every waiter answers within its own time (not ready / TemporalUnavailable), whatever is queued.
    import socket
    import time

    from mcp_frontend.link import TemporalLink, TemporalUnavailable

    silent = socket.socket()  # accepts connections (the backlog) and never says a word
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)
    try:
        link = TemporalLink(ItemStore(project), "kiwi", address=f"127.0.0.1:{silent.getsockname()[1]}")
        started = time.monotonic()

        async def probe() -> float:
            with pytest.raises(TemporalUnavailable):
                await link.runs(timeout=0.5)
            return time.monotonic() - started

        took = await asyncio.gather(*(probe() for _ in range(6)))
        assert max(took) < 1.5, took
    finally:
        silent.close()


async def test_a_grant_taken_out_with_a_typo_in_the_harness_is_not_kept(runs, project, monkeypatch):
    # The slip an agent waits for: a human takes a grant out of internal_tools and leaves the file invalid
    # (a misspelt key: the harness is strict). The client's look at the files failed, it kept the running
    # session, and that session went on honouring the old grants for as long as the typo stayed, while every
    # new run was refused for the file. What must hold: no call is made under the policy the human took back;
    # the call says what is wrong with the file.
    import kiwi.runs.starting
    from kiwi.errors import KiwiError

    monkeypatch.setattr(kiwi.runs.starting, "SESSION_CHECK_SECONDS", 0.0)
    (project / "readme.txt").write_text("hi")
    write(project / HARNESS, "internal_tools:\n  filesystem:\n    read: ['**']\n")
    assert (await runs.session_call("agent", "filesystem.read", {"path": "readme.txt"})).status == "ok"
    write(project / HARNESS, "internal_tool:\n  filesystem:\n    read: ['docs/**']\n")
    with pytest.raises(KiwiError, match="internal_tool"):
        await runs.session_call("agent", "filesystem.read", {"path": "readme.txt"})
    # Fixed: the next call runs in a session with the file's policy, its budget carried.
    write(project / HARNESS, "internal_tools:\n  filesystem:\n    read: ['docs/**']\n")
    assert (await runs.session_call("agent", "filesystem.read", {"path": "readme.txt"})).status == "denied"
    assert (await runs.status(session_workflow_id(project))).calls == 2


async def test_a_child_run_the_session_started_holds_when_its_replacement_is_stuck(runs, project):
    # The attack: from outside a run the agent starts a child run (directive.run through the session), ends
    # the session (execute(run, cancel) on its id; or any harness edit replaces it), then loops the new
    # session into `stuck`. A held run holds its running children; the new session knew none of them.
    # What must hold: the child holds with the session.
    from kiwi.contracts import session_workflow_id as sid
    from tests.helpers import awaiting_step, write_parent_and_child

    write_parent_and_child(
        project,
        harness="internal_tools:\n  tools: ['directive.run']\n  filesystem:\n    read: ['notes/**']\n",
    )
    started = await runs.session_call("agent", "directive.run", {"directive": "helper"})
    assert started.status == "ok", started
    child = started.result["run_id"]
    await awaiting_step(runs, child, "help")
    await runs.cancel(sid(project), "cancelled by the agent", children=False)
    await runs.handle(sid(project)).result()
    for _ in range(3):
        with contextlib.suppress(RunStateConflict):
            await runs.session_call("agent", "filesystem.read", {"path": "notes/a.txt"})
    assert (await runs.status(sid(project))).status == "stuck"

    async def child_held():
        return (await runs.status(child)).status in ("stuck", "awaiting_human")

    await wait_for(child_held, timeout=10, what="the child to hold with the session")


@pytest.mark.parametrize("how", ["agent cancels it", "the base policy changes"])
async def test_calls_in_a_session_that_replaced_another_reach_the_audit_trail(
    runs, project, monkeypatch, how
):
    # The attack: the project's session writes its audit trail to one file per day named by the session's
    # id, and a flush skips records whose sequence number the file already holds (a retried flush). A new
    # session numbered its records from 1 again: after the agent ended its session (execute(run, cancel)),
    # or a harness edit replaced it, the new session's calls were silently left out of the trail until
    # its count passed the old one's. What must hold: every call made in the new session is in the trail.
    import kiwi.runs.starting
    from activities.audit import read_audit
    from kiwi.contracts import session_workflow_id as sid

    monkeypatch.setattr(kiwi.runs.starting, "SESSION_CHECK_SECONDS", 0.0)
    (project / "readme.txt").write_text("hi")
    write(project / HARNESS, "internal_tools:\n  filesystem:\n    read: ['**']\n")
    for _ in range(3):
        await runs.session_call("agent", "filesystem.read", {"path": "readme.txt"})
    if how == "agent cancels it":
        await runs.cancel(sid(project), "cancelled by the agent")
    else:
        write(
            project / HARNESS, "internal_tools:\n  filesystem:\n    read: ['**']\n    write: ['notes/**']\n"
        )
    secret = await runs.session_call("agent", "filesystem.list", {"path": "."})
    assert secret.status == "ok", secret
    await runs.cancel(sid(project), "flush the trail")
    await runs.handle(sid(project)).result()

    records = read_audit(str(project), sid(project))
    calls = [r for r in records if r["event"] == "tool_call" and r.get("origin") == "agent"]
    assert [r["tool"] for r in calls][-1:] == ["filesystem.list"], [r["tool"] for r in calls]
    seqs = [r["seq"] for r in records]
    assert seqs == sorted(set(seqs)), seqs
