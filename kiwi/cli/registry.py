"""`kiwi publish`, `kiwi pull` and `kiwi registry ...`: the shared registry from the command line."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from kiwi.cli import CONFIG_FILES, project_option
from kiwi.errors import InputInvalid, KiwiError
from kiwi.items.store import item_kind
from kiwi.registry import KINDS

TYPE_HELP = "item type (script: the same as tool), when an id is published as several"

EXIT_OK = 0


def _print(data: Any, as_json: bool, text: str) -> None:
    print(json.dumps(data, indent=2, default=str) if as_json else text)


def cmd_publish(args: argparse.Namespace) -> int:
    from kiwi.registry.embedded import registry_for_command
    from kiwi.registry.local import publish_item

    path = Path(args.path)
    if path.name in CONFIG_FILES and path.parent.name == "config":
        # (README trial s39: agent_harness.yaml was refused as a manifest that needs tool_id.)
        raise InputInvalid(
            f"{path} is a settings file, not an item: there is nothing to publish",
            hint="publish a directive or knowledge file, or a tool's folder",
        )
    with registry_for_command() as registry:
        done = publish_item(registry, path, version=args.version, key=args.key)
    _print(
        done,
        args.json,
        f"published {done['item_type']} {done['item_id']} {done['version']} as {done['namespace']} "
        f"(sha256 {done['content_hash'][:16]}...)",
    )
    return EXIT_OK


def _split(ref: str) -> tuple[str, str | None]:
    item_id, _, version = ref.partition("@")
    if not item_id:
        raise InputInvalid(f"'{ref}' names no item", hint="write ID or ID@VERSION, e.g. deploy@1.2.0")
    return item_id, version or None


def cmd_pull(args: argparse.Namespace) -> int:
    from kiwi.items.store import ItemStore, find_project_root
    from kiwi.registry.embedded import registry_for_command
    from kiwi.registry.local import write_pulled
    from kiwi.registry.lock import lock_entry

    item_id, version = _split(args.ref)
    root = find_project_root()
    if args.to == "project" and not (root / ".ai").is_dir():
        # (It made a new .ai/ in whatever folder it ran from.)
        raise KiwiError(
            f"no Kiwi project at {root} (no .ai/ folder here or above)",
            hint="run it inside a project or pass --project PATH; `kiwi init` makes one; --to user pulls into "
            "your user space",
        )
    store = ItemStore(root)
    with registry_for_command() as registry:
        kind = registry.kind_of(item_id, args.type)
        bundle, provenance = registry.fetch(kind, item_id, version)
        source = registry.label()
        latest = registry.latest_versions(kind, [item_id]).get(item_id) if provenance["yanked"] else None
    path = write_pulled(
        store, bundle, location=args.to, replace=args.replace, provenance=lock_entry(source, provenance)
    )
    data = {"item_type": bundle.kind, "item_id": bundle.item_id, "path": str(path), **provenance}
    if bundle.kept:
        data["kept"] = bundle.kept
    if provenance["yanked"]:
        # (Asked for by version: pulled, as cargo and pip do, but not quietly.)
        sys.stderr.write(
            f"kiwi pull: warning: {bundle.item_id} {provenance['version']} is yanked (its publisher withdrew "
            "it); "
            + (
                f"the latest version not yanked is {latest}: kiwi pull {bundle.item_id}@{latest}"
                if latest
                else "no version of it is left that is not yanked"
            )
            + "\n"
        )
    _print(
        data,
        args.json,
        f"pulled {bundle.kind} {bundle.item_id} {provenance['version']} from {provenance['namespace']} "
        f"(signed by {provenance['signer']}, hash checked) into {path}"
        + (
            f"\nthe replaced tool's files the published one does not have are kept in {bundle.kept} "
            "(its hidden files, such as .env, were carried over)"
            if bundle.kept
            else ""
        ),
    )
    return EXIT_OK


def cmd_registry(args: argparse.Namespace) -> int:
    from kiwi.registry.embedded import registry_for_command

    with registry_for_command() as registry:
        if args.registry_command == "migrate":
            applied = registry.migrate()
            _print(
                {"applied": applied},
                args.json,
                f"applied {', '.join(applied)}" if applied else "the registry is up to date",
            )
        elif args.registry_command == "status":
            status = registry.status()
            _print(
                status,
                args.json,
                "\n".join(
                    [
                        f"registry: {status['url']} (PostgreSQL {status['server_version']})",
                        f"migrations: {status['migrations']}"
                        if isinstance(status["migrations"], str)
                        else f"migrations: {', '.join(status['migrations']) or 'none'}"
                        + (
                            f"; pending: {', '.join(status['pending_migrations'])}"
                            if status["pending_migrations"]
                            else ""
                        ),
                        f"versions: {', '.join(f'{k} {v}' for k, v in sorted(status['versions'].items())) or 'none'}",
                        f"you: role {status['role']}, namespace {status['namespace'] or '(not a publisher)'}",
                    ]
                ),
            )
        elif args.registry_command == "yank":
            item_id, version = _split(args.ref)
            if not version:
                raise InputInvalid("yank needs a version", hint=f"write {item_id}@VERSION")
            kind = registry.kind_of(item_id, args.type)
            registry.yank(kind, item_id, version)
            _print({"yanked": f"{item_id}@{version}"}, args.json, f"yanked {kind} {item_id} {version}")
        elif args.registry_command == "versions":
            kind = registry.kind_of(args.item_id, args.type)
            versions = registry.versions(kind, args.item_id)
            _print(
                {"item_type": kind, "item_id": args.item_id, "versions": versions},
                args.json,
                "\n".join(
                    f"{v['version']:<12} {v['published_at'][:10]}  {v['namespace']}/{v['signer']}  "
                    f"{v['size_bytes']:,} bytes  {v['downloads']} download(s)"
                    + ("  YANKED" if v["yanked"] else "")
                    for v in versions
                ),
            )
        elif args.registry_command == "add-publisher":
            from kiwi.keys import load_private, public_key_text

            public = args.public_key or public_key_text(load_private(args.key))
            registry.add_publisher(args.namespace, args.role, args.key, public)
            _print(
                {"namespace": args.namespace, "role": args.role, "key": args.key},
                args.json,
                f"{args.role} publishes as {args.namespace} (key {args.key})",
            )
    return EXIT_OK


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "publish",
        help="publish a signed item to the registry (KIWI_REGISTRY_URL, else the local one)",
        description="Validate the item, check its signature is yours, and store it as a new, immutable "
        "version: a directive or knowledge file, or a tool's folder with all its files. The version must "
        "be higher than the latest published.",
    )
    p.add_argument("path", help="a directive or knowledge file, or a tool's folder (or its tool.yaml)")
    p.add_argument(
        "--key",
        help="which of your keys signs the version (default: the key that signed the item, which must be yours)",
    )
    p.add_argument(
        "--version",
        help="the version to publish, for a knowledge entry without one (a directive or tool publishes as the "
        "version it was signed with)",
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_publish)

    p = sub.add_parser(
        "pull",
        help="copy an item from the registry into the project (hash and signature checked)",
        description="Fetch ID (the latest version not yanked) or ID@VERSION, check its files against the "
        "published hash and the publisher's signature, and write it into the project (or user) space. "
        "An item already there is replaced only with --replace.",
    )
    p.add_argument("ref", metavar="ID[@VERSION]", help="e.g. deploy or deploy@1.2.0")
    p.add_argument("--type", type=item_kind, choices=KINDS, help=TYPE_HELP)
    p.add_argument(
        "--to", choices=("project", "user"), default="project", help="where to write (default project)"
    )
    p.add_argument("--replace", action="store_true", help="overwrite a local item with the same id")
    p.add_argument("--json", action="store_true", help="print JSON")
    project_option(p)
    p.set_defaults(func=cmd_pull)

    p = sub.add_parser(
        "registry", help="the registry's database: migrate, status, versions, yank, add-publisher"
    )
    rsub = p.add_subparsers(dest="registry_command", metavar="ACTION", required=True)
    r = rsub.add_parser("migrate", help="apply Kiwi's SQL migrations to the registry database")
    r.add_argument("--json", action="store_true", help="print JSON")
    r = rsub.add_parser("status", help="where the registry is, its migrations, what it holds, who you are")
    r.add_argument("--json", action="store_true", help="print JSON")
    r = rsub.add_parser("yank", help="mark a version yanked (pulls skip it unless asked for by version)")
    r.add_argument("ref", metavar="ID@VERSION")
    r.add_argument("--type", type=item_kind, choices=KINDS, help=TYPE_HELP)
    r.add_argument("--json", action="store_true", help="print JSON")
    r = rsub.add_parser(
        "versions",
        help="every published version of an item, newest first: when, by whom, size, downloads, yanked",
    )
    r.add_argument("item_id", metavar="ID")
    r.add_argument("--type", type=item_kind, choices=KINDS, help=TYPE_HELP)
    r.add_argument("--json", action="store_true", help="print JSON")
    r = rsub.add_parser(
        "add-publisher", help="let a database role publish under a namespace (run by the database's owner)"
    )
    r.add_argument("namespace", help="lowercase letters, digits, '-' and '_'")
    r.add_argument("--role", required=True, help="the PostgreSQL role that publishes as this namespace")
    r.add_argument("--key", required=True, help="the publisher's key name (as it signs)")
    r.add_argument("--public-key", help="its public key (default: read your own key of that name)")
    r.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_registry)
