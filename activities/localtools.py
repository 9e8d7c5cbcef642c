"""Local tools' parameters checked and typed by the worker, and their requirements (secrets) read."""

from __future__ import annotations

import json
import os
import shutil
import sys
from typing import Any

from activities.process import child_env
from kiwi.contracts import LocalToolSpec
from kiwi.errors import CommandNotFound, InputInvalid, SecretMissing, ToolFailed
from kiwi.toolargs import coerce_value, shape_problem, unfit_parameters
from kiwi.upstream.pool import remember_secrets
from kiwi.upstream.registry import first_own, lookup_secret


def _check_parameters(tool: LocalToolSpec, params: dict[str, Any]) -> None:
    """The call's arguments against the manifest's parameters, before the tool runs: a name the tool does not
    take, or a required one missing, ended in the tool's own traceback (a TypeError from its main())."""
    schema = tool.input_schema or {}
    declared = schema.get("properties")
    if not isinstance(declared, dict) or not declared:
        return  # (no parameters declared: the tool takes what it is given)
    # (null for a required one is none: `{"text": null}` reached main(), whose traceback was the answer.)
    unknown, missing = unfit_parameters(schema, params)
    shapes = [
        f"'{n}' {problem}"
        for n, value in sorted(params.items())
        if n in declared and (problem := shape_problem(value, declared[n]))
    ]
    if unknown or missing or shapes:
        takes = ", ".join(sorted(declared))
        problems = [f"'{n}' is not a parameter of tool '{tool.tool_id}'" for n in unknown]
        problems += [f"'{n}' is required" for n in missing]
        problems += shapes
        named = [n for n in schema.get("required") or [] if n in declared] or sorted(declared)[:3]
        shape = ", ".join(f'"{n}": ...' for n in named)
        raise InputInvalid.error(
            "; ".join(problems) + f" (it takes: {takes})",
            {
                "hint": f"send {{{shape}}}; load(item_type='tool', item_id='{tool.tool_id}') shows its parameters "
                "and their types"
            },
        )


def typed_parameters(tool: LocalToolSpec, params: dict[str, Any]) -> dict[str, Any]:
    """The call's arguments as the manifest types them, where a number, true/false and text stand in for one
    another (shape_problem lets them): a number or true/false for a `string` parameter as its JSON text (`5` as
    "5"), text for a number, integer or boolean parameter as that value when it reads as one ("3" as 3). README
    trial s34: `{"text": 5}` reached word_count's main() as an int, and its traceback was the answer."""
    declared = (tool.input_schema or {}).get("properties")
    if not isinstance(declared, dict):
        return params
    typed = dict(params)
    for name, value in params.items():
        spec = declared.get(name)
        kinds = spec.get("type") if isinstance(spec, dict) else None
        kinds = [kinds] if isinstance(kinds, str) else list(kinds or [])
        if not kinds or value is None or isinstance(value, dict | list):
            continue
        problem = ""
        if isinstance(value, bool | int | float) and kinds == ["string"]:
            typed[name] = json.dumps(value)
        elif isinstance(value, str) and "string" not in kinds:
            try:
                typed[name] = coerce_value(value, spec)
            except ValueError as exc:
                problem = str(exc)  # (trial s34 (2): "many" for an integer reached main() as text)
        elif kinds == ["integer"] and isinstance(value, float):
            if value.is_integer():
                typed[name] = int(value)
            else:
                problem = f"must be an integer, got the number {value!r}"
        elif kinds == ["boolean"] and not isinstance(value, bool):
            if value in (0, 1):
                typed[name] = bool(value)
            else:
                problem = f"must be true or false, got the number {value!r}"
        if problem:
            raise InputInvalid.error(
                f"'{name}' {problem} (tool '{tool.tool_id}')",
                {
                    "hint": f"load(item_type='tool', item_id='{tool.tool_id}') shows its parameters and their types"
                },
            )
    return typed


def _check_requirements(tool: LocalToolSpec) -> dict[str, str]:
    """Check a tool's ``requires`` before it runs; the declared environment variables, to pass to it.

    A missing program or variable is an error naming each one, instead of the tool failing halfway.
    The values are remembered as secrets, so they are scrubbed from what the tool returns.
    """
    if tool.required_python:
        from packaging.specifiers import SpecifierSet

        running = ".".join(map(str, sys.version_info[:3]))
        if running not in SpecifierSet(tool.required_python):
            raise ToolFailed.error(
                f"tool '{tool.tool_id}' requires Python {tool.required_python}; the worker runs {running}",
                {"hint": "run a worker on a Python that fits, or change requires.python"},
            )
    path = child_env().get("PATH", os.defpath)
    missing = [c for c in tool.required_commands if shutil.which(c, path=path) is None]
    if missing:
        raise CommandNotFound.error(
            f"tool '{tool.tool_id}' requires {', '.join(missing)}, not found on the worker's PATH",
            {
                "hint": "install "
                + " and ".join(missing)
                + " where the worker runs, or change requires.commands"
            },
        )
    values = {name: lookup_secret(name) for name in tool.required_environment}
    unset = [name for name, value in values.items() if value is None]
    if refused := first_own(unset):
        raise SecretMissing.error(
            f"tool '{tool.tool_id}' requires a variable it may not have", {"hint": refused}
        )
    if unset:
        raise SecretMissing.error(
            f"tool '{tool.tool_id}' requires the environment variable{'s' if len(unset) > 1 else ''} "
            f"{', '.join(unset)}, not set in the worker's environment",
            {"hint": "export " + " ".join(f"{n}=..." for n in unset) + " where the worker runs"},
        )
    passed = {name: value for name, value in values.items() if value is not None}
    remember_secrets(passed)
    return passed
