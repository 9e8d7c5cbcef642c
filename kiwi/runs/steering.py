"""Humans steering runs: approvals decided (with or without a worker), resumes, cancels.

A part of :class:`kiwi.runs.RunClient`, which mixes it in."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from temporalio.client import WorkflowExecutionStatus
from temporalio.service import RPCError

from kiwi.auditlog import read_audit
from kiwi.contracts import (
    PENDING_APPROVAL_ATTR,
    TERMINAL,
    ApprovalRequest,
    CancelRequest,
    DecisionAnswer,
    ResumeRequest,
    RunStatus,
    parent_hold_reason,
)
from kiwi.errors import DecisionRefused, InputInvalid, KiwiError, RunFinished, RunStateConflict
from kiwi.guards import approval_summary
from kiwi.keys import default_key, human_message, load_private, sign_bytes
from kiwi.runs.shared import DECISION_WAIT_SECONDS, _approval_answered, _escalation_answered, _translate
from kiwi.snapshot import signed_decision
from workflows.directive_run import DirectiveRun
from workflows.directive_run.options import HELD

# What a request listed while no worker answers says of its summary, read from the run's audit record.
AUDITED_SUMMARY = (
    " [read from the audit record, where secret-looking values are [redacted] and long ones cut: with a worker "
    "running, `kiwi approvals` shows the whole call; deny what you cannot read]"
)


class RunSteering:
    """Humans steering runs: approvals decided (with or without a worker), resumes, cancels."""

    async def resume(self, run_id: str, reason: str = "", by: str | None = None) -> bool:
        """Let a held run carry on, signed with the approver key ``by`` (default: your only key), and the
        child runs it held with it (see :meth:`resume_with_children`).

        True when the run took it (see ``_taken``); DecisionRefused when it refused it."""
        return (await self.resume_with_children(run_id, reason, by))[0]

    async def resume_with_children(
        self, run_id: str, reason: str = "", by: str | None = None
    ) -> tuple[bool, list[str]]:
        """:meth:`resume`, and the run ids of the child runs (and theirs) resumed with it: a run that is held
        holds its running children (PARENT_HOLDS_CHILDREN), and each of those is resumed here, signed for
        itself, once the parent took its own resume. A child held for a reason of its own stays held. A
        parent no longer held resumes only the children it held: (False, their ids)."""
        try:
            taken = await self._resume_one(run_id, reason, by)
        except (RunStateConflict, RunFinished):
            # Not held any more (a human answered its question or resumed it alone; it was cancelled): the
            # children it held may still be, their reason naming this command. Resume those; else say why not.
            children = await self._resume_children(run_id, reason, by)
            if children:
                return False, children
            raise
        if not taken:
            return False, []
        return True, await self._resume_children(run_id, reason, by)

    async def _resume_children(self, run_id: str, reason: str, by: str | None) -> list[str]:
        """Resume each running child of ``run_id`` held for it (and theirs); the ids resumed."""
        resumed: list[str] = []
        for child in (await self.status(run_id)).children:
            if child.status != "running":
                continue
            try:
                now = await self.status(child.run_id)
                if now.status not in HELD or now.hold_reason != parent_hold_reason(run_id, now.status):
                    continue  # (held for a reason of its own, or not held)
                # Read after the child's hold: the agent may have looped the parent into a hold again since
                # its resume was taken, and its child then stays held. A parent held again after this read
                # sends the child a new notice, which renews its hold: the resume below, signed for the hold
                # read above, is then refused, or lifts it before the notice holds the child again.
                if (await self.status(run_id)).status in HELD:
                    continue
                why = reason or f"its parent run {run_id} was resumed"
                if not await self._resume_one(child.run_id, why, by, status=now):
                    continue
            except KiwiError:
                continue  # (gone, finished, or it refused a resume signed for a hold it renewed: still held)
            resumed += [child.run_id, *await self._resume_children(child.run_id, reason, by)]
        return resumed

    async def _resume_one(
        self, run_id: str, reason: str, by: str | None, *, status: RunStatus | None = None
    ) -> bool:
        """Resume one run, signed for its hold as ``status`` (default: read now) shows it."""
        if status is None:
            await self.execution(run_id)  # (a run that is none is named first: see decide_approval)
        by = default_key(by, option="--as", role="approve", project_root=self.store.project_root)
        load_private(by)
        status = status or await self.status(run_id)
        if status.status in TERMINAL:
            raise RunFinished(
                f"run {run_id} has finished ({status.status}); there is nothing to resume",
                hint=f"see `kiwi status {run_id}`; start a new run to go on",
            )
        if status.status not in HELD:
            raise RunStateConflict(
                f"run {run_id} is {status.status}, not stopped; resume lets a stuck or awaiting_human run "
                "carry on",
                hint=f"see `kiwi status {run_id}`",
            )
        signature = sign_bytes(by, human_message("resume", run_id, status.execution, status.hold_id, "", by))
        await self._signal(
            run_id, DirectiveRun.resume, ResumeRequest(reason=reason, by=by, signature=signature)
        )
        return await self._taken(run_id, "resume", status, lambda now: now.hold_id != status.hold_id)

    async def decide_approval(
        self, run_id: str, request_id: str, approved: bool, *, by: str | None = None, reason: str = ""
    ) -> ApprovalRequest:
        """Approve or reject a pending call, signed with the approver's key ``by`` (default: your only key).

        Answers the request as the run recorded it. The run accepts the decision only when ``by`` is
        a trusted approver and the signature covers this run, request, call hash and answer. The
        answer's status is the decision once the run took it, "pending" while no worker has taken it;
        a decision the run refused raises DecisionRefused with the run's reason.
        """
        # A misspelt run is named before the key is chosen (README trial s39: with two approver keys, `kiwi approve
        # run-nope 1` said to choose one with --as, and with --as, that there is no such run).
        await self.execution(run_id)
        by = default_key(by, option="--as", role="approve", project_root=self.store.project_root)
        load_private(by)  # no key, no decision: say so before asking the run anything
        status = await self.answered_status(run_id)
        if status is None:
            return await self._decide_without_worker(run_id, request_id, approved, by, reason)
        request = next((a for a in status.approvals if a.request_id == request_id), None)
        if request is None:
            pending = ", ".join(a.request_id for a in status.approvals if a.status == "pending") or "none"
            raise KiwiError(
                f"run {run_id} has no approval request '{request_id}' (pending: {pending})",
                hint=f"see `kiwi status {run_id}`",
            )
        if request.status != "pending":
            raise RunStateConflict(f"{request_id} is already {request.status}")
        if by == request.requested_by:
            raise KiwiError(f"'{by}' made this call and cannot approve it", hint="another person must decide")
        await self._signal(
            run_id,
            DirectiveRun.decide_approval,
            signed_decision(run_id, status.execution, request, approved, by, reason),
        )
        taken = await self._taken(run_id, request_id, status, lambda now: _approval_answered(now, request_id))
        return request.model_copy(
            update={"status": ("approved" if approved else "rejected") if taken else "pending"}
        )

    async def approvals_without_worker(self, run_id: str) -> tuple[str, list[ApprovalRequest]]:
        """The run's execution and its pending approval requests, with no worker to ask: which are pending
        is the run's own KiwiPendingApproval (Temporal keeps it), what each asks is its ``approval_requested``
        audit record (written within a second of the request). A request whose record is not written yet
        is left out."""
        await self.check_project(run_id)
        try:
            description = await self.handle(run_id).describe()
        except RPCError as exc:
            raise _translate(exc, run_id) from None
        if description.status != WorkflowExecutionStatus.RUNNING:
            raise RunFinished(
                f"{await self._how_it_ended(run_id, description.status)}; it waits for no approval"
            )
        ids = [
            i for i in (description.typed_search_attributes.get(PENDING_APPROVAL_ATTR) or "").split(",") if i
        ]
        asked = {
            r.get("request_id"): r
            for r in read_audit(str(self.store.project_root), run_id)
            if r.get("event") == "approval_requested"
        }
        pending = [
            ApprovalRequest(
                request_id=i,
                tool=str(asked[i].get("tool", "")),
                args_hash=str(asked[i].get("args_hash", "")),
                # (The audit record's copy: secret-looking values redacted and long ones cut, so it says so,
                # review s36 second round: a human could approve a call whose content read "[redacted]".)
                summary=approval_summary(str(asked[i].get("tool", "")), asked[i].get("arguments") or {})
                + AUDITED_SUMMARY,
                requested_by=str(asked[i].get("requested_by", "")),
                requested_at=str(asked[i].get("time", "")),
                expires_at=str(asked[i].get("expires_at", "")),
            )
            for i in ids
            if i in asked and asked[i].get("args_hash")
        ]
        return description.run_id or "", pending

    async def _decide_without_worker(
        self, run_id: str, request_id: str, approved: bool, by: str, reason: str
    ) -> ApprovalRequest:
        """decide_approval with no worker polling: the request from the audit trail, the signal sent (the
        run takes it, and checks its signature, when a worker runs); answered as still pending."""
        execution, pending = await self.approvals_without_worker(run_id)
        request = next((a for a in pending if a.request_id == request_id), None)
        if request is None:
            shown = ", ".join(a.request_id for a in pending) or "none whose record is written"
            raise KiwiError(
                f"no worker is running to answer for run {run_id}, and it has no pending approval request "
                f"'{request_id}' (pending: {shown})",
                hint="start a worker (`kiwi dev` or `kiwi worker`) and see `kiwi status "
                f"{run_id}`; its audit trail (`kiwi audit {run_id}`) lists the requests",
            )
        if by == request.requested_by:
            raise KiwiError(f"'{by}' made this call and cannot approve it", hint="another person must decide")
        await self._signal(
            run_id,
            DirectiveRun.decide_approval,
            signed_decision(run_id, execution, request, approved, by, reason),
        )
        return request

    async def decide(
        self, run_id: str, request_id: str, option: str, *, by: str | None = None, note: str = ""
    ) -> bool:
        """Answer an escalation, signed with the approver key ``by`` (default: your only key).

        True when the run took it (see ``_taken``); DecisionRefused when it refused it."""
        await self.execution(run_id)  # (a run that is none is named first: see decide_approval)
        by = default_key(by, option="--as", role="approve", project_root=self.store.project_root)
        load_private(by)
        status = await self.status(run_id)
        request = next((d for d in status.decisions if d.request_id == request_id), None)
        if request is None:
            raise KiwiError(
                f"run {run_id} has no escalation '{request_id}'", hint=f"see `kiwi status {run_id}`"
            )
        if request.answer:
            raise RunStateConflict(f"{request_id} was already answered: {request.answer}")
        if request.options and option not in request.options:
            raise InputInvalid(
                f"'{option}' is not an option of {request_id}; options: {', '.join(request.options)}"
            )
        signature = sign_bytes(by, human_message("decide", run_id, status.execution, request_id, option, by))
        await self._signal(
            run_id,
            DirectiveRun.decide,
            DecisionAnswer(request_id=request_id, option=option, by=by, note=note, signature=signature),
        )
        return await self._taken(
            run_id, request_id, status, lambda now: _escalation_answered(now, request_id)
        )

    async def cancel(
        self, run_id: str, reason: str = "cancelled by request", *, children: bool = True
    ) -> list[str]:
        """Cancel a run and, unless ``children`` is False, the child runs it started that still run (and
        theirs), each with a reason naming the run cancelled. The run ids of the children cancelled.

        A child outlives a parent that completes (the agent may still be working in it); one whose parent is
        cancelled was left running before, its parent's work gone."""
        running = await self._running_children(run_id) if children else []
        await self._signal(run_id, DirectiveRun.cancel, CancelRequest(reason=reason))
        cancelled: list[str] = []
        why = f"its parent run {run_id} was cancelled" + (f" ({reason})" if reason else "")
        for child in running:
            with contextlib.suppress(KiwiError):  # (it finished meanwhile)
                cancelled += [child, *await self.cancel(child, why)]
        return cancelled

    async def _running_children(self, run_id: str) -> list[str]:
        """The child runs ``run_id`` started that have not closed (Temporal's own record: no worker needed)."""
        try:
            description = await self.handle(run_id).describe()
        except RPCError:
            return []  # (the cancel itself says what is wrong with the run id)
        return [child.workflow_id for child in description.raw_description.pending_children]

    async def _taken(
        self, run_id: str, subject: str, before: RunStatus, taken: Callable[[RunStatus], bool]
    ) -> bool:
        """Watch the run take a human decision just signalled: a signal itself never says if it was refused.

        True once ``taken(status)`` holds; DecisionRefused with the run's reason when a new refusal of
        ``subject`` appears in its status; False when no worker took it within DECISION_WAIT_SECONDS
        (the signal is durable: the run takes it when a worker runs).
        """
        seen = {(r.by, r.reason, r.at) for r in before.refused_decisions if r.request_id == subject}
        loop = asyncio.get_running_loop()
        deadline, delay = loop.time() + DECISION_WAIT_SECONDS, 0.05
        while True:
            now = await self.status(run_id)
            refused = [
                r
                for r in now.refused_decisions
                if r.request_id == subject and (r.by, r.reason, r.at) not in seen
            ]
            if refused:
                raise DecisionRefused(
                    f"run {run_id} refused the decision on {subject} by '{refused[-1].by}': {refused[-1].reason}",
                    hint=f"`kiwi status {run_id}` lists refused decisions; `kiwi audit {run_id}` has them too",
                )
            if taken(now):
                return True
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.5)

    async def _signal(self, run_id: str, signal: Callable[..., Any], arg: Any) -> None:
        await self.check_project(run_id)
        try:
            await self.handle(run_id).signal(signal, arg)
        except RPCError as exc:
            raise await self._closed_or_missing(exc, run_id) from None
