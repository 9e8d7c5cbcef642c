"""How `kiwi status` prints a run as text (its status, steps, calls, approvals, children and checkpoints)."""

from __future__ import annotations

import json
from typing import Any

from kiwi.cli import progress
from kiwi.cli.safeout import one_line
from kiwi.contracts import TERMINAL


def print_status(status: Any) -> None:
    print(f"{status.run_id}  {status.directive} v{status.version}  {progress.state(status.status)}")
    if status.deadline_at and status.status not in TERMINAL:
        print(f"  deadline: {progress.readable_time(status.deadline_at)} (the run times out then)")
    if status.error:
        print(f"  error: {one_line(status.error)}")
    if status.cancel_reason:
        # (The reason went to the audit trail only: the status said "cancelled" and not why or by whom.)
        said = "cancelled" if status.status == "cancelled" else "cancel asked"
        print(f"  {said}: {one_line(status.cancel_reason)}")
    if status.hint:
        print(f"  hint: {one_line(status.hint)}")
    # What it waits for, each with its deadline and the command that answers it (else the run's own words).
    for line in progress.answers(status) or ([status.waiting_for] if status.waiting_for else []):
        print(f"  waiting for {line}")
    for step in status.steps:
        marker = {"completed": "✓", "skipped": "-", "awaiting_agent": "…", "running": ">", "failed": "✗"}.get(
            step.status, " "
        )
        print(f"  {marker} {step.name:<24} {step.status:<15} {step.mode}")
        if step.status == "awaiting_agent" and step.action:
            for line in step.action.splitlines():
                print(f"      {line}")
        for key, value in step.outputs.items():
            if key == "results" and value == [step.outputs.get("result")]:
                continue  # one call: the same value as result
            shown = json.dumps(preview(value), default=str)
            print(f"      {key} = {shown if len(shown) <= 100 else shown[:97] + '...'}")
    for call in status.last_calls[-5:]:
        print(
            f"  call #{call.seq} {one_line(call.summary)} → {call.status}"
            f"{': ' + one_line(call.reason) if call.reason else ''}"
        )
    for signal_ in status.help:
        print(f"  help {signal_.kind}: {one_line(signal_.reason)}")
    for approval in status.approvals:
        print(
            f"  {approval.request_id} {one_line(approval.summary)} {asked_by(approval.model_dump())}: {approval.status}"
            + (
                f" (until {progress.readable_time(approval.expires_at)})"
                if approval.status == "pending"
                else f" by {one_line(approval.decided_by)}"
                if approval.decided_by
                else ""
            )
        )
    for decision in status.decisions:
        print(
            f"  {decision.request_id} {one_line(decision.reason)} [{one_line(', '.join(decision.options))}]: "
            + (f"{decision.answer} (by {decision.by})" if decision.answer else "open")
        )
    for refused in status.refused_decisions[-5:]:
        # (The DecisionRefused hint sends the approver here: it listed them in --json only.)
        print(
            f"  refused decision on {refused.request_id} by '{one_line(refused.by or '?')}': "
            f"{one_line(refused.reason)}"
        )
    for child in status.children:
        print(
            f"  child {child.run_id} ({child.directive}): {child.status}"
            + (f": {one_line(child.error)}" if child.error else "")
        )
    for checkpoint in status.checkpoints[-5:]:
        print(
            f"  checkpoint {checkpoint['checkpoint']} {checkpoint['commit'][:10]} ({one_line(checkpoint['why'])})"
        )


def preview(value: Any) -> Any:
    """What a one-line view shows of a step's output: an MCP tool's answer by its structured content, else its
    text, without its `_meta` (README trial s38: the line was all server info, the time or status cut off);
    `--json` has the whole."""
    if not isinstance(value, dict) or not ({"content", "structuredContent"} & set(value)):
        return value
    if value.get("structuredContent") is not None:
        return value["structuredContent"]
    texts = [
        c.get("text") for c in value.get("content") or [] if isinstance(c, dict) and c.get("type") == "text"
    ]
    return "\n".join(t for t in texts if isinstance(t, str)) or {
        k: v for k, v in value.items() if k != "_meta"
    }


def asked_by(approval: dict[str, Any]) -> str:
    """Who asked for an approval: the directive's step whose call it is, else the client that made the call (a
    step's call said "by mcp", the client that started the run: review s36)."""
    if approval.get("origin") == "step" and approval.get("step"):
        return f"step {one_line(approval['step'])}"
    return f"by {one_line(approval.get('requested_by') or 'unknown')}"
