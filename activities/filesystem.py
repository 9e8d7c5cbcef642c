"""``filesystem.*`` activities. The workflow already checked the path lexically; here it is
resolved on disk (symlinks included) and must still be inside the project and its grant."""

from __future__ import annotations

import base64
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from kiwi.contracts import FilesystemRequest
from kiwi.globs import glob_match


def confine(root: str, raw: str, allowed: list[str], denied: list[str]) -> Path:
    """The real path of ``raw`` under ``root``, or PermissionDenied (non-retryable)."""
    base = Path(root).resolve()
    target = (base / raw).resolve()
    if target != base and base not in target.parents:
        raise ApplicationError(f"'{raw}' resolves outside the project root (symlink or '..')",
                               type="PermissionDenied", non_retryable=True)
    rel = "." if target == base else target.relative_to(base).as_posix()
    if any(glob_match(p, rel) for p in denied) or not any(glob_match(p, rel) for p in allowed):
        raise ApplicationError(f"'{raw}' resolves to '{rel}', which its grant does not cover",
                               type="PermissionDenied", non_retryable=True)
    return target


def _missing(path: Path, raw: str) -> ApplicationError:
    return ApplicationError(f"'{raw}' does not exist", type="FileNotFound", non_retryable=True)


class FilesystemActivities:
    """Filesystem side effects. Writes are atomic (temp file + rename), so a retried write is harmless."""

    @activity.defn(name="read_file")
    async def read_file(self, req: FilesystemRequest) -> dict[str, Any]:
        path = confine(req.project_root, req.path, req.allowed, req.denied)
        if not path.is_file():
            raise _missing(path, req.path)
        size = path.stat().st_size
        data = path.read_bytes()[: req.max_bytes]
        try:
            return {"path": req.path, "content": data.decode("utf-8"), "size": size, "truncated": size > req.max_bytes}
        except UnicodeDecodeError:
            return {"path": req.path, "content": base64.b64encode(data).decode(), "encoding": "base64", "size": size,
                    "truncated": size > req.max_bytes}

    @activity.defn(name="write_file")
    async def write_file(self, req: FilesystemRequest) -> dict[str, Any]:
        path = confine(req.project_root, req.path, req.allowed, req.denied)
        if path.is_dir():
            raise ApplicationError(f"'{req.path}' is a folder", type="IsADirectory", non_retryable=True)
        content = req.content or ""
        data = base64.b64decode(content) if req.encoding == "base64" else content.encode("utf-8")
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".kiwi-", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return {"path": req.path, "bytes": len(data)}

    @activity.defn(name="list_directory")
    async def list_directory(self, req: FilesystemRequest) -> dict[str, Any]:
        path = confine(req.project_root, req.path, req.allowed, req.denied)
        if not path.is_dir():
            raise _missing(path, req.path)
        entries = []
        for child in sorted(path.iterdir(), key=lambda p: p.name)[:1000]:
            entries.append({"name": child.name, "type": "dir" if child.is_dir() else "file",
                            "size": child.stat().st_size if child.is_file() else None})
        return {"path": req.path, "entries": entries}

    @activity.defn(name="create_directory")
    async def create_directory(self, req: FilesystemRequest) -> dict[str, Any]:
        path = confine(req.project_root, req.path, req.allowed, req.denied)
        path.mkdir(parents=True, exist_ok=True)
        return {"path": req.path, "created": True}

    @activity.defn(name="delete_path")
    async def delete_path(self, req: FilesystemRequest) -> dict[str, Any]:
        path = confine(req.project_root, req.path, req.allowed, req.denied)
        if path == Path(req.project_root).resolve():
            raise ApplicationError("refusing to delete the project root", type="PermissionDenied", non_retryable=True)
        if not path.exists():
            return {"path": req.path, "deleted": False}
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()
        return {"path": req.path, "deleted": True}

    @activity.defn(name="move_path")
    async def move_path(self, req: FilesystemRequest) -> dict[str, Any]:
        source = confine(req.project_root, req.path, req.allowed, req.denied)
        destination = confine(req.project_root, req.destination, req.allowed, req.denied)
        if not source.exists():
            if destination.exists():
                return {"source": req.path, "destination": req.destination, "moved": False}
            raise _missing(source, req.path)
        destination.parent.mkdir(parents=True, exist_ok=True)
        os.replace(source, destination)
        return {"source": req.path, "destination": req.destination, "moved": True}
