"""What was pulled from the registry: ``.ai/config/registry-lock.json`` in the project (or user space),
so a run of a pulled directive can record where it came from. Kiwi writes it on every pull; an entry
counts only while the file's SHA-256 is still the one pulled (an edited copy is no longer the registry's).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from kiwi import projectfiles
from kiwi.errors import ItemInvalid

LOCK = Path("config") / "registry-lock.json"
MAX_LOCK_BYTES = 16_000_000


def file_digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _read(space: Path) -> dict[str, Any]:
    try:
        data = json.loads((space / LOCK).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def record(space: Path, kind: str, item_id: str, main_text: str, entry: dict[str, str]) -> None:
    """Remember a pull into ``space`` (the .ai folder it was written into)."""
    from kiwi.items.authoring import _atomic_write

    data = _read(space)
    data[f"{kind}:{item_id}"] = {**entry, "file_sha256": file_digest(main_text)}
    _atomic_write(space / LOCK, json.dumps(data, indent=2, sort_keys=True) + "\n")


def provenance(project_root: Path, kind: str, item_id: str, text: str) -> dict[str, str]:
    """What the project's lock says of a pulled item whose text is still the one pulled ({} if nothing); the
    lock is read with no link followed on the way (kiwi.projectfiles): through one, nothing is recorded."""
    try:
        raw = projectfiles.read_bytes(project_root, f".ai/{LOCK.as_posix()}", MAX_LOCK_BYTES)
        data = json.loads(raw) if raw is not None else {}
    except (ItemInvalid, ValueError, RecursionError):
        return {}
    entry = data.get(f"{kind}:{item_id}") if isinstance(data, dict) else None
    if isinstance(entry, dict) and entry.get("file_sha256") == file_digest(text):
        return {k: str(v) for k, v in entry.items() if k != "file_sha256"}
    return {}


def lock_entry(source: str, fetched: dict[str, Any]) -> dict[str, str]:
    """A pull's lock entry from what ``Registry.fetch`` reported."""
    return {
        "registry": source,
        **{k: str(fetched[k]) for k in ("namespace", "version", "signer", "content_hash")},
    }
