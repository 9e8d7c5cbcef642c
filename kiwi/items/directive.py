"""Directives: Markdown with one fenced XML block ``<directive name version>``.

``parse_directive`` turns a file's text into a :class:`Directive` plus a list of
:class:`~kiwi.errors.Problem` (errors and warnings), each naming file, line and column.
Unknown elements are kept and reported as warnings so newer files still load.
The models are pure pydantic and safe to import from workflow code; parsing uses lxml
and is not.
"""

from __future__ import annotations

import difflib
import re
from typing import Any, Literal

from pydantic import BaseModel, Field

from kiwi.errors import ItemInvalid, Problem
from kiwi.items.markdown import find_xml_block
from kiwi.policy import (
    BUILTIN_TOOLS,
    KIWI_MCP_TOOLS,
    Decision,
    PermissionEntry,
    PermissionSet,
    entry_problems,
    shell_grant_warnings,
)
from kiwi.templating import placeholders

MAX_FILE_BYTES = 1_000_000
MODEL_TIERS = ("fast", "balanced", "general", "reasoning", "orchestrator", "expert")
INPUT_TYPES = ("string", "integer", "number", "boolean", "array", "object")
CHECKPOINT_MODES = ("auto", "explicit", "disabled")
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
_SEMVER = re.compile(r"^\d+\.\d+\.\d+(?:-[0-9A-Za-z.-]+)?(?:\+[0-9A-Za-z.-]+)?$")

KNOWN_METADATA = {
    "description",
    "category",
    "author",
    "model",
    "permissions",
    "tools",
    "mcps",
    "deviation_rules",
    "context_budget",
    "relationships",
    "git_checkpoint",
    "parallel_capable",
    "subagent_strategy",
    "tags",
    "approvals",
}
KNOWN_TOP = {"metadata", "inputs", "process", "outputs", "context"}


class ModelSpec(BaseModel):
    tier: str = "general"
    fallback: str | None = None
    parallel: bool = False
    notes: str = ""


class McpDeclaration(BaseModel):
    """An external MCP server a directive needs, optionally filtered to some of its tools."""

    name: str
    required: bool = False
    alias: str | None = None
    refresh: bool = False
    tools: list[str] = Field(default_factory=list)
    description: str = ""


class ToolsDeclaration(BaseModel):
    mcps: list[McpDeclaration] = Field(default_factory=list)
    tools: list[str] = Field(default_factory=list)
    shell: list[str] = Field(default_factory=list)
    kiwi: list[str] = Field(default_factory=list)
    # The seed's <filesystem><read paths=/><write paths=/></filesystem>: what the steps use, checked
    # against <permissions> like every declaration.
    filesystem_read: list[str] = Field(default_factory=list)
    filesystem_write: list[str] = Field(default_factory=list)


class InputSpec(BaseModel):
    name: str
    type: str = "string"
    required: bool = False
    default: Any = None
    description: str = ""


class ToolCall(BaseModel):
    """A call written in a step: a tool id plus its parameters (templated strings)."""

    tool: str
    params: dict[str, Any] = Field(default_factory=dict)
    line: int = 0
    # Where the file writes the call and each <param> (line, column), for kiwi validate's problems; never sent
    # with a run's snapshot.
    column: int = Field(default=0, exclude=True)
    places: dict[str, tuple[int, int]] = Field(default_factory=dict, exclude=True)

    def place(self, param: str | None = None) -> tuple[int, int]:
        """Where ``param`` (or the call itself) is written: (line, column), column 1 when not known."""
        if param is not None and param in self.places:
            return self.places[param]
        return self.line, self.column or 1


class Step(BaseModel):
    name: str
    condition: str | None = None
    mode: Literal["auto", "agent"] | None = None
    description: str = ""
    action: str = ""
    tool_calls: list[ToolCall] = Field(default_factory=list)
    line: int = 0


class StepPlan(BaseModel):
    """Whether a step runs by itself (``auto``) or waits for the agent, and why."""

    step: str
    mode: Literal["auto", "agent"]
    prerun: bool = False
    reason: str


class Metadata(BaseModel):
    description: str = ""
    category: str = ""
    author: str = ""
    model: ModelSpec = Field(default_factory=ModelSpec)
    permissions: list[PermissionEntry] = Field(default_factory=list)
    tools: ToolsDeclaration = Field(default_factory=ToolsDeclaration)
    deviation_rules: dict[str, str] = Field(default_factory=dict)
    context_budget: dict[str, str] = Field(default_factory=dict)
    relationships: dict[str, list[str]] = Field(default_factory=dict)
    git_checkpoint: str = "explicit"
    approvals: list[str] = Field(default_factory=list)
    approval_timeout_seconds: float | None = None
    tags: list[str] = Field(default_factory=list)
    extra: dict[str, str] = Field(default_factory=dict)


class Directive(BaseModel):
    name: str
    version: str
    metadata: Metadata = Field(default_factory=Metadata)
    inputs: list[InputSpec] = Field(default_factory=list)
    steps: list[Step] = Field(default_factory=list)
    outputs: dict[str, str] = Field(default_factory=dict)
    extra: dict[str, str] = Field(default_factory=dict)

    def grants(self) -> PermissionSet:
        return PermissionSet.from_entries(self.metadata.permissions)

    def input_spec(self, name: str) -> InputSpec | None:
        return next((i for i in self.inputs if i.name == name), None)

    def step(self, name: str) -> Step | None:
        return next((s for s in self.steps if s.name == name), None)

    def plan(self, local_tools: set[str] | frozenset[str] = frozenset()) -> list[StepPlan]:
        return [plan_step(s, self, local_tools) for s in self.steps]


def callable_tool(
    tool: str, directive: Directive, local_tools: set[str] | frozenset[str], *, kiwi_tools: bool = True
) -> bool:
    """Whether Kiwi itself can call ``tool`` in a run of ``directive``.

    ``kiwi_tools``: Kiwi's meta-tools (``kiwi-mcp.search``, ...) are tools of the run; runs started
    before they were replay without them.
    """
    if tool in BUILTIN_TOOLS or tool in local_tools or (kiwi_tools and tool in KIWI_MCP_TOOLS):
        return True
    server, _, name = tool.partition(".")
    for mcp in directive.metadata.tools.mcps:
        if name and server in (mcp.name, mcp.alias) and (not mcp.tools or name in mcp.tools):
            return True
    return False


def plan_step(
    step: Step,
    directive: Directive,
    local_tools: set[str] | frozenset[str] = frozenset(),
    *,
    kiwi_tools: bool = True,
) -> StepPlan:
    unknown = [
        c.tool
        for c in step.tool_calls
        if not callable_tool(c.tool, directive, local_tools, kiwi_tools=kiwi_tools)
    ]
    bound = bool(step.tool_calls) and not unknown
    if step.mode == "agent":
        return StepPlan(step=step.name, mode="agent", prerun=bound, reason='mode="agent" set on the step')
    if step.mode == "auto":
        if not bound:
            why = f"tool(s) Kiwi cannot call: {', '.join(unknown)}" if unknown else "no tool calls"
            return StepPlan(step=step.name, mode="agent", reason=f'mode="auto" ignored: {why}')
        return StepPlan(step=step.name, mode="auto", reason='mode="auto" set on the step')
    if not step.tool_calls:
        return StepPlan(step=step.name, mode="agent", reason="no tool calls: the agent does the work")
    if unknown:
        return StepPlan(
            step=step.name, mode="agent", reason=f"tool(s) Kiwi cannot call itself: {', '.join(unknown)}"
        )
    if step.action.strip():
        return StepPlan(
            step=step.name,
            mode="agent",
            prerun=True,
            reason="bound tool calls run first; the <action> then needs the agent",
        )
    return StepPlan(step=step.name, mode="auto", reason="all tool calls are bound to tools Kiwi can call")


# --------------------------------------------------------------------------- parsing


class _Ctx:
    def __init__(self, path: str, text: str, line_offset: int) -> None:
        self.path = path
        self.lines = text.splitlines()
        self.offset = line_offset
        self.problems: list[Problem] = []

    def at(self, element: Any) -> tuple[int, int]:
        xml_line = getattr(element, "sourceline", None) or 0
        line = xml_line + self.offset
        column = 0
        if 0 < line <= len(self.lines) and isinstance(getattr(element, "tag", None), str):
            column = self.lines[line - 1].find("<" + element.tag) + 1
        return line, column

    def at_param(self, element: Any) -> tuple[int, int]:
        """Where a <param name=...> is: its own column, also beside other <param>s on its line."""
        line, column = self.at(element)
        if 0 < line <= len(self.lines):
            text, name = self.lines[line - 1], element.get("name")
            found = max(text.find(f'<param name="{name}"'), text.find(f"<param name='{name}'"))
            column = found + 1 if found >= 0 else column
        return line, column

    def error(self, element: Any, message: str) -> None:
        line, column = self.at(element) if element is not None else (0, 0)
        self.problems.append(Problem(message, self.path, line, column))

    def warn(self, element: Any, message: str) -> None:
        line, column = self.at(element) if element is not None else (0, 0)
        self.problems.append(Problem(message, self.path, line, column, severity="warning"))


def _text(element: Any) -> str:
    if element is None:
        return ""
    return " ".join("".join(element.itertext()).split()) if len(element) == 0 else _dedent(element)


def _dedent(element: Any) -> str:
    raw = "".join(element.itertext())
    lines = [ln.rstrip() for ln in raw.splitlines()]
    while lines and not lines[0].strip():
        lines.pop(0)
    while lines and not lines[-1].strip():
        lines.pop()
    indent = min((len(ln) - len(ln.lstrip()) for ln in lines if ln.strip()), default=0)
    return "\n".join(ln[indent:] for ln in lines)


def _bool(value: str | None, default: bool = False) -> bool:
    if value is None:
        return default
    return value.strip().lower() in ("true", "yes", "1")


def _serialise(element: Any) -> str:
    from lxml import etree

    return etree.tostring(element, encoding="unicode").strip()


def _children(element: Any) -> list[Any]:
    return [c for c in element if isinstance(c.tag, str)]


LONG_LINE = 200  # (characters of a line of the xml block, blanks at its ends left out)


def parse_directive(text: str, path: str = "") -> tuple[Directive, list[Problem]]:
    """Parse and validate a directive file's text.

    Raises :class:`ItemInvalid` when the file cannot be parsed at all or has errors;
    returns the directive and its warnings otherwise.
    """
    directive, problems = parse_directive_lenient(text, path)
    if directive is None or any(p.severity == "error" for p in problems):
        raise ItemInvalid(problems)
    return directive, problems


def parse_directive_lenient(text: str, path: str = "") -> tuple[Directive | None, list[Problem]]:
    """Parse and validate, returning every problem instead of raising on validation errors."""
    from kiwi.items.xmlsafe import XmlRefused, parse_xml

    if len(text.encode("utf-8", "surrogatepass")) > MAX_FILE_BYTES:
        return None, [
            Problem(f"file is larger than {MAX_FILE_BYTES:,} bytes; directives are small text files", path)
        ]
    if "\x00" in text:
        return None, [Problem("file contains NUL bytes; a directive is UTF-8 Markdown text", path, 1, 1)]
    try:
        block, start = find_xml_block(text, path)
    except ItemInvalid as exc:
        return None, exc.problems
    try:
        root = parse_xml(block)
    except XmlRefused as exc:
        line = start + exc.line if exc.line else start
        # The parser's own "line N" (an opening tag's, say) counts in the XML block: in the file's lines here.
        message = re.sub(r"\bline (\d+)\b", lambda m: f"line {int(m.group(1)) + start}", exc.message)
        return None, [Problem(message, path, line, exc.column)]
    ctx = _Ctx(path, text, start)
    if root.tag != "directive":
        ctx.error(root, f'root element is <{root.tag}>; expected <directive name="..." version="...">')
        return None, ctx.problems
    directive = _build(root, ctx)
    _validate(directive, root, ctx)
    for offset, line in enumerate(block.splitlines(), 1):
        if len(line.strip()) > LONG_LINE:
            # (Review s37, third round: a grant past 300 blanks sat off-screen in every viewer, which does not wrap
            # code.) A warning: `kiwi validate` and `kiwi sign` print every grant all the same.
            ctx.problems.append(
                Problem(
                    f"line {start + offset} of the directive is {len(line.strip()):,} characters long: a viewer "
                    "shows code without wrapping, so what lies past the edge is easy to miss; break it up",
                    path,
                    start + offset,
                    1,
                    "warning",
                )
            )
    # (Without a name or version there is no directive to use; the rest is checked all the same, so one
    # pass names every problem instead of the next one only after that is fixed.)
    return (directive if root.get("name") and root.get("version") else None), ctx.problems


def _build(root: Any, ctx: _Ctx) -> Directive:
    name = root.get("name")
    version = root.get("version")
    if not name:
        ctx.error(root, '<directive> needs a name attribute (snake_case, e.g. name="deploy_app")')
    if not version:
        ctx.error(root, '<directive> needs a version attribute (semver, e.g. version="1.0.0")')
    metadata = Metadata()
    inputs: list[InputSpec] = []
    steps: list[Step] = []
    outputs: dict[str, str] = {}
    extra: dict[str, str] = {}
    seen: set[str] = set()
    for child in _children(root):
        if child.tag in seen and child.tag in KNOWN_TOP:
            _second(child, "<directive>", ctx)
        seen.add(child.tag)
        if child.tag == "metadata":
            metadata = _metadata(child, ctx)
        elif child.tag == "inputs":
            inputs = _inputs(child, ctx)
        elif child.tag == "process":
            steps = _process(child, ctx)
        elif child.tag == "outputs":
            outputs = {c.tag: _dedent(c) for c in _children(child)}
            if not outputs and _text(child):
                outputs = {"success": _dedent(child)}
        elif child.tag == "context":
            extra["context"] = _serialise(child)
        elif _local_name(child.tag) == "approvals":
            _misplaced_approvals(child, "<directive>", ctx)
        else:
            extra[child.tag] = _serialise(child)
            ctx.warn(
                child, f"unknown element <{child.tag}> kept as-is (known: {', '.join(sorted(KNOWN_TOP))})"
            )
    return Directive(
        name=name or "unnamed",  # (placeholders: the missing attribute is an error above)
        version=version or "0.0.0",
        metadata=metadata,
        inputs=inputs,
        steps=steps,
        outputs=outputs,
        extra=extra,
    )


def _local_name(tag: Any) -> str:
    """An element's name without its namespace (``{urn:x}approvals``, ``k:approvals``), case-folded."""
    return str(tag).rsplit("}", 1)[-1].rsplit(":", 1)[-1].casefold()


def _misplaced_approvals(child: Any, where: str, ctx: _Ctx) -> None:
    """<approvals> anywhere but <metadata> asks nobody (hostile review s39, third round: at the top level, in
    <tools> or a <step>, upper-case or namespaced, it was a warning, and the directive signed): an error."""
    ctx.error(
        child,
        f"<{child.tag}> in {where} asks nobody: as written, no call waits for a human's approval; write "
        "<approvals> in <metadata>",
    )


def _second(child: Any, parent: str, ctx: _Ctx) -> None:
    """A second element of a kind its parent has one of replaced the first without a word (hostile review s39: a
    second <metadata> or <approvals> dropped the first's approvals, a second <process> its steps, a second <inputs>
    a required input): an error."""
    ctx.error(
        child,
        f"{parent} has a second <{child.tag}>, which would replace the first and all it says: write one <{child.tag}>",
    )


def _metadata(element: Any, ctx: _Ctx) -> Metadata:
    meta = Metadata()
    seen: set[str] = set()
    for child in _children(element):
        tag = child.tag
        if tag in seen and tag != "permissions":  # (grants add up; everything else is set once)
            _second(child, "<metadata>", ctx)
        seen.add(tag)
        if tag in ("description", "category", "author"):
            setattr(meta, tag, _text(child))
        elif tag == "model":
            tier = child.get("tier", "general")
            meta.model = ModelSpec(
                tier=tier,
                fallback=child.get("fallback"),
                parallel=_bool(child.get("parallel")),
                notes=_text(child),
            )
            for attr in ("tier", "fallback"):
                value = child.get(attr)
                if value is not None and value not in MODEL_TIERS:
                    ctx.error(
                        child,
                        f'<model {attr}="{value}"> is not a known tier; expected one of {", ".join(MODEL_TIERS)}',
                    )
        elif tag == "permissions":
            for perm in _children(element=child):
                # A grant Kiwi cannot read exactly is an error: never ignored, never "all".
                entry = PermissionEntry(tag=perm.tag, attrs=dict(perm.attrib), line=ctx.at(perm)[0])
                problems = entry_problems(entry)
                for problem in problems:
                    ctx.error(perm, problem)
                if not problems:
                    meta.permissions.append(entry)
                    for warning in shell_grant_warnings(entry):
                        ctx.warn(perm, warning)
        elif tag in ("tools", "mcps"):
            _tools_decl(child, meta.tools, ctx)
        elif tag in ("deviation_rules", "context_budget"):
            values = dict(child.attrib)
            for sub in _children(child):
                values[sub.tag] = _text(sub)
            if _text(child) and not _children(child):
                values["text"] = _dedent(child)
            setattr(meta, tag, values)
        elif tag == "relationships":
            for sub in _children(child):
                meta.relationships.setdefault(sub.tag, []).append(_text(sub))
        elif tag == "git_checkpoint":
            mode = child.get("mode", "explicit")
            if mode not in CHECKPOINT_MODES:
                ctx.error(
                    child,
                    f'<git_checkpoint mode="{mode}"> is unknown; expected one of {", ".join(CHECKPOINT_MODES)}',
                )
            meta.git_checkpoint = mode
        elif tag == "approvals":
            # <approvals timeout="600"><tool>filesystem.delete</tool><tool>github.*</tool></approvals>
            _attributes(child, ("timeout",), ctx)
            meta.approvals = [
                t
                for t in (sub.get("name") or _text(sub) for sub in _children(child) if sub.tag == "tool")
                if t
            ]
            if child.get("timeout"):
                try:
                    meta.approval_timeout_seconds = float(child.get("timeout"))
                except ValueError:
                    ctx.error(
                        child, f'<approvals timeout="{child.get("timeout")}"> must be a number of seconds'
                    )
            for sub in _children(child):
                if sub.tag != "tool":
                    # (Its tool went unguarded: a misspelt <tol> was dropped without a word. README trial s37.)
                    ctx.error(
                        sub,
                        f"<approvals> takes <tool> elements only, not <{sub.tag}>: a tool it does not name runs "
                        "with nobody asked; write <tool>NAME</tool>",
                    )
                elif sub.get("name") and _text(sub) and sub.get("name") != _text(sub):
                    # (Review s39, third round: `<tool name="git.commit">filesystem.delete</tool>` gated git.commit
                    # alone, the text ignored.)
                    ctx.error(
                        sub,
                        f'<tool name="{sub.get("name")}">{_text(sub)}</tool> names two tools: write one <tool> for each',
                    )
                elif not (sub.get("name") or _text(sub)):
                    # (Hostile review s39: `<tool nmae="filesystem.delete"/>` named no tool, and the delete ran
                    # with nobody asked; the directive validated and signed.)
                    has = ", ".join(f'{a}="{v}"' for a, v in sub.attrib.items())
                    ctx.error(
                        sub,
                        "<tool> in <approvals> names no tool: a tool it does not name runs with nobody asked; "
                        'write <tool>NAME</tool> or <tool name="NAME"/>'
                        + (f" (it has {has})" if has else ""),
                    )
                else:
                    _attributes(sub, ("name",), ctx)
            if not meta.approvals:
                ctx.warn(child, "<approvals> names no <tool>; nothing will wait for approval")
        elif tag == "tags":
            meta.tags = [t.strip() for t in re.split(r"[,\n]", _text(child)) if t.strip()] or [
                _text(t) for t in _children(child)
            ]
        elif tag in KNOWN_METADATA:
            meta.extra[tag] = _text(child)
        else:
            meta.extra[tag] = _serialise(child)
            near = (["approvals"] if _local_name(tag) == "approvals" else []) or difflib.get_close_matches(
                _local_name(tag), sorted({*KNOWN_METADATA, "approvals", "tags"}), n=1, cutoff=0.75
            )
            # A misspelt <approvals> asks nobody: an error, as a gate lost (README trial s37: `<approval>` was a
            # warning, `kiwi sign` signed it and the run deleted with no approval asked). Others stay warnings.
            (ctx.error if near == ["approvals"] else ctx.warn)(
                child,
                f"unknown metadata element <{tag}> kept as-is"
                + (f"; did you mean <{near[0]}>?" if near else "")
                + (": as written, no call waits for a human's approval" if near == ["approvals"] else ""),
            )
    return meta


def _tools_decl(element: Any, decl: ToolsDeclaration, ctx: _Ctx) -> None:
    for child in _children(element):
        if child.tag == "mcp":
            name = child.get("name")
            if not name:
                ctx.error(
                    child,
                    "<mcp> needs a name attribute naming a server in mcp_registry.yaml" + _name_meant(child),
                )
                continue
            tools: list[str] = []
            for sub in child.iter("tool"):
                tool = sub.get("name") or _text(sub)
                if tool:
                    tools.append(tool)
            description = (child.text or "").strip()
            decl.mcps.append(
                McpDeclaration(
                    name=name,
                    required=_bool(child.get("required")),
                    alias=child.get("alias"),
                    refresh=_bool(child.get("refresh")),
                    tools=tools,
                    description=description,
                )
            )
        elif child.tag in ("script", "tool"):
            tool = child.get("name") or child.get("id") or _text(child)
            if tool:
                decl.tools.append(tool)
        elif child.tag == "shell":
            decl.shell.extend(c.strip() for c in child.get("commands", "").split(",") if c.strip())
            # The seed's other form: <shell><command>git</command>...</shell>.
            decl.shell.extend(_text(sub) for sub in _children(child) if sub.tag == "command" and _text(sub))
            for sub in _children(child):
                if sub.tag != "command":
                    ctx.error(sub, f"<shell> holds <command> elements, not <{sub.tag}>")
        elif child.tag == "filesystem":
            for sub in _children(child):
                if sub.tag not in ("read", "write") or not sub.get("paths", sub.get("path")):
                    ctx.error(sub, '<filesystem> holds <read paths="..."/> and <write paths="..."/>')
                    continue
                paths = [p.strip() for p in sub.get("paths", sub.get("path", "")).split(",") if p.strip()]
                (decl.filesystem_read if sub.tag == "read" else decl.filesystem_write).extend(paths)
        elif child.tag == "kiwi":
            for sub in _children(child):
                decl.kiwi.append(sub.tag)
        elif _local_name(child.tag) == "approvals":
            _misplaced_approvals(child, "<tools>", ctx)
        else:
            ctx.warn(
                child,
                f"unknown tool declaration <{child.tag}> ignored (known: mcp, tool, script, shell, filesystem, kiwi)",
            )


def _name_meant(element: Any) -> str:
    """For an element without its name attribute: the misspelt one it has instead (README trial s37: `<step
    nmae="list_notes">` was "needs a name attribute", and the step left out of the plan, with no word of why)."""
    near = difflib.get_close_matches("name", [str(a) for a in element.attrib], n=1, cutoff=0.7)
    return f' (it has {near[0]}="{element.get(near[0])}": did you mean name=?)' if near else ""


CONDITION_WORDS = ("if", "when", "only_if", "run_if", "unless", "cond", "where")


def _attributes(element: Any, known: tuple[str, ...], ctx: _Ctx) -> None:
    """Warn of each attribute of ``element`` Kiwi does not read, naming the one meant (README trial s36:
    `<step conditon=...>` made a step that always runs, `<approvals timout=...>` kept the default wait, and
    `<input requried=...>` an optional input, each with nothing said)."""
    for name in element.attrib:
        if name in known:
            continue
        near = difflib.get_close_matches(name, known, n=1, cutoff=0.6) or [
            # (Another word for a condition, hostile review s39: `<step if=...>` made a step that always runs.)
            m
            for m in known
            if m == "condition" and name.casefold().replace("-", "_") in CONDITION_WORDS
        ]
        meant = f'; did you mean {near[0]}="..."?' if near else f" (it takes {', '.join(known)})"
        # A misspelling of one Kiwi reads is an error: as written, the directive does less than it says (a
        # condition that never applies, an input not required, the default wait). README trial s38: they were
        # warnings, and `kiwi sign` signed them. An attribute like no known one stays a warning.
        (ctx.error if near else ctx.warn)(
            element, f"<{element.tag}> has no attribute '{name}', which is ignored{meant}"
        )


def _inputs(element: Any, ctx: _Ctx) -> list[InputSpec]:
    inputs = []
    for child in _children(element):
        if child.tag != "input":
            ctx.warn(child, f"unknown element <{child.tag}> in <inputs> ignored")
            continue
        name = child.get("name")
        if not name:
            ctx.error(child, "<input> needs a name attribute" + _name_meant(child))
            continue
        _attributes(child, ("name", "type", "required", "default", "description"), ctx)
        kind = child.get("type", "string")
        if kind not in INPUT_TYPES:
            ctx.error(
                child, f'<input name="{name}"> has type "{kind}"; expected one of {", ".join(INPUT_TYPES)}'
            )
        default: Any = child.get("default")
        if default is not None and kind in INPUT_TYPES:
            from kiwi.templating import coerce_input

            try:
                default = coerce_input(kind, default)
            except ValueError as exc:
                ctx.error(child, f'<input name="{name}"> default {exc}')
        required = child.get("required")
        if required is not None and required.strip().lower() not in ("true", "yes", "1", "false", "no", "0"):
            # (Hostile review s39: required="on", "y" or "ture" meant not required, with no word.)
            ctx.error(
                child, f'<input name="{name}" required="{required}"> is no yes or no: write required="true"'
            )
        inputs.append(
            InputSpec(
                name=name,
                type=kind,
                required=_bool(required),
                default=default,
                description=_dedent(child),
            )
        )
    return inputs


def _params(element: Any) -> dict[str, Any]:
    params: dict[str, Any] = {}
    for p in _children(element):
        if p.tag == "param" and p.get("name"):
            params[p.get("name")] = _param_value(p)
    return params


def _param_places(element: Any, ctx: _Ctx) -> dict[str, tuple[int, int]]:
    """Where each <param name=...> of a call is written (the legacy <params><NAME> children too)."""
    found = {p.get("name"): ctx.at_param(p) for p in _children(element) if p.tag == "param" and p.get("name")}
    legacy = element.find("params")
    if legacy is not None:
        found.update({p.tag: ctx.at(p) for p in _children(legacy) if p.tag not in found})
    return found


def _param_value(element: Any) -> str:
    raw = "".join(element.itertext())
    return raw.strip() if "\n" not in raw.strip() else _dedent(element)


def _check_params(call: Any, known: tuple[str, ...], ctx: _Ctx) -> None:
    """A call's children: a <param> with no name, and a misspelt <param>, are parameters the call goes without
    (errors: README trial s38, `<param key="command">` was dropped and the call said only that it needs
    'command'); another unknown element is a warning."""
    for sub in _children(call):
        if sub.tag == "param" and not sub.get("name"):
            has = ", ".join(f'{a}="{v}"' for a, v in sub.attrib.items())
            ctx.error(
                sub,
                '<param> needs a name attribute: <param name="...">value</param>'
                + (f" (it has {has})" if has else ""),
            )
        if sub.tag not in known:
            meant = (
                "; did you mean <param>?" if difflib.get_close_matches(sub.tag, ["param"], cutoff=0.6) else ""
            )
            (ctx.error if meant else ctx.warn)(
                sub, f"unknown element <{sub.tag}> in <{call.tag}> ignored{meant}"
            )


def _calls(step_el: Any, ctx: _Ctx) -> list[ToolCall]:
    calls: list[ToolCall] = []
    for child in _children(step_el):
        if child.tag == "tool_call":
            tool = child.get("tool")
            mcp = child.get("mcp")
            _check_params(child, ("param", "mcp", "tool", "params"), ctx)
            if tool is None:
                # Legacy form: <tool_call><mcp>x</mcp><tool>y</tool><params><k>v</k></params></tool_call>
                mcp_el, tool_el, params_el = child.find("mcp"), child.find("tool"), child.find("params")
                tool = _text(tool_el)
                mcp = _text(mcp_el) or None
                params = (
                    {p.tag: _param_value(p) for p in _children(params_el)} if params_el is not None else {}
                )
                params.update(_params(child))
            else:
                params = _params(child)
            if not tool:
                ctx.error(
                    child,
                    '<tool_call> needs a tool attribute (e.g. tool="filesystem.read") or a <tool> child',
                )
                continue
            line, column = ctx.at(child)
            calls.append(
                ToolCall(
                    tool=f"{mcp}.{tool}" if mcp else tool,
                    params=params,
                    line=line,
                    column=column,
                    places=_param_places(child, ctx),
                )
            )
        elif child.tag == "tool_calls":
            for call in _children(child):
                if call.tag != "call":
                    ctx.warn(call, f"unknown element <{call.tag}> in <tool_calls> ignored (expected <call>)")
                    continue
                tool, mcp = call.get("tool"), call.get("mcp")
                if not tool:
                    ctx.error(call, "<call> needs a tool attribute")
                    continue
                # (Hostile review s39: the <tool_calls><call> form dropped a <param key=...> and a <parm> with no
                # word, where <tool_call> refused them.)
                _check_params(call, ("param",), ctx)
                line, column = ctx.at(call)
                calls.append(
                    ToolCall(
                        tool=f"{mcp}.{tool}" if mcp else tool,
                        params=_params(call),
                        line=line,
                        column=column,
                        places=_param_places(call, ctx),
                    )
                )
    return calls


def _process(element: Any, ctx: _Ctx) -> list[Step]:
    steps = []
    for child in _children(element):
        if child.tag != "step":
            ctx.warn(child, f"unknown element <{child.tag}> in <process> ignored (expected <step>)")
            continue
        name = child.get("name")
        if not name:
            ctx.error(child, "<step> needs a name attribute" + _name_meant(child))
            continue
        _attributes(child, ("name", "condition", "mode"), ctx)
        mode = child.get("mode")
        if mode not in (None, "auto", "agent"):
            ctx.error(child, f'<step name="{name}" mode="{mode}"> is unknown; expected auto or agent')
            mode = None
        for sub in _children(child):
            if sub.tag not in (
                "description",
                "action",
                "tool_call",
                "tool_calls",
                "verification",
                "outputs",
                "notes",
            ):
                if _local_name(sub.tag) == "approvals":
                    _misplaced_approvals(sub, f"step '{name}'", ctx)
                    continue
                if sub.tag.casefold().replace("-", "_") in ("condition", *CONDITION_WORDS):
                    # (A condition written as an element applies to nothing: the step always runs. Review s39.)
                    ctx.error(
                        sub,
                        f"<{sub.tag}> in step '{name}' is no condition Kiwi reads, and the step would always run: "
                        f'write it as <step name="{name}" condition="...">',
                    )
                    continue
                ctx.warn(sub, f"unknown element <{sub.tag}> in step '{name}' kept as text")
        if child.get("condition") == "":
            # (Hostile review s39: an empty condition was taken as none, and the step always ran.)
            ctx.error(
                child, f'<step name="{name}" condition=""> is empty: write the condition, or leave it out'
            )
        steps.append(
            Step(
                name=name,
                condition=child.get("condition"),
                mode=mode,
                description=_text(child.find("description")),
                action=_dedent(child.find("action")) if child.find("action") is not None else "",
                tool_calls=_calls(child, ctx),
                line=ctx.at(child)[0],
            )
        )
    return steps


def _validate(directive: Directive, root: Any, ctx: _Ctx) -> None:
    from kiwi.conditions import ConditionError, parse_condition

    if not _NAME.match(directive.name):
        ctx.error(
            root, f'directive name "{directive.name}" must be snake_case (lowercase letters, digits, _)'
        )
    if not _SEMVER.match(directive.version):
        ctx.error(
            root, f'version "{directive.version}" is not semver (expected MAJOR.MINOR.PATCH, e.g. 1.0.0)'
        )
    seen_inputs: set[str] = set()
    inputs_el = root.find("inputs")
    for spec, el in zip(
        directive.inputs, inputs_el.findall("input") if inputs_el is not None else [], strict=False
    ):
        if spec.name in seen_inputs:
            ctx.error(el, f'input "{spec.name}" is declared twice')
        seen_inputs.add(spec.name)
    step_els = {el.get("name"): el for el in root.iter("step")}
    earlier: set[str] = set()
    for step in directive.steps:
        el = step_els.get(step.name)
        if step.name in earlier:
            dupes = [e for e in root.iter("step") if e.get("name") == step.name]
            ctx.error(dupes[-1], f'step name "{step.name}" is used twice; step names must be unique')
            continue
        if step.condition:
            try:
                names = parse_condition(step.condition).names()
            except ConditionError as exc:
                ctx.error(el, f'step "{step.name}" condition: {exc}')
                names = set()
            for ref in names:
                problem = _reference_problem(ref, seen_inputs, earlier)
                if problem:
                    ctx.error(el, f'step "{step.name}" condition: {problem}')
        for call in step.tool_calls:
            for name, value in call.params.items():
                for ref in placeholders(value):
                    problem = _reference_problem(ref, seen_inputs, earlier)
                    if problem:
                        # (At the <param> that holds it: README trial s36, it named the line only.)
                        ctx.problems.append(
                            Problem(f'step "{step.name}" {call.tool}: {problem}', ctx.path, *call.place(name))
                        )
        for ref in placeholders(step.action):
            problem = _reference_problem(ref, seen_inputs, earlier)
            if problem:
                ctx.warn(el, f'step "{step.name}" action text: {problem}')
        earlier.add(step.name)
    _validate_tools_against_permissions(directive, root, ctx)


def _reference_problem(ref: str, inputs: set[str], earlier: set[str]) -> str:
    parts = ref.split(".")
    if parts[0] == "inputs" and len(parts) == 2:
        parts = parts[1:]
    if len(parts) == 1:
        if parts[0] in inputs:
            return ""
        return f"{{{ref}}} is not a declared input (declared: {', '.join(sorted(inputs)) or 'none'})"
    if parts[0] == "steps":
        if len(parts) < 3 or parts[2] != "outputs" and len(parts) != 3:
            return f"{{{ref}}} should read {{steps.NAME.outputs.KEY}}"
        if parts[1] not in earlier:
            return f'{{{ref}}} refers to step "{parts[1]}", which is not an earlier step'
        return ""
    if parts[0] in earlier:
        return ""
    return f"{{{ref}}} is neither a declared input nor an earlier step's output"


def _validate_tools_against_permissions(directive: Directive, root: Any, ctx: _Ctx) -> None:
    grants = directive.grants()
    decl = directive.metadata.tools
    meta_el = root.find("metadata")
    where = None
    if meta_el is not None:
        where = meta_el.find("tools") if meta_el.find("tools") is not None else meta_el.find("mcps")
    for mcp in decl.mcps:
        if "kiwi-mcp" in (mcp.name, mcp.alias):
            ctx.error(
                where,
                '<mcp name="kiwi-mcp"> names Kiwi itself, not an external MCP server: its tools (kiwi-mcp.search, '
                'load, help, execute) need no declaration; grant them with <execute resource="kiwi-mcp" '
                'action="..."/>',
            )
            continue
        for tool in mcp.tools:
            decision = grants.check_tool_id(f"{mcp.name}.{tool}")
            if not decision.allowed:
                ctx.error(
                    where,
                    f"<tools> requests {mcp.name}.{tool} but <permissions> does not grant it; {decision.hint}",
                )
        if not mcp.tools and not grants.mcp.get(mcp.name) and f"{mcp.name}.*" not in grants.tools:
            ctx.error(
                where,
                f'<tools> requests MCP server "{mcp.name}" but <permissions> grants none of its tools; '
                f'add <execute resource="mcp" name="{mcp.name}" actions="*"/>',
            )
    for tool in decl.tools:
        if tool in ("filesystem.read", "filesystem.list"):
            decision = Decision(
                allowed=bool(grants.fs_read), hint='add a <read resource="filesystem" path="..."/>'
            )
        elif tool.startswith("filesystem."):
            decision = Decision(
                allowed=bool(grants.fs_write), hint='add a <write resource="filesystem" path="..."/>'
            )
        elif tool == "shell.run":
            decision = Decision(
                allowed=bool(grants.shell), hint='add <execute resource="shell" commands="..."/>'
            )
        else:
            decision = grants.check_tool_id(tool)
        if not decision.allowed:
            ctx.error(
                where, f'<tools> requests tool "{tool}" but <permissions> does not grant it; {decision.hint}'
            )
    for key, paths in (("read", decl.filesystem_read), ("write", decl.filesystem_write)):
        for glob in paths:
            # A path the glob stands for (its wildcards filled in), checked as the run would check it.
            sample = glob.replace("**", "x").replace("*", "x").replace("?", "x").rstrip("/") or "x"
            decision = grants.check(f"filesystem.{key}", {"path": sample, "content": ""})
            if not decision.allowed:
                ctx.error(
                    where,
                    f"<tools> declares filesystem {key} of {glob} but <permissions> does not grant it; add "
                    f'<{key} resource="filesystem" path="{glob}"/>',
                )
    for command in decl.shell:
        decision = grants.check_shell({"argv": [command]}, [])
        if not decision.allowed:
            ctx.error(
                where,
                f'<tools> requests shell command "{command}" but <permissions> does not grant it; '
                f"{decision.hint}",
            )
