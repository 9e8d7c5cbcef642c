"""The ``kiwi`` command line."""

from __future__ import annotations

import argparse
import difflib
import json
import re
import shutil
import sys
from collections.abc import Callable, Mapping
from importlib import resources
from pathlib import Path
from typing import Any, NoReturn

from kiwi.cli import progress
from kiwi.cli.safeout import safe_output
from kiwi.errors import ItemInvalid, ItemNotFound, KiwiError, Problem
from kiwi.items.store import ITEM_ALIASES, ITEM_TYPES, ItemStore, find_project_root, item_kind
from kiwi.items.tools import ToolManifest
from kiwi.items.validation import approvals_line, run_approvals, shell_syntax, unknown_builtins, validate_file
from kiwi.signing import content_hash

EXIT_OK, EXIT_INVALID, EXIT_USAGE = 0, 1, 2


def _emit(data: Any, as_json: bool, text: Callable[[], None]) -> None:
    if as_json:
        print(json.dumps(data, indent=2, default=str))
    else:
        text()


_ITEM_FOLDERS = {"directives", "tools", "knowledge", "scripts"}


def _expand(paths: list[str], settings: bool = True) -> list[Path]:
    """The item files named: files as given; a folder's .md/.yaml files inside an item folder (directives,
    tools, knowledge, scripts), which the folder may be, hold, or sit in (``.ai/directives/drafts``); with
    ``settings``, the settings files (CONFIG_FILES) of an ``.ai`` or ``.ai/config`` folder given."""
    out: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            out += sorted(
                q
                for q in p.rglob("*")
                if q.is_file()
                and q.suffix in (".md", ".yaml", ".yml")
                and _ITEM_FOLDERS & ({*_inside_ai(p), *q.relative_to(p).parts[:-1]})
                and ".cache" not in q.parts
            )
        else:
            out.append(p)
        # (README trial s34: `kiwi validate .ai` passed an mcp_registry.yaml that stopped every run.)
        folder = (
            p / "config" if p.name == ".ai" else p if p.name == "config" and p.parent.name == ".ai" else None
        )
        if settings and folder:
            out += sorted(f for f in folder.glob("*.yaml") if f.name in CONFIG_FILES)
    return out


# Kiwi's settings files in .ai/config, which `kiwi validate` checks with the loaders runs use.
CONFIG_FILES = ("agent_harness.yaml", "mcp_registry.yaml", "trusted_keys.yaml")


def _inside_ai(folder: Path) -> tuple[str, ...]:
    """The folder's names below its project's ``.ai`` (its own name alone outside one): only those say
    what kind of items it holds, not a folder of the same name above the project."""
    parts = folder.resolve().parts
    if ".ai" not in parts:
        return parts[-1:]
    return parts[len(parts) - parts[::-1].index(".ai") :]


# ---------------------------------------------------------------- item commands


def cmd_init(args: argparse.Namespace) -> int:
    root = Path(args.path).resolve()
    source = resources.files("kiwi") / "scaffold" / ".ai"
    written: list[str] = []
    skipped: list[str] = []

    def copy(node: Any, dest: Path) -> None:
        for child in node.iterdir():
            target = dest / child.name
            if child.is_dir():
                copy(child, target)
            elif target.exists():
                skipped.append(str(target.relative_to(root)))
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(child.read_bytes())
                written.append(str(target.relative_to(root)))

    copy(source, root / ".ai")
    for folder in ("directives", "tools", "knowledge", "config", "logs"):
        (root / ".ai" / folder).mkdir(parents=True, exist_ok=True)
    # The example directive's grants take effect only when a trusted key signed it: sign what
    # init wrote with the user's key (made on first use), as the human who ran init.
    from kiwi.cli.keys import ensure_key
    from kiwi.signing import sign

    signer, made = ensure_key()
    signed = []
    for rel in written:
        if rel.startswith(".ai/directives/") and rel.endswith(".md"):
            target = root / rel
            target.write_text(
                sign(target.read_text(encoding="utf-8"), signer=signer, kind="directive"), encoding="utf-8"
            )
            signed.append(rel)
    _emit(
        {
            "root": str(root),
            "written": written,
            "kept": skipped,
            "signed_by": signer if signed else "",
            "key": made,
        },
        args.json,
        lambda: (
            made and print(f"kiwi init: {made}"),
            signed and print(f"kiwi init: signed {', '.join(signed)} with your key '{signer}'"),
            print(f"Kiwi project at {root}"),
            [print(f"  wrote {w}") for w in written],
            [print(f"  kept  {s} (already there)") for s in skipped],
            print(
                "Next: `kiwi validate .ai` and `kiwi search hello`; with `kiwi dev` running, "
                "`kiwi run hello_kiwi --input name=you`."
            ),
        ),
    )
    return EXIT_OK


def cmd_validate(args: argparse.Namespace) -> int:
    missing = [raw for raw in args.paths if not Path(raw).exists()]
    if missing:
        raise KiwiError(
            f"no such file or folder: {', '.join(missing)}",
            hint="give item files or folders that exist, e.g. `kiwi validate .ai`",
        )
    files = _expand(args.paths)
    if not files:
        print("kiwi validate: no item files found in " + ", ".join(args.paths), file=sys.stderr)
        return EXIT_INVALID
    store = ItemStore(find_project_root(files[0].resolve().parent))
    local = store.local_tools()
    results = [_validate_readable(f, local) for f in files]
    ok = all(r["valid"] for r in results)
    for r in results:
        problems = r.pop("_problems")
        if args.json:
            continue
        mark = "ok  " if r["valid"] else "FAIL"
        print(f"{mark} {r['path']} ({r['item_type']}{': ' + str(r['item_id']) if r.get('item_id') else ''})")
        for p in problems:
            print(f"     {p}")
        if r.get("signature"):
            print(f"     signature: {r['signature']}")
        if "grants" in r:
            print(f"     grants: {' '.join(r['grants']) or '(none)'}")
        if "approvals" in r:
            print(f"     {approvals_line(r['approvals'])}")
        for step in r.get("steps", []):
            if step.get("no_start"):
                print(f"     step {step['step']}: no run starts, as {_no_start(step)} (above)")
                continue
            if step.get("stops"):
                # (Whatever the error above is: README trial s39 read "refusing its call" of a step whose only fault
                # was its condition.)
                print(f"     step {step['step']}: the run stops there, at the error above")
                continue
            if step.get("stops_unsigned"):
                why = (
                    "it was changed after it was signed"
                    if str(r.get("signature", "")).startswith("modified")
                    else "it is not signed by a trusted key"
                )
                print(
                    f"     step {step['step']}: a run of the file as it is stops there: {why}, so its runs get "
                    f"only what its grants share with the base policy (`kiwi sign {r['path']}`)"
                )
                continue
            runs = "runs by itself" if step["mode"] == "auto" else "waits for the agent"
            gated = (
                f"; its {', '.join(step['approval'])} call waits for a human's approval first"
                if step.get("approval")
                else ""
            )
            print(f"     step {step['step']}: {runs} ({step['reason']}){gated}")
    if args.json:
        print(json.dumps({"valid": ok, "items": results}, indent=2))
    return EXIT_OK if ok else EXIT_INVALID


def _validate_settings(path: Path, local: Mapping[str, ToolManifest] | None = None) -> dict[str, Any]:
    """A settings file (CONFIG_FILES) read as a run reads it: its problems, or none (README trial s34: validate
    read agent_harness.yaml as a tool manifest and failed a valid one)."""
    from kiwi.harness import HarnessConfig, load_harness
    from kiwi.items.store import user_space
    from kiwi.items.validation import harness_tool_problems
    from kiwi.keys import load_trusted
    from kiwi.upstream.registry import McpRegistry, load_registry

    root = find_project_root(path.resolve().parent)
    load = {"agent_harness.yaml": load_harness, "trusted_keys.yaml": load_trusted}.get(
        path.name, load_registry
    )
    try:
        loaded = load(root, user_space())
        problems: list[Problem] = []
    except ItemInvalid as exc:
        problems = [p for p in exc.problems if p.severity == "error"] or [Problem(exc.message, str(path))]
    except KiwiError as exc:
        problems = [Problem(exc.message + (f" ({exc.hint})" if exc.hint else ""), str(path))]
    if not problems and isinstance(loaded, HarnessConfig):
        # A misspelt tool in approvals.tools switched approval off without a word (README trial s34).
        problems += harness_tool_problems(root, loaded, str(path), local)
    if path.name not in ("agent_harness.yaml", "trusted_keys.yaml"):  # (the registry)
        # (README trial s37: a command not on the PATH was found by `kiwi doctor` and the run only. Trial s38: with a
        # mistake elsewhere in the file, it was said only once that was mended: the file's own commands then.)
        servers = (
            [(name, config.type, config.command) for name, config in loaded.servers.items()]
            if not problems and isinstance(loaded, McpRegistry)
            else _written_servers(path)
        )
        problems += [
            Problem(
                f"mcps.{name}.command: '{command}' is not found on this PATH; the worker starts it from "
                "its own PATH: put its folder there, or write its full path (`kiwi doctor` starts each server)",
                str(path),
                severity="warning",
            )
            for name, kind, command in servers
            if kind == "stdio"
            and isinstance(command, str)
            and command
            and "$" not in command
            and ("/" not in command or command.startswith("/"))  # (a relative one: from its cwd)
            and shutil.which(command) is None
        ]
    return {
        "path": str(path),
        "item_type": "settings",
        "valid": not any(p.severity == "error" for p in problems),
        "problems": [p.as_dict() for p in problems],
        "_problems": problems,
    }


def _written_servers(path: Path) -> list[tuple[str, Any, Any]]:
    """A registry file's servers as written (name, type, command), read without checking them: [] when unreadable."""
    from kiwi import yamltext

    try:
        data = yamltext.read(path)
    except (KiwiError, OSError, ValueError):
        return []
    mcps = data.get("mcps") if isinstance(data, dict) else None
    if not isinstance(mcps, dict):
        return []
    return [
        (str(name), entry.get("type", "stdio"), entry.get("command"))
        for name, entry in mcps.items()
        if isinstance(entry, dict)
    ]


def _no_start(step: dict[str, Any]) -> str:
    """Why no run of a directive starts, said of the step that makes it so."""
    return "its command is shell syntax" if step.get("shell_syntax") else "it calls a tool that is none"


def _validate_readable(path: Path, local: Mapping[str, ToolManifest]) -> dict[str, Any]:
    """:func:`validate_file`, with a file that cannot be read (a folder, no permission) reported as invalid."""
    if path.name in CONFIG_FILES and path.parent.name == "config":
        return _validate_settings(path, local)
    try:
        return validate_file(path, local)
    except OSError as exc:
        problem = Problem(f"cannot read the file: {exc.strerror or exc}", str(path))
        return {
            "path": str(path),
            "item_type": "unknown",
            "valid": False,
            "problems": [problem.as_dict()],
            "_problems": [problem],
        }


def cmd_sign(args: argparse.Namespace) -> int:
    from kiwi.keys import default_key, load_private
    from kiwi.signing import sign

    first = Path(args.paths[0]).resolve() if args.paths else Path.cwd()
    signer = default_key(
        args.key, role="sign", project_root=find_project_root(first if first.is_dir() else first.parent)
    )
    load_private(signer)  # a missing or unreadable key is an error before any file is touched
    failed = False
    report: list[dict[str, Any]] = []
    # (A settings file is not an item: `kiwi sign .ai` failed on agent_harness.yaml, read as a tool.)
    files = _expand(args.paths, settings=False)
    if not files:
        raise KiwiError(
            "no item files found in " + ", ".join(args.paths),
            hint="give item files, or folders inside .ai/directives, .ai/tools or .ai/knowledge (`kiwi sign .ai`)",
        )
    local = ItemStore(find_project_root(files[0].resolve().parent)).local_tools()
    for path in files:
        if path.name in CONFIG_FILES and path.parent.name == "config":
            failed = True
            why = "a settings file, not an item: Kiwi reads it unsigned (`kiwi validate` checks it)"
            report.append({"path": str(path), "signed": False, "problems": [why]})
            print(f"not signed: {path}\n  {why}", file=sys.stderr)
            continue
        result = validate_file(path, local)
        problems = result.pop("_problems")
        if not result["valid"]:
            failed = True
            errors = [p for p in problems if p.severity == "error"]
            report.append({"path": str(path), "signed": False, "problems": [str(p) for p in errors]})
            print(f"not signed: {path}", file=sys.stderr)
            for p in errors:
                print(f"  {p}", file=sys.stderr)
            continue
        # Validate's warnings, but the one that re-signing answers (README trial s34: sign printed none).
        # (validate_file's warning of a file changed since it was signed is its signature's own description.)
        warnings = [p for p in problems if p.severity == "warning" and p.message != result.get("signature")]
        for p in warnings:
            print(f"kiwi sign: {p}", file=sys.stderr)
        text = path.read_text(encoding="utf-8")
        style = "hash" if path.suffix in (".yaml", ".yml", ".py") else "html"
        path.write_text(sign(text, signer=signer, kind=result["item_type"], comment=style), encoding="utf-8")
        trusted = validate_file(path).get("trusted") is True
        report.append({"path": str(path), "signed": True, "signer": signer, "trusted": trusted})
        if not args.json:
            print(f"signed {path} as {signer}")
            if "grants" in result:  # (what the signature gives its runs, as the file writes it)
                print(f"  grants: {' '.join(result['grants']) or '(none)'}")
            if "approvals" in result:
                print(f"  {approvals_line(result['approvals'])}")
        if not trusted:
            # README trial s34: a key trusted to approve only signed "fine", and the directive's runs got the base
            # policy; validate said "NOT by a trusted key" later.
            print(
                f"kiwi sign: warning: '{signer}' is not trusted to sign here (trusted_keys.yaml gives it no 'sign' "
                "role, or does not list it): this item's runs get the base policy, not its own grants; add 'sign' "
                "to its roles in trusted_keys.yaml (`kiwi keys list` shows where), or sign with another key (--key)",
                file=sys.stderr,
            )
    if args.json:
        print(json.dumps({"signed": not failed, "items": report}, indent=2))
    return EXIT_INVALID if failed else EXIT_OK


def _mcp_catalog(operation: Callable[[Any], Any]) -> Any:
    """Run one catalog operation against the configured MCP servers, then stop the servers it started.

    What the servers write on stderr is kept, not mixed into the answer (one server's banner among the
    tools: trial), and shown only for a server that failed: after a search, each unavailable server's lines
    on stderr (``server_stderr`` in JSON); with the error of a `show`."""
    import asyncio

    from kiwi.upstream.catalog import McpCatalog
    from kiwi.upstream.pool import divert_server_stderr

    catalog = McpCatalog(find_project_root())
    said: dict[str, list[str]] = {}

    async def go() -> Any:
        try:
            return await operation(catalog)
        finally:
            await catalog.pool.close()

    divert_server_stderr(lambda line: said.setdefault(catalog.current, []).append(line.rstrip("\n")))
    try:
        data = asyncio.run(go())
    except KiwiError as exc:
        tail = " | ".join(line.strip() for line in said.get(catalog.current, [])[-5:] if line.strip())
        if tail:
            exc.message = f"{exc.message}; its stderr ended: {tail[-600:]}"
        raise
    finally:
        divert_server_stderr(None)
    if isinstance(data, dict) and data.get("unavailable"):
        kept = {name: said[name][-20:] for name in data["unavailable"] if said.get(name)}
        if kept:
            data["server_stderr"] = kept
    return data


def cmd_migrate(args: argparse.Namespace) -> int:
    from kiwi.items.authoring import migrate_script

    store = ItemStore(find_project_root())
    done = []
    for raw in args.scripts:
        written = migrate_script(store, Path(raw))
        done.append({"script": raw, "tool": written.relative_to(store.project_root).as_posix()})
        if not args.json:
            print(f"kiwi migrate: {raw} -> {done[-1]['tool']} (the script moved beside it)")
    if args.json:
        print(json.dumps({"migrated": done}, indent=2))
    return EXIT_OK


def positive(text: str) -> int:
    """A count given on the command line (--limit): 1 or more."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is no count: give a whole number from 1 up")
    return value


def cmd_search(args: argparse.Namespace) -> int:
    args.query = " ".join(args.query)
    args.type = item_kind(args.type) if args.type else None
    if args.type == "mcp":
        if args.category or args.source != "all":
            raise KiwiError(
                "--category and --source do not apply to --type mcp",
                hint="MCP tools come from the servers in mcp_registry.yaml (project over user)",
            )
        data = _mcp_catalog(lambda catalog: catalog.search(args.query, args.limit))
        _emit(
            {"query": args.query, **data},
            args.json,
            lambda: (
                print(f"no MCP tools match '{args.query}'") if not data["results"] else None,
                [print(f"mcp  {r['item_id']:<40} {r['description'][:70]}") for r in data["results"]],
                [
                    print(f"unavailable: {name}: {why}", file=sys.stderr)
                    for name, why in data["unavailable"].items()
                ],
                [
                    print(f"  {name} stderr: {line}", file=sys.stderr)
                    for name, lines in data.get("server_stderr", {}).items()
                    for line in lines
                ],
            ),
        )
        return EXIT_OK
    store = ItemStore(find_project_root())
    results = (
        []
        if args.source == "registry"
        else store.search(
            args.query, item_type=args.type, category=args.category, source=args.source, limit=args.limit
        )
    )
    remote: list[dict[str, Any]] = []
    unavailable = ""
    if args.source in ("registry", "all"):
        from kiwi.registry.embedded import search_registry
        from kiwi.registry.local import registry_results

        required = args.source == "registry"
        remote, unavailable = registry_results(
            store,
            # (README trial s39: --category filtered the local results only.)
            search_registry(args.query, args.type, args.limit, required=required, category=args.category),
            required=required,
            hint="check KIWI_REGISTRY_URL (unset, the local registry is used); local items: --source all",
        )
    data: dict[str, Any] = {"query": args.query, "results": [r.as_dict() for r in results] + remote}
    if unavailable:
        data["registry_unavailable"] = unavailable
    _emit(
        data,
        args.json,
        lambda: (
            print(
                f"no items match '{args.query}'"
                # (README trial s39: from a folder that is no project, as `kiwi runs` says.)
                + (
                    f" ({store.project_root} is no Kiwi project (no .ai/ at or above it): only your user space's "
                    "items were searched; run this from your project's folder, or pass --project PATH)"
                    if not (store.project_root / ".ai").is_dir()
                    else ""
                )
            )
            if not results and not remote
            else None,
            [
                print(
                    f"{r.score:6.2f}  {r.item_type:<9} {r.item_id:<28} [{r.source}] {r.description[:70]}"
                    + (f"\n        {r.snippet}" if r.snippet else "")
                    + (f"\n        also: {'; '.join(r.shadows)}" if r.shadows else "")
                )
                for r in results
            ],
            [
                print(
                    f"{r['score']:6.2f}  {r['item_type']:<9} {r['item_id']:<28} [registry {r['version']}, "
                    f"{r['namespace']}] {r['description'][:60]}"
                    + (
                        f"\n        newer than your {r['local_version']}: kiwi pull {r['item_id']} --replace"
                        if r.get("newer")
                        else ""
                    )
                )
                for r in remote
            ],
            print(f"registry unavailable: {unavailable}", file=sys.stderr) if unavailable else None,
            # (README trial s34: a listing stopped at the default 10 without a word.)
            print(f"(the first {args.limit}; --limit N shows more)", file=sys.stderr)
            if len(results) >= args.limit
            else None,
        ),
    )
    return EXIT_OK


def _mcp_item_lines(data: dict[str, Any]) -> list[str]:
    """`kiwi show SERVER[.TOOL] --type mcp` as text: a tool's description and inputs, or a server's tools."""
    tool = data.get("tool")
    if tool is None:
        lines = [f"mcp server {data['server']}  [{data.get('transport', '')}]"]
        lines += [f"  {data['description']}"] if data.get("description") else []
        for each in data.get("tools", []):
            summary = (each.get("description") or "").strip().split("\n", 1)[0]
            lines.append(f"  tool {each['name']}" + (f": {summary}" if summary else ""))
        lines.append(
            f"(`kiwi show {data['server']}.TOOL --type mcp` shows a tool's inputs; --json, everything)"
        )
        return lines
    lines = [f"mcp tool {data['item_id']}  [server {data['server']}]"]
    lines += [f"  {line}" for line in (tool.get("description") or "").strip().splitlines()]
    schema = tool.get("inputSchema") or tool.get("input_schema") or {}
    required = set(schema.get("required") or [])
    for name, spec in (schema.get("properties") or {}).items():
        kind = spec.get("type", "any") if isinstance(spec, dict) else "any"
        kind = "|".join(kind) if isinstance(kind, list) else kind
        about = spec.get("description", "") if isinstance(spec, dict) else ""
        lines.append(f"  input {name} ({kind}{', required' if name in required else ''}) {about}".rstrip())
    return lines


def cmd_show(args: argparse.Namespace) -> int:
    from kiwi.items.directive import Directive

    if args.type == "mcp":
        data = _mcp_catalog(lambda catalog: catalog.load(args.id))
        _emit(data, args.json, lambda: print("\n".join(_mcp_item_lines(data))))
        return EXIT_OK
    store = ItemStore(find_project_root())
    types = [item_kind(args.type)] if args.type else list(ITEM_TYPES)
    last: KiwiError | None = None
    for item_type in types:
        try:
            item = store.load(item_type, args.id)  # type: ignore[arg-type]
        except KiwiError as exc:
            last = exc
            continue
        parsed = item.parsed
        problems = list(item.problems)
        plan = []
        if isinstance(parsed, Directive):
            local = frozenset(store.local_tools())
            plan = [p.model_dump() for p in parsed.plan(local)]
            # (A step calling a tool that is none: no run starts, which the plan's "agent" did not say. Review s36.)
            nothing = [p for _, p in unknown_builtins(parsed, item.record.path, local)]
            syntax = shell_syntax(parsed, item.record.path)
            for step in plan:
                marker = f'step "{step["step"]}"'
                step["shell_syntax"] = any(p.message.startswith(marker) for p in syntax)
                step["no_start"] = step["shell_syntax"] or any(p.message.startswith(marker) for p in nothing)
            problems += [*nothing, *syntax]
        data = {
            "item_type": item_type,
            **item.record.as_dict(),
            "parsed": parsed.model_dump() if parsed is not None else None,
            "problems": [p.as_dict() for p in problems],
            **({"steps_plan": plan} if isinstance(parsed, Directive) else {}),
        }
        if args.json:
            print(json.dumps(data, indent=2, default=str))
        else:
            print(f"{item_type} {item.record.item_id}  [{item.record.source}] {item.record.path}")
            if item.record.shadows:
                print(f"  also defined in: {'; '.join(item.record.shadows)}")
            for p in problems:
                print(f"  {p}")
            if isinstance(parsed, Directive):
                print(f"  version {parsed.version}: {parsed.metadata.description}")
                # (What a run's trust and a directive.run's approval name the file's content by.)
                print(f"  sha256 {content_hash(item.text)}")
                written = " ".join(entry.written() for entry in parsed.metadata.permissions)
                print(f"  grants: {written or '(none)'}")
                print(f"  {approvals_line(run_approvals(parsed, store.project_root))}")
                for spec in parsed.inputs:
                    # (README trial s38: an optional input's default was shown nowhere.)
                    given = (
                        ", required"
                        if spec.required
                        else f", default {json.dumps(spec.default)}"
                        if spec.default is not None
                        else ", optional"
                    )
                    print(f"  input {spec.name} ({spec.type}{given}) {spec.description}")
                for step in plan:
                    if step["no_start"]:
                        print(f"  step {step['step']}: no run starts, as {_no_start(step)} (above)")
                    else:
                        print(f"  step {step['step']}: {step['mode']} ({step['reason']})")
            else:
                print(item.text)
        return EXIT_OK
    assert last is not None
    if len(types) > 1 and isinstance(last, ItemNotFound):
        # (Each kind was looked for: the last one's "no knowledge" named one of them only.)
        similar = [f"{r.item_type} {r.item_id}" for r in store.search(args.id, limit=3, refresh=False)]
        raise ItemNotFound(
            f"no item named '{args.id}' (directive, tool or knowledge) in "
            f"{', '.join(str(p) for p in store.spaces.values())}",
            hint=f"did you mean: {', '.join(similar)}?"
            if similar
            else "run `kiwi search` to list items"
            if (store.project_root / ".ai").is_dir()
            else last.hint,  # (no project here: the store's hint says so, and how to make one)
        )
    raise last


# ---------------------------------------------------------------- entry point


class _UsageError(Exception):
    def __init__(self, parser: argparse.ArgumentParser, message: str) -> None:
        super().__init__(message)
        self.parser, self.message = parser, message


class _Parser(argparse.ArgumentParser):
    """argparse's parser, whose usage errors main() reports (as JSON with --json, as argparse does else)."""

    def error(self, message: str) -> NoReturn:
        raise _UsageError(self, message)


def _missing_action(parser: argparse.ArgumentParser, message: str) -> bool:
    """Whether ``message`` is argparse's word that ``parser``'s ACTION (its subcommand) was left out."""
    return any(
        isinstance(action, argparse._SubParsersAction) and (action.metavar or action.dest) in message
        for action in parser._actions
    ) and message.startswith("the following arguments are required")


def _subcommand_parser(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.ArgumentParser:
    """The parser of the (sub)command ``argv`` names (``kiwi registry status``'s), else ``parser``."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for word in argv:
                if word in action.choices:
                    rest = argv[argv.index(word) + 1 :]
                    return _subcommand_parser(action.choices[word], rest)
    return parser


def _usage_meant(
    parser: argparse.ArgumentParser, exc: _UsageError, argv: list[str]
) -> tuple[argparse.ArgumentParser, str]:
    """The parser a usage mistake belongs to and its message, with the name meant when one is close (README
    trial s37: `kiwi run ... --wiat` printed kiwi's own usage, and `kiwi audti` listed every command, with no
    word of --wait or audit; Python 3.11's argparse suggests nothing)."""
    message = exc.message
    if found := re.match(r"unrecognized arguments: (.+)", message):
        # (Options a subcommand does not know come back to the top parser: the subcommand's usage says more.)
        command = _subcommand_parser(parser, argv)
        known = [o for a in command._actions for o in a.option_strings if o.startswith("--")]
        meant = [
            f"{word} (did you mean {near[0]}?)"
            if (near := difflib.get_close_matches(word, known, n=1))
            else word
            for word in found.group(1).split()
        ]
        return command, f"unrecognized arguments: {' '.join(meant)}"
    if found := re.search(r"invalid choice: '([^']*)' \(choose from (.+)\)$", message):
        choices = re.findall(r"'([^']*)'", found.group(2))
        if near := difflib.get_close_matches(found.group(1), choices, n=1):
            return exc.parser, f"{message}; did you mean '{near[0]}'?"
    return exc.parser, message


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="kiwi",
        description="Kiwi: durable directive workflows for AI agents, on Temporal, reached over MCP.",
    )
    parser.add_argument("--version", action="version", version=f"kiwi {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser(
        "init", help="scaffold .ai/ with an example directive, tool, knowledge entry and config"
    )
    p.add_argument("path", nargs="?", default=".", help="project folder (default: the current folder)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_init)

    p = sub.add_parser("validate", help="parse and check items; exit 1 on any error")
    p.add_argument("paths", nargs="+", metavar="PATH", help="item files or folders (e.g. .ai)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser(
        "sign",
        help="validate items and sign them with your key (so a directive's grants take effect)",
        description="Validate items, then write a first-line signature: timestamp, SHA-256 of the "
        "content, your key's name and its Ed25519 signature. Only a directive signed "
        "by a key in trusted_keys.yaml runs with its declared grants "
        "(agent_harness.yaml `signatures`).",
    )
    p.add_argument("paths", nargs="+", metavar="PATH", help="item files or folders")
    p.add_argument(
        "--key",
        help="which of your keys signs (default: your only key, or with several the one trusted_keys.yaml trusts to "
        "sign; see `kiwi keys list`)",
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_sign)

    from kiwi.cli import keys as cli_keys

    cli_keys.add_commands(sub)

    p = sub.add_parser(
        "search", help="relevance search over directives, tools and knowledge (or MCP server tools)"
    )
    p.add_argument(
        "query",
        nargs="*",
        help="words to look for, e.g. deploy database; none (or *) lists every item (of --type), by id",
    )
    p.add_argument(
        "--type",
        choices=(*ITEM_TYPES, *ITEM_ALIASES, "mcp"),
        help="only this item type (script: the same as tool); mcp searches the tools of the servers in mcp_registry.yaml "
        "(starting them)",
    )
    p.add_argument("--category", help="only this category (and its sub-categories)")
    p.add_argument(
        "--source",
        choices=("all", "project", "user", "registry"),
        default="all",
        help="which space (default all: project and user, plus the registry when KIWI_REGISTRY_URL is set "
        "or the local registry runs); registry: only the registry",
    )
    p.add_argument("--limit", type=positive, default=10, help="at most this many results (default 10)")
    p.add_argument("--json", action="store_true", help="print JSON")
    project_option(p)
    p.set_defaults(func=cmd_search)

    p = sub.add_parser("show", help="show one item by id (project space first)")
    p.add_argument("id", help="directive name, tool_id or zettel_id (with --type mcp: SERVER or SERVER.TOOL)")
    p.add_argument(
        "--type",
        choices=(*ITEM_TYPES, *ITEM_ALIASES, "mcp"),
        help="item type (script: the same as tool), when an id is used by several types; mcp shows an MCP server's tools or "
        "one tool's schema",
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    project_option(p)
    p.set_defaults(func=cmd_show)

    p = sub.add_parser(
        "migrate",
        help="turn legacy .ai/scripts/**/NAME.py tools into .ai/tools/CATEGORY/NAME/tool.yaml",
        description="Write a tool.yaml for each legacy script (from its docstring, main() signature and "
        "__version__) in .ai/tools/CATEGORY/NAME/ and move the script there; the tool keeps its id and "
        "parameters. Nothing is overwritten.",
    )
    p.add_argument(
        "scripts", nargs="+", metavar="SCRIPT", help="legacy scripts, e.g. .ai/scripts/text/shout.py"
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_migrate)

    from kiwi.cli import runs as cli_runs

    cli_runs.add_commands(sub)

    from kiwi.cli import doctor as cli_doctor

    cli_doctor.add_commands(sub)

    from kiwi.cli import registry as cli_registry

    cli_registry.add_commands(sub)

    from kiwi.cli import payloads as cli_payloads

    cli_payloads.add_commands(sub)

    p = sub.add_parser(
        "tools",
        help="tools an agent proposed: list them, accept one into .ai/tools",
        description="An agent's execute(tool, create|update) writes a proposal to .ai/proposals/tools/ID/; "
        "nothing runs it until you read it and accept it here.",
    )
    tsub = p.add_subparsers(dest="tools_command", metavar="ACTION", required=True)
    t = tsub.add_parser("proposals", help="list the proposed tools (and which tool each replaces)")
    project_option(t)
    t.add_argument("--json", action="store_true", help="print JSON")
    t = tsub.add_parser("accept", help="move a proposed tool into .ai/tools (replacing the tool it updates)")
    project_option(t)
    t.add_argument("id", help="the proposed tool's id")
    t.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_tools)
    return parser


def cmd_tools(args: argparse.Namespace) -> int:
    from kiwi.items.proposals import accept_tool, list_proposals

    store = ItemStore(find_project_root())
    if args.tools_command == "proposals":
        found = list_proposals(store)
        _emit(
            {"proposals": found},
            args.json,
            lambda: (
                [
                    print(
                        f"{p['tool_id']:<28} {p['path']}"
                        + (f"  (replaces {p['replaces']})" if p["replaces"] else "")
                    )
                    for p in found
                ]
                or print("no proposed tools")
            ),
        )
        return EXIT_OK
    done = accept_tool(store, args.id)
    _emit(done, args.json, lambda: print(f"accepted {done['tool_id']} into {done['path']}"))
    return EXIT_OK


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("kiwi-runtime")
    except PackageNotFoundError:
        return "unknown (not installed)"


def project_option(parser: argparse.ArgumentParser) -> None:
    """``--project PATH`` on a command (read by _choose_project)."""
    parser.add_argument(
        "--project",
        metavar="PATH",
        help="the project folder (default: KIWI_PROJECT, else the nearest folder above holding .ai/)",
    )


def _choose_project(args: argparse.Namespace) -> None:
    """``--project PATH`` (or ``KIWI_PROJECT``) names the project every part of this command serves."""
    import os

    raw = getattr(args, "project", None) or os.environ.get("KIWI_PROJECT")
    if not raw:
        return
    where = Path(raw).expanduser().resolve()
    if not where.is_dir():
        source = "--project" if getattr(args, "project", None) else "KIWI_PROJECT"
        raise KiwiError(
            f"{source} {raw}: no such folder",
            hint="give the project folder (the one holding .ai/; `kiwi init PATH` makes one)",
        )
    if (
        getattr(args, "project", None)
        and not (where / ".ai").is_dir()
        and args.command not in ("init", "doctor")
    ):
        # (README trial s34: a --project with no .ai/ was taken, and each command went on as if it were one.)
        raise KiwiError(
            f"--project {raw}: {where} is no Kiwi project (no .ai/ in it)",
            hint=f"give the folder holding .ai/, or make this one a project: `kiwi init {raw}`",
        )
    os.environ["KIWI_PROJECT"] = str(where)  # read by find_project_root, here and in what we start


def main(argv: list[str] | None = None) -> int:
    from kiwi.seal import guard

    guard()  # (a seal key in the environment: no other process of the user reads it from this one)
    with safe_output():  # (agent-written text cannot steer the terminal: kiwi/cli/safeout.py)
        return _main(argv)


def _main(argv: list[str] | None) -> int:
    args = argparse.Namespace()
    try:
        parser = build_parser()
        try:
            args = parser.parse_args(argv)
        except _UsageError as exc:
            exc.parser, exc.message = _usage_meant(parser, exc, sys.argv[1:] if argv is None else argv)
            if "--json" in (sys.argv[1:] if argv is None else argv):
                # (A script asking for JSON gets JSON for a mistake on the command line too.)
                hint = f"see `{exc.parser.prog} --help`"
                print(json.dumps({"error": "InputInvalid", "message": exc.message, "hint": hint}, indent=2))
                print(f"{exc.parser.prog}: error: {exc.message}", file=sys.stderr)
                return EXIT_INVALID
            if _missing_action(exc.parser, exc.message):
                # (`kiwi keys` alone said an ACTION is required and not which: review s36.)
                exc.parser.print_help(sys.stderr)
            else:
                exc.parser.print_usage(sys.stderr)
            print(f"{exc.parser.prog}: error: {exc.message}", file=sys.stderr)
            return EXIT_USAGE
        if not getattr(args, "func", None):
            parser.print_help()
            return EXIT_USAGE
        _choose_project(args)
        return int(args.func(args) or 0)
    except ItemInvalid as exc:
        for p in exc.problems:
            print(f"kiwi: {p}", file=sys.stderr)
        _json_error(args, exc, problems=[str(p) for p in exc.problems])
        return EXIT_INVALID
    except KiwiError as exc:
        print(f"kiwi: {exc.message}", file=sys.stderr)
        if exc.hint:
            print(f"hint: {exc.hint}", file=sys.stderr)
        _json_error(args, exc)
        return EXIT_INVALID
    except KeyboardInterrupt:
        watching = getattr(args, "watching", None)
        if watching:
            print(
                f"\nkiwi: stopped watching {watching}; the run goes on (see `kiwi status {watching}`, "
                f"stop it with `kiwi cancel {watching}`)",
                file=sys.stderr,
            )
        else:
            print("\nkiwi: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        progress.quiet_stdout()
        return 141
    except FileNotFoundError as exc:
        print(f"kiwi: no such file or folder: {exc.filename or exc}", file=sys.stderr)
        return EXIT_INVALID
    except RuntimeError as exc:
        if "TMPRL1105" not in str(exc):
            raise
        # (Temporal's converter, reading a run whose payloads are in the store, with the store off here.)
        error = KiwiError(
            "this run's payloads are in a payload store, and KIWI_PAYLOAD_STORE=off in this process",
            hint="set KIWI_PAYLOAD_STORE to the store's folder (every Kiwi process needs the same one; README: "
            "Large payloads)",
        )
        print(f"kiwi: {error.message}\nhint: {error.hint}", file=sys.stderr)
        _json_error(args, error)
        return EXIT_INVALID


def _json_error(args: argparse.Namespace, exc: KiwiError, **more: Any) -> None:
    """With --json, the error as JSON on standard output too (a script reading it gets JSON either way)."""
    if getattr(args, "json", False):
        shown = {"error": exc.type, "message": exc.message, "hint": exc.hint, **exc.details, **more}
        print(json.dumps(shown, indent=2))


def run() -> None:
    """Console-script entry: ``main()``, then exit without interpreter finalization.

    The Temporal SDK's native runtime threads can abort a finalizing interpreter
    ("PyGILState_Release ... finalizing"), turning a finished command into exit code -6.
    Everything is flushed first, so nothing the command printed or wrote is lost.
    """
    import os

    from kiwi import telemetry

    code = main()
    telemetry.shutdown()  # spans still buffered go out now: os._exit runs no atexit hooks
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        progress.quiet_stdout()
        code = code or 141
    sys.stderr.flush()
    os._exit(code)
