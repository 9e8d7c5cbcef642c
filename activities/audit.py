"""The audit sink: JSONL per run and day, written in batches with sequence numbers.

A retried flush skips records whose sequence number is already in the file for that execution of the run, so a
batch is never written twice; the workflow keeps records until a flush succeeds, so none is lost.

The folders (``.ai/logs/audit/DAY``) and the file are opened one name at a time from the project
root with ``O_NOFOLLOW``: a symlink planted at ``.ai``, ``.ai/logs`` or below is never followed, so
records cannot be redirected outside the project. The flush fails (retryably, saying where the
link is) and the workflow keeps its records until a human removes the link.

A line that cannot be read (a torn write, garbage) does not stop the writer, which starts its next
records on a line of their own, nor the reader, which returns the good records and names the bad line.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from datetime import UTC, datetime, timedelta

from temporalio import activity

from kiwi import telemetry
from kiwi.auditlog import (  # noqa: F401 - the readers are re-exported for their existing callers
    AUDIT_FOLDERS,
    CLOEXEC,
    AuditPathUnsafe,
    AuditTrail,
    audit_path,
    open_audit_folder,
    read_audit,
    read_audit_trail,
    refusal,
    safe_name,
)
from kiwi.contracts import AuditBatch
from kiwi.metrics import AUDIT_FLUSH_LAG
from kiwi.upstream.pool import scrub

_TAIL = 65536


def _seqs(lines: list[bytes], execution: str | None) -> list[int]:
    out = []
    for line in lines:
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if not isinstance(record, dict) or (execution and record.get("workflow_run_id") != execution):
            continue
        seq = record.get("seq")
        if isinstance(seq, int) and not isinstance(seq, bool):
            out.append(seq)
    return out


def _last_seq(fd: int, size: int, execution: str | None = None) -> int:
    """The highest sequence number in the file of the records of ``execution`` (the workflow's run id: a run id
    can name several executions, whose numbers each start again; hostile review s38: a second child given the
    first's id had its records dropped as written), its tail first, the whole file when the tail has none."""
    start = max(0, size - _TAIL)
    while True:
        data = os.pread(fd, size - start, start)
        lines = data.splitlines()
        if start > 0:
            lines = lines[1:]  # the first line of a tail is usually cut
        found = _seqs(lines, execution)
        if found or start == 0:
            return max(found, default=0)
        start = 0


def _record_lag(batch: AuditBatch) -> None:
    """How long the oldest record of the batch waited in the run's state (``kiwi_audit_flush_lag``)."""
    times = []
    for record in batch.records:
        with contextlib.suppress(ValueError, TypeError):
            times.append(datetime.fromisoformat(str(record.get("time"))))
    if times:
        lag = max(datetime.now(UTC) - min(times), timedelta(0))
        activity.metric_meter().create_histogram_timedelta(
            AUDIT_FLUSH_LAG, "how long audit records waited in a run before a flush wrote them", "ms"
        ).record(lag)


class AuditActivities:
    @activity.defn(name="write_audit_records")
    async def write_audit_records(self, batch: AuditBatch) -> int:
        if telemetry.active():
            _record_lag(batch)
        written = 0
        by_day: dict[str, list[dict]] = {}
        for record in batch.records:
            by_day.setdefault(str(record.get("time", ""))[:10] or "undated", []).append(record)
        file_name = safe_name(f"{batch.run_id}.jsonl", "run id")
        for day, records in by_day.items():
            folder = open_audit_folder(batch.project_root, safe_name(day, "day"), create=True)
            assert folder is not None
            where = f".ai/logs/audit/{day}/{file_name}"
            try:
                fd = os.open(
                    file_name,
                    os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | CLOEXEC,
                    0o644,
                    dir_fd=folder,
                )
            except OSError as exc:
                raise refusal(where, exc) from None
            finally:
                os.close(folder)
            try:
                info = os.fstat(fd)
                if not stat.S_ISREG(info.st_mode):
                    raise AuditPathUnsafe(f"'{where}' is not a regular file")
                last = _last_seq(fd, info.st_size, records[0].get("workflow_run_id"))
                # (Scrubbed of the secrets this worker resolved for MCP servers: the run's records hold the
                # agent's arguments as sent, and an agent can echo a secret back in them, README trial s33.)
                fresh = [scrub(r) for r in records if int(r["seq"]) > last]
                if not fresh:
                    continue
                text = "".join(json.dumps(r, default=str) + "\n" for r in fresh).encode("utf-8")
                if info.st_size and os.pread(fd, 1, info.st_size - 1) != b"\n":
                    text = b"\n" + text  # a torn last line: the new records start on a line of their own
                view = memoryview(text)
                while view:
                    view = view[os.write(fd, view) :]
                written += len(fresh)
            finally:
                os.close(fd)
        return written
