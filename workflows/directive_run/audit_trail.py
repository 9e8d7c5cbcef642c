"""The audit trail: records kept in the run's state until a local activity writes them."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from activities.audit import AuditActivities
    from kiwi.contracts import (
        AuditBatch,
        RunSnapshot,
        RunState,
    )
    from kiwi.metrics import RunMetrics
    from kiwi.tracing import audit_span, current_ids, traced_here


class AuditTrail:
    """A run's audit trail: numbers each record, keeps it in the run's state (so history has it and a
    crashed worker's successor writes it again) until a local activity has written it, and flushes one
    batch at a time (the step-boundary, idle, final and continue-as-new flushes share the lock)."""

    def __init__(self, state: RunState, snap: RunSnapshot) -> None:
        self.state = state
        self.snap = snap
        self.lock = asyncio.Lock()
        # Runs started before the audit-local-activity patch write through an ordinary activity.
        self.local = False
        self.metrics: RunMetrics | None = None

    def record(self, record: dict[str, Any]) -> None:
        self.state.audit_seq += 1
        entry = {
            "seq": self.state.audit_seq,
            "time": workflow.now().isoformat(),
            "run_id": self.snap.run_id,
            "workflow_run_id": workflow.info().run_id,
            "directive": self.snap.directive.name,
            **record,
            # With tracing on: the trace and span of the call that made the record.
            **current_ids(),
        }
        self.state.audit_pending.append(entry)
        if traced_here():
            # Telemetry on: the record as a span, and counted (Temporal's meter skips replays).
            audit_span(entry)
            if self.metrics is None:
                self.metrics = RunMetrics(workflow.metric_meter())
            self.metrics.record(entry)

    @property
    def pending(self) -> int:
        return len(self.state.audit_pending)

    async def flush(self) -> None:
        async with self.lock:
            batch = list(self.state.audit_pending)
            if not batch:
                return
            # A local activity: the audit file is written by the worker running this workflow,
            # without a round trip through the task queue. Retries are idempotent (sequence numbers).
            request = AuditBatch(project_root=self.snap.project_root, run_id=self.snap.run_id, records=batch)
            options: dict[str, Any] = {
                "start_to_close_timeout": timedelta(seconds=30),
                "retry_policy": RetryPolicy(maximum_interval=timedelta(seconds=10)),
                "summary": f"audit {len(batch)} records",
            }
            if self.local:
                await workflow.execute_local_activity_method(
                    AuditActivities.write_audit_records, request, **options
                )
            else:
                await workflow.execute_activity_method(
                    AuditActivities.write_audit_records, request, **options
                )
            flushed = {r["seq"] for r in batch}
            self.state.audit_pending = [r for r in self.state.audit_pending if r["seq"] not in flushed]
