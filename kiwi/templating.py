"""``{input}`` and ``{steps.NAME.outputs.KEY}`` placeholders, and typed inputs.

Pure: used by the parser for validation and by the workflow to bind tool calls.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from typing import Any

from kiwi.errors import InputInvalid
from kiwi.toolargs import json_kind

PLACEHOLDER = re.compile(r"\{([A-Za-z_][\w-]*(?:\.[\w-]+)*)\}")
_MISSING = object()


class TemplateError(ValueError):
    """A placeholder names a value the run does not have (yet); ``ref`` is the placeholder's name."""

    def __init__(self, message: str, ref: str = "") -> None:
        super().__init__(message)
        self.ref = ref


def unset_input(exc: TemplateError, inputs: list[Any]) -> str:
    """``exc`` said of an optional input that was not given and has no default (``inputs``: the directive's
    InputSpecs), with the two fixes; '' for any other placeholder. README trial s34: "no input is called 'ratio'"
    was said of a declared input."""
    name = exc.ref.removeprefix("inputs.").split(".")[0]
    spec = next((i for i in inputs if i.name == name), None)
    if spec is None or spec.required or spec.default is not None:
        return ""
    return (
        f"{{{exc.ref}}} has no value: the optional input '{name}' was not given and has no default; pass it "
        f'(--input {name}=..., or in parameters) or give it one: <input name="{name}" ... default="...">'
    )


def placeholders(value: Any) -> list[str]:
    """Every placeholder name in ``value`` (strings, lists and dicts are searched)."""
    if isinstance(value, str):
        return PLACEHOLDER.findall(value)
    if isinstance(value, dict):
        return [ref for v in value.values() for ref in placeholders(v)]
    if isinstance(value, list):
        return [ref for v in value for ref in placeholders(v)]
    return []


def lookup(ref: str, context: dict[str, Any]) -> Any:
    """Resolve a dotted reference against ``{"inputs": ..., "steps": ...}``; raise if absent."""
    parts = ref.split(".")
    if parts[0] == "inputs" and len(parts) > 1:
        node: Any = context.get("inputs", {})
        parts = parts[1:]
    elif parts[0] == "steps":
        node = context
    elif parts[0] in context.get("inputs", {}):
        node = context["inputs"]
    elif parts[0] in context.get("steps", {}):
        # "{step.key}" is shorthand for "{steps.step.outputs.key}".
        node = context["steps"][parts[0]].get("outputs", {})
        parts = parts[1:]
    else:
        raise TemplateError(f"{{{ref}}} has no value: no input or completed step is called '{parts[0]}'", ref)
    for part in parts:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise TemplateError(f"{{{ref}}} has no value ('{part}' is missing)", ref)
    return node


def render(value: Any, context: dict[str, Any]) -> Any:
    """Substitute placeholders; a string that is exactly one placeholder keeps the value's type."""
    if isinstance(value, dict):
        return {k: render(v, context) for k, v in value.items()}
    if isinstance(value, list):
        return [render(v, context) for v in value]
    if not isinstance(value, str):
        return value
    whole = PLACEHOLDER.fullmatch(value)
    if whole:
        return lookup(whole.group(1), context)

    def one(match: re.Match[str]) -> str:
        found = lookup(match.group(1), context)
        return found if isinstance(found, str) else json.dumps(found)

    return PLACEHOLDER.sub(one, value)


def command_words(tool: str, params: dict[str, Any], context: dict[str, Any]) -> list[str] | None:
    """A step's ``shell.run`` ``command`` with placeholders, split into the words the directive wrote and each
    rendered by itself: a value is part of one word, never more words (README trial s36: an input
    ``src/fruits.txt -o notes/pwn.txt`` into ``sort {file}`` gave sort an option the directive never wrote). A
    word that is exactly one placeholder of an ``array`` input is its items, a word each; any other list is one
    word.
    None for another call, a command without a placeholder, or one that cannot be split."""
    template = params.get("command")
    if (
        tool != "shell.run"
        or "argv" in params
        or not isinstance(template, str)
        or not PLACEHOLDER.search(template)
    ):
        return None
    try:
        words = shlex.split(template)
    except ValueError:
        return None
    out: list[str] = []
    for word in words:
        value = render(word, context)
        whole = PLACEHOLDER.fullmatch(word)
        if isinstance(value, list) and whole and _an_input(whole.group(1), context):
            # (A word that is one placeholder of an array input is its items, a word each: the way to pass many.
            # Only an input's: a list an agent's step outputs is one word, review s36, second round: outputs
            # ["-o", "notes/important.md", ...] gave `sort {steps.pick.outputs.file}` an option.)
            out += [item if isinstance(item, str) else json.dumps(item) for item in value]
        else:
            out.append(value if isinstance(value, str) else json.dumps(value))
    return out


def _an_input(ref: str, context: dict[str, Any]) -> bool:
    """Whether the placeholder ``ref`` names one of the run's inputs (typed when the run started), as lookup reads it."""
    head = ref.split(".")[0]
    return (head == "inputs" and "." in ref) or (head != "steps" and head in context.get("inputs", {}))


def coerce_input(kind: str, value: Any) -> Any:
    """Convert ``value`` (a CLI string or a JSON value) to the declared input type, or raise ValueError."""
    if kind == "string":
        if isinstance(value, (dict, list)):
            raise ValueError(f"expected a string, got {json_kind(value)}")
        return value if isinstance(value, str) else json.dumps(value)
    if kind == "boolean":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in ("true", "false", "yes", "no", "1", "0"):
            return value.strip().lower() in ("true", "yes", "1")
        raise ValueError(f"expected a boolean (true/false), got {json_kind(value)}")
    if kind == "integer":
        if isinstance(value, bool):
            raise ValueError(f"expected an integer, got {json_kind(value)}")
        if isinstance(value, int):
            return value
        if isinstance(value, str) and re.fullmatch(r"[+-]?\d+", value.strip()):
            return int(value)
        raise ValueError(f"expected an integer, got {json_kind(value)}")
    if kind == "number":
        if isinstance(value, bool):
            raise ValueError(f"expected a number, got {json_kind(value)}")
        try:
            number = (
                value
                if isinstance(value, (int, float))
                else float(value)
                if "." in str(value) or "e" in str(value).lower()
                else int(value)
            )
        except (TypeError, ValueError):
            raise ValueError(f"expected a number, got {json_kind(value)}") from None
        if isinstance(number, float) and not math.isfinite(number):
            # (1e400 is inf, which JSON writes as null: the run took the input as missing. README trial s34.)
            raise ValueError(f"expected a finite number, got {json_kind(value)}")
        return number
    if kind in ("array", "object"):
        expected = list if kind == "array" else dict
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                if kind == "array":
                    value = [v.strip() for v in value.split(",") if v.strip()]
                else:
                    raise ValueError(f"expected a JSON object, got {json_kind(value)}") from None
        if not isinstance(value, expected):
            raise ValueError(
                f"expected {'a JSON array' if kind == 'array' else 'a JSON object'}, got {json_kind(value)}"
            )
        return value
    raise ValueError(f"unknown type {kind!r}")


def bind_inputs(directive: Any, raw: dict[str, Any]) -> dict[str, Any]:
    """Check and type a run's inputs against the directive's ``<inputs>``; raise InputInvalid listing all problems."""
    problems: list[str] = []
    bound: dict[str, Any] = {}
    declared = {spec.name: spec for spec in directive.inputs}
    for name in raw:
        if name not in declared:
            problems.append(f"unknown input '{name}' (declared: {', '.join(declared) or 'none'})")
    for name, spec in declared.items():
        if name in raw and raw[name] is not None:
            try:
                bound[name] = coerce_input(spec.type, raw[name])
            except ValueError as exc:
                problems.append(f"input '{name}' ({spec.type}): {exc}")
        elif spec.default is not None:
            bound[name] = spec.default
        elif spec.required:
            problems.append(f"required input '{name}' ({spec.type}) is missing")
    if problems:
        raise InputInvalid(
            f"directive '{directive.name}': " + "; ".join(problems),
            hint="pass inputs as --input name=value (CLI) or in 'parameters' (MCP)",
        )
    return bound
