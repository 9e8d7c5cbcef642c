"""Serving the front end: stdio, and streamable HTTP with its bearer token, same-user check and
graceful stop."""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import os
import sys
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import mcp.types as mcp_types
from mcp.server.mcpserver import MCPServer
from mcp.server.stdio import stdio_server
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.message import SessionMessage
from pydantic import ValidationError
from temporalio.client import Client
from temporalio.service import RPCError

from kiwi.devserver import loopback, peer_uid  # ("" and 0.0.0.0, ::, bind every interface: not loopback)
from kiwi.errors import (
    KiwiError,
)
from kiwi.health import HealthApp, InFlight, OwnedServer, Readiness, WithHealth
from kiwi.registry.embedded import kept_while_serving
from mcp_frontend.link import CLOSE_SECONDS, DRAIN_SECONDS, PROBE_SECONDS, TemporalUnavailable
from mcp_frontend.server import build_server


class BearerToken:
    """ASGI middleware: every request must carry ``Authorization: Bearer <token>``."""

    def __init__(self, app: Any, token: str) -> None:
        self.app = app
        self.token = token.encode()

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = dict(scope.get("headers") or [])
            given = headers.get(b"authorization", b"")
            if not hmac.compare_digest(given, b"Bearer " + self.token):
                await _answer(
                    send, 401, {"error": "missing or wrong bearer token"}, (b"www-authenticate", b"Bearer")
                )
                return
        await self.app(scope, receive, send)


# Where the kernel lists TCP connections with their owners (Linux); see SameUser.
PROC_TABLES = Path("/proc/net/tcp").exists()


class SameUser:
    """ASGI middleware for a front end on loopback without a token: only processes of the user running it
    may call it.

    Every local user of the machine reaches 127.0.0.1, so without this any of them was the agent in your
    project, with your runs' grants. Whose process sent a request is whose socket the other end of its
    connection is (``kiwi.devserver.peer_uid``); where that cannot be read (not Linux), requests pass.
    """

    def __init__(self, app: Any, uid: int | None = None) -> None:
        self.app = app
        self.uid = os.getuid() if uid is None else uid

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            # (The connection's own ends: uvicorn runs with proxy headers off, so no X-Forwarded-For can
            # name another client. A connection the tables do not list is refused; only where there are no
            # such tables at all, not Linux, is every local process let in.)
            client, server = scope.get("client"), scope.get("server")
            owner = peer_uid(tuple(client), tuple(server)) if client and server else None
            if owner is None and PROC_TABLES:
                owner = -1
            if owner is not None and owner != self.uid:
                body = {
                    "error": "this MCP front end answers its own user's processes only",
                    "hint": "run your own `kiwi dev` or `kiwi mcp --http`; to share one, its owner sets "
                    "KIWI_MCP_TOKEN and gives you the token",
                }
                await _answer(send, 403, body)
                return
        await self.app(scope, receive, send)


class NoResume:
    """ASGI middleware: a GET that asks to resume a stream (``Last-Event-ID``) opens a fresh one, as if it did
    not ask (the spec lets a server replay, not makes it). Without an event store the SDK gave no answer at
    all (a 500 and an ASGI error in the log per request). Kiwi's events carry no ids, so nothing was missed
    that an id could name; a run's state is in Temporal, and ``tasks/get`` or the tools read it again."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope.get("method") == "GET":
            headers = scope.get("headers") or []
            if any(name.lower() == b"last-event-id" for name, _ in headers):
                kept = [(name, value) for name, value in headers if name.lower() != b"last-event-id"]
                scope = {**scope, "headers": kept}
        await self.app(scope, receive, send)


async def _answer(send: Any, status: int, body: dict[str, str], *headers: tuple[bytes, bytes]) -> None:
    """A JSON answer a middleware gives itself (a refusal), the request going no further."""
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), *headers],
        }
    )
    await send({"type": "http.response.body", "body": json.dumps(body).encode()})


# Host names (``name`` or ``name:port``) the HTTP front end answers besides its bind address.
ALLOWED_HOSTS_ENV = "KIWI_MCP_ALLOWED_HOSTS"


def http_app(
    server: MCPServer, host: str, port: int, ready: Readiness | None = None, *, stateless: bool = False
) -> Any:
    """The streamable HTTP app at ``/mcp`` (bearer token when ``KIWI_MCP_TOKEN`` is set), with ``/healthz``
    and ``/readyz`` beside it (no token: probes carry none and the answers reveal nothing).

    ``stateless`` keeps no MCP session in the process: every request stands alone, so front ends behind
    a load balancer can answer one client's requests in turn (the run state lives in Temporal anyway).
    """
    token = os.environ.get("KIWI_MCP_TOKEN", "")
    # Behind a proxy or a Service the Host header is the name clients use, not the bind address.
    public = [name.strip() for name in os.environ.get(ALLOWED_HOSTS_ENV, "").split(",") if name.strip()]
    if not token and (not loopback(host) or public):
        # Names for a proxy mean clients from elsewhere: a loopback bind behind a proxy is no protection.
        why = f"on {host or 'every interface'}" if not loopback(host) else f"for {ALLOWED_HOSTS_ENV} names"
        raise KiwiError(
            f"refusing to serve MCP {why} without a token",
            hint="set KIWI_MCP_TOKEN (clients send it as Authorization: Bearer), or bind to 127.0.0.1 "
            f"without {ALLOWED_HOSTS_ENV}",
        )
    hosts = ["127.0.0.1", "localhost", "[::1]"] if loopback(host) else [host]
    security = TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=[f"{h}:{port}" for h in hosts] + hosts + public,
        allowed_origins=[f"http://{h}:{port}" for h in hosts] + [f"https://{name}" for name in public],
    )
    app = server.streamable_http_app(transport_security=security, host=host, stateless_http=stateless)
    app = NoResume(app)
    # (Without a token the bind is loopback, see above: only this user's processes are let in.)
    return WithHealth(BearerToken(app, token) if token else SameUser(app), HealthApp(ready or _always_ready))


def _port_free(host: str, port: int) -> bool:
    """Whether ``host:port`` can be bound now (uvicorn, finding it taken, ended in a traceback)."""
    import socket

    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host.strip("[]") or "0.0.0.0", port))
        except OSError:
            return False
    return True


def _not_cut_off(record: logging.LogRecord) -> bool:
    """Keep uvicorn from logging a traceback for each request it cuts off after the drain, or a line on them
    (serve_http says how many it cut off)."""
    error = record.exc_info[1] if record.exc_info else None
    if isinstance(error, asyncio.CancelledError) and "graceful shutdown" in str(error):
        return False
    # (Nor its own line on them, "ERROR: Cancel 1 running task(s), timeout graceful shutdown exceeded", after
    # Kiwi's: README trial s39 read it as a failure of the drain.)
    return "timeout graceful shutdown exceeded" not in record.getMessage()


def _say(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


async def _always_ready() -> bool:
    return True


async def serve_stdio(
    project_root: Path | None = None,
    task_queue: str = "kiwi",
    *,
    address: str | None = None,
    namespace: str | None = None,
    client: Client | None = None,
) -> None:
    """``kiwi mcp``: the front end on stdin/stdout, up whether or not Temporal is (see :class:`TemporalLink`).

    A line that is not JSON, or not a JSON-RPC message, gets a JSON-RPC error with id null
    (-32700 parse error, -32600 invalid request) instead of the SDK's silence.
    """
    server = build_server(client, project_root, task_queue=task_queue, address=address, namespace=namespace)
    # (A local registry a request starts stays up for the next ones: trial F19.)
    with kept_while_serving():
        await _serve_stdio(server)


async def _serve_stdio(server: MCPServer) -> None:
    lowlevel = server._lowlevel_server  # noqa: SLF001 - run() over our own streams; the SDK offers no hook
    async with stdio_server() as (read_stream, write_stream):
        checked_send, checked_receive = anyio.create_memory_object_stream[SessionMessage | Exception](0)

        async def answer_malformed() -> None:
            async with checked_send:
                async for item in read_stream:
                    if isinstance(item, Exception):
                        await write_stream.send(SessionMessage(malformed_reply(item)))
                    else:
                        await checked_send.send(item)

        async with anyio.create_task_group() as group:
            group.start_soon(answer_malformed)
            await lowlevel.run(checked_receive, write_stream, lowlevel.create_initialization_options())
            group.cancel_scope.cancel()


def malformed_reply(exc: Exception) -> mcp_types.JSONRPCError:
    """The JSON-RPC error for a line the transport could not read as a message."""
    errors = exc.errors() if isinstance(exc, ValidationError) else []
    if any(e.get("type") == "json_invalid" for e in errors) or not errors:
        error = mcp_types.ErrorData(
            code=mcp_types.PARSE_ERROR,
            message="Parse error: the line is not JSON; send one JSON-RPC 2.0 message per line",
        )
    else:
        error = mcp_types.ErrorData(
            code=mcp_types.INVALID_REQUEST,
            message="Invalid Request: not a JSON-RPC 2.0 "
            'message (expected {"jsonrpc": "2.0", "method": ..., "id": ...})',
        )
    return mcp_types.JSONRPCError(jsonrpc="2.0", id=None, error=error)


async def serve_http(
    client: Client | None,
    host: str,
    port: int,
    stop: asyncio.Event | None = None,
    task_queue: str = "kiwi",
    *,
    stateless: bool = False,
    address: str | None = None,
    namespace: str | None = None,
    announce: Callable[[], None] | None = None,
    drain_seconds: float = DRAIN_SECONDS,
) -> None:
    """``kiwi mcp --http``: serve until ``stop`` is set. ``/readyz`` is ready while Temporal answers a
    health check and the front end is not stopping. With ``client`` None, up whether or not Temporal is
    (see :class:`TemporalLink`): a probe tries to connect, within its own 2 s. ``announce`` is called once
    the settings are checked and the port is free (a front end that refuses to start never said it serves).
    Once ``stop`` is set, the answers in flight have ``drain_seconds`` to be given before the port closes."""
    import uvicorn

    server = build_server(client, task_queue=task_queue, address=address, namespace=namespace)

    async def ready() -> bool:
        if stop is not None and stop.is_set():
            return False
        try:
            runs = await server.temporal.runs(timeout=PROBE_SECONDS)
            return await runs.client.service_client.check_health(timeout=timedelta(seconds=PROBE_SECONDS))
        except (RPCError, TemporalUnavailable):
            return False

    app = InFlight(http_app(server, host, port, ready, stateless=stateless))
    if not _port_free(host, port):
        raise KiwiError(
            f"the MCP port {host}:{port} is in use (another `kiwi mcp` or `kiwi dev`, perhaps)",
            hint="stop it, or choose another with --port",
        )
    if announce is not None:
        announce()
    # No proxy headers: uvicorn's default took X-Forwarded-For from any local client (it trusts 127.0.0.1 as a
    # proxy), so the client address SameUser checks was whatever the client said.
    # A bounded close after the drain: uvicorn waited for every open connection, a client's listening stream
    # or a request it never finished sending included, and the front end never exited (review s22 F-1).
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        lifespan="on",
        proxy_headers=False,
        timeout_graceful_shutdown=CLOSE_SECONDS,
    )
    logging.getLogger("uvicorn.error").addFilter(_not_cut_off)  # (a filter added again is kept once)
    # The SDK says at INFO that it started and that each client's session began: a line per client on the
    # front end's stderr, which is for what needs an operator (warnings, errors).
    for name in ("mcp.server.streamable_http_manager", "mcp.server.streamable_http"):
        logging.getLogger(name).setLevel(logging.WARNING)
    web = OwnedServer(config) if stop is not None else uvicorn.Server(config)
    with kept_while_serving():
        await _serve_until(web, app, stop, drain_seconds)


async def _serve_until(web: Any, app: InFlight, stop: asyncio.Event | None, drain_seconds: float) -> None:
    task = asyncio.create_task(web.serve())
    if stop is not None:
        await stop.wait()
        # Draining: /readyz answers 503 from now on, and the port stays open until the answers in flight
        # are given (trial F37: closed at once, it cut a call's answer off, and the client's resume of its
        # stream found nothing listening).
        if app.count:
            _say(f"kiwi mcp: stopping; {app.count} answer(s) in flight have {drain_seconds:g}s to be given")
        if not await app.drained(drain_seconds):
            _say(f"kiwi mcp: {app.count} answer(s) still in flight after {drain_seconds:g}s: cut off")
        web.should_exit = True
    await task
