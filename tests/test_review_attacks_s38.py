"""Session 38: attacks on what an approval binds, against the real stack (a Temporal server, Kiwi's worker, real
git). Each test's docstring says the attack and the safe outcome."""

from __future__ import annotations

import asyncio
import re

import pytest

from activities import confinement
from tests.helpers import approver, awaiting_step, directive_md, wait_for, write, write_directive
from tests.test_humans import pending_approval, status_is
from tests.test_review_attacks_s37 import _git

AUTHOR = (
    '<read resource="filesystem" path="**"/><write resource="filesystem" path=".ai/directives/**"/>'
    '<execute resource="tool" id="directive.run"/>'
)
COMMITS = (
    '<read resource="filesystem" path="**"/><write resource="filesystem" path="notes/**"/>'
    '<execute resource="tool" id="git.commit"/>'
)


def gated(project, name: str, permissions: str, approvals: str, harness: str = "") -> None:
    """alice as an approver, a harness whose ``approvals`` (a YAML list's items) wait for her, and a one-step agent
    directive ``name`` granted ``permissions``."""
    approver("alice")
    write(project / ".ai" / "config" / "agent_harness.yaml", f"approvals:\n  tools: [{approvals}]\n{harness}")
    write_directive(
        project / ".ai" / "directives" / f"{name}.md",
        directive_md(
            '<step name="work" mode="agent"><action>Work.</action></step>', name=name, permissions=permissions
        ),
    )


def _approved_commits(project, permissions: str = COMMITS) -> None:
    """A repository whose `publish` directive may write notes/ and commit, each commit approved by alice."""
    gated(project, "publish", permissions, "git.commit")
    write(project / ".gitignore", ".ai/logs/\n.ai/.cache/\n")
    write(project / "notes" / "a.md", "base\n")
    write(project / "notes" / "other.md", "base\n")
    _git(project, "init", "-q", "-b", "main")
    _git(project, "add", ".")
    _git(project, "commit", "-qm", "base")


async def _asked(runs, run_id, args):
    """Start ``git.commit args`` and return its task and the approval it waits for."""
    call = asyncio.create_task(runs.call_tool(run_id, "git.commit", args))
    (request,) = await wait_for(lambda: pending_approval(runs, run_id), what="the commit's approval")
    return call, request


async def test_attack_an_approved_commit_takes_only_what_the_approver_was_shown(runs, project):
    """Session 37's note: an approval bound git.commit's arguments, not what it commits. The agent asked to
    commit notes/ with a reviewed change, and while the human read it, rewrote the file and added another; the
    approved commit took both. Now the approval shows the files and how to see their content (`git diff BASE
    TREE`), and the commit takes that content: later changes stay uncommitted, and are named."""
    _approved_commits(project)
    run_id = await runs.start("publish", {})
    await awaiting_step(runs, run_id, "work")
    await runs.call_tool(run_id, "filesystem.write", {"path": "notes/a.md", "content": "reviewed\n"})
    # (Review s38, second round: attributes the agent writes made the shown `git diff` say "Binary files differ".)
    await runs.call_tool(run_id, "filesystem.write", {"path": "notes/.gitattributes", "content": "* -diff\n"})
    call, request = await _asked(runs, run_id, {"message": "notes", "paths": ["notes"]})
    assert (
        "commits to main 2 file(s) as they are now: A notes/.gitattributes, M notes/a.md" in request.summary
    ), request
    shown = re.search(r"`(git diff [-\w ]+)`", request.summary)
    assert shown, request.summary
    diff = _git(project, *shown.group(1).split()[1:])
    assert "+reviewed" in diff and "+* -diff" in diff and "notes/other.md" not in diff, diff
    # While the approval waits, the agent changes the reviewed file and adds one.
    await runs.call_tool(run_id, "filesystem.write", {"path": "notes/a.md", "content": "rm -rf /\n"})
    await runs.call_tool(run_id, "filesystem.write", {"path": "notes/b.md", "content": "unseen\n"})
    await runs.decide_approval(run_id, request.request_id, True, by="alice")
    done = await asyncio.wait_for(call, 60)
    assert done.status == "ok" and done.result["committed"], done
    assert sorted(done.result["not_committed"]) == ["notes/a.md", "notes/b.md"], done.result
    assert _git(project, "rev-parse", "HEAD").strip() == done.result["sha"]
    assert _git(project, "show", "HEAD:notes/a.md") == "reviewed\n"
    assert _git(project, "ls-tree", "--name-only", "HEAD", "notes/").split() == [
        "notes/.gitattributes",
        "notes/a.md",
        "notes/other.md",
    ]
    # The files and the index are as `git commit --only` leaves them: the later change unstaged, the new file new.
    assert (project / "notes" / "a.md").read_text() == "rm -rf /\n"
    status = _git(project, "status", "--porcelain", "--", "notes").splitlines()
    assert status == [" M notes/a.md", "?? notes/b.md"], status


async def test_an_approved_commit_goes_on_a_branch_that_moved_unless_it_changed_those_files(runs, project):
    """While an approval waits, the human commits. A commit of other files: the approved commit goes on top of
    it, which it keeps. A commit of the same file: the approved change was made on what the file was then, so
    the commit is refused, saying why, and nothing is overwritten. A call with nothing to commit asks nobody."""
    _approved_commits(project)
    run_id = await runs.start("publish", {})
    await awaiting_step(runs, run_id, "work")
    nothing = await runs.call_tool(run_id, "git.commit", {"message": "none", "paths": ["notes"]})
    assert nothing.status == "ok" and nothing.result == {"committed": False, "reason": "nothing to commit"}
    assert not (await runs.status(run_id)).approvals, "nothing to commit asks no approval"

    await runs.call_tool(run_id, "filesystem.write", {"path": "notes/a.md", "content": "agent\n"})
    call, request = await _asked(runs, run_id, {"message": "agent's", "paths": ["notes/a.md"]})
    write(project / "README.md", "the human's\n")
    _git(project, "add", "README.md")
    _git(project, "commit", "-qm", "human")
    human = _git(project, "rev-parse", "HEAD").strip()
    await runs.decide_approval(run_id, request.request_id, True, by="alice")
    done = await asyncio.wait_for(call, 60)
    assert done.status == "ok" and done.result["committed"], done
    assert _git(project, "rev-parse", "HEAD^").strip() == human
    assert _git(project, "show", "HEAD:README.md") == "the human's\n"
    assert _git(project, "show", "HEAD:notes/a.md") == "agent\n"

    await runs.call_tool(run_id, "filesystem.write", {"path": "notes/a.md", "content": "agent again\n"})
    call, request = await _asked(runs, run_id, {"message": "again", "paths": ["notes"]})
    write(project / "notes" / "a.md", "the human's own\n")
    _git(project, "commit", "-qam", "human edits a.md")
    human = _git(project, "rev-parse", "HEAD").strip()
    await runs.decide_approval(run_id, request.request_id, True, by="alice")
    refused = await asyncio.wait_for(call, 60)
    assert refused.status == "error" and "the branch moved since the approval was asked" in refused.reason, (
        refused
    )
    assert "notes/a.md" in refused.reason and "call git.commit again" in refused.hint, refused
    assert _git(project, "rev-parse", "HEAD").strip() == human
    assert _git(project, "show", "HEAD:notes/a.md") == "the human's own\n"


async def test_an_approved_first_commit_makes_the_branch(runs, project):
    """In a repository with no commit yet, the approved commit is the branch's first, with what was shown, and the
    request's `git diff` shows it."""
    _approved_commits(project)
    (project / ".git").rename(project / "old.git")  # (a fresh repository, no commit on it)
    _git(project, "init", "-q", "-b", "main")
    run_id = await runs.start("publish", {})
    await awaiting_step(runs, run_id, "work")
    call, request = await _asked(runs, run_id, {"message": "first", "paths": ["notes"]})
    assert "commits to main 2 file(s) as they are now: A notes/a.md, A notes/other.md" in request.summary, (
        request
    )
    # (Review s38, second round: the command compared with an empty tree the repository did not hold.)
    shown = re.search(r"`(git diff [-\w ]+)`", request.summary).group(1)
    assert "+base" in _git(project, *shown.split()[1:]), shown
    await runs.call_tool(run_id, "filesystem.write", {"path": "notes/a.md", "content": "later\n"})
    await runs.decide_approval(run_id, request.request_id, True, by="alice")
    done = await asyncio.wait_for(call, 60)
    assert done.status == "ok" and done.result["committed"], done
    assert _git(project, "log", "--format=%s", "main").splitlines() == ["first"]
    assert _git(project, "show", "HEAD:notes/a.md") == "base\n"
    assert done.result["not_committed"] == ["notes/a.md"], done.result


def _draft(name: str, step: str) -> str:
    return directive_md(
        f'<step name="{step}" mode="agent"><action>{step}</action></step>',
        name=name,
        permissions='<read resource="filesystem" path="notes/**"/>',
    )


async def test_attack_an_approved_child_run_is_the_directive_the_approver_was_shown(runs, project, capsys):
    """Session 37's note: a directive.run's approval bound its arguments, and the child started from its
    directive file as it was once approved. A run drafting directives (granted `.ai/directives/**`) asked to try
    `draft`, and while the human read it, rewrote the file: the child that started was the rewrite. Now the
    child is read from the file when the approval is asked, the request names the file, its signer and hash (as
    `kiwi show` prints it), and the approved call starts that child."""
    from kiwi.cli import main as kiwi

    gated(project, "author", AUTHOR, "directive.run")
    run_id = await runs.start("author", {})
    await awaiting_step(runs, run_id, "work")
    wrote = await runs.call_tool(
        run_id,
        "filesystem.write",
        {"path": ".ai/directives/draft.md", "content": _draft("draft", "reviewed")},
    )
    assert wrote.status == "ok", wrote
    call = asyncio.create_task(runs.call_tool(run_id, "directive.run", {"directive": "draft"}))
    (request,) = await wait_for(lambda: pending_approval(runs, run_id), what="the child's approval")
    assert "starts directive draft v1.0.0 from .ai/directives/draft.md as it is now" in request.summary, (
        request
    )
    shown_hash = re.search(r"sha256 (\w{12})", request.summary).group(1)
    capsys.readouterr()
    assert kiwi(["show", "draft"]) == 0
    assert f"sha256 {shown_hash}" in capsys.readouterr().out
    # While the approval waits, the agent rewrites the draft.
    await runs.call_tool(
        run_id, "filesystem.write", {"path": ".ai/directives/draft.md", "content": _draft("draft", "swapped")}
    )
    capsys.readouterr()
    assert kiwi(["show", "draft"]) == 0
    assert f"sha256 {shown_hash}" not in capsys.readouterr().out, "the approver can see the file changed"
    await runs.decide_approval(run_id, request.request_id, True, by="alice")
    started = await asyncio.wait_for(call, 60)
    assert started.status == "ok", started
    await awaiting_step(runs, started.result["run_id"], "reviewed")
    child = await runs.status(started.result["run_id"])
    assert child.trust.content_hash.startswith(shown_hash), child.trust


async def test_attack_a_decoy_argument_does_not_change_what_a_human_reads_of_a_call(runs, project):
    """Hostile review s38: (1) `filesystem.move {"path": "notes/tmp.md", "source": "notes/important.md", ...}` was
    shown to the approver as `filesystem.move notes/tmp.md -> ...`, and moved important.md; (2) `shell.run
    {"command": "ls notes", "argv": ["rm", ...]}` showed as `ls notes` in `kiwi status` and ran rm. What a human
    reads now names what the tool acts on: the move's source, the words that run."""
    permissions = (
        '<read resource="filesystem" path="**"/><write resource="filesystem" path="notes/**"/>'
        '<execute resource="shell" commands="ls,rm"/>'
    )
    gated(project, "tidy", permissions, "filesystem.move")
    write(project / "notes" / "important.md", "keep")
    write(project / "notes" / "x.md", "x")
    run_id = await runs.start("tidy", {})
    await awaiting_step(runs, run_id, "work")
    decoy = {"path": "notes/tmp.md", "source": "notes/important.md", "destination": "notes/archive.md"}
    move = asyncio.create_task(runs.call_tool(run_id, "filesystem.move", decoy))
    (request,) = await wait_for(lambda: pending_approval(runs, run_id), what="the move's approval")
    assert request.summary.startswith("filesystem.move notes/important.md -> notes/archive.md"), (
        request.summary
    )
    await runs.decide_approval(run_id, request.request_id, False, by="alice")
    assert (await asyncio.wait_for(move, 60)).status == "denied"
    ran = await runs.call_tool(run_id, "shell.run", {"command": "ls notes", "argv": ["rm", "notes/x.md"]})
    assert ran.status == "ok" and not (project / "notes" / "x.md").exists(), ran
    shown = [c.summary for c in (await runs.status(run_id)).last_calls]
    assert shown[-1] == "shell.run rm notes/x.md", shown


async def test_attack_help_checkpoint_waits_for_the_approval_and_counts_in_the_rate_limit(runs, project):
    """Hostile review s38: help(action="checkpoint") checked the grant alone and checkpointed: with
    git.checkpoint waiting for approval, and with a rate limit of 1, four helps made four checkpoints. It is now
    the agent's git.checkpoint call: it waits for the human's approval, and counts in the limit."""
    from kiwi.contracts import HelpRequest

    permissions = (
        '<write resource="filesystem" path="notes/**"/><execute resource="tool" id="git.checkpoint"/>'
    )
    gated(project, "ckpt", permissions, "git.checkpoint", "rate_limits:\n  git.checkpoint: 1\n")
    write(project / ".gitignore", ".ai/logs/\n.ai/.cache/\n")
    _git(project, "init", "-q", "-b", "main")
    run_id = await runs.start("ckpt", {})
    await awaiting_step(runs, run_id, "work")
    await runs.help(run_id, HelpRequest(kind="checkpoint", reason="bypass"))
    (request,) = await wait_for(lambda: pending_approval(runs, run_id), what="the checkpoint's approval")
    assert request.tool == "git.checkpoint" and not _git(project, "for-each-ref", "refs/kiwi/"), request
    await runs.decide_approval(run_id, request.request_id, True, by="alice")

    async def made():
        return (await runs.status(run_id)).checkpoints

    (checkpoint,) = await wait_for(made, what="the approved checkpoint")
    await runs.help(run_id, HelpRequest(kind="checkpoint", reason="again"))

    async def refused():
        calls = (await runs.status(run_id)).last_calls
        return [c for c in calls if c.tool == "git.checkpoint" and c.status == "rate_limited"]

    (over,) = await wait_for(refused, what="the second checkpoint's refusal")
    assert "rate limit" in over.reason, over
    assert len(_git(project, "for-each-ref", "refs/kiwi/").splitlines()) == 1
    assert [c["checkpoint"] for c in (await runs.status(run_id)).checkpoints] == [checkpoint["checkpoint"]]


async def test_two_executions_under_one_run_id_each_keep_their_audit_records(project):
    """Hostile review s38: two approved directive.run calls gave their children one workflow id (fixed for new
    runs by CHILD_BOUND), and the audit writer, which skips a retried flush's records by sequence number, dropped
    the second child's records (its delete, the agent's reads) as already written: they were numbered from 1
    again in the same file. A record is now skipped only when its own execution wrote that number."""
    from temporalio.testing import ActivityEnvironment

    from activities.audit import AuditActivities, read_audit
    from kiwi.contracts import AuditBatch

    def batch(execution: str, events: list[tuple[int, str]]) -> AuditBatch:
        records = [
            {"seq": n, "time": "2026-11-28T12:00:00+00:00", "workflow_run_id": execution, "event": event}
            for n, event in events
        ]
        return AuditBatch(project_root=str(project), run_id="run-cleaner-abc1c13", records=records)

    write_records = AuditActivities().write_audit_records
    env = ActivityEnvironment()
    first = batch("exec-1", [(1, "run_started"), (2, "tool_call")])
    assert await env.run(write_records, first) == 2
    assert await env.run(write_records, first) == 0  # (a retried flush)
    second = batch("exec-2", [(1, "run_started"), (2, "approval_requested"), (3, "tool_call")])
    assert await env.run(write_records, second) == 3
    assert await env.run(write_records, batch("exec-2", [(3, "tool_call"), (4, "run_finished")])) == 1
    records = read_audit(project, "run-cleaner-abc1c13")
    assert sorted((r["workflow_run_id"], r["seq"]) for r in records) == [
        ("exec-1", 1),
        ("exec-1", 2),
        ("exec-2", 1),
        ("exec-2", 2),
        ("exec-2", 3),
        ("exec-2", 4),
    ], records


async def test_attack_a_child_run_ends_by_its_parents_deadline(runs, project):
    """Hostile review s38: a child of a run started with `--deadline 40` had no deadline: after the parent timed
    out, the agent's writes into the child went on. A child now gets what is left of its parent's deadline."""
    from datetime import datetime

    from tests.helpers import write_parent_and_child

    write_parent_and_child(project)
    parent = await runs.start("boss", {}, deadline_seconds=3600)
    await awaiting_step(runs, parent, "lead")
    child = (await runs.call_tool(parent, "directive.run", {"directive": "helper"})).result["run_id"]
    await awaiting_step(runs, child, "help")
    ends = [datetime.fromisoformat((await runs.status(r)).deadline_at) for r in (parent, child)]
    assert abs((ends[1] - ends[0]).total_seconds()) < 60, ends


async def test_attack_shell_git_commit_with_no_path_does_not_commit_the_humans_staged_work(runs, project):
    """Session 37's note: shell `git commit -m x` (no path) committed whatever the index held, the human's staged
    draft under docs/ included, from a run granted `write src/**`. It
    is refused, naming `git commit -m MSG -- PATH`; `git commit -m x -- src/app.py` commits the run's own file, the
    human's draft still staged."""
    from tests.test_attack_shell import agent_run, shell

    write(project / "src" / "app.py", "print('v1')\n")
    write(project / "docs" / "wip.md", "v1\n")
    _git(project, "init", "-q", "-b", "main")
    _git(project, "add", "-f", ".")
    _git(project, "commit", "-qm", "the human's")
    head = _git(project, "rev-parse", "HEAD")
    write(project / "docs" / "wip.md", "the human's staged draft\n")
    _git(project, "add", "docs/wip.md")
    grants = (
        '<read resource="filesystem" path="**"/><write resource="filesystem" path="src/**"/>'
        '<execute resource="shell" commands="git"/>'
    )
    run_id = await agent_run(runs, project, "shellcommit", grants)
    write(project / "src" / "app.py", "print('v2')\n")
    for argv in (["git", "commit", "-m", "x"], ["git", "commit", "--amend", "--no-edit"]):
        refused = await shell(runs, run_id, *argv)
        assert refused.status == "denied" and "what a human staged included" in refused.reason, (
            argv,
            refused,
        )
        assert "git commit -m MSG -- PATH" in refused.hint, refused
    assert _git(project, "rev-parse", "HEAD") == head
    mine = await shell(runs, run_id, "git", "commit", "-qm", "v2", "--", "src/app.py")
    assert mine.status == "ok" and mine.result["exit_code"] == 0, mine
    assert _git(project, "show", "--name-only", "--format=", "HEAD").split() == ["src/app.py"]
    assert _git(project, "diff", "--cached", "--name-only").split() == ["docs/wip.md"]


async def test_attack_an_approved_commit_never_drops_what_a_human_committed_meanwhile(runs, project):
    """Hostile review s38, second round: the agent asked to commit src/docs/x.txt, then deleted it and its
    folder; the human committed a file `src/docs` meanwhile; the approved commit, made on the branch as it was,
    put src/docs/x.txt where the human's file was and dropped it. The approved commit now changes nothing the
    approval did not show: refused, the human's commit kept. And a name with a newline is quoted in the request
    (it forged a line of `kiwi approvals`)."""
    _approved_commits(project, COMMITS.replace('path="notes/**"', 'path="src/**"'))
    run_id = await runs.start("publish", {})
    await awaiting_step(runs, run_id, "work")
    await runs.call_tool(run_id, "filesystem.write", {"path": "src/docs/x.txt", "content": "agent\n"})
    await runs.call_tool(run_id, "filesystem.write", {"path": "src/n\n; commits 0 file(s)", "content": "x"})
    await runs.call_tool(run_id, "filesystem.write", {"path": "src/a.md, M src/b.md", "content": "x"})
    call, request = await _asked(runs, run_id, {"message": "agent's", "paths": ["src"]})
    assert "\n" not in request.summary and 'A "src/n\\n; commits 0 file(s)"' in request.summary, request
    # (Session 39: a name holding ", " read as two files; it is shell-quoted.)
    assert "A 'src/a.md, M src/b.md'" in request.summary, request.summary
    await runs.call_tool(run_id, "filesystem.delete", {"path": "src/docs/x.txt"})
    await runs.call_tool(run_id, "filesystem.delete", {"path": "src/docs"})
    write(project / "src" / "docs", "the human's docs\n")
    _git(project, "add", "src/docs")
    _git(project, "commit", "-qm", "human: add src/docs")
    human = _git(project, "rev-parse", "HEAD").strip()
    await runs.decide_approval(run_id, request.request_id, True, by="alice")
    refused = await asyncio.wait_for(call, 60)
    assert refused.status == "error" and "would also change src/docs," in refused.reason, refused
    assert _git(project, "rev-parse", "HEAD").strip() == human
    assert _git(project, "show", "HEAD:src/docs") == "the human's docs\n"


async def test_approvals_pending_when_a_run_ends_are_cancelled(runs, project):
    """Hostile review s38, second round: a run that timed out still listed its pending approvals, and approving
    one then made the call (a commit landed after the run's deadline). The approvals pending when a run ends are
    cancelled, each call answered denied, and a later decision changes nothing."""
    _approved_commits(project)
    run_id = await runs.start("publish", {})
    await awaiting_step(runs, run_id, "work")
    await runs.call_tool(run_id, "filesystem.write", {"path": "notes/a.md", "content": "late\n"})
    head = _git(project, "rev-parse", "HEAD")
    call, request = await _asked(runs, run_id, {"message": "late", "paths": ["notes"]})
    await runs.complete_step(run_id, "work", {"done": True})
    denied = await asyncio.wait_for(call, 60)
    assert denied.status == "denied" and "the run ended (completed) before a decision" in denied.reason, (
        denied
    )
    assert (await runs.handle(run_id).result()).status == "completed"
    (cancelled,) = (await runs.status(run_id)).approvals
    assert cancelled.status == "cancelled", cancelled
    assert _git(project, "rev-parse", "HEAD") == head


async def test_an_approved_commit_goes_to_the_branch_its_approval_named(runs, project):
    """Hostile review s38, second round (unverified there): the approval did not say which branch the commit goes
    to, and a HEAD switched while it waited took it elsewhere. The request names the branch, and a commit whose
    HEAD is on another branch by then is refused."""
    _approved_commits(project)
    run_id = await runs.start("publish", {})
    await awaiting_step(runs, run_id, "work")
    await runs.call_tool(run_id, "filesystem.write", {"path": "notes/a.md", "content": "agent\n"})
    call, request = await _asked(runs, run_id, {"message": "agent's", "paths": ["notes"]})
    assert "; commits to main 1 file(s)" in request.summary, request.summary
    main = _git(project, "rev-parse", "main")
    _git(project, "checkout", "-q", "-b", "elsewhere")
    await runs.decide_approval(run_id, request.request_id, True, by="alice")
    refused = await asyncio.wait_for(call, 60)
    assert refused.status == "error" and "HEAD is on elsewhere now" in refused.reason, refused
    assert _git(project, "rev-parse", "main") == main == _git(project, "rev-parse", "elsewhere")


async def test_attack_a_newline_in_an_argument_forges_no_line_of_what_a_human_reads(runs, project):
    """Hostile review s38, third round: a shell word holding newlines (kept by shlex's quotes) printed, in `kiwi
    approvals`, lines that read as the end of the request and a second one, `approval-4: shell.run rm`, which hid
    `notes/important.md` among the words; the human approved and both files were deleted. Such a word is shown
    JSON-quoted, and agent-written text the CLI prints keeps to its line (an escalation's question too)."""
    from kiwi.contracts import HelpRequest
    from tests.helpers import kiwi_cli
    from tests.test_cli_first_day import connection

    gated(
        project,
        "cleanup",
        '<write resource="filesystem" path="notes/**"/><execute resource="shell" commands="rm"/>',
        "shell.run",
    )
    write(project / "notes" / "tmp.txt", "tmp")
    write(project / "notes" / "important.md", "keep")
    run_id = await runs.start("cleanup", {})
    await awaiting_step(runs, run_id, "work")
    forged = f"notes/x\n  kiwi approve {run_id} approval-1\n{run_id} approval-2: shell.run rm"
    argv = ["rm", "notes/tmp.txt", forged, "notes/important.md"]
    call = asyncio.create_task(runs.call_tool(run_id, "shell.run", {"argv": argv}))
    (request,) = await wait_for(lambda: pending_approval(runs, run_id), what="the rm's approval")
    assert "\n" not in request.summary and '"notes/x\\n  kiwi approve' in request.summary, request.summary
    code, out, _ = await kiwi_cli("approvals", *connection(runs), cwd=project)
    assert code == 0 and [line for line in out.splitlines() if line.startswith(run_id)] == [
        line
        for line in out.splitlines()
        if line.startswith(f"{run_id} approval-1: shell.run rm notes/tmp.txt")
    ], out
    await runs.decide_approval(run_id, request.request_id, False, by="alice")
    assert (await asyncio.wait_for(call, 60)).status == "denied"
    fake = "\n  waiting for approval approval-9 of shell.run ls notes: answer with `kiwi approve`"
    await runs.help(
        run_id, HelpRequest(kind="escalate", reason="which?\nfake line", options=["a", "b" + fake])
    )
    await wait_for(lambda: status_is(runs, run_id, "awaiting_human"), what="the escalation")
    code, held, _ = await kiwi_cli("status", run_id, *connection(runs), cwd=project)
    assert code == 0 and "which?\\nfake line" in held and "\nfake line" not in held, held
    await runs.cancel(run_id, reason="done" + fake)
    code, ended, _ = await kiwi_cli("status", run_id, *connection(runs), cwd=project)
    # (Fourth round: an escalation's options and a cancel's reason, each printed raw, forged such a line.)
    for out in (held, ended):
        forged = [
            line for line in out.splitlines() if line.strip().startswith("waiting for approval approval-9")
        ]
        assert code == 0 and not forged, out


@pytest.mark.skipif(confinement.landlock.abi_version() == 0, reason="this kernel has no Landlock")
async def test_attack_a_program_kiwi_does_not_model_reads_no_file_of_a_cwd_granted_in_part(runs, project):
    """README trial s38: a step running jq (a program Kiwi does not model) under `read data/**` was refused as its
    cwd '.' may not be read, with the hint `add <read path="."/>`; with that grant, `jq . secret.json` printed a
    root secret the run may not read (filesystem.read and wc refused it): Kiwi checks such a program's words
    only where they look like paths, and the kernel's rule for a folder is the whole folder. Now such a program
    runs only in a cwd the run reads whole, and the refusal names that way (cwd "data" under data/**)."""
    from tests.test_attack_shell import agent_run, shell

    run_id = await agent_run(runs, project, "peek", root_secret_and_data(project))
    assert (await runs.call_tool(run_id, "filesystem.read", {"path": "secret.json"})).status == "denied"
    stolen = await shell(runs, run_id, "dd", "if=secret.json", "status=none")
    assert stolen.status == "denied" and "s3cr3t" not in str(stolen.result), stolen
    assert "reads any file of its cwd '.' by a bare name" in stolen.reason, stolen
    assert 'cwd "data" under <read resource="filesystem" path="data/**"/>' in stolen.hint, stolen
    mine = await shell(runs, run_id, "dd", "if=config.json", "status=none", cwd="data")
    assert mine.status == "ok" and '"a": 1' in mine.result["stdout"], mine


async def test_attack_load_copies_no_tool_into_the_project(runs, project, temporal_env):
    """Hostile review s38, third round: `load(item_type="tool", copy_to_project=true)` copied a user-space tool
    (its .env with its token included) into the project's .ai/tools, a protected place a human writes; the copy
    then shadowed the human's later fixes of the user's tool. A tool is not copied: the answer says so and how a
    human does it, and nothing is written."""
    import os
    from pathlib import Path

    from mcp.client import Client

    from mcp_frontend.server import build_server
    from tests.helpers import data

    tool = Path(os.environ["AI_USER_SPACE"]) / "tools" / "ops" / "greet"
    manifest = (project / ".ai" / "tools" / "text" / "word_count" / "tool.yaml").read_text()
    write(
        tool / "tool.yaml", manifest.replace("word_count", "greet").replace("category: text", "category: ops")
    )
    write(tool / "main.py", "def main(text: str) -> dict:\n    return {'version': 1}\n")
    write(tool / ".env", "API_TOKEN=s3cret-user-token\n")
    server = build_server(temporal_env.client, project, task_queue=runs.task_queue)
    async with Client(server) as client:
        answer = data(
            await client.call_tool("load", {"item_type": "tool", "item_id": "greet", "copy_to_project": True})
        )
    assert answer["error"] == "InputInvalid" and "only a human puts it in .ai/tools" in answer["message"], (
        answer
    )
    assert not (project / ".ai" / "tools" / "ops").exists()


async def test_git_status_lists_the_changes_below_its_paths(runs, project):
    """git.status took `paths` (its schema names them) and listed every change anyway. It lists those below them."""
    permissions = (
        '<read resource="filesystem" path="**"/><write resource="filesystem" path="notes/**"/>'
        '<execute resource="tool" id="git.status"/>'
    )
    gated(project, "look", permissions, "git.rollback")
    write(project / "notes" / "a.md", "a\n")
    write(project / "src" / "b.py", "b\n")
    _git(project, "init", "-q", "-b", "main")
    run_id = await runs.start("look", {})
    await awaiting_step(runs, run_id, "work")
    everything = await runs.call_tool(run_id, "git.status", {})
    below = await runs.call_tool(run_id, "git.status", {"paths": ["notes"]})
    assert {"?? notes/", "?? src/"} <= set(everything.result["changes"]), everything
    assert below.result["changes"] == ["?? notes/"], below


async def test_a_run_failed_by_a_refused_step_says_the_fix(runs, project):
    """README trial s38: a step's refused call failed the run with "step 'pretty': shell.run denied: ..." and no
    word of the fix, which only `kiwi audit RUN --json` held. The run's error carries the refusal's hint."""
    body = '<step name="sorted"><tool_call tool="shell.run"><param name="command">sort notes.txt</param></tool_call></step>'
    write_directive(
        project / ".ai" / "directives" / "sorter.md",
        directive_md(body, name="sorter", permissions='<read resource="filesystem" path="**"/>'),
    )
    run_id = await runs.start("sorter", {})
    status = await wait_for(lambda: failed(runs, run_id), what="the run to fail at its step")
    assert "step 'sorted': shell.run denied" in status.error, status.error
    assert 'add <execute resource="shell" commands="sort"/>' in status.error, status.error


def test_a_git_calls_summary_names_its_paths():
    """README trial s38, second round: a git.commit's audit row and status line named no path (its message and
    paths only in `kiwi audit --json`). They name its paths, a name that is no printable text quoted."""
    from kiwi.guards import summarise_call

    assert (
        summarise_call("git.commit", {"message": "m", "paths": ["notes", "src/a\nb"]})
        == 'git.commit notes "src/a\\nb"'
    )
    assert summarise_call("git.rollback", {"checkpoint": "run-x/1"}) == "git.rollback run-x/1"


async def failed(runs, run_id: str):
    """The run's status once it has failed, else None."""
    status = await runs.status(run_id)
    return status if status.status == "failed" else None


def root_secret_and_data(project) -> str:
    """A root secret.json the run may not read and data/config.json it may (read data/**, read ., dd): the grants."""
    write(project / "secret.json", '{"token": "s3cr3t"}\n')
    write(project / "data" / "config.json", '{"a": 1}\n')
    return (
        '<read resource="filesystem" path="data/**"/><read resource="filesystem" path="."/>'
        '<execute resource="shell" commands="dd"/>'
    )
