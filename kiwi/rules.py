"""Rules that came with a workflow patch: in force always outside workflow code, and in a run once it has met
the patch (see :func:`rule_in_force`). Its own module, importing nothing of Kiwi's, so that any module of the
workflow's (kiwi.globs too, which kiwi.protected imports) can ask it.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

# While set, rule_in_force answers True without asking the run (see rules_assumed).
_ASSUMED: contextvars.ContextVar[bool] = contextvars.ContextVar("kiwi_rules_assumed", default=False)


def rule_in_force(patch: str) -> bool:
    """Whether a rule that came with the workflow patch ``patch`` applies: always outside workflow code; in a
    run, once it has met the patch (a marker only in runs that meet it, so runs from before replay as they
    ran). Called only where the rule can change the answer."""
    from temporalio import workflow

    return not workflow.in_workflow() or _ASSUMED.get() or workflow.patched(patch)


@contextlib.contextmanager
def rules_assumed() -> Iterator[None]:
    """Every rule taken as in force, without asking the run: for a reading made only to compare it with an
    older one. (A run remembers the first answer to each patch: asked where the code before never asked it,
    a replay could answer False there and keep that answer for a later command the code before decided with
    True.)"""
    token = _ASSUMED.set(True)
    try:
        yield
    finally:
        _ASSUMED.reset(token)
