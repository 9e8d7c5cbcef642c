"""Escalations answered by the client's user through MCP input rounds (SEP-2322, protocol 2026-07-28).

When the harness opts in (``input_rounds: {escalations: true, sign_as: KEY}`` in
``agent_harness.yaml``) and the client can ask its user (it declares ``elicitation`` on the request),
``help(action="escalate")`` still escalates (the run waits as ``awaiting_human``, exactly as without
rounds), and answers with an ``InputRequiredResult``: a form with the escalation's reason and options.
The client asks its user and retries the same call with the answer and the ``requestState``, which
names only the run and the escalation; the SDK seals it with a key every front end of this machine
shares (``KIWI_MCP_STATE_KEY``, else a secret kept next to your keys), so any front end takes the
retry, before or after a restart. The answer is sent as ``kiwi decide`` would send it, signed by
the ``sign_as`` approver key, and the note records which client's user gave it.

A user who declines leaves the escalation to ``kiwi decide``. Approvals never go
this way: a call's approval must come from someone the agent cannot be, and a client's user may be
the agent itself.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.request_state import RequestStateSecurity
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from kiwi.errors import ItemInvalid, KiwiError
from kiwi.harness import InputRounds, load_harness
from kiwi.items.store import ItemStore
from kiwi.keys import keys_dir

if TYPE_CHECKING:
    from mcp_frontend.server import TemporalLink

logger = logging.getLogger(__name__)

STATE_KEY_ENV = "KIWI_MCP_STATE_KEY"
STATE_KEY_FILE = "mcp-request-state.secret"
# An escalation can wait for its human; the sealed state outlives the default ten minutes.
STATE_TTL_SECONDS = 24 * 3600.0
REQUEST_KEY = "escalation"


def request_state_security(name: str) -> RequestStateSecurity:
    """Sealing for ``requestState`` that every front end of this machine (or of one deployment) shares."""
    secret = os.environ.get(STATE_KEY_ENV, "")
    if not secret:
        try:
            secret = _machine_secret()
        except OSError as exc:
            logger.warning("input rounds: no shared state key (%s); only this process takes retries", exc)
            return RequestStateSecurity.ephemeral(ttl=STATE_TTL_SECONDS, audience=name)
    return RequestStateSecurity(keys=[secret], ttl=STATE_TTL_SECONDS, audience=name)


def _machine_secret() -> str:
    folder = keys_dir()
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = folder / STATE_KEY_FILE
    with contextlib.suppress(FileExistsError):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(os.urandom(32).hex())
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd) as handle:
        return handle.read().strip()


class Escalations:
    """Middleware for ``tools/call help(action="escalate")``: the round trip through the client's user."""

    def __init__(self, link: TemporalLink, store: ItemStore) -> None:
        self.link = link
        self.store = store

    def settings(self) -> InputRounds:
        try:
            return load_harness(self.store.project_root, self.store.user).input_rounds
        except ItemInvalid:
            return InputRounds()  # a broken harness opts into nothing; run actions report it

    async def __call__(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        params = ctx.params if isinstance(ctx.params, Mapping) else {}
        arguments = params.get("arguments") if isinstance(params.get("arguments"), Mapping) else {}
        if (
            ctx.method != "tools/call"
            or params.get("name") != "help"
            or arguments.get("action") != "escalate"
            or not self.settings().escalations
            or not _asks_its_user(ctx)
        ):
            return await call_next(ctx)
        state = params.get("requestState")
        if isinstance(state, str):
            return await self._retry(ctx, state, params.get("inputResponses"), arguments)
        result = await call_next(ctx)
        escalated = _structured(result)
        if escalated.get("status") != "escalated":
            return result
        status = await (await self.link.runs()).status(escalated["run_id"])
        request = next((d for d in status.decisions if d.request_id == escalated["request_id"]), None)
        if request is None:
            return result
        return {
            "resultType": "input_required",
            "inputRequests": {REQUEST_KEY: _form(status.run_id, request.reason, request.options)},
            "requestState": json.dumps({"run_id": status.run_id, "request_id": request.request_id}),
        }

    async def _retry(
        self, ctx: ServerRequestContext[Any, Any], state: str, responses: Any, arguments: Mapping[str, Any]
    ) -> HandlerResult:
        try:
            named = json.loads(state)
            run_id, request_id = str(named["run_id"]), str(named["request_id"])
        except (ValueError, KeyError, TypeError):
            return _tool_result(
                {"error": "InputInvalid", "message": "the requestState does not name an escalation"}
            )
        if arguments.get("run_id") not in (None, run_id):
            return _tool_result({"error": "InputInvalid", "message": "the retry names another run"})
        answer = (responses or {}).get(REQUEST_KEY) if isinstance(responses, Mapping) else None
        outcome = await self.answer(ctx, run_id, request_id, answer)
        return _tool_result(outcome)

    async def answer(
        self, ctx: ServerRequestContext[Any, Any], run_id: str, request_id: str, answer: Any
    ) -> dict[str, Any]:
        """Send the user's answer to the run as a signed decision; what the agent is told."""
        waiting = {
            "status": "escalated",
            "run_id": run_id,
            "request_id": request_id,
            "message": f"the user did not answer; the run waits until a human runs `kiwi decide {run_id} "
            f"{request_id} OPTION`",
        }
        if not isinstance(answer, Mapping) or answer.get("action") != "accept":
            return waiting
        content = answer.get("content") if isinstance(answer.get("content"), Mapping) else {}
        option = str(content.get("option") or "")
        note = str(content.get("note") or "")
        who = _client_identity(ctx)
        signer = self.settings().sign_as
        try:
            await (await self.link.runs()).decide(
                run_id,
                request_id,
                option,
                by=signer,
                note=f"answered by the user of MCP client {who}" + (f": {note}" if note else ""),
            )
        except KiwiError as exc:
            return {
                "error": exc.type,
                "run_id": run_id,
                "request_id": request_id,
                "message": exc.message,
                "hint": exc.hint,
            }
        return {
            "status": "decided",
            "run_id": run_id,
            "request_id": request_id,
            "option": option,
            "by": signer,
            "client": who,
            "message": "the answer is sent to the run, signed; read it in the run's status under 'decisions'",
        }


def _asks_its_user(ctx: ServerRequestContext[Any, Any]) -> bool:
    capabilities = ctx.session.client_capabilities
    return ctx.protocol_version in MODERN_PROTOCOL_VERSIONS and bool(
        capabilities and capabilities.elicitation
    )


def _client_identity(ctx: ServerRequestContext[Any, Any]) -> str:
    params = ctx.session.client_params
    info = params.client_info if params is not None else None
    return f"{info.name} {info.version}".strip() if info is not None else "(unnamed client)"


def _form(run_id: str, reason: str, options: list[str]) -> dict[str, Any]:
    choice: dict[str, Any] = {"type": "string", "title": "Your decision"}
    if options:
        choice["enum"] = list(options)
    return {
        "method": "elicitation/create",
        "params": {
            "mode": "form",
            "message": f"Run {run_id} asks a human to decide: {reason or '(no reason given)'}"
            + (f"\nOptions: {', '.join(options)}" if options else ""),
            "requestedSchema": {
                "type": "object",
                "properties": {"option": choice, "note": {"type": "string", "title": "Note (optional)"}},
                "required": ["option"],
            },
        },
    }


def _structured(result: HandlerResult) -> dict[str, Any]:
    value = result.get("structuredContent") if isinstance(result, Mapping) else None
    return value if isinstance(value, dict) else {}


def _tool_result(answer: dict[str, Any]) -> dict[str, Any]:
    return {
        "resultType": "complete",
        "content": [{"type": "text", "text": json.dumps(answer)}],
        "structuredContent": answer,
        "isError": False,
    }
