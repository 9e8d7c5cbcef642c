"""Tool manifests (``.ai/tools/**/tool.yaml``) and legacy ``.ai/scripts/*.py`` tools."""

from __future__ import annotations

import ast
import difflib
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, Field, ValidationError

from kiwi import yamltext
from kiwi.apitools import read_executor
from kiwi.containertools import read_container_executor
from kiwi.errors import ItemInvalid, Problem
from kiwi.items.files import read_item_bytes
from kiwi.signing import split_signature

TOOL_TYPES = ("python", "bash", "api", "docker", "mcp")
_LEGACY_TYPES = {"mcp_tool": "mcp", "script": "python", "http": "api"}
_PARAM_TYPES = {
    "string": "string",
    "str": "string",
    "integer": "integer",
    "int": "integer",
    "number": "number",
    "float": "number",
    "boolean": "boolean",
    "bool": "boolean",
    "array": "array",
    "list": "array",
    "object": "object",
    "dict": "object",
}
MAX_MANIFEST_BYTES = 256_000


class ToolParameter(BaseModel):
    name: str
    type: str = "string"
    required: bool = False
    default: Any = None
    description: str = ""
    enum: list[Any] | None = None


class ToolManifest(BaseModel):
    """A local tool: what it is, how it runs, and the JSON Schema of its parameters."""

    tool_id: str
    tool_type: Literal["python", "bash", "api", "docker", "mcp"]
    version: str = "0.0.0"
    category: str = ""
    description: str = ""
    executor: dict[str, Any] = Field(default_factory=dict)
    mutates_state: bool = False
    parameters: list[ToolParameter] = Field(default_factory=list)
    input_schema: dict[str, Any] | None = None
    outputs: dict[str, Any] = Field(default_factory=dict)
    requires: Any = None
    tags: list[str] = Field(default_factory=list)
    author: str = ""
    config: dict[str, Any] = Field(default_factory=dict)
    metadata: dict[str, Any] = Field(default_factory=dict)
    legacy: bool = False
    path: str = ""

    def json_schema(self) -> dict[str, Any]:
        if self.input_schema:
            return self.input_schema
        properties: dict[str, Any] = {}
        required = []
        for p in self.parameters:
            prop: dict[str, Any] = {"type": _PARAM_TYPES.get(p.type, "string")}
            if p.description:
                prop["description"] = p.description
            if p.default is not None:
                prop["default"] = p.default
            if p.enum:
                prop["enum"] = p.enum
            properties[p.name] = prop
            if p.required:
                required.append(p.name)
        schema: dict[str, Any] = {"type": "object", "properties": properties, "additionalProperties": False}
        if required:
            schema["required"] = required
        return schema

    @property
    def entrypoint(self) -> str:
        return str(self.executor.get("entrypoint", ""))

    def _required(self, key: str) -> list[str]:
        """Names listed under ``requires.KEY`` (or the seed's ``executor.requires.KEY``)."""
        names: list[str] = []
        for requires in (self.requires, self.executor.get("requires")):
            listed = requires.get(key) if isinstance(requires, dict) else None
            if isinstance(listed, str):
                listed = [listed]
            names += [str(n) for n in listed or [] if str(n) not in names]
        return names

    def required_commands(self) -> list[str]:
        """Programs that must be on the worker's PATH before the tool runs."""
        return self._required("commands")

    def required_environment(self) -> list[str]:
        """Environment variables that must be set in the worker before the tool runs (passed to it)."""
        return self._required("environment")

    def required_packages(self) -> list[str]:
        """A python tool's packages: ``requires.packages`` (or the seed's ``executor.dependencies``)."""
        listed = self._required("packages")
        deps = self.executor.get("dependencies")
        return listed + [str(d) for d in deps if str(d) not in listed] if isinstance(deps, list) else listed

    def required_python(self) -> str:
        """The Python versions the tool runs on (a specifier such as ``>=3.11``; '' for any)."""
        requires = self.requires if isinstance(self.requires, dict) else {}
        return str(requires.get("python") or "")


def requirement_problems(manifest: ToolManifest) -> list[str]:
    """What is wrong with a tool's ``requires`` ([] when nothing)."""
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    problems = []
    packages = manifest.required_packages()
    if packages and manifest.tool_type != "python":
        problems.append(
            f"requires.packages is for python tools; a {manifest.tool_type} tool cannot install any"
        )
    for package in packages:
        try:
            requirement = Requirement(package)
        except InvalidRequirement as exc:
            problems.append(
                f"requires.packages: '{package}' is not a requirement (e.g. requests>=2.31): {exc}"
            )
            continue
        if requirement.url:
            problems.append(
                f"requires.packages: '{package}' names a URL; packages come from the configured index only"
            )
    if manifest.required_python():
        try:
            SpecifierSet(manifest.required_python())
        except InvalidSpecifier:
            problems.append(
                f"requires.python: '{manifest.required_python()}' is not a version specifier (e.g. >=3.11)"
            )
    return problems


# What a worker cannot run, and what to write instead: a manifest of these types is an error, so it
# never sits in search as a tool that fails only when called.
UNRUNNABLE_TYPES = {
    "mcp": (
        "an MCP tool is not declared in a tool.yaml: declare its server in .ai/config/mcp_registry.yaml "
        "(mcps: NAME: {command: ..., args: [...]} or {url: ...}), grant it in a directive with "
        '<execute resource="mcp" name="NAME" actions="TOOL"/>, and call it as NAME.TOOL'
    ),
}


def parse_manifest(text: str, path: str = "") -> tuple[ToolManifest, list[Problem]]:
    """Parse a tool manifest's YAML text; raise ItemInvalid with file:line problems."""
    problems: list[Problem] = []
    if len(text) > MAX_MANIFEST_BYTES:
        raise ItemInvalid([Problem(f"manifest is larger than {MAX_MANIFEST_BYTES:,} bytes", path)])
    _, body = split_signature(text)
    offset = 0 if body is text else 1
    try:
        data = yamltext.safe_load(body)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 + offset if mark else 0
        column = mark.column + 1 if mark else 0
        raise ItemInvalid(
            [Problem(f"malformed YAML: {getattr(exc, 'problem', exc)}", path, line, column)]
        ) from None
    if not isinstance(data, dict):
        raise ItemInvalid(
            [Problem("a tool manifest is a YAML mapping with tool_id, tool_type, executor, ...", path, 1, 1)]
        )
    if not data.get("tool_id"):
        raise ItemInvalid([Problem("manifest needs tool_id (e.g. tool_id: word_count)", path, 1, 1)])
    kind = data.get("tool_type") or (data.get("executor") or {}).get("type")
    if kind in _LEGACY_TYPES:
        problems.append(
            Problem(
                f"tool_type '{kind}' is the legacy name of '{_LEGACY_TYPES[kind]}'", path, 1, 1, "warning"
            )
        )
        kind = _LEGACY_TYPES[kind]
    if kind not in TOOL_TYPES:
        raise ItemInvalid(
            [
                Problem(
                    # (The runnable ones, and the one meant: README trial s39 was offered `mcp`, always refused.)
                    f"tool_type '{kind}' is unknown; expected one of "
                    f"{', '.join(t for t in TOOL_TYPES if t not in UNRUNNABLE_TYPES)}"
                    + (
                        f"; did you mean {near[0]}?"
                        if (near := difflib.get_close_matches(str(kind), TOOL_TYPES, n=1))
                        else ""
                    ),
                    path,
                    _line_of(body, "tool_type", offset),
                    1,
                )
            ]
        )
    data["tool_type"] = kind
    if kind == "mcp" and not data.get("executor"):
        data["executor"] = {"type": "mcp", **(data.get("config") or {})}
        if isinstance(data.get("metadata"), dict) and data["metadata"].get("mcp_server"):
            data["executor"].setdefault("server", data["metadata"]["mcp_server"])
    params = data.get("parameters") or []
    if isinstance(params, dict):
        params = [{"name": k, **(v if isinstance(v, dict) else {"type": v})} for k, v in params.items()]
    data["parameters"] = params
    problems += _isolation_problems(data, kind, path, _line_of(body, "isolation", offset))
    known = set(ToolManifest.model_fields)
    extra = {k: v for k, v in data.items() if k not in known}
    for key in extra:
        if key not in ("executor_id", "env_requirements", "created_at", "updated_at", "isolation"):
            problems.append(
                Problem(
                    f"unknown key '{key}' kept in metadata", path, _line_of(body, key, offset), 1, "warning"
                )
            )
    data = {k: v for k, v in data.items() if k in known}
    data.setdefault("metadata", {})
    if isinstance(data["metadata"], dict):
        data["metadata"].update(extra)
    if "version" in data:
        data["version"] = str(data["version"])
    if "created_at" in extra:
        data["metadata"]["created_at"] = str(extra["created_at"])
    try:
        manifest = ToolManifest(**data, path=path)
    except ValidationError as exc:
        first = exc.errors()[0]
        key = str(first["loc"][0]) if first["loc"] else ""
        raise ItemInvalid(
            [
                Problem(
                    f"'{'.'.join(map(str, first['loc']))}': {first['msg']}",
                    path,
                    _line_of(body, key, offset),
                    1,
                )
            ]
        ) from None
    if kind in ("python", "bash") and not manifest.entrypoint:
        problems.append(
            Problem(
                f"{kind} tool needs executor.entrypoint (e.g. main.py)",
                path,
                _line_of(body, "executor", offset),
                1,
            )
        )
    problems += [
        Problem(message, path, _line_of(body, "requires", offset), 1)
        for message in requirement_problems(manifest)
    ]
    problems += [
        Problem(message, path, _line_of(body, key, offset), 1) for key, message in _schema_problems(manifest)
    ]
    # (README trial s39: `version: banana` validated and signed, and only publish refused it.)
    if "version" in data and not _SEMVER.match(manifest.version):
        problems.append(
            Problem(
                f"version '{manifest.version}' is not semver (MAJOR.MINOR.PATCH, e.g. 1.0.0)",
                path,
                _line_of(body, "version", offset),
                1,
            )
        )
    entry = manifest.entrypoint
    # (A manifest read from its folder: a proposal's is parsed as a bare "tool.yaml", its files checked apart.)
    if kind in ("python", "bash") and entry and path and Path(path).parent.name and Path(path).is_file():
        # (README trial s39: `entrypoint: missing.py` validated, signed and published; a call then said the file
        # is missing.)
        if entry.startswith("/") or ".." in Path(entry).parts:
            problems.append(
                Problem(
                    f"executor.entrypoint '{entry}' leaves the tool's folder: name a file in it",
                    path,
                    _line_of(body, "executor", offset),
                    1,
                )
            )
        elif not (Path(path).parent / entry).is_file():
            problems.append(
                Problem(
                    f"executor.entrypoint '{entry}' is no file of the tool's folder ({Path(path).parent.name}/): "
                    "add it, or name the file the tool runs",
                    path,
                    _line_of(body, "executor", offset),
                    1,
                )
            )
    if kind in ("api", "docker"):
        try:
            if kind == "api":
                read_executor(manifest.executor, [p.name for p in manifest.parameters] or None)
            else:
                read_container_executor(manifest.executor)
        except ValueError as exc:
            problems.append(Problem(str(exc), path, _line_of(body, "executor", offset), 1))
    if problems and any(p.severity == "error" for p in problems):
        raise ItemInvalid(problems)
    return manifest, problems


JSON_TYPES = ("string", "integer", "number", "boolean", "array", "object")
_SEMVER = re.compile(r"^\d+\.\d+\.\d+(?:-[0-9A-Za-z.-]+)?(?:\+[0-9A-Za-z.-]+)?$")


def _schema_problems(manifest: ToolManifest) -> list[tuple[str, str]]:
    """(key, problem) for parameters no call could meet as written (README trial s39: `type: strng` was taken as a
    string, a default outside its enum, a name given twice, an input_schema requiring what it does not define:
    each validated, and every call failed or took what the author did not mean)."""
    found: list[tuple[str, str]] = []
    seen: set[str] = set()
    for parameter in manifest.parameters:
        name = parameter.name
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]*", name):
            found.append(
                (
                    "parameters",
                    f"parameter name '{name}' is no name an argument can have (letters, digits, _)",
                )
            )
        if name in seen:
            found.append(("parameters", f"parameter '{name}' is declared twice"))
        seen.add(name)
        if parameter.type not in JSON_TYPES:
            near = difflib.get_close_matches(parameter.type, JSON_TYPES, n=1)
            found.append(
                (
                    "parameters",
                    f"parameter '{name}' has type '{parameter.type}', which is no JSON type ("
                    + (f"did you mean {near[0]}?" if near else f"one of {', '.join(JSON_TYPES)}")
                    + ")",
                )
            )
        if (
            parameter.enum is not None
            and parameter.default is not None
            and parameter.default not in parameter.enum
        ):
            found.append(
                (
                    "parameters",
                    f"parameter '{name}' defaults to {parameter.default!r}, which is none of its enum",
                )
            )
    schema = manifest.input_schema
    if isinstance(schema, dict):
        properties = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
        for name in schema.get("required") or []:
            if name not in properties:
                found.append(
                    ("input_schema", f"input_schema requires '{name}', which its properties do not define")
                )
        for name, spec in properties.items():
            kind = spec.get("type") if isinstance(spec, dict) else None
            kinds = kind if isinstance(kind, list) else [kind] if kind is not None else []
            for one in kinds:
                if one not in (*JSON_TYPES, "null"):
                    near = difflib.get_close_matches(str(one), JSON_TYPES, n=1)
                    found.append(
                        (
                            "input_schema",
                            f"input_schema property '{name}' has type '{one}', which is no JSON type"
                            + (f" (did you mean {near[0]}?)" if near else ""),
                        )
                    )
    return found


ISOLATION_LEVELS = ("trusted", "standard", "sandboxed", "restricted")


def _isolation_problems(data: dict[str, Any], kind: str, path: str, line: int) -> list[Problem]:
    """The seed's ``isolation:`` level, taken at its word or refused: never a key that changes nothing."""
    level = data.get("isolation")
    if level is None:
        return []
    if level not in ISOLATION_LEVELS:
        return [
            Problem(
                f"isolation '{level}' is unknown; it is one of {', '.join(ISOLATION_LEVELS)}", path, line, 1
            )
        ]
    if level in ("sandboxed", "restricted") and kind != "docker":
        return [
            Problem(
                f"isolation: {level} needs a container, and Kiwi runs {kind} tools as child processes: make it a "
                "docker tool (tool_type: docker, which always runs without network, read-only, with limits)",
                path,
                line,
                1,
            )
        ]
    if level == "trusted":
        return [
            Problem(
                "isolation: trusted (in the main process) is not offered: Kiwi runs every tool in a child "
                "process, as 'standard'",
                path,
                line,
                1,
                "warning",
            )
        ]
    return []


def runnable_problems(manifest: ToolManifest) -> list[Problem]:
    """Why a parsed manifest names a tool no worker can run ([] when it can run)."""
    why = UNRUNNABLE_TYPES.get(manifest.tool_type)
    return [Problem(f"tool_type {manifest.tool_type}: {why}", manifest.path, 1, 1)] if why else []


def _line_of(text: str, key: str, offset: int) -> int:
    for number, line in enumerate(text.splitlines(), start=1):
        if line.startswith(f"{key}:"):
            return number + offset
    return 0


def legacy_script_manifest(path: Path) -> ToolManifest:
    """A generated manifest for a legacy ``.ai/scripts/NAME.py``: docstring and ``main()`` signature."""
    text = read_item_bytes(path).decode("utf-8")
    try:
        module = ast.parse(text)
    except SyntaxError as exc:
        raise ItemInvalid(
            [Problem(f"Python syntax error: {exc.msg}", str(path), exc.lineno or 0, exc.offset or 0)]
        ) from None
    params: list[ToolParameter] = []
    version = "0.0.0"
    for node in module.body:
        if isinstance(node, ast.FunctionDef) and node.name == "main":
            args = node.args.args
            defaults = [None] * (len(args) - len(node.args.defaults)) + list(node.args.defaults)
            for arg, default in zip(args, defaults, strict=True):
                annotation = ast.unparse(arg.annotation) if arg.annotation else "str"
                params.append(
                    ToolParameter(
                        name=arg.arg,
                        type=_PARAM_TYPES.get(annotation, "string"),
                        required=default is None,
                        default=ast.literal_eval(default) if isinstance(default, ast.Constant) else None,
                    )
                )
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Constant)
            and any(isinstance(t, ast.Name) and t.id == "__version__" for t in node.targets)
        ):
            version = str(node.value.value)
    doc = ast.get_docstring(module) or ""
    # .ai/scripts/scraping/maps.py is in category "scraping", as Kiwi MCP filed it.
    folders = path.parent.parts
    below = folders[len(folders) - folders[::-1].index("scripts") :] if "scripts" in folders else ()
    return ToolManifest(
        tool_id=path.stem,
        tool_type="python",
        version=version,
        category="/".join(below) or "scripts",
        description=doc.strip().splitlines()[0] if doc.strip() else "",
        parameters=params,
        executor={"type": "python", "entrypoint": path.name},
        legacy=True,
        path=str(path),
    )


def foreign_tool_file(rel: str) -> str | None:
    """Why a file beside a tool's ``tool.yaml`` (``rel``, relative to the tool's folder) may not be there,
    or None. The index takes every YAML file under ``.ai/tools`` for a manifest, so another one (quoted,
    flow-style or not, whatever its name) could declare a second tool and take over another tool's id; a
    hidden file is out of a reader's sight."""
    parts = rel.replace("\\", "/").split("/")
    if any(part.startswith(".") and part not in (".", "..") for part in parts):
        return "a hidden file"  # (a path leaving the folder is refused where it is written)
    if parts[-1].lower().endswith((".yaml", ".yml")):
        return "a second YAML file: the index would read it as a tool manifest; use JSON or another format"
    return None
