"""Exceptions the call path raises inside the workflow, and reading an activity's failure."""

from __future__ import annotations

from temporalio import workflow
from temporalio.exceptions import ActivityError
from temporalio.exceptions import TimeoutError as TemporalTimeout

with workflow.unsafe.imports_passed_through():
    from kiwi.contracts import (
        McpCallResult,
    )


class StepAborted(Exception):
    """A step cannot go on (a call it needs was refused or failed); the run fails with ``message``."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ToolReportedError(Exception):
    """The upstream tool answered with ``isError``: the call ran, and its content says why it failed."""

    def __init__(self, outcome: McpCallResult) -> None:
        super().__init__(outcome.error_text)
        self.outcome = outcome


class CallRefused(Exception):
    """A call the workflow decided against after looking closer (e.g. a child run's escalation)."""

    def __init__(
        self, status: str, reason: str, hint: str = "", error_type: str = "PermissionDenied"
    ) -> None:
        super().__init__(reason)
        self.status, self.reason, self.hint, self.error_type = status, reason, hint, error_type


def _cause(exc: BaseException) -> BaseException:
    """An activity's failure itself, unwrapped from its ActivityError if it is in one."""
    return exc.cause if isinstance(exc, ActivityError) and exc.cause is not None else exc


def failure_of(exc: BaseException) -> tuple[str, str]:
    """``(type, message)`` of an activity's failure, wrapped in an ActivityError or not."""
    cause = _cause(exc)
    if isinstance(cause, TemporalTimeout):
        # (Temporal's: its ``type`` is which timeout, a number; it read as error type "1".)
        return (
            "ToolTimeout",
            f"the call did not finish in its time ({cause.type.name.lower().replace('_', '-')} timeout)"
            if cause.type
            else "the call did not finish in its time",
        )
    kind = getattr(cause, "type", None) or "ActivityFailed"
    return kind, getattr(cause, "message", None) or str(cause)


def hint_of(exc: BaseException) -> str:
    """The hint an activity's failure carries (``Kind.error(message, {"hint": ...})``), '' when none: what
    the agent is told to do about it (it was dropped, and the agent saw the message alone)."""
    for detail in getattr(_cause(exc), "details", None) or ():
        if isinstance(detail, dict) and isinstance(detail.get("hint"), str):
            return detail["hint"]
    return ""
