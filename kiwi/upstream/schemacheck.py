"""An upstream answer's ``structuredContent`` checked against its tool's ``outputSchema`` in bounded time.

The MCP SDK checks it with jsonschema as it is, on the worker's event loop: a schema's ``pattern`` runs on
Python's ``re``, which backtracks (a hostile server's ``^(a+)+$`` against 27 characters held the loop, and
every run of the worker, for 10 s; 40 characters would be hours), ``uniqueItems`` over objects compares
every pair, and nested ``anyOf`` over nested data multiplies. Here the same check has a deadline,
CHECK_SECONDS for the whole answer: every keyword looks at it before it works, patterns run on the
``regex`` module with what is left of it as their timeout, and unique items are compared by their
canonical JSON, in linear time. An answer not checked by then fails as an answer that does not fit does.
``unevaluatedProperties`` and ``unevaluatedItems`` are not checked (jsonschema matches patterns for them where
no deadline reaches).

The server writes both the schema and the answer, so the check is about a server's mistakes, not its
intent; what must hold against a hostile one is the worker's time.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import regex
from jsonschema import SchemaError, ValidationError
from jsonschema.validators import extend, validator_for
from referencing import Registry

CHECK_SECONDS = 1.0
# (A pattern's own timeout is never shorter: the regex module looks at the clock every so many steps.)
MIN_PATTERN_SECONDS = 0.001

_deadline = [0.0]  # (checks run whole, without awaiting: one at a time on the loop)


class CheckTooSlow(RuntimeError):
    """The answer was not checked against its output schema within CHECK_SECONDS."""


def output_validator(name: str, output_schema: dict[str, Any]) -> Any:
    """What the SDK's ``ClientSession._output_schema_validator`` returns, bounded (see the module)."""
    base = validator_for(output_schema)
    try:
        base.check_schema(output_schema)
    except SchemaError as exc:
        raise RuntimeError(f"Invalid schema for tool {name}: {exc}") from None
    keywords: dict[str, Callable[..., Any]] = {
        keyword: _in_time(check, name) for keyword, check in base.VALIDATORS.items()
    }
    for keyword, check in (
        ("pattern", _pattern),
        ("patternProperties", _pattern_properties),
        ("additionalProperties", _additional_properties),
        ("uniqueItems", _unique_items),
    ):
        if keyword in keywords:
            keywords[keyword] = _in_time(check, name)
    for keyword in ("unevaluatedProperties", "unevaluatedItems"):
        # Not checked: jsonschema works out what is "evaluated" with Python's re over patternProperties,
        # outside any keyword this module can bound (`^(a+)+$` against 28 characters: 8 s; second s18 review).
        if keyword in keywords:
            keywords[keyword] = _unchecked
    bounded = extend(base, keywords)
    return _Timed(bounded(output_schema, registry=Registry()), name)


class _Timed:
    """Starts the deadline when the SDK asks for the answer's errors."""

    def __init__(self, validator: Any, name: str) -> None:
        self.validator, self.name = validator, name

    def iter_errors(self, instance: Any) -> Iterator[ValidationError]:
        _deadline[0] = time.monotonic() + CHECK_SECONDS
        return self.validator.iter_errors(instance)


def _in_time(check: Callable[..., Any], name: str) -> Callable[..., Iterator[ValidationError]]:
    def keyword(validator: Any, value: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
        if time.monotonic() > _deadline[0]:
            raise CheckTooSlow(
                f"tool {name}'s structuredContent was not checked against its outputSchema within "
                f"{CHECK_SECONDS:g}s; the answer is refused"
            )
        errors = check(validator, value, instance, schema)
        if errors:
            yield from errors

    return keyword


def _unchecked(validator: Any, value: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
    return iter(())


def _search(pattern: str, text: str) -> bool:
    left = max(MIN_PATTERN_SECONDS, _deadline[0] - time.monotonic())
    try:
        return regex.search(pattern, text, timeout=left) is not None
    except TimeoutError:
        raise CheckTooSlow(
            f"a pattern of the outputSchema ({pattern[:80]!r}) took more than {CHECK_SECONDS:g}s to match "
            "the server's answer; the answer is refused"
        ) from None


def _pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if validator.is_type(instance, "string") and not _search(pattern, instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


def _pattern_properties(
    validator: Any, patterns: Any, instance: Any, schema: Any
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            if _search(pattern, key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _additional_properties(
    validator: Any, allowed: Any, instance: Any, schema: Any
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    properties = schema.get("properties", {})
    patterns = "|".join(schema.get("patternProperties", {}))
    extras = [k for k in instance if k not in properties and not (patterns and _search(patterns, k))]
    if validator.is_type(allowed, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], allowed, path=extra)
    elif not allowed and extras:
        listed = ", ".join(repr(each) for each in sorted(extras, key=str))
        yield ValidationError(f"Additional properties are not allowed ({listed} unexpected)")


def _unique_items(validator: Any, unique: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if not (unique and validator.is_type(instance, "array")):
        return
    seen: set[str] = set()
    for item in instance:
        key = json.dumps(_canonical(item), sort_keys=True, separators=(",", ":"))
        if key in seen:
            yield ValidationError(f"{_short(instance)} has non-unique elements")
            return
        seen.add(key)


def _canonical(value: Any) -> Any:
    """As jsonschema compares: 1 and 1.0 alike, True and 1 apart."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _canonical(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_canonical(v) for v in value]
    return value


def _short(value: Any) -> str:
    from kiwi.upstream.pool import shown_value  # (pool imports this module)

    return shown_value(value)
