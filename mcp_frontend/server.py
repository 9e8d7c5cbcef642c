"""Kiwi's MCP front end: four tools (search, load, execute, help) over stdio or streamable HTTP.

Thin by design: it resolves items, starts runs, sends updates and signals, runs queries and
translates errors into the seeds' shape ``{error, item_type, action, item_id, message, hint}``.
It keeps no run state, so restarting it mid-run loses nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import os
import re
import sys
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, Literal

import anyio
import mcp.types as mcp_types
import pydantic_core
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.stdio import stdio_server
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.message import SessionMessage
from opentelemetry import trace
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from temporalio.client import Client
from temporalio.service import RPCError

from kiwi.contracts import STUCK_ATTEMPTS_FOR_HUMAN, HelpRequest, ToolCallResult
from kiwi.devserver import loopback, peer_uid  # ("" and 0.0.0.0, ::, bind every interface: not loopback)
from kiwi.errors import (
    InputInvalid,
    ItemInvalid,
    KiwiError,
    PermissionDenied,
    Problem,
    RunInOtherProject,
    RunStateConflict,
)
from kiwi.explain import grants_some_call, outside_run_hint, tool_not_found
from kiwi.harness import load_harness
from kiwi.health import HealthApp, InFlight, OwnedServer, Readiness, WithHealth
from kiwi.items.authoring import copy_to_project as copy_to_project_
from kiwi.items.authoring import delete_item, link_knowledge, save_directive, save_knowledge
from kiwi.items.directive import Directive
from kiwi.items.store import ItemStore, find_project_root, item_kind, project_root_problem
from kiwi.policy import PermissionSet
from kiwi.registry import RegistryRefused
from kiwi.registry.embedded import kept_while_serving
from kiwi.registry.local import write_pulled
from kiwi.runs import RunClient
from kiwi.toolargs import CONTROL_CHARACTERS, check_arguments, json_kind, stray_argument
from kiwi.upstream.catalog import McpCatalog
from mcp_frontend.capabilities import BeyondTools
from mcp_frontend.resources import RunWatches
from workflows.directive_run.options import HELD

INSTRUCTIONS = """Kiwi runs directives (reusable workflow specs) durably on Temporal.
Typical flow: search(item_type="directive", query=...) → load(...) to read its steps and inputs →
execute(item_type="directive", action="run", item_id=NAME, parameters={inputs}) → follow the current
step's instructions, making tool calls with execute(item_type="tool", action="call", run_id=...,
item_id=TOOL, parameters={args}) → execute(item_type="run", action="complete_step", run_id=...,
parameters={"step": NAME, "outputs": {...}}). Every call is checked against the directive's permissions.
Use help(action="stuck"|"escalate"|"checkpoint", run_id=...) when you need a human."""

ItemKind = Literal["directive", "tool", "knowledge", "run", "mcp", "script"]
# Item spaces: 'project' (the project's .ai/; 'local' is the same, as in Kiwi MCP) and 'user'.
Source = Literal["all", "project", "local", "user", "registry"]


EXECUTE_DESCRIPTION = """Act on an item or a run. A run's id always goes in run_id. One example per action:
- directive run: execute(item_type='directive', action='run', item_id='hello_kiwi', parameters={'name': 'Ada'}) \
-> run_id, state, current_step (what to do now), tool_context, permissions
- directive validate: execute(item_type='directive', action='validate', item_id='hello_kiwi'); a draft before \
it is written: parameters={'content': ...}
- directive create / update: execute(item_type='directive', action='create', item_id='tidy', \
parameters={'content': 'the whole Markdown file with its xml block'}) (only a valid directive is written)
- directive / knowledge delete: execute(item_type='knowledge', action='delete', item_id='note-1', \
parameters={'confirm': true})
- knowledge create / update: execute(item_type='knowledge', action='create', item_id='note-1', \
parameters={'title': 'T', 'entry_type': 'note', 'category': 'c', 'tags': ['t'], 'content': 'text'}); \
execute(item_type='knowledge', action='update', item_id='note-1', parameters={...the same fields...})
- knowledge link: execute(item_type='knowledge', action='link', item_id='note-1', \
parameters={'to': 'note-2', 'relation': 'references'})
- tool create / update (a proposal a human accepts; nothing runs it before): execute(item_type='tool', \
action='create', item_id='slug', parameters={'manifest': 'the whole tool.yaml', 'files': {'main.py': '...'}})
- directive / tool / knowledge publish (to the shared registry; only an item a human signed with their own \
key): execute(item_type='directive', action='publish', item_id='tidy') (parameters={'version': '1.2.0'} \
for knowledge without one)
- run status: execute(item_type='run', action='status', run_id='run-hello_kiwi-1a2b3c')
- run complete_step: execute(item_type='run', action='complete_step', run_id='run-hello_kiwi-1a2b3c', \
parameters={'step': 'confirm', 'outputs': {'confirmed': true}})
- run cancel: execute(item_type='run', action='cancel', run_id='run-hello_kiwi-1a2b3c')
- run poll (a call that answered 'pending'): execute(item_type='run', action='poll', \
run_id='run-hello_kiwi-1a2b3c', item_id='CALL_ID')
- tool call: execute(item_type='tool', action='call', run_id='run-hello_kiwi-1a2b3c', \
item_id='filesystem.read', parameters={'path': 'notes/hello.md'}) (action='run' is the same; a built-in, local or SERVER.TOOL id; \
parameters are its arguments; with run_id the run's grants apply, without it the base policy of \
agent_harness.yaml); in a run whose directive grants them, also Kiwi's meta-tools kiwi-mcp.search, \
kiwi-mcp.load, kiwi-mcp.help, kiwi-mcp.execute (help(topic='kiwi-mcp'))
- mcp call (a tool of an external MCP server, the same as a tool call): execute(item_type='mcp', \
action='call', run_id='run-hello_kiwi-1a2b3c', item_id='clock.get_current_time', parameters={'timezone': 'UTC'})
- script call (a legacy .ai/scripts tool, the same as a tool call): execute(item_type='script', \
action='call', run_id='run-hello_kiwi-1a2b3c', item_id='shout', parameters={'text': 'hi'})"""


class SearchAnswer(BaseModel):
    """search's answer (its outputSchema); errors come as isError results in the seeds' error shape."""

    model_config = ConfigDict(extra="allow")
    results: list[dict[str, Any]] = Field(
        description="best first. directive/tool/knowledge: item_id, item_type, source ('project' or "
        "'user', the values search and load take), name, description, category, tags, path, valid, "
        "problems, score, snippet; run: run_id, directive, status, step, started, closed, project, "
        "pending_approval; mcp: item_id (SERVER.TOOL), server, tool, description; registry hits: "
        "source 'registry', version, namespace, signer, and newer/local_version when a local copy is older"
    )
    registry_unavailable: str = Field(
        default="", description="why the registry part of the answer is missing (local results still come)"
    )


class LoadAnswer(BaseModel):
    """load's answer (its outputSchema)."""

    model_config = ConfigDict(extra="allow")
    item_type: str = Field(description="the item type asked for")
    item_id: str = Field(
        description="directive/tool/knowledge: also source, path, content (the whole file), problems, "
        "also_in, parsed, and for a directive steps_plan (copied: what copy_to_project did); mcp: server, and tool (one tool's inputSchema) "
        "or tools"
    )


def error(item_type: str, action: str, item_id: str, exc: BaseException) -> Any:
    """A tool error (``isError: true``) carrying the seeds' shape as structured content and as JSON text.

    The shape is built from the error's type, never from its text.
    """
    shape = error_shape(item_type, action, item_id, exc)
    return mcp_types.CallToolResult(
        content=[mcp_types.TextContent(type="text", text=json.dumps(shape, indent=2))],
        structured_content=shape,
        is_error=True,
    )


# How long an id (item_id, run_id, a call id, an idempotency key) or a search's words may be.
MAX_ID_CHARS = 256
MAX_QUERY_CHARS = 2000
# A help(stuck)'s count of failed attempts (1e30 was taken, and shown to the approver as it came).
MAX_ATTEMPTS = 1_000_000


def text_problem(limit: int, **fields: str | None) -> InputInvalid | None:
    """An id or query that is no text Kiwi can look up: a control character (NUL broke the registry's and
    Temporal's queries into a bare "Error executing tool", review s33) or more than ``limit`` characters
    (echoed whole, a 100 KB id made a 400 KB answer). The message names the field, never its value."""
    for name, value in fields.items():
        if not value:
            continue
        if (bad := CONTROL_CHARACTERS.search(value)) is not None:
            return InputInvalid(
                f"'{name}' holds a control character (U+{ord(bad.group()):04X}); ids and search words are text",
                hint=f"send '{name}' without control characters",
            )
        if len(value) > limit:
            return InputInvalid(
                f"'{name}' is {len(value):,} characters; it may be {limit:,} at most",
                hint=f"send a shorter '{name}'",
            )
    return None


def unexpected(item_type: str, action: str, item_id: str, exc: Exception) -> Any:
    """An error Kiwi did not expect, answered in the seeds' shape (it was the SDK's bare "Error executing tool
    X"), its traceback in the front end's log (scrubbed as every log line is)."""
    logging.getLogger("kiwi.mcp").error(
        "%s %s %s failed unexpectedly", item_type, action, item_id[:MAX_ID_CHARS], exc_info=exc
    )
    return error(
        item_type,
        action,
        item_id[:MAX_ID_CHARS],
        KiwiError(
            f"Kiwi could not answer this call ({type(exc).__name__}); its log has the details",
            hint="check the arguments against the tool's schema; if they are right, tell the human who runs Kiwi",
        ),
    )


# Commands an agent can reach through this server, and what it calls instead; other `kiwi ...`
# commands in a hint are a human's (kiwi dev, approve, keys ...), and the hint says so.
_AGENT_CALLS = (
    (re.compile(r"`kiwi status (\S+?)`"), r"`execute(item_type='run', action='status', run_id='\1')`"),
    (re.compile(r"`kiwi audit (\S+?)`"), r"the resource `kiwi://runs/\1/audit`"),
    (re.compile(r"`kiwi runs[^`]*`"), "`search(item_type='run')`"),
    (re.compile(r"`kiwi search[^`]*`"), "`search(item_type=..., query=...)`"),
    (re.compile(r"`kiwi validate[^`]*`"), "`execute(item_type='directive', action='validate', item_id=...)`"),
    # (A pull's conflict: --replace is the command line's; the agent loads the copy it has.)
    (
        re.compile(r"pass --replace to take the registry's version"),
        "load the copy there (no source='registry'), or a human takes the registry's version over it with "
        "`kiwi pull ITEM --replace`",
    ),
)
_HUMAN_COMMAND = re.compile(r"`(kiwi [^`]+)`")


def _publish(path: Path, version: str | None) -> dict[str, Any]:
    """execute(publish): the item as the human signed it, published under their key (see publish_item)."""
    from kiwi.registry.embedded import registry_for_command
    from kiwi.registry.local import publish_item

    with registry_for_command() as registry:
        return publish_item(registry, path, version=version, key=None)


def _tool_pull_hint(item_id: str, version: str | None) -> str:
    """What the agent tells its user to run for a registry tool: the pull, when there is a version to pull
    (the hint named `kiwi pull` for tools the registry did not have, or had only yanked)."""
    from kiwi.registry.embedded import registry_for_command

    ref = f"{item_id}@{version}" if version else item_id
    pull = f"ask the user to read it and run `kiwi pull {ref} --type tool`"
    try:
        with registry_for_command() as registry:
            published = registry.versions("tool", item_id) if "tool" in registry.kinds_of(item_id) else []
    except KiwiError:
        return pull  # (the registry is down: the pull will say what is wrong)
    if not published:
        return (
            f"the registry has no tool '{item_id}'; `search(item_type='tool', source='registry')` lists them"
        )
    if version:
        if any(v["version"] == version for v in published):
            return pull
        return (
            f"the registry has no version {version} of tool '{item_id}' (its versions: "
            + ", ".join(v["version"] for v in published)
            + ")"
        )
    if all(v["yanked"] for v in published):
        return (
            f"every version of tool '{item_id}' in the registry is yanked (withdrawn by its publisher); a human "
            f"can still take one by number: `kiwi registry versions {item_id}` lists them"
        )
    return pull


def _fetch_from_registry(item_type: str, item_id: str, version: str | None) -> tuple[Any, dict[str, str]]:
    """load(source='registry'): the registry's version, its hash and signature checked (written into the
    project by the caller, never over a local item)."""
    from kiwi.registry import parse_version
    from kiwi.registry.embedded import registry_for_command
    from kiwi.registry.lock import lock_entry

    with registry_for_command() as registry:
        bundle, info = registry.fetch(item_type, item_id, version)
        source = registry.label()
        latest = registry.latest_versions(item_type, [item_id]).get(item_id) if version else None
    if info["yanked"]:
        # A yanked version may have been withdrawn for a reason: a human pins it, not the agent.
        raise RegistryRefused(
            f"{item_type} '{item_id}' {info['version']} is yanked",
            hint=f"load the latest (no version); a human can still take this one: "
            f"`kiwi pull {item_id}@{info['version']}`",
        )
    if item_type == "directive" and latest and parse_version(info["version"]) < parse_version(latest):
        # An older version may carry grants its publisher has since removed: a human pins one.
        raise RegistryRefused(
            f"directive '{item_id}' {info['version']} is older than the latest, {latest}",
            hint=f"load the latest (no version); a human can still take this one: "
            f"`kiwi pull {item_id}@{info['version']}`",
        )
    return bundle, lock_entry(source, info)


def note_span(attributes: dict[str, Any]) -> None:
    """Kiwi's attributes on the MCP SDK's span of this request (nothing when tracing is off)."""
    span = trace.get_current_span()
    if span.is_recording():
        span.set_attributes({k: v for k, v in attributes.items() if v not in (None, "")})


def agent_hint(hint: str) -> str:
    """A hint for an agent: the MCP call that fixes it, or who runs a command it cannot."""
    for pattern, call in _AGENT_CALLS:
        hint = pattern.sub(call, hint)
    return _HUMAN_COMMAND.sub(r"`\1` (a command a human runs)", hint)


def error_shape(item_type: str, action: str, item_id: str, exc: BaseException) -> dict[str, Any]:
    """The seeds' error shape, built from the error's type, never from its text."""
    kind = getattr(exc, "type", None) or type(exc).__name__
    message = getattr(exc, "message", None) or str(exc)
    hint = agent_hint(getattr(exc, "hint", "") or "")
    if isinstance(exc, RunInOtherProject):
        # The command line's fix (another folder, --project) is not the agent's to make.
        hint = (
            f"this Kiwi MCP server serves another project; the run is reached through the Kiwi MCP server "
            f"of {exc.owner} (`kiwi mcp --project {exc.owner}`, a command a human runs)"
        )
    if isinstance(exc, ItemInvalid):
        hint = hint or "fix the problems listed, then validate again"
    return {
        "error": kind,
        "item_type": item_type,
        "action": action,
        "item_id": item_id,
        "message": message,
        "hint": hint,
    }


class ExecuteAnswer(BaseModel):
    """execute's answer (its outputSchema): the keys an action's answer carries; others may follow."""

    model_config = ConfigDict(extra="allow")
    run_id: str | None = Field(default=None, description="directive run and every run action: the run")
    state: str | None = Field(
        default=None,
        description="directive run, complete_step: the run's state now (awaiting_agent, running, "
        "awaiting_approval, awaiting_human, stuck, completed, failed, cancelled, timed_out)",
    )
    status: str | None = Field(
        default=None,
        description="tool/mcp call and poll: ok, denied, error, rate_limited, or pending (poll "
        "result.call_id); run status: the run's state; cancel: cancel_requested; create/update/delete: "
        "what was done",
    )
    result: Any = Field(default=None, description="tool/mcp call and poll: the tool's answer")
    reason: str | None = Field(default=None, description="why a call was denied or failed")
    hint: str | None = Field(default=None, description="what to do about it")
    current_step: dict[str, Any] | None = Field(
        default=None,
        description="directive run, complete_step, status: the step to do now (name, action, tools)",
    )
    instructions: str | None = Field(default=None, description="directive run: how to work through the run")


class HelpAnswer(BaseModel):
    """help's answer (its outputSchema)."""

    model_config = ConfigDict(extra="allow")
    help: str | None = Field(default=None, description="guidance: the text")
    status: str | None = Field(
        default=None,
        description="a signal: escalated (then request_id), awaiting_human, stuck_recorded, "
        "checkpoint_requested (a refused checkpoint is an error saying why)",
    )
    run_id: str | None = Field(default=None, description="the run the signal went to")
    request_id: str | None = Field(
        default=None, description="escalate: the decision's id in the run's status"
    )
    message: str | None = Field(default=None, description="what happens next")


def answer(value: dict[str, Any] | mcp_types.CallToolResult) -> mcp_types.CallToolResult:
    """A dict answer as the tool result MCPServer makes of it; the declared output model validates it."""
    if isinstance(value, mcp_types.CallToolResult):
        return value
    text = pydantic_core.to_json(value, fallback=str, indent=2).decode()
    return mcp_types.CallToolResult(
        content=[mcp_types.TextContent(type="text", text=text)], structured_content=value
    )


def argument_problems(exc: ValidationError) -> tuple[str, str]:
    """What is wrong with a tool call's arguments, in words (allowed values named), and the fix."""
    lines = []
    for err in exc.errors():
        field = ".".join(str(part) for part in err["loc"]) or "arguments"
        expected = (err.get("ctx") or {}).get("expected")
        if err["type"] == "literal_error" and expected:
            lines.append(f"'{field}' must be one of {expected}")
        elif err["type"] == "missing":
            lines.append(f"'{field}' is required")
        else:
            lines.append(f"'{field}': {err['msg']}")
    return "; ".join(lines), "call again with the arguments corrected (the tool's inputSchema lists them)"


class KiwiMCPServer(MCPServer):
    """MCPServer whose argument errors carry the seeds' error shape and name allowed values (no links)."""

    temporal: TemporalLink  # (set by build_server: the way to Temporal its tools share)
    watches: RunWatches  # (set by build_server: the runs its subscribers watch)

    async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None) -> Any:
        if isinstance(arguments, dict) and "project_path" in arguments:
            # Kiwi MCP's clients send the project with every call (second review s34: refused as an argument the
            # tool does not take): taken when it names the project this front end serves.
            arguments = dict(arguments)
            given = arguments.pop("project_path")
            if (problem := self._other_project(given)) is not None:
                return error(*_shown_call(name, arguments), problem)
        tool = self._tool_manager.get_tool(name)
        if tool is not None and (problem := stray_arguments(name, tool.parameters, arguments)) is not None:
            return error(*_shown_call(name, arguments), problem)
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as exc:
            # Only the arguments' model is the caller's mistake; an answer that fails its output
            # schema is the server's, and stays an error of its own.
            if not isinstance(exc.__cause__, ValidationError) or not exc.__cause__.title.endswith(
                "Arguments"
            ):
                raise
            message, hint = argument_problems(exc.__cause__)
            return error(*_shown_call(name, arguments), InputInvalid(message, hint=hint))

    def _other_project(self, given: Any) -> InputInvalid | None:
        """Why a call's ``project_path`` (Kiwi MCP's) is not this front end's project, or None when it is (or
        names none)."""
        served = self.temporal.store.project_root
        if given is None or given == "":
            return None
        if isinstance(given, str) and not CONTROL_CHARACTERS.search(given) and len(given) <= 4096:
            with contextlib.suppress(OSError, ValueError):
                if Path(given).expanduser().resolve() == Path(served).resolve():
                    return None
        return InputInvalid(
            f"project_path names another folder than the project this front end serves ({served})",
            hint="leave project_path out (this server serves one project); for another project, connect to its "
            "own `kiwi mcp`",
        )


def _shown_call(name: str, arguments: dict[str, Any]) -> tuple[str, str, str]:
    """The item type, action and item id an error about a call's arguments names (the tool's name as its
    action when it has none); an id that is no short text is not echoed."""

    def text(key: str) -> str:
        value = arguments.get(key)
        return value if isinstance(value, str) and len(value) <= MAX_ID_CHARS else ""

    return text("item_type"), text("action") or name, text("item_id")


# Other tools' and Kiwi MCP's names for an argument, and where it goes here (review s33: execute's `inputs`,
# Kiwi MCP's name for a directive's inputs, was dropped without a word and the run started without them).
_ARGUMENT_HOMES = {
    "inputs": "parameters",
    "arguments": "parameters",
    "args": "parameters",
    "params": "parameters",
    "directive_name": "item_id",
    "directive": "item_id",
    "tool_name": "item_id",
    "tool_id": "item_id",
    "zettel_id": "item_id",
    "name": "item_id",
    "id": "item_id",
    "call_id": "item_id",
    "type": "item_type",
    "runId": "run_id",
}


def stray_arguments(tool: str, schema: dict[str, Any], arguments: Any) -> InputInvalid | None:
    """Arguments the tool does not take, or true/false given for a number: refused, not dropped (an agent that
    misspells an optional argument, `limt`, or sends another tool's, `inputs`, would get an answer made without
    it and never know). None when every argument is the tool's."""
    if not isinstance(arguments, dict):
        return None  # (the argument model's check answers it)
    properties = schema.get("properties") or {}
    if (stray := stray_argument(tool, list(properties), arguments, _ARGUMENT_HOMES)) is not None:
        return InputInvalid(stray.reason, hint=f"{stray.hint} (the tool's inputSchema lists its arguments)")
    for key, value in arguments.items():
        kinds = _schema_types(properties[key])
        if isinstance(value, bool) and kinds & {"integer", "number"} and "boolean" not in kinds:
            return InputInvalid(
                f"'{key}' must be a number, got {json_kind(value)}",
                hint="call again with the arguments corrected (the tool's inputSchema lists them)",
            )
    return None


def _schema_types(spec: dict[str, Any]) -> set[str]:
    """The JSON types a property's schema allows (its anyOf's too)."""
    kinds = spec.get("type")
    found = {kinds} if isinstance(kinds, str) else set(kinds or ())
    for option in spec.get("anyOf") or ():
        found |= _schema_types(option)
    return found


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


def build_server(
    client: Client | None,
    project_root: Path | None = None,
    task_queue: str = "kiwi",
    client_name: str = "mcp",
    *,
    address: str | None = None,
    namespace: str | None = None,
) -> MCPServer:
    """The four tools. With ``client`` None, Temporal is reached on the first run action (``address``)."""
    root = project_root or find_project_root()
    if problem := project_root_problem(root):
        raise KiwiError(
            f"kiwi mcp serves a project, and {problem}",
            hint="start it with --project PATH (a folder `kiwi init` made), or from inside the project",
        )

    # One store and client for the server's life: the store re-scans changed files on every query,
    # and the client remembers whether the search attributes are registered.
    store = ItemStore(root)
    link = TemporalLink(store, task_queue, client, address=address, namespace=namespace)
    catalog = McpCatalog(root)

    beyond = BeyondTools(link, store, client_name)  # resources, prompts, tasks: mcp_frontend/capabilities.py
    server = KiwiMCPServer(name="kiwi", instructions=INSTRUCTIONS, version="0.1.0", **beyond.server_options())
    server.temporal = link
    server.watches = beyond.watches
    beyond.attach(server)

    @server.tool(
        annotations=mcp_types.ToolAnnotations(
            read_only_hint=True, idempotent_hint=True, open_world_hint=False
        ),
        description="Find directives, tools, knowledge (multi-term relevance search) or runs. "
        "Example: search(item_type='directive', query='deploy database').",
    )
    async def search(
        item_type: ItemKind = Field(
            description="what to search: directive, tool, knowledge, run, or mcp (tools of "
            "the external MCP servers in mcp_registry.yaml); script is the same as tool"
        ),
        query: str = Field(
            default="",
            description="words to look for (none: every item of item_type, by id); for runs, an optional "
            "directive name",
        ),
        source: Source = Field(
            default="all",
            description="which item space: project (or 'local', as in Kiwi MCP), user, registry (the shared "
            "registry), or all (project and user, plus the registry when one is configured or running)",
        ),
        status: str | None = Field(default=None, description="runs only: e.g. awaiting_agent, completed"),
        limit: int = Field(default=10, ge=1, le=100, description="at most this many results"),
    ) -> SearchAnswer:
        item_type = item_kind(item_type)  # type: ignore[assignment]
        if (problem := text_problem(MAX_QUERY_CHARS, query=query, status=status)) is not None:
            return error(item_type, "search", "", problem)
        try:
            if item_type == "run":
                rows = await (await link.runs()).list_runs(
                    status=status, directive=query or None, limit=limit
                )
                return SearchAnswer(results=rows)
            if item_type == "mcp":
                return SearchAnswer.model_validate(await catalog.search(query, limit=limit))
            found = (
                []
                if source == "registry"
                else store.search(
                    query, item_type=item_type, source="project" if source == "local" else source, limit=limit
                )
            )
            remote: list[dict[str, Any]] = []
            unavailable = ""
            if source in ("registry", "all"):
                from kiwi.registry.embedded import search_registry
                from kiwi.registry.local import registry_results

                required = source == "registry"
                # The database in a thread; the item store (SQLite) stays on this one.
                remote, unavailable = registry_results(
                    store,
                    await anyio.to_thread.run_sync(
                        lambda: search_registry(query, item_type, limit, required=required)
                    ),
                    required=required,
                    hint="search(source='all') still finds local items; a human checks KIWI_REGISTRY_URL",
                )
            return SearchAnswer(
                results=[r.as_dict() for r in found] + remote, registry_unavailable=unavailable
            )
        except KiwiError as exc:
            return error(item_type, "search", query, exc)
        except Exception as exc:  # noqa: BLE001 - a request's top level: answered in the seeds' shape
            return unexpected(item_type, "search", query, exc)

    @server.tool(
        # copy_to_project writes a file, so load is not read-only; it never deletes or overwrites.
        annotations=mcp_types.ToolAnnotations(
            read_only_hint=False, destructive_hint=False, idempotent_hint=True
        ),
        description="Load one item: its content and parsed form. For a directive: inputs, permissions, "
        "steps and which steps run by themselves. Example: load(item_type='directive', "
        "item_id='hello_kiwi').",
    )
    async def load(
        item_type: Literal["directive", "tool", "knowledge", "mcp", "script"] = Field(
            description="item type (script is the same as tool)"
        ),
        item_id: str = Field(
            description="directive name, tool_id, zettel_id, or for mcp a server name or SERVER.TOOL"
        ),
        source: Source = Field(
            default="all",
            description="which item space: project (or 'local', as in Kiwi MCP), user, all, or registry (pull "
            "the item from the shared registry into the project first: hash and signature checked, never "
            "over a local item)",
        ),
        copy_to_project: bool = Field(
            default=False, description="copy the item from the user space into the project first"
        ),
        version: str | None = Field(
            default=None, description="source='registry' only: this version (default the latest not yanked)"
        ),
    ) -> LoadAnswer:
        item_type = item_kind(item_type)  # type: ignore[assignment]
        if (problem := text_problem(MAX_ID_CHARS, item_id=item_id, version=version)) is not None:
            return error(item_type, "load", "", problem)
        try:
            if version is not None and source != "registry":
                # (Trial F34: a version asked of a local item was ignored, and the file served as if it were.)
                raise InputInvalid(
                    "'version' is for source='registry' only: a project or user item is the one version its "
                    "file holds",
                    hint="leave version out to load the local item, or load(source='registry', version=...) "
                    "to pull that version into the project",
                )
            if item_type == "mcp":
                return LoadAnswer.model_validate(await catalog.load(item_id))
            if source == "registry":
                if item_type == "tool":
                    # A tool is code Kiwi runs, in a place only a human writes.
                    hint = await anyio.to_thread.run_sync(lambda: _tool_pull_hint(item_id, version))
                    raise KiwiError(
                        "tools are pulled from the registry by a human, not by the agent", hint=hint
                    )
                # The database work in a thread; the item store (SQLite) stays on this one.
                bundle, entry = await anyio.to_thread.run_sync(
                    lambda: _fetch_from_registry(item_type, item_id, version)
                )
                write_pulled(store, bundle, location="project", provenance=entry)
                store.refresh()
                source = "project"
            copied = None
            if copy_to_project:
                copied = copy_to_project_(store, item_type, item_id)
                store.refresh()
            item = store.load(item_type, item_id, source="project" if source == "local" else source)
            data: dict[str, Any] = {
                "item_type": item_type,
                "item_id": item.record.item_id,
                "source": item.record.source,
                "path": item.record.path,
                "content": item.text,
                "problems": [str(p) for p in item.problems],
                "also_in": item.record.shadows,
                **({"copied": copied} if copied else {}),
            }
            if item.parsed is not None:
                data["parsed"] = item.parsed.model_dump()
            if isinstance(item.parsed, Directive):
                data["steps_plan"] = [
                    p.model_dump() for p in item.parsed.plan(frozenset(store.local_tools()))
                ]
            return LoadAnswer.model_validate(data)
        except KiwiError as exc:
            return error(item_type, "load", item_id, exc)
        except Exception as exc:  # noqa: BLE001 - a request's top level: answered in the seeds' shape
            return unexpected(item_type, "load", item_id, exc)

    @server.tool(
        # delete, update and cancel destroy; a tool call may reach an external MCP server.
        annotations=mcp_types.ToolAnnotations(
            read_only_hint=False, destructive_hint=True, idempotent_hint=False, open_world_hint=True
        ),
        description=EXECUTE_DESCRIPTION,
    )
    async def execute(
        item_type: Literal["directive", "knowledge", "run", "tool", "mcp", "script"] = Field(
            description="directive, knowledge, run, tool, or mcp (call = a tool of an external MCP server); "
            "script is the same as tool"
        ),
        action: Literal[
            "run",
            "validate",
            "create",
            "update",
            "delete",
            "link",
            "status",
            "complete_step",
            "cancel",
            "poll",
            "call",
            "publish",
        ] = Field(description="what to do"),
        item_id: str = Field(
            default="",
            description="directive name, knowledge id, tool id (built-in, local, or SERVER.TOOL), or for "
            "poll the call_id of a pending call; not the run id (that is run_id)",
        ),
        parameters: dict[str, Any] = Field(
            default_factory=dict,
            description="per action (see the examples): directive run = its inputs; create/update = "
            "{'content'} or the knowledge fields; delete = {'confirm': true}; link = {'to', 'relation'}; "
            "complete_step = {'step', 'outputs'}; call = the tool's arguments",
        ),
        run_id: str | None = Field(
            default=None,
            description="the run: for every run action (status, complete_step, cancel, poll) and for a "
            "tool call inside a run",
        ),
        idempotency_key: str | None = Field(
            default=None,
            description="directive run: the same key returns the existing run; tool call in a run: the same "
            "key returns that call's answer instead of calling again (retry a call whose answer was lost, "
            "through any front end)",
        ),
        wait_seconds: float = Field(
            default=20.0,
            ge=0,
            le=300,
            description="tool call / poll: answer 'pending' with a call id after this long (at least 1 s: "
            "time for the run to take or refuse the call); directive run / complete_step: answer with the run "
            "still 'running' after this long, when its automatic steps have not reached the agent by then",
        ),
        ctx: Context | None = None,
    ) -> Annotated[mcp_types.CallToolResult, ExecuteAnswer]:
        async def progress(elapsed: float, total: float, upstream: str) -> None:
            if ctx is not None:
                await ctx.report_progress(elapsed, total, progress_message(item_id, upstream))

        item_type = item_kind(item_type)  # type: ignore[assignment]
        note_span(
            {
                "kiwi.item_type": item_type,
                "kiwi.action": action,
                "kiwi.item_id": item_id,
                "kiwi.run_id": run_id,
            }
        )
        problem = text_problem(MAX_ID_CHARS, item_id=item_id, run_id=run_id, idempotency_key=idempotency_key)
        if problem is not None:
            return error(item_type, action, "", problem)
        try:
            if action == "poll":
                if missing := [
                    name for name, given in (("run_id", run_id), ("item_id", item_id)) if not given
                ]:
                    raise InputInvalid(
                        f"poll needs {' and '.join(missing)}: the run, and the call_id of a call that answered "
                        "'pending'",
                        hint="execute(item_type='run', action='poll', run_id=RUN, item_id=CALL_ID)",
                    )
                return answer(
                    (
                        await (await link.runs()).poll_call(
                            run_id, item_id, wait_seconds=wait_seconds, on_progress=progress
                        )
                    ).model_dump()
                )
            if item_type == "mcp" and action == "call":
                item_id = catalog.tool_id(item_id, parameters)
                item_type = "tool"
            if item_type == "tool" and action == "run":
                action = "call"  # the seeds' name for a tool call (Kiwi MCP's execute(tool, run))
            if action == "call":
                # Checked here too: arguments over Temporal's payload limit could never reach the run.
                problem = check_arguments(item_id, parameters)
                if problem is not None and item_type == "tool":
                    # Answered as the run answers arguments that do not fit (a typed result, not an MCP
                    # error), so one mistake has one shape whichever tool it was sent to (call_seq 0: no
                    # run recorded it).
                    refused = ToolCallResult(
                        status="error",
                        tool=item_id,
                        error_type=InputInvalid.type,
                        reason=problem.reason,
                        hint=problem.hint,
                    )
                    return answer({**refused.model_dump(), "hint": agent_hint(problem.hint)})
                if problem is not None:
                    raise InputInvalid(problem.reason, hint=problem.hint)
            if item_type == "tool" and action == "call":
                # In a run, or outside one through the project's session: 'pending' after wait_seconds either way.
                waiting = {
                    "wait_seconds": wait_seconds,
                    "on_progress": progress,
                    "idempotency_key": idempotency_key,
                }
                runs_ = await link.runs()
                called = await (
                    runs_.call_tool_waiting(run_id, item_id, parameters, client_name=client_name, **waiting)
                    if run_id
                    else runs_.session_call(client_name, item_id, parameters, **waiting)
                )
                note_span({"gen_ai.tool.name": item_id, "kiwi.decision": called.status})
                called = tool_not_found(called, in_run=bool(run_id), agent=True)
                hint = called.hint
                if not run_id:
                    local = link.store.local_tools()
                    hint = outside_run_hint(called.status, hint, item_id, local, agent=True)
                return answer({**called.model_dump(), "hint": agent_hint(hint)})
            return answer(
                await _execute(
                    link,
                    root,
                    item_type,
                    action,
                    item_id,
                    parameters,
                    run_id,
                    idempotency_key,
                    client_name,
                    wait_seconds,
                )
            )
        except KiwiError as exc:
            note_span({"error.type": type(exc).__name__})
            return error(item_type, action, item_id or run_id or "", exc)
        except Exception as exc:  # noqa: BLE001 - a request's top level: answered in the seeds' shape
            note_span({"error.type": type(exc).__name__})
            return unexpected(item_type, action, item_id or run_id or "", exc)

    @server.tool(
        name="help",
        annotations=mcp_types.ToolAnnotations(
            read_only_hint=False, destructive_hint=False, idempotent_hint=False
        ),
        description=(
            "Guidance, or a signal to the humans running a run: stuck (reason, attempts), escalate (reason, options), "
            "checkpoint (reason). Example: help(action='stuck', run_id='run-x-1', reason='tests keep failing', "
            "attempts=4)."
        ),
    )
    async def help_(
        action: Literal["guidance", "stuck", "escalate", "checkpoint"] = Field(default="guidance"),
        topic: str = Field(
            default="", description="guidance topic: directives, runs, tools, permissions, kiwi-mcp"
        ),
        run_id: str | None = Field(default=None, description="the run the signal is about"),
        reason: str = Field(default="", description="why help is needed"),
        attempts: int = Field(default=0, ge=0, le=MAX_ATTEMPTS, description="failed attempts so far (stuck)"),
        options: list[str] = Field(default_factory=list, description="choices for a human (escalate)"),
    ) -> Annotated[mcp_types.CallToolResult, HelpAnswer]:
        if action == "guidance":
            return answer({"help": _guidance(topic, store)})
        if not run_id:
            return error("run", action, "", KiwiError("a help signal needs run_id", hint="pass the run's id"))
        if (problem := text_problem(MAX_ID_CHARS, run_id=run_id)) is not None:
            return error("run", action, "", problem)
        request_id = f"decision-{uuid.uuid4().hex[:8]}" if action == "escalate" else ""
        try:
            if action == "checkpoint":
                # (Asked before the signal: a held run's status is the one it had when the agent asked.)
                refused = await _checkpoint_refused(await link.runs(), run_id)
            await (await link.runs()).help(
                run_id,
                HelpRequest(
                    kind=action, reason=reason, attempts=attempts, options=options, request_id=request_id
                ),
            )
        except KiwiError as exc:
            return error("run", action, run_id, exc)
        except Exception as exc:  # noqa: BLE001 - a request's top level: answered in the seeds' shape
            return unexpected("run", action, run_id, exc)
        if action == "escalate":
            return answer(
                {
                    "status": "escalated",
                    "run_id": run_id,
                    "request_id": request_id,
                    "message": "the run waits (awaiting_human) until a human answers with `kiwi decide "
                    f"{run_id} {request_id} OPTION`; poll execute(item_type='run', action='status') and "
                    "read 'decisions' for the answer",
                }
            )
        if action == "stuck" and attempts > STUCK_ATTEMPTS_FOR_HUMAN:
            return answer(
                {
                    "status": "awaiting_human",
                    "run_id": run_id,
                    "message": f"more than {STUCK_ATTEMPTS_FOR_HUMAN} failed attempts: the run now waits for a human "
                    f"(awaiting_human) and your tool calls are held. A human resumes it with `kiwi resume {run_id}` "
                    "(or cancels it); poll execute(item_type='run', action='status', run_id=...) to see when it "
                    "moves on.",
                }
            )
        if action == "checkpoint":
            if refused is not None:
                # The request is recorded (the run's audit trail has it, denied); the checkpoint is not taken.
                return error("run", action, run_id, refused)
            return answer(
                {
                    "status": "checkpoint_requested",
                    "run_id": run_id,
                    "message": "the run takes a git checkpoint now, when the project is a git repository: "
                    "it is listed under 'checkpoints' in execute(item_type='run', action='status', run_id=...)",
                }
            )
        return answer(
            {
                "status": f"{action}_recorded",
                "run_id": run_id,
                "message": "recorded in the run's state and audit trail; operators see it in `kiwi status`",
            }
        )

    for tool in server._tool_manager.list_tools():  # noqa: SLF001 - MCPServer has no setter for it
        # What stray_arguments refuses, said in the schema clients read.
        tool.parameters["additionalProperties"] = False
    return server


async def _checkpoint_refused(runs: RunClient, run_id: str) -> KiwiError | None:
    """Why the run will take no checkpoint for help(checkpoint), as it decides when the signal comes
    (workflows/directive_run/humans.py: the directive disables them, a held run runs nothing the agent asks,
    git.checkpoint's grant); None when it will, or when that cannot be read. (It answered
    'checkpoint_recorded' either way, and the agent counted on a checkpoint that was denied: trial s33.)"""
    snapshot = await runs.snapshot_of(run_id)
    if snapshot is not None:
        if snapshot.directive.metadata.git_checkpoint == "disabled":
            return PermissionDenied(
                'no checkpoint taken: the directive disables them (<git_checkpoint mode="disabled">)',
                hint="a human changes the directive's git_checkpoint and signs it again",
            )
        decision = snapshot.grants.check_tool_id("git.checkpoint")
        if not decision.allowed:
            return PermissionDenied(f"no checkpoint taken: {decision.reason}", hint=decision.hint)
    try:
        status = await runs.answered_status(run_id)  # (None at once when no worker polls: not held-checked)
    except KiwiError:
        return None
    if status is not None and status.status in HELD:
        return RunStateConflict(
            f"no checkpoint taken: run {run_id} is {status.status}; a held run runs nothing the agent asks for",
            hint=f"a human resumes it (`kiwi resume {run_id}`); ask again then",
        )
    return None


def progress_message(tool: str, upstream: str) -> str:
    """A pending call's progress line, always naming the tool (the upstream server's words follow)."""
    name = tool or "the call"
    return (
        f"{name}: {upstream}"
        if upstream and not upstream.startswith(name)
        else upstream or f"waiting for {name}"
    )


def callable_tools(grants: PermissionSet, store: ItemStore) -> dict[str, dict[str, Any]]:
    """Kiwi's own tools and the project's local tools this run's grants let it call, with their input
    schemas, so an agent knows them from the start as it knows the MCP servers' (``tool_context``)."""
    from kiwi.toolargs import BUILTIN_SCHEMAS

    found: dict[str, dict[str, Any]] = {}
    for tool, schema in BUILTIN_SCHEMAS.items():
        if grants_some_call(grants, tool):
            found[tool] = {"type": "built-in", "input_schema": schema}
    for tool_id, manifest in sorted(store.local_tools().items()):
        if grants.check_tool_id(tool_id).allowed:
            found[tool_id] = {
                "type": manifest.tool_type,
                "description": manifest.description,
                "input_schema": manifest.json_schema(),
            }
    return found


async def _execute(
    link: TemporalLink,
    root: Path,
    item_type: str,
    action: str,
    item_id: str,
    parameters: dict[str, Any],
    run_id: str | None,
    idempotency_key: str | None,
    client_name: str,
    wait_seconds: float = 20.0,
) -> dict[str, Any]:
    if item_type in ("directive", "knowledge", "tool") and action in ("create", "update", "delete", "link"):
        return _author(link.store, item_type, action, item_id, parameters)
    if item_type in ("directive", "knowledge", "tool") and action == "publish":
        store = link.store
        record = store.find(item_type, item_id, source="project")  # type: ignore[arg-type]
        if not load_harness(store.project_root, store.user).agent_publish:
            where = Path(record.path).relative_to(store.project_root)
            raise PermissionDenied(
                "publishing to the shared registry is for a human here: every reader of the registry can "
                "read what is published",
                hint=f"ask the user to run `kiwi publish {where}`; to let agents publish what a human "
                "signed, set `registry: {agent_publish: true}` in .ai/config/agent_harness.yaml",
            )
        version = parameters.get("version")
        return await anyio.to_thread.run_sync(lambda: _publish(Path(record.path), version))
    if item_type == "directive" and action == "validate":
        from kiwi.items.validation import validate_file

        local = link.store.local_tools()
        draft = parameters.get("content")
        if draft is None:
            record = link.store.find("directive", item_id)
            result = validate_file(Path(record.path), local)
        else:
            # A draft checked before it is written (review s33: the content was ignored and the saved file
            # validated, so a broken draft was answered valid).
            if not isinstance(draft, str) or not draft.strip():
                raise InputInvalid(
                    "validate's parameters.content is a directive's draft: the whole Markdown file with its "
                    f"```xml block, not {json_kind(draft)}",
                    hint="leave parameters out to validate the saved directive named item_id",
                )
            name = item_id or "draft"
            where = link.store.project_root / ".ai" / "directives" / f"{name}.md"
            result = validate_file(where, local, text=draft)
            shown = "parameters.content (not written)"
            result["path"] = shown
            for problem in result["problems"]:
                problem["path"] = shown if problem["path"] == str(where) else problem["path"]
            if item_id and result.get("item_id") not in (None, item_id):
                result["valid"] = False
                result["problems"].append(
                    Problem(
                        f"the content defines directive '{result['item_id']}', not '{item_id}': make "
                        "<directive name> match item_id",
                        shown,
                    ).as_dict()
                )
        result.pop("_problems", None)
        return result
    runs = await link.runs()
    if item_type == "directive" and action == "run":
        started = await runs.launch(
            item_id, parameters, idempotency_key=idempotency_key, client_name=client_name
        )
        new_id, directive = started.run_id, started.directive
        await runs.first_task_done(new_id)
        status = await _settled(runs, new_id, wait_seconds)
        context = {
            name: {
                "available": c.available,
                "required": c.required,
                "description": c.description,
                "tools": c.tools,
                **({"error": c.error} if c.error else {}),
                **({"hint": c.hint} if c.hint else {}),
            }
            for name, c in (started.context.mcps if started.context else {}).items()
        }
        return {
            "run_id": new_id,
            **({"existing": True} if started.existing else {}),
            "state": status.status,
            **({"error": status.error} if status.error else {}),
            **({"hint": agent_hint(status.hint)} if status.hint else {}),
            "current_step": status.current_step.model_dump() if status.current_step else None,
            "declared_tools": directive.metadata.tools.model_dump(),
            "tool_context": context,
            "local_tools": callable_tools(started.grants or directive.grants(), link.store),
            "permissions": (started.grants or directive.grants()).summary(),
            "trust": started.trust.model_dump() if started.trust else None,
            **(
                {"deviation_rules": _deviation_guidance(directive.metadata.deviation_rules, new_id)}
                if directive.metadata.deviation_rules
                else {}
            ),
            "instructions": "Do the current step's action, making tool calls with execute(item_type='tool', "
            "action='call', run_id=...), then complete it with execute(item_type='run', "
            "action='complete_step', run_id=..., parameters={'step': ..., 'outputs': {...}}).",
        }
    target = run_id or item_id
    if item_type == "run" and action in ("status", "complete_step", "cancel") and not target:
        raise InputInvalid(
            f"{action} needs run_id: the run's id (run-DIRECTIVE-...)",
            hint=f"execute(item_type='run', action='{action}', run_id=RUN, ...); search(item_type='run') lists "
            "the runs",
        )
    if item_type == "run" and action == "status":
        shown = (await runs.status(target)).model_dump()
        return {**shown, "hint": agent_hint(shown["hint"])}
    if item_type == "run" and action == "complete_step":
        step = parameters.get("step")
        if not isinstance(step, str) or not step:
            raise InputInvalid(
                "complete_step needs parameters.step, the step's name (a string)"
                + ("" if step is None or step == "" else f", not {json_kind(step)}"),
                hint="parameters={'step': NAME, 'outputs': {...}} (the name is the run's current_step.name)",
            )
        outputs = parameters.get("outputs")
        if outputs is not None and not isinstance(outputs, dict):
            raise InputInvalid(
                f"complete_step's parameters.outputs is {json_kind(outputs)}; it is an object of the step's "
                "outputs by name",
                hint=f"parameters={{'step': {step!r}, 'outputs': {{NAME: value, ...}}}} (the names are the run's "
                "current_step.outputs)",
            )
        result = await runs.complete_step(target, step, outputs or {})
        status = await _settled(runs, target, wait_seconds)
        return {
            **result.model_dump(),
            "state": status.status,
            "current_step": status.current_step.model_dump() if status.current_step else None,
        }
    if item_type == "run" and action == "cancel":
        children = await runs.cancel(target, str(parameters.get("reason", "cancelled by the agent")))
        return {"run_id": target, "status": "cancel_requested", "children_cancelled": children}
    raise KiwiError(
        f"action '{action}' does not apply to item_type '{item_type}'",
        hint="directive: run, validate · run: status, complete_step, cancel · tool: call",
    )


DEVIATION_SIGNALS = {
    "ask_first": "before doing this, ask: help(action='escalate', run_id='{run}', reason=..., options=[...]) and "
    "wait for the answer in the run's decisions",
    "escalate": "when this happens, stop and help(action='escalate', run_id='{run}', reason=..., options=[...])",
    "auto_fix": "fix this yourself and say so in the step's outputs",
}


def _deviation_guidance(rules: dict[str, str], run_id: str) -> list[dict[str, str]]:
    """The directive's deviation rules, each with the help signal the agent should use for it."""
    return [
        {
            "rule": kind,
            "when": text,
            "do": DEVIATION_SIGNALS.get(kind, "follow the directive's text").format(run=run_id),
        }
        for kind, text in rules.items()
    ]


def _author(store: ItemStore, item_type: str, action: str, item_id: str, parameters: dict[str, Any]) -> dict:
    location = str(parameters.get("location", "project"))
    if location != "project":
        # The user space (~/.ai) is every project's and the human's: an agent of one project wrote, rewrote
        # (a signed directive) and deleted items there that every other project's agent then found.
        raise PermissionDenied(
            f"an agent writes items in its project only, not in the {location!r} space",
            hint="leave out parameters.location; a human puts items in the user space (`kiwi pull --to user`, "
            "or by hand)",
        )
    if action == "delete":
        return delete_item(
            store, item_type, item_id, location=location, confirm=parameters.get("confirm") is True
        )
    if item_type == "directive" and action in ("create", "update"):
        content = parameters.get("content")
        if not isinstance(content, str) or not content.strip():
            raise InputInvalid(
                "directive create/update needs parameters.content: the whole Markdown file with its ```xml "
                "block" + ("" if content is None or content == "" else f", not {json_kind(content)}"),
                hint="parameters={'content': TEXT}; load(item_type='directive', item_id='hello_kiwi') shows one",
            )
        return save_directive(store, content, item_id=item_id, location=location, create=action == "create")
    if item_type == "knowledge" and action in ("create", "update"):
        if not item_id:
            raise InputInvalid(
                "knowledge create/update needs item_id (the zettel_id)",
                hint="execute(item_type='knowledge', action='create', item_id='my-note', parameters={'title': "
                "..., 'content': ...})",
            )
        return save_knowledge(store, item_id, parameters, location=location, create=action == "create")
    if item_type == "tool" and action in ("create", "update"):
        from kiwi.items.proposals import propose_tool

        return propose_tool(store, item_id, parameters, update=action == "update")
    if item_type == "knowledge" and action == "link":
        to, relation = parameters.get("to"), parameters.get("relation", "references")
        for value, what in (
            (item_id, "item_id, the zettel_id it links from"),
            (to, "parameters.to, the zettel_id it links to"),
            (relation, "parameters.relation, a relation's name"),
        ):
            if not isinstance(value, str) or not value:
                raise InputInvalid(
                    f"knowledge link needs {what}"
                    + ("" if value is None or value == "" else f" (a string, not {json_kind(value)})"),
                    hint="execute(item_type='knowledge', action='link', item_id=FROM, parameters={'to': TO, "
                    "'relation': 'references'})",
                )
        return link_knowledge(store, item_id, to, relation, location)
    raise KiwiError(
        f"action '{action}' does not apply to item_type '{item_type}'",
        hint="directive: create, update, delete · knowledge: create, update, delete, link · tool: create, update",
    )


async def _settled(runs: RunClient, run_id: str, timeout: float = 20.0):
    """The run's status once it waits for the agent or finishes (or after ``timeout``)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    delay = 0.02
    while True:
        status = await runs.status(run_id)
        if status.status != "running" or loop.time() > deadline:
            return status
        await asyncio.sleep(delay)
        delay = min(delay * 1.5, 0.5)


def _guidance(topic: str, store: ItemStore) -> str:
    from kiwi.guidance import BUILTINS, TOPICS

    directives = [r.item_id for r in store.list_items("directive") if r.valid][:20]
    tools = store.local_tools()
    text = {
        **TOPICS,
        "tools": BUILTINS
        + " Kiwi's meta-tools in a run: kiwi-mcp.search, kiwi-mcp.load, kiwi-mcp.help, kiwi-mcp.execute "
        "(help topic 'kiwi-mcp'). Local tools and their parameter schemas:\n"
        + ("\n".join(f"- {t}: {json.dumps(m.json_schema())}" for t, m in sorted(tools.items())) or "none"),
    }.get(topic, "")
    if topic and not text:
        # (An unknown topic got the general text as if it were the topic's: review s33.)
        text = f"No guidance topic '{topic[:80]}'; the topics are: {', '.join(sorted({*TOPICS, 'tools'}))}."
    return (
        (text + "\n\n" if text else "")
        + INSTRUCTIONS
        + "\n\nDirectives here: "
        + (", ".join(directives) or "none")
    )


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
    """Keep uvicorn from logging a traceback for each request it cuts off after the drain (serve_http says
    how many it cut off)."""
    error = record.exc_info[1] if record.exc_info else None
    return not (isinstance(error, asyncio.CancelledError) and "graceful shutdown" in str(error))


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
