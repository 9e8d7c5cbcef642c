"""Humans in the loop: approvals, escalations, holds and resumes, each decision signed by a trusted approver."""

from __future__ import annotations

import fnmatch
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import FailureError

with workflow.unsafe.imports_passed_through():
    from activities.approvals import ApprovalActivities
    from kiwi.contracts import (
        TERMINAL,
        ApprovalDecision,
        ApprovalRequest,
        CommitPlan,
        DecisionAnswer,
        DecisionRequest,
        HelpRecord,
        HelpRequest,
        ParentHeld,
        RefusedDecision,
        ResumeRequest,
        RunSnapshot,
        ToolCallResult,
        WebhookRequest,
        parent_hold_reason,
    )
    from kiwi.errors import ApprovalCancelled, ApprovalRejected, ApprovalTimedOut, RunStateConflict
    from kiwi.guards import approval_summary, digest, redact
    from kiwi.keys import approval_message, human_message, verify_bytes
    from kiwi.policy import shown_path
    from kiwi.rules import rule_in_force

from workflows.directive_run.options import (
    APPROVAL_AUDITED,
    HELD,
    HELP_CHECKPOINT_CALL,
    STUCK_ATTEMPTS_FOR_HUMAN,
    STUCK_HOLD_KEPT,
)

if TYPE_CHECKING:
    from workflows.directive_run.workflow import DirectiveRun


def _fixed(bound: CommitPlan | RunSnapshot) -> Any:
    """What an approval's hash covers beside the call: the commit's content, or the child's directive."""
    if isinstance(bound, CommitPlan):
        # (empty_tree and branch came after kiwi-commit-bound-s38's first runs: left out unless set, so the hashes
        # their histories hold stay as they were.)
        return bound.model_dump(exclude={k for k in ("empty_tree", "branch") if not getattr(bound, k)})
    return [_in_project(bound), bound.content_hash]  # (no machine path: the project's folder may move)


def _subject(bound: CommitPlan | RunSnapshot) -> str:
    """What the approver reads after the call's arguments."""
    if isinstance(bound, CommitPlan):
        return bound.subject()
    trust = bound.trust
    if trust.signature == "valid":
        signed = f"signed by {trust.signer}"
    elif trust.grants == "base":
        signed = f"{trust.signature}: its grants are only what it shares with the harness's base policy"
    else:
        signed = f"signature {trust.signature}"
    return (
        f"; starts directive {bound.directive.name} v{bound.directive.version} from {_in_project(bound)} as it "
        f"is now ({signed}; sha256 {bound.content_hash[:12]}, which `kiwi show {bound.directive.name}` prints for "
        "the file as it is when you look): the child started is this one, whatever the file says later"
    )


def _in_project(child: RunSnapshot) -> str:
    """The child's directive file, from the project's folder when it is in it."""
    return shown_path(child.source_path.removeprefix(child.project_root.rstrip("/") + "/"))


def _audited(bound: CommitPlan | RunSnapshot | None) -> dict[str, Any]:
    """What an approval_requested record holds of ``bound``."""
    if isinstance(bound, CommitPlan):
        return {
            "commits": [f"{f.change} {f.shown}" for f in bound.files],
            "tree": bound.tree,
        }  # (JSON: quoted)
    if isinstance(bound, RunSnapshot):
        return {
            "child": bound.directive.name,
            "source": _in_project(bound),
            "content_hash": bound.content_hash,
            "child_grants": bound.grants.summary(),
        }
    return {}


class HumansMixin:
    """Humans in the loop: approvals, escalations, holds and resumes, each decision signed by a trusted approver."""

    # ------------------------------------------------------------------ humans in the loop
    def _approval_patterns(self: DirectiveRun) -> list[str]:
        patterns = [*self.snap.limits.approval_tools, *self.snap.directive.metadata.approvals]
        for server, info in self.snap.mcp_servers.items():
            patterns += [f"{server}.{t}" for t in info.require_approval]
        return patterns

    def _needs_approval(self: DirectiveRun, tool: str) -> bool:
        return any(fnmatch.fnmatchcase(tool, p) for p in self._approval_patterns())

    async def _await_approval(
        self: DirectiveRun,
        tool: str,
        args: dict[str, Any],
        seq: int,
        origin: str,
        step: str | None,
        client: str,
        bound: CommitPlan | RunSnapshot | None = None,
    ) -> ToolCallResult | None:
        """Wait, durably, for a human to approve this exact call, and what ``bound`` fixes beside its arguments (a
        git.commit's content, COMMIT_BOUND; a directive.run's child, CHILD_BOUND); None means approved."""
        state, snap = self.state, self.snap
        timeout = snap.directive.metadata.approval_timeout_seconds or snap.limits.approval_timeout_seconds
        server = tool.partition(".")[0]
        if server in snap.mcp_servers and snap.mcp_servers[server].approval_timeout_seconds:
            timeout = snap.mcp_servers[server].approval_timeout_seconds or timeout
        now = workflow.now()
        request = ApprovalRequest(
            request_id=f"approval-{seq}",
            tool=tool,
            args_hash=digest([tool, args, _fixed(bound)] if bound else [tool, args]),
            summary=approval_summary(tool, args) + (_subject(bound) if bound else ""),
            requested_by=client,
            origin=origin,
            step=step,
            requested_at=now.isoformat(),
            expires_at=(now + timedelta(seconds=timeout)).isoformat(),
        )
        state.approvals = [*state.approvals, request][-50:]
        if state.status != "awaiting_approval" and state.status not in TERMINAL:
            state.approval_from = state.status
            state.status = "awaiting_approval"
        self.audit.record(
            {
                "event": "approval_requested",
                "request_id": request.request_id,
                "tool": tool,
                "arguments": redact(args),
                **_audited(bound),
                "args_hash": request.args_hash,
                "requested_by": client,
                "expires_at": request.expires_at,
            }
        )
        self._publish()
        audited = workflow.patched(APPROVAL_AUDITED)
        if audited and not self.latest:
            # Written before the wait (a human's: hours): `kiwi audit` shows what waits, and an approver
            # with no worker running finds what to sign in the audit trail (RunClient.approvals_without_worker).
            self._spawn(self.audit.flush(), f"audit {request.request_id}")
        if snap.limits.approval_webhook:
            payload = {
                "event": "approval_requested",
                "run_id": snap.run_id,
                "directive": snap.directive.name,
                **request.model_dump(
                    include={"request_id", "tool", "summary", "args_hash", "requested_by", "expires_at"}
                ),
                "approve": f"kiwi approve {snap.run_id} {request.request_id}",
                "reject": f"kiwi reject {snap.run_id} {request.request_id}",
            }
            self._spawn(
                workflow.start_activity_method(
                    ApprovalActivities.notify_approvers,
                    WebhookRequest(url=snap.limits.approval_webhook, payload=payload),
                    start_to_close_timeout=timedelta(seconds=30),
                    summary=f"notify approvers of {request.request_id}",
                    retry_policy=RetryPolicy(
                        initial_interval=timedelta(seconds=1),
                        maximum_interval=timedelta(minutes=1),
                        maximum_attempts=10,
                    ),
                ),
                f"notify approvers of {request.request_id}",
            )
        if audited and self.latest:
            # (EARLY_APPROVALS) Written before any decision is taken: a decision is taken once its call waits,
            # so the flush holds the request and never the decision, whichever came first to the worker.
            await self.audit.flush()
        self.waiting.add(request.request_id)
        # Decisions kept until now (EARLY_APPROVALS: signed before the request, or while its audit was written),
        # taken in the order they came: the first decides, a later one is refused and audited, as during the wait.
        early = [d for d in state.early_approvals if d.request_id == request.request_id]
        state.early_approvals = [d for d in state.early_approvals if d.request_id != request.request_id]
        for decision in early:
            self._on_decide_approval(decision)
        try:
            await workflow.wait_condition(
                lambda: request.status != "pending" or bool(state.cancel_reason),
                timeout=timedelta(seconds=timeout),
                timeout_summary=f"approval {request.request_id} expires",
            )
        except TimeoutError:
            request.status = "timed_out"
            request.reason = f"no decision within {timeout:g}s; a timeout denies"
            self.audit.record({"event": "approval_timed_out", "request_id": request.request_id, "tool": tool})
        self.waiting.discard(request.request_id)
        if request.status == "pending":
            request.status = "cancelled"
        if state.status == "awaiting_approval" and not any(a.status == "pending" for a in state.approvals):
            state.status = state.approval_from or "running"  # type: ignore[assignment]
        self._publish()
        if request.status == "approved":
            return None
        kinds = {
            "rejected": ApprovalRejected.type,
            "timed_out": ApprovalTimedOut.type,
            "cancelled": ApprovalCancelled.type,
        }
        return ToolCallResult(
            status="denied",
            tool=tool,
            call_seq=seq,
            error_type=kinds[request.status],
            reason=f"approval {request.request_id} {request.status.replace('_', ' ')}"
            + (f" by {request.decided_by}" if request.decided_by else "")
            + (f": {request.reason}" if request.reason else ""),
            hint="a changed call needs a new approval" if request.status == "rejected" else "",
        )

    def _human_problem(self: DirectiveRun, by: str, signature: str, message: bytes, command: str) -> str:
        """Why a human's decision does not come from a trusted approver ('' when it does).

        The caller of a run (an agent, a tool it runs) can send a signal, but cannot sign one: the
        approvers' private keys never reach the worker or its tools.
        """
        approvers = self.snap.limits.approvers
        if not approvers:
            return "no approvers are configured (trusted_keys.yaml role approve): create one with `kiwi keys init`"
        key = approvers.get(by)
        if key is None:
            return (
                f"'{by or 'nobody'}' is not a trusted approver of this run (approvers: "
                f"{', '.join(sorted(approvers)) or 'none'}; a run takes its approvers from trusted_keys.yaml "
                "when it starts, so a key trusted since then decides for runs started after it)"
            )
        if not signature or not verify_bytes(key, message, signature):
            return f"not signed by {by}'s key for exactly this decision; send it with `{command} --as {by}`"
        return ""

    def _refuse_decision(self: DirectiveRun, event: str, subject: str, by: str, reason: str) -> None:
        """Every refused human decision is in the audit trail, and (in hardened runs) in the run's status."""
        self.audit.record({"event": event, "request_id": subject, "by": by, "reason": reason})
        if self.hardened:
            self.state.refused_decisions = [
                *self.state.refused_decisions,
                RefusedDecision(request_id=subject, by=by, reason=reason, at=workflow.now().isoformat()),
            ][-20:]

    def _hold(self: DirectiveRun, status: str, reason: str) -> None:
        if self.state.status in TERMINAL or self.state.status in HELD:
            return
        self.state.held_from = self.state.status
        self.state.holds += 1
        self.state.status = status  # type: ignore[assignment]
        self.state.hold_reason = reason
        self.audit.record({"event": "held", "status": status, "reason": reason})
        if self.holds_children:
            self._hold_children()

    def _hold_children(self: DirectiveRun) -> None:
        for child in self.state.children:
            if child.status == "running":
                self._hold_child(child.run_id)

    def _hold_child(self: DirectiveRun, child_id: str) -> None:
        """Tell a running child run this run is held (PARENT_HOLDS_CHILDREN): it holds too."""

        async def tell() -> None:
            notice = ParentHeld(parent_run_id=self.snap.run_id, status=self.state.status)
            try:
                await workflow.get_external_workflow_handle(child_id).signal("parent_held", notice)
            except FailureError as exc:  # (a child that ended meanwhile: nothing to hold)
                self.audit.record({"event": "child_hold_failed", "child_run": child_id, "error": str(exc)})

        self.audit.record({"event": "child_held", "child_run": child_id})
        self._spawn(tell(), f"hold child run {child_id}")

    def _on_parent_held(self: DirectiveRun, notice: ParentHeld) -> None:
        """A notice that this run's parent is held: the run holds too, until resumed (by a human, as any
        hold; `kiwi resume PARENT` resumes the children it held). Anyone who can reach Temporal can send
        the signal; only the run's own parent is obeyed, with a reason the run writes itself."""
        if not self.holds_children:
            return  # (runs started before PARENT_HOLDS_CHILDREN never take it: same on replay)
        parent = workflow.info().parent
        if parent is None or parent.workflow_id != notice.parent_run_id:
            self.audit.record(
                {
                    "event": "parent_hold_ignored",
                    "named_parent": notice.parent_run_id[:200],
                    "reason": "not this run's parent" if parent is not None else "this run has no parent",
                }
            )
            return
        status = notice.status if notice.status in HELD else "stuck"
        reason = parent_hold_reason(notice.parent_run_id, status)
        if self._held_for_parent():
            # Held for the parent already, which held again (the agent looped it into `stuck` right after a
            # resume): a new hold, so a resume signed for the old one (`kiwi resume PARENT` under way, which
            # read it before the parent held again) is refused, and the run's own children renew theirs.
            self.state.holds += 1
            self.state.status = status  # type: ignore[assignment]
            self.state.hold_reason = reason
            self.audit.record({"event": "held", "status": status, "reason": reason, "renewed": True})
            self._hold_children()
        elif self.state.status in HELD:
            # Held for a reason of its own (its loop, a question): that hold stays as it is (`kiwi resume
            # PARENT` does not lift it), and when a human lifts it the run holds for its parent instead, so
            # neither an answer nor a resume of the child alone lets the agent on while the parent is held.
            self.state.parent_hold_pending = status
            self.audit.record({"event": "parent_hold_deferred", "parent_run": notice.parent_run_id})
        else:
            self._hold(status, reason)
        self._publish()

    def _held_for_parent(self: DirectiveRun) -> bool:
        """Whether the run is held because its parent is (PARENT_HOLDS_CHILDREN), not for a reason of its own."""
        parent = workflow.info().parent
        return (
            parent is not None
            and self.state.status in HELD
            and self.state.hold_reason == parent_hold_reason(parent.workflow_id, self.state.status)
        )

    def _release(self: DirectiveRun, request: ResumeRequest) -> None:
        self.audit.record(
            {"event": "resumed", "from": self.state.status, "reason": request.reason, "by": request.by}
        )
        self.state.status = self.state.held_from or "running"  # type: ignore[assignment]
        self.state.held_from = self.state.hold_reason = ""
        self.state.loop_warnings = 0
        parent = workflow.info().parent
        if self.holds_children and self.state.parent_hold_pending and parent is not None:
            status, self.state.parent_hold_pending = self.state.parent_hold_pending, ""
            self._hold(status, parent_hold_reason(parent.workflow_id, status))
        self._publish()

    def _refuse_if_held(self: DirectiveRun) -> None:
        if self.state.status in HELD:
            run_id, reason = self.snap.run_id, self.state.hold_reason
            # (A validator's refusal: no history records its text.)
            if reason.startswith("escalation "):
                # The hint of the escalation itself says kiwi decide: the refusal said only resume (s18 trial).
                asked = reason.split()[1].rstrip(":")
                action = f"a human answers it with `kiwi decide {run_id} {asked} OPTION` (or resumes it: `kiwi resume {run_id}`)"
            else:
                action = f"a human must resume it with `kiwi resume {run_id}`"
            raise RunStateConflict.error(f"run {run_id} is {self.state.status} ({reason}); {action}")

    def _execution(self: DirectiveRun) -> str:
        """This execution of the run: its first run id, kept across continue-as-new, new when the id is reused."""
        return workflow.info().first_execution_run_id

    def _hold_id(self: DirectiveRun) -> str:
        return f"hold-{self.state.holds}"

    def _on_help(self: DirectiveRun, request: HelpRequest) -> None:
        self.state.help.append(
            HelpRecord(
                kind=request.kind,
                reason=request.reason,
                attempts=request.attempts,
                options=request.options,
                at=workflow.now().isoformat(),
            )
        )
        self.audit.record(
            {"event": f"help_{request.kind}", "reason": request.reason, "attempts": request.attempts}
        )
        if request.kind == "stuck" and request.attempts > STUCK_ATTEMPTS_FOR_HUMAN:
            reason = f"the agent is stuck after {request.attempts} attempts: {request.reason}"
            if (
                self.state.status == "awaiting_human"
                and self.state.hold_reason.startswith("escalation ")
                and rule_in_force(STUCK_HOLD_KEPT)
            ):
                # (Held for an escalation already: the hold is now the stuck agent's, which a resume lifts.)
                self.state.hold_reason = reason
                self.audit.record({"event": "held", "status": "awaiting_human", "reason": reason})
            else:
                self._hold("awaiting_human", reason)
        if self.human_loop and request.kind == "escalate":
            request_id = request.request_id or f"decision-{len(self.state.decisions) + 1}"
            self.state.decisions = [
                *self.state.decisions,
                DecisionRequest(
                    request_id=request_id,
                    reason=request.reason,
                    options=request.options,
                    asked_at=workflow.now().isoformat(),
                ),
            ][-50:]
            self._hold("awaiting_human", f"escalation {request_id}: {request.reason}")
        if (
            self.human_loop
            and request.kind == "checkpoint"
            and self.snap.directive.metadata.git_checkpoint != "disabled"
        ):
            decision = self.snap.grants.check_tool_id("git.checkpoint")
            if self.newest and self.state.status in HELD:
                # A held run runs nothing the agent asks for until a human resumes it (HOLD_AT_ONCE).
                self.audit.record(
                    {
                        "event": "help_checkpoint_denied",
                        "decision": "denied",
                        "reason": f"run is {self.state.status} ({self.state.hold_reason})",
                        "hint": f"a human must resume it: kiwi resume {self.snap.run_id}",
                    }
                )
            elif self.hardened and not decision.allowed:
                # A checkpoint runs git in the project: the same grant as the git.checkpoint tool.
                self.audit.record(
                    {
                        "event": "help_checkpoint_denied",
                        "decision": "denied",
                        "reason": decision.reason,
                        "hint": decision.hint,
                    }
                )
            elif rule_in_force(HELP_CHECKPOINT_CALL):
                # The git.checkpoint call it is, with its approval, rate limit and loop checks (review s38).
                call = self._call(
                    "git.checkpoint",
                    {"message": request.reason or "the agent asked"},
                    origin="agent",
                    client="help(checkpoint)",  # (its approval said "by cli", the run's starter: review s38)
                )
                self._spawn(call, "checkpoint the agent asked for")
            else:
                self._spawn(
                    self._checkpoint(request.reason or "the agent asked"), "checkpoint the agent asked for"
                )
        self._publish()

    def _on_resume(self: DirectiveRun, request: ResumeRequest) -> None:
        if self.state.status not in HELD:
            return
        if self.hardened:
            refused = self._human_problem(
                request.by,
                request.signature,
                human_message("resume", self.snap.run_id, self._execution(), self._hold_id(), "", request.by),
                "kiwi resume",
            )
            if refused:
                self._refuse_decision("resume_refused", "resume", request.by, refused)
                return
        self._release(request)

    def _unsigned(self: DirectiveRun, decision: ApprovalDecision, args_hash: str) -> str:
        """Why ``decision`` is not a trusted approver's signature over its request and ``args_hash`` ('' when
        it is)."""
        message = approval_message(
            self.snap.run_id,
            self._execution(),
            decision.request_id,
            args_hash,
            decision.approved,
            decision.by,
        )
        command = f"kiwi approve {self.snap.run_id} {decision.request_id}"
        return self._human_problem(decision.by, decision.signature, message, command)

    def _kept_for_later(
        self: DirectiveRun, decision: ApprovalDecision, request: ApprovalRequest | None
    ) -> bool:
        """Whether a decision is kept until its call waits (EARLY_APPROVALS): a decision on a call the run has
        not asked about yet, or on one whose request is being written to the audit trail. Only one a trusted
        approver signed for exactly that request and those arguments (nobody else can fill the keeping), on a
        request still to come (its number not below the run's latest call). Kept with no command and no audit record:
        whatever it did now, a replay that sees it later would do later (audit batches and flushes included)."""
        if not self.latest or not decision.args_hash or not decision.signature:
            return False
        if request is None:
            try:
                number = int(decision.request_id.removeprefix("approval-"))
            except ValueError:
                return False
            if number < self.state.call_seq:
                # (A call before the latest: its request, if it made one, scrolled out of the run's list, and
                # never comes again. The latest call may still be on its way to its request.)
                return False
        elif request.status != "pending" or request.request_id in self.waiting:
            return False
        if self._unsigned(decision, decision.args_hash):
            return False
        if any(d.signature == decision.signature for d in self.state.early_approvals):
            return True  # (the same signal again: kept once)
        # In the order they came, each taken in turn when the call waits: the first decides (a later rejection
        # does not override an approval, nor the other way round: review s22 F-2).
        self.state.early_approvals = [*self.state.early_approvals, decision][-10:]
        return True

    def _on_decide_approval(self: DirectiveRun, decision: ApprovalDecision) -> None:
        request = next((a for a in self.state.approvals if a.request_id == decision.request_id), None)
        refused = ""
        if self._kept_for_later(decision, request):
            return
        if request is None:
            refused = f"no approval request '{decision.request_id}'"
        elif request.status != "pending":
            refused = f"{decision.request_id} is already {request.status}"
        elif decision.args_hash and decision.args_hash != request.args_hash:
            refused = "the decision names other arguments than the pending call; a changed call needs a new approval"
        elif decision.by and decision.by == request.requested_by:
            refused = f"'{decision.by}' made the call and cannot approve it"
        elif self.hardened:
            refused = self._unsigned(decision, request.args_hash)
        if refused or request is None:
            self._refuse_decision("approval_decision_refused", decision.request_id, decision.by, refused)
            return
        request.status = "approved" if decision.approved else "rejected"
        request.decided_by = decision.by or "unknown"
        request.reason = decision.reason
        self.audit.record(
            {
                "event": "approval_decided",
                "request_id": request.request_id,
                "tool": request.tool,
                "decision": request.status,
                "by": request.decided_by,
                "reason": decision.reason,
            }
        )

    def _on_decide(self: DirectiveRun, answer: DecisionAnswer) -> None:
        request = next((d for d in self.state.decisions if d.request_id == answer.request_id), None)
        signer = (
            self._human_problem(
                answer.by,
                answer.signature,
                human_message(
                    "decide", self.snap.run_id, self._execution(), answer.request_id, answer.option, answer.by
                ),
                "kiwi decide",
            )
            if self.hardened
            else ""
        )
        if (
            request is None
            or request.answer
            or (request.options and answer.option not in request.options)
            or signer
        ):
            why = (
                "no such escalation"
                if request is None
                else "already answered"
                if request.answer
                else f"'{answer.option}' is not one of {', '.join(request.options)}"
                if request.options and answer.option not in request.options
                else signer
            )
            self._refuse_decision("decision_refused", answer.request_id, answer.by, why)
            return
        request.answer, request.by, request.note = answer.option, answer.by or "unknown", answer.note
        self.audit.record(
            {
                "event": "decided",
                "request_id": request.request_id,
                "option": answer.option,
                "by": request.by,
                "note": answer.note,
            }
        )
        if (
            self.state.status == "awaiting_human"
            and not any(not d.answer for d in self.state.decisions)
            # An answer lifts a hold of the run's own, not the one it owes its held parent (whose resume lifts
            # it): the agent asked in a held child to have a human's answer free it.
            and not (self.holds_children and self._held_for_parent())
            # Only the escalation's own hold: a stuck agent's waits for a resume (README trial s36).
            and (self.state.hold_reason.startswith("escalation ") or not rule_in_force(STUCK_HOLD_KEPT))
        ):
            self._release(
                ResumeRequest(
                    reason=f"escalation {request.request_id} answered: {answer.option}", by=request.by
                )
            )
