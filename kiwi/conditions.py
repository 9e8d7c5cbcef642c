"""Step conditions: a small, safe expression language evaluated over a run's values.

Names (``inputs.env``, ``steps.check.outputs.ok``, or plain ``env``), literals, comparisons,
``in``, ``and``/``or``/``not`` and parentheses. Parsed with :mod:`ast` and walked over an
allowlist of node types: nothing is ever ``eval``-ed. Pure, so workflows may use it.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Any

from kiwi.templating import TemplateError, lookup

_LITERAL_NAMES = {"true": True, "false": False, "null": None, "True": True, "False": False, "None": None}
_COMPARE = {
    ast.Eq: lambda a, b: a == b,
    ast.NotEq: lambda a, b: a != b,
    ast.Lt: lambda a, b: a < b,
    ast.LtE: lambda a, b: a <= b,
    ast.Gt: lambda a, b: a > b,
    ast.GtE: lambda a, b: a >= b,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
}


class ConditionError(ValueError):
    """The condition is not in the allowed expression language."""


@dataclass
class Condition:
    source: str
    tree: ast.expr

    def names(self) -> set[str]:
        found: set[str] = set()
        for node in ast.walk(self.tree):
            if isinstance(node, (ast.Name, ast.Attribute)):
                dotted = _dotted(node)
                if dotted and dotted not in _LITERAL_NAMES:
                    found.add(dotted)
        # Drop prefixes of longer names ("steps" of "steps.a.outputs.b").
        return {n for n in found if not any(o != n and o.startswith(n + ".") for o in found)}

    def evaluate(self, context: dict[str, Any]) -> bool:
        return bool(_eval(self.tree, context))


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


def parse_condition(source: str) -> Condition:
    text = source.strip()
    if not text:
        raise ConditionError("empty condition")
    if len(text) > 500:
        raise ConditionError("condition is longer than 500 characters")
    try:
        tree = ast.parse(text.replace("&&", " and ").replace("||", " or "), mode="eval").body
    except SyntaxError as exc:
        raise ConditionError(f"cannot parse {source!r}: {exc.msg}") from None
    for node in ast.walk(tree):
        if isinstance(
            node,
            (
                ast.BoolOp,
                ast.And,
                ast.Or,
                ast.UnaryOp,
                ast.Not,
                ast.USub,
                ast.Compare,
                ast.Name,
                ast.Attribute,
                ast.Constant,
                ast.Load,
                ast.List,
                ast.Tuple,
                *_COMPARE,
            ),
        ):
            continue
        raise ConditionError(
            f"{type(node).__name__} is not allowed in a condition; use names, literals, comparisons, "
            "in, and/or/not and parentheses"
        )
    return Condition(text, tree)


def _eval(node: ast.AST, context: dict[str, Any]) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, (ast.Name, ast.Attribute)):
        dotted = _dotted(node)
        if dotted in _LITERAL_NAMES:
            return _LITERAL_NAMES[dotted]
        try:
            return lookup(dotted or "", context)
        except TemplateError:
            return None
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_eval(e, context) for e in node.elts]
    if isinstance(node, ast.UnaryOp):
        operand = _eval(node.operand, context)
        if isinstance(node.op, ast.USub):
            return -operand if isinstance(operand, (int, float)) else None
        return not operand
    if isinstance(node, ast.BoolOp):
        values = (_eval(v, context) for v in node.values)
        return all(values) if isinstance(node.op, ast.And) else any(values)
    if isinstance(node, ast.Compare):
        left = _eval(node.left, context)
        for op, right_node in zip(node.ops, node.comparators, strict=True):
            right = _eval(right_node, context)
            try:
                ok = _COMPARE[type(op)](left, right)
            except TypeError:
                ok = False
            if not ok:
                return False
            left = right
        return True
    raise ConditionError(f"{type(node).__name__} is not allowed in a condition")
