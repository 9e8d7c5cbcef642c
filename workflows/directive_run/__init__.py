"""``DirectiveRun``: one directive run as one Temporal workflow, split by concern.

- ``workflow``: the definition, with every handler (updates, signals, the status query)
- ``steps``, ``calls``, ``kiwi_tools``, ``humans``, ``upstream``, ``children``, ``audit_trail``, ``view``:
  its parts
- ``options``: retry policies, timeouts and patch ids; ``errors``: the call path's exceptions
"""

from workflows.directive_run.options import (
    ALL_CHANGES,
    COMMIT_BEFORE_CONTINUE,
    CURRENT,
    HARDENED,
    KIWI_MCP_TOOLS,
)
from workflows.directive_run.workflow import DirectiveRun

__all__ = ["ALL_CHANGES", "COMMIT_BEFORE_CONTINUE", "CURRENT", "HARDENED", "KIWI_MCP_TOOLS", "DirectiveRun"]
