"""Proxied calls to external MCP servers, as activities over the worker's :class:`McpPool`.

One dynamic definition serves every server under its own name, ``mcp.{server}.list_tools`` and
``mcp.{server}.call_tool``, so the Temporal UI shows which server a run talked to. Transport
failures are retryable (the pool reconnects on the next attempt); refusals are not. Secret
values are scrubbed from everything that leaves here: results, tool listings (descriptions and
schemas), error messages and progress messages.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from temporalio import activity
from temporalio.common import RawValue
from temporalio.exceptions import ApplicationError

from activities.batches import answer_batch
from kiwi import errors
from kiwi.contracts import (
    BatchResult,
    McpCallBatch,
    McpCallRequest,
    McpCallResult,
    McpListToolsRequest,
    McpListToolsResult,
)
from kiwi.errors import ActivityNotFound, KiwiError
from kiwi.seal import seal_progress
from kiwi.upstream.pool import McpPool, McpUnavailable, scrub, scrub_text

# What a run takes of one server's tool listing (JSON bytes, after the directive's and registry's filters).
MAX_TOOL_LIST_BYTES = 512_000
# What a progress report's message keeps (the front end shows it while the call runs).
PROGRESS_MESSAGE_CHARS = 1_000
# A call's own timeout ends this long before its activity's (see _deadline).
ANSWER_MARGIN_SECONDS = 0.25
# How long after a batched call's own timeout the batch stops waiting for it (see call_tools).
BACKSTOP_SECONDS = 1.0


class McpActivities:
    """``mcp.{server}.list_tools`` and ``mcp.{server}.call_tool`` over one shared :class:`McpPool`."""

    def __init__(self, pool: McpPool) -> None:
        self.pool = pool

    @activity.defn(dynamic=True)
    async def mcp_operation(self, args: Sequence[RawValue]) -> Any:
        name = activity.info().activity_type
        prefix, _, rest = name.partition(".")
        server, _, operation = rest.rpartition(".")
        converter = activity.payload_converter()
        if prefix != "mcp" or not server:
            raise ActivityNotFound.error(f"no activity '{name}' on this worker")
        try:
            if operation == "list_tools":
                return await self.list_tools(converter.from_payload(args[0].payload, McpListToolsRequest))
            if operation == "call_tool":
                return await self.call_tool(converter.from_payload(args[0].payload, McpCallRequest))
            if operation == "call_tools":
                return await self.call_tools(converter.from_payload(args[0].payload, McpCallBatch))
        except (ApplicationError, asyncio.CancelledError):
            raise
        except Exception as exc:  # noqa: BLE001 - the activity's top level: no exception text leaves unscrubbed
            raise _unavailable(exc) from None
        raise ActivityNotFound.error(f"no MCP operation '{operation}'")

    async def call_tools(self, batch: McpCallBatch) -> BatchResult:
        """The calls a run made together, at once over the server's one connection (see
        activities.batches): a call whose transport failed comes back for the run to retry alone."""

        async def one(request: McpCallRequest) -> McpCallResult:
            # Each call is bounded by the server's timeout on its own: had one slow call run the batch's
            # activity out of time, the whole batch would be retried and its finished calls run again.
            # The MCP client's own read timeout (the same) comes first and retires the connection, whose
            # server may be stuck (see McpPool._using); this bound, a second later, is the backstop.
            call = asyncio.ensure_future(self.call_tool(request))
            try:
                bound = batch.timeout_seconds + BACKSTOP_SECONDS if batch.timeout_seconds else None
                done, _ = await asyncio.wait({call}, timeout=bound)
                if not done:
                    raise errors.ToolTimeout.error(
                        f"{request.server}.{request.tool}: no answer within {batch.timeout_seconds:g}s; the "
                        "server may have done it all the same, so Kiwi does not send it again",
                        retryable=False,
                    )
                return call.result()
            except (ApplicationError, asyncio.CancelledError):
                raise
            except Exception as exc:  # noqa: BLE001 - as mcp_operation: no exception text leaves unscrubbed
                raise _unavailable(exc) from None
            finally:
                if not call.done():
                    call.cancel()

        return await answer_batch(((f"{r.server}.{r.tool}", one(r)) for r in batch.requests), NOT_RETRIED)

    async def list_tools(self, req: McpListToolsRequest) -> McpListToolsResult:
        try:
            config = self.pool.config(req.project_root, req.server)
            tools, hashes = await self.pool.listing(req.project_root, config, refresh=req.refresh)
        except McpUnavailable as exc:
            raise errors.McpUnavailable.error(scrub_text(str(exc)), retryable=not exc.lasting) from None
        except KiwiError as exc:
            raise ApplicationError(scrub_text(exc.message), type=exc.type, non_retryable=True) from None
        if req.tools:
            missing = [t for t in req.tools if t not in {x.get("name") for x in tools}]
            tools = [t for t in tools if t.get("name") in req.tools]
            if missing:
                activity.logger.warning("MCP server %s has no tool(s) %s", req.server, ", ".join(missing))
        # The listing is held by the run (its state, its history, what each front end asks for): a server
        # listing megabytes, by accident or on purpose, would take the run past what Temporal carries.
        size = len(json.dumps(tools, default=str))
        if size > MAX_TOOL_LIST_BYTES:
            raise errors.McpError.error(
                f"MCP server '{req.server}' lists {size:,} bytes of tools, more than a run holds "
                f"({MAX_TOOL_LIST_BYTES:,}); name the tools the run needs (<tool> in the directive's <mcp>, "
                "or tools: in mcp_registry.yaml)"
            )
        return McpListToolsResult(
            server=req.server, tools=tools, tool_hashes={t["name"]: hashes.get(t["name"], "") for t in tools}
        )

    async def call_tool(self, req: McpCallRequest) -> McpCallResult:
        info = activity.info()  # (this activity's: the progress callback runs in the connection's task)
        in_activity = not info.is_local  # local activities cannot heartbeat

        last: list[dict[str, Any]] = []
        reported = asyncio.Event()

        async def progress(value: float, total: float | None, message: str | None) -> None:
            # Heartbeat details are how the front end reads an upstream call's progress.
            # (Scrubbed, then cut: Temporal keeps each heartbeat's details, and the front end reads them.)
            # This runs in the pooled connection's task, whose activity context is the one that opened the
            # connection (another call's, maybe another run's): the heartbeat goes from this call's own task.
            shown = scrub_text(message)[:PROGRESS_MESSAGE_CHARS] if message else message
            last[:] = [seal_progress({"progress": value, "total": total, "message": shown}, info)]
            reported.set()

        beat = asyncio.create_task(_heartbeat(last, reported)) if in_activity else None
        try:
            config = self.pool.config(req.project_root, req.server)
            result, conn = await self.pool.call_tool(
                req.project_root,
                config,
                req.tool,
                req.arguments,
                progress,
                _deadline(),
            )
        except McpUnavailable as exc:
            raise errors.McpUnavailable.error(scrub_text(str(exc)), retryable=not exc.lasting) from None
        except KiwiError as exc:
            raise ApplicationError(scrub_text(exc.message), type=exc.type, non_retryable=True) from None
        finally:
            if beat is not None:
                beat.cancel()
        changed = ""
        if req.expected_hash:
            try:
                hashes: dict[str, str] | None = (await self.pool.listing(req.project_root, config))[1]
            except (McpUnavailable, KiwiError):
                hashes = None  # the call worked; a listing that fails now says nothing about the schema
            now = (hashes or {}).get(req.tool, "")
            if hashes is not None and now != req.expected_hash:
                changed = (
                    f"the schema of {req.server}.{req.tool} changed since this run started"
                    if now
                    else f"{req.server}.{req.tool} is no longer listed by the server"
                )
        # (KNOWN_SECRETS holds every connection's secrets: the pool remembers them before it connects.)
        result = scrub(result)
        is_error = bool(result.get("isError"))
        text = " ".join(c.get("text", "") for c in result.get("content", []) if c.get("type") == "text")
        return McpCallResult(
            result=result,
            is_error=is_error,
            error_text=text[:2000] if is_error else "",
            schema_changed=changed,
        )


# Refusals the run does not retry (kiwi.errors.MCP_REFUSALS, as the workflow's MCP_RETRY), and a call that
# had no answer in time (it reached the server, which may have done it: see McpPool._using).
NOT_RETRIED = frozenset(errors.non_retryable(*errors.MCP_REFUSALS, ActivityNotFound, errors.ToolTimeout))


def _deadline() -> float | None:
    """When a call must stop waiting for its answer (``time.monotonic()``): a margin before its activity's
    time ends (a short call's local activity has the server's timeout itself, connecting included). The
    call's own timeout must come first: it answers ToolTimeout and is never sent again; the activity's ran
    out unnoticed, and Temporal retried it, running the server's operation again."""
    info = activity.info()
    if not info.start_to_close_timeout or not info.started_time:
        return None
    elapsed = (datetime.now(UTC) - info.started_time).total_seconds()
    return time.monotonic() + info.start_to_close_timeout.total_seconds() - elapsed - ANSWER_MARGIN_SECONDS


def _unavailable(exc: BaseException) -> ApplicationError:
    return errors.McpUnavailable.error(scrub_text(f"{type(exc).__name__}: {exc}"))


async def _heartbeat(last: list[dict[str, Any]], reported: asyncio.Event) -> None:
    """Keep a long upstream call's activity alive (and cancellable): a heartbeat with its last progress as
    soon as the server reports some, and every 2 s between reports."""
    while True:
        activity.heartbeat(*last)
        reported.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(reported.wait(), 2)
