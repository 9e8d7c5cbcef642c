"""Steps in order: automatic ones run their calls, agent ones wait for complete_step."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from kiwi.conditions import parse_condition
    from kiwi.contracts import (
        DirectiveRunInput,
        StepRecord,
    )
    from kiwi.guards import redact
    from kiwi.items.directive import Step, plan_step
    from kiwi.policy import parse_command
    from kiwi.rules import rule_in_force
    from kiwi.templating import command_words, render
    from kiwi.toolargs import ArgumentError, coerce_step_arguments, oversized_command

from workflows.directive_run.errors import (
    StepAborted,
)
from workflows.directive_run.options import (
    APPROVAL_STATUS_KEPT,
    AUDIT_IDLE_FLUSH,
    CANCELLED_NOT_FAILED,
    COMMAND_WORDS,
    CONTINUE_COMMIT_TIMER,
    DEADLINE_BETWEEN_CALLS,
    HELD,
    RUN_OUTPUTS_BYTES,
    STEP_COMMAND_CAPPED,
    STEP_HINT,
)
from workflows.directive_run.task_budget import json_bytes

if TYPE_CHECKING:
    from workflows.directive_run.workflow import DirectiveRun


class StepsMixin:
    """Steps in order: automatic ones run their calls, agent ones wait for complete_step."""

    def _held_outputs(self: DirectiveRun, but: str) -> int:
        """What the run's steps other than ``but`` hold (outputs and results of their calls), as JSON."""
        return sum(
            json_bytes(r.outputs) + (json_bytes(r.prerun_results) if r.prerun_results else 0)
            for n, r in self.state.steps.items()
            if n != but
        )

    async def _run_step(self: DirectiveRun, step: Step) -> None:
        state = self.state
        record = state.steps.get(step.name) or StepRecord(name=step.name)
        state.steps[step.name] = record
        if record.status in ("completed", "skipped"):
            return
        context = self._context()
        if (
            step.condition
            and record.status == "pending"
            and not parse_condition(step.condition).evaluate(context)
        ):
            record.status = "skipped"
            record.reason = f"condition false: {step.condition}"
            self.audit.record({"event": "step_skipped", "step": step.name, "reason": record.reason})
            return
        plan = plan_step(
            step, self.snap.directive, frozenset(self.snap.local_tools), kiwi_tools=self.kiwi_tools
        )
        record.mode = plan.mode
        record.reason = plan.reason
        if record.status == "pending":
            record.status = "running"
            record.started_at = workflow.now().isoformat()
            if not (self.current and plan.mode != "auto" and not plan.prerun):
                # An agent step with no calls of its own goes on to awaiting_agent in this same task and
                # publishes that: a 'running' upsert first would be one more history event and write.
                self._publish()
            if plan.mode == "auto" or plan.prerun:
                held = self._held_outputs(step.name) if self.budgeted else 0
                for call in step.tool_calls:
                    await workflow.wait_condition(
                        lambda: state.status not in HELD or bool(state.cancel_reason)
                    )
                    if state.cancel_reason:
                        state.status = "cancelled"
                        return
                    if self._overdue() and rule_in_force(DEADLINE_BETWEEN_CALLS):
                        state.status = "timed_out"
                        state.error = (
                            f"run deadline of {self.snap.limits.deadline_seconds:g}s passed before step "
                            f"'{step.name}' called {call.tool}"
                        )
                        return
                    args = render(call.params, self._context())
                    if self.hardened:
                        try:
                            args = coerce_step_arguments(
                                call.tool, call.params, args, self._input_schema(call.tool)
                            )
                        except ArgumentError as exc:
                            raise StepAborted(f"step '{step.name}': {exc.reason} ({exc.hint})") from None
                    words = command_words(call.tool, call.params, self._context())
                    if words is not None and parse_command(args) != words and rule_in_force(COMMAND_WORDS):
                        args = {**{k: v for k, v in args.items() if k != "command"}, "argv": words}
                    command = oversized_command(call.tool, args)
                    if command is not None and workflow.patched(STEP_COMMAND_CAPPED):
                        raise StepAborted(f"step '{step.name}': {command.reason} ({command.hint})")
                    result = await self._call(call.tool, args, origin="step", step=step.name)
                    if result.status != "ok" and state.cancel_reason and rule_in_force(CANCELLED_NOT_FAILED):
                        state.status = "cancelled"
                        return
                    if result.status != "ok":
                        # (With the refusal's hint, which names the fix: README trial s38 found it in the audit
                        # trail's JSON only.)
                        hint = f" ({result.hint})" if result.hint and rule_in_force(STEP_HINT) else ""
                        trust = self.snap.trust
                        if hint and trust.grants == "base" and "<permissions>" in hint:
                            # (README trial s39: an unsigned directive's run was told to add a grant its file has;
                            # the run has the base policy's grants alone until a human signs it.)
                            why = {
                                "unsigned": "not signed",
                                "none": "not signed",
                                "modified": "changed since it was signed",
                            }.get(trust.signature, "signed by no trusted key")
                            hint = (
                                f" (the directive is {why}: its run has only the grants its <permissions> share "
                                "with the base policy; a human signs it, `kiwi sign`, for its own)"
                            )
                        raise StepAborted(
                            f"step '{step.name}': {call.tool} {result.status}: {result.reason}{hint}"
                        )
                    record.prerun_results.append(result.result)
                    if self.budgeted:
                        # The results travel with the run (its result, a continue-as-new's input): bounded
                        # as an agent's outputs are. An automatic step's `result` repeats the last one.
                        last = json_bytes(result.result)
                        held += last
                        size = held + (last if plan.mode == "auto" else 0)
                        if size > RUN_OUTPUTS_BYTES:
                            raise StepAborted(
                                f"step '{step.name}': with {call.tool}'s result the run's step outputs would "
                                f"be {size:,} bytes; a run holds at most {RUN_OUTPUTS_BYTES:,} (they travel "
                                "with it); read less (max_bytes), or have the step write to a file and pass "
                                "its path"
                            )
        if plan.mode == "auto":
            results = record.prerun_results
            record.outputs = {"result": results[-1] if results else None, "results": results}
            if self.budgeted:
                record.prerun_results = []  # (they are the outputs now: held once, not twice)
            self._finish_step(record)
            return
        record.status = "awaiting_agent"
        if state.status == "awaiting_approval" and workflow.patched(APPROVAL_STATUS_KEPT):
            state.approval_from = "awaiting_agent"  # (what the run goes back to once no call waits)
        elif state.status not in HELD:
            state.status = "awaiting_agent"
        self._publish()
        if self.current and state.audit_pending:
            # The records so far (run_started, the steps before) are written as the step starts waiting,
            # in this workflow task, not by an idle timer a second later in a task of their own: a
            # waiting run's history is shorter, and so is every replay of it.
            await self.audit.flush()
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
                    lambda armed=armed: (
                        record.status != "awaiting_agent"
                        or bool(state.cancel_reason)
                        or self._should_continue()
                        or (bool(state.audit_pending) and not armed)
                    ),
                    timeout=timeout,
                )
            except TimeoutError:
                if self._remaining() is None or self._remaining() > timedelta(milliseconds=1):
                    await self.audit.flush()
                    continue
                state.status = "timed_out"
                state.error = (
                    f"run deadline of {self.snap.limits.deadline_seconds:g}s passed while step "
                    f"'{step.name}' waited for the agent"
                )
                return
            if state.cancel_reason:
                state.status = "cancelled"
                return
            if record.status != "awaiting_agent":
                if state.status == "awaiting_approval" and workflow.patched(APPROVAL_STATUS_KEPT):
                    state.approval_from = "running"
                else:
                    state.status = "running"
                return
            if self._should_continue():
                await self._continue_as_new()

    def _finish_step(self: DirectiveRun, record: StepRecord) -> None:
        record.status = "completed"
        record.finished_at = workflow.now().isoformat()
        self.audit.record(
            {
                "event": "step_completed",
                "step": record.name,
                "mode": record.mode,
                "outputs": redact(record.outputs),
            }
        )

    # ------------------------------------------------------------------ helpers
    def _context(self: DirectiveRun) -> dict[str, Any]:
        return {
            "inputs": self.snap.inputs,
            "steps": {
                name: {"outputs": rec.outputs, "status": rec.status} for name, rec in self.state.steps.items()
            },
        }

    def _current_step_name(self: DirectiveRun) -> str | None:
        steps = self.snap.directive.steps
        return steps[self.state.step_index].name if self.state.step_index < len(steps) else None

    def _remaining(self: DirectiveRun) -> timedelta | None:
        deadline = self.snap.limits.deadline_seconds
        if not deadline:
            return None
        elapsed = workflow.now() - datetime.fromisoformat(self.state.started_at)
        return max(timedelta(seconds=deadline) - elapsed, timedelta(milliseconds=1))

    def _overdue(self: DirectiveRun) -> bool:
        """Whether the run's deadline (if it has one) has passed."""
        deadline = self.snap.limits.deadline_seconds
        if not deadline:
            return False
        return workflow.now() - datetime.fromisoformat(self.state.started_at) >= timedelta(seconds=deadline)

    def _should_continue(self: DirectiveRun) -> bool:
        return (
            self.updates >= self.snap.limits.max_updates_before_continue
            or workflow.info().is_continue_as_new_suggested()
        )

    async def _continue_as_new(self: DirectiveRun) -> None:
        # Refuse new updates (callers resend them to the new run), finish the ones in flight,
        # and write their audit records, so nothing is lost across the boundary.
        self.draining = True
        await workflow.wait_condition(workflow.all_handlers_finished)
        await self.audit.flush()
        if self.commit_before_continue:
            # A timer ends this workflow task, so the finished calls' completions reach Temporal before
            # (not with) the continue-as-new command (temporalio/temporal#6375), and the last task holds
            # nothing but the hand-over: calls that reach the server during it wait for the successor.
            # Records made meanwhile (a signal's) travel in the carried state and are written there.
            await workflow.sleep(CONTINUE_COMMIT_TIMER)
        self.state.continued += 1
        workflow.continue_as_new(DirectiveRunInput(snapshot=self.snap, state=self.state))

    def _fail_current_step(self: DirectiveRun) -> None:
        """The step a failed run stopped at shows ``failed``, not ``running``."""
        record = self.state.steps.get(self._current_step_name() or "")
        if record is not None and record.status not in ("completed", "skipped"):
            record.status = "failed"
            record.finished_at = workflow.now().isoformat()
