"""Creating, updating and deleting items: only validated content is ever written, atomically."""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from kiwi.errors import InputInvalid, ItemNotFound, PermissionDenied
from kiwi.items.directive import parse_directive
from kiwi.items.knowledge import LINK_KEYS, KnowledgeEntry, parse_knowledge, render_knowledge
from kiwi.items.store import ItemStore
from kiwi.signing import split_signature
from kiwi.toolargs import CONTROL_CHARACTERS, json_kind


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".kiwi-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


_SAFE_PART = re.compile(r"^[A-Za-z0-9_.-]+$")


def _inside(folder: Path, *parts: str, what: str) -> Path:
    """``folder/parts...``, refused unless it stays inside ``folder`` with no symlink on the way.

    Every value an agent gives that becomes a path (a category, an id) is checked: no absolute
    paths, no '..', only plain names, and the real path (symlinks resolved) must be the lexical one.
    """
    segments: list[str] = []
    for part in parts:
        for segment in part.replace("\\", "/").split("/"):
            if segment in ("", "."):
                continue
            if segment == ".." or not _SAFE_PART.match(segment) or part.startswith(("/", "~")):
                raise InputInvalid(
                    f"{what} '{part}' would leave the items folder {folder}",
                    hint="use plain names separated by '/', e.g. 'ops/deploy' (no '..', no absolute paths)",
                )
            segments.append(segment)
    target = folder.joinpath(*segments)
    # The space (.ai/ or ~/.ai) is where the user put it; the item folder in it must be a real folder.
    base = folder.parent.resolve() / folder.name
    if target.resolve() != base.joinpath(*segments):
        raise InputInvalid(
            f"{what} '{'/'.join(parts)}' goes through a symlink out of {folder}",
            hint="items are written only into real folders under .ai/",
        )
    return target


def _space(store: ItemStore, location: str) -> Path:
    if location not in store.spaces:
        raise InputInvalid(f"location '{location}' is unknown", hint=f"use one of: {', '.join(store.spaces)}")
    return store.spaces[location]


def _existing(store: ItemStore, item_type: str, item_id: str, location: str) -> Path | None:
    try:
        return Path(store.find(item_type, item_id, source=location).path)  # type: ignore[arg-type]
    except ItemNotFound:
        return None


def _refuse_shadowing(store: ItemStore, item_type: str, item_id: str, location: str) -> None:
    """A new project item with the id of a user-space one would shadow it for every run of the project (a
    human's signed directive replaced, unseen, by an agent's unsigned text), as copy_to_project and pull
    refuse."""
    if location != "project":
        return
    other = _existing(store, item_type, item_id, "user")
    if other is not None:
        raise InputInvalid(
            f"the user space holds {item_type} '{item_id}' ({other}); a project copy would shadow it",
            hint="choose another id",
        )


def save_directive(
    store: ItemStore, content: str, *, item_id: str = "", location: str = "project", create: bool = True
) -> dict[str, Any]:
    """Validate ``content`` (a whole directive file) and write it; create refuses to overwrite, update needs one.

    What an agent writes is never signed: a signature line it sends is dropped. A signature proves who
    wrote a content, not that it is the current one, so an older signed version (from git's history, from
    the registry) written back restored the grants a human had since removed."""
    signature, unsigned = split_signature(content)
    directive, warnings = parse_directive(content, f"{item_id or 'new'}.md")
    if item_id and directive.name != item_id:
        raise InputInvalid(
            f"the content defines directive '{directive.name}', not '{item_id}'",
            hint="make <directive name> match item_id",
        )
    current = _existing(store, "directive", directive.name, location)
    if create and current is not None:
        raise InputInvalid(
            f"directive '{directive.name}' already exists at {current}", hint="use action 'update'"
        )
    if create:
        _refuse_shadowing(store, "directive", directive.name, location)
    if not create and current is None:
        raise ItemNotFound(
            f"no directive '{directive.name}' in the {location} space", hint="use action 'create'"
        )
    path = current or _inside(
        _space(store, location) / "directives",
        directive.metadata.category,
        f"{directive.name}.md",
        what="category",
    )
    before = current.read_text(encoding="utf-8") if current is not None else None
    if before == content:
        signature = None  # (the same file: nothing is written, a signature it has stays)
    else:
        if before is not None and split_signature(before)[0] is not None:
            # A signed directive the agent rewrites stays a human's: the agent cannot delete it next (its id
            # free for the registry's version, with grants the human had removed: second s18 review).
            _remember_signed(store, location, directive.name)
        _atomic_write(path, unsigned if signature is not None else content)
    saved = {
        "item_id": directive.name,
        "path": str(path),
        "status": "created" if create else "updated",
        "warnings": [str(w) for w in warnings],
    }
    if signature is not None:
        saved["signature"] = (
            "dropped: a directive an agent writes is unsigned and runs with the base policy only, until a "
            f"human reads it and signs it (kiwi sign {path})"
        )
    elif before is not None and before != content and split_signature(before)[0] is not None:
        # (README trial s39: rewriting a signed directive unsigned it, and the answer's warnings said nothing.)
        saved["warnings"].append(
            "the directive was signed, and what an agent writes is not: its runs now get only what its grants share "
            f"with the base policy, until a human reads it and signs it (kiwi sign {path})"
        )
    return saved


def _signed_list(store: ItemStore, location: str) -> Path:
    """Where a space keeps the ids of directives that were signed when an agent rewrote them."""
    return _space(store, location) / ".cache" / "signed-directives.json"


def _signed_before(store: ItemStore, location: str) -> set[str]:
    try:
        return set(json.loads(_signed_list(store, location).read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError):
        return set()


def _remember_signed(store: ItemStore, location: str, item_id: str) -> None:
    known = _signed_before(store, location)
    if item_id not in known:
        path = _signed_list(store, location)
        path.parent.mkdir(parents=True, exist_ok=True)
        _atomic_write(path, json.dumps(sorted(known | {item_id})))


def delete_item(
    store: ItemStore, item_type: str, item_id: str, *, location: str = "project", confirm: bool = False
) -> dict[str, Any]:
    if item_type not in ("directive", "knowledge"):
        # A tool is code in a protected place (.ai/tools): only a human removes it.
        raise InputInvalid(
            f"{item_type}s cannot be deleted through Kiwi",
            hint=f"a human removes the {item_type}'s folder by hand",
        )
    if not confirm:
        raise InputInvalid(
            f"deleting {item_type} '{item_id}' needs confirm=true", hint="pass parameters.confirm=true"
        )
    path = _existing(store, item_type, item_id, location)
    if path is None:
        raise ItemNotFound(f"no {item_type} '{item_id}' in the {location} space")
    if item_type == "directive" and (
        split_signature(path.read_text(encoding="utf-8"))[0] is not None
        or item_id in _signed_before(store, location)
    ):
        # A signed directive is a human's decision; gone, its id was free for another version of it (an
        # older one from the registry) with the grants the human had removed.
        raise PermissionDenied(
            f"directive '{item_id}' is signed: only a human deletes it",
            hint=f"ask the user to remove {path} if it should go",
        )
    path.unlink()
    return {"item_id": item_id, "path": str(path), "status": "deleted"}


def save_knowledge(
    store: ItemStore, item_id: str, fields: dict[str, Any], *, location: str = "project", create: bool = True
) -> dict[str, Any]:
    current = _existing(store, "knowledge", item_id, location)
    if create and current is not None:
        raise InputInvalid(f"knowledge '{item_id}' already exists at {current}", hint="use action 'update'")
    if create:
        _refuse_shadowing(store, "knowledge", item_id, location)
    if not create and current is None:
        raise ItemNotFound(f"no knowledge '{item_id}' in the {location} space", hint="use action 'create'")
    base = (
        parse_knowledge(current.read_text(encoding="utf-8"), str(current))[0].model_dump() if current else {}
    )
    merged = {**base, **{k: v for k, v in fields.items() if k != "content"}, "zettel_id": item_id}
    if "content" in fields:
        merged["body"] = fields["content"]
    merged.setdefault("title", "")
    if not merged["title"]:
        raise InputInvalid("knowledge needs a title", hint="parameters={'title': ..., 'content': ...}")
    try:
        entry = KnowledgeEntry(**{k: v for k, v in merged.items() if k in KnowledgeEntry.model_fields})
    except ValidationError as exc:
        raise InputInvalid(
            f"knowledge '{item_id}': " + "; ".join(_field_problem(e) for e in exc.errors()),
            hint="parameters={'title': TEXT, 'content': TEXT, 'entry_type': TEXT, 'category': TEXT, "
            "'tags': [TEXT, ...]}",
        ) from None
    for field, value in (
        ("title", entry.title),
        ("entry_type", entry.entry_type),
        ("category", entry.category),
        *(("tags", tag) for tag in entry.tags),
        ("content", entry.body),
    ):
        # (A NUL was written into the file as it came, review s33; a directive's file refuses it.)
        if (bad := CONTROL_CHARACTERS.search(value)) is not None:
            raise InputInvalid(
                f"knowledge '{item_id}': '{field}' holds a control character (U+{ord(bad.group()):04X})",
                hint=f"send '{field}' as text without control characters",
            )
    text = render_knowledge(entry)
    parse_knowledge(text, f"{item_id}.md")  # what is written must load again
    path = current or _inside(
        _space(store, location) / "knowledge", entry.category, f"{item_id}.md", what="category or id"
    )
    _atomic_write(path, text)
    return {"item_id": item_id, "path": str(path), "status": "created" if create else "updated"}


def _field_problem(error: Any) -> str:
    """One of pydantic's errors as a field's problem: 'tags' must be a valid list, got the text 'a,b'."""
    where = ".".join("content" if p == "body" else str(p) for p in error["loc"]) or "the entry"
    wanted = str(error["msg"]).replace("Input should be", "must be")
    return f"'{where}' {wanted}, got {json_kind(error.get('input'))}"


def link_knowledge(
    store: ItemStore, item_id: str, to: str, relation: str = "references", location: str = "project"
) -> dict[str, Any]:
    if relation not in LINK_KEYS:
        raise InputInvalid(f"relation '{relation}' is unknown", hint=f"use one of: {', '.join(LINK_KEYS)}")
    store.find("knowledge", to)
    path = _existing(store, "knowledge", item_id, location)
    if path is None:
        raise ItemNotFound(f"no knowledge '{item_id}' in the {location} space")
    entry, _ = parse_knowledge(path.read_text(encoding="utf-8"), str(path))
    links = entry.links.get(relation, [])
    if to not in links:
        entry.links[relation] = [*links, to]
        _atomic_write(path, render_knowledge(entry))
    return {"item_id": item_id, "links": entry.links, "status": "linked"}


def copy_to_project(store: ItemStore, item_type: str, item_id: str) -> dict[str, Any]:
    """Copy an item from the user space into the project space (same relative path); never beside a project
    item of the same id (a second file of one id, in another category, would win by its path)."""
    here = _existing(store, item_type, item_id, "project")
    if here is not None:
        raise InputInvalid(
            f"{item_type} '{item_id}' is already in the project at {here}",
            hint="load it from the project (source='project'); the user space's copy stays where it is",
        )
    record = store.find(item_type, item_id, source="user")  # type: ignore[arg-type]
    source = Path(record.path)
    user_base = store.spaces["user"]
    if item_type == "tool":
        # A tool is code, and .ai/tools a protected place a human writes (hostile review s38: the agent's load
        # copied a user tool there, its .env with it, and the copy shadowed the human's later fixes for good).
        raise InputInvalid(
            f"tool '{item_id}' is not copied into the project: a tool is code, and only a human puts it in "
            ".ai/tools (its runs call it from the user space as it is)",
            hint=f"a human copies it if the project must keep its own: cp -r {source.parent} "
            f"{store.spaces['project'] / source.parent.relative_to(user_base)}",
        )
    else:
        target = store.spaces["project"] / source.relative_to(user_base)
        if target.exists():
            raise InputInvalid(
                f"{target} already exists in the project", hint="delete it first or edit it there"
            )
        target.parent.mkdir(parents=True, exist_ok=True)
        signature, unsigned = split_signature(source.read_text(encoding="utf-8"))
        if item_type == "directive" and signature is not None:
            # What an agent writes is never signed (see save_directive). Second review s35: a signed copy
            # outlived the human's narrowed and re-signed user-space version, whose grants it kept.
            _atomic_write(target, unsigned)
            return {
                "item_id": item_id,
                "path": str(target),
                "status": "copied",
                "signed": False,
                "note": "copied without its signature: its runs get the base policy until a human signs the "
                "project's copy (kiwi sign)",
            }
        shutil.copy2(source, target)
    return {"item_id": item_id, "path": str(target), "status": "copied"}


def migrate_script(store: ItemStore, script: Path) -> Path:
    """Turn a legacy ``.ai/scripts/**/NAME.py`` into a tool: ``.ai/tools/CATEGORY/NAME/tool.yaml`` beside
    the script, moved there unchanged. Returns the manifest's path.

    The manifest is what Kiwi already derives from the script (docstring, ``main()`` signature,
    ``__version__``), so the tool is called the same way afterwards; it is validated before anything
    is written, and nothing is overwritten.
    """
    import yaml

    from kiwi.items.tools import legacy_script_manifest, parse_manifest

    script = script.resolve()
    scripts = store.project_root / ".ai" / "scripts"
    if not script.exists():
        # (README trial s39: a misspelt path was called "not a legacy script".)
        raise ItemNotFound(f"{script} does not exist", hint="ls .ai/scripts/ shows the legacy scripts")
    if script.suffix != ".py" or not script.is_file() or scripts.resolve() not in script.parents:
        raise InputInvalid(
            f"{script.name} is not a legacy script: migrate takes a .py file under .ai/scripts/",
            hint="e.g. kiwi migrate .ai/scripts/scraping/maps.py",
        )
    legacy = legacy_script_manifest(script)
    category = legacy.category
    folder = _inside(store.project_root / ".ai" / "tools", *category.split("/"), legacy.tool_id, what="tool")
    if folder.exists():
        raise InputInvalid(
            f"{folder.relative_to(store.project_root)} already exists; migrate writes a new tool folder only",
            hint="move or remove it first",
        )
    parameters = []
    for p in legacy.parameters:
        entry: dict[str, Any] = {"name": p.name, "type": p.type, "required": p.required}
        if p.default is not None:
            entry["default"] = p.default
        parameters.append(entry)
    manifest = {
        "tool_id": legacy.tool_id,
        "tool_type": "python",
        "version": legacy.version,
        "category": category,
        "description": legacy.description,
        "executor": {"type": "python", "entrypoint": script.name},
        "parameters": parameters,
        "metadata": {"migrated_from": script.relative_to(store.project_root).as_posix()},
    }
    text = yaml.safe_dump(manifest, sort_keys=False, allow_unicode=True)
    parse_manifest(text, str(folder / "tool.yaml"))  # raises ItemInvalid before anything is written
    folder.mkdir(parents=True)
    shutil.move(str(script), folder / script.name)
    _atomic_write(folder / "tool.yaml", text)
    store.refresh()
    return folder / "tool.yaml"
