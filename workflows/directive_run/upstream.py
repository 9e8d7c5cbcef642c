"""External MCP servers: tool context at the start, proxied calls."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.workflow import ActivityCancellationType

with workflow.unsafe.imports_passed_through():
    from kiwi.contracts import (
        TERMINAL,
        BatchItem,
        BatchResult,
        McpCallBatch,
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
    BATCH_ANSWER_MARGIN,
    LOCAL_CALL_MARGIN,
    MCP_LOCAL_LIMIT,
    MCP_RETRY,
)
from workflows.directive_run.task_budget import json_bytes

T = TypeVar("T")

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
                listed = await self._within_budget(
                    lambda: self._list_tools(decl),
                    answered=lambda listed: json_bytes(listed.model_dump()),
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

    async def _list_tools(self: DirectiveRun, decl: McpDeclaration) -> McpListToolsResult:
        """A declared server's tools, as its local activity lists them at the run's start."""
        return await workflow.execute_local_activity(
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
        if info.timeout_seconds <= MCP_LOCAL_LIMIT and self.batched:
            # Sent with the other calls to this server made in the same workflow task (one local activity).
            item = await self._batched(
                f"mcp:{server}",
                request,
                one=lambda r: self._single_item(r, timeout),
                many=lambda rs: self._batch_items(server, rs, timeout),
            )
            if not item.retry:
                value = item.value
                return self._outcome(
                    tool,
                    value if isinstance(value, McpCallResult) else McpCallResult.model_validate(value),
                    warnings,
                )
            # A transport failure: retried as a call of its own, with the single call's retry policy.
        if info.timeout_seconds <= MCP_LOCAL_LIMIT:
            item = await self._within_budget(
                lambda: self._single_item(request, timeout),
                answered=lambda item: json_bytes(item.model_dump()),
            )
            return self._outcome(tool, item.value, warnings)
        return self._outcome(tool, await self._remote_call(request, timeout), warnings)

    async def _remote_call(self: DirectiveRun, request: McpCallRequest, timeout: timedelta) -> McpCallResult:
        """A long upstream call, as an activity of its own (heartbeats carry its progress)."""
        tool = f"{request.server}.{request.tool}"
        handle = workflow.start_activity(
            f"mcp.{request.server}.call_tool",
            request,
            result_type=McpCallResult,
            start_to_close_timeout=timeout + timedelta(seconds=30),
            heartbeat_timeout=timedelta(seconds=5),
            retry_policy=MCP_RETRY,
            summary=f"call tool: {tool}",
            cancellation_type=ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
        )
        await self._until_done_or_cancelled(handle, tool)
        return await handle

    async def _within_budget(
        self: DirectiveRun,
        send: Callable[[], Awaitable[T]],
        *,
        answered: Callable[[T], int],
    ) -> T:
        """``send()`` (a local activity on the call path) once its largest answer fits in the workflow task
        (see TaskBudget.local_slot); it holds that room until it answers (``answered``: its size). Runs
        started before the task budget: at once."""
        if not self.budgeted:
            return await send()
        await self.budget.local_slot()
        size = 0
        try:
            result = await send()
            size = answered(result)
            return result
        finally:
            self.budget.settle(size)

    def _outcome(self: DirectiveRun, tool: str, outcome: McpCallResult, warnings: list[str]) -> Any:
        if outcome.schema_changed:
            warnings.append(outcome.schema_changed)
            self.audit.record({"event": "mcp_schema_changed", "tool": tool, "detail": outcome.schema_changed})
        if outcome.is_error:
            raise ToolReportedError(outcome)
        return outcome.result

    async def _batched(
        self: DirectiveRun,
        key: str,
        request: Any,
        *,
        one: Callable[[Any], Awaitable[BatchItem]],
        many: Callable[[list[Any]], Awaitable[list[BatchItem]]],
    ) -> BatchItem:
        """Queue ``request`` for the next batch of ``key`` (sent once every call of this workflow task that
        reaches this point has joined it: ``one`` for a batch of one, as the call always went, else
        ``many``, within the task's budget: see ``_within_budget``) and wait for its own item. A refused
        call's item raises its refusal here."""
        future: asyncio.Future[BatchItem] = asyncio.get_running_loop().create_future()
        queue = self.batches.setdefault(key, [])
        queue.append((request, future))
        if len(queue) == 1:
            task = asyncio.ensure_future(self._send_batch(key, one, many))
            self.batch_senders.add(task)
            task.add_done_callback(self.batch_senders.discard)
        item = await future
        if item.error_type and not item.retry:
            raise ApplicationError(item.message, type=item.error_type, non_retryable=True)
        return item

    async def _send_batch(
        self: DirectiveRun,
        key: str,
        one: Callable[[Any], Awaitable[BatchItem]],
        many: Callable[[list[Any]], Awaitable[list[BatchItem]]],
    ) -> None:
        queue = self.batches[key]
        # Let every handler this activation runs reach its call: each yield lets the ready ones go first.
        # (asyncio.sleep(0) is a plain yield to the workflow's event loop, no timer.)
        size = 0
        while size != len(queue):
            size = len(queue)
            await asyncio.sleep(0)
        del self.batches[key]
        requests = [r for r, _ in queue]

        async def send() -> list[BatchItem]:
            return [await one(requests[0])] if len(requests) == 1 else await many(requests)

        try:
            items = await self._within_budget(
                send,
                answered=lambda items: sum(json_bytes(item.model_dump()) for item in items),
            )
        except BaseException as exc:  # every caller gets the failure: none may wait forever
            for _, future in queue:
                if not future.done():
                    future.set_exception(exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        for (_, future), item in zip(queue, items, strict=True):
            if not future.done():
                future.set_result(item)

    async def _single_item(self: DirectiveRun, request: McpCallRequest, timeout: timedelta) -> BatchItem:
        """One short call's own local activity: a batch of one, a call retried alone, every short call of a
        run started before batching (the same commands as ever)."""
        tool = f"{request.server}.{request.tool}"
        # (The call's own timeout, the server's, answers ToolTimeout and is never sent again; with the same
        # timeout for its local activity, a loaded worker's answer came after Temporal's, which retried the
        # call: it was sent again, and answered `ok` (test_review_attacks_s18, twice under load). Time to answer,
        # as a batch has.)
        margin = BATCH_ANSWER_MARGIN if workflow.patched(LOCAL_CALL_MARGIN) else timedelta(0)
        handle = workflow.start_local_activity(
            f"mcp.{request.server}.call_tool",
            request,
            result_type=McpCallResult,
            start_to_close_timeout=timeout + margin,
            retry_policy=MCP_RETRY,
            summary=f"call tool: {tool}",
        )
        await self._until_done_or_cancelled(handle, tool)
        return BatchItem(value=await handle)

    async def _batch_items(
        self: DirectiveRun,
        server: str,
        requests: list[McpCallRequest],
        timeout: timedelta,
    ) -> list[BatchItem]:
        handle = workflow.start_local_activity(
            f"mcp.{server}.call_tools",
            McpCallBatch(requests=requests, timeout_seconds=timeout.total_seconds()),
            result_type=BatchResult,
            # Each call is bounded by ``timeout`` in the activity (a slow one comes back to be retried
            # alone); the batch gets more, so it answers for the others and is never retried as a whole.
            start_to_close_timeout=timeout + BATCH_ANSWER_MARGIN,
            retry_policy=MCP_RETRY,
            summary=f"call tools: {len(requests)} calls to {server}",
        )
        await self._until_done_or_cancelled(handle, f"{len(requests)} calls to {server}")
        return (await handle).items

    async def _until_done_or_cancelled(self: DirectiveRun, handle: Any, what: str) -> None:
        # Cancelling the run cancels the upstream calls in flight.
        await workflow.wait_condition(lambda: handle.done() or bool(self.state.cancel_reason))
        if not handle.done():
            handle.cancel()
            with contextlib.suppress(ActivityError):
                await handle
            raise CallRefused("error", f"{what} was cancelled with the run", error_type=Cancelled.type)
