"""Typed errors shared by the CLI, the workers and the MCP front end.

Each error carries a stable ``type`` string. Activities raise it as
``ApplicationError(type=...)`` and the front end maps ``cause.type`` back to the
seeds' error shape, so nothing ever matches on message text.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from temporalio.exceptions import ApplicationError, ApplicationErrorCategory


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
    """Base of Kiwi's errors; ``type`` is the stable machine-readable kind: the class name.

    Code that retries, translates or tests an error names the class (``non_retryable(ToolFailed, ...)``,
    ``kind == ToolFailed.type``), never a string that could drift from it. Raised in an activity or
    the workflow, an error travels as the ``ApplicationError`` that ``error()`` makes.
    """

    type = "KiwiError"
    # Whether Temporal may retry an activity that failed with it (a transport failure: yes).
    retryable: bool = False
    # Logged without a stack trace even when retried: an expected failure of something outside Kiwi.
    benign: bool = False

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        cls.type = cls.__name__

    def __init__(self, message: str, *, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        # What else a command's --json error carries (kiwi run: the run it started all the same).
        self.details: dict[str, object] = {}

    @classmethod
    def error(cls, message: str, *details: object, retryable: bool | None = None) -> ApplicationError:
        """The ``ApplicationError`` to raise for this kind of failure."""
        again = cls.retryable if retryable is None else retryable
        # A failure that is not retried is an answer (no such file, denied, the tool said no), not a
        # fault: BENIGN keeps the worker from logging a stack trace for every one an agent causes.
        return ApplicationError(
            message,
            *details,
            type=cls.type,
            non_retryable=not again,
            category=ApplicationErrorCategory.BENIGN
            if cls.benign or not again
            else ApplicationErrorCategory.UNSPECIFIED,
        )


class ItemInvalid(KiwiError):
    """An item failed to parse or validate; ``problems`` says where and why."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        errors = [p for p in problems if p.severity == "error"]
        super().__init__("; ".join(str(p) for p in errors) or "invalid item")


class ItemNotFound(KiwiError):
    pass


class InputInvalid(KiwiError):
    pass


class RunNotFound(KiwiError):
    pass


class RunStateConflict(KiwiError):
    pass


class TemporalUnavailable(KiwiError):
    """Temporal did not answer the request (down, restarting, or the request was cut off): try again."""


class DecisionRefused(KiwiError):
    """A run received a human decision (approve, reject, decide, resume) and refused it; the reason says why."""

    type = "DecisionRefused"


class RunInOtherProject(KiwiError):
    """The run belongs to another project than the one this client serves (``owner``)."""

    def __init__(self, message: str, *, hint: str = "", owner: str = "") -> None:
        super().__init__(message, hint=hint)
        self.owner = owner


class RunFinished(RunStateConflict):
    """The run has completed, failed, timed out or been cancelled; it takes no more calls."""


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


class Failure(KiwiError):
    """An error raised in an activity or the workflow's call path (carried by Temporal)."""


def non_retryable(*kinds: type[KiwiError]) -> list[str]:
    """``RetryPolicy.non_retryable_error_types`` from failure classes."""
    return [kind.type for kind in kinds]


class PermissionDenied(Failure):
    """The policy, or the activity's own re-check, refused the call."""


class FileNotFound(Failure):
    pass


class IsADirectory(Failure):
    pass


class ToolNotFound(Failure):
    pass


class ToolFailed(Failure):
    """The tool ran and reported failure (exit code, ``isError``, invalid output)."""


class ToolTimeout(Failure):
    pass


class ToolTypeUnsupported(Failure):
    pass


class CommandNotFound(Failure):
    pass


class GitUnavailable(Failure):
    pass


class GitFailed(Failure):
    pass


class CheckpointNotFound(Failure):
    pass


class SecretMissing(Failure):
    pass


class McpServerUnknown(Failure):
    pass


class McpError(Failure):
    """The upstream MCP server answered a request with a JSON-RPC error."""


class McpUnavailable(Failure):
    """The upstream MCP server could not be reached; the pool reconnects on the next attempt."""

    retryable = True
    # (A server that cannot start left a full traceback per attempt in `kiwi dev`'s output: 31 in one
    # trial. The failure's message says why; the final one reaches the run.)
    benign = True


class ActivityNotFound(Failure):
    pass


class WebhookUnreachable(Failure):
    retryable = True


class WebhookFailed(Failure):
    """The approval webhook answered 5xx: retried."""

    retryable = True


class WebhookRefused(Failure):
    pass


class StepFailed(Failure):
    pass


class RunTimedOut(Failure):
    pass


class RunContinuing(Failure):
    """The run is continuing-as-new; the client sends the update again to the new run."""

    retryable = True


class RunBusy(Failure):
    """The run's current workflow task already carries as many call arguments as it may (see
    workflows/directive_run/task_budget.py); the client sends the call again, to a later task."""

    retryable = True


class ChildRunFailed(Failure):
    pass


class Cancelled(Failure):
    pass


class RateLimited(Failure):
    pass


class ApprovalRejected(Failure):
    pass


class ApprovalTimedOut(Failure):
    pass


class ApprovalCancelled(Failure):
    pass


class AuditPathUnsafe(Failure):
    """A link was planted where the audit trail is written; the records wait in the run until it is gone."""

    retryable = True


# Refusals a retry cannot change. The single calls' retry policies (workflows/directive_run/options.py) and
# the batches' activities (activities/batches.py: which calls come back to be retried alone) name the same.
ACTIVITY_REFUSALS = (
    PermissionDenied,
    FileNotFound,
    ToolNotFound,
    ToolFailed,
    ToolTimeout,
    GitUnavailable,
    CommandNotFound,
)
MCP_REFUSALS = (ToolFailed, ToolNotFound, SecretMissing, McpServerUnknown, McpError)
