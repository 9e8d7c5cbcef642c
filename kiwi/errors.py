"""Typed errors shared by the CLI, the workers and the MCP front end.

Each error carries a stable ``type`` string. Activities raise it as
``ApplicationError(type=...)`` and the front end maps ``cause.type`` back to the
seeds' error shape, so nothing ever matches on message text.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass
class Problem:
    """One finding about an item: where it is, what is wrong, what is expected."""

    message: str
    path: str = ""
    line: int = 0
    column: int = 0
    severity: str = "error"  # "error" | "warning"

    def __str__(self) -> str:
        where = self.path or "<input>"
        if self.line:
            where += f":{self.line}"
            if self.column:
                where += f":{self.column}"
        prefix = "" if self.severity == "error" else "warning: "
        return f"{where}: {prefix}{self.message}"

    def as_dict(self) -> dict:
        return {
            "severity": self.severity,
            "path": self.path,
            "line": self.line,
            "column": self.column,
            "message": self.message,
        }


class KiwiError(Exception):
    """Base of Kiwi's domain errors; ``type`` is the stable machine-readable kind."""

    type = "KiwiError"

    def __init__(self, message: str, *, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


class ItemInvalid(KiwiError):
    """An item failed to parse or validate; ``problems`` says where and why."""

    type = "ItemInvalid"

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        errors = [p for p in problems if p.severity == "error"]
        super().__init__("; ".join(str(p) for p in errors) or "invalid item")


class ItemNotFound(KiwiError):
    type = "ItemNotFound"


class InputInvalid(KiwiError):
    type = "InputInvalid"


class RunNotFound(KiwiError):
    type = "RunNotFound"


class RunStateConflict(KiwiError):
    type = "RunStateConflict"


class RunFinished(RunStateConflict):
    """The run has completed, failed, timed out or been cancelled; it takes no more calls."""

    type = "RunFinished"


def display_path(path: Path | str, root: Path | None = None) -> str:
    """A path as a user should see it: relative to ``root`` when inside it."""
    p = Path(path)
    if root is not None:
        try:
            return str(p.resolve().relative_to(root.resolve()))
        except ValueError:
            pass
    return str(p)


class McpServerMissing(KiwiError):
    """A run needs an external MCP server that is not configured or does not answer."""

    type = "McpServerMissing"
