"""The front end's link to Temporal: connected lazily, probed, and reconnected when it goes away;
items (search, load, help) never wait for it."""

from __future__ import annotations

import asyncio

from temporalio.client import Client

from kiwi.errors import (
    KiwiError,
)
from kiwi.items.store import ItemStore
from kiwi.runs import RunClient


class TemporalUnavailable(KiwiError):
    """Temporal cannot be reached; run actions wait for it, items (search, load, help) do not."""

    type = "TemporalUnavailable"


class TemporalLink:
    """The front end's way to Temporal, made on first need and again after a failed attempt.

    ``kiwi mcp`` starts without Temporal, so an agent can search, load and read help from the
    local items while Temporal is down. A run action connects (once, with a timeout; never a retry
    loop) and, if Temporal is still not there, answers with an error naming its address.
    """

    def __init__(
        self,
        store: ItemStore,
        task_queue: str,
        client: Client | None = None,
        address: str | None = None,
        namespace: str | None = None,
    ) -> None:
        self.store = store
        self.task_queue = task_queue
        self.address = address
        self.namespace = namespace
        self._runs = RunClient(client, store, task_queue=task_queue) if client is not None else None
        self._lock = asyncio.Lock()

    async def runs(self, timeout: float = 0.0) -> RunClient:
        """The run client, connecting first if need be (within ``timeout`` seconds, default CONNECT_TIMEOUT)."""
        if self._runs is not None:
            return self._runs
        from kiwi.connect import connect, target

        try:
            # The time covers the wait for an attempt already under way too (one at a time): a flood of
            # readiness probes (they carry no token) must not queue every caller behind its 2 s each.
            async with asyncio.timeout(timeout or CONNECT_TIMEOUT), self._lock:
                if self._runs is None:
                    client = await connect(self.address, self.namespace)
                    self._runs = RunClient(client, self.store, task_queue=self.task_queue)
        except (RuntimeError, OSError, TimeoutError):
            raise TemporalUnavailable(
                f"Temporal is not reachable at {target(self.address, self.namespace)[0]}, so runs cannot "
                "start or be steered now",
                hint="start it with `kiwi dev` (or point KIWI_TEMPORAL_ADDRESS / --address at a running "
                "server) and try again; search, load and help work meanwhile",
            ) from None
        return self._runs


CONNECT_TIMEOUT = 10.0
# How long a readiness probe waits for Temporal (a connection, then its health check).
PROBE_SECONDS = 2.0
# On SIGTERM, how long the answers in flight have before the HTTP front end closes its port (kiwi mcp
# --drain-seconds; the worker's drain has the same default).
DRAIN_SECONDS = 30.0
# After the drain, how long the connections still open (listening streams, requests never finished) have to
# close before they are cut.
CLOSE_SECONDS = 3.0
