"""Kiwi's meta-tools inside a run: kiwi-mcp.search, load, help and execute (run).

The call path has already checked the kiwi-mcp grant of the call's action (and refused authoring).
search and load read the run's project items in local activities; help is text; execute starts a
child run as ``directive.run`` does, or calls a tool through this run's own call path, so the tool's
own grant, rate limits, approvals and audit apply to it as to any call: nothing is reached that the
run could not reach directly.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from activities.items import ItemActivities
    from kiwi.admission import counted_patterns
    from kiwi.contracts import LoadItemRequest, SearchItemsRequest
    from kiwi.guards import digest
    from kiwi.guidance import run_help
    from kiwi.policy import KIWI_MCP_ACTIONS
    from kiwi.toolargs import kiwi_execute_target

from workflows.directive_run.errors import CallRefused
from workflows.directive_run.options import KIWI_EXECUTE_AS_CALL, RETRY
from workflows.directive_run.task_budget import json_bytes

if TYPE_CHECKING:
    from workflows.directive_run.workflow import DirectiveRun

# Kiwi MCP's names for an item of each type, in load's arguments.
_LOAD_ALIASES = {"directive_name": "directive", "tool_name": "tool", "zettel_id": "knowledge"}


class KiwiToolsMixin:
    """kiwi-mcp.* tools of a run (see the module's docstring)."""

    async def _kiwi_tool(
        self: DirectiveRun, tool: str, args: dict[str, Any], origin: str, *, step: str | None, client: str
    ) -> Any:
        action = KIWI_MCP_ACTIONS[tool]
        root = self.snap.project_root
        options: dict[str, Any] = {"start_to_close_timeout": timedelta(seconds=30), "retry_policy": RETRY}
        if action == "help":
            schemas = {t: spec.input_schema for t, spec in self.snap.local_tools.items()}
            return run_help(str(args.get("topic") or ""), schemas)
        if action == "search":
            kind = str(args.get("item_type") or "")
            request = SearchItemsRequest(
                project_root=root,
                query=str(args.get("query") or ""),
                item_type="tool" if kind == "script" else kind or None,  # type: ignore[arg-type]
                category=str(args["category"]) if args.get("category") else None,
                limit=int(args.get("limit") or 10),
            )
            found = await self._item_activity(
                ItemActivities.search_items, request, f"kiwi-mcp search: {request.query}"[:100], options
            )
            return found.model_dump()
        if action == "load":
            kind, item_id = _load_target(args)
            loaded = await self._item_activity(
                ItemActivities.load_item,
                LoadItemRequest(project_root=root, item_type=kind, item_id=item_id),  # type: ignore[arg-type]
                f"kiwi-mcp load: {kind} {item_id}"[:100],
                options,
            )
            return loaded.model_dump()
        kind, item_id, values = kiwi_execute_target(args)
        as_call = self.current or workflow.patched(KIWI_EXECUTE_AS_CALL)
        granted_by = ""
        if kind == "directive":
            if not as_call:
                return await self._run_child({"directive": item_id, "inputs": values}, origin)
            # A directive.run call: its approval rules, rate limits and explicit denials apply, as they
            # would to the agent calling directive.run itself; the kiwi-mcp execute grant stands in for
            # directive.run's own.
            item_id, values = "directive.run", {"directive": item_id, "inputs": values}
            granted_by = "kiwi-mcp:execute"
        # The inner call is the call: its own admission counts it for loop detection, this one does not.
        hashes = self.state.loop_hashes
        own = digest([tool, args])
        if not as_call:
            self.state.loop_hashes = hashes[:-1]
        elif own in hashes:
            # This call's own hash, not merely the last: other calls may have been admitted while this
            # one waited for its approval.
            last = len(hashes) - 1 - hashes[::-1].index(own)
            self.state.loop_hashes = hashes[:last] + hashes[last + 1 :]
        # ... and for rate limits: a pattern this call counted (``*``) is not counted again for the inner one.
        counted = (
            counted_patterns(tool, self.snap, kiwi_tools=True, one_execute=True)
            if self.budgeted
            else frozenset()
        )
        inner = await self._call(
            item_id, values, origin=origin, step=step, client=client, granted_by=granted_by, counted=counted
        )
        if inner.status != "ok":
            raise CallRefused(
                inner.status,
                f"{item_id}: {inner.reason}",
                inner.hint,
                error_type=inner.error_type,
            )
        return inner.result

    async def _item_activity(
        self: DirectiveRun, method: Any, request: Any, summary: str, options: dict[str, Any]
    ) -> Any:
        """A local activity reading the project's items, within the workflow task's budget (a loaded item
        may be 1.4 MB; see UpstreamMixin._within_budget)."""
        return await self._within_budget(
            lambda: workflow.execute_local_activity_method(method, request, summary=summary, **options),
            answered=lambda found: json_bytes(found.model_dump()),
        )


def _load_target(args: dict[str, Any]) -> tuple[str, str]:
    """(item type, item id) of a kiwi-mcp.load call: Kiwi's {item_type, item_id} or Kiwi MCP's names."""
    if args.get("item_id"):
        kind = str(args.get("item_type") or "")
        return ("tool" if kind == "script" else kind), str(args["item_id"])
    for key, kind in _LOAD_ALIASES.items():
        if args.get(key):
            return kind, str(args[key])
    return "", ""
