"""What Kiwi's MCP server offers beyond its four tools, plugged in by ``build_server`` in two lines.

Resources (runs, audit trails, directives, knowledge) with run watches for subscribers
(``resources.py``), directives as prompts (``prompts.py``), durable MCP Tasks backed by the
runs in Temporal (``tasks.py``), and escalations answered through input rounds (``input_rounds.py``). None of it holds run state: a restarted front end, or another one,
answers the same.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mcp.server.mcpserver import MCPServer
from mcp.server.subscriptions import InMemorySubscriptionBus
from mcp_types import SubscribeRequestParams, UnsubscribeRequestParams

from kiwi.items.store import ItemStore
from mcp_frontend.input_rounds import Approvals, Escalations, request_state_security
from mcp_frontend.prompts import DirectivePrompts
from mcp_frontend.resources import ItemListing, RunWatches, register_resources
from mcp_frontend.tasks import KiwiTasks

if TYPE_CHECKING:
    from mcp_frontend.link import TemporalLink

SERVER_NAME = "kiwi"  # the audience sealed into requestState: what MCPServer(name=...) says


class BeyondTools:
    """``MCPServer(..., **beyond.server_options())``, then ``beyond.attach(server)``."""

    def __init__(self, link: TemporalLink, store: ItemStore, client_name: str) -> None:
        self.link = link
        self.store = store
        self.bus = InMemorySubscriptionBus()
        self.watches = RunWatches(link, self.bus)
        self.prompts = DirectivePrompts(store)
        self.listing = ItemListing(store)
        self.tasks = KiwiTasks(link, client_name)
        self.escalations = Escalations(link, store)
        self.approvals = Approvals(link, store, client_name)

    def server_options(self) -> dict[str, Any]:
        return {
            "subscriptions": self.bus,
            "middleware": [self.listing, self.prompts, self.watches, self.escalations, self.approvals],
            "extensions": [self.tasks],
            "request_state_security": request_state_security(SERVER_NAME),
        }

    def attach(self, server: MCPServer) -> None:
        register_resources(server, self.link, self.store)
        self.prompts.server = server
        # 2025-era resources/subscribe: MCPServer has no decorator for it, the low-level server has.
        lowlevel = server._lowlevel_server  # noqa: SLF001
        lowlevel.add_request_handler("resources/subscribe", SubscribeRequestParams, self.watches.subscribe)
        lowlevel.add_request_handler(
            "resources/unsubscribe", UnsubscribeRequestParams, self.watches.unsubscribe
        )
