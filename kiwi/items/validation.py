"""Validating one item file as `kiwi validate` and the MCP front end's `execute(..., validate)` report it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kiwi.errors import Problem
from kiwi.items.directive import Directive
from kiwi.items.store import find_project_root, parse_item, user_space
from kiwi.keys import load_trusted
from kiwi.signing import check_trust, verify


def item_type_of(path: Path) -> str:
    """directive, tool or knowledge, from where the file is and what it starts with."""
    parts = set(path.resolve().parts)
    if path.suffix in (".yaml", ".yml") or "tools" in parts or "scripts" in parts:
        return "tool"
    if "knowledge" in parts:
        return "knowledge"
    if "directives" in parts:
        return "directive"
    head = path.read_text(encoding="utf-8", errors="replace")[:4096]
    if head.lstrip().startswith("---") and "zettel_id" in head:
        return "knowledge"
    return "directive"


def validate_file(path: Path, local_tools: frozenset[str] = frozenset()) -> dict[str, Any]:
    """Parse and check one item file; its problems, signature (and whether a trusted key made it), step plan."""
    item_type = item_type_of(path)
    if not path.exists():
        return {
            "path": str(path),
            "item_type": item_type,
            "valid": False,
            "problems": [Problem("no such file", str(path)).as_dict()],
        }
    parsed, problems = parse_item(item_type, path)  # type: ignore[arg-type]
    result: dict[str, Any] = {"path": str(path), "item_type": item_type}
    if parsed is not None:
        try:
            status = verify(path.read_text(encoding="utf-8"))
            if status.signer:
                root = find_project_root(path.resolve().parent)
                check_trust(status, load_trusted(root, user_space()).with_role("sign"), item_type)
            result["signature"] = status.describe()
            result["trusted"] = status.trusted
            if status.state == "modified":
                problems.append(Problem(status.describe(), str(path), 1, 1, "warning"))
        except UnicodeDecodeError:
            pass
    if isinstance(parsed, Directive):
        result["item_id"] = parsed.name
        result["steps"] = [p.model_dump() for p in parsed.plan(local_tools)]
    elif parsed is not None:
        result["item_id"] = getattr(parsed, "tool_id", None) or getattr(parsed, "zettel_id", None)
    result["valid"] = parsed is not None and not any(p.severity == "error" for p in problems)
    result["problems"] = [p.as_dict() for p in problems]
    result["_problems"] = problems
    return result
