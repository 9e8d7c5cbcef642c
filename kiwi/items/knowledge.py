"""Knowledge entries: Markdown with YAML front matter (``zettel_id``, ``title``, ``entry_type``, ...)."""

from __future__ import annotations

import re
from typing import Any

import yaml
from pydantic import BaseModel, Field

from kiwi import yamltext
from kiwi.errors import ItemInvalid, Problem
from kiwi.signing import split_signature

ENTRY_TYPES = (
    "api_fact",
    "pattern",
    "concept",
    "learning",
    "procedure",
    "reference",
    "decision",
    "note",
    "example",
)
LINK_KEYS = ("references", "extends", "related", "supersedes", "links", "implements", "depends_on")
_ZETTEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class KnowledgeEntry(BaseModel):
    zettel_id: str
    title: str
    entry_type: str = "note"
    category: str = ""
    tags: list[str] = Field(default_factory=list)
    links: dict[str, list[str]] = Field(default_factory=dict)
    body: str = ""
    extra: dict[str, Any] = Field(default_factory=dict)
    path: str = ""


def parse_knowledge(text: str, path: str = "") -> tuple[KnowledgeEntry, list[Problem]]:
    problems: list[Problem] = []
    _, body = split_signature(text)
    offset = 0 if body is text else 1
    lines = body.splitlines()
    if not lines or lines[0].strip() != "---":
        raise ItemInvalid(
            [
                Problem(
                    "knowledge entry needs YAML front matter between '---' lines at the top",
                    path,
                    1 + offset,
                    1,
                )
            ]
        )
    try:
        end = next(i for i in range(1, len(lines)) if lines[i].strip() == "---")
    except StopIteration:
        raise ItemInvalid(
            [Problem("front matter is not closed by a '---' line", path, 1 + offset, 1)]
        ) from None
    try:
        meta = yamltext.safe_load("\n".join(lines[1:end])) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise ItemInvalid(
            [
                Problem(
                    f"malformed front matter: {getattr(exc, 'problem', exc)}",
                    path,
                    (mark.line + 2 + offset) if mark else 0,
                    (mark.column + 1) if mark else 0,
                )
            ]
        ) from None
    if not isinstance(meta, dict):
        raise ItemInvalid([Problem("front matter must be a YAML mapping", path, 2 + offset, 1)])
    for key in ("zettel_id", "title"):
        if not meta.get(key):
            raise ItemInvalid([Problem(f"front matter needs '{key}'", path, 2 + offset, 1)])
    zettel = str(meta["zettel_id"])
    if not _ZETTEL.match(zettel):
        raise ItemInvalid(
            [
                Problem(
                    f"zettel_id '{zettel}' may hold letters, digits, '-', '_' and '.' only",
                    path,
                    2 + offset,
                    1,
                )
            ]
        )
    entry_type = str(meta.get("entry_type", "note"))
    if entry_type not in ENTRY_TYPES:
        problems.append(
            Problem(
                f"entry_type '{entry_type}' is not one of {', '.join(ENTRY_TYPES)}",
                path,
                2 + offset,
                1,
                "warning",
            )
        )
    tags = meta.get("tags") or []
    if isinstance(tags, str):
        tags = [t.strip() for t in tags.split(",") if t.strip()]
    links = {
        k: [str(v) for v in (meta[k] if isinstance(meta[k], list) else [meta[k]])]
        for k in LINK_KEYS
        if meta.get(k)
    }
    known = {"zettel_id", "title", "entry_type", "category", "tags", *LINK_KEYS}
    extra = {k: v for k, v in meta.items() if k not in known}
    entry = KnowledgeEntry(
        zettel_id=zettel,
        title=str(meta["title"]),
        entry_type=entry_type,
        category=str(meta.get("category", "")),
        tags=[str(t) for t in tags],
        links=links,
        body="\n".join(lines[end + 1 :]).strip("\n"),
        extra=_jsonable(extra),
        path=path,
    )
    return entry, problems


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


def render_knowledge(entry: KnowledgeEntry) -> str:
    meta: dict[str, Any] = {
        "zettel_id": entry.zettel_id,
        "title": entry.title,
        "entry_type": entry.entry_type,
    }
    if entry.category:
        meta["category"] = entry.category
    if entry.tags:
        meta["tags"] = entry.tags
    meta.update(entry.links)
    meta.update(entry.extra)
    return (
        "---\n"
        + yaml.safe_dump(meta, sort_keys=False, allow_unicode=True)
        + "---\n\n"
        + entry.body.strip()
        + "\n"
    )
