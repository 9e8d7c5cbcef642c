"""Between the registry and a project: an item on disk as a bundle to publish, and a pulled bundle
written into the project or user space (never over a local item silently, a tool's files all at once)."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from kiwi.errors import InputInvalid, ItemInvalid, KiwiError
from kiwi.items.directive import Directive
from kiwi.items.knowledge import KnowledgeEntry
from kiwi.items.store import ItemStore, parse_item
from kiwi.items.tools import ToolManifest, foreign_tool_file
from kiwi.items.validation import item_type_of
from kiwi.registry import Bundle, RegistryConflict, RegistryRefused, bundle_message, parse_version
from kiwi.signing import verify

SKIPPED = {"__pycache__", ".git", ".venv", "node_modules"}


def bundle_from_path(path: Path, version: str | None = None) -> Bundle:
    """The item at ``path`` (a directive or knowledge file, a tool's folder or its tool.yaml), validated
    and signed: the registry takes only valid items whose signature verifies."""
    path = path.resolve()
    if path.is_dir():
        path = path / "tool.yaml"
    if not path.is_file():
        raise InputInvalid(
            f"no item at {path}", hint="give a directive or knowledge file, or a tool's folder"
        )
    kind = item_type_of(path)
    if kind not in ("directive", "tool", "knowledge"):
        raise InputInvalid(
            f"{path} is not under .ai/directives, .ai/tools or .ai/knowledge",
            hint="publish an item from a Kiwi project",
        )
    text = path.read_text(encoding="utf-8")
    parsed, problems = parse_item(kind, path, text)  # type: ignore[arg-type]
    if parsed is None or any(p.severity == "error" for p in problems):
        raise ItemInvalid(problems)
    status = verify(text)
    if status.state != "valid" or not status.signer or not status.signature:
        raise InputInvalid(
            f"{path.name} is {status.describe()}; the registry takes only items signed with your key",
            hint=f"sign it: `kiwi sign {path}`",
        )
    files: dict[str, str] = {}
    if isinstance(parsed, Directive):
        item_id, item_version = parsed.name, parsed.version
        description, category, tags = (
            parsed.metadata.description,
            parsed.metadata.category,
            parsed.metadata.tags,
        )
    elif isinstance(parsed, ToolManifest):
        item_id, item_version = parsed.tool_id, parsed.version
        description, category, tags = parsed.description, parsed.category, parsed.tags
        files = _tool_files(path.parent)
    else:
        assert isinstance(parsed, KnowledgeEntry)
        item_id, item_version = parsed.zettel_id, str(parsed.extra.get("version", ""))
        description, category, tags = parsed.title, parsed.category, parsed.tags
    if version and item_version and version != item_version and kind != "knowledge":
        raise InputInvalid(
            f"{kind} '{item_id}' is signed as version {item_version}, not {version}",
            hint="change the version inside the item and sign it again (a version is what was signed)",
        )
    item_version = version or item_version
    if not item_version:
        raise InputInvalid(
            f"{kind} '{item_id}' has no version", hint="add `version: 1.0.0` to it, or pass --version"
        )
    parse_version(item_version)
    return Bundle(kind, item_id, item_version, text, files, description, category, list(tags))


def _tool_files(folder: Path) -> dict[str, str]:
    files: dict[str, str] = {}
    for root, dirs, names in os.walk(folder, followlinks=False):
        dirs[:] = sorted(
            d
            for d in dirs
            if d not in SKIPPED and not d.startswith(".") and not (Path(root) / d).is_symlink()
        )
        for name in sorted(names):
            if name.startswith("."):
                continue  # .env and friends stay home
            file = Path(root) / name
            rel = file.relative_to(folder).as_posix()
            if rel == "tool.yaml" or name.endswith((".pyc", ".pyo")):
                continue
            if file.is_symlink():
                raise InputInvalid(f"{file} is a symlink", hint="a published tool holds only regular files")
            try:
                files[rel] = file.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                raise InputInvalid(
                    f"{file} is not UTF-8 text", hint="the registry stores a tool's text files only"
                ) from None
    return files


def publish_item(registry: Any, path: Path, *, version: str | None, key: str | None) -> dict[str, Any]:
    """Publish the item at ``path``: valid, signed by the publishing key itself (an item someone else
    signed, or one pulled from the registry, is not yours to publish), the version signed with that key."""
    from kiwi.keys import check_name, load_private, own_keys, public_key_text
    from kiwi.registry import registry_url
    from kiwi.signing import check_trust

    bundle = bundle_from_path(path, version)
    signed_by = verify(bundle.main).signer
    signer = check_name(key) if key else signed_by
    mine = own_keys()
    if key and signer not in mine:
        # (s18 trial: `--key nobody` was reported as the file's signer not being one of your keys.)
        raise InputInvalid(
            f"you have no key '{signer}'",
            hint=f"your keys: {', '.join(sorted(mine)) or 'none'} (`kiwi keys list`); `kiwi keys init` makes one",
        )
    if signer not in mine:
        raise InputInvalid(
            f"{path.name} is signed by '{signed_by}', which is not one of your keys",
            hint=f"read it, then sign it yourself: `kiwi sign {path}`",
        )
    public = public_key_text(load_private(signer))
    status = check_trust(verify(bundle.main), {signer: public}, bundle.kind)
    if not status.trusted:
        raise InputInvalid(
            f"{path.name} is signed by '{status.signer}', not by your key '{signer}'",
            hint=f"sign it yourself: `kiwi sign {path} --key {signer}` (after reading it)",
        )
    if not registry_url() and not registry.status()["namespace"]:
        # The local registry is the user's own: its first publish registers the user's key.
        registry.add_publisher(namespace_for(signer), "postgres", signer, public)
    return registry.publish(bundle, signer=signer, bundle_signature=sign_bundle(bundle, signer))


def namespace_for(key_name: str) -> str:
    """The local registry's namespace for a key name: namespaces are ``[a-z0-9][a-z0-9_-]*`` (at most 64),
    key names may also hold capitals and dots (``Ada.Lovelace`` -> ``ada-lovelace``)."""
    name = re.sub(r"[^a-z0-9_-]", "-", key_name.lower()).lstrip("_-")[:64]
    return name or "publisher"


def sign_bundle(bundle: Bundle, signer: str) -> str:
    from kiwi.keys import sign_bytes

    return sign_bytes(signer, bundle_message(bundle.digest(), signer))


def target_of(store: ItemStore, bundle: Bundle, location: str) -> Path:
    from kiwi.items.authoring import _inside

    if location not in store.spaces:
        raise InputInvalid(f"location '{location}' is unknown", hint=f"use one of: {', '.join(store.spaces)}")
    space = store.spaces[location]
    if bundle.kind == "directive":
        return _inside(space / "directives", bundle.category, f"{bundle.item_id}.md", what="directive")
    if bundle.kind == "knowledge":
        return _inside(space / "knowledge", bundle.category, f"{bundle.item_id}.md", what="knowledge entry")
    return _inside(space / "tools", bundle.category, bundle.item_id, what="tool")


def check_identity(bundle: Bundle) -> None:
    """The bundle's main file is the item the registry row says it is (a row written around Kiwi could
    put another item, or another version, under a trusted id)."""
    name = {"directive": "pulled.md", "tool": "tool.yaml", "knowledge": "pulled.md"}[bundle.kind]
    parsed, problems = parse_item(bundle.kind, Path(name), bundle.main)  # type: ignore[arg-type]
    if parsed is None:
        raise RegistryRefused(
            f"{bundle.kind} '{bundle.item_id}' {bundle.version} in the registry does not parse: "
            + "; ".join(str(p) for p in problems[:3]),
            hint="tell the registry's administrator",
        )
    if isinstance(parsed, Directive):
        found = (parsed.name, parsed.version)
        category = parsed.metadata.category
    elif isinstance(parsed, ToolManifest):
        found = (parsed.tool_id, parsed.version)
        category = parsed.category
    else:
        found = (parsed.zettel_id, bundle.version)
        category = parsed.category
    # Where it lands comes from the signed file, never from the row.
    bundle.category = category
    if bundle.kind == "tool":
        for rel in bundle.files:
            if (why := foreign_tool_file(rel)) is not None:
                raise RegistryRefused(
                    f"tool '{bundle.item_id}' {bundle.version} carries the file {rel}, which a tool may not "
                    f"({why}): refused",
                    hint="tell the registry's administrator",
                )
    if found != (bundle.item_id, bundle.version):
        raise RegistryRefused(
            f"the registry's {bundle.kind} '{bundle.item_id}' {bundle.version} holds "
            f"'{found[0]}' {found[1]}: refused",
            hint="the row does not match its content; tell the registry's administrator",
        )


def write_pulled(
    store: ItemStore,
    bundle: Bundle,
    *,
    location: str = "project",
    replace: bool = False,
    provenance: dict[str, str] | None = None,
) -> Path:
    """Write a checked bundle; an item of the same id already there is replaced only with ``replace``."""
    check_identity(bundle)
    target = target_of(store, bundle, location)
    path = _write(store, bundle, target, location, replace)
    if provenance:
        from kiwi.registry.lock import record

        record(store.spaces[location], bundle.kind, bundle.item_id, bundle.main, provenance)
    return path


def _write(store: ItemStore, bundle: Bundle, target: Path, location: str, replace: bool) -> Path:
    elsewhere = _existing_anywhere(store, bundle, location)
    existing = _existing_path(store, bundle, location)
    if elsewhere and not replace:
        where = "; ".join(f"{source} space at {path}" for source, path in elsewhere)
        raise RegistryConflict(
            f"{bundle.kind} '{bundle.item_id}' is already in the {where}",
            hint="pass --replace to take the registry's version (the copy in this space is not kept; a copy "
            "in your user space would be shadowed by the project's)"
            if location != "user"
            else "pass --replace to pull it into your user space all the same (a copy there is not kept; this "
            "project's copy stays, and shadows it here)",
        )
    if bundle.kind == "tool":
        tools = store.spaces[location] / "tools"
        relative = target.relative_to(tools).parts
        if "lib" in relative or any(part.startswith(".") for part in relative):
            raise RegistryRefused(
                f"a tool cannot be pulled into {target}: lib/ folders hold the code local tools import",
                hint="the tool's category or id names a lib folder; tell its publisher",
            )
        # Never inside another tool, never over a folder that is not this very tool.
        for parent in target.parents:
            if parent == tools:
                break
            if (parent / "tool.yaml").exists():
                raise RegistryRefused(f"a tool cannot be pulled into another tool's folder ({parent})")
        own = existing is not None and existing.parent == target
        if target.exists() and not own:
            raise RegistryConflict(
                f"{target} exists and is not tool '{bundle.item_id}': nothing was written",
                hint="move that folder, or ask the publisher for another category",
            )
    elif target.exists() and existing != target:
        raise RegistryConflict(
            f"{target} exists and is not {bundle.kind} '{bundle.item_id}': nothing was written"
        )
    if existing is not None and existing != (target / "tool.yaml" if bundle.kind == "tool" else target):
        _remove(existing if bundle.kind != "tool" else existing.parent)
    if bundle.kind != "tool":
        from kiwi.items.authoring import _atomic_write

        _atomic_write(target, bundle.main)
        return target
    # A tool's files land together: written into a new folder beside the target, then swapped in.
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{bundle.item_id}-"))
    try:
        for rel, text in {"tool.yaml": bundle.main, **bundle.files}.items():
            from kiwi.items.authoring import _inside

            file = _inside(staging, rel, what="tool file")
            file.parent.mkdir(parents=True, exist_ok=True)
            file.write_text(text, encoding="utf-8")
        old = None
        dropped = _carry_local_files(target, staging, bundle) if target.exists() else []
        if target.exists():
            old = target.parent / f".{bundle.item_id}-old-{os.getpid()}"
            os.replace(target, old)
        os.replace(staging, target)
        if old is not None and dropped:
            # Files of the local tool the published one does not have (the user's notes, a helper): kept
            # beside it, never deleted unseen.
            kept = target.parent / f".{bundle.item_id}-replaced-{time.strftime('%Y%m%d-%H%M%S')}"
            os.replace(old, kept)
            bundle.kept = str(kept)
        elif old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return target / "tool.yaml"


def _carry_local_files(target: Path, staging: Path, bundle: Bundle) -> list[str]:
    """Copy the replaced tool's hidden files (``.env`` and the like: never published, the user's own) into
    the new folder; the other files the bundle does not have, by relative path (kept by the caller)."""
    dropped = []
    published = {"tool.yaml", *bundle.files}
    for path in sorted(target.rglob("*")):
        if not path.is_file() or path.is_symlink():
            continue
        rel = path.relative_to(target).as_posix()
        if rel in published or "__pycache__" in rel.split("/"):
            continue
        if any(part.startswith(".") for part in rel.split("/")):
            copy = staging / rel
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, copy)
        else:
            dropped.append(rel)
    return dropped


def _existing_anywhere(store: ItemStore, bundle: Bundle, location: str) -> list[tuple[str, Path]]:
    """The items of this id a pull would replace or shadow: never silently."""
    found = []
    # The target space, and the other space: under a project pull the user space's copy (the project's
    # copy would shadow it), under a pull --to user the project's (it shadows what is pulled: s18 trial).
    other = {"project": "user", "user": "project"}.get(location)
    for source in [location] + ([other] if other and other in store.spaces else []):
        path = _existing_path(store, bundle, source)
        if path is not None:
            found.append((source, path))
    return found


def _existing_path(store: ItemStore, bundle: Bundle, location: str) -> Path | None:
    from kiwi.errors import ItemNotFound

    try:
        return Path(store.find(bundle.kind, bundle.item_id, source=location).path)  # type: ignore[arg-type]
    except ItemNotFound:
        return None


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink()


def registry_results(
    store: ItemStore, searched: tuple[list[dict[str, Any]], str], *, required: bool, hint: str
) -> tuple[list[dict[str, Any]], str]:
    """A search's registry part (``search_registry``'s hits and why there are none): each hit marked
    newer or not than the local copy; an unavailable registry is an error only when it was asked for
    alone (``required``), else the reason travels beside the local results."""
    hits, unavailable = searched
    if required and unavailable:
        raise KiwiError(f"registry unavailable: {unavailable}", hint=hint)
    mark_newer(store, hits)
    return hits, unavailable


def mark_newer(store: ItemStore, hits: list[dict[str, Any]]) -> None:
    """Say on each registry hit whether a local item of that id exists, and whether it is older."""
    from kiwi.errors import ItemNotFound

    for hit in hits:
        try:
            item = store.load(hit["item_type"], hit["item_id"])
        except ItemNotFound:
            continue
        parsed = item.parsed
        local = getattr(parsed, "version", "") or (getattr(parsed, "extra", {}) or {}).get("version", "")
        hit["local_version"] = str(local)
        hit["newer"] = newer(hit["version"], str(local))


def newer(registry_version: str, local_version: str) -> bool:
    try:
        return parse_version(registry_version) > parse_version(local_version)
    except KiwiError:
        return False
