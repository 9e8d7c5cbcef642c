"""What crosses processes: task queues, workflow ids, search attributes, and every input/output model.

The CLI, the MCP front end, the workers and the workflow import these same names. Models are
pydantic and travel through ``kiwi.converter.data_converter`` (pydantic JSON). Fields may
be added (with defaults) without breaking running workflows; never rename or remove one.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from pydantic import BaseModel, Field
from temporalio.common import SearchAttributeKey

from kiwi.guards import shown_word
from kiwi.items.directive import Directive
from kiwi.policy import PermissionSet

TASK_QUEUE = "kiwi"

DIRECTIVE_ATTR = SearchAttributeKey.for_keyword("KiwiDirective")
STATUS_ATTR = SearchAttributeKey.for_keyword("KiwiStatus")
STEP_ATTR = SearchAttributeKey.for_keyword("KiwiStep")
PENDING_APPROVAL_ATTR = SearchAttributeKey.for_keyword("KiwiPendingApproval")
# The project folder a run belongs to: set by the client when it starts the run, never changed.
PROJECT_ATTR = SearchAttributeKey.for_keyword("KiwiProject")
SEARCH_ATTRIBUTES = (DIRECTIVE_ATTR, STATUS_ATTR, STEP_ATTR, PENDING_APPROVAL_ATTR, PROJECT_ATTR)

RunStatusName = Literal[
    "running",
    "awaiting_agent",
    "awaiting_approval",
    "awaiting_human",
    "stuck",
    "completed",
    "failed",
    "cancelled",
    "timed_out",
]
TERMINAL = ("completed", "failed", "cancelled", "timed_out")
# A run held for a human: only `kiwi resume` (a resume signal) lets it carry on.
HELD = ("stuck", "awaiting_human")
CallStatus = Literal["ok", "denied", "error", "rate_limited", "pending"]


def run_workflow_id(directive: str, short_id: str) -> str:
    """``run-{directive}-{short id}``: readable in the Temporal UI, unique per run."""
    return f"run-{directive}-{short_id}"


def is_session(run_id: str, directive: str = "session") -> bool:
    """A project's session (see :func:`session_workflow_id`), not a directive's run."""
    return run_id.startswith("session-") and directive == "session"


def session_workflow_id(project_root: str | Path) -> str:
    """``session-{project folder}-{hash}``: calls outside a run, one session (and rate budget) per project.

    Every client of the project shares it, so naming a new client never starts a fresh budget.
    """
    root = str(project_root)
    name = re.sub(r"[^A-Za-z0-9_.-]", "-", PurePosixPath(root.replace("\\", "/")).name or "project")[:60]
    return f"session-{name}-{hashlib.sha256(root.encode()).hexdigest()[:8]}"


# ---------------------------------------------------------------- run snapshot and state


class McpServerInfo(BaseModel):
    """What a run may know about a server: no command, URL, environment or headers."""

    name: str
    description: str = ""
    tools: list[str] = Field(default_factory=list)
    require_approval: list[str] = Field(default_factory=list)
    approval_timeout_seconds: float | None = None
    timeout_seconds: float = 60.0

    def exposes(self, tool: str) -> bool:
        """Whether the registry's tool filter lets ``tool`` be seen and called."""
        return not self.tools or tool in self.tools


class LocalToolSpec(BaseModel):
    """What a run needs to call a local tool: resolved when the run starts, never re-read."""

    tool_id: str
    tool_type: str
    entrypoint: str
    mutates_state: bool = False
    timeout_seconds: float = 300.0
    # The JSON Schema of the tool's parameters (its manifest's), which types a step's <param> text.
    input_schema: dict[str, Any] = Field(default_factory=dict)
    # The manifest's executor section (an api tool's method, URL, headers, ...): ``${NAME}`` stays a
    # placeholder here and is filled in by the worker, so no secret enters the run's history.
    executor: dict[str, Any] = Field(default_factory=dict)
    # What must exist before the tool runs: programs on PATH and environment variables (names only).
    required_commands: list[str] = Field(default_factory=list)
    required_environment: list[str] = Field(default_factory=list)
    # A python tool's packages (PEP 508), installed into an environment of its own, and its Python version.
    required_packages: list[str] = Field(default_factory=list)
    required_python: str = ""


class RunLimits(BaseModel):
    """Harness settings that apply to one run (from ``agent_harness.yaml``)."""

    rate_limits: dict[str, int] = Field(
        default_factory=lambda: {"filesystem.write": 100, "shell.run": 50, "mcp.*": 200, "directive.run": 20}
    )
    # Limits over a sliding time window ("100/minute"): pattern -> [calls, window seconds].
    rate_windows: dict[str, tuple[int, float]] = Field(default_factory=dict)
    blocked_commands: list[str] = Field(default_factory=lambda: ["sudo", "rm -rf"])
    loop_repeat_threshold: int = 3
    loop_max_warnings: int = 5
    deadline_seconds: float | None = None
    audit_batch_size: int = 50
    on_escalation: Literal["deny", "intersect"] = "deny"
    max_updates_before_continue: int = 1000
    # Calls that wait for a human's approval: tool ids or globs ("github.*"); a timeout denies.
    approval_tools: list[str] = Field(default_factory=lambda: ["git.rollback"])
    approval_timeout_seconds: float = 3600.0
    approval_webhook: str = ""
    # Who may decide approvals: {name: "ed25519:PUBLIC KEY"} from trusted_keys.yaml (role approve).
    # A decision counts only with that key's signature over the exact request (kiwi.keys).
    approvers: dict[str, str] = Field(default_factory=dict)


class RunTrust(BaseModel):
    """Whether a run's directive was signed, by whom, and which grants it runs with."""

    signature: Literal["unsigned", "valid", "modified", "none"] = "none"
    signer: str = ""
    trusted: bool = False
    content_hash: str = ""
    # The harness's `signatures` setting when the run started.
    mode: Literal["require", "warn", "off"] = "require"
    # declared: the directive's <permissions>; base: only what they share with the harness's base policy.
    grants: Literal["declared", "base"] = "declared"
    note: str = ""
    # Pulled from the shared registry (and unchanged since): registry, namespace, version, content_hash.
    provenance: dict[str, str] = Field(default_factory=dict)


class RunSnapshot(BaseModel):
    """A run's fixed input: editing the directive file later never changes a running run."""

    run_id: str
    directive: Directive
    content_hash: str
    source_path: str = ""
    inputs: dict[str, Any] = Field(default_factory=dict)
    grants: PermissionSet
    project_root: str
    client: str = "cli"
    local_tools: dict[str, LocalToolSpec] = Field(default_factory=dict)
    limits: RunLimits = Field(default_factory=RunLimits)
    search_attributes: bool = False
    # External MCP servers this run may call: names, filters and timeouts only, never how to connect.
    mcp_servers: dict[str, McpServerInfo] = Field(default_factory=dict)
    mcp_skipped: dict[str, str] = Field(default_factory=dict)
    trust: RunTrust = Field(default_factory=RunTrust)
    # A child's snapshot as its parent's resolve_directive activity made it: the seal of that activity's
    # answer (kiwi.seal.seal_resolved), so an answer completed by someone else is refused.
    seal: str = ""


class ToolCallResult(BaseModel):
    status: CallStatus
    tool: str
    result: Any = None
    reason: str = ""
    hint: str = ""
    error_type: str = ""
    warnings: list[str] = Field(default_factory=list)
    call_seq: int = 0


class CallRecord(BaseModel):
    seq: int
    tool: str
    status: CallStatus
    origin: Literal["step", "agent"]
    step: str | None = None
    reason: str = ""
    summary: str = ""
    at: str = ""


class ChildRecord(BaseModel):
    run_id: str
    directive: str
    status: str = "running"
    narrowed: list[str] = Field(default_factory=list)
    error: str = ""
    # Calls of this run's per-run rate budget handed to the child; settled when the child ends.
    reserved: dict[str, int] = Field(default_factory=dict)
    # Calls per window of this run's windowed limits handed to the child while it runs.
    reserved_windows: dict[str, int] = Field(default_factory=dict)


class StepRecord(BaseModel):
    name: str
    status: Literal["pending", "running", "awaiting_agent", "completed", "skipped", "failed"] = "pending"
    mode: Literal["auto", "agent"] = "auto"
    reason: str = ""
    outputs: dict[str, Any] = Field(default_factory=dict)
    prerun_results: list[Any] = Field(default_factory=list)
    started_at: str = ""
    finished_at: str = ""


class HelpRecord(BaseModel):
    kind: Literal["stuck", "escalate", "checkpoint"]
    reason: str = ""
    attempts: int = 0
    options: list[str] = Field(default_factory=list)
    at: str = ""


class McpServerContext(BaseModel):
    """A declared server's tools as the run saw them at its start (recorded, so replays need no server)."""

    server: str
    alias: str | None = None
    required: bool = False
    available: bool = False
    description: str = ""
    tools: list[dict[str, Any]] = Field(default_factory=list)
    tool_hashes: dict[str, str] = Field(default_factory=dict)
    error: str = ""
    hint: str = ""


class ApprovalRequest(BaseModel):
    """One call waiting for a human: bound to that tool and a hash of its exact arguments."""

    request_id: str
    tool: str
    args_hash: str
    summary: str = ""
    requested_by: str = ""
    origin: str = ""
    step: str | None = None
    requested_at: str = ""
    expires_at: str = ""
    status: Literal["pending", "approved", "rejected", "timed_out", "cancelled"] = "pending"
    decided_by: str = ""
    reason: str = ""


class DecisionRequest(BaseModel):
    """An escalation: the agent asks a human to choose; the answer goes back through the run's status."""

    request_id: str
    reason: str = ""
    options: list[str] = Field(default_factory=list)
    asked_at: str = ""
    answer: str = ""
    by: str = ""
    note: str = ""


class RefusedDecision(BaseModel):
    """An approval decision the run did not accept (unknown request, wrong arguments, no approver's signature)."""

    request_id: str
    by: str = ""
    reason: str = ""
    at: str = ""


class RunState(BaseModel):
    """Everything a run has decided so far; carried whole across continue-as-new."""

    status: RunStatusName = "running"
    step_index: int = 0
    steps: dict[str, StepRecord] = Field(default_factory=dict)
    recent_calls: list[CallRecord] = Field(default_factory=list)
    call_seq: int = 0
    call_counts: dict[str, int] = Field(default_factory=dict)
    loop_hashes: list[str] = Field(default_factory=list)
    result_hashes: list[str] = Field(default_factory=list)
    loop_warnings: int = 0
    audit_seq: int = 0
    audit_pending: list[dict[str, Any]] = Field(default_factory=list)
    help: list[HelpRecord] = Field(default_factory=list)
    started_at: str = ""
    error: str = ""
    cancel_reason: str = ""
    continued: int = 0
    recent_updates: dict[str, ToolCallResult] = Field(default_factory=dict)
    # Update id -> call_seq of the agent's last calls, kept far longer than their results: a call
    # Temporal delivers again after continue-as-new is answered, never run twice (see call_tool).
    update_seqs: dict[str, int] = Field(default_factory=dict)
    children: list[ChildRecord] = Field(default_factory=list)
    held_from: str = ""
    hold_reason: str = ""
    # The status its parent was held in when that parent's notice reached the run while it was held for a
    # reason of its own (PARENT_HOLDS_CHILDREN): a human lifting that hold holds it for its parent instead.
    parent_hold_pending: str = ""
    mcp_context: dict[str, McpServerContext] = Field(default_factory=dict)
    mcp_ready: bool = False
    approvals: list[ApprovalRequest] = Field(default_factory=list)
    approval_from: str = ""
    decisions: list[DecisionRequest] = Field(default_factory=list)
    checkpoints: list[dict[str, Any]] = Field(default_factory=list)
    refused_decisions: list[RefusedDecision] = Field(default_factory=list)
    # Holds so far (stuck, awaiting_human): a resume is signed for one hold, never the next.
    holds: int = 0
    # Windowed-limit calls handed to running child runs, per pattern: this run may use the rest.
    window_reserved: dict[str, int] = Field(default_factory=dict)
    # Times (epoch seconds, workflow time) of the calls each windowed rate limit counted, in its window.
    rate_times: dict[str, list[float]] = Field(default_factory=dict)
    # Calls with arguments in the payload store that did not go through (see STORED_REFUSALS).
    stored_refusals: int = 0
    # Signed approvals of calls the run has not asked about yet (EARLY_APPROVALS): applied, and checked
    # again, when the request comes.
    early_approvals: list[ApprovalDecision] = Field(default_factory=list)


class DirectiveRunInput(BaseModel):
    snapshot: RunSnapshot
    state: RunState | None = None


class DirectiveRunResult(BaseModel):
    run_id: str
    status: RunStatusName
    outputs: dict[str, dict[str, Any]] = Field(default_factory=dict)
    error: str = ""
    calls: int = 0
    # Calls counted against each rate-limit pattern: a parent run settles its shared budget with them,
    # and a project's next session starts from them (with the windows' recent call times).
    call_counts: dict[str, int] = Field(default_factory=dict)
    rate_times: dict[str, list[float]] = Field(default_factory=dict)
    # A project's session only: the agent's last calls by update id, so the session that replaces it (the
    # base policy changed) answers a call sent again with its idempotency_key instead of making it twice.
    recent_updates: dict[str, ToolCallResult] = Field(default_factory=dict)
    update_seqs: dict[str, int] = Field(default_factory=dict)
    # A project's session only: its loop detection, and the hold it ended in ("" if none), so ending the
    # session (the agent's cancel, a base policy change) is no way out of a hold or a loop's count.
    loop_hashes: list[str] = Field(default_factory=list)
    result_hashes: list[str] = Field(default_factory=list)
    loop_warnings: int = 0
    hold_reason: str = ""
    # ... and the child runs it started (a held session holds those still running) with the window slots
    # held back for them, as a run continuing-as-new carries them.
    children: list[ChildRecord] = Field(default_factory=list)
    window_reserved: dict[str, int] = Field(default_factory=dict)
    # ... and its audit records' last number: the trail is one file per session id and day, and a flush skips
    # the numbers the file holds, so a successor counting from 1 again was left out of it.
    audit_seq: int = 0
    # ... and how many calls with stored arguments did not go through (a new session started from 0).
    stored_refusals: int = 0


# ---------------------------------------------------------------- updates, signals, queries


class CallToolRequest(BaseModel):
    tool: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    client: str = ""


class CompleteStepRequest(BaseModel):
    step: str
    outputs: dict[str, Any] = Field(default_factory=dict)


class CompleteStepResult(BaseModel):
    step: str
    status: RunStatusName
    next_step: str | None = None


# The seed: a help(stuck) with more than this many failed attempts puts the run in awaiting_human.
STUCK_ATTEMPTS_FOR_HUMAN = 3


class HelpRequest(BaseModel):
    kind: Literal["stuck", "escalate", "checkpoint"]
    reason: str = ""
    attempts: int = 0
    options: list[str] = Field(default_factory=list)
    request_id: str = ""


class ApprovalDecision(BaseModel):
    """Signal ``decide_approval``: a human approves or rejects one pending call.

    ``args_hash`` (optional) pins the decision to the arguments the approver saw.
    """

    request_id: str
    approved: bool
    by: str = ""
    reason: str = ""
    args_hash: str = ""
    # The approver's Ed25519 signature (kiwi.keys.approval_message) by the key named ``by``;
    # `kiwi approve` makes it. Without a valid one the decision is refused and audited.
    signature: str = ""


class DecisionAnswer(BaseModel):
    """Signal ``decide``: a human answers an escalation with one of its options."""

    request_id: str
    option: str
    by: str = ""
    note: str = ""
    # Signature by the approver key ``by`` over kiwi.keys.human_message("decide", ...).
    signature: str = ""


class ResumeRequest(BaseModel):
    """A human lets a run that stopped as ``stuck`` or ``awaiting_human`` carry on."""

    reason: str = ""
    by: str = ""
    # Signature by the approver key ``by`` over kiwi.keys.human_message("resume", run, hold reason).
    signature: str = ""


class ParentHeld(BaseModel):
    """A parent run tells a running child it is held (``stuck`` or ``awaiting_human``): the child holds too
    (PARENT_HOLDS_CHILDREN). Taken only from the child's own parent; resuming the parent resumes it."""

    parent_run_id: str
    status: str = "stuck"


def parent_hold_reason(parent_run_id: str, status: str) -> str:
    """The hold reason of a child held for its parent (how `kiwi resume PARENT` knows it held it)."""
    return f"its parent run {parent_run_id} is {status}; `kiwi resume {parent_run_id}` resumes both"


class CancelRequest(BaseModel):
    reason: str = "cancelled by request"


class ToolContextRequest(BaseModel):
    """Ask a run for the tool context it fetched at its start (waits until it is ready)."""

    wait: bool = True


class ToolContext(BaseModel):
    run_id: str
    status: RunStatusName
    mcps: dict[str, McpServerContext] = Field(default_factory=dict)
    error: str = ""


class StepView(BaseModel):
    name: str
    status: str
    mode: str
    reason: str = ""
    description: str = ""
    action: str = ""
    tools: list[str] = Field(default_factory=list)
    outputs: dict[str, Any] = Field(default_factory=dict)
    prerun_results: list[Any] = Field(default_factory=list)


class RunStatus(BaseModel):
    """What the ``status`` query returns: enough for an operator or an agent to act on."""

    run_id: str
    directive: str
    version: str
    status: RunStatusName
    current_step: StepView | None = None
    steps: list[StepView] = Field(default_factory=list)
    inputs: dict[str, Any] = Field(default_factory=dict)
    waiting_for: str = ""
    last_calls: list[CallRecord] = Field(default_factory=list)
    help: list[HelpRecord] = Field(default_factory=list)
    calls: int = 0
    error: str = ""
    continued: int = 0
    children: list[ChildRecord] = Field(default_factory=list)
    approvals: list[ApprovalRequest] = Field(default_factory=list)
    decisions: list[DecisionRequest] = Field(default_factory=list)
    checkpoints: list[dict[str, Any]] = Field(default_factory=list)
    trust: RunTrust = Field(default_factory=RunTrust)
    refused_decisions: list[RefusedDecision] = Field(default_factory=list)
    hold_reason: str = ""
    # What a human's signature names: this execution of the run (its first run id) and the current hold.
    execution: str = ""
    hold_id: str = ""
    # The OpenTelemetry trace the run was started in ("" when tracing was off).
    trace_id: str = ""
    # When the run times out (ISO time; "" without a deadline): `kiwi run --deadline SECONDS`.
    deadline_at: str = ""
    # Why the run was cancelled, as `kiwi cancel --reason` (or the cancelling client) gave it; "" when it was not.
    cancel_reason: str = ""
    # What fixes a failed run when its error alone does not say (a directive changed after signing):
    # set by the client (RunClient.status), never by the run.
    hint: str = ""


# ---------------------------------------------------------------- activity inputs


class FilesystemRequest(BaseModel):
    project_root: str
    path: str = ""
    destination: str = ""
    content: str | None = None
    encoding: Literal["utf-8", "base64"] = "utf-8"
    allowed: list[str] = Field(default_factory=list)
    denied: list[str] = Field(default_factory=list)
    max_bytes: int = 1_000_000


class CommandRequest(BaseModel):
    project_root: str
    argv: list[str]
    cwd: str = "."
    timeout_seconds: float = 120.0
    max_output_bytes: int = 200_000
    stdin: str = ""
    env: dict[str, str] = Field(default_factory=dict)
    read_grants: list[str] = []
    write_grants: list[str] = []
    deny_fs: list[str] = []


class CheckpointResult(BaseModel):
    """``git_checkpoint``: a snapshot of the project's files under ``refs/kiwi/checkpoints/``, or why not."""

    available: bool
    reason: str = ""
    hint: str = ""
    checkpoint: str = ""
    ref: str = ""
    commit: str = ""
    files: int = 0

    def shown(self) -> dict[str, Any]:
        """As the agent and the audit trail see it: only the fields that say something."""
        return self.model_dump(exclude_defaults=True) | {"available": self.available}


class LocalToolRequest(BaseModel):
    project_root: str
    tool: LocalToolSpec
    params: dict[str, Any] = Field(default_factory=dict)
    max_output_bytes: int = 1_000_000


class ApiToolRequest(BaseModel):
    """One call of an api tool: the hosts the run may reach travel with it, checked on every redirect."""

    tool: LocalToolSpec
    params: dict[str, Any] = Field(default_factory=dict)
    network_hosts: list[str] = Field(default_factory=list)
    deny_network: bool = False
    max_output_bytes: int = 1_000_000


class ContainerToolRequest(BaseModel):
    """One call of a docker tool: the run's filesystem grants decide which of its mounts it gets."""

    project_root: str
    tool: LocalToolSpec
    params: dict[str, Any] = Field(default_factory=dict)
    read_grants: list[str] = Field(default_factory=list)
    write_grants: list[str] = Field(default_factory=list)
    deny_fs: list[str] = Field(default_factory=list)
    max_output_bytes: int = 1_000_000


class CommitFile(BaseModel):
    """One file an approved git.commit takes, as it was when the approval was asked."""

    path: str  # from the repository's top (git's index names)
    shown: str  # from the project's folder (what the agent and the approver see)
    change: str  # git status's two letters (`??` new, ` M` changed, ` D` removed...)
    mode: str = ""  # '' for a removal
    blob: str = ""


class CommitPlan(BaseModel):
    """What a git.commit waiting for approval would commit (``git_commit_plan``): its files' content is fixed
    when the approval is asked, and the approved commit takes that content and nothing else (hostile review s37:
    the approval bound the call's arguments, and the commit took whatever the files held once it was approved,
    changes the agent made while the human was reading included)."""

    base: str = ""  # the branch's commit then ('' before the first)
    tree: str = ""  # base with those files: `git diff BASE TREE` shows the commit
    # With no base, the empty tree, written into the repository: what a first commit is compared with.
    empty_tree: str = ""
    # The branch HEAD named (refs/heads/main; '' detached): the approved commit goes there or nowhere.
    branch: str = ""
    files: list[CommitFile] = Field(default_factory=list)
    left_out: int = 0
    reason: str = ""  # why nothing would be committed

    def _on(self) -> str:
        return (
            f" to {self.branch.removeprefix('refs/heads/')}"
            if self.branch
            else " to a detached HEAD"
            if self.base
            else ""
        )

    def subject(self) -> str:
        """What the approver reads after the call's arguments."""
        if not self.files:
            return ""
        # (Each name quoted when it holds what is no printable text, a newline forged a line of the summary; and
        # shell-quoted when it holds a blank or a comma, `a.md, M b.md` read as two files: review s38.)
        names = ", ".join(f"{f.change} {shown_word(f.shown)}" for f in self.files[:20])
        more = f" and {len(self.files) - 20} more" if len(self.files) > 20 else ""
        return (
            f"; commits{self._on()} {len(self.files)} file(s) as they are now: {names}{more} (see it with `git diff --text "
            f"--no-textconv --no-ext-diff {self.base[:12] or self.empty_tree[:12]} {self.tree[:12]}`, which no .gitattributes "
            "the agent wrote turns into 'Binary files differ'; a change made after this request is not committed)"
        )


class GitRequest(BaseModel):
    project_root: str
    message: str = ""
    paths: list[str] = Field(default_factory=list)
    run_id: str = ""
    checkpoint: str = ""
    # The run's read grants and denials: git.status, git.diff and git.commit show and take only the files it may
    # read (activities.gitsight). None in a request of a run's from before session 35, which sent none.
    read_grants: list[str] | None = None
    deny_fs: list[str] = Field(default_factory=list)
    # git.commit takes only what the run may write (None: a request from before, its reads decide).
    write_grants: list[str] | None = None
    # An approved git.commit commits this, what the approver was shown (None: no approval, or a run from before).
    approved: CommitPlan | None = None


class WebhookRequest(BaseModel):
    url: str
    payload: dict[str, Any] = Field(default_factory=dict)


class AuditBatch(BaseModel):
    project_root: str
    run_id: str
    records: list[dict[str, Any]]


class ResolveDirectiveRequest(BaseModel):
    project_root: str
    directive: str
    inputs: dict[str, Any] = Field(default_factory=dict)
    run_id: str
    client: str = ""
    search_attributes: bool = False


class McpListToolsRequest(BaseModel):
    """``mcp.{server}.list_tools``: the server's tools, through the registry's and the caller's filters."""

    project_root: str
    server: str
    tools: list[str] = Field(default_factory=list)
    refresh: bool = False


class McpListToolsResult(BaseModel):
    server: str
    tools: list[dict[str, Any]] = Field(default_factory=list)
    tool_hashes: dict[str, str] = Field(default_factory=dict)


class McpCallRequest(BaseModel):
    """``mcp.{server}.call_tool``: one upstream call. ``expected_hash`` is the tool schema the run recorded."""

    project_root: str
    server: str
    tool: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    expected_hash: str = ""


class McpCallResult(BaseModel):
    result: dict[str, Any] = Field(default_factory=dict)
    is_error: bool = False
    error_text: str = ""
    schema_changed: str = ""


class BatchItem(BaseModel):
    """One call's outcome in a batch (calls a run's workflow task made together, sent as one local
    activity; see DirectiveRun._batched): its ``value``; or the refusal it ended with (``error_type``,
    not retried); or ``retry``: a failure worth another attempt, which the run makes as a call of its own."""

    value: Any = None
    error_type: str = ""
    message: str = ""
    retry: bool = False


class BatchResult(BaseModel):
    items: list[BatchItem]


class McpCallBatch(BaseModel):
    """``mcp.{server}.call_tools``: calls to one server, each a ``McpCallResult`` item. ``timeout_seconds``
    (the server's timeout) bounds each call on its own: a call past it comes back to be retried alone, while
    the batch's activity (given more time) still answers for the others, which must not run again."""

    requests: list[McpCallRequest]
    timeout_seconds: float = 0.0


class FilesystemBatch(BaseModel):
    """``read_many``: filesystem.read and filesystem.list calls (``operations[i]`` is "read" or "list")."""

    operations: list[str]
    requests: list[FilesystemRequest]


class SearchItemsRequest(BaseModel):
    """``search_items``: kiwi-mcp.search in a run, over the run's project items only."""

    project_root: str
    query: str
    item_type: Literal["directive", "tool", "knowledge"] | None = None
    category: str | None = None
    limit: int = 10


class FoundItem(BaseModel):
    item_type: str
    item_id: str
    name: str = ""
    description: str = ""
    category: str = ""
    tags: list[str] = Field(default_factory=list)
    valid: bool = True
    score: float = 0.0
    snippet: str = ""
    path: str = ""  # relative to the project root


class SearchItemsResult(BaseModel):
    results: list[FoundItem] = Field(default_factory=list)


class LoadItemRequest(BaseModel):
    """``load_item``: kiwi-mcp.load in a run: one item file of the project's ``.ai`` folders, read-only."""

    project_root: str
    item_type: Literal["directive", "tool", "knowledge"]
    item_id: str


# Temporal refuses a payload over 2 MB (its default error limit), and a local activity's result that large
# fails the run's workflow task on every attempt: the run stands still for good. Text an activity hands
# back is kept under this as JSON, where a control character is six bytes (\u0001) and a quote two.
MAX_TEXT_PAYLOAD = 1_400_000
# What an activity's answer may be as sent: below Temporal's 2 MB, leaving room for what wraps it (the call's
# answer, the update's response). workers/answer_limit.py holds every activity to it.
MAX_ANSWER_BYTES = 1_900_000


def json_size(text: str) -> int:
    """The bytes ``text`` takes in a JSON payload."""
    if len(text) * 6 <= MAX_TEXT_PAYLOAD:
        return len(text) * 6  # an upper bound, and small enough: no need to spell it out
    return len(json.dumps(text, ensure_ascii=False).encode())


class LoadItemResult(BaseModel):
    item_type: str
    item_id: str
    path: str  # relative to the project root
    content: str
    valid: bool = True
    problems: list[str] = Field(default_factory=list)
    # A directive's steps: which run by themselves and which wait for the agent.
    steps_plan: list[dict[str, Any]] = Field(default_factory=list)
