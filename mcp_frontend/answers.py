"""What the agent reads and gets back: the server's instructions and ``execute``'s description, typed
answers, error shapes (kind, message, hint, secrets scrubbed) and the checks of an agent's arguments."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

import mcp.types as mcp_types
import pydantic_core
from opentelemetry import trace
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kiwi.contracts import HELD
from kiwi.errors import (
    InputInvalid,
    ItemInvalid,
    KiwiError,
    RunInOtherProject,
)
from kiwi.registry import RegistryRefused
from kiwi.toolargs import CONTROL_CHARACTERS

INSTRUCTIONS = """Kiwi runs directives (reusable workflow specs) durably on Temporal.
Typical flow: search(item_type="directive", query=...) → load(...) to read its steps and inputs →
execute(item_type="directive", action="run", item_id=NAME, parameters={inputs}) → follow the current
step's instructions, making tool calls with execute(item_type="tool", action="call", run_id=...,
item_id=TOOL, parameters={args}) → execute(item_type="run", action="complete_step", run_id=...,
parameters={"step": NAME, "outputs": {...}}). Every call is checked against the directive's permissions.
Use help(action="stuck"|"escalate"|"checkpoint", run_id=...) when you need a human."""


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


_POLL = "poll with execute(item_type='run', action='status', run_id=...)"


def next_move(status: Any) -> str:
    """What the agent does next with a run in ``status`` (a RunStatus): its ``instructions``. (README trial s37:
    a run waiting for a human's approval of an automatic step's call told the agent to do the step's action and
    complete it, and named no request.)"""
    state = status.status
    if state == "awaiting_agent":
        return (
            "Do the current step's action, making tool calls with execute(item_type='tool', action='call', "
            "run_id=...), then complete it with execute(item_type='run', action='complete_step', run_id=..., "
            "parameters={'step': ..., 'outputs': {...}})."
        )
    if state == "awaiting_approval":
        pending = [a for a in status.approvals if a.status == "pending"]
        asked = "; ".join(f"{a.request_id}: {a.summary}" for a in pending) or "a call"
        return (
            f"The run waits for a human to approve {asked}. Nothing to do meanwhile (you cannot approve it): "
            f"{_POLL}; the call runs, or is refused, once a human answers."
        )
    if state in HELD:
        return (
            f"The run is held ({status.hold_reason or state}) until a human lets it carry on; a question you asked "
            f"is answered by a human, not by you. {_POLL[0].upper()}{_POLL[1:]}."
        )
    if state == "running":
        return f"The run's automatic steps are running: {_POLL} until it needs you (awaiting_agent) or ends."
    if state == "completed":
        return "The run completed: its steps' outputs are in its status."
    return (
        f"The run ended ({state}){': ' + status.error if status.error else ''}; start a new run to try again."
    )


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
