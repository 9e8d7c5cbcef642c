"""Tools an agent writes: proposals a human accepts.

A local tool is code Kiwi runs, so ``.ai/tools`` is written only by a human. ``execute(tool, create |
update)`` validates the manifest and files like ``kiwi validate`` and writes them to
``.ai/proposals/tools/ID/``, where nothing is ever loaded or run; ``kiwi tools accept ID`` (a human,
after reading it) moves the proposal into ``.ai/tools/CATEGORY/ID/``. A tool update is a proposal too,
and replaces the tool only when accepted.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import yaml

from kiwi.errors import InputInvalid, ItemInvalid, ItemNotFound
from kiwi.items.authoring import _inside
from kiwi.items.store import ItemStore
from kiwi.items.tools import foreign_tool_file, parse_manifest

PROPOSALS = Path("proposals") / "tools"
MAX_BYTES = 1_000_000


def propose_tool(
    store: ItemStore, item_id: str, parameters: dict[str, Any], *, update: bool
) -> dict[str, Any]:
    manifest = parameters.get("manifest")
    files = parameters.get("files") or {}
    if isinstance(manifest, dict):
        # (README trial s39: a manifest sent as an object was told it needs a manifest.) Taken as YAML's mapping.
        manifest = yaml.safe_dump(manifest, sort_keys=False, allow_unicode=True)
    if not isinstance(manifest, str) or not manifest.strip():
        raise InputInvalid(
            "tool create/update needs parameters.manifest: the whole tool.yaml, as YAML text or an object"
            + (f" (it got {type(manifest).__name__})" if manifest is not None else ""),
            hint="and parameters.files: {'main.py': '...'} for the files beside it",
        )
    if not isinstance(files, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in files.items()
    ):
        raise InputInvalid("parameters.files must map relative paths to file contents (text)")
    if sum(len(v.encode()) for v in files.values()) + len(manifest.encode()) > MAX_BYTES:
        raise InputInvalid(f"a proposed tool is at most {MAX_BYTES:,} bytes in all")
    parsed, problems = parse_manifest(manifest, "tool.yaml")
    if any(p.severity == "error" for p in problems):
        raise ItemInvalid(problems)
    if item_id and parsed.tool_id != item_id:
        raise InputInvalid(f"the manifest's tool_id is '{parsed.tool_id}', not '{item_id}'")
    exists = _existing(store, parsed.tool_id)
    if update and exists is None:
        raise ItemNotFound(f"no tool '{parsed.tool_id}' to update", hint="use action='create'")
    if not update and exists is not None:
        raise InputInvalid(f"tool '{parsed.tool_id}' exists at {exists}", hint="use action='update'")
    entry = parsed.entrypoint
    if entry and entry not in files and parsed.tool_type in ("python", "bash"):
        raise InputInvalid(f"the manifest runs {entry}, which parameters.files does not hold")
    if (why := misplaced(parsed.category, parsed.tool_id)) is not None:
        raise InputInvalid(
            f"tool '{parsed.tool_id}' cannot be proposed: {why}", hint="choose another category or id"
        )
    for rel in files:
        if rel != "tool.yaml" and (why := foreign_tool_file(rel)) is not None:
            raise InputInvalid(f"parameters.files holds {rel}, which a tool may not: {why}")
    space = store.spaces["project"]
    folder = _inside(space / PROPOSALS, parsed.tool_id, what="tool id")
    if folder.exists():
        # What a human read stays what a human accepts: a proposal is not rewritten under them.
        raise InputInvalid(
            f"a proposal for tool '{parsed.tool_id}' already waits for a human ({folder})",
            hint="ask the human to accept or remove it (`kiwi tools proposals`), then propose again",
        )
    staging = Path(tempfile.mkdtemp(dir=_mkdir(folder.parent), prefix=f".{parsed.tool_id}-"))
    try:
        (staging / "tool.yaml").write_text(manifest, encoding="utf-8")
        for rel, text in files.items():
            if rel == "tool.yaml":
                raise InputInvalid("the manifest goes in parameters.manifest, not in files")
            file = _inside(staging, rel, what="file path")
            file.parent.mkdir(parents=True, exist_ok=True)
            file.write_text(text, encoding="utf-8")
        os.rename(staging, folder)  # (fails if one appeared meanwhile: never replaced)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return {
        "item_id": parsed.tool_id,
        "status": "proposed",
        "path": str(folder),
        "replaces": str(exists) if exists else "",
        "message": "written as a proposal: nothing runs it until a human reads it and accepts it",
        "hint": f"a human runs `kiwi tools accept {parsed.tool_id}`",
    }


# Folder names a proposed tool's category and id may not hold: `lib` is the code every Python tool of the space
# imports (first on its path, before the standard library), `tools`/`scripts` would start a space's layout of
# their own inside it (review s34: a proposed tool `json` in category `lib` became every tool's `json`).
RESERVED_FOLDERS = ("lib", "tools", "scripts")


def misplaced(category: str, tool_id: str) -> str | None:
    """Why a tool of ``category`` and ``tool_id`` may not be installed where they put it, or None."""
    if "/" in tool_id or "\\" in tool_id:
        # (Second review s34: `lib\\json` was one part here and two folders where it was written.)
        return f"its id '{tool_id}' holds a path separator: an id is one name"
    for part in [*(category or "").replace("\\", "/").split("/"), tool_id]:
        if part.casefold() in RESERVED_FOLDERS:
            return (
                f"its category or id names a '{part}' folder: a lib/ folder holds the code every Python tool "
                "imports (ahead of the standard library), and tools/ or scripts/ would start a tool space inside "
                "the tools"
            )
        if part.startswith("."):
            return f"its category or id holds '{part}', a hidden folder"
    return None


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def _existing(store: ItemStore, tool_id: str) -> Path | None:
    try:
        return Path(store.find("tool", tool_id, source="project").path).parent
    except ItemNotFound:
        return None


def list_proposals(store: ItemStore) -> list[dict[str, str]]:
    base = store.spaces["project"] / PROPOSALS
    found = []
    for folder in sorted(base.iterdir()) if base.is_dir() else []:
        if folder.is_dir() and not folder.name.startswith(".") and (folder / "tool.yaml").is_file():
            existing = _existing(store, folder.name)
            found.append({"tool_id": folder.name, "path": str(folder), "replaces": str(existing or "")})
    return found


def accept_tool(store: ItemStore, tool_id: str) -> dict[str, str]:
    """Move a proposal into .ai/tools (the human's act), replacing the tool it updates."""
    base = store.spaces["project"] / PROPOSALS
    folder = _inside(base, tool_id, what="tool id")
    if not (folder / "tool.yaml").is_file():
        raise ItemNotFound(
            f"no proposed tool '{tool_id}' in {base}", hint="`kiwi tools proposals` lists them"
        )
    parsed, problems = parse_manifest(
        (folder / "tool.yaml").read_text(encoding="utf-8"), str(folder / "tool.yaml")
    )
    if any(p.severity == "error" for p in problems) or parsed.tool_id != tool_id:
        raise ItemInvalid(problems or [])
    if (why := misplaced(parsed.category, tool_id)) is not None:
        # (Proposed before the check: refused where the human accepts it too.)
        raise InputInvalid(
            f"proposed tool '{tool_id}' is not accepted: {why}",
            hint=f"remove the proposal ({folder}); ask for it again under another category",
        )
    existing = _existing(store, tool_id)
    target = existing or _inside(
        store.spaces["project"] / "tools", parsed.category or "", tool_id, what="tool"
    )
    target.parent.mkdir(parents=True, exist_ok=True)
    old = None
    if target.exists():
        old = target.parent / f".{tool_id}-replaced-{os.getpid()}"
        os.replace(target, old)
    os.replace(folder, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return {"tool_id": tool_id, "path": str(target), "status": "accepted", "replaced": str(existing or "")}
