"""Liveness and readiness over HTTP for orchestrators (Kubernetes probes, load balancers, compose).

``/healthz`` answers 200 while the process's event loop answers at all (liveness: restart me if not).
``/readyz`` answers 200 only while the process can do its work (readiness: send me traffic, or count
me as polling) and 503 before it is connected and while it drains on SIGTERM.

The answers carry a status word and nothing else: no address, namespace, version or error text, so the
endpoints can face a cluster network without telling it anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import uvicorn

LIVENESS_PATH = "/healthz"
READINESS_PATH = "/readyz"
HEALTH_PATHS = (LIVENESS_PATH, READINESS_PATH)

Readiness = Callable[[], Awaitable[bool]]


class HealthApp:
    """An ASGI app answering ``/healthz`` and ``/readyz`` (GET or HEAD); 404 for anything else."""

    def __init__(self, ready: Readiness) -> None:
        self.ready = ready
        self._checking: asyncio.Future[bool] | None = None

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path, method = scope.get("path", ""), scope.get("method", "GET")
        if method not in ("GET", "HEAD"):
            status, body = 405, {"status": "method not allowed"}
        elif path == LIVENESS_PATH:
            status, body = 200, {"status": "ok"}
        elif path == READINESS_PATH:
            ok = await self._ready()
            status, body = (200, {"status": "ready"}) if ok else (503, {"status": "not ready"})
        else:
            status, body = 404, {"status": "not found"}
        payload = json.dumps(body).encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(payload)).encode()),
                    (b"cache-control", b"no-store"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": b"" if method == "HEAD" else payload})

    async def _ready(self) -> bool:
        """Probes that arrive while a check is running share its answer: each check is a call to Temporal
        (up to 3 s), and a flood of probes made as many at once."""
        if self._checking is None or self._checking.done():
            self._checking = asyncio.ensure_future(self._check())
        return await asyncio.shield(self._checking)

    async def _check(self) -> bool:
        # A probe must answer within its own timeout: a readiness check that hangs is a "no".
        try:
            return bool(await asyncio.wait_for(self.ready(), timeout=3))
        except (TimeoutError, OSError, RuntimeError):
            return False


async def _lifespan(receive: Any, send: Any) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


class WithHealth:
    """ASGI: ``/healthz`` and ``/readyz`` go to ``health`` (no token: probes carry none, and the answers
    reveal nothing); every other path goes to ``app``."""

    def __init__(self, app: Any, health: HealthApp) -> None:
        self.app = app
        self.health = health

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope.get("path") in HEALTH_PATHS:
            await self.health(scope, receive, send)
            return
        await self.app(scope, receive, send)


class InFlight:
    """ASGI: counts the requests in flight that carry an answer (every one but a GET), so a front end stopping
    on SIGTERM keeps serving until the answers it owes are given (:meth:`drained`). A call's answer streams
    back on its POST; a GET only listens for notifications, never ends by itself, and is not waited for."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.count = 0
        self._idle = asyncio.Event()
        self._idle.set()

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        counted = scope["type"] == "http" and scope.get("method") not in ("GET", "HEAD")
        if not counted:
            await self.app(scope, receive, send)
            return
        self.count += 1
        self._idle.clear()
        try:
            await self.app(scope, receive, send)
        finally:
            self.count -= 1
            if not self.count:
                self._idle.set()

    async def drained(self, seconds: float) -> bool:
        """Wait until no answer is in flight, at most ``seconds``; False when some still were then."""
        try:
            await asyncio.wait_for(self._idle.wait(), seconds)
        except TimeoutError:
            return False
        return True


class OwnedServer(uvicorn.Server):
    """A uvicorn server that leaves SIGTERM and SIGINT to the process that runs it.

    uvicorn takes both signals while it serves and stops itself on them; a worker draining on SIGTERM
    must keep answering ``/readyz`` (503) until the drain ends, so the process stops it instead.
    """

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def bind_health(host: str, port: int) -> socket.socket:
    """The listening socket of the health endpoints, bound now so a taken port stops the process at
    start instead of leaving it running with probes that never answer."""
    from kiwi.errors import KiwiError

    try:
        return socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET)
    except OSError as exc:
        raise KiwiError(
            f"cannot serve the health endpoints on {host}:{port}: {exc.strerror}",
            hint="choose another --health-port, or stop what listens there",
        ) from None


async def serve_health(listener: socket.socket, ready: Readiness, stop: asyncio.Event) -> None:
    """Serve :class:`HealthApp` on ``listener`` (see :func:`bind_health`) until ``stop`` is set."""
    config = uvicorn.Config(HealthApp(ready), log_level="warning", lifespan="off")
    web = OwnedServer(config)
    task = asyncio.create_task(web.serve(sockets=[listener]))
    waiter = asyncio.create_task(stop.wait())
    await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    web.should_exit = True
    waiter.cancel()
    await task
    listener.close()
