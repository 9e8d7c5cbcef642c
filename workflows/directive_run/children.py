"""Child runs (directive.run): intersected grants, inherited rules, a shared budget."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from temporalio import workflow
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.exceptions import ActivityError, CancelledError, ChildWorkflowError
from temporalio.workflow import ParentClosePolicy

with workflow.unsafe.imports_passed_through():
    from activities.directives import DirectiveActivities
    from kiwi.contracts import (
        DIRECTIVE_ATTR,
        PROJECT_ATTR,
        STATUS_ATTR,
        ChildRecord,
        DirectiveRunInput,
        DirectiveRunResult,
        ResolveDirectiveRequest,
        RunSnapshot,
        ToolCallResult,
        run_workflow_id,
    )
    from kiwi.errors import ChildRunFailed, InputInvalid
    from kiwi.rules import rule_in_force
    from kiwi.seal import NotSealed, resolved_sealed

from workflows.directive_run.errors import (
    CallRefused,
)
from workflows.directive_run.options import (
    CHILD_ATTRIBUTES,
    CHILD_DEADLINE,
    CHILD_HELD,
    CHILD_UNUSED_RETURNED,
    CHILD_WINDOWS,
    HELD,
    RETRY,
)

if TYPE_CHECKING:
    from workflows.directive_run.workflow import DirectiveRun


def _named(args: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """directive.run's directive name and inputs."""
    name = args.get("directive") or args.get("name")
    inputs = args.get("inputs") or {}
    if not isinstance(name, str) or not name or not isinstance(inputs, dict):
        raise CallRefused(
            "error",
            "directive.run needs 'directive' (a name) and optional 'inputs' (an object)",
            error_type=InputInvalid.type,
        )
    return name, inputs


def _spent_in(
    cause: BaseException | None,
) -> tuple[dict[str, int], dict[str, list[float]], dict[str, int]] | None:
    """What a failed child run used of its budget, from its failure's details (None if it carries none)."""
    details = getattr(cause, "details", None) or ()
    spent = details[0] if details and isinstance(details[0], dict) else None
    if spent is None:
        return None
    try:
        return (
            {str(p): int(n) for p, n in (spent.get("call_counts") or {}).items()},
            {str(p): [float(t) for t in ts] for p, ts in (spent.get("rate_times") or {}).items()},
            {str(p): int(n) for p, n in (spent.get("window_reserved") or {}).items()},
        )
    except (AttributeError, TypeError, ValueError):
        return None


class ChildrenMixin:
    """Child runs (directive.run): intersected grants, inherited rules, a shared budget."""

    async def _child_plan(
        self: DirectiveRun, args: dict[str, Any], seq: int
    ) -> tuple[RunSnapshot | None, ToolCallResult | None]:
        """The child a directive.run needing approval would start, read from its file now (CHILD_BOUND), so the
        approver is shown it and the approved call starts it; or the call's answer when none can start."""
        try:
            name, inputs = _named(args)
            child_id = run_workflow_id(name, f"{self.snap.run_id.rsplit('-', 1)[-1]}c{seq}")
            return await self._resolve_child(name, inputs, child_id), None
        except CallRefused as exc:
            refused = ToolCallResult(
                status=exc.status,
                tool="directive.run",
                reason=exc.reason,
                hint=exc.hint,  # type: ignore[arg-type]
                error_type=exc.error_type,
                call_seq=seq,
            )
            return None, refused

    async def _resolve_child(
        self: DirectiveRun, name: str, inputs: dict[str, Any], child_id: str
    ) -> RunSnapshot:
        """The child's snapshot, made from its directive file by the resolve_directive activity, its seal checked."""
        snap = self.snap
        try:
            child = await workflow.execute_activity_method(
                DirectiveActivities.resolve_directive,
                ResolveDirectiveRequest(
                    project_root=snap.project_root,
                    directive=name,
                    inputs=inputs,
                    run_id=child_id,
                    client=snap.client,
                    search_attributes=snap.search_attributes,
                ),
                start_to_close_timeout=timedelta(seconds=30),
                retry_policy=RETRY,
                summary=f"resolve directive {name}",
            )
        except ActivityError as exc:
            raise CallRefused(
                "error",
                getattr(exc.cause, "message", str(exc)),
                error_type=getattr(exc.cause, "type", "") or "ItemInvalid",
            ) from None
        if self.sealed and not resolved_sealed(child):
            # (A run started before seals takes its children's snapshots as it did.)
            raise CallRefused(
                "error",
                f"child directive '{name}': the answer of resolve_directive carries no valid seal (it was not "
                "made by a Kiwi worker holding this run's key), so no child started",
                error_type=NotSealed.type,
            )
        return child

    async def _run_child(
        self: DirectiveRun, args: dict[str, Any], origin: str, resolved: RunSnapshot | None = None
    ) -> Any:
        """``directive.run``: a child run with the intersection of this run's grants and its own. ``resolved``:
        the child as its approval showed it (CHILD_BOUND), started whatever its file says since."""
        snap, state = self.snap, self.state
        name, inputs = _named(args)
        if resolved is None:
            child_id = run_workflow_id(name, f"{snap.run_id.rsplit('-', 1)[-1]}c{state.call_seq}")
            child = await self._resolve_child(name, inputs, child_id)
        else:
            child, child_id = resolved, resolved.run_id
        excess = child.grants.exceeds(snap.grants)
        if excess:
            self.audit.record(
                {
                    "event": "escalation_attempt",
                    "child_directive": name,
                    "excess": excess,
                    "outcome": "denied" if snap.limits.on_escalation == "deny" else "narrowed",
                }
            )
            if snap.limits.on_escalation == "deny":
                raise CallRefused(
                    "denied",
                    f"child directive '{name}' declares more than this run grants: " + ", ".join(excess),
                    hint="grant it in the parent's <permissions>, narrow the child's, or set "
                    "child_runs.on_escalation: intersect in agent_harness.yaml",
                )
        child = child.model_copy(update={"grants": snap.grants.intersect(child.grants)})
        reserved: dict[str, int] = {}
        windows: dict[str, int] = {}
        if self.hardened:
            child, reserved, windows = self._inherit(child)
        left = self._remaining()
        if left is not None and rule_in_force(CHILD_DEADLINE):
            # The child ends by the parent's deadline (hostile review s38: a child of a run started with
            # --deadline 40 went on taking the agent's calls after its parent timed out).
            own = child.limits.deadline_seconds
            seconds = left.total_seconds() if own is None else min(own, left.total_seconds())
            child = child.model_copy(
                update={"limits": child.limits.model_copy(update={"deadline_seconds": seconds})}
            )
        attributes = None
        if snap.search_attributes and (self.current or workflow.patched(CHILD_ATTRIBUTES)):
            # Set at the start, as for a run a client starts: the child is its project's run from the first
            # moment (kiwi runs, the UI's views), not only once the project is looked up.
            attributes = TypedSearchAttributes(
                [
                    SearchAttributePair(DIRECTIVE_ATTR, name),
                    SearchAttributePair(STATUS_ATTR, "running"),
                    SearchAttributePair(PROJECT_ATTR, snap.project_root),
                ]
            )
        handle = await workflow.start_child_workflow(
            type(self).run,
            DirectiveRunInput(snapshot=child),
            id=child_id,
            search_attributes=attributes,
            task_queue=workflow.info().task_queue,
            parent_close_policy=ParentClosePolicy.ABANDON,
            static_summary=f"child of {snap.run_id}: {name} v{child.directive.version}",
        )
        record = ChildRecord(
            run_id=child_id, directive=name, narrowed=excess, reserved=reserved, reserved_windows=windows
        )
        state.children.append(record)
        self.audit.record({"event": "child_started", "child_run": child_id, "narrowed": excess})
        if self.holds_children and state.status in HELD:
            self._hold_child(child_id)  # (held while the child was starting: it holds from the first)
        if origin == "agent":
            # The agent steers the child by its run id; this call does not wait for it to finish,
            # but the parent keeps watching it so its status shows how the child ended.
            self._spawn(self._watch_child(handle, record), f"watch child run {child_id}", wait=False)
            return {"run_id": child_id, "status": "started", "narrowed": excess}
        result = await self._watch_child(handle, record)
        if result is None:
            raise CallRefused(
                "error", f"child run {child_id} failed: {record.error}", error_type=ChildRunFailed.type
            )
        return {"run_id": child_id, "status": result.status, "outputs": result.outputs}

    def _inherit(
        self: DirectiveRun, child: RunSnapshot
    ) -> tuple[RunSnapshot, dict[str, int], dict[str, int]]:
        """A child run under this run's rules: its approval rules and approvers, and a share of its budget.

        The child may use half (rounded up) of what is left of each per-run rate limit, and of each
        window half of what this run has not used of it lately (all of it, in runs started before
        BUDGET_HALVED); both are held back here until the child ends (``_settle``), so parent and
        children together, however many run at once, stay within every limit, and the parent keeps
        the other half for its own calls.
        """
        limits, state = self.snap.limits, self.state
        # The child's share of what is left (BUDGET_HALVED): half, rounded up; before it, all of it.
        share = (lambda left: (left + 1) // 2) if self.newest else (lambda left: left)
        reserved = {p: share(max(0, n - state.call_counts.get(p, 0))) for p, n in limits.rate_limits.items()}
        rates = {
            **child.limits.rate_limits,
            **{p: min(child.limits.rate_limits.get(p, left), left) for p, left in reserved.items()},
        }
        now = workflow.now().timestamp()
        free = {
            p: share(
                max(
                    0,
                    calls
                    - state.window_reserved.get(p, 0)
                    - sum(1 for t in state.rate_times.get(p, []) if t > now - seconds),
                )
            )
            for p, (calls, seconds) in limits.rate_windows.items()
        }
        windows = {
            **child.limits.rate_windows,
            **{p: (free[p], seconds) for p, (_, seconds) in limits.rate_windows.items()},
        }
        approvals = list(dict.fromkeys([*self._approval_patterns(), *child.limits.approval_tools]))
        for pattern, left in reserved.items():
            state.call_counts[pattern] = state.call_counts.get(pattern, 0) + left
        for pattern, slots in free.items():
            state.window_reserved[pattern] = state.window_reserved.get(pattern, 0) + slots
        return (
            child.model_copy(
                update={
                    "limits": child.limits.model_copy(
                        update={
                            "rate_limits": rates,
                            "rate_windows": windows,
                            "approval_tools": approvals,
                            "approvers": limits.approvers,
                            "blocked_commands": list(
                                dict.fromkeys([*limits.blocked_commands, *child.limits.blocked_commands])
                            ),
                        }
                    )
                }
            ),
            reserved,
            free,
        )

    def _settle(
        self: DirectiveRun,
        record: ChildRecord,
        used: dict[str, int] | None,
        times: dict[str, list[float]] | None = None,
        held: dict[str, int] | None = None,
    ) -> None:
        """Give back what a finished child did not use of the budget held for it (nothing if unknown); the
        times of the calls it made in each window count in this run's windows (CHILD_WINDOWS), and the window
        slots it still holds for runs it started that go on stay held here until this run ends (CHILD_HELD):
        nothing tells this run when they end."""
        for pattern, held_count in record.reserved.items():
            if used is None:
                count = held_count
            elif pattern in used:
                count = used[pattern]
            else:
                # A child that made no call of the pattern has no count of it: it used none. Before
                # CHILD_UNUSED_RETURNED that read as all of it used, and the parent kept none back.
                count = 0 if workflow.patched(CHILD_UNUSED_RETURNED) else held_count
            unused = held_count - min(held_count, count)
            self.state.call_counts[pattern] = max(0, self.state.call_counts.get(pattern, 0) - unused)
        slots = {p: n for p, n in record.reserved_windows.items() if n}
        if used is None and slots and rule_in_force(CHILD_HELD):
            # A child that ended saying nothing (terminated) may have used every slot it had just now; and
            # so may runs it started, which may go on: its slots stay held until this run ends.
            held = slots
        made = {p: list((times or {}).get(p, [])) for p in record.reserved_windows}
        if any(made.values()) and rule_in_force(CHILD_WINDOWS):
            # (Hostile review s38: the slots went back and the child's calls were forgotten, so six children one
            # after another, and the parent, made 15 calls under a limit of 3 a minute.)
            for pattern, stamps in made.items():
                self.state.rate_times[pattern] = sorted([*self.state.rate_times.get(pattern, []), *stamps])
        kept = {p: min(n, (held or {}).get(p, 0)) for p, n in slots.items()}
        if any(kept.values()) and rule_in_force(CHILD_HELD):
            # (Hostile review s38: a child ended while its own child ran; the slots went back here, and the
            # grandchild's calls counted in no window: 5 reads under 4 a minute.)
            self.audit.record(
                {
                    "event": "child_slots_kept",
                    "child_run": record.run_id,
                    "slots": {p: n for p, n in kept.items() if n},
                }
            )
        else:
            kept = {}
        for pattern, n in record.reserved_windows.items():
            back = n - kept.get(pattern, 0)
            self.state.window_reserved[pattern] = max(0, self.state.window_reserved.get(pattern, 0) - back)
        record.reserved = {}
        record.reserved_windows = {}

    async def _watch_child(self: DirectiveRun, handle: Any, record: ChildRecord) -> DirectiveRunResult | None:
        """Wait for a child run and record how it ended (None if it failed)."""
        try:
            result = await handle
        except ChildWorkflowError as exc:
            cause = exc.cause
            record.status = "cancelled" if isinstance(cause, CancelledError) else "failed"
            record.error = getattr(cause, "message", "") or str(exc)
            self.audit.record(
                {
                    "event": "child_finished",
                    "child_run": record.run_id,
                    "status": record.status,
                    "error": record.error,
                }
            )
            spent = _spent_in(cause)
            if (
                spent is not None
                and (record.reserved or record.reserved_windows)
                and rule_in_force(CHILD_HELD)
            ):
                # A failed child says what it used, as a finished one does (CHILD_HELD): its window calls
                # were forgotten, and all it had been given was kept back.
                self._settle(record, *spent)
            else:
                self._settle(record, None)
            return None
        record.status = result.status
        self._settle(record, result.call_counts, result.rate_times, result.window_reserved)
        self.audit.record({"event": "child_finished", "child_run": record.run_id, "status": record.status})
        return result
