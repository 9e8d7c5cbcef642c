"""Kiwi's meta-tools inside a run: searching and loading the run's project items (read-only).

The workflow has already checked the kiwi-mcp grant; these activities read the item store of the
run's project, never the user space or the registry, and never a file outside the project's
``.ai`` item folders (a symbolic link met on the way is refused, not followed).
"""

from __future__ import annotations

import asyncio
import os
import re
import stat
from pathlib import Path

from temporalio import activity

from kiwi.contracts import (
    MAX_TEXT_PAYLOAD,
    FoundItem,
    LoadItemRequest,
    LoadItemResult,
    SearchItemsRequest,
    SearchItemsResult,
    json_size,
)
from kiwi.errors import ItemNotFound, KiwiError, PermissionDenied
from kiwi.items.directive import Directive
from kiwi.items.files import MAX_ITEM_BYTES
from kiwi.items.store import ItemStore, parse_item

# Where each item type lives under .ai (the store's own folders).
ITEM_FOLDERS = {"directive": ("directives",), "tool": ("tools", "scripts"), "knowledge": ("knowledge",)}


class ItemActivities:
    """``search_items`` and ``load_item``: the run's project items, as kiwi-mcp.search and kiwi-mcp.load."""

    @activity.defn(name="search_items")
    async def search_items(self, req: SearchItemsRequest) -> SearchItemsResult:
        # The item store is SQLite and file scans: a thread, so the worker's event loop keeps running.
        return await asyncio.to_thread(_search, req)

    @activity.defn(name="load_item")
    async def load_item(self, req: LoadItemRequest) -> LoadItemResult:
        try:
            return await asyncio.to_thread(_load, req)
        except PermissionDenied as exc:
            raise PermissionDenied.error(exc.message) from None
        except KiwiError as exc:
            raise ItemNotFound.error(exc.message + (f" ({exc.hint})" if exc.hint else "")) from None


def _search(req: SearchItemsRequest) -> SearchItemsResult:
    root = Path(req.project_root)
    store = ItemStore(root)
    try:
        found = store.search(
            req.query, item_type=req.item_type, category=req.category, source="project", limit=req.limit
        )
    finally:
        store.close()
    return SearchItemsResult(
        results=[
            FoundItem(
                item_type=r.item_type,
                item_id=r.item_id,
                name=r.name,
                description=r.description,
                category=r.category,
                tags=r.tags,
                valid=r.valid,
                score=round(r.score, 4),
                snippet=r.snippet,
                path=_relative(store.project_root, r.path),
            )
            for r in found
            if _real(Path(r.path))
        ]
    )


def _real(path: Path) -> bool:
    """Whether ``path`` is reached without a symbolic link: a linked file's text is not the project's to show."""
    try:
        return path.resolve(strict=True) == path.absolute()
    except OSError:
        return False


def _load(req: LoadItemRequest) -> LoadItemResult:
    store = ItemStore(Path(req.project_root))
    try:
        record = store.find(req.item_type, req.item_id, source="project")
        local_tools = frozenset(store.local_tools()) if req.item_type == "directive" else frozenset()
    finally:
        store.close()
    path = Path(record.path)
    text = _read_item(store.project_root, req.item_type, path)
    parsed, problems = parse_item(req.item_type, path, text)
    return LoadItemResult(
        item_type=req.item_type,
        item_id=record.item_id,
        path=_relative(store.project_root, record.path),
        content=text,
        valid=parsed is not None and not any(p.severity == "error" for p in problems),
        problems=[str(p) for p in problems],
        steps_plan=[p.model_dump() for p in parsed.plan(local_tools)]
        if isinstance(parsed, Directive)
        else [],
    )


def _read_item(root: Path, item_type: str, path: Path) -> str:
    """The text of one item file, opened without following a symbolic link anywhere on its way.

    The file must sit in the project's ``.ai`` folder of its type, under names that are neither hidden
    (a tool's ``.env``) nor links: a link in ``.ai/knowledge`` to a secret elsewhere is refused.
    """
    ai = root / ".ai"
    try:
        parts = path.relative_to(ai).parts
    except ValueError:
        parts = ()
    if len(parts) < 2 or parts[0] not in ITEM_FOLDERS[item_type] or any(p.startswith(".") for p in parts):
        raise PermissionDenied(f"{path.name} is not an item file of the project's .ai/ folders")
    flags = os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        folder = os.open(ai, flags | os.O_DIRECTORY)
    except OSError as exc:
        raise PermissionDenied(
            f"the project's .ai folder cannot be opened as a real folder: {exc.strerror}"
        ) from exc
    try:
        for name in parts[:-1]:
            try:
                inner = os.open(name, flags | os.O_DIRECTORY, dir_fd=folder)
            except OSError as exc:
                raise PermissionDenied(
                    f"{'/'.join(parts)}: '{name}' is a symbolic link or not a folder; items are read only "
                    "through real folders"
                ) from exc
            os.close(folder)
            folder = inner
        try:
            # (Not blocking: opening a FIFO for reading would wait for a writer; fstat refuses it below.)
            fd = os.open(parts[-1], flags | os.O_NONBLOCK, dir_fd=folder)
        except OSError as exc:
            raise PermissionDenied(
                f"{'/'.join(parts)} is a symbolic link or cannot be opened; items are read only as regular files"
            ) from exc
    finally:
        os.close(folder)
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise PermissionDenied(f"{'/'.join(parts)} is not a regular file")
        raw = handle.read(MAX_ITEM_BYTES + 1)
    if len(raw) > MAX_ITEM_BYTES:
        raise PermissionDenied(f"{'/'.join(parts)} is over {MAX_ITEM_BYTES:,} bytes; items are smaller")
    text = raw.decode("utf-8", errors="replace")
    if json_size(text) > MAX_TEXT_PAYLOAD:
        raise PermissionDenied(
            f"{'/'.join(parts)} is {json_size(text):,} bytes as JSON text (control characters take six bytes "
            f"each), more than a run's answer may carry ({MAX_TEXT_PAYLOAD:,})"
        )
    if not _declares_item(item_type, parts[-1], text):
        # A tool's folder holds more than its manifest (a credentials.yaml, a config): the store lists
        # such a file as a broken tool, but it is no item, and its text is not the agent's to read.
        raise PermissionDenied(
            f"{'/'.join(parts)} is not a {item_type} item file (no {_ITEM_MARKS[item_type][1]} in it)"
        )
    return text


# What an item file of each type declares, as a pattern and as it is named in a refusal.
_ITEM_MARKS = {
    "directive": (re.compile(r"<directive[\s>]"), "<directive> element"),
    "tool": (re.compile(r"^tool_id\s*:", re.MULTILINE), "tool_id"),
    "knowledge": (re.compile(r"^zettel_id\s*:", re.MULTILINE), "zettel_id"),
}


def _declares_item(item_type: str, name: str, text: str) -> bool:
    if item_type == "tool" and name.endswith(".py"):
        return True  # a legacy script under .ai/scripts: the script is the tool
    return bool(_ITEM_MARKS[item_type][0].search(text))


def _relative(root: Path, path: str) -> str:
    try:
        return Path(path).relative_to(root).as_posix()
    except ValueError:
        return Path(path).name
