"""The audit sink: JSONL per run and day, written in batches with sequence numbers.

A retried flush skips records whose sequence number is already in the file, so a batch is
never written twice; the workflow keeps records until a flush succeeds, so none is lost.

The folders (``.ai/logs/audit/DAY``) and the file are opened one name at a time from the project
root with ``O_NOFOLLOW``: a symlink planted at ``.ai``, ``.ai/logs`` or below is never followed, so
records cannot be redirected outside the project. The flush fails (retryably, saying where the
link is) and the workflow keeps its records until a human removes the link.

A line that cannot be read (a torn write, garbage) does not stop the writer, which starts its next
records on a line of their own, nor the reader, which returns the good records and names the bad line.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from temporalio import activity
from temporalio.exceptions import ApplicationError

from kiwi import errors
from kiwi.contracts import AuditBatch

AUDIT_FOLDERS = (".ai", "logs", "audit")
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | _CLOEXEC
_TAIL = 65536


def audit_path(project_root: str, run_id: str, day: str) -> Path:
    return Path(project_root) / ".ai" / "logs" / "audit" / day / f"{run_id}.jsonl"


class AuditPathUnsafe(ApplicationError):
    """A link (or a non-folder) stands where an audit folder or file should be."""

    def __init__(self, message: str, non_retryable: bool = False) -> None:
        super().__init__(message, type=errors.AuditPathUnsafe.type, non_retryable=non_retryable)


def _name(value: str, what: str) -> str:
    if not value or value in (".", "..") or "/" in value or "\\" in value or "\x00" in value:
        raise AuditPathUnsafe(f"{what} '{value}' cannot name an audit file", non_retryable=True)
    return value


def _refusal(where: str, exc: OSError) -> AuditPathUnsafe:
    if exc.errno in (errno.ELOOP, errno.EMLINK):
        return AuditPathUnsafe(
            f"'{where}' is a symbolic link; the audit trail never follows links (remove it; "
            "the run keeps its records until it can write them)"
        )
    return AuditPathUnsafe(f"'{where}' cannot be opened as an audit folder or file: {exc.strerror}")


def _open_folder(parent: int, name: str, where: str, create: bool) -> int | None:
    for _ in range(3):
        try:
            return os.open(name, _DIR_FLAGS, dir_fd=parent)
        except FileNotFoundError:
            if not create:
                return None
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, 0o777, dir_fd=parent)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.EMLINK, errno.ENOTDIR):
                info = os.stat(name, dir_fd=parent, follow_symlinks=False)
                if stat.S_ISLNK(info.st_mode):
                    raise _refusal(where, OSError(errno.ELOOP, "link")) from None
            raise _refusal(where, exc) from None
    raise AuditPathUnsafe(f"'{where}' kept changing while it was opened")


def _open_audit_folder(project_root: str, day: str | None, create: bool) -> int | None:
    """The descriptor of ``.ai/logs/audit[/day]``, walked without links; None if it does not exist."""
    try:
        fd = os.open(project_root, os.O_RDONLY | os.O_DIRECTORY | _CLOEXEC)
    except FileNotFoundError:
        if create:
            raise
        return None
    names = [*AUDIT_FOLDERS, *([day] if day else [])]
    for index, name in enumerate(names):
        where = "/".join(names[: index + 1])
        try:
            child = _open_folder(fd, name, where, create)
        finally:
            os.close(fd)
        if child is None:
            return None
        fd = child
    return fd


def _seqs(lines: list[bytes]) -> list[int]:
    out = []
    for line in lines:
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):
            continue
        seq = record.get("seq") if isinstance(record, dict) else None
        if isinstance(seq, int) and not isinstance(seq, bool):
            out.append(seq)
    return out


def _last_seq(fd: int, size: int) -> int:
    """The highest sequence number in the file: its tail first, the whole file when the tail has none."""
    start = max(0, size - _TAIL)
    while True:
        data = os.pread(fd, size - start, start)
        lines = data.splitlines()
        if start > 0:
            lines = lines[1:]  # the first line of a tail is usually cut
        found = _seqs(lines)
        if found or start == 0:
            return max(found, default=0)
        start = 0


class AuditActivities:
    @activity.defn(name="write_audit_records")
    async def write_audit_records(self, batch: AuditBatch) -> int:
        written = 0
        by_day: dict[str, list[dict]] = {}
        for record in batch.records:
            by_day.setdefault(str(record.get("time", ""))[:10] or "undated", []).append(record)
        file_name = _name(f"{batch.run_id}.jsonl", "run id")
        for day, records in by_day.items():
            folder = _open_audit_folder(batch.project_root, _name(day, "day"), create=True)
            assert folder is not None
            where = f".ai/logs/audit/{day}/{file_name}"
            try:
                fd = os.open(
                    file_name,
                    os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | _CLOEXEC,
                    0o644,
                    dir_fd=folder,
                )
            except OSError as exc:
                raise _refusal(where, exc) from None
            finally:
                os.close(folder)
            try:
                info = os.fstat(fd)
                if not stat.S_ISREG(info.st_mode):
                    raise AuditPathUnsafe(f"'{where}' is not a regular file")
                last = _last_seq(fd, info.st_size)
                fresh = [r for r in records if int(r["seq"]) > last]
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


@dataclass
class AuditTrail:
    """What ``read_audit_trail`` found: the good records, oldest first, and what could not be read."""

    records: list[dict] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def read_audit_trail(project_root: str, run_id: str) -> AuditTrail:
    """Every readable audit record of a run (all days), and a line for each file or line that was not."""
    trail = AuditTrail()
    base = ".ai/logs/audit"
    try:
        folder = _open_audit_folder(project_root, None, create=False)
    except AuditPathUnsafe as exc:
        trail.problems.append(str(exc))
        return trail
    if folder is None:
        return trail
    file_name = f"{run_id}.jsonl"
    try:
        with os.scandir(folder) as scan:
            days = sorted(e.name for e in scan)
        for day in days:
            where = f"{base}/{day}/{file_name}"
            try:
                day_fd = _open_folder(folder, day, f"{base}/{day}", create=False)
            except AuditPathUnsafe as exc:
                trail.problems.append(str(exc))
                continue
            if day_fd is None:
                continue
            try:
                fd = os.open(file_name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | _CLOEXEC, dir_fd=day_fd)
            except FileNotFoundError:
                continue
            except OSError as exc:
                trail.problems.append(str(_refusal(where, exc)))
                continue
            finally:
                os.close(day_fd)
            with os.fdopen(fd, "rb") as handle:
                if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                    trail.problems.append(f"'{where}' is not a regular file")
                    continue
                data = handle.read()
            _parse(data, where, trail)
    finally:
        os.close(folder)
    trail.records.sort(key=lambda r: r["seq"])
    return trail


def _parse(data: bytes, where: str, trail: AuditTrail) -> None:
    for number, line in enumerate(data.split(b"\n"), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line.decode("utf-8"))
        except (ValueError, RecursionError) as exc:
            trail.problems.append(f"{where} line {number} could not be read ({_why(exc)})")
            continue
        if (
            not isinstance(record, dict)
            or not isinstance(record.get("seq"), int)
            or isinstance(record["seq"], bool)
        ):
            trail.problems.append(f"{where} line {number} could not be read (not an audit record: no 'seq')")
            continue
        trail.records.append(record)


def _why(exc: ValueError | RecursionError) -> str:
    if isinstance(exc, json.JSONDecodeError):
        return f"not JSON: {exc.msg} at column {exc.colno}"
    if isinstance(exc, RecursionError):
        return "not an audit record: nested too deeply"
    return "not UTF-8 text"


def read_audit(project_root: str, run_id: str) -> list[dict]:
    """Every readable audit record of a run, oldest first (all days); see ``read_audit_trail`` for the rest."""
    return read_audit_trail(project_root, run_id).records
