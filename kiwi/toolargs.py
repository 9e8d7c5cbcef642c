"""Tool arguments: the built-ins' schemas, checks of what an agent sends, and step parameters typed.

Pure, and imported by the workflow: nothing here does I/O, and nothing raises on any input but
:class:`ArgumentError`, so a wrong argument from an (untrusted) agent is a typed ``InputInvalid``
answer, never a failed workflow task.

- :func:`check_arguments` checks a call's arguments before anything is scheduled: the size of the
  whole argument object (every tool) and, for Kiwi's built-ins (``filesystem.*``, ``shell.run``,
  ``git.*``, ``directive.run``, ``kiwi-mcp.*``), each argument's type and range against
  :data:`BUILTIN_SCHEMAS`.
- :func:`coerce_step_arguments` types the literal text of a step's ``<param>`` values by the JSON
  Schema the tool declares (an MCP tool's ``inputSchema``, a local tool's manifest, a built-in's
  schema here). A parameter that is exactly one placeholder keeps the type of its value.
"""

from __future__ import annotations

import difflib
import json
import math
import re
from typing import Any

from kiwi.rules import rule_in_force

# Text a filesystem.write may carry: what the filesystem activities read and write at most, and
# far enough under Temporal's 2 MB payload limit that a call's update, activity input and audit
# record all fit.
MAX_CONTENT_BYTES = 1_000_000
# The JSON of one call's arguments, for every tool (the update that carries them and the activity
# input are Temporal payloads: 2 MB at most, warnings from 512 KB).
MAX_ARGUMENTS_BYTES = 1_500_000
MAX_SHELL_TIMEOUT = 3600.0
# A shell.run command's text (its argv's words, one separator each): the run checks every word, each
# path against its grants, in workflow code, on the worker's event loop. At 1.5 MB (the argument limit)
# that took 3 s, all other runs of the worker waiting; at this limit it takes under 0.1 s. Half of
# Linux's limit on one argument (128 KiB).
MAX_COMMAND_BYTES = 65_536

_STRING = {"type": "string"}
_PATHS = {"type": "array", "items": {"type": "string"}, "description": "paths relative to the project root"}
_ENCODING = {"type": "string", "enum": ["utf-8", "base64"]}


def _object(properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(required)}


_ITEM_TYPES = ("directive", "tool", "knowledge", "script")
# In a run Kiwi's meta-tools reach the run's project only ('local' is Kiwi MCP's name for it).
_SOURCES = ("project", "local")
_EXECUTE = _object(
    {
        "item_type": {"type": "string", "enum": ["directive", "tool", "script"]},
        "action": _STRING,
        "item_id": _STRING,
        "inputs": {"type": "object", "description": "a directive's inputs"},
        "parameters": {"type": "object", "description": "a tool's arguments, or a directive's inputs"},
        # Kiwi MCP's spellings: {"directive": NAME, "inputs": {...}}, {"tool_name": ID, "parameters": {...}}.
        "directive": _STRING,
        "tool_name": _STRING,
    }
)


BUILTIN_SCHEMAS: dict[str, dict[str, Any]] = {
    "filesystem.read": _object(
        {
            "path": _STRING,
            "encoding": _ENCODING,
            "max_bytes": {"type": "integer", "minimum": 1, "maximum": MAX_CONTENT_BYTES},
        },
        ("path",),
    ),
    "filesystem.write": _object(
        {
            "path": _STRING,
            "encoding": _ENCODING,
            "content": {"type": ["string", "number", "boolean"], "maxBytes": MAX_CONTENT_BYTES},
        },
        ("path",),
    ),
    "filesystem.list": _object({"path": _STRING, "encoding": _ENCODING}),
    "filesystem.create": _object({"path": _STRING, "encoding": _ENCODING}, ("path",)),
    "filesystem.delete": _object({"path": _STRING, "encoding": _ENCODING}, ("path",)),
    "filesystem.move": _object(
        {"source": _STRING, "destination": _STRING, "path": _STRING, "encoding": _ENCODING},
        ("source", "destination"),
    ),
    "shell.run": _object(
        {
            "command": _STRING,
            "argv": {"type": "array", "items": _STRING},
            "cwd": _STRING,
            "timeout": {
                "type": "number",
                "exclusiveMinimum": 0,
                "maximum": MAX_SHELL_TIMEOUT,
                "numericText": True,
            },
        }
    ),
    "git.status": _object({"paths": _PATHS, "message": _STRING}),
    "git.diff": _object({"paths": _PATHS, "message": _STRING}),
    "git.commit": _object({"paths": _PATHS, "message": _STRING}),
    "git.checkpoint": _object({"message": _STRING, "reason": _STRING}),
    "git.rollback": _object({"checkpoint": _STRING}),
    "directive.run": _object({"directive": _STRING, "name": _STRING, "inputs": {"type": "object"}}),
    # Kiwi's meta-tools in a run (kiwi-mcp grants); the front end's arguments, read-only or running only.
    "kiwi-mcp.search": _object(
        {
            "query": _STRING,
            "item_type": {"type": "string", "enum": list(_ITEM_TYPES)},
            "category": _STRING,
            "source": {"type": "string", "enum": list(_SOURCES)},
            "limit": {"type": "integer", "minimum": 1, "maximum": 100},
        },
        ("query",),
    ),
    "kiwi-mcp.load": _object(
        {
            "item_type": {"type": "string", "enum": list(_ITEM_TYPES)},
            "item_id": _STRING,
            "source": {"type": "string", "enum": list(_SOURCES)},
            # Kiwi MCP's spellings of item_type + item_id.
            "directive_name": _STRING,
            "tool_name": _STRING,
            "zettel_id": _STRING,
        }
    ),
    "kiwi-mcp.help": _object({"topic": _STRING}),
    "kiwi-mcp.execute": _EXECUTE,
    "kiwi-mcp.run": _EXECUTE,
}
_HINTS = {
    "filesystem.read": '{"path": "notes/a.md", "max_bytes": 10000}',
    "filesystem.write": '{"path": "notes/a.md", "content": "text", "encoding": "utf-8"}',
    "filesystem.list": '{"path": "notes"}',
    "filesystem.create": '{"path": "notes/new-folder"}',
    "filesystem.delete": '{"path": "notes/old.md"}',
    "filesystem.move": '{"source": "notes/a.md", "destination": "notes/b.md"}',
    "shell.run": '{"command": "pytest -q", "cwd": ".", "timeout": 120}',
    "git.commit": '{"message": "what changed", "paths": ["src/app.py"]}',
    "git.checkpoint": '{"message": "before the refactor"}',
    "git.rollback": '{"checkpoint": "RUN/1"}',
    "directive.run": '{"directive": "NAME", "inputs": {"key": "value"}}',
    "kiwi-mcp.search": '{"query": "deploy database", "item_type": "directive", "limit": 5}',
    "kiwi-mcp.load": '{"item_type": "knowledge", "item_id": "ZETTEL_ID"}',
    "kiwi-mcp.help": '{"topic": "permissions"}',
    "kiwi-mcp.execute": '{"item_type": "directive", "action": "run", "item_id": "NAME", "inputs": {}}',
    "kiwi-mcp.run": '{"directive": "NAME", "inputs": {"key": "value"}}',
}
_TYPE_NAMES = {
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "true or false",
    "array": "a JSON array",
    "object": "a JSON object",
    "null": "null",
}
_INTEGER = re.compile(r"[+-]?\d+")
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][\w-]*(?:\.[\w-]+)*)\}")  # the same rule as kiwi.templating


class ArgumentError(ValueError):
    """An argument that does not fit its tool: ``reason`` names it and what is wrong, ``hint`` what to send."""

    def __init__(self, reason: str, hint: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.hint = hint


# What each built-in does, as an agent reads it beside its input schema (a run's `local_tools`; README trial s36:
# shell.run's schema said nothing of command or argv, nor that no shell runs them).
BUILTIN_DESCRIPTIONS = {
    "filesystem.read": "Read a file of the project: 'path' relative to the project root; 'max_bytes' to read less. "
    "Answers its content (base64 for a file that is not UTF-8 text) and whether it was cut.",
    "filesystem.write": "Write a file of the project: 'path' relative to the project root, 'content' its whole text.",
    "filesystem.list": "List a folder of the project ('path', default the root).",
    "filesystem.create": "Make a folder of the project ('path').",
    "filesystem.delete": "Delete a file or an empty folder of the project ('path').",
    "filesystem.move": "Move or rename within the project: 'source' to 'destination'.",
    "shell.run": "Run one program, never through a shell: 'command', a string split into words as a shell "
    "splits them (pipes, redirections, ;, &&, $(...) refused), or 'argv', a list of strings; 'cwd' the "
    "folder relative to the project root (default the root); 'timeout' in seconds (default 120, at most "
    "3600). Answers exit_code, stdout, stderr and truncated; a non-zero exit is an answer, not an error.",
    "git.status": "The project's changed files the run may read ('paths' to narrow).",
    "git.diff": "The changes of files the run may read, against the last commit ('paths' to narrow).",
    "git.commit": "Commit the changes the run may write ('paths' to narrow, 'message').",
    "git.checkpoint": "Save the project's files as a checkpoint of this run ('message'); the user's branch and "
    "index stay as they are.",
    "git.rollback": "Make the files this run may write what they were at a checkpoint ('checkpoint', default the "
    "run's latest); what else changed is left as it is.",
    "directive.run": "Start a child run of another directive ('directive', 'inputs'); it gets no more than this "
    "run may do.",
    "kiwi-mcp.search": "Search the project's directives, tools and knowledge ('query', 'item_type').",
    "kiwi-mcp.load": "Load one of the project's items ('item_type', 'item_id').",
    "kiwi-mcp.help": "Kiwi's guidance on a topic ('topic').",
    "kiwi-mcp.execute": "Kiwi's execute inside this run, with this run's grants ('item_type', 'action', ...).",
    "kiwi-mcp.run": "The same as kiwi-mcp.execute.",
}


def check_arguments(tool: str, args: Any) -> ArgumentError | None:
    """What is wrong with ``args`` for ``tool`` (None when nothing is). Never raises."""
    example = _HINTS.get(tool, "")
    hint = f"send e.g. {example}" if example else ""
    if not isinstance(args, dict):
        return ArgumentError(
            f"{tool}: arguments must be a JSON object, got {json_kind(args)}",
            hint or 'send an object, e.g. {"name": "value"}',
        )
    problem = _builtin_problem(tool, args, hint) if tool in BUILTIN_SCHEMAS else None
    return problem or unsendable(tool, args)


def arguments_bytes(args: Any) -> int | None:
    """The bytes ``args`` take as JSON, or None when they cannot be written as JSON."""
    try:
        return _json_bytes(args)
    except (TypeError, ValueError, RecursionError):
        return None


_UTF8_JSON = json.JSONEncoder(ensure_ascii=False, default=str)  # (built once: see kiwi.guards.JSON_TEXT)


def _json_bytes(args: Any) -> int:
    return len(_UTF8_JSON.encode(args).encode("utf-8"))


def unsendable(tool: str, args: Any, size: int | None = None) -> ArgumentError | None:
    """Arguments no run can even be asked about: not an object, not JSON, or over the payload limit.
    ``size``: ``arguments_bytes(args)``, when the caller has it."""
    if not isinstance(args, dict):
        return check_arguments(tool, args)
    hint = f"send e.g. {_HINTS[tool]}" if tool in _HINTS else ""
    if size is None:
        try:
            size = _json_bytes(args)
        except (TypeError, ValueError, RecursionError) as exc:
            return ArgumentError(f"{tool}: arguments cannot be read as JSON: {exc}", hint)
    if size > MAX_ARGUMENTS_BYTES:
        specific = _builtin_problem(tool, args, hint) if tool in BUILTIN_SCHEMAS else None
        return specific or ArgumentError(
            f"{tool}: arguments are {size:,} bytes, over the limit of {MAX_ARGUMENTS_BYTES:,}",
            "send less per call (split the content over several calls or files)",
        )
    return None


def _builtin_problem(tool: str, args: dict[str, Any], hint: str) -> ArgumentError | None:
    schema = BUILTIN_SCHEMAS[tool]
    properties = schema["properties"]
    for name in schema.get("required", []):
        if args.get(name) is None:
            # (The argument sent for it, misspelt: README trial s36, `pth` went unnamed.)
            strays = [k for k in args if k not in properties and isinstance(k, str)]
            near = difflib.get_close_matches(name, strays, n=1, cutoff=0.6)
            sent = f" (got '{near[0]}': send it as '{name}')" if near else ""
            return ArgumentError(f"{tool}: argument '{name}' is required{sent}", hint)
    if tool == "shell.run" and args.get("command") is None and args.get("argv") is None:
        return ArgumentError(
            "shell.run: 'command' (a string) or 'argv' (a list of strings) is required", hint
        )
    if tool == "directive.run" and not isinstance(args.get("directive") or args.get("name"), str):
        return ArgumentError("directive.run: argument 'directive' (the directive's name) is required", hint)
    if tool in ("kiwi-mcp.search", "kiwi-mcp.load") and args.get("source") not in (None, *_SOURCES):
        return ArgumentError(
            f"{tool}: source {json.dumps(args['source'], default=str)} is not available inside a run: it reaches "
            "the run's project items only (source 'project')",
            "leave out 'source'; outside a run the front end's own search and load reach the user space and "
            "the registry",
        )
    if tool in ("kiwi-mcp.execute", "kiwi-mcp.run"):
        problem = _execute_problem(tool, args)
        if problem:
            return ArgumentError(problem, hint)
    if tool == "kiwi-mcp.load" and not any(
        isinstance(args.get(k), str) and args[k]
        for k in ("item_id", "directive_name", "tool_name", "zettel_id")
    ):
        return ArgumentError("kiwi-mcp.load: argument 'item_id' (with 'item_type') is required", hint)
    if tool == "kiwi-mcp.load" and args.get("item_id") and not args.get("item_type"):
        return ArgumentError(
            "kiwi-mcp.load: argument 'item_type' (directive, tool or knowledge) is required", hint
        )
    for name, spec in properties.items():
        if name in args and args[name] is not None:
            problem = _problem(args[name], spec)
            if problem:
                return ArgumentError(f"{tool}: argument '{name}' {problem}", hint)
    named = args.get("checkpoint")
    if (
        tool == "git.rollback"
        and isinstance(named, str)
        and named
        and checkpoint_label(named) is None
        and rule_in_force(ROLLBACK_SHAPE)
    ):
        return ArgumentError(
            f"git.rollback: '{named}' is not a Kiwi checkpoint",
            f"name one the run's status lists (RUN/N, or {CHECKPOINT_REFS}/RUN/N), or none for the run's latest",
        )
    if (
        not tool.startswith("kiwi-mcp.")
        and (stray := stray_argument(tool, list(properties), args))
        and rule_in_force(ARGS_CLOSED)
    ):
        return ArgumentError(stray.reason, "; ".join(h for h in (stray.hint, hint) if h))
    return None


# Since session 34: an argument Kiwi's own built-ins (filesystem.*, shell.run, git.*, directive.run) do not
# take is refused when the call is admitted. It was dropped: filesystem.write with a misspelt `contnet` wrote an
# empty file (review s33). Kiwi's meta-tools (kiwi-mcp.*) keep taking Kiwi MCP's other arguments (`sort_by`,
# `sections`, `project_path`), which they ignore. With it filesystem.read takes `max_bytes` (README trial s34: the
# README and a step's hint named it, and the run dropped it, reading the whole file).
ARGS_CLOSED = "kiwi-builtin-args-closed-s34"


def stray_argument(
    tool: str, names: list[str], args: dict[str, Any], homes: dict[str, str] | None = None
) -> ArgumentError | None:
    """The first of ``args`` that is none of ``names`` (the arguments ``tool`` takes), with where it goes: its
    entry in ``homes`` (another tool's name for one of ``names``), else the closest of ``names``. None when
    every argument is one of them."""
    stray = [key for key in args if key not in names]
    if not stray:
        return None
    key = stray[0]
    home = (homes or {}).get(key)
    if home not in names:
        close = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
        home = close[0] if close else None
    shown = key if len(key) <= 64 and not CONTROL_CHARACTERS.search(key) else "(unreadable name)"
    return ArgumentError(
        f"{tool} has no argument '{shown}'"
        + (f" (and {len(stray) - 1} more)" if len(stray) > 1 else "")
        + f"; it takes {', '.join(names)}",
        f"send it as '{home}'" if home else "leave it out",
    )


def unfit_parameters(schema: dict[str, Any] | None, params: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The names in ``params`` that a local tool's input ``schema`` does not take, and the required names it
    lacks (null counts as none), both sorted; nothing for a schema that declares no parameters (the tool takes
    what it is given). The worker refuses such a call before the tool runs, and ``kiwi validate`` names a
    step's (README trial s34: a stray ``txt`` for word_count validated, and the run failed at that step)."""
    schema = schema or {}
    declared = schema.get("properties")
    if not isinstance(declared, dict) or not declared:
        return [], []
    unknown = sorted(set(params) - set(declared)) if schema.get("additionalProperties") is not True else []
    missing = sorted(n for n in schema.get("required") or [] if params.get(n) is None)
    return unknown, missing


CHECKPOINT_REFS = "refs/kiwi/checkpoints"
# A checkpoint's label: the run's id and its number (workflows/directive_run/calls.py, _checkpoint).
_CHECKPOINT_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,200}/[1-9][0-9]{0,9}")
# Since session 33: git.rollback of a name that is no checkpoint's (refs/heads/B, main~1) is refused when the
# call is admitted, before it asks a human to approve a call that can only fail (README trial s33).
ROLLBACK_SHAPE = "kiwi-rollback-shape-s33"


def checkpoint_label(name: str) -> str | None:
    """The label (RUN/N) of a checkpoint named ``RUN/N`` or ``refs/kiwi/checkpoints/RUN/N``; None for any
    other name (a branch, a revision, a path: a rollback reaches checkpoints only)."""
    label = name.removeprefix(f"{CHECKPOINT_REFS}/")
    return label if _CHECKPOINT_LABEL.fullmatch(label) and ".." not in label else None


def oversized_command(tool: str, args: Any) -> ArgumentError | None:
    """A shell.run command over MAX_COMMAND_BYTES, called directly or through kiwi-mcp.execute; else None.

    Refused where the call is sent (kiwi.runs) and by the run's update validator, never by the run's
    admission: a validator does not run again when a run's history is replayed, so runs that took a longer
    command before the limit replay as they ran."""
    inner, inner_args = inner_call(tool, args)
    if inner != "shell.run" or (size := command_bytes(inner_args)) <= MAX_COMMAND_BYTES:
        return None
    return ArgumentError(
        f"shell.run: the command is {size:,} bytes, over the limit of {MAX_COMMAND_BYTES:,}: the run checks "
        "each of its words against its grants before the command runs",
        "name fewer paths per command (several calls), or write long text to a file and name the file",
    )


def command_bytes(args: dict[str, Any]) -> int:
    """The UTF-8 bytes of a shell.run call's command (``argv``: its words, one separator each)."""
    argv = args.get("argv")
    if isinstance(argv, list):
        return sum(len(a.encode("utf-8", "surrogatepass")) + 1 for a in argv if isinstance(a, str))
    command = args.get("command")
    return len(command.encode("utf-8", "surrogatepass")) if isinstance(command, str) else 0


def kiwi_execute_target(args: dict[str, Any]) -> tuple[str, str, dict[str, Any]]:
    """What a kiwi-mcp.execute call asks for: (``directive`` or ``tool``, its id, inputs or parameters).

    Kiwi's own form is ``{"item_type", "action", "item_id", "inputs"|"parameters"}``; Kiwi MCP's are
    ``{"directive": NAME, "inputs": ...}`` and ``{"tool_name": ID, "parameters": ...}``.
    """
    kind = str(args.get("item_type") or "")
    if not kind:
        kind = "tool" if args.get("tool_name") else "directive"
    kind = "tool" if kind == "script" else kind
    item_id = args.get("item_id") or (args.get("tool_name") if kind == "tool" else args.get("directive"))
    values = args.get("parameters") if kind == "tool" else args.get("inputs", args.get("parameters"))
    return kind, item_id if isinstance(item_id, str) else "", values if isinstance(values, dict) else {}


def inner_call(tool: str, args: Any) -> tuple[str, dict[str, Any]]:
    """The call a kiwi-mcp.execute (or .run) call makes, as the run admits it (the tool and its arguments,
    or ``directive.run`` for a directive): what its approval request names. Other calls: themselves."""
    from kiwi.policy import KIWI_MCP_ACTIONS

    args = args if isinstance(args, dict) else {}
    if KIWI_MCP_ACTIONS.get(tool) != "execute":
        return tool, args
    kind, item_id, values = kiwi_execute_target(args)
    if kind == "directive":
        return "directive.run", {"directive": item_id, "inputs": values}
    return item_id, values


def _execute_problem(tool: str, args: dict[str, Any]) -> str:
    kind, item_id, _ = kiwi_execute_target(args)
    if not item_id:
        what = "the tool's id" if kind == "tool" else "the directive's name"
        return f"{tool}: argument 'item_id' ({what}) is required"
    if kind == "tool" and item_id.startswith("kiwi-mcp."):
        return f"{tool}: {item_id} is called directly, not through {tool}"
    return ""


def shape_problem(value: Any, spec: Any) -> str:
    """Why ``value`` is not of the shape a local tool's parameter ``spec`` declares: an object or array where
    it takes neither, or a plain value where it takes only those ('' when it fits). Numbers and strings stand
    in for each other here: a tool reads its own text (review s33: {"text": {"a": 1}} reached word_count's
    main(), whose traceback was the answer)."""
    types = _types(spec)
    if not types:
        return ""
    fits = (
        any(t in ("object", "array") for t in types)
        if isinstance(value, dict | list)
        else any(t not in ("object", "array") for t in types)
    )
    if fits and isinstance(value, dict | list):
        fits = any(_is(value, t, spec) for t in types)
    return (
        "" if fits else f"must be {' or '.join(_TYPE_NAMES.get(t, t) for t in types)}, got {json_kind(value)}"
    )


def _problem(value: Any, spec: dict[str, Any]) -> str:
    """Why ``value`` does not fit ``spec`` (a JSON Schema subset), or ''."""
    types = _types(spec)
    if types and not any(_is(value, t, spec) for t in types):
        return f"must be {' or '.join(_TYPE_NAMES.get(t, t) for t in types)}, got {json_kind(value)}"
    if "enum" in spec and value not in spec["enum"]:
        return f"must be one of {', '.join(json.dumps(v) for v in spec['enum'])}, got {json.dumps(value, default=str)}"
    if isinstance(value, list) and isinstance(spec.get("items"), dict):
        for index, item in enumerate(value):
            problem = _problem(item, spec["items"])
            if problem:
                return f"item {index} {problem}"
    if "maxBytes" in spec:
        size = len(str(value).encode("utf-8"))
        if size > spec["maxBytes"]:
            return f"is {size:,} bytes, over the limit of {spec['maxBytes']:,} bytes per call"
    if ("number" in types or "integer" in types) and not isinstance(value, bool):
        number = _number(value)
        if number is not None:
            if not math.isfinite(number):
                return f"must be a finite number, got {value!r}"
            low, high = spec.get("exclusiveMinimum"), spec.get("maximum")
            if low is not None and number <= low:
                return f"must be more than {_shown(low)}, got {_shown(number)}"
            if spec.get("minimum") is not None and number < spec["minimum"]:
                return f"must be at least {_shown(spec['minimum'])}, got {_shown(number)}"
            if high is not None and number > high:
                return f"must be at most {_shown(high)}, got {_shown(number)}"
    return ""


def _shown(number: float) -> str:
    """A number as a message shows it: whole ones whole (`1000001`, where `:g` wrote `1e+06`, trial s34)."""
    return str(int(number)) if float(number).is_integer() and abs(number) < 1e18 else f"{number:g}"


def _is(value: Any, kind: str, spec: dict[str, Any]) -> bool:
    if kind == "string":
        return isinstance(value, str)
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        if isinstance(value, bool):
            return False
        return isinstance(value, (int, float)) or (
            bool(spec.get("numericText")) and _number(value) is not None
        )
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "array":
        return isinstance(value, list)
    if kind == "object":
        return isinstance(value, dict)
    if kind == "null":
        return value is None
    return True


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            return None
    return None


def _types(spec: Any) -> list[str]:
    """The JSON types ``spec`` allows ([] = any): ``type`` as a name or list, or the branches of anyOf/oneOf."""
    if not isinstance(spec, dict):
        return []
    kind = spec.get("type")
    if isinstance(kind, str):
        return [kind]
    if isinstance(kind, list):
        return [k for k in kind if isinstance(k, str)]
    branches = spec.get("anyOf") or spec.get("oneOf")
    if isinstance(branches, list):
        found: list[str] = []
        for branch in branches:
            sub = _types(branch)
            if not sub:
                return []
            found += [k for k in sub if k not in found]
        return found
    return []


# Control characters no id, search word or item text holds (a tab, a newline and a carriage return aside).
CONTROL_CHARACTERS = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def json_kind(value: Any) -> str:
    """A JSON value as an error message names it: the text 'x', the number 5, true, null, an array, an object."""
    if isinstance(value, str):
        shown = value if len(value) <= 40 else value[:40] + "…"
        return f"the text {shown!r}"
    if isinstance(value, bool):
        return json.dumps(value)
    if value is None:
        return "null"
    if isinstance(value, (int, float)):
        return f"the number {value!r}"
    return {list: "an array", dict: "an object"}.get(type(value), type(value).__name__)


def coerce_value(text: str, spec: Any) -> Any:
    """``text`` as the type ``spec`` declares; raises ValueError saying what was expected.

    Text stays text when the schema allows a string (or says nothing). Otherwise: integers,
    numbers, ``true``/``false``, ``null``, and a JSON array or object written as text.
    """
    types = _types(spec)
    if not types or "string" in types:
        if isinstance(spec, dict) and "enum" in spec and types == ["string"] and text not in spec["enum"]:
            raise ValueError(f"must be one of {', '.join(json.dumps(v) for v in spec['enum'])}, got {text!r}")
        return text
    stripped = text.strip()
    for kind in types:
        if kind == "integer" and _INTEGER.fullmatch(stripped):
            return int(stripped)
        if kind == "number":
            number = _number(stripped)
            if number is not None and math.isfinite(number):
                return int(stripped) if _INTEGER.fullmatch(stripped) else number
        if kind == "boolean" and stripped.lower() in ("true", "false"):
            return stripped.lower() == "true"
        if kind == "null" and stripped == "null":
            return None
        if kind in ("array", "object"):
            try:
                parsed = json.loads(stripped)
            except (json.JSONDecodeError, RecursionError):
                continue
            if isinstance(parsed, list if kind == "array" else dict):
                return parsed
    expected = " or ".join(_TYPE_NAMES.get(k, k) for k in types)
    return _raise(f"must be {expected}, got {json_kind(text)}")


def _raise(message: str) -> Any:
    raise ValueError(message)


def coerce_step_arguments(
    tool: str, raw: dict[str, Any], rendered: dict[str, Any], schema: dict[str, Any] | None
) -> dict[str, Any]:
    """A step's rendered ``<param>`` values typed by ``schema`` (the tool's JSON Schema for its input).

    ``raw`` is the step's text before templating: a parameter that was exactly one placeholder
    keeps its value's type. Raises :class:`ArgumentError` naming the first parameter that does not fit.
    """
    properties = schema.get("properties") if isinstance(schema, dict) else None
    if not isinstance(properties, dict):
        return rendered
    typed = dict(rendered)
    for name, value in rendered.items():
        before = raw.get(name)
        if not isinstance(value, str) or (isinstance(before, str) and _PLACEHOLDER.fullmatch(before)):
            continue
        spec = properties.get(name)
        if spec is None:
            continue
        try:
            typed[name] = coerce_value(value, spec)
        except ValueError as exc:
            raise ArgumentError(
                f"{tool}: parameter '{name}' {exc}", f'write <param name="{name}"> as {_describe(spec)}'
            ) from None
    return typed


def _describe(spec: Any) -> str:
    types = _types(spec)
    examples = {
        "integer": "a whole number, e.g. 3",
        "number": "a number, e.g. 2.5",
        "boolean": "true or false",
        "array": 'a JSON array, e.g. ["a", "b"]',
        "object": 'a JSON object, e.g. {"key": "value"}',
        "null": "null",
        "string": "text",
    }
    if isinstance(spec, dict) and "enum" in spec:
        return "one of " + ", ".join(json.dumps(v) for v in spec["enum"])
    return " or ".join(examples.get(t, t) for t in types) or "text"
