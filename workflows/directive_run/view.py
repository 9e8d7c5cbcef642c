"""What operators and agents see: the status query, search attributes, current details."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from kiwi.contracts import (
        DIRECTIVE_ATTR,
        PENDING_APPROVAL_ATTR,
        STATUS_ATTR,
        STEP_ATTR,
        DirectiveRunResult,
        RunStatus,
        StepRecord,
        StepView,
        is_session,
    )
    from kiwi.items.directive import Step, plan_step
    from kiwi.templating import PLACEHOLDER, TemplateError, render
    from kiwi.tracing import started_trace_id

from workflows.directive_run.options import HELD


def render_safe(text: str, context: dict[str, Any]) -> str:
    """``text`` with each placeholder that has a value filled, and any other left as written (README trial s36:
    one misspelt `{steps.sortd...}` left `{top}` unfilled too, and the agent read neither)."""
    try:
        rendered = render(text, context)
    except TemplateError:
        rendered = None
    if isinstance(rendered, str):
        return rendered
    return PLACEHOLDER.sub(lambda m: _filled(m.group(0), context), text)


def _filled(placeholder: str, context: dict[str, Any]) -> str:
    try:
        value = render(
            f"x{placeholder}", context
        )  # (a prefix keeps a value of another type as its JSON text)
    except TemplateError:
        return placeholder
    return value[1:] if isinstance(value, str) else placeholder


if TYPE_CHECKING:
    from workflows.directive_run.workflow import DirectiveRun


class ViewMixin:
    """What operators and agents see: the status query, search attributes, current details."""

    def _view(self: DirectiveRun, step: Step) -> StepView:
        record = self.state.steps.get(step.name) or StepRecord(name=step.name)
        plan = plan_step(
            step, self.snap.directive, frozenset(self.snap.local_tools), kiwi_tools=self.kiwi_tools
        )
        return StepView(
            name=step.name,
            status=record.status,
            mode=plan.mode,
            reason=plan.reason,
            description=step.description,
            action=render_safe(step.action, self._context()),
            tools=[c.tool for c in step.tool_calls],
            outputs=record.outputs,
            prerun_results=record.prerun_results,
        )

    def _publish(self: DirectiveRun) -> None:
        """Keep search attributes and current details up to date for the Temporal UI."""
        state = self.state
        step = self._current_step_name() or ""
        if self.snap.search_attributes:
            updates = [
                DIRECTIVE_ATTR.value_set(self.snap.directive.name),
                STATUS_ATTR.value_set(state.status),
                STEP_ATTR.value_set(step),
            ]
            if self.human_loop:
                pending = ",".join(a.request_id for a in state.approvals if a.status == "pending")
                updates.append(PENDING_APPROVAL_ATTR.value_set(pending))
            if self.newest:
                # Only what changed since this run's own last upsert (PUBLISH_OWN_RECORD): decided from what
                # the workflow code itself sent, never from workflow.info(), whose search attributes a
                # replaying worker builds from the run's start.
                updates = [u for u in updates if self.published.get(u.key.name) != u.value]
                self.published.update((u.key.name, u.value) for u in updates)
            elif self.lean:
                current = workflow.info().typed_search_attributes
                updates = [u for u in updates if current.get(u.key) != u.value]
            if updates:
                workflow.upsert_search_attributes(updates)
        lines = [
            f"**{state.status}**" + (f" · step `{step}`" if step else ""),
            f"{self.state.step_index}/{len(self.snap.directive.steps)} steps done · {state.call_seq} calls",
        ]
        if state.status == "awaiting_agent":
            lines.append(f"Waiting for the agent to complete step `{step}`")
        for approval in (a for a in state.approvals if a.status == "pending"):
            lines.append(
                f"Waiting for approval `{approval.request_id}` of {approval.summary} (args_hash "
                f"`{approval.args_hash}`, until {approval.expires_at}): "
                f"`kiwi approve {self.snap.run_id} {approval.request_id}`"
            )
        if state.recent_calls:
            last = state.recent_calls[-1]
            lines.append(f"Last call: {last.summary} → {last.status}")
        if state.error:
            lines.append(f"Error: {state.error}")
        workflow.set_current_details("\n\n".join(lines))

    def _spent(self: DirectiveRun) -> dict[str, Any]:
        """What a parent settles a child's share of its budget with: the calls counted against each rate limit,
        the times of the calls in each window, and the window slots still held for runs this one started that
        have not ended (CHILD_HELD). A child run's result carries it, and so does its failure."""
        return {
            "call_counts": dict(self.state.call_counts),
            "rate_times": self.state.rate_times,
            "window_reserved": {p: n for p, n in self.state.window_reserved.items() if n},
        }

    def _result(self: DirectiveRun) -> DirectiveRunResult:
        session = is_session(self.snap.run_id, self.snap.directive.name)
        return DirectiveRunResult(
            run_id=self.snap.run_id,
            status=self.state.status,
            outputs={n: r.outputs for n, r in self.state.steps.items()},
            error=self.state.error,
            calls=self.state.call_seq,
            **({} if session else self._spent()),
            **(
                self.state.model_dump(
                    include={
                        "recent_updates",
                        "update_seqs",
                        "loop_hashes",
                        "result_hashes",
                        "loop_warnings",
                        "hold_reason",
                        "call_counts",
                        "rate_times",
                        "children",
                        "window_reserved",
                        "audit_seq",
                        "stored_refusals",
                    }
                )
                if session
                else {}
            ),
        )

    def _status_view(self: DirectiveRun) -> RunStatus:
        directive = self.snap.directive
        views = [self._view(s) for s in directive.steps]
        current_name = self._current_step_name()
        current = next((v for v in views if v.name == current_name), None)
        waiting = ""
        if self.state.status == "awaiting_agent" and current:
            waiting = f"the agent to complete step '{current.name}'"
        elif self.state.status in HELD:
            open_ = [d for d in self.state.decisions if not d.answer]
            waiting = (
                f"a human to answer escalation {open_[-1].request_id} ({open_[-1].reason}): kiwi decide "
                f"{self.snap.run_id} {open_[-1].request_id} OPTION"
                if open_ and self.state.status == "awaiting_human"
                else f"a human to resume the run ({self.state.hold_reason}): kiwi resume {self.snap.run_id}"
            )
        elif self.state.status == "awaiting_approval":
            pending = [a for a in self.state.approvals if a.status == "pending"]
            waiting = "; ".join(
                f"approval of {a.summary} until {a.expires_at}: kiwi approve {self.snap.run_id} "
                f"{a.request_id}"
                for a in pending
            )
        return RunStatus(
            run_id=self.snap.run_id,
            directive=directive.name,
            version=directive.version,
            status=self.state.status,
            current_step=current,
            steps=views,
            inputs=self.snap.inputs,
            waiting_for=waiting,
            last_calls=self.state.recent_calls[-10:],
            help=self.state.help,
            calls=self.state.call_seq,
            error=self.state.error,
            continued=self.state.continued,
            children=self.state.children,
            approvals=self.state.approvals[-20:],
            decisions=self.state.decisions[-20:],
            checkpoints=self.state.checkpoints[-20:],
            trust=self.snap.trust,
            refused_decisions=self.state.refused_decisions,
            hold_reason=self.state.hold_reason,
            execution=self._execution(),
            hold_id=self._hold_id() if self.state.status in HELD else "",
            trace_id=started_trace_id(),
            deadline_at=self._deadline_at(),
            cancel_reason=self.state.cancel_reason,
        )

    def _deadline_at(self: DirectiveRun) -> str:
        """When the run times out, as the status shows it (README trial s36: nothing showed a deadline)."""
        seconds = self.snap.limits.deadline_seconds
        if not seconds or not self.state.started_at:
            return ""
        return (datetime.fromisoformat(self.state.started_at) + timedelta(seconds=seconds)).isoformat()
