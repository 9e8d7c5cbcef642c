"""Kiwi's runs, directives and knowledge as MCP resources, and run watches for subscribed clients.

- ``kiwi://runs/{run_id}``: the run's status (the ``status`` query) as JSON.
- ``kiwi://runs/{run_id}/audit``: the run's audit trail as JSON (what ``kiwi audit`` prints).
- ``kiwi://directives/{name}`` and ``kiwi://knowledge/{zettel_id}``: the item's file.

Directives and knowledge are listed by ``resources/list`` as they are on disk at the moment of the
request (a new file is listed at once); runs are reached through the templates.

A client that subscribes to a run's URI (``subscriptions/listen`` with ``resourceSubscriptions``, or
``resources/subscribe`` on 2025 protocol versions) hears ``notifications/resources/updated`` when the
run changes: while at least one stream of this
front end names a run, one watcher asks Temporal for the run's status, every 0.2 s after a change and
backing off to every 2 s while nothing changes, and stops when the last stream ends or the run has
ended. The watcher lives in the listen request itself, so a stateless HTTP front end serves it too.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any

import anyio
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ResourceError, ResourceNotFoundError
from mcp.server.subscriptions import ResourceUpdated, SubscriptionBus
from mcp_types import EmptyResult, SubscribeRequestParams, UnsubscribeRequestParams

from kiwi.contracts import TERMINAL
from kiwi.errors import ItemNotFound, KiwiError, RunInOtherProject, RunNotFound
from kiwi.items.store import ItemStore

if TYPE_CHECKING:
    from mcp_frontend.link import TemporalLink

logger = logging.getLogger(__name__)

RUN_URI = "kiwi://runs/{run_id}"
AUDIT_URI = "kiwi://runs/{run_id}/audit"
DIRECTIVE_URI = "kiwi://directives/{name}"
KNOWLEDGE_URI = "kiwi://knowledge/{zettel_id}"
RUNS_PREFIX = "kiwi://runs/"

FASTEST_POLL = 0.2
SLOWEST_POLL = 2.0


def run_uri(run_id: str) -> str:
    return RUN_URI.format(run_id=run_id)


def audit_uri(run_id: str) -> str:
    return AUDIT_URI.format(run_id=run_id)


def register_resources(server: MCPServer, link: TemporalLink, store: ItemStore) -> None:
    """The resource templates: runs, their audit trails, directives and knowledge."""

    @server.resource(
        RUN_URI,
        name="run",
        title="Directive run status",
        description="A directive run's status: state, current step with its instructions, outputs, "
        "what it waits for (approvals, escalations), last calls. Subscribe to hear when it changes.",
        mime_type="application/json",
    )
    async def run_status(run_id: str) -> str:
        try:
            status = await (await link.runs()).status(run_id)
        except RunNotFound as exc:
            raise ResourceNotFoundError(_said(exc)) from None
        except KiwiError as exc:
            raise ResourceError(exc.message) from None
        return status.model_dump_json(indent=2)

    @server.resource(
        AUDIT_URI,
        name="run-audit",
        title="Directive run audit trail",
        description="Every audit record of a run written so far (.ai/logs/audit), oldest first, "
        "and the files or lines that could not be read.",
        mime_type="application/json",
    )
    async def run_audit(run_id: str) -> str:
        from kiwi.auditlog import read_audit_trail

        trail = await asyncio.to_thread(read_audit_trail, str(store.project_root), run_id)
        if not trail.records and not trail.problems:
            try:
                await (await link.runs()).status(run_id)
            except RunNotFound as exc:
                raise ResourceNotFoundError(_said(exc)) from None
            except KiwiError:
                pass  # Temporal is away: the files are the answer, and there are none yet
        return json.dumps({"run_id": run_id, "records": trail.records, "problems": trail.problems}, indent=2)

    @server.resource(
        DIRECTIVE_URI,
        name="directive",
        title="Directive",
        description="A directive's Markdown file (project space first).",
        mime_type="text/markdown",
    )
    async def directive(name: str) -> str:
        return _item_text(store, "directive", name)

    @server.resource(
        KNOWLEDGE_URI,
        name="knowledge",
        title="Knowledge entry",
        description="A knowledge entry's Markdown file with its front matter (project space first).",
        mime_type="text/markdown",
    )
    async def knowledge(zettel_id: str) -> str:
        return _item_text(store, "knowledge", zettel_id)


def _item_text(store: ItemStore, item_type: str, item_id: str) -> str:
    try:
        return store.load(item_type, item_id).text  # type: ignore[arg-type]
    except ItemNotFound as exc:
        raise ResourceNotFoundError(_said(exc)) from None


class ItemListing:
    """Middleware: ``resources/list`` also lists every directive and knowledge entry on disk now."""

    def __init__(self, store: ItemStore) -> None:
        self.store = store

    async def __call__(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        result = await call_next(ctx)
        if ctx.method != "resources/list" or not isinstance(result, dict):
            return result
        listed = list(result.get("resources") or [])
        # On the event loop: the store's SQLite connection belongs to this thread.
        for record in self.store.list_items(None):
            if record.item_type == "directive" and record.valid:
                uri = DIRECTIVE_URI.format(name=record.item_id)
            elif record.item_type == "knowledge" and record.valid:
                uri = KNOWLEDGE_URI.format(zettel_id=record.item_id)
            else:
                continue
            entry = {"uri": uri, "name": record.item_id, "mimeType": "text/markdown"}
            if record.description:
                entry["description"] = record.description
            listed.append(entry)
        return {**result, "resources": listed}


# A connection's state key: its subscriptions are released when it closes (set at its first one).
RELEASED_AT_CLOSE = "kiwi.subscriptions-released-at-close"


class RunWatches:
    """Middleware: while a ``subscriptions/listen`` stream names run URIs, watch those runs.

    One watcher per run however many streams name it (counted), publishing ``ResourceUpdated``
    for the run's status and audit URIs on the server's subscription bus when the status changes.
    Clients of 2025 protocol versions subscribe with ``resources/subscribe`` instead, and hear
    ``notifications/resources/updated`` on their session from the same watchers.
    """

    def __init__(self, link: TemporalLink, bus: SubscriptionBus) -> None:
        self.link = link
        self.bus = bus
        self._counts: dict[str, int] = {}
        self._watchers: dict[str, asyncio.Task[None]] = {}
        self._legacy: dict[tuple[Any, str], Any] = {}  # (connection, URI) -> a session of that connection

    async def __call__(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        if ctx.method != "subscriptions/listen":
            return await call_next(ctx)
        run_ids = _watched_runs(ctx.params)
        if not run_ids:
            return await call_next(ctx)
        async with self.watching(run_ids):
            return await call_next(ctx)

    @contextlib.asynccontextmanager
    async def watching(self, run_ids: list[str]) -> AsyncIterator[None]:
        for run_id in run_ids:
            await self._acquire(run_id)
        try:
            yield
        finally:
            for run_id in run_ids:
                self._release(run_id)

    async def _acquire(self, run_id: str) -> None:
        self._counts[run_id] = self._counts.get(run_id, 0) + 1
        if run_id not in self._watchers or self._watchers[run_id].done():
            # The state the subscriber is told about changes from is read before the subscription is
            # answered: a change right after it (another client completing the step) is never the
            # watcher's first sight, which it would take for the baseline and miss.
            first = await self._seen(run_id)
            self._watchers[run_id] = asyncio.create_task(self._watch(run_id, first), name=f"watch {run_id}")

    async def _seen(self, run_id: str) -> str | None:
        try:
            return (await (await self.link.runs()).status(run_id)).model_dump_json()
        except KiwiError:
            return None

    def _release(self, run_id: str) -> None:
        self._counts[run_id] -= 1
        if self._counts[run_id] == 0:
            del self._counts[run_id]
            watcher = self._watchers.pop(run_id, None)
            if watcher is not None:
                watcher.cancel()

    # 2025-era clients: resources/subscribe and resources/unsubscribe on their session.
    async def subscribe(
        self, ctx: ServerRequestContext[Any, Any], params: SubscribeRequestParams
    ) -> EmptyResult:
        connection = _connection(ctx)
        key = (connection, str(params.uri))
        if key not in self._legacy:
            if not connection.state.get(RELEASED_AT_CLOSE):
                # The connection's end releases what it subscribed to: a client that went without
                # unsubscribing held its entries (and the runs' watchers) for the life of the process.
                connection.state[RELEASED_AT_CLOSE] = True
                connection.exit_stack.callback(self._forget_connection, connection)
            # Any session object of the connection sends on its standalone stream, after this request too.
            self._legacy[key] = ctx.session
            if run_id := _run_of(key[1]):
                await self._acquire(run_id)
        return EmptyResult()

    async def unsubscribe(
        self, ctx: ServerRequestContext[Any, Any], params: UnsubscribeRequestParams
    ) -> EmptyResult:
        self._forget((_connection(ctx), str(params.uri)))
        return EmptyResult()

    def _forget_connection(self, connection: Any) -> None:
        for key in [k for k in self._legacy if k[0] is connection]:
            self._forget(key)

    def subscribed(self) -> int:
        """How many 2025-era subscriptions are held (connection and URI)."""
        return len(self._legacy)

    def _forget(self, key: tuple[Any, str]) -> None:
        if self._legacy.pop(key, None) is not None and (run_id := _run_of(key[1])):
            self._release(run_id)

    async def _watch(self, run_id: str, last: str | None = None) -> None:
        delay = FASTEST_POLL
        while True:
            try:
                status = await (await self.link.runs()).status(run_id)
            except (RunNotFound, RunInOtherProject):
                # (Another project's run is nothing this front end watches: it polled one until the stream
                # closed, each time refused. Review s38.)
                return
            except KiwiError as exc:
                # Temporal away or the query refused for now: keep watching, more slowly.
                logger.info("watching %s: %s", run_id, exc.message)
                delay = SLOWEST_POLL
                await asyncio.sleep(delay)
                continue
            seen = status.model_dump_json()
            if last is not None and seen != last:
                await self._publish(run_id)
                delay = FASTEST_POLL
            else:
                delay = min(delay * 1.5, SLOWEST_POLL)
            last = seen
            if status.status in TERMINAL:
                return
            await asyncio.sleep(delay)

    async def _publish(self, run_id: str) -> None:
        uris = (run_uri(run_id), audit_uri(run_id))
        for uri in uris:
            await self.bus.publish(ResourceUpdated(uri=uri))
        for key, session in [(k, v) for k, v in self._legacy.items() if k[1] in uris]:
            try:
                await session.send_resource_updated(key[1])
            except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
                self._forget(key)  # that client has gone without unsubscribing


def _connection(ctx: ServerRequestContext[Any, Any]) -> Any:
    """The client connection a request came on: what a 2025-era subscription belongs to."""
    return ctx.session._connection  # noqa: SLF001 - ServerSession is per request; no public accessor


def _run_of(uri: str) -> str:
    """The run a status or audit URI names ('' for any other URI)."""
    if not uri.startswith(RUNS_PREFIX):
        return ""
    run_id = uri[len(RUNS_PREFIX) :].removesuffix("/audit")
    return run_id if run_id and "/" not in run_id else ""


def _watched_runs(params: Any) -> list[str]:
    """The run ids named by a listen request's ``resourceSubscriptions`` (status or audit URI)."""
    notifications = params.get("notifications") if isinstance(params, Mapping) else None
    uris = notifications.get("resourceSubscriptions") if isinstance(notifications, Mapping) else None
    found: list[str] = []
    for uri in uris or []:
        run_id = _run_of(uri) if isinstance(uri, str) else ""
        if run_id and run_id not in found:
            found.append(run_id)
    return found


def _said(exc: KiwiError) -> str:
    """A refusal for the agent reading a resource: its hint names the MCP call, not the `kiwi` command."""
    from mcp_frontend.answers import agent_hint

    return f"{exc.message}; {agent_hint(exc.hint)}" if exc.hint else exc.message
