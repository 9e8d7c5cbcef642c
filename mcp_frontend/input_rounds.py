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

A user who declines leaves the escalation to ``kiwi decide``.

Approvals the same way, opted into on their own (``input_rounds: {approvals: true, sign_as: KEY}``):
a call that waits for approval answers, instead of ``pending``, with a form showing exactly what
will run (tool, arguments, the call's hash); the user's approve or reject is sent as ``kiwi approve``
would send it, signed by ``sign_as`` over the run, the request and that hash, and the retry answers
with the call's result. The client's user may be the agent itself, which is why it is a separate
switch, off by default.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.request_state import RequestStateSecurity
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from kiwi.errors import ItemInvalid, KiwiError
from kiwi.guards import digest, redact
from kiwi.harness import InputRounds, load_harness
from kiwi.items.store import ItemStore
from kiwi.keys import keys_dir
from kiwi.toolargs import inner_call

if TYPE_CHECKING:
    from mcp_frontend.link import TemporalLink

logger = logging.getLogger(__name__)

STATE_KEY_ENV = "KIWI_MCP_STATE_KEY"
STATE_KEY_FILE = "mcp-request-state.secret"
# An escalation can wait for its human; the sealed state outlives the default ten minutes.
STATE_TTL_SECONDS = 24 * 3600.0
REQUEST_KEY = "escalation"
APPROVAL_KEY = "approval"
# A call sent in a client that can ask its user: how long before a call waiting for approval asks.
APPROVAL_ASK_WAIT = 2.0


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


class Approvals(Escalations):
    """Middleware for ``tools/call execute(call, run_id)``: a call waiting for approval asks the client's user."""

    def __init__(self, link: TemporalLink, store: ItemStore, client_name: str) -> None:
        super().__init__(link, store)
        self.client_name = client_name

    async def __call__(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        params = ctx.params if isinstance(ctx.params, Mapping) else {}
        arguments = params.get("arguments") if isinstance(params.get("arguments"), Mapping) else {}
        if (
            ctx.method != "tools/call"
            or params.get("name") != "execute"
            or arguments.get("action") != "call"
            or not arguments.get("run_id")
            or not self.settings().approvals
            or not _asks_its_user(ctx)
        ):
            return await call_next(ctx)
        state = params.get("requestState")
        if isinstance(state, str):
            return await self._decided(ctx, state, params.get("inputResponses"), arguments)
        if "wait_seconds" not in arguments:
            # A call held for approval asks soon. A copy: the requestState is bound to the call as sent.
            ctx = replace(
                ctx, params={**params, "arguments": {**arguments, "wait_seconds": APPROVAL_ASK_WAIT}}
            )
        result = await call_next(ctx)
        pending = _structured(result)
        if pending.get("status") != "pending":
            return result
        run_id, call_id = str(arguments["run_id"]), str((pending.get("result") or {}).get("call_id") or "")
        # A kiwi-mcp.execute waits on the call it makes: that call's request, and its arguments shown.
        tool, parameters = inner_call(str(pending.get("tool") or ""), arguments.get("parameters"))
        request = await self._request_of(run_id, tool, parameters)
        if request is None or not call_id:
            return result  # slow, not waiting for a human: the agent polls as usual
        return {
            "resultType": "input_required",
            "inputRequests": {APPROVAL_KEY: _approval_form(run_id, request, parameters)},
            "requestState": json.dumps(
                {"run_id": run_id, "request_id": request.request_id, "call_id": call_id}
            ),
        }

    async def _request_of(self, run_id: str, tool: str, parameters: Any) -> Any:
        """The run's pending approval request for this very call (tool and argument hash), if any."""
        status = await (await self.link.runs()).status(run_id)
        wanted = digest([tool, parameters if isinstance(parameters, dict) else {}])
        pending = [a for a in status.approvals if a.status == "pending" and a.tool == tool]
        return next((a for a in pending if a.args_hash == wanted), None)

    async def _decided(
        self, ctx: ServerRequestContext[Any, Any], state: str, responses: Any, arguments: Mapping[str, Any]
    ) -> HandlerResult:
        try:
            named = json.loads(state)
            run_id, request_id, call_id = (
                str(named["run_id"]),
                str(named["request_id"]),
                str(named["call_id"]),
            )
        except (ValueError, KeyError, TypeError):
            return _call_result(
                {"error": "InputInvalid", "message": "the requestState does not name an approval"}
            )
        if arguments.get("run_id") != run_id:
            return _call_result({"error": "InputInvalid", "message": "the retry names another run"})
        runs = await self.link.runs()
        answer = (responses or {}).get(APPROVAL_KEY) if isinstance(responses, Mapping) else None
        content = answer.get("content") if isinstance(answer, Mapping) else None
        decision = str((content or {}).get("decision") or "") if isinstance(content, Mapping) else ""
        if (
            not isinstance(answer, Mapping)
            or answer.get("action") != "accept"
            or decision
            not in (
                "approve",
                "reject",
            )
        ):
            return _call_result(
                {
                    "status": "pending",
                    "run_id": run_id,
                    "result": {"call_id": call_id, "run_id": run_id},
                    "reason": f"the user did not decide; the call waits for `kiwi approve {run_id} {request_id}`",
                    "hint": f"poll with execute(item_type='run', action='poll', run_id='{run_id}', "
                    f"item_id='{call_id}')",
                }
            )
        note = str(content.get("reason") or "") if isinstance(content, Mapping) else ""
        who = _client_identity(ctx)
        try:
            await runs.decide_approval(
                run_id,
                request_id,
                decision == "approve",
                by=self.settings().sign_as,
                reason=f"answered by the user of MCP client {who}" + (f": {note}" if note else ""),
            )
        except KiwiError as exc:
            return _call_result(
                {
                    "error": exc.type,
                    "run_id": run_id,
                    "request_id": request_id,
                    "message": exc.message,
                    "hint": exc.hint,
                }
            )
        wait = arguments.get("wait_seconds")
        result = await runs.poll_call(
            run_id, call_id, wait_seconds=float(wait) if isinstance(wait, int | float) and wait > 0 else 20.0
        )
        return _call_result(result.model_dump())


def _call_result(answer: dict[str, Any]) -> dict[str, Any]:
    return _tool_result(answer, "tool", "call")


def _approval_form(run_id: str, request: Any, parameters: Any) -> dict[str, Any]:
    shown = json.dumps(redact(parameters if isinstance(parameters, dict) else {}), indent=2)
    if len(shown) > 4000:
        shown = shown[:4000] + "\n... (cut; the call hash covers all of it)"
    return {
        "method": "elicitation/create",
        "params": {
            "mode": "form",
            "message": f"Run {run_id} asks to run {request.summary} ({request.tool}). It runs only if you "
            f"approve.\nArguments:\n{shown}\nCall hash: {request.args_hash} (request {request.request_id}, "
            f"until {request.expires_at})",
            "requestedSchema": {
                "type": "object",
                "properties": {
                    "decision": {"type": "string", "title": "Your decision", "enum": ["approve", "reject"]},
                    "reason": {"type": "string", "title": "Reason (optional)"},
                },
                "required": ["decision"],
            },
        },
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


def _tool_result(answer: dict[str, Any], item_type: str = "run", action: str = "escalate") -> dict[str, Any]:
    """The tool's answer on the wire; an answer with ``error`` is an isError result in the seeds' shape."""
    is_error = "error" in answer
    if is_error:
        item_id = str(answer.get("request_id") or answer.get("run_id") or "")
        answer = {"item_type": item_type, "action": action, "item_id": item_id, "hint": "", **answer}
    return {
        "resultType": "complete",
        "content": [{"type": "text", "text": json.dumps(answer, indent=2 if is_error else None)}],
        "structuredContent": answer,
        "isError": is_error,
    }
