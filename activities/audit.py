"""The audit sink: JSONL per run and day, written in batches with sequence numbers.

A retried flush skips records whose sequence number is already in the file, so a batch is
never written twice; the workflow keeps records until a flush succeeds, so none is lost.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from temporalio import activity

from kiwi.contracts import AuditBatch


def audit_path(project_root: str, run_id: str, day: str) -> Path:
    return Path(project_root) / ".ai" / "logs" / "audit" / day / f"{run_id}.jsonl"


def _last_seq(path: Path) -> int:
    if not path.exists():
        return 0
    with path.open("rb") as handle:
        handle.seek(0, os.SEEK_END)
        size = handle.tell()
        handle.seek(max(0, size - 65536))
        lines = [ln for ln in handle.read().splitlines() if ln.strip()]
    for line in reversed(lines):
        try:
            return int(json.loads(line)["seq"])
        except (ValueError, KeyError, TypeError):
            continue
    return 0


class AuditActivities:
    @activity.defn(name="write_audit_records")
    async def write_audit_records(self, batch: AuditBatch) -> int:
        written = 0
        by_day: dict[str, list[dict]] = {}
        for record in batch.records:
            by_day.setdefault(str(record.get("time", ""))[:10] or "undated", []).append(record)
        for day, records in by_day.items():
            path = audit_path(batch.project_root, batch.run_id, day)
            path.parent.mkdir(parents=True, exist_ok=True)
            last = _last_seq(path)
            fresh = [r for r in records if int(r["seq"]) > last]
            if not fresh:
                continue
            with path.open("a", encoding="utf-8") as handle:
                handle.write("".join(json.dumps(r, default=str) + "\n" for r in fresh))
            written += len(fresh)
        return written


def read_audit(project_root: str, run_id: str) -> list[dict]:
    """Every audit record of a run, oldest first (all days)."""
    base = Path(project_root) / ".ai" / "logs" / "audit"
    records: list[dict] = []
    for path in sorted(base.glob(f"*/{run_id}.jsonl")):
        records += [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return sorted(records, key=lambda r: r["seq"])
