"""Validating one item file as `kiwi validate` and the MCP front end's `execute(..., validate)` report it."""

from __future__ import annotations

import difflib
import fnmatch
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path
from typing import Any

from kiwi.errors import ItemInvalid, KiwiError, Problem
from kiwi.harness import HarnessConfig
from kiwi.items.directive import Directive
from kiwi.items.files import read_item_bytes
from kiwi.items.store import find_project_root, parse_item, user_space
from kiwi.items.tools import ToolManifest
from kiwi.keys import load_trusted
from kiwi.policy import BUILTIN_NAMESPACES, BUILTIN_TOOLS, KIWI_MCP_TOOLS, Decision, parse_command
from kiwi.shellpolicy import modeled_program
from kiwi.signing import check_trust, verify
from kiwi.templating import PLACEHOLDER, placeholders
from kiwi.toolargs import (
    BUILTIN_SCHEMAS,
    ArgumentError,
    coerce_step_arguments,
    stray_argument,
    unfit_parameters,
)


def item_type_of(path: Path) -> str:
    """directive, tool or knowledge, from where the file is and what it starts with."""
    parts = set(path.resolve().parts)
    if path.suffix in (".yaml", ".yml") or "tools" in parts or "scripts" in parts:
        return "tool"
    if "knowledge" in parts:
        return "knowledge"
    if "directives" in parts:
        return "directive"
    head = read_item_bytes(path, head=16384).decode("utf-8", errors="replace")[:4096]
    if head.lstrip().startswith("---") and "zettel_id" in head:
        return "knowledge"
    return "directive"


def _program_granted(grants: Any, program: str, cwd: Any) -> Decision:
    """A templated command's program checked alone: the grant of the program, not what its words (unknown until
    the run fills them) read. (README trial s36: `ls -l {paths}` was refused for reading the cwd, which `ls` given
    its paths does not.) A program Kiwi does not model reads its cwd whatever its words: that refusal stands when
    the cwd is written out (README trial s39: `sleep {secs}` "runs by itself", and the run failed at once)."""
    templated_cwd = cwd is not None and "{" in str(cwd)
    decision = grants.check_shell(
        {"argv": [program], **({"cwd": cwd} if cwd and not templated_cwd else {})}, []
    )
    if not decision.allowed and "cwd" in decision.reason and (modeled_program(program) or templated_cwd):
        return Decision(allowed=True)
    return decision


def ungranted_calls(directive: Directive, path: str = "", grants: Any = None) -> list[Problem]:
    """Bound calls the directive's own <permissions> refuse (or ``grants``, what a run of it gets): the run's check
    (PermissionSet.check) on each.

    The run never grants more than the directive does, so a refusal here is a refusal in the run. A call
    whose arguments hold {templates} is checked as far as its literal part reaches (the tool, the program).
    """
    grants = directive.grants() if grants is None else grants
    problems: list[Problem] = []
    for step in directive.steps:
        for call in step.tool_calls:
            args = dict(call.params)
            templated = any("{" in str(v) for v in args.values())
            if templated and call.tool.startswith("filesystem."):
                mode = "read" if call.tool in ("filesystem.read", "filesystem.list") else "write"
                granted = grants.fs_read if mode == "read" else grants.fs_write
                decision = Decision(
                    allowed=bool(granted),
                    reason=f"{call.tool} needs a {mode} grant and <permissions> has none",
                    hint=f'add <{mode} resource="filesystem" path="..."/> to <permissions>',
                )
            elif templated and call.tool == "shell.run":
                command = str(args.get("command", args.get("argv", ""))).split()
                program = command[0] if command and "{" not in command[0] else ""
                decision = (
                    _program_granted(grants, program, args.get("cwd"))
                    if program
                    else Decision(
                        allowed=bool(grants.shell),
                        reason="shell.run needs a shell grant and <permissions> has none",
                        hint='add <execute resource="shell" commands="PROGRAM"/> to <permissions>',
                    )
                )
            else:
                decision = grants.check(call.tool, args)
            if not decision.allowed:
                hint = f"; {decision.hint}" if decision.hint else ""
                problems.append(
                    Problem(
                        f'step "{step.name}" calls {call.tool}, which the run would refuse: '
                        f"{decision.reason}{hint}",
                        path,
                        *call.place(),
                    )
                )
    return problems


def unknown_builtins(
    directive: Directive, path: str = "", local_tools: frozenset[str] | None = None
) -> list[tuple[str, Problem]]:
    """Step calls of a tool that is none, so that no run of the directive starts (``kiwi.snapshot`` refuses it): one
    in the namespace of Kiwi's own (``filesystem.wrte``, ``shell.runn``, ``Filesystem.Write``) that is none of them,
    nor a tool of a declared MCP server of that name, a misspelling (the step waited for the agent, though it was
    meant to run by itself: README trial s34, and the hint named an MCP grant); with ``local_tools`` (the
    project's), a local tool id (no server prefix) that is none of them, with the one meant if one is close
    (``word_cont``; the hint named a grant of it, which would not have helped: review s36)."""
    known = (*BUILTIN_TOOLS, *KIWI_MCP_TOOLS)
    spaces = {name.casefold() for name in (*BUILTIN_NAMESPACES, "kiwi-mcp")}
    servers = {name for mcp in directive.metadata.tools.mcps for name in (mcp.name, mcp.alias) if name}
    problems: list[tuple[str, Problem]] = []
    for step in directive.steps:
        for call in step.tool_calls:
            space = call.tool.partition(".")[0]
            if local_tools is not None and "." not in call.tool and call.tool not in local_tools:
                # (README trial s34, second round: `word_cont`, granted, validated and made the step an agent step.)
                near = difflib.get_close_matches(call.tool, sorted(local_tools), n=1, cutoff=0.8)
                problems.append(
                    (
                        call.tool,
                        Problem(
                            f'step "{step.name}" calls {call.tool}, which is no tool here: '
                            + (
                                f"did you mean {near[0]}?"
                                if near
                                else "no local tool has that id (.ai/tools/), and an MCP server's tool is named "
                                "SERVER.TOOL"
                            ),
                            path,
                            *call.place(),
                        ),
                    )
                )
                continue
            if call.tool in known or space.casefold() not in spaces or space in servers:
                continue
            close = difflib.get_close_matches(call.tool.casefold(), known, n=1, cutoff=0.6)
            problems.append(
                (
                    call.tool,
                    Problem(
                        f'step "{step.name}" calls {call.tool}, which is no tool of Kiwi\'s'
                        + (f": did you mean {close[0]}?" if close else f" (its tools: {', '.join(known)})"),
                        path,
                        *call.place(),
                    ),
                )
            )
    return problems


def unset_inputs(directive: Directive, path: str = "") -> list[Problem]:
    """Warnings for each optional input with no default that a step's parameter uses: a run started without it
    fails at that step (README trial s34: validate said ok, the run failed)."""
    optional = {i.name for i in directive.inputs if not i.required and i.default is None}
    problems: list[Problem] = []
    for step in directive.steps:
        for call in step.tool_calls:
            used = {ref.removeprefix("inputs.").split(".")[0] for ref in placeholders(call.params)}
            for name in sorted(used & optional):
                problems.append(
                    Problem(
                        f'step "{step.name}" uses {{{name}}}, an optional input with no default: a run started '
                        f'without it fails there; give it a default (<input name="{name}" ... default="...">) '
                        'or make it required="true"',
                        path,
                        *call.place(),
                        "warning",
                    )
                )
    return problems


def stray_params(directive: Directive, path: str = "") -> list[Problem]:
    """Step <param>s that Kiwi's built-in tool does not take: the run refuses the call (InputInvalid), and
    before it did, dropped them (a misspelt `contnet` wrote an empty file)."""
    problems: list[Problem] = []
    for step in directive.steps:
        for call in step.tool_calls:
            if call.tool not in BUILTIN_SCHEMAS or call.tool.startswith("kiwi-mcp."):
                continue
            stray = stray_argument(
                call.tool, list(BUILTIN_SCHEMAS[call.tool]["properties"]), dict(call.params)
            )
            if stray is not None:
                names = BUILTIN_SCHEMAS[call.tool]["properties"]
                first = next((k for k in call.params if k not in names), None)
                problems.append(
                    Problem(
                        f'step "{step.name}": {stray.reason.replace("argument", "<param>", 1)} ({stray.hint})',
                        path,
                        *call.place(first),
                    )
                )
    return problems


def shell_syntax(directive: Directive, path: str = "") -> list[Problem]:
    """A step's ``shell.run`` command with shell syntax the directive wrote (a placeholder's value is one word,
    never syntax): commands run without a shell, so no run starts (README trial s38: `grep -rn {marker} src | wc
    -l` validated and signed, and the run refused `'|'` as a file its grants do not let it read)."""
    problems: list[Problem] = []
    for step in directive.steps:
        for call in step.tool_calls:
            template = call.params.get("command")
            if call.tool != "shell.run" or not isinstance(template, str):
                continue
            refused = parse_command({"command": PLACEHOLDER.sub("x", template)})
            if isinstance(refused, Decision) and refused.reason.startswith("shell syntax"):
                problems.append(
                    Problem(
                        f'step "{step.name}": {refused.reason}; a step runs one program: split the pipeline into '
                        "steps (each step's output is `{steps.NAME.outputs...}` in the next), or write a local tool",
                        path,
                        *call.place("command"),
                    )
                )
    return problems


def local_params(directive: Directive, tools: Mapping[str, ToolManifest], path: str = "") -> list[Problem]:
    """Step <param>s a local tool does not take, the required ones a step leaves out, and a literal value that
    is not of its parameter's type: the run refuses the call at that step, after the steps before it ran
    (README trial s34: a stray `txt` for word_count validated)."""
    problems: list[Problem] = []
    for step in directive.steps:
        for call in step.tool_calls:
            tool = tools.get(call.tool)
            if tool is None or call.tool in BUILTIN_SCHEMAS:
                continue
            schema = tool.json_schema()
            unknown, missing = unfit_parameters(schema, dict(call.params))
            takes = ", ".join(sorted(schema.get("properties") or {}))
            meant: set[str] = set()
            for name in unknown:
                declared = list(schema.get("properties") or {})
                close = difflib.get_close_matches(name, declared, n=1, cutoff=0.6)
                meant.update(close)
                problems.append(
                    Problem(
                        f"step \"{step.name}\": {call.tool} has no parameter '{name}'; it takes {takes}"
                        + (f' (did you mean <param name="{close[0]}">?)' if close else ""),
                        path,
                        *call.place(name),
                    )
                )
            for name in (n for n in missing if n not in meant):  # (a misspelt one is named once, above)
                problems.append(
                    Problem(
                        f'step "{step.name}": {call.tool} requires <param name="{name}">, which the step leaves out',
                        path,
                        *call.place(),
                    )
                )
            literal = {n: v for n, v in call.params.items() if n not in unknown and not placeholders(v)}
            try:
                coerce_step_arguments(call.tool, literal, literal, schema)
            except ArgumentError as exc:
                problems.append(
                    Problem(f'step "{step.name}": {exc.reason} ({exc.hint})', path, *call.place())
                )
    return problems


def registered_servers(project_root: Path) -> set[str]:
    """The MCP servers the registry files name (none when they cannot be read: their own check says why)."""
    from kiwi.upstream.registry import load_registry

    try:
        registry = load_registry(project_root, user_space())
    except KiwiError:
        return set()
    return {*registry.servers, *registry.skipped}


def _base_policy_refusals(
    directive: Directive, path: Path, text: str, root: Path, harness: HarnessConfig | None
) -> list[str]:
    """The refusals a run of ``directive`` (the file's ``text``) would meet that its own <permissions> would not:
    an unsigned (or modified, or untrusted) directive's run gets what they share with the base policy. None when a
    trusted key signed it, the harness's ``signatures`` let its grants through, or the harness cannot be read."""
    from kiwi.snapshot import directive_trust, run_grants

    if harness is None:
        return []
    try:
        trust = directive_trust(text, harness.signatures, load_trusted(root, user_space()).with_role("sign"))
    except KiwiError:
        return []
    if trust.grants == "declared":
        return []
    return [p.message for p in ungranted_calls(directive, str(path), run_grants(directive, trust, harness))]


def _harness_or_none(root: Path) -> HarnessConfig | None:
    from kiwi.harness import load_harness

    try:
        return load_harness(root, user_space())
    except KiwiError:
        return None


def approvals_line(patterns: list[str]) -> str:
    """How validate, show and sign print the calls that wait for a human in a run of a directive."""
    if not patterns:
        return "approvals: none (no call waits for a human)"
    return f"approvals: {', '.join(patterns)} (such a call waits for a human's signed approval)"


def run_approvals(directive: Directive, project_root: Path) -> list[str]:
    """approval_patterns with the project's harness read here."""
    return approval_patterns(directive, project_root, _harness_or_none(project_root))


def approval_patterns(directive: Directive, project_root: Path, harness: HarnessConfig | None) -> list[str]:
    """The tool patterns whose calls wait for a human's approval in a run of ``directive`` started here, as the run
    puts them together (``HumansMixin._approval_patterns``): the harness's ``approvals.tools``, the directive's
    ``<approvals>``, each registered server's ``require_approval``. The harness's part is left out when it cannot
    be read (None; its own check says why), the registry's likewise. Each pattern once, in that order."""
    from kiwi.upstream.registry import load_registry

    patterns = [*directive.metadata.approvals, *(harness.limits.approval_tools if harness else [])]
    try:
        registry = load_registry(project_root, user_space())
    except KiwiError:
        return list(dict.fromkeys(patterns))
    for server, config in registry.servers.items():
        patterns += [f"{server}.{tool}" for tool in config.info().require_approval]
    return list(dict.fromkeys(patterns))


def unknown_tool_names(
    key: str, patterns: Iterable[str], local_tools: Collection[str], servers: Collection[str], path: str = ""
) -> list[Problem]:
    """The tool names and patterns under ``key`` (``approvals.tools``, ``rate_limits``, ``<approvals>``) that can
    match no tool: an error for one in Kiwi's own namespaces that is none of its tools (README trial s34:
    ``approvals.tools: [git.rolback]`` validated, and git.rollback ran with nobody asked), a warning for a local
    tool the project does not have or a server no registry names (a directive may declare it)."""
    known = (*BUILTIN_TOOLS, *KIWI_MCP_TOOLS)
    spaces = {name.casefold() for name in (*BUILTIN_NAMESPACES, "kiwi-mcp")}
    problems: list[Problem] = []
    for pattern in dict.fromkeys(patterns):
        space, dot, _ = pattern.partition(".")
        if pattern in ("*", "mcp.*") or any(fnmatch.fnmatchcase(t, pattern) for t in (*known, *local_tools)):
            continue
        if dot and (space in servers or any(c in space for c in "*?[")):
            continue
        near = difflib.get_close_matches(space.casefold(), sorted(spaces), n=1, cutoff=0.8) if dot else []
        if dot and space.casefold() in spaces:
            close = difflib.get_close_matches(pattern.casefold(), known, n=1, cutoff=0.6)
            hint = f": did you mean {close[0]}?" if close else f" (its tools: {', '.join(known)})"
            problems.append(Problem(f"{key}: '{pattern}' is no tool of Kiwi's{hint}", path))
        elif near:
            # (`filesytem.*`: second README trial s35, a warning about a server, and the limit never applied.)
            meant = near[0] + pattern[len(space) :]
            problems.append(Problem(f"{key}: '{pattern}' is no tool of Kiwi's: did you mean {meant}?", path))
        elif dot:
            problems.append(
                Problem(
                    f"{key}: '{pattern}' names MCP server '{space}', which no mcp_registry.yaml registers; it "
                    "matches only a directive that declares that server",
                    path,
                    severity="warning",
                )
            )
        else:
            close = difflib.get_close_matches(pattern, sorted(local_tools), n=1, cutoff=0.8)
            problems.append(
                Problem(
                    f"{key}: '{pattern}' is no tool here" + (f": did you mean {close[0]}?" if close else ""),
                    path,
                    severity="error" if close else "warning",
                )
            )
    return problems


def harness_tool_problems(
    project_root: Path,
    config: Any,
    path: str = "",
    local_tools: Collection[str] | None = None,
    registered: Collection[str] | None = None,
) -> list[Problem]:
    """:func:`unknown_tool_names` of a loaded harness (``kiwi.harness.HarnessConfig``): its approvals, rate
    limits and granted tools (README trial s34: `approvals.tools: [git.rolback]` switched approval off; second
    trial s35: `kiwi doctor` said all good of it). ``local_tools``, ``registered`` (the registry's servers): the
    project's, when the caller has them."""
    from kiwi.items.store import ItemStore

    local = ItemStore(project_root).local_tools() if local_tools is None else local_tools
    servers = set(registered_servers(project_root) if registered is None else registered) | set(
        config.base_policy.mcp
    )
    limits = config.limits
    problems: list[Problem] = []
    for key, names in (
        ("approvals.tools", limits.approval_tools),
        ("rate_limits", [*limits.rate_limits, *limits.rate_windows]),
        ("internal_tools.tools", config.base_policy.tools),
    ):
        problems += unknown_tool_names(key, names, local, servers, path)
    return problems


def validate_file(
    path: Path, local_tools: Mapping[str, ToolManifest] | Collection[str] = (), text: str | None = None
) -> dict[str, Any]:
    """Parse and check one item file; its problems, signature (and whether a trusted key made it), step plan.
    ``local_tools``: the project's tools (by id, with their manifests to check a step's parameters against).
    ``text``: a directive's draft, checked as if it were the file at ``path`` (which need not exist)."""
    item_type = "directive" if text is not None else item_type_of(path)
    if text is None and not path.exists():
        return {
            "path": str(path),
            "item_type": item_type,
            "valid": False,
            "problems": [Problem("no such file", str(path)).as_dict()],
        }
    parsed, problems = parse_item(item_type, path, text)  # type: ignore[arg-type]
    result: dict[str, Any] = {"path": str(path), "item_type": item_type}
    source = text
    if parsed is not None:
        try:
            source = path.read_text(encoding="utf-8") if text is None else text
            status = verify(source)
            if status.signer:
                root = find_project_root(path.resolve().parent)
                try:
                    trusted = load_trusted(root, user_space()).with_role("sign")
                except ItemInvalid as exc:
                    # (Its own check names each mistake; every item's validate failed on it before.)
                    trusted = {}
                    where = exc.problems[0].path if exc.problems else "trusted_keys.yaml"
                    problems.append(
                        Problem(
                            f"its signer's trust is not checked: {where} has mistakes (`kiwi validate {where}`)",
                            str(path),
                            severity="warning",
                        )
                    )
                check_trust(status, trusted, item_type)
            result["signature"] = status.describe()
            result["trusted"] = status.trusted
            if status.state == "modified":
                problems.append(Problem(status.describe(), str(path), 1, 1, "warning"))
        except UnicodeDecodeError:
            pass
    if isinstance(parsed, Directive):
        result["item_id"] = parsed.name
        # What a signature of it grants, as written (review s36: a human signed grants validate never showed).
        result["grants"] = [entry.written() for entry in parsed.metadata.permissions]
        names = frozenset(local_tools)
        result["steps"] = [p.model_dump() for p in parsed.plan(names)]
        misspelt = unknown_builtins(parsed, str(path), names)
        # (A misspelt tool's grant check named an MCP grant for it: its own problem says what is wrong.)
        ungranted = [
            p
            for p in ungranted_calls(parsed, str(path))
            if not any(f" calls {t}, " in p.message for t, _ in misspelt)
        ]
        syntax = shell_syntax(parsed, str(path))
        problems += [
            *(m for _, m in misspelt),
            *ungranted,
            *stray_params(parsed, str(path)),
            *syntax,
        ]
        if isinstance(local_tools, Mapping):
            problems += local_params(parsed, local_tools, str(path))
        granted = {
            entry.line: [tool.strip() for tool in (entry.attrs.get("id") or "").split(",") if tool.strip()]
            for entry in parsed.metadata.permissions
            if entry.tag == "execute" and entry.attrs.get("resource") == "tool"
        }
        if parsed.metadata.approvals or granted:
            declared = {n for mcp in parsed.metadata.tools.mcps for n in (mcp.name, mcp.alias) if n}
            servers = declared | registered_servers(find_project_root(path.resolve().parent))
            # (On the <approvals> line: README trial s36, these named no line.)
            source = text if text is not None else path.read_text(encoding="utf-8", errors="replace")
            at = next((n for n, ln in enumerate(source.splitlines(), 1) if "<approvals" in ln), 0)
            problems += [
                Problem(p.message, p.path, at, at and 1, p.severity)
                for p in unknown_tool_names(
                    "<approvals>", parsed.metadata.approvals, names, servers, str(path)
                )
            ]
            # A grant of a tool that is none grants nothing: said as a warning naming the one meant (README
            # trial s36: `id="word_cont"` went unremarked, and the step's refusal only asked for word_count).
            problems += [
                Problem(p.message, p.path, line, 1, "warning")
                for line, tools in granted.items()
                for p in unknown_tool_names('<execute resource="tool">', tools, names, servers, str(path))
            ]
        problems += unset_inputs(parsed, str(path))
        # A step whose call the run refuses stops the run there, whatever its plan says (README trial s35:
        # validate printed "runs by itself" under the FAIL of that step's call).
        # (The harness read once for both: README trial s37's plan lines.)
        root = find_project_root(path.resolve().parent)
        harness = _harness_or_none(root)
        patterns = approval_patterns(parsed, root, harness)
        # (README trial s38: validate, show and sign printed the grants and not which calls wait for a human.)
        result["approvals"] = patterns
        weaker = _base_policy_refusals(parsed, path, source, root, harness) if source is not None else []
        for step in result["steps"]:
            marker = f'step "{step["step"]}"'
            step["stops"] = any(p.severity == "error" and p.message.startswith(marker) for p in problems)
            # (A call of a tool that is none refuses the run's start: validate said the run stopped at the step,
            # show that the agent did it, and the run did neither. Review s36.)
            step["shell_syntax"] = any(m.message.startswith(marker) for m in syntax)
            step["no_start"] = step["shell_syntax"] or any(m.message.startswith(marker) for _, m in misspelt)
            # (README trial s37: an unsigned directive validated with every step "runs by itself", and its run
            # failed at the first, its grants cut to the base policy.)
            step["stops_unsigned"] = not step["stops"] and any(m.startswith(marker) for m in weaker)
            # (README trial s37: a step whose delete waits for a human was printed as "runs by itself".)
            calls = next((s.tool_calls for s in parsed.steps if s.name == step["step"]), [])
            step["approval"] = sorted(
                {c.tool for c in calls if any(fnmatch.fnmatchcase(c.tool, p) for p in patterns)}
            )
    elif parsed is not None:
        result["item_id"] = getattr(parsed, "tool_id", None) or getattr(parsed, "zettel_id", None)
    result["valid"] = parsed is not None and not any(p.severity == "error" for p in problems)
    result["problems"] = [p.as_dict() for p in problems]
    result["_problems"] = problems
    return result
