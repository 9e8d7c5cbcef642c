"""``DirectiveRun``: one directive run as one Temporal workflow.

Steps run in order. A step whose calls are bound runs them as activities; a step that needs
the agent waits (``awaiting_agent``) until ``complete_step`` arrives. Every tool call, from a
step or from the agent (the ``call_tool`` update), goes through the same path here: tool
lookup, permission check, rate limit, loop detection, activity, audit. Decisions are made in
this deterministic code and recorded in history; side effects happen only in activities.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import math
from datetime import datetime, timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError, ChildWorkflowError
from temporalio.workflow import ActivityCancellationType, ParentClosePolicy

with workflow.unsafe.imports_passed_through():
    from activities.approvals import ApprovalActivities
    from activities.audit import AuditActivities
    from activities.commands import CommandActivities, GitActivities
    from activities.directives import DirectiveActivities
    from activities.filesystem import FilesystemActivities
    from kiwi.conditions import ConditionError, parse_condition
    from kiwi.contracts import (
        DIRECTIVE_ATTR,
        PENDING_APPROVAL_ATTR,
        STATUS_ATTR,
        STEP_ATTR,
        TERMINAL,
        ApprovalDecision,
        ApprovalRequest,
        AuditBatch,
        CallRecord,
        CallToolRequest,
        CancelRequest,
        ChildRecord,
        CommandRequest,
        CompleteStepRequest,
        CompleteStepResult,
        DecisionAnswer,
        DecisionRequest,
        DirectiveRunInput,
        DirectiveRunResult,
        FilesystemRequest,
        GitRequest,
        HelpRecord,
        HelpRequest,
        LocalToolRequest,
        McpCallRequest,
        McpCallResult,
        McpListToolsRequest,
        McpListToolsResult,
        McpServerContext,
        RefusedDecision,
        ResolveDirectiveRequest,
        ResumeRequest,
        RunSnapshot,
        RunState,
        RunStatus,
        StepRecord,
        StepView,
        ToolCallResult,
        ToolContext,
        ToolContextRequest,
        WebhookRequest,
        run_workflow_id,
    )
    from kiwi.directive import McpDeclaration, Step, callable_tool, plan_step
    from kiwi.guards import detect_loop, digest, rate_patterns, redact, summarise_call, summarise_result
    from kiwi.keys import approval_message, human_message, verify_bytes
    from kiwi.policy import BUILTIN_TOOLS, FILESYSTEM_TOOLS, parse_command
    from kiwi.templating import TemplateError, render
    from kiwi.toolargs import BUILTIN_SCHEMAS, ArgumentError, check_arguments, coerce_step_arguments

RETRY = RetryPolicy(initial_interval=timedelta(milliseconds=200), backoff_coefficient=2.0,
                    maximum_interval=timedelta(seconds=10), maximum_attempts=5,
                    non_retryable_error_types=["PermissionDenied", "FileNotFound", "ToolNotFound", "ToolFailed",
                                               "ToolTimeout", "GitUnavailable", "CommandNotFound"])
FS_ACTIVITIES = {
    "filesystem.read": FilesystemActivities.read_file,
    "filesystem.write": FilesystemActivities.write_file,
    "filesystem.list": FilesystemActivities.list_directory,
    "filesystem.create": FilesystemActivities.create_directory,
    "filesystem.delete": FilesystemActivities.delete_path,
    "filesystem.move": FilesystemActivities.move_path,
}
GIT_ACTIVITIES = {"git.status": GitActivities.git_status, "git.diff": GitActivities.git_diff,
                  "git.commit": GitActivities.git_commit}
# Tools that change the project's files: <git_checkpoint mode="auto"> checkpoints after each.
MUTATING_TOOLS = ("filesystem.write", "filesystem.create", "filesystem.delete", "filesystem.move", "shell.run")
HELD = ("stuck", "awaiting_human")
STUCK_ATTEMPTS_FOR_HUMAN = 3  # the seed: more than 3 failed attempts goes to a human
# Upstream MCP servers: transport failures retry (the pool reconnects); refusals do not.
MCP_RETRY = RetryPolicy(initial_interval=timedelta(milliseconds=300), backoff_coefficient=2.0,
                        maximum_interval=timedelta(seconds=10), maximum_attempts=6,
                        non_retryable_error_types=["ToolFailed", "ToolNotFound", "SecretMissing", "McpServerUnknown",
                                                   "McpError"])
# One patch for every workflow change up to this point (see DirectiveRun.run); add new changes as
# patches of their own, and fold them into a new ALL_CHANGES id when the previous one is retired.
ALL_CHANGES = "kiwi-run-changes-2026-11"
# Escapes closed: approval decisions need an approver's signature, help(checkpoint) needs the
# git.checkpoint grant, child runs inherit approval rules and share the parent's rate budget, tool
# arguments are checked before anything is scheduled (a wrong one is InputInvalid, never a failed
# workflow task), and a step's literal <param> text is typed by the tool's input schema.
HARDENED = "kiwi-escapes-closed-2026-11"
MCP_LOCAL_LIMIT = 60.0  # calls that may take longer run as heartbeating activities, with progress
RECENT_CALLS = 20
AUDIT_IDLE_FLUSH = timedelta(seconds=1)
LOOP_WINDOW = 10


class StepFailed(ApplicationError):
    pass


class ToolReportedError(Exception):
    """The upstream tool answered with ``isError``: the call ran, and its content says why it failed."""

    def __init__(self, outcome: McpCallResult) -> None:
        super().__init__(outcome.error_text)
        self.outcome = outcome


class CallRefused(Exception):
    """A call the workflow decided against after looking closer (e.g. a child run's escalation)."""

    def __init__(self, status: str, reason: str, hint: str = "", error_type: str = "PermissionDenied") -> None:
        super().__init__(reason)
        self.status, self.reason, self.hint, self.error_type = status, reason, hint, error_type


@workflow.defn(name="DirectiveRun", failure_exception_types=[TemplateError, ConditionError])
class DirectiveRun:
    @workflow.init
    def __init__(self, input: DirectiveRunInput) -> None:
        self.snap = input.snapshot
        self.state = input.state or RunState()
        self.updates = 0
        self.audit_lock = asyncio.Lock()
        self.draining = False
        self.local_audit = False
        self.idle_flush = False
        self.human_loop = False
        self.fs_local = False
        self.lean = False
        # Checked here, not in run(): signals that arrive with the first task are handled before
        # run() starts, and must already be held to the hardened rules.
        self.hardened = workflow.patched(HARDENED)
        self.background: list[Any] = []

    # ------------------------------------------------------------------ main loop
    @workflow.run
    async def run(self, input: DirectiveRunInput) -> DirectiveRunResult:
        state = self.state
        # Patches are checked once, in the run's first activation, so the marker always sits at
        # the same point of history (checking inside loops made replays diverge).
        # Each recorded patch costs a history marker and a visibility write, so new runs record one
        # marker for every change up to ALL_CHANGES; runs started before it replay their own patches.
        # "lean-boundaries": step-boundary audit flushes overlap the next step, and search
        # attributes are upserted only when they change.
        mcp_context: bool | None = True
        if workflow.patched(ALL_CHANGES):
            self.local_audit = self.idle_flush = self.human_loop = self.fs_local = self.lean = True
        else:
            self.local_audit = workflow.patched("audit-local-activity")
            self.idle_flush = workflow.patched("audit-idle-flush")
            self.human_loop = workflow.patched("human-loop")
            mcp_context = None  # decided below, where that patch has always been checked
        if not state.started_at:
            state.started_at = workflow.now().isoformat()
            trust = self.snap.trust
            self._audit({"event": "run_started", "signature": trust.signature, "signer": trust.signer,
                         "trusted": trust.trusted, "content_hash": self.snap.content_hash,
                         "grants_from": trust.grants, "note": trust.note, "grants": self.snap.grants.summary()})
        directive = self.snap.directive
        self._publish()
        if not state.mcp_ready:
            if directive.metadata.tools.mcps and (mcp_context or workflow.patched("mcp-tool-context")):
                await self._fetch_tool_context(directive.metadata.tools.mcps)
            state.mcp_ready = True
        try:
            while state.step_index < len(directive.steps) and state.status not in TERMINAL:
                step = directive.steps[state.step_index]
                await self._run_step(step)
                if state.status in TERMINAL:
                    break
                state.step_index += 1
                if self.lean:
                    # The flush holds the audit lock; the final flush and continue-as-new wait for it.
                    self.background.append(asyncio.ensure_future(self._flush_audit()))
                else:
                    await self._flush_audit()
                if self._should_continue():
                    await self._continue_as_new()
            if state.status not in TERMINAL:
                state.status = "completed"
        except StepFailed as exc:
            state.status = "failed"
            state.error = exc.message
            self._fail_current_step()
        except TemplateError as exc:
            state.status = "failed"
            state.error = str(exc)
            self._fail_current_step()
        self._audit({"event": "run_finished", "status": state.status, "error": state.error})
        self._publish()
        await workflow.wait_condition(workflow.all_handlers_finished)
        await self._flush_audit(force=True)
        if state.status == "failed":
            raise ApplicationError(state.error, type="StepFailed", non_retryable=True)
        if state.status == "timed_out":
            raise ApplicationError(state.error, type="RunTimedOut", non_retryable=True)
        return self._result()

    async def _run_step(self, step: Step) -> None:
        state = self.state
        record = state.steps.get(step.name) or StepRecord(name=step.name)
        state.steps[step.name] = record
        if record.status in ("completed", "skipped"):
            return
        context = self._context()
        if step.condition and record.status == "pending" and not parse_condition(step.condition).evaluate(context):
            record.status = "skipped"
            record.reason = f"condition false: {step.condition}"
            self._audit({"event": "step_skipped", "step": step.name, "reason": record.reason})
            return
        plan = plan_step(step, self.snap.directive, frozenset(self.snap.local_tools))
        record.mode = plan.mode
        record.reason = plan.reason
        if record.status == "pending":
            record.status = "running"
            record.started_at = workflow.now().isoformat()
            self._publish()
            if plan.mode == "auto" or plan.prerun:
                for call in step.tool_calls:
                    await workflow.wait_condition(lambda: state.status not in HELD or bool(state.cancel_reason))
                    if state.cancel_reason:
                        state.status = "cancelled"
                        return
                    args = render(call.params, self._context())
                    if self.hardened:
                        try:
                            args = coerce_step_arguments(call.tool, call.params, args, self._input_schema(call.tool))
                        except ArgumentError as exc:
                            raise StepFailed(f"step '{step.name}': {exc.reason} ({exc.hint})", type="StepFailed",
                                             non_retryable=True) from None
                    result = await self._call(call.tool, args, origin="step", step=step.name)
                    if result.status != "ok":
                        raise StepFailed(f"step '{step.name}': {call.tool} {result.status}: {result.reason}",
                                         type="StepFailed", non_retryable=True)
                    record.prerun_results.append(result.result)
        if plan.mode == "auto":
            results = record.prerun_results
            record.outputs = {"result": results[-1] if results else None, "results": results}
            self._finish_step(record)
            return
        record.status = "awaiting_agent"
        if state.status not in HELD:
            state.status = "awaiting_agent"
        self._publish()
        while True:
            timeout = self._remaining()
            idle_flush = self.idle_flush
            if state.audit_pending and idle_flush:
                # Calls made while the step waits reach the audit file within seconds, not only
                # at the next step boundary.
                timeout = min(timeout, AUDIT_IDLE_FLUSH) if timeout else AUDIT_IDLE_FLUSH
            try:
                armed = bool(state.audit_pending) or not idle_flush
                await workflow.wait_condition(
                    lambda armed=armed: record.status != "awaiting_agent" or bool(state.cancel_reason)
                    or self._should_continue() or (bool(state.audit_pending) and not armed),
                    timeout=timeout)
            except TimeoutError:
                if self._remaining() is None or self._remaining() > timedelta(milliseconds=1):
                    await self._flush_audit()
                    continue
                state.status = "timed_out"
                state.error = f"run deadline of {self.snap.limits.deadline_seconds:g}s passed while step " \
                              f"'{step.name}' waited for the agent"
                return
            if state.cancel_reason:
                state.status = "cancelled"
                return
            if record.status != "awaiting_agent":
                state.status = "running"
                return
            if self._should_continue():
                await self._continue_as_new()

    def _finish_step(self, record: StepRecord) -> None:
        record.status = "completed"
        record.finished_at = workflow.now().isoformat()
        self._audit({"event": "step_completed", "step": record.name, "mode": record.mode,
                     "outputs": redact(record.outputs)})

    # ------------------------------------------------------------------ handlers
    @workflow.update
    async def call_tool(self, request: CallToolRequest) -> ToolCallResult:
        """Make one tool call through the run's policy (the agent's path to every tool)."""
        self.updates += 1
        # A caller that lost the answer while the run continued-as-new sends the same update id
        # again; answer it from the carried state instead of calling the tool twice.
        update_id = workflow.current_update_info().id if workflow.current_update_info() else ""
        if update_id in self.state.recent_updates:
            return self.state.recent_updates[update_id]
        result = await self._call(request.tool, request.arguments, origin="agent", client=request.client)
        if update_id:
            recent = {**self.state.recent_updates, update_id: result}
            self.state.recent_updates = dict(list(recent.items())[-50:])
        return result

    @call_tool.validator
    def _validate_call_tool(self, request: CallToolRequest) -> None:
        if self.draining:
            raise ApplicationError("run is continuing as new; send the call again", type="RunContinuing")
        if self.state.status in TERMINAL:
            raise ApplicationError(f"run {self.snap.run_id} has finished ({self.state.status}); start a new run",
                                   type="RunFinished")
        self._refuse_if_held()
        if not request.tool:
            raise ApplicationError("'tool' is required, e.g. filesystem.read", type="InputInvalid")

    @workflow.update
    async def complete_step(self, request: CompleteStepRequest) -> CompleteStepResult:
        """The agent finished the current step; ``outputs`` become ``{steps.NAME.outputs.KEY}``."""
        self.updates += 1
        record = self.state.steps[request.step]
        record.outputs = {**({"prerun_results": record.prerun_results} if record.prerun_results else {}),
                          **request.outputs}
        self._finish_step(record)
        index = next(i for i, s in enumerate(self.snap.directive.steps) if s.name == request.step)
        last = len(self.snap.directive.steps) - 1
        await workflow.wait_condition(lambda: self.state.status in TERMINAL or (
            self.state.step_index > index and index < last))
        next_step = self._current_step_name()
        return CompleteStepResult(step=request.step, status=self.state.status, next_step=next_step)

    @complete_step.validator
    def _validate_complete_step(self, request: CompleteStepRequest) -> None:
        if self.draining:
            raise ApplicationError("run is continuing as new; send the call again", type="RunContinuing")
        record = self.state.steps.get(request.step)
        if self.state.status in TERMINAL:
            raise ApplicationError(f"run {self.snap.run_id} has finished ({self.state.status})",
                                   type="RunFinished")
        self._refuse_if_held()
        if record is None or record.status != "awaiting_agent":
            current = self._current_step_name()
            waiting = current if current and self.state.steps.get(current, StepRecord(name="")).status == \
                "awaiting_agent" else None
            raise ApplicationError(
                f"step '{request.step}' is not waiting for the agent"
                + (f"; step '{waiting}' is" if waiting else "; no step is waiting now"),
                type="RunStateConflict")

    @workflow.update
    async def tool_context(self, request: ToolContextRequest) -> ToolContext:
        """The declared MCP servers' tools as fetched when the run started (waits until fetched)."""
        if request.wait:
            await workflow.wait_condition(lambda: self.state.mcp_ready)
        return ToolContext(run_id=self.snap.run_id, status=self.state.status, mcps=self.state.mcp_context,
                           error=self.state.error)

    @workflow.signal
    def cancel(self, request: CancelRequest) -> None:
        if self.state.status not in TERMINAL:
            self.state.cancel_reason = request.reason or "cancelled"
            self._audit({"event": "cancel_requested", "reason": self.state.cancel_reason})

    @workflow.signal
    def help(self, request: HelpRequest) -> None:
        """Agent control signals: stuck, escalate, checkpoint. Recorded and shown in the status."""
        self.state.help.append(HelpRecord(kind=request.kind, reason=request.reason, attempts=request.attempts,
                                          options=request.options, at=workflow.now().isoformat()))
        self._audit({"event": f"help_{request.kind}", "reason": request.reason, "attempts": request.attempts})
        if request.kind == "stuck" and request.attempts > STUCK_ATTEMPTS_FOR_HUMAN:
            self._hold("awaiting_human", f"the agent is stuck after {request.attempts} attempts: {request.reason}")
        if self.human_loop and request.kind == "escalate":
            request_id = request.request_id or f"decision-{len(self.state.decisions) + 1}"
            self.state.decisions = [*self.state.decisions, DecisionRequest(
                request_id=request_id, reason=request.reason, options=request.options,
                asked_at=workflow.now().isoformat())][-50:]
            self._hold("awaiting_human", f"escalation {request_id}: {request.reason}")
        if self.human_loop and request.kind == "checkpoint" and \
                self.snap.directive.metadata.git_checkpoint != "disabled":
            decision = self.snap.grants.check_tool_id("git.checkpoint")
            if self.hardened and not decision.allowed:
                # A checkpoint runs git in the project: the same grant as the git.checkpoint tool.
                self._audit({"event": "help_checkpoint_denied", "decision": "denied", "reason": decision.reason,
                             "hint": decision.hint})
            else:
                self.background.append(asyncio.ensure_future(self._checkpoint(request.reason or "the agent asked")))
        self._publish()

    @workflow.signal
    def resume(self, request: ResumeRequest) -> None:
        """A human lets a held run (stuck, awaiting_human) carry on; loop warnings start again from zero."""
        if self.state.status not in HELD:
            return
        if self.hardened:
            refused = self._human_problem(request.by, request.signature, human_message(
                "resume", self.snap.run_id, self._execution(), self._hold_id(), "", request.by), "kiwi resume")
            if refused:
                self._refuse_decision("resume_refused", "resume", request.by, refused)
                return
        self._release(request)

    def _release(self, request: ResumeRequest) -> None:
        self._audit({"event": "resumed", "from": self.state.status, "reason": request.reason, "by": request.by})
        self.state.status = self.state.held_from or "running"  # type: ignore[assignment]
        self.state.held_from = self.state.hold_reason = ""
        self.state.loop_warnings = 0
        self._publish()

    def _hold(self, status: str, reason: str) -> None:
        if self.state.status in TERMINAL or self.state.status in HELD:
            return
        self.state.held_from = self.state.status
        self.state.holds += 1
        self.state.status = status  # type: ignore[assignment]
        self.state.hold_reason = reason
        self._audit({"event": "held", "status": status, "reason": reason})

    def _refuse_if_held(self) -> None:
        if self.state.status in HELD:
            raise ApplicationError(
                f"run {self.snap.run_id} is {self.state.status} ({self.state.hold_reason}); a human must resume it "
                f"with `kiwi resume {self.snap.run_id}`", type="RunStateConflict")

    @workflow.query
    def status(self) -> RunStatus:
        directive = self.snap.directive
        views = [self._view(s) for s in directive.steps]
        current_name = self._current_step_name()
        current = next((v for v in views if v.name == current_name), None)
        waiting = ""
        if self.state.status == "awaiting_agent" and current:
            waiting = f"the agent to complete step '{current.name}'"
        elif self.state.status in HELD:
            open_ = [d for d in self.state.decisions if not d.answer]
            waiting = (f"a human to answer escalation {open_[-1].request_id} ({open_[-1].reason}): kiwi decide "
                       f"{self.snap.run_id} {open_[-1].request_id} OPTION" if open_ and self.state.status ==
                       "awaiting_human" else
                       f"a human to resume the run ({self.state.hold_reason}): kiwi resume {self.snap.run_id}")
        elif self.state.status == "awaiting_approval":
            pending = [a for a in self.state.approvals if a.status == "pending"]
            waiting = "; ".join(f"approval of {a.summary} until {a.expires_at}: kiwi approve {self.snap.run_id} "
                                f"{a.request_id}" for a in pending)
        return RunStatus(run_id=self.snap.run_id, directive=directive.name, version=directive.version,
                         status=self.state.status, current_step=current, steps=views, inputs=self.snap.inputs,
                         waiting_for=waiting, last_calls=self.state.recent_calls[-10:], help=self.state.help,
                         calls=self.state.call_seq, error=self.state.error, continued=self.state.continued,
                         children=self.state.children, approvals=self.state.approvals[-20:],
                         decisions=self.state.decisions[-20:], checkpoints=self.state.checkpoints[-20:],
                         trust=self.snap.trust, refused_decisions=self.state.refused_decisions,
                         hold_reason=self.state.hold_reason, execution=self._execution(),
                         hold_id=self._hold_id() if self.state.status in HELD else "")

    # ------------------------------------------------------------------ the call path
    async def _call(self, tool: str, args: dict[str, Any], *, origin: str, step: str | None = None,
                    client: str = "") -> ToolCallResult:
        state, snap = self.state, self.snap
        state.call_seq += 1
        seq = state.call_seq
        step = step or self._current_step_name()
        started = workflow.now()
        declared = self._mcp_declaration(tool)
        if declared is not None:
            # An alias (<mcp name="supabase" alias="db">) is only a spelling: policy and audit see the server.
            tool = f"{declared.name}.{tool.partition('.')[2]}"
            if declared.name not in state.mcp_context:
                await self._fetch_tool_context([declared])
        result, warning = self._admit(tool, args, seq)
        if result is None and self.human_loop and self._needs_approval(tool):
            result = await self._await_approval(tool, args, seq, origin, step, client or snap.client)
        if result is None:
            warnings = [warning] if warning else []
            try:
                value = await self._execute(tool, args, origin, warnings)
                result = ToolCallResult(status="ok", tool=tool, result=value, call_seq=seq, warnings=warnings)
            except ToolReportedError as exc:
                result = ToolCallResult(status="error", tool=tool, result=exc.outcome.result, call_seq=seq,
                                        reason=exc.outcome.error_text or "the tool reported an error",
                                        error_type="ToolFailed", warnings=warnings)
            except CallRefused as exc:
                result = ToolCallResult(status=exc.status, tool=tool, reason=exc.reason, hint=exc.hint,  # type: ignore[arg-type]
                                        error_type=exc.error_type, call_seq=seq)
            except (ActivityError, ApplicationError) as exc:
                kind, message = failure_of(exc)
                result = ToolCallResult(status="denied" if kind == "PermissionDenied" else "error", tool=tool,
                                        reason=message, error_type=kind, call_seq=seq)
            if result.status == "ok":
                result_hash = digest(result.result)
                state.result_hashes = (state.result_hashes + [result_hash])[-LOOP_WINDOW:]
                same = state.result_hashes[-snap.limits.loop_repeat_threshold:]
                if (len(same) == snap.limits.loop_repeat_threshold and len(set(same)) == 1
                        and len(set(state.loop_hashes[-snap.limits.loop_repeat_threshold:])) > 1):
                    result.warnings.append("the same result came back several times in a row; you may be looping")
                    state.loop_warnings += 1
        if result.status == "ok" and self.human_loop and snap.directive.metadata.git_checkpoint == "auto" and (
                tool in MUTATING_TOOLS or (tool in snap.local_tools and snap.local_tools[tool].mutates_state)):
            await self._checkpoint(f"after {tool}")
        state.recent_calls = (state.recent_calls + [CallRecord(
            seq=seq, tool=tool, status=result.status, origin=origin, step=step, reason=result.reason,
            summary=summarise_call(tool, args), at=started.isoformat())])[-RECENT_CALLS:]
        self._audit({"event": "tool_call", "call_seq": seq, "origin": origin, "step": step,
                     "client": client or snap.client, "tool": tool, "arguments": redact(args),
                     "decision": "allowed" if result.status == "ok" or (
                         result.status == "error" and result.error_type != "ToolNotFound") else result.status,
                     "reason": result.reason, "hint": result.hint, "error_type": result.error_type,
                     "result": summarise_result(result.result) if result.status == "ok" else "",
                     "duration_ms": int((workflow.now() - started).total_seconds() * 1000)})
        if state.loop_warnings >= snap.limits.loop_max_warnings:
            self._hold("stuck", f"{state.loop_warnings} loop warnings")
            self._publish()
        if len(state.audit_pending) >= snap.limits.audit_batch_size:
            await self._flush_audit()
        return result

    def _admit(self, tool: str, args: dict[str, Any], seq: int) -> tuple[ToolCallResult | None, str]:
        """Tool lookup, permission, rate limit and loop checks; a result here means 'not executed'."""
        snap, state = self.snap, self.state
        if not callable_tool(tool, snap.directive, frozenset(snap.local_tools)):
            known = ", ".join(sorted([*BUILTIN_TOOLS, *snap.local_tools]))
            return ToolCallResult(status="error", tool=tool, error_type="ToolNotFound", call_seq=seq,
                                  reason=f"no tool '{tool}' in this run",
                                  hint=f"tools this run can call: {known}"), ""
        refusal = self._mcp_refusal(tool, seq)
        if refusal is not None:
            return refusal, ""
        if self.hardened:
            problem = check_arguments(tool, args)
            if problem is not None:
                return ToolCallResult(status="error", tool=tool, error_type="InputInvalid", call_seq=seq,
                                      reason=problem.reason, hint=problem.hint), ""
        decision = snap.grants.check(tool, args, blocked_commands=snap.limits.blocked_commands)
        if not decision.allowed:
            return ToolCallResult(status="denied", tool=tool, reason=decision.reason, hint=decision.hint,
                                  error_type="PermissionDenied", call_seq=seq), ""
        patterns = rate_patterns(tool, snap.limits.rate_limits, snap.local_tools)
        for pattern in patterns:
            count = state.call_counts.get(pattern, 0) + 1
            if count > snap.limits.rate_limits[pattern]:
                return ToolCallResult(status="rate_limited", tool=tool, error_type="RateLimited", call_seq=seq,
                                      reason=f"rate limit for {pattern} is {snap.limits.rate_limits[pattern]} "
                                             "calls per run"), ""
        windows = rate_patterns(tool, snap.limits.rate_windows, snap.local_tools) if snap.limits.rate_windows else []
        now = workflow.now().timestamp()
        for pattern in windows:
            calls, seconds = snap.limits.rate_windows[pattern]
            calls -= state.window_reserved.get(pattern, 0)  # handed to running child runs
            recent = [t for t in state.rate_times.get(pattern, []) if t > now - seconds]
            state.rate_times[pattern] = recent
            if len(recent) >= calls:
                wait = math.ceil(recent[0] + seconds - now) if recent else seconds
                return ToolCallResult(status="rate_limited", tool=tool, error_type="RateLimited", call_seq=seq,
                                      reason=f"rate limit for {pattern} is {calls} calls per {seconds:g}s",
                                      hint=f"try again in {wait:g}s"), ""
        for pattern in patterns:
            state.call_counts[pattern] = state.call_counts.get(pattern, 0) + 1
        for pattern in windows:
            state.rate_times[pattern].append(now)
        state.loop_hashes = (state.loop_hashes + [digest([tool, args])])[-LOOP_WINDOW:]
        warning = detect_loop(state.loop_hashes, snap.limits.loop_repeat_threshold)
        if warning:
            state.loop_warnings += 1
        return None, warning

    def _input_schema(self, tool: str) -> dict[str, Any] | None:
        """The JSON Schema of ``tool``'s input: a built-in's, a local tool's manifest, an MCP tool's as listed
        when the run started (None when unknown)."""
        if tool in BUILTIN_SCHEMAS:
            return BUILTIN_SCHEMAS[tool]
        if tool in self.snap.local_tools:
            return self.snap.local_tools[tool].input_schema or None
        declared = self._mcp_declaration(tool)
        context = self.state.mcp_context.get(declared.name) if declared is not None else None
        if declared is None or context is None:
            return None
        name = f"{declared.name}.{tool.partition('.')[2]}"
        listed = next((t for t in context.tools if t.get("name") == name), None)
        schema = listed.get("inputSchema") if listed else None
        return schema if isinstance(schema, dict) else None

    def _fail_current_step(self) -> None:
        """The step a failed run stopped at shows ``failed``, not ``running``."""
        record = self.state.steps.get(self._current_step_name() or "")
        if record is not None and record.status not in ("completed", "skipped"):
            record.status = "failed"
            record.finished_at = workflow.now().isoformat()

    async def _execute(self, tool: str, args: dict[str, Any], origin: str = "step",
                       warnings: list[str] | None = None) -> Any:
        snap = self.snap
        root = snap.project_root
        summary = summarise_call(tool, args)
        options: dict[str, Any] = {"start_to_close_timeout": timedelta(seconds=60), "retry_policy": RETRY,
                                   "summary": summary}
        if tool in FILESYSTEM_TOOLS:
            read_only = tool in ("filesystem.read", "filesystem.list")
            grants = snap.grants.fs_read if read_only else snap.grants.fs_write
            content = args.get("content")
            request = FilesystemRequest(project_root=root, path=str(args.get("source" if tool == "filesystem.move" else "path") or ""),
                                        destination=str(args.get("destination", "")),
                                        content=content if isinstance(content, str) or content is None else
                                        str(content), encoding=args.get("encoding", "utf-8"),
                                        allowed=grants, denied=snap.grants.deny_fs)
            if self.fs_local:
                # A local activity: run by this worker inside the workflow task, no task-queue round
                # trip and no activity events; same timeout, retry policy and at-least-once contract.
                value = await workflow.execute_local_activity_method(FS_ACTIVITIES[tool], request, **options)
            else:
                value = await workflow.execute_activity_method(FS_ACTIVITIES[tool], request, **options)
        elif tool == "shell.run":
            argv = parse_command(args)
            assert isinstance(argv, list)
            request = CommandRequest(project_root=root, argv=argv, cwd=str(args.get("cwd", ".")),
                                     timeout_seconds=float(args.get("timeout", 120)),
                                     read_grants=snap.grants.fs_read, write_grants=snap.grants.fs_write,
                                     deny_fs=snap.grants.deny_fs)
            value = await workflow.execute_activity_method(
                CommandActivities.run_command, request, heartbeat_timeout=timedelta(seconds=10),
                **{**options, "start_to_close_timeout": timedelta(seconds=request.timeout_seconds + 30)})
        elif tool == "git.checkpoint":
            if snap.directive.metadata.git_checkpoint == "disabled":
                raise CallRefused("denied", "git checkpoints are disabled for this directive",
                                  hint='<git_checkpoint mode="disabled"> is set in the directive')
            value = await self._checkpoint(str(args.get("message") or args.get("reason") or "requested"))
        elif tool == "git.rollback":
            checkpoint = str(args.get("checkpoint") or (self.state.checkpoints[-1]["checkpoint"]
                                                         if self.state.checkpoints else ""))
            value = await workflow.execute_activity_method(
                GitActivities.git_rollback, GitRequest(project_root=root, run_id=snap.run_id, checkpoint=checkpoint),
                **{**options, "summary": f"git rollback to {checkpoint}"})
            self._audit({"event": "rolled_back", "checkpoint": checkpoint})
        elif tool in GIT_ACTIVITIES:
            request = GitRequest(project_root=root, message=str(args.get("message", "")),
                                 paths=[str(p) for p in args.get("paths", [])])
            value = await workflow.execute_activity_method(GIT_ACTIVITIES[tool], request, **options)
        elif tool == "directive.run":
            value = await self._run_child(args, origin)
        elif tool.partition(".")[0] in self.state.mcp_context:
            value = await self._call_mcp(tool, args, warnings if warnings is not None else [])
        elif tool in snap.local_tools:
            spec = snap.local_tools[tool]
            value = await workflow.execute_activity_method(
                CommandActivities.run_local_tool, LocalToolRequest(project_root=root, tool=spec, params=args),
                heartbeat_timeout=timedelta(seconds=10),
                **{**options, "summary": f"tool {tool}",
                   "start_to_close_timeout": timedelta(seconds=spec.timeout_seconds + 30)})
        else:
            raise ApplicationError(f"no executor for '{tool}' in this run", type="ToolNotFound", non_retryable=True)
        return value

    # ------------------------------------------------------------------ humans in the loop
    def _approval_patterns(self) -> list[str]:
        patterns = [*self.snap.limits.approval_tools, *self.snap.directive.metadata.approvals]
        for server, info in self.snap.mcp_servers.items():
            patterns += [f"{server}.{t}" for t in info.require_approval]
        return patterns

    def _needs_approval(self, tool: str) -> bool:
        return any(fnmatch.fnmatchcase(tool, p) for p in self._approval_patterns())

    async def _await_approval(self, tool: str, args: dict[str, Any], seq: int, origin: str, step: str | None,
                              client: str) -> ToolCallResult | None:
        """Wait, durably, for a human to approve this exact call; None means approved."""
        state, snap = self.state, self.snap
        timeout = snap.directive.metadata.approval_timeout_seconds or snap.limits.approval_timeout_seconds
        server = tool.partition(".")[0]
        if server in snap.mcp_servers and snap.mcp_servers[server].approval_timeout_seconds:
            timeout = snap.mcp_servers[server].approval_timeout_seconds or timeout
        now = workflow.now()
        request = ApprovalRequest(request_id=f"approval-{seq}", tool=tool, args_hash=digest([tool, args]),
                                  summary=summarise_call(tool, args), requested_by=client, origin=origin, step=step,
                                  requested_at=now.isoformat(),
                                  expires_at=(now + timedelta(seconds=timeout)).isoformat())
        state.approvals = [*state.approvals, request][-50:]
        if state.status != "awaiting_approval" and state.status not in TERMINAL:
            state.approval_from = state.status
            state.status = "awaiting_approval"
        self._audit({"event": "approval_requested", "request_id": request.request_id, "tool": tool,
                     "arguments": redact(args), "args_hash": request.args_hash, "requested_by": client,
                     "expires_at": request.expires_at})
        self._publish()
        if snap.limits.approval_webhook:
            payload = {"event": "approval_requested", "run_id": snap.run_id, "directive": snap.directive.name,
                       **request.model_dump(include={"request_id", "tool", "summary", "args_hash", "requested_by",
                                                     "expires_at"}),
                       "approve": f"kiwi approve {snap.run_id} {request.request_id}",
                       "reject": f"kiwi reject {snap.run_id} {request.request_id}"}
            self.background.append(workflow.start_activity_method(
                ApprovalActivities.notify_approvers, WebhookRequest(url=snap.limits.approval_webhook, payload=payload),
                start_to_close_timeout=timedelta(seconds=30), summary=f"notify approvers of {request.request_id}",
                retry_policy=RetryPolicy(initial_interval=timedelta(seconds=1), maximum_interval=timedelta(minutes=1),
                                         maximum_attempts=10)))
        try:
            await workflow.wait_condition(lambda: request.status != "pending" or bool(state.cancel_reason),
                                          timeout=timedelta(seconds=timeout),
                                          timeout_summary=f"approval {request.request_id} expires")
        except TimeoutError:
            request.status = "timed_out"
            request.reason = f"no decision within {timeout:g}s; a timeout denies"
            self._audit({"event": "approval_timed_out", "request_id": request.request_id, "tool": tool})
        if request.status == "pending":
            request.status = "cancelled"
        if state.status == "awaiting_approval" and not any(a.status == "pending" for a in state.approvals):
            state.status = state.approval_from or "running"  # type: ignore[assignment]
        self._publish()
        if request.status == "approved":
            return None
        kinds = {"rejected": "ApprovalRejected", "timed_out": "ApprovalTimedOut", "cancelled": "ApprovalCancelled"}
        return ToolCallResult(status="denied", tool=tool, call_seq=seq, error_type=kinds[request.status],
                              reason=f"approval {request.request_id} {request.status.replace('_', ' ')}"
                                     + (f" by {request.decided_by}" if request.decided_by else "")
                                     + (f": {request.reason}" if request.reason else ""),
                              hint="a changed call needs a new approval" if request.status == "rejected" else "")

    async def _checkpoint(self, why: str) -> dict[str, Any]:
        """A git checkpoint of the project's files; recorded in the run when git is available."""
        label = f"{self.snap.run_id}/{len(self.state.checkpoints) + 1}"
        value = await workflow.execute_activity_method(
            GitActivities.git_checkpoint,
            GitRequest(project_root=self.snap.project_root, run_id=self.snap.run_id, checkpoint=label,
                       message=f"kiwi checkpoint {label}: {why}"),
            start_to_close_timeout=timedelta(seconds=120), retry_policy=RETRY, summary=f"git checkpoint: {why}"[:100])
        if value.get("available"):
            self.state.checkpoints = [*self.state.checkpoints,
                                      {"checkpoint": label, "commit": value["commit"], "why": why,
                                       "at": workflow.now().isoformat()}][-100:]
        self._audit({"event": "checkpoint", "why": why, **value})
        return value

    @workflow.signal
    def decide_approval(self, decision: ApprovalDecision) -> None:
        """A human approves or rejects a pending call (``kiwi approve`` / ``kiwi reject``, or the Temporal UI)."""
        request = next((a for a in self.state.approvals if a.request_id == decision.request_id), None)
        refused = ""
        if request is None:
            refused = f"no approval request '{decision.request_id}'"
        elif request.status != "pending":
            refused = f"{decision.request_id} is already {request.status}"
        elif decision.args_hash and decision.args_hash != request.args_hash:
            refused = "the decision names other arguments than the pending call; a changed call needs a new approval"
        elif decision.by and decision.by == request.requested_by:
            refused = f"'{decision.by}' made the call and cannot approve it"
        elif self.hardened:
            refused = self._human_problem(decision.by, decision.signature, approval_message(
                self.snap.run_id, self._execution(), request.request_id, request.args_hash, decision.approved,
                decision.by),
                f"kiwi approve {self.snap.run_id} {request.request_id}")
        if refused:
            self._refuse_decision("approval_decision_refused", decision.request_id, decision.by, refused)
            return
        assert request is not None
        request.status = "approved" if decision.approved else "rejected"
        request.decided_by = decision.by or "unknown"
        request.reason = decision.reason
        self._audit({"event": "approval_decided", "request_id": request.request_id, "tool": request.tool,
                     "decision": request.status, "by": request.decided_by, "reason": decision.reason})

    def _human_problem(self, by: str, signature: str, message: bytes, command: str) -> str:
        """Why a human's decision does not come from a trusted approver ('' when it does).

        The caller of a run (an agent, a tool it runs) can send a signal, but cannot sign one: the
        approvers' private keys never reach the worker or its tools.
        """
        approvers = self.snap.limits.approvers
        if not approvers:
            return "no approvers are configured (trusted_keys.yaml role approve): create one with `kiwi keys init`"
        key = approvers.get(by)
        if key is None:
            return f"'{by or 'nobody'}' is not a trusted approver (approvers: {', '.join(sorted(approvers))})"
        if not signature or not verify_bytes(key, message, signature):
            return f"not signed by {by}'s key for exactly this decision; send it with `{command} --as {by}`"
        return ""

    def _execution(self) -> str:
        """This execution of the run: its first run id, kept across continue-as-new, new when the id is reused."""
        return workflow.info().first_execution_run_id

    def _hold_id(self) -> str:
        return f"hold-{self.state.holds}"

    def _refuse_decision(self, event: str, subject: str, by: str, reason: str) -> None:
        """Every refused human decision is in the audit trail, and (in hardened runs) in the run's status."""
        self._audit({"event": event, "request_id": subject, "by": by, "reason": reason})
        if self.hardened:
            self.state.refused_decisions = [*self.state.refused_decisions, RefusedDecision(
                request_id=subject, by=by, reason=reason, at=workflow.now().isoformat())][-20:]

    @workflow.signal
    def decide(self, answer: DecisionAnswer) -> None:
        """A human answers an escalation (``kiwi decide RUN REQUEST OPTION``); the run carries on."""
        request = next((d for d in self.state.decisions if d.request_id == answer.request_id), None)
        signer = self._human_problem(answer.by, answer.signature, human_message(
            "decide", self.snap.run_id, self._execution(), answer.request_id, answer.option, answer.by),
            "kiwi decide") \
            if self.hardened else ""
        if request is None or request.answer or (request.options and answer.option not in request.options) or signer:
            why = ("no such escalation" if request is None else "already answered" if request.answer else
                   f"'{answer.option}' is not one of {', '.join(request.options)}" if request.options and
                   answer.option not in request.options else signer)
            self._refuse_decision("decision_refused", answer.request_id, answer.by, why)
            return
        request.answer, request.by, request.note = answer.option, answer.by or "unknown", answer.note
        self._audit({"event": "decided", "request_id": request.request_id, "option": answer.option, "by": request.by})
        if self.state.status == "awaiting_human" and not any(not d.answer for d in self.state.decisions):
            self._release(ResumeRequest(reason=f"escalation {request.request_id} answered: {answer.option}",
                                        by=request.by))

    # ------------------------------------------------------------------ external MCP servers
    def _mcp_declaration(self, tool: str) -> McpDeclaration | None:
        server, _, name = tool.partition(".")
        if not name:
            return None
        return next((d for d in self.snap.directive.metadata.tools.mcps if server in (d.name, d.alias)), None)

    async def _fetch_tool_context(self, declarations: list[McpDeclaration]) -> None:
        """Fetch the declared servers' tool schemas once, into the run's state (and so its history)."""
        async def one(decl: McpDeclaration) -> McpServerContext:
            context = McpServerContext(server=decl.name, alias=decl.alias, required=decl.required)
            info = self.snap.mcp_servers.get(decl.name)
            if info is None:
                context.error = self.snap.mcp_skipped.get(decl.name) or f"no MCP server '{decl.name}' is configured"
                context.hint = (f"add '{decl.name}' under mcps: in .ai/config/mcp_registry.yaml"
                                if decl.name not in self.snap.mcp_skipped else
                                "set the missing variable where the front end and worker run, then start a new run")
                return context
            context.description = info.description
            try:
                listed = await workflow.execute_local_activity(
                    f"mcp.{decl.name}.list_tools",
                    McpListToolsRequest(project_root=self.snap.project_root, server=decl.name, tools=decl.tools,
                                        refresh=decl.refresh),
                    result_type=McpListToolsResult, start_to_close_timeout=timedelta(seconds=60),
                    retry_policy=RetryPolicy(initial_interval=timedelta(milliseconds=300), maximum_attempts=3,
                                             non_retryable_error_types=MCP_RETRY.non_retryable_error_types),
                    summary=f"list tools: {decl.name}")
            except (ActivityError, ApplicationError) as exc:
                # A local activity's final failure can arrive unwrapped (an ApplicationError).
                context.error = failure_of(exc)[1]
                context.hint = f"check that MCP server '{decl.name}' starts (see mcp_registry.yaml), then start a " \
                               "new run"
                return context
            context.available = True
            context.tools = [{**t, "name": f"{decl.name}.{t['name']}"} for t in listed.tools]
            context.tool_hashes = listed.tool_hashes
            offered = set(listed.tool_hashes)
            missing = [t for t in decl.tools if t not in offered]
            if missing:
                context.hint = f"declared but not offered by the server (or hidden by its registry filter): " \
                               f"{', '.join(missing)}"
            return context

        contexts = await asyncio.gather(*(one(d) for d in declarations))
        for context in contexts:
            self.state.mcp_context[context.server] = context
            self._audit({"event": "mcp_context", "server": context.server, "available": context.available,
                         "tools": sorted(context.tool_hashes), "error": context.error})
            if context.required and not context.available and self.state.status not in TERMINAL:
                self.state.status = "failed"
                self.state.error = f"required MCP server '{context.server}' is not available: {context.error}" + (
                    f" ({context.hint})" if context.hint else "")

    def _mcp_refusal(self, tool: str, seq: int) -> ToolCallResult | None:
        server, _, name = tool.partition(".")
        context = self.state.mcp_context.get(server)
        if context is None or not name:
            return None
        if not context.available:
            return ToolCallResult(status="error", tool=tool, error_type="McpUnavailable", call_seq=seq,
                                  reason=f"MCP server '{server}' is unavailable in this run: {context.error}",
                                  hint=context.hint)
        if name not in context.tool_hashes:
            offered = ", ".join(sorted(context.tool_hashes)) or "none"
            return ToolCallResult(status="error", tool=tool, error_type="ToolNotFound", call_seq=seq,
                                  reason=f"MCP server '{server}' offers no tool '{name}' to this run",
                                  hint=f"tools of {server} this run can call: {offered}")
        return None

    async def _call_mcp(self, tool: str, args: dict[str, Any], warnings: list[str]) -> Any:
        """One upstream call: a local activity for short calls, a heartbeating one (with progress) for long."""
        server, _, name = tool.partition(".")
        info = self.snap.mcp_servers[server]
        request = McpCallRequest(project_root=self.snap.project_root, server=server, tool=name, arguments=args,
                                 expected_hash=self.state.mcp_context[server].tool_hashes.get(name, ""))
        timeout = timedelta(seconds=info.timeout_seconds)
        if info.timeout_seconds <= MCP_LOCAL_LIMIT:
            handle = workflow.start_local_activity(
                f"mcp.{server}.call_tool", request, result_type=McpCallResult, start_to_close_timeout=timeout,
                retry_policy=MCP_RETRY, summary=f"call tool: {tool}")
        else:
            handle = workflow.start_activity(
                f"mcp.{server}.call_tool", request, result_type=McpCallResult,
                start_to_close_timeout=timeout + timedelta(seconds=30), heartbeat_timeout=timedelta(seconds=5),
                retry_policy=MCP_RETRY, summary=f"call tool: {tool}",
                cancellation_type=ActivityCancellationType.WAIT_CANCELLATION_COMPLETED)
        # Cancelling the run cancels the upstream call in flight.
        await workflow.wait_condition(lambda: handle.done() or bool(self.state.cancel_reason))
        if not handle.done():
            handle.cancel()
            with contextlib.suppress(ActivityError):
                await handle
            raise CallRefused("error", f"{tool} was cancelled with the run", error_type="Cancelled")
        outcome = await handle
        if outcome.schema_changed:
            warnings.append(outcome.schema_changed)
            self._audit({"event": "mcp_schema_changed", "tool": tool, "detail": outcome.schema_changed})
        if outcome.is_error:
            raise ToolReportedError(outcome)
        return outcome.result

    async def _run_child(self, args: dict[str, Any], origin: str) -> Any:
        """``directive.run``: a child run with the intersection of this run's grants and its own."""
        snap, state = self.snap, self.state
        name = args.get("directive") or args.get("name")
        inputs = args.get("inputs") or {}
        if not isinstance(name, str) or not name or not isinstance(inputs, dict):
            raise CallRefused("error", "directive.run needs 'directive' (a name) and optional 'inputs' (an object)",
                              error_type="InputInvalid")
        child_id = run_workflow_id(name, f"{snap.run_id.rsplit('-', 1)[-1]}c{state.call_seq}")
        try:
            child = await workflow.execute_activity_method(
                DirectiveActivities.resolve_directive,
                ResolveDirectiveRequest(project_root=snap.project_root, directive=name, inputs=inputs, run_id=child_id,
                                        client=snap.client, search_attributes=snap.search_attributes),
                start_to_close_timeout=timedelta(seconds=30), retry_policy=RETRY, summary=f"resolve directive {name}")
        except ActivityError as exc:
            raise CallRefused("error", getattr(exc.cause, "message", str(exc)),
                              error_type=getattr(exc.cause, "type", "") or "ItemInvalid") from None
        excess = child.grants.exceeds(snap.grants)
        if excess:
            self._audit({"event": "escalation_attempt", "child_directive": name, "excess": excess,
                         "outcome": "denied" if snap.limits.on_escalation == "deny" else "narrowed"})
            if snap.limits.on_escalation == "deny":
                raise CallRefused("denied", f"child directive '{name}' declares more than this run grants: "
                                            + ", ".join(excess),
                                  hint="grant it in the parent's <permissions>, narrow the child's, or set "
                                       "child_runs.on_escalation: intersect in agent_harness.yaml")
        child = child.model_copy(update={"grants": snap.grants.intersect(child.grants)})
        reserved: dict[str, int] = {}
        windows: dict[str, int] = {}
        if self.hardened:
            child, reserved, windows = self._inherit(child)
        handle = await workflow.start_child_workflow(
            DirectiveRun.run, DirectiveRunInput(snapshot=child), id=child_id,
            task_queue=workflow.info().task_queue, parent_close_policy=ParentClosePolicy.ABANDON,
            static_summary=f"child of {snap.run_id}: {name} v{child.directive.version}")
        record = ChildRecord(run_id=child_id, directive=name, narrowed=excess, reserved=reserved,
                             reserved_windows=windows)
        state.children.append(record)
        self._audit({"event": "child_started", "child_run": child_id, "narrowed": excess})
        if origin == "agent":
            # The agent steers the child by its run id; this call does not wait for it to finish,
            # but the parent keeps watching it so its status shows how the child ended.
            self.background.append(asyncio.ensure_future(self._watch_child(handle, record)))
            return {"run_id": child_id, "status": "started", "narrowed": excess}
        result = await self._watch_child(handle, record)
        if result is None:
            raise CallRefused("error", f"child run {child_id} failed: {record.error}", error_type="ChildRunFailed")
        return {"run_id": child_id, "status": result.status, "outputs": result.outputs}

    def _inherit(self, child: RunSnapshot) -> tuple[RunSnapshot, dict[str, int], dict[str, int]]:
        """A child run under this run's rules: its approval rules and approvers, and a share of its budget.

        The child may use what is left of each per-run rate limit, and of each window what this run
        has not used of it lately; both are held back here until the child ends (``_settle``), so
        parent and children together, however many run at once, stay within every limit.
        """
        limits, state = self.snap.limits, self.state
        reserved = {p: max(0, n - state.call_counts.get(p, 0)) for p, n in limits.rate_limits.items()}
        rates = {**child.limits.rate_limits,
                 **{p: min(child.limits.rate_limits.get(p, left), left) for p, left in reserved.items()}}
        now = workflow.now().timestamp()
        free = {p: max(0, calls - state.window_reserved.get(p, 0)
                       - sum(1 for t in state.rate_times.get(p, []) if t > now - seconds))
                for p, (calls, seconds) in limits.rate_windows.items()}
        windows = {**child.limits.rate_windows,
                   **{p: (free[p], seconds) for p, (_, seconds) in limits.rate_windows.items()}}
        approvals = list(dict.fromkeys([*self._approval_patterns(), *child.limits.approval_tools]))
        for pattern, left in reserved.items():
            state.call_counts[pattern] = state.call_counts.get(pattern, 0) + left
        for pattern, slots in free.items():
            state.window_reserved[pattern] = state.window_reserved.get(pattern, 0) + slots
        return child.model_copy(update={"limits": child.limits.model_copy(update={
            "rate_limits": rates, "rate_windows": windows, "approval_tools": approvals,
            "approvers": limits.approvers, "blocked_commands": list(dict.fromkeys(
                [*limits.blocked_commands, *child.limits.blocked_commands]))})}), reserved, free

    def _settle(self, record: ChildRecord, used: dict[str, int] | None) -> None:
        """Give back what a finished child did not use of the budget held for it (nothing if unknown)."""
        for pattern, held in record.reserved.items():
            unused = held - min(held, (used or {}).get(pattern, held))
            self.state.call_counts[pattern] = max(0, self.state.call_counts.get(pattern, 0) - unused)
        for pattern, slots in record.reserved_windows.items():
            self.state.window_reserved[pattern] = max(0, self.state.window_reserved.get(pattern, 0) - slots)
        record.reserved = {}
        record.reserved_windows = {}

    async def _watch_child(self, handle: Any, record: ChildRecord) -> DirectiveRunResult | None:
        """Wait for a child run and record how it ended (None if it failed)."""
        try:
            result = await handle
        except ChildWorkflowError as exc:
            cause = exc.cause
            record.status = "cancelled" if isinstance(cause, CancelledError) else "failed"
            record.error = getattr(cause, "message", "") or str(exc)
            self._audit({"event": "child_finished", "child_run": record.run_id, "status": record.status,
                         "error": record.error})
            self._settle(record, None)
            return None
        record.status = result.status
        self._settle(record, result.call_counts)
        self._audit({"event": "child_finished", "child_run": record.run_id, "status": record.status})
        return result

    # ------------------------------------------------------------------ audit
    def _audit(self, record: dict[str, Any]) -> None:
        self.state.audit_seq += 1
        self.state.audit_pending.append({
            "seq": self.state.audit_seq, "time": workflow.now().isoformat(), "run_id": self.snap.run_id,
            "workflow_run_id": workflow.info().run_id, "directive": self.snap.directive.name, **record})

    async def _flush_audit(self, force: bool = False) -> None:
        async with self.audit_lock:
            batch = list(self.state.audit_pending)
            if not batch:
                return
            # A local activity: the audit file is written by the worker running this workflow,
            # without a round trip through the task queue. Retries are idempotent (sequence numbers).
            request = AuditBatch(project_root=self.snap.project_root, run_id=self.snap.run_id, records=batch)
            options: dict[str, Any] = {"start_to_close_timeout": timedelta(seconds=30),
                                       "retry_policy": RetryPolicy(maximum_interval=timedelta(seconds=10)),
                                       "summary": f"audit {len(batch)} records"}
            if self.local_audit:
                await workflow.execute_local_activity_method(AuditActivities.write_audit_records, request, **options)
            else:
                await workflow.execute_activity_method(AuditActivities.write_audit_records, request, **options)
            flushed = {r["seq"] for r in batch}
            self.state.audit_pending = [r for r in self.state.audit_pending if r["seq"] not in flushed]

    # ------------------------------------------------------------------ helpers
    def _context(self) -> dict[str, Any]:
        return {"inputs": self.snap.inputs,
                "steps": {name: {"outputs": rec.outputs, "status": rec.status}
                          for name, rec in self.state.steps.items()}}

    def _current_step_name(self) -> str | None:
        steps = self.snap.directive.steps
        return steps[self.state.step_index].name if self.state.step_index < len(steps) else None

    def _remaining(self) -> timedelta | None:
        deadline = self.snap.limits.deadline_seconds
        if not deadline:
            return None
        elapsed = workflow.now() - datetime.fromisoformat(self.state.started_at)
        return max(timedelta(seconds=deadline) - elapsed, timedelta(milliseconds=1))

    def _should_continue(self) -> bool:
        return self.updates >= self.snap.limits.max_updates_before_continue or \
            workflow.info().is_continue_as_new_suggested()

    async def _continue_as_new(self) -> None:
        # Refuse new updates (callers resend them to the new run), finish the ones in flight,
        # and write their audit records, so nothing is lost across the boundary.
        self.draining = True
        await workflow.wait_condition(workflow.all_handlers_finished)
        await self._flush_audit(force=True)
        self.state.continued += 1
        workflow.continue_as_new(DirectiveRunInput(snapshot=self.snap, state=self.state))

    def _view(self, step: Step) -> StepView:
        record = self.state.steps.get(step.name) or StepRecord(name=step.name)
        plan = plan_step(step, self.snap.directive, frozenset(self.snap.local_tools))
        return StepView(name=step.name, status=record.status, mode=plan.mode, reason=plan.reason,
                        description=step.description, action=render_safe(step.action, self._context()),
                        tools=[c.tool for c in step.tool_calls], outputs=record.outputs,
                        prerun_results=record.prerun_results)

    def _publish(self) -> None:
        """Keep search attributes and current details up to date for the Temporal UI."""
        state = self.state
        step = self._current_step_name() or ""
        if self.snap.search_attributes:
            updates = [DIRECTIVE_ATTR.value_set(self.snap.directive.name), STATUS_ATTR.value_set(state.status),
                       STEP_ATTR.value_set(step)]
            if self.human_loop:
                pending = ",".join(a.request_id for a in state.approvals if a.status == "pending")
                updates.append(PENDING_APPROVAL_ATTR.value_set(pending))
            if self.lean:
                current = workflow.info().typed_search_attributes
                updates = [u for u in updates if current.get(u.key) != u.value]
            if updates:
                workflow.upsert_search_attributes(updates)
        lines = [f"**{state.status}**" + (f" · step `{step}`" if step else ""),
                 f"{self.state.step_index}/{len(self.snap.directive.steps)} steps done · {state.call_seq} calls"]
        if state.status == "awaiting_agent":
            lines.append(f"Waiting for the agent to complete step `{step}`")
        for approval in (a for a in state.approvals if a.status == "pending"):
            lines.append(f"Waiting for approval `{approval.request_id}` of {approval.summary} (until "
                         f"{approval.expires_at}): `kiwi approve {self.snap.run_id} {approval.request_id}`")
        if state.recent_calls:
            last = state.recent_calls[-1]
            lines.append(f"Last call: {last.summary} → {last.status}")
        if state.error:
            lines.append(f"Error: {state.error}")
        workflow.set_current_details("\n\n".join(lines))

    def _result(self) -> DirectiveRunResult:
        return DirectiveRunResult(run_id=self.snap.run_id, status=self.state.status,
                                  outputs={n: r.outputs for n, r in self.state.steps.items()},
                                  error=self.state.error, calls=self.state.call_seq,
                                  call_counts=dict(self.state.call_counts), rate_times=self.state.rate_times)


def failure_of(exc: BaseException) -> tuple[str, str]:
    """``(type, message)`` of an activity's failure, wrapped in an ActivityError or not."""
    cause = exc.cause if isinstance(exc, ActivityError) and exc.cause is not None else exc
    kind = getattr(cause, "type", None) or "ActivityFailed"
    return kind, getattr(cause, "message", None) or str(cause)


def render_safe(text: str, context: dict[str, Any]) -> str:
    try:
        rendered = render(text, context)
    except TemplateError:
        return text
    return rendered if isinstance(rendered, str) else text
