"""Retry policies, timeouts, patch ids and the activity tables of DirectiveRun."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from activities.filesystem import FilesystemActivities
    from activities.gittools import GitActivities
    from kiwi.admission import LOOP_WINDOW  # noqa: F401 - re-exported for the call path
    from kiwi.contracts import (
        HELD,  # noqa: F401 - re-exported: the held statuses
        STUCK_ATTEMPTS_FOR_HUMAN,  # noqa: F401 - the seed: more than 3 goes to a human
    )
    from kiwi.errors import (
        ACTIVITY_REFUSALS,
        MCP_REFUSALS,
        PermissionDenied,
        SecretMissing,
        ToolFailed,
        ToolNotFound,
        ToolTimeout,
        non_retryable,
    )

RETRY = RetryPolicy(
    initial_interval=timedelta(milliseconds=200),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=10),
    maximum_attempts=5,
    non_retryable_error_types=non_retryable(*ACTIVITY_REFUSALS),
)
# api tools retry their own idempotent requests; an attempt that failed as a whole is not repeated.
API_RETRY = RetryPolicy(
    maximum_attempts=3,
    non_retryable_error_types=non_retryable(
        PermissionDenied, ToolNotFound, ToolFailed, ToolTimeout, SecretMissing
    ),
)
FS_ACTIVITIES = {
    "filesystem.read": FilesystemActivities.read_file,
    "filesystem.write": FilesystemActivities.write_file,
    "filesystem.list": FilesystemActivities.list_directory,
    "filesystem.create": FilesystemActivities.create_directory,
    "filesystem.delete": FilesystemActivities.delete_path,
    "filesystem.move": FilesystemActivities.move_path,
}
GIT_ACTIVITIES = {
    "git.status": GitActivities.git_status,
    "git.diff": GitActivities.git_diff,
    "git.commit": GitActivities.git_commit,
}
# Tools that change the project's files: <git_checkpoint mode="auto"> checkpoints after each.
MUTATING_TOOLS = (
    "filesystem.write",
    "filesystem.create",
    "filesystem.delete",
    "filesystem.move",
    "shell.run",
)
# A step that starts while a call waits for its approval (a call in the run's first task, or one made before
# the step began) leaves the run awaiting_approval; it said awaiting_agent with the request pending. Asked only
# where it changes the answer (a marker only in runs that meet it).
APPROVAL_STATUS_KEPT = "kiwi-approval-status-kept"
# Upstream MCP servers: transport failures retry (the pool reconnects); refusals do not.
MCP_RETRY = RetryPolicy(
    initial_interval=timedelta(milliseconds=300),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=10),
    maximum_attempts=6,
    non_retryable_error_types=non_retryable(*MCP_REFUSALS),
)
# One patch for every workflow change up to this point (see DirectiveRun.run); add new changes as
# patches of their own, and fold them into a new ALL_CHANGES id when the previous one is retired.
ALL_CHANGES = "kiwi-run-changes-2026-11"
# New runs record this one marker for ALL_CHANGES and every patch below it (HARDENED, CHILD_ATTRIBUTES,
# TOOL_EXECUTORS, COMMIT_BEFORE_CONTINUE, KIWI_MCP_TOOLS, KIWI_EXECUTE_AS_CALL, HELD_RESULTS_CAPPED):
# each marker is a history event and a search-attribute upsert, and a run replays them on every worker
# that takes it over. Runs started before it replay the
# markers they recorded. Check it with ``self.current or workflow.patched(OLD_ID)``, never alone.
CURRENT = "kiwi-run-changes-2026-11-26d"
# What CURRENT stood for until it also stood for STEP_AWAITED: runs started in between replay it.
CHANGES_2026_11_26C = "kiwi-run-changes-2026-11-26c"
# (In CURRENT only, never a marker of its own.) complete_step finishes its step once the step waits for the
# agent, not at once. Its validator checked that the step waited, but validators do not run on replay, and a
# replay hands a task's updates over before its activity results: an update accepted in the task that took
# the result which made its step wait (by a worker that had taken that result already) found no such step on
# replay (KeyError, seen once in the chaos bench): a history no worker could replay again. Waiting for the
# step makes the same commands in both orders (tests/test_durability.py builds that history and replays it).
STEP_AWAITED = CURRENT
# (In CURRENT only, never a marker of its own.) The rules ALL_CHANGES stands for (approvals among them) are in
# force from the run's first activation, not from when run() starts: a call_tool update in the first task
# (sent with the start, or handed to a continue-as-new's successor) is handled before run(), and a call that
# needs approval ran without it.
FIRST_TASK_RULES = CURRENT
# What CHANGES_2026_11_26C stood for until it also stood for EARLY_APPROVALS: runs started in between replay
# it.
CHANGES_2026_11_26B = "kiwi-run-changes-2026-11-26b"
# (In CHANGES_2026_11_26C and after, never a marker of its own.) A trusted approver's signed decision on a call the run has not
# asked about yet is kept, and applied as the call starts waiting, instead of refused. A worker can show a
# request the history does not have yet: after a crash, a status query replayed the run past an activity
# result whose workflow task had not run, and the approver answered what it showed. The next attempt of that
# task takes the signal first (Temporal hands a task its signals before activity results): refused, the
# approval was lost and the run waited for ever (chaos bench). And when the worker that answered the query
# ran that task itself, it took the result first and the decision second: the run's history then did not
# replay (its status unreadable). Applied where the call starts waiting, a kept decision makes the same
# commands as one that comes while it waits, so both orders replay alike. Not in runs started before it: a
# decision they refused stays refused on replay.
EARLY_APPROVALS = CHANGES_2026_11_26C
# (In CHANGES_2026_11_26C and after, never a marker of its own.) A tool call that fails in its activity answers with the hint
# the failure carries (what to set, install or fix): the agent got the message alone. Not in older runs: the
# answer is bigger, and its size counts in what a workflow task may send (task_budget.py).
FAILURE_HINTS = CHANGES_2026_11_26C
# What CURRENT stood for until it also stood for RESULTS_SEALED: runs started in between replay it.
CHANGES_2026_11_26 = "kiwi-run-changes-2026-11-26"
# (In CURRENT only.) The run checks the seal of every activity result it gets (kiwi/seal.py, SealedResult):
# whoever reaches Temporal could complete an activity by its id with a result of their making, and the run
# acted on it. (No command changes: the check is in the worker's seal interceptor and payload converter.)
RESULTS_SEALED = CHANGES_2026_11_26B
# What CURRENT stood for until it also stood for PARENT_HOLDS_CHILDREN: runs started in between replay it.
CHANGES_2026_11_25 = "kiwi-run-changes-2026-11-25"
# (In CURRENT only.) A run that is held (stuck, awaiting_human) holds its running child runs too: it
# signals each (parent_held), and a child takes the notice only from its own parent and holds its own
# children in turn. Before it, the agent went on calling tools in a child started with directive.run
# while the parent was stuck. Resuming the parent (kiwi resume, signed) resumes the children it held.
PARENT_HOLDS_CHILDREN = CURRENT
# What CURRENT stood for until it also stood for HOLD_AT_ONCE: runs started in between replay it.
CHANGES_2026_11_23C = "kiwi-run-changes-2026-11-23c"
# (In CURRENT only, never a marker of its own.) A run is held as soon as the loop warning that reaches
# the limit is counted (at admission, or from a call's result before its checkpoint), and an agent's call
# that reaches a held run, in the task that held it, is refused as a later call is: before it, calls sent
# with the call that held the run (their validators ran before it was held) went out with it and ran
# while the run was stuck. A held run also takes no checkpoint asked for by a help signal.
HOLD_AT_ONCE = CURRENT
# (In CURRENT only.) A child run started by the agent is given half of what is left of each of the
# parent's per-run limits and windows, not all of it: the parent went on refusing its own calls of every
# limited pattern (mcp.*, filesystem.write, shell.run by default) while the child ran. Parent and
# children together still stay within every limit.
BUDGET_HALVED = CURRENT
# (In CURRENT only.) _publish upserts the search attributes that changed since the run's own last upsert,
# as its code recorded them, instead of comparing with workflow.info()'s: one chaos run's status query
# failed replaying an approval run (an upsert fewer on replay than in its history), and what the
# workflow code itself sent is the same on every replay by construction.
PUBLISH_OWN_RECORD = CURRENT
# What CURRENT stood for until it also stood for the task budget (task_budget.py): runs started in between
# replay it.
CHANGES_2026_11_23B = "kiwi-run-changes-2026-11-23b"
# What CURRENT stood for until it also stood for MCP_BATCHED: runs started in between replay it.
CHANGES_2026_11_23 = "kiwi-run-changes-2026-11-23"
# (In CURRENT only, never a marker of its own.) Upstream MCP calls to one server made in the same workflow
# task go out together as one local activity (mcp.{server}.call_tools): with concurrent agent calls the
# per-call local-activity round trips and activations were most of the worker's work. A batch of one is
# the single call's activity, as before; a call whose transport failed in a batch is retried alone.
MCP_BATCHED = CURRENT
# (A marker only in runs that meet it.) A finished child run that made no call of a pattern the parent
# held a share of its budget back for gives that share back: its missing count read as all of it used,
# so each child started cost the parent half of what was left of every limit for good.
CHILD_UNUSED_RETURNED = "kiwi-child-unused-returned"
# (A marker only in runs that meet it.) A call that waits for approval has its audit records written as it
# starts waiting, not when the wait ends (hours later): the approval_requested record is what an approver
# with no worker running signs from (RunClient.approvals_without_worker).
APPROVAL_AUDITED = "kiwi-approval-audited"
# (A marker only in runs that meet it.) A step's shell.run command over MAX_COMMAND_BYTES, its text filled
# in from the run's inputs and earlier steps' outputs, fails the step before admission walks its words, as
# an agent's such call is refused by the run's update validator. Before it, a step's command had no limit.
STEP_COMMAND_CAPPED = "kiwi-step-command-capped"
# Since session 34 (README trial): a run's deadline (--deadline) is checked before each call of an automatic step
# too, not only while a step waits for the agent (a run of slow automatic steps completed long past it). Asked
# only where it changes the answer: once the deadline has passed.
DEADLINE_BETWEEN_CALLS = "kiwi-deadline-between-calls-s34"
# Since session 35 (README trial): a run cancelled while an automatic step's call waits (for an approval, say) ends
# cancelled; the call's refusal (ApprovalCancelled) failed the step, and the run ended failed. Asked only where it
# changes the answer: a step's call that did not succeed after the run was cancelled.
CANCELLED_NOT_FAILED = "kiwi-cancelled-not-failed-s35"
# Since session 36 (hostile review): git.rollback restores and removes only what the run may write; it made the
# whole project its checkpoint's, overwrote a human's edit under src/ and deleted their new file in a run granted
# notes/** alone. Asked for each git.rollback call (its request carries the run's write grants).
ROLLBACK_GRANTS = "kiwi-rollback-grants-s36"
# Since session 37 (hostile review): a git.rollback naming no checkpoint that waits for a human's approval names the
# run's latest checkpoint in the call the human approves; it was resolved after the approval, and the agent, taking
# another checkpoint while the approval waited, made the rollback go to that one. Asked only where it changes the
# call: such a rollback, with a checkpoint to name.
ROLLBACK_NAMED = "kiwi-rollback-named-s37"
# Since session 38 (session 37's note): a git.commit waiting for approval has its files' content fixed and shown
# when the approval is asked (GitActivities.git_commit_plan), and the approved commit takes that content; it took
# what the files held once approved, the agent's changes made while the human read included. Asked only where it
# changes the call: a git.commit that needs approval.
COMMIT_BOUND = "kiwi-commit-bound-s38"
# Since session 38 (session 37's note): a directive.run waiting for approval has its child read from the directive
# file when the approval is asked (shown: file, signer, hash), and the approved call starts that child; it read the
# file once approved, so an agent could rewrite an unsigned child while the human read. Asked only where it changes
# the call: a directive.run that needs approval.
CHILD_BOUND = "kiwi-child-bound-s38"
# Since session 38 (hostile review): help(action="checkpoint") is the agent's git.checkpoint call, admitted as the tool
# is (approval rules, rate limits, loop checks, its tool_call record); it checked the grant alone and checkpointed,
# past a pending approval of git.checkpoint and its rate limit. Asked only where it changes the answer: a
# checkpoint help the run takes.
HELP_CHECKPOINT_CALL = "kiwi-help-checkpoint-call-s38"
# Since session 38 (hostile review): a child run of a run with a deadline gets what is left of it (or its own, if
# sooner); it got none, and took the agent's calls after its parent had timed out. Asked only where it changes the
# child: a parent with a deadline.
CHILD_DEADLINE = "kiwi-child-deadline-s38"
# Since session 38 (hostile review): the approvals still pending when a run ends (completed, failed, timed out) are
# cancelled, their calls answered `denied`; the run waited for a decision, and an approval given after a timeout
# made the call. Asked only where it changes the answer: a run that ends with an approval pending.
ENDED_APPROVALS = "kiwi-ended-approvals-s38"
# Since session 38 (hostile review): a finished child's calls in a rate window count in its parent's window (the
# slots held for it went back, and its calls were forgotten: children one after another beat "3/minute"). Asked
# only where it changes the answer: a child that made calls in a window.
CHILD_WINDOWS = "kiwi-child-windows-s38"
# Since session 39 (hostile review s38): a child that ends while runs it started still run tells its parent the
# window slots it still holds for them, and the parent keeps those held until its own end (it cannot see them
# end); they went back, and a grandchild's calls counted in no window. A child that fails says what it used as a
# finished one does, and one that ends saying nothing counts as having used its window slots just now (its calls
# were forgotten). Asked only where it changes the answer: a child ending with slots held or with window slots.
CHILD_HELD = "kiwi-child-held-s39"
# Since session 38 (README trial): a run failed by a step's refused call says the refusal's hint (the grant to add)
# in its error, as kiwi run --wait and kiwi status print it; it was in the audit trail's JSON only. Asked only
# where it changes the error: a refusal with a hint.
STEP_HINT = "kiwi-step-hint-s38"
# Since session 37 (hostile review): a checkpoint's number follows the last one's; it was the count of checkpoints
# the run keeps (the last 100), so from the 102nd every checkpoint was RUN/101, overwriting the ref a pending
# approval of a rollback named. Asked only where it changes the number.
CHECKPOINT_NUMBERS = "kiwi-checkpoint-numbers-s37"
# Since session 37 (hostile review): a checkpoint leaves out what the run explicitly denies (a `.env` denied to the
# run was in its checkpoint's ref, which a run of a project sharing the repository's refs could restore). Asked
# only for a run with denials.
CHECKPOINT_DENIALS = "kiwi-checkpoint-denials-s37"
# Since session 36 (README trial): a step's templated shell.run command is split into the words the directive
# wrote before its placeholders are filled, each value part of one word (kiwi.templating.command_words); an input
# `src/fruits.txt -o notes/pwn.txt` gave `sort {file}` an option. Asked only where the words differ.
COMMAND_WORDS = "kiwi-command-words-s36"
# Since session 36 (README trial): an agent that said it is stuck past STUCK_ATTEMPTS_FOR_HUMAN stays held until a
# human resumes the run; a human's answer to an escalation lifted that hold too (and a stuck hold met while an
# escalation held the run was not kept). Asked only where it changes the answer: an answer to a run held for
# something other than an escalation, and a stuck agent's hold met while an escalation holds the run.
STUCK_HOLD_KEPT = "kiwi-stuck-hold-kept-s36"
# Escapes closed: approval decisions need an approver's signature, help(checkpoint) needs the
# git.checkpoint grant, child runs inherit approval rules and share the parent's rate budget, tool
# arguments are checked before anything is scheduled (a wrong one is InputInvalid, never a failed
# workflow task), and a step's literal <param> text is typed by the tool's input schema.
HARDENED = "kiwi-escapes-closed-2026-11"
# A child run starts with its search attributes (directive, status, project), as a client-started run does.
CHILD_ATTRIBUTES = "kiwi-child-attributes-2026-11"
# api and docker tools run (call_api_tool with the run's network grants, run_container_tool with its
# filesystem grants) instead of failing as an unsupported type.
TOOL_EXECUTORS = "kiwi-tool-executors-2026-11"
# Update completions are committed in a workflow task of their own before the run continues-as-new
# (temporalio/temporal#6375: a completion sent with the continue-as-new command is sometimes lost and
# the update delivered again to the successor), and a call delivered again is answered from the
# update ids the run keeps (RunState.update_seqs) instead of running twice.
COMMIT_BEFORE_CONTINUE = "kiwi-commit-before-continue-2026-11"
CONTINUE_COMMIT_TIMER = timedelta(milliseconds=1)
# What one workflow task may send (task_budget.py): Temporal takes 4 MB (4,194,304 bytes) of a task's
# completion; the rest is for what frames the payloads and the task's other commands.
TASK_BYTES = 3_900_000
# Call arguments one workflow task accepts (the updates' acceptances carry them): past this, a call is
# refused (RunBusy) and the client sends it again to a later task. The first call of a task is always
# accepted (Temporal bounds one payload at 2 MB).
TASK_ARGUMENT_BYTES = 1_000_000
# Kiwi's meta-tools (kiwi-mcp.search, load, help, execute/run) are tools of the run, gated by the
# kiwi-mcp grants: looked up, planned into steps and executed. Checked once, in the run's first
# activation (DirectiveRun.__init__), so a run started before it keeps refusing them on replay.
KIWI_MCP_TOOLS = "kiwi-mcp-tools-2026-11"
# kiwi-mcp.execute of a directive is a directive.run call made through the run's call path (its own
# call number and audit record, directive.run's approval rules, rate limits and explicit denials), the
# kiwi-mcp execute grant standing in for directive.run's; before it, execute started the child directly,
# and a harness's `approvals.tools: [directive.run]` or `rate_limits: {directive.run: N}` did not apply.
# Also: a denial, approval rule or rate limit naming kiwi-mcp.execute or kiwi-mcp.run holds for both
# (one tool, two names; each name was a way around the other's rules).
KIWI_EXECUTE_AS_CALL = "kiwi-execute-directive-as-call-2026-11"
# A re-sent call is answered from RunState.recent_updates only when its result is small: the held results
# travel in the continue-as-new input, and a few large ones (a 900 kB kiwi-mcp.load, a big file read)
# made it larger than Temporal takes (2 MB), so the run's hand-over failed on every attempt and the run
# (or the project's session, every client's) stood still for good. A larger result is held by its call
# number only (RunState.update_seqs): a re-sent call is told it ran, never run again.
HELD_RESULTS_CAPPED = "kiwi-held-results-capped-2026-11"
HELD_RESULT_BYTES = 16_000
# What complete_step takes as a step's outputs, and as all steps' outputs of a run together: they travel
# in the continue-as-new input as well. (Checked in the update's validator, which history never records.)
STEP_OUTPUTS_BYTES = 256_000
RUN_OUTPUTS_BYTES = 1_000_000
# Arguments this large travel to the run as a reference to the payload store (kiwi.payloads.THRESHOLD_BYTES):
# the file stays while the run's history names it. A run takes at most STORED_REFUSALS calls with such
# arguments that did not go through (refused, failed); later ones are refused by the update's validator, so
# no history names them and `kiwi payloads prune` removes their files. Before it, an agent filled the store
# with refused calls of 300 KB each, as many as it liked. (The count is the handler's, so replay keeps it;
# the refusal is the validator's, which no history records.)
STORED_ARGUMENT_BYTES = 256 * 1024
STORED_REFUSALS = 20
# What a stored call's payload holds besides its arguments and names (JSON keys, metadata), and then some.
STORED_MARGIN_BYTES = 1024
MCP_LOCAL_LIMIT = 60.0  # calls that may take longer run as heartbeating activities, with progress
# What a batch of upstream calls gets past the server's timeout, which bounds each of its calls: time to
# answer for the calls that finished when one did not (see McpCallBatch).
BATCH_ANSWER_MARGIN = timedelta(seconds=5)
# A short upstream call's own local activity gets BATCH_ANSWER_MARGIN too (runs started before replay none).
LOCAL_CALL_MARGIN = "kiwi-local-call-margin"
RECENT_CALLS = 20
RECENT_RESULTS = 50  # agent calls whose results a re-sent call is answered with
RECENT_UPDATE_IDS = 2000  # agent calls a re-delivered call is recognised by (call_seq only)
AUDIT_IDLE_FLUSH = timedelta(seconds=1)
