"""The audit trail's files: ``.ai/logs/audit/DAY/RUN.jsonl``, reached without following links.

The folders and the file are opened one name at a time from the project root with ``O_NOFOLLOW``:
a symlink planted at ``.ai``, ``.ai/logs`` or below is never followed, so records can neither be
redirected outside the project (the writer, ``activities.audit``) nor read from there (``kiwi audit``,
the MCP front end's ``kiwi://runs/{id}/audit`` resource). A line that cannot be read does not stop
the reader, which returns the good records and names the bad line.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from temporalio.exceptions import ApplicationError

from kiwi import errors

AUDIT_FOLDERS = (".ai", "logs", "audit")
CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | CLOEXEC


def audit_path(project_root: str, run_id: str, day: str) -> Path:
    return Path(project_root) / ".ai" / "logs" / "audit" / day / f"{run_id}.jsonl"


class AuditPathUnsafe(ApplicationError):
    """A link (or a non-folder) stands where an audit folder or file should be."""

    def __init__(self, message: str, non_retryable: bool = False) -> None:
        super().__init__(message, type=errors.AuditPathUnsafe.type, non_retryable=non_retryable)


def safe_name(value: str, what: str) -> str:
    if not value or value in (".", "..") or "/" in value or "\\" in value or "\x00" in value:
        raise AuditPathUnsafe(f"{what} '{value}' cannot name an audit file", non_retryable=True)
    return value


def refusal(where: str, exc: OSError) -> AuditPathUnsafe:
    if exc.errno in (errno.ELOOP, errno.EMLINK):
        return AuditPathUnsafe(
            f"'{where}' is a symbolic link; the audit trail never follows links (remove it; "
            "the run keeps its records until it can write them)"
        )
    return AuditPathUnsafe(f"'{where}' cannot be opened as an audit folder or file: {exc.strerror}")


def open_folder(parent: int, name: str, where: str, create: bool) -> int | None:
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
                    raise refusal(where, OSError(errno.ELOOP, "link")) from None
            raise refusal(where, exc) from None
    raise AuditPathUnsafe(f"'{where}' kept changing while it was opened")


def open_audit_folder(project_root: str, day: str | None, create: bool) -> int | None:
    """The descriptor of ``.ai/logs/audit[/day]``, walked without links; None if it does not exist."""
    try:
        fd = os.open(project_root, os.O_RDONLY | os.O_DIRECTORY | CLOEXEC)
    except FileNotFoundError:
        if create:
            raise
        return None
    names = [*AUDIT_FOLDERS, *([day] if day else [])]
    for index, name in enumerate(names):
        where = "/".join(names[: index + 1])
        try:
            child = open_folder(fd, name, where, create)
        finally:
            os.close(fd)
        if child is None:
            return None
        fd = child
    return fd


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
        folder = open_audit_folder(project_root, None, create=False)
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
                day_fd = open_folder(folder, day, f"{base}/{day}", create=False)
            except AuditPathUnsafe as exc:
                trail.problems.append(str(exc))
                continue
            if day_fd is None:
                continue
            try:
                fd = os.open(file_name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | CLOEXEC, dir_fd=day_fd)
            except FileNotFoundError:
                continue
            except OSError as exc:
                trail.problems.append(str(refusal(where, exc)))
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
