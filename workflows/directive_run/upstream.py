"""External MCP servers: tool context at the start, proxied calls."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.workflow import ActivityCancellationType

with workflow.unsafe.imports_passed_through():
    from kiwi.contracts import (
        TERMINAL,
        McpCallRequest,
        McpCallResult,
        McpListToolsRequest,
        McpListToolsResult,
        McpServerContext,
    )
    from kiwi.errors import Cancelled
    from kiwi.items.directive import McpDeclaration

from workflows.directive_run.errors import (
    CallRefused,
    ToolReportedError,
    failure_of,
)
from workflows.directive_run.options import (
    MCP_LOCAL_LIMIT,
    MCP_RETRY,
)

if TYPE_CHECKING:
    from workflows.directive_run.workflow import DirectiveRun


class UpstreamMixin:
    """External MCP servers: tool context at the start, proxied calls."""

    # ------------------------------------------------------------------ external MCP servers
    def _mcp_declaration(self: DirectiveRun, tool: str) -> McpDeclaration | None:
        server, _, name = tool.partition(".")
        if not name:
            return None
        return next((d for d in self.snap.directive.metadata.tools.mcps if server in (d.name, d.alias)), None)

    async def _fetch_tool_context(self: DirectiveRun, declarations: list[McpDeclaration]) -> None:
        """Fetch the declared servers' tool schemas once, into the run's state (and so its history)."""

        async def one(decl: McpDeclaration) -> McpServerContext:
            context = McpServerContext(server=decl.name, alias=decl.alias, required=decl.required)
            info = self.snap.mcp_servers.get(decl.name)
            if info is None:
                context.error = (
                    self.snap.mcp_skipped.get(decl.name) or f"no MCP server '{decl.name}' is configured"
                )
                context.hint = (
                    f"add '{decl.name}' under mcps: in .ai/config/mcp_registry.yaml"
                    if decl.name not in self.snap.mcp_skipped
                    else "set the missing variable where the front end and worker run, then start a new run"
                )
                return context
            context.description = info.description
            try:
                listed = await workflow.execute_local_activity(
                    f"mcp.{decl.name}.list_tools",
                    McpListToolsRequest(
                        project_root=self.snap.project_root,
                        server=decl.name,
                        tools=decl.tools,
                        refresh=decl.refresh,
                    ),
                    result_type=McpListToolsResult,
                    start_to_close_timeout=timedelta(seconds=60),
                    retry_policy=RetryPolicy(
                        initial_interval=timedelta(milliseconds=300),
                        maximum_attempts=3,
                        non_retryable_error_types=MCP_RETRY.non_retryable_error_types,
                    ),
                    summary=f"list tools: {decl.name}",
                )
            except (ActivityError, ApplicationError) as exc:
                # A local activity's final failure can arrive unwrapped (an ApplicationError).
                context.error = failure_of(exc)[1]
                context.hint = (
                    f"check that MCP server '{decl.name}' starts (see mcp_registry.yaml), then start a "
                    "new run"
                )
                return context
            context.available = True
            context.tools = [{**t, "name": f"{decl.name}.{t['name']}"} for t in listed.tools]
            context.tool_hashes = listed.tool_hashes
            offered = set(listed.tool_hashes)
            missing = [t for t in decl.tools if t not in offered]
            if missing:
                context.hint = (
                    f"declared but not offered by the server (or hidden by its registry filter): "
                    f"{', '.join(missing)}"
                )
            return context

        contexts = await asyncio.gather(*(one(d) for d in declarations))
        for context in contexts:
            self.state.mcp_context[context.server] = context
            self.audit.record(
                {
                    "event": "mcp_context",
                    "server": context.server,
                    "available": context.available,
                    "tools": sorted(context.tool_hashes),
                    "error": context.error,
                }
            )
            if context.required and not context.available and self.state.status not in TERMINAL:
                self.state.status = "failed"
                self.state.error = (
                    f"required MCP server '{context.server}' is not available: {context.error}"
                    + (f" ({context.hint})" if context.hint else "")
                )

    async def _call_mcp(self: DirectiveRun, tool: str, args: dict[str, Any], warnings: list[str]) -> Any:
        """One upstream call: a local activity for short calls, a heartbeating one (with progress) for long."""
        server, _, name = tool.partition(".")
        info = self.snap.mcp_servers[server]
        request = McpCallRequest(
            project_root=self.snap.project_root,
            server=server,
            tool=name,
            arguments=args,
            expected_hash=self.state.mcp_context[server].tool_hashes.get(name, ""),
        )
        timeout = timedelta(seconds=info.timeout_seconds)
        if info.timeout_seconds <= MCP_LOCAL_LIMIT:
            handle = workflow.start_local_activity(
                f"mcp.{server}.call_tool",
                request,
                result_type=McpCallResult,
                start_to_close_timeout=timeout,
                retry_policy=MCP_RETRY,
                summary=f"call tool: {tool}",
            )
        else:
            handle = workflow.start_activity(
                f"mcp.{server}.call_tool",
                request,
                result_type=McpCallResult,
                start_to_close_timeout=timeout + timedelta(seconds=30),
                heartbeat_timeout=timedelta(seconds=5),
                retry_policy=MCP_RETRY,
                summary=f"call tool: {tool}",
                cancellation_type=ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
            )
        # Cancelling the run cancels the upstream call in flight.
        await workflow.wait_condition(lambda: handle.done() or bool(self.state.cancel_reason))
        if not handle.done():
            handle.cancel()
            with contextlib.suppress(ActivityError):
                await handle
            raise CallRefused("error", f"{tool} was cancelled with the run", error_type=Cancelled.type)
        outcome = await handle
        if outcome.schema_changed:
            warnings.append(outcome.schema_changed)
            self.audit.record({"event": "mcp_schema_changed", "tool": tool, "detail": outcome.schema_changed})
        if outcome.is_error:
            raise ToolReportedError(outcome)
        return outcome.result
