"""``DirectiveRun``: one directive run as one Temporal workflow.

Steps run in order. A step whose calls are bound runs them as activities; a step that needs
the agent waits (``awaiting_agent``) until ``complete_step`` arrives. Every tool call, from a
step or from the agent (the ``call_tool`` update), goes through the same path here: tool
lookup, permission check, rate limit, loop detection, activity, audit. Decisions are made in
this deterministic code and recorded in history; side effects happen only in activities."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError, ChildWorkflowError

with workflow.unsafe.imports_passed_through():
    from kiwi.conditions import ConditionError
    from kiwi.contracts import (
        TERMINAL,
        ApprovalDecision,
        BatchItem,
        CallToolRequest,
        CancelRequest,
        CompleteStepRequest,
        CompleteStepResult,
        DecisionAnswer,
        DirectiveRunInput,
        DirectiveRunResult,
        HelpRequest,
        ParentHeld,
        ResumeRequest,
        RunState,
        RunStatus,
        StepRecord,
        ToolCallResult,
        ToolContext,
        ToolContextRequest,
    )
    from kiwi.errors import (
        InputInvalid,
        RunBusy,
        RunContinuing,
        RunFinished,
        RunStateConflict,
        RunTimedOut,
        StepFailed,
    )
    from kiwi.rules import rule_in_force
    from kiwi.seal import start_sealed
    from kiwi.templating import TemplateError, unset_input
    from kiwi.toolargs import oversized_command
    from kiwi.upstream.pool import scrub_model

from workflows.directive_run.audit_trail import AuditTrail
from workflows.directive_run.calls import CallsMixin
from workflows.directive_run.children import ChildrenMixin
from workflows.directive_run.errors import StepAborted
from workflows.directive_run.humans import HumansMixin
from workflows.directive_run.kiwi_tools import KiwiToolsMixin
from workflows.directive_run.options import (
    ALL_CHANGES,
    CHANGES_2026_11_23,
    CHANGES_2026_11_23B,
    CHANGES_2026_11_23C,
    CHANGES_2026_11_25,
    CHANGES_2026_11_26,
    CHANGES_2026_11_26B,
    CHANGES_2026_11_26C,
    COMMIT_BEFORE_CONTINUE,
    CURRENT,
    ENDED_APPROVALS,
    HARDENED,
    HELD_RESULT_BYTES,
    HELD_RESULTS_CAPPED,
    KIWI_MCP_TOOLS,
    RECENT_RESULTS,
    RECENT_UPDATE_IDS,
    RUN_OUTPUTS_BYTES,
    STEP_OUTPUTS_BYTES,
    STORED_ARGUMENT_BYTES,
    STORED_MARGIN_BYTES,
    STORED_REFUSALS,
    TASK_ARGUMENT_BYTES,
)
from workflows.directive_run.steps import StepsMixin
from workflows.directive_run.task_budget import TaskBudget, json_bytes
from workflows.directive_run.upstream import UpstreamMixin
from workflows.directive_run.view import ViewMixin


def stored_size(request: CallToolRequest, arguments_size: int) -> int:
    """About the bytes of the payload the client stores for this call (the store decides on the whole
    request, not its arguments alone: arguments of 262,143 bytes were stored and never counted; second s18
    review): the arguments, the tool's and client's names, and a margin for the rest."""
    return arguments_size + len(request.tool) + len(request.client) + STORED_MARGIN_BYTES


@workflow.defn(name="DirectiveRun", failure_exception_types=[TemplateError, ConditionError])
class DirectiveRun(
    StepsMixin, CallsMixin, KiwiToolsMixin, HumansMixin, UpstreamMixin, ChildrenMixin, ViewMixin
):
    @workflow.init
    def __init__(self, input: DirectiveRunInput) -> None:
        # Whether its start carries its seal (kiwi/seal.py), on the input as it came, before any handler.
        self.sealed = start_sealed([input])
        self.snap = input.snapshot
        self.state = input.state or RunState()
        self.updates = 0
        self.audit = AuditTrail(self.state, self.snap)
        self.draining = False
        self.idle_flush = False
        self.human_loop = False
        self.fs_local = False
        self.lean = False
        # Search attribute -> the value this run's code last upserted (see _publish, PUBLISH_OWN_RECORD).
        self.published: dict[str, Any] = {}
        # Checked here, not in run(): signals that arrive with the first task are handled before
        # run() starts, and must already be held to the hardened rules.
        # CURRENT stands for every change, STEP_AWAITED included. Runs started before it replay the marker
        # of the changes up to CHANGES_2026_11_26C for EARLY_APPROVALS, CHANGES_2026_11_26B for
        # RESULTS_SEALED, CHANGES_2026_11_26 for PARENT_HOLDS_CHILDREN, CHANGES_2026_11_25 for HOLD_AT_ONCE,
        # CHANGES_2026_11_23C for the task budget, CHANGES_2026_11_23B for MCP_BATCHED, or CHANGES_2026_11_23:
        # each checked only when the newer ones are not in their history.
        self.step_awaited = workflow.patched(CURRENT)  # STEP_AWAITED
        self.latest = self.step_awaited or workflow.patched(
            CHANGES_2026_11_26C
        )  # EARLY_APPROVALS, FAILURE_HINTS
        # RESULTS_SEALED (read by kiwi/seal.py)
        self.results_sealed = self.latest or workflow.patched(CHANGES_2026_11_26B)
        # Approval requests whose calls wait for a decision now (EARLY_APPROVALS: one is taken only then).
        self.waiting: set[str] = set()
        self.holds_children = self.results_sealed or workflow.patched(CHANGES_2026_11_26)
        self.newest = self.holds_children or workflow.patched(
            CHANGES_2026_11_25
        )  # HOLD_AT_ONCE, BUDGET_HALVED, ...
        self.budgeted = self.newest or workflow.patched(CHANGES_2026_11_23C)
        self.batched = self.budgeted or workflow.patched(CHANGES_2026_11_23B)
        self.current = self.batched or workflow.patched(CHANGES_2026_11_23)
        self.hardened = self.current or workflow.patched(HARDENED)
        self.commit_before_continue = self.current or workflow.patched(COMMIT_BEFORE_CONTINUE)
        # Also here for the same reason: the first task's call_tool updates already look tools up.
        self.kiwi_tools = self.current or workflow.patched(KIWI_MCP_TOOLS)
        if self.step_awaited:
            # (FIRST_TASK_RULES) Updates in a run's first task (sent with its start, or handed to the successor
            # of a continue-as-new) are handled before run() starts: set there, human_loop was still off, and
            # a call that needs a human's approval ran without one.
            self.audit.local = self.idle_flush = self.human_loop = self.fs_local = self.lean = True
        # Work the run starts and does not wait for at once (audit flushes, checkpoints, notices,
        # watching children): owned here, failures audited, awaited before the run ends.
        self.background: list[tuple[asyncio.Future[Any], bool]] = []
        # Calls waiting for their batch (by key: an MCP server's, the file reads'), and the tasks sending them.
        self.batches: dict[str, list[tuple[Any, asyncio.Future[BatchItem]]]] = {}
        self.batch_senders: set[asyncio.Future[None]] = set()
        # Reads a batch handed back are made again one at a time, each in a task of its own (see _read_alone).
        self.rereads = asyncio.Lock()
        # What the current workflow task sends Temporal, kept under what it takes (see task_budget.py).
        self.budget = TaskBudget()
        self.accepting = (-1, 0)  # (task, call argument bytes accepted in it): see _accept_arguments

    def refuse_start(self, why: str) -> None:
        """The run's start was refused before its first step (kiwi/seal.py): its status says why."""
        self.state.status = "failed"
        self.state.error = why

    def _spawn(self, work: Awaitable[Any], what: str, *, wait: bool = True) -> None:
        """Start ``work`` without waiting for it; a failure is audited, not lost. ``wait``: the run awaits it
        before it ends (not for children, which outlive their parent)."""

        async def owned() -> None:
            try:
                await work
            except (ActivityError, ApplicationError, ChildWorkflowError) as exc:
                self.audit.record(
                    {"event": "background_failed", "what": what, "error": str(exc.cause or exc)}
                )

        self.background.append((asyncio.ensure_future(owned()), wait))

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
        if self.current or workflow.patched(ALL_CHANGES):
            self.audit.local = self.idle_flush = self.human_loop = self.fs_local = self.lean = True
        else:
            self.audit.local = workflow.patched("audit-local-activity")
            self.idle_flush = workflow.patched("audit-idle-flush")
            self.human_loop = workflow.patched("human-loop")
            mcp_context = None  # decided below, where that patch has always been checked
        if not state.started_at:
            state.started_at = workflow.now().isoformat()
            trust = self.snap.trust
            self.audit.record(
                {
                    "event": "run_started",
                    "signature": trust.signature,
                    "signer": trust.signer,
                    "trusted": trust.trusted,
                    "content_hash": self.snap.content_hash,
                    "grants_from": trust.grants,
                    "note": trust.note,
                    "grants": self.snap.grants.summary(),
                    # A directive pulled from the shared registry: which registry, namespace, version.
                    **({"provenance": trust.provenance} if trust.provenance else {}),
                }
            )
        directive = self.snap.directive
        if not (
            self.current and state.step_index < len(directive.steps) and not directive.metadata.tools.mcps
        ):
            # (A new run's first step publishes its state in this same task; one fetching MCP tool context
            # first shows 'running' meanwhile.)
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
                    self._spawn(self.audit.flush(), "audit flush")
                else:
                    await self.audit.flush()
                # Not after the last step: the run is about to finish, and continuing-as-new would wait
                # for the last step's complete_step, which waits for the finish (they waited forever).
                last_done = self.commit_before_continue and state.step_index >= len(directive.steps)
                if self._should_continue() and not last_done:
                    await self._continue_as_new()
            if state.status not in TERMINAL:
                state.status = "completed"
        except StepAborted as exc:
            state.status = "failed"
            state.error = exc.message
            self._fail_current_step()
        except TemplateError as exc:
            state.status = "failed"
            state.error = unset_input(exc, directive.inputs) or str(exc)
            self._fail_current_step()
        self.audit.record({"event": "run_finished", "status": state.status, "error": state.error})
        pending = [a for a in state.approvals if a.status == "pending"]
        if pending and rule_in_force(ENDED_APPROVALS):
            # An ended run makes no call it was still asking a human for (review s38: a timed-out run's pending
            # git.commit, approved later, landed on the branch).
            for request in pending:
                request.status = "cancelled"
                request.reason = f"the run ended ({state.status}) before a decision"
                self.audit.record(
                    {
                        "event": "approval_cancelled",
                        "request_id": request.request_id,
                        "reason": request.reason,
                    }
                )
        self._publish()
        await workflow.wait_condition(workflow.all_handlers_finished)
        if self.hardened:
            await asyncio.gather(*(task for task, wait in self.background if wait and not task.done()))
        await self.audit.flush()
        # A child's failure carries what it used, as its result would: the parent settles its share of the budget
        # with it (CHILD_HELD). Only the failure's details differ, no command.
        spent = (self._spent(),) if workflow.info().parent is not None else ()
        if state.status == "failed":
            raise StepFailed.error(state.error, *spent)
        if state.status == "timed_out":
            raise RunTimedOut.error(state.error, *spent)
        return self._result()

    # ------------------------------------------------------------------ handlers
    @workflow.update
    async def call_tool(self, request: CallToolRequest) -> ToolCallResult:
        """Make one tool call through the run's policy (the agent's path to every tool)."""
        self.updates += 1
        # A caller that lost the answer while the run continued-as-new sends the same update id
        # again; answer it from the carried state instead of calling the tool twice.
        # Temporal may also deliver a completed call again to the successor (see COMMIT_BEFORE_CONTINUE):
        # one whose result is no longer held is answered by its call number, never run twice.
        update_id = workflow.current_update_info().id if workflow.current_update_info() else ""
        arguments_size = json_bytes(request.arguments) if self.budgeted else 0
        if self.budgeted:
            self.budget.spend(arguments_size)  # (the update's acceptance carries them)
        if update_id in self.state.recent_updates:
            return await self._answer(self.state.recent_updates[update_id])
        if self.commit_before_continue and update_id in self.state.update_seqs:
            return self._already_ran(request, update_id, self.state.update_seqs[update_id])
        result = await self._call(request.tool, request.arguments, origin="agent", client=request.client)
        if stored_size(request, arguments_size) >= STORED_ARGUMENT_BYTES and result.status != "ok":
            self.state.stored_refusals += 1
        size = json_bytes(result.model_dump()) if self.budgeted else 0
        if update_id:
            if self._holds(result, size):
                held = self.state.recent_updates  # (in place: the last RECENT_RESULTS, oldest first)
                held[update_id] = result
                while len(held) > RECENT_RESULTS:
                    del held[next(iter(held))]
            if self.commit_before_continue:
                seqs = self.state.update_seqs
                seqs[update_id] = result.call_seq
                if len(seqs) > RECENT_UPDATE_IDS * 1.1:  # trimmed now and then, not copied per call
                    self.state.update_seqs = dict(list(seqs.items())[-RECENT_UPDATE_IDS:])
        if self.budgeted:
            await self.budget.room(size)  # (the update's completion carries the answer again)
        return result

    async def _answer(self, result: ToolCallResult) -> ToolCallResult:
        """A held result answered again: in a task with room for it."""
        if self.budgeted:
            await self.budget.room(json_bytes(result.model_dump()))
        return result

    def _holds(self, result: ToolCallResult, size: int = 0) -> bool:
        """Whether a call's result is kept for a re-sent call (see HELD_RESULTS_CAPPED); a larger one is
        known by its call number only, which needs update_seqs (COMMIT_BEFORE_CONTINUE). ``size``: its JSON
        length, when already measured."""
        if not self.commit_before_continue or not (self.current or workflow.patched(HELD_RESULTS_CAPPED)):
            return True
        return (size or json_bytes(result.model_dump())) <= HELD_RESULT_BYTES

    def _already_ran(self, request: CallToolRequest, update_id: str, seq: int) -> ToolCallResult:
        return ToolCallResult(
            status="error",
            tool=request.tool,
            call_seq=seq,
            reason=f"this call (update {update_id}) already ran as call #{seq}; its result is no longer held",
            hint=f"its record is in the run's audit trail: kiwi audit {self.snap.run_id}",
            error_type=RunStateConflict.type,
        )

    @call_tool.validator
    def _validate_call_tool(self, request: CallToolRequest) -> None:
        if self.draining:
            # (Its execution named: the client waits for that one to close, not for its successor.)
            raise RunContinuing.error("run is continuing as new; send the call again", workflow.info().run_id)
        if self.state.status in TERMINAL:
            raise RunFinished.error(
                f"run {self.snap.run_id} has finished ({self.state.status}); start a new run"
            )
        self._refuse_if_held()
        if not request.tool:
            raise InputInvalid.error("'tool' is required, e.g. filesystem.read")
        if (command := oversized_command(request.tool, request.arguments)) is not None:
            # (Checked before admission walks the command's words on the worker's event loop; see the
            # function for why here and not in admission.)
            raise InputInvalid.error(f"{command.reason}; {command.hint}")
        if self.budgeted:
            self._accept_arguments(request)

    def _accept_arguments(self, request: CallToolRequest) -> None:
        """Bound the call arguments one workflow task accepts (TASK_ARGUMENT_BYTES; its first call always
        goes). Validators do not run again on replay, so this count is the validator's own: nothing the
        run decides reads it."""
        size = json_bytes(request.arguments)
        if (
            stored_size(request, size) >= STORED_ARGUMENT_BYTES
            and self.state.stored_refusals >= STORED_REFUSALS
        ):
            raise InputInvalid.error(
                f"this run has taken {self.state.stored_refusals} calls with arguments of "
                f"{STORED_ARGUMENT_BYTES // 1024} KB or more that did not go through, and takes no more of "
                f"them (this call's are {size:,} bytes); each is kept on disk while the run lasts. Send "
                "smaller calls, or start a new run"
            )
        task = workflow.info().get_current_history_length()
        if self.accepting[0] != task:
            self.accepting = (task, 0)
        taken = self.accepting[1]
        if taken and taken + size > TASK_ARGUMENT_BYTES:
            raise RunBusy.error(
                f"this run's workflow task already carries {taken:,} bytes of call arguments and this call "
                f"{size:,} more; send it again (a later task takes it)"
            )
        self.accepting = (task, taken + size)

    @workflow.update
    async def complete_step(self, request: CompleteStepRequest) -> CompleteStepResult:
        """The agent finished the current step; ``outputs`` become ``{steps.NAME.outputs.KEY}``."""
        self.updates += 1
        if self.step_awaited and not self._awaits_agent(request.step):
            # (STEP_AWAITED) The validator saw the step waiting; a replay may hand this update over before the
            # activity result that made it wait (see options.py). Not awaited when it waits: a second
            # complete_step for the step is then refused by its validator, as before.
            await workflow.wait_condition(
                lambda: self._awaits_agent(request.step) or self.state.status in TERMINAL
            )
            if not self._awaits_agent(request.step):
                raise RunFinished.error(f"run {self.snap.run_id} has finished ({self.state.status})")
        record = self.state.steps[request.step]
        record.outputs = {
            **({"prerun_results": record.prerun_results} if record.prerun_results else {}),
            **request.outputs,
        }
        if self.budgeted:
            record.prerun_results = []  # (they are in the outputs now: held once, not twice)
        self._finish_step(record)
        index = next(i for i, s in enumerate(self.snap.directive.steps) if s.name == request.step)
        last = len(self.snap.directive.steps) - 1
        await workflow.wait_condition(
            lambda: self.state.status in TERMINAL or (self.state.step_index > index and index < last)
        )
        next_step = self._current_step_name()
        return CompleteStepResult(step=request.step, status=self.state.status, next_step=next_step)

    def _awaits_agent(self, step: str) -> bool:
        record = self.state.steps.get(step)
        return record is not None and record.status == "awaiting_agent"

    @complete_step.validator
    def _validate_complete_step(self, request: CompleteStepRequest) -> None:
        if self.draining:
            # (Its execution named: the client waits for that one to close, not for its successor.)
            raise RunContinuing.error("run is continuing as new; send the call again", workflow.info().run_id)
        record = self.state.steps.get(request.step)
        if self.state.status in TERMINAL:
            raise RunFinished.error(f"run {self.snap.run_id} has finished ({self.state.status})")
        self._refuse_if_held()
        if record is None or record.status != "awaiting_agent":
            current = self._current_step_name()
            waiting = (
                current
                if current and self.state.steps.get(current, StepRecord(name="")).status == "awaiting_agent"
                else None
            )
            raise RunStateConflict.error(
                f"step '{request.step}' is not waiting for the agent"
                + (f"; step '{waiting}' is" if waiting else "; no step is waiting now")
            )
        self._refuse_big_outputs(request)

    def _refuse_big_outputs(self, request: CompleteStepRequest) -> None:
        """Outputs travel in the continue-as-new input: one step's, and all steps' together, are bounded."""
        size = len(json.dumps(request.outputs, default=str))
        if size > STEP_OUTPUTS_BYTES:
            raise InputInvalid.error(
                f"step '{request.step}': outputs are {size:,} bytes; a step's outputs are at most "
                f"{STEP_OUTPUTS_BYTES:,}; write a large result to a file and return its path"
            )
        if size <= HELD_RESULT_BYTES:
            return  # small outputs always pass, so a run whose own steps hold much is never stuck
        held = sum(
            len(json.dumps(r.outputs, default=str)) for n, r in self.state.steps.items() if n != request.step
        )
        if held + size > RUN_OUTPUTS_BYTES:
            raise InputInvalid.error(
                f"step '{request.step}': the run's step outputs would be {held + size:,} bytes; a run holds at "
                f"most {RUN_OUTPUTS_BYTES:,}; write a large result to a file and return its path"
            )

    @workflow.update
    async def tool_context(self, request: ToolContextRequest) -> ToolContext:
        """The declared MCP servers' tools as fetched when the run started (waits until fetched)."""
        if request.wait:
            await workflow.wait_condition(lambda: self.state.mcp_ready)
        context = ToolContext(
            run_id=self.snap.run_id,
            status=self.state.status,
            mcps=self.state.mcp_context,
            error=self.state.error,
        )
        if self.budgeted:
            await self.budget.room(json_bytes(context.model_dump()))  # (each answer carries the listings)
        return context

    @tool_context.validator
    def _validate_tool_context(self, request: ToolContextRequest) -> None:
        """Nothing to refuse here; with a validator, the seal check (kiwi/seal.py) runs for this update too."""

    @workflow.signal
    def cancel(self, request: CancelRequest) -> None:
        if self.state.status not in TERMINAL:
            self.state.cancel_reason = request.reason or "cancelled"
            self.audit.record({"event": "cancel_requested", "reason": self.state.cancel_reason})

    @workflow.signal
    def help(self, request: HelpRequest) -> None:
        """Agent control signals: stuck, escalate, checkpoint. Recorded and shown in the status."""
        self._on_help(request)

    @workflow.signal
    def resume(self, request: ResumeRequest) -> None:
        """A human lets a held run (stuck, awaiting_human) carry on; loop warnings start again from zero."""
        self._on_resume(request)

    @workflow.query
    def status(self) -> RunStatus:
        # What the agent sent (a refused path, a reason) may hold a secret this worker knows: scrubbed as the
        # audit trail scrubs it (hostile review s39: a run's status and resource showed it raw). A query makes no
        # command: what this worker knows may differ from another's.
        return scrub_model(self._status_view())

    @workflow.signal
    def parent_held(self, notice: ParentHeld) -> None:
        self._on_parent_held(notice)

    @workflow.signal
    def decide_approval(self, decision: ApprovalDecision) -> None:
        """A human approves or rejects a pending call (``kiwi approve`` / ``kiwi reject``, or the Temporal UI)."""
        self._on_decide_approval(decision)

    @workflow.signal
    def decide(self, answer: DecisionAnswer) -> None:
        """A human answers an escalation (``kiwi decide RUN REQUEST OPTION``); the run carries on."""
        self._on_decide(answer)
