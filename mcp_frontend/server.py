"""Kiwi's MCP front end: four tools (search, load, execute, help) over stdio or streamable HTTP.

Thin by design: it resolves items, starts runs, sends updates and signals, runs queries and
translates errors into the seeds' shape ``{error, item_type, action, item_id, message, hint}``.
It keeps no run state, so restarting it mid-run loses nothing.
"""

from __future__ import annotations

import contextlib
import uuid
from pathlib import Path
from typing import Annotated, Any, Literal

import anyio
import mcp.types as mcp_types
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field, ValidationError
from temporalio.client import Client

from kiwi.contracts import STUCK_ATTEMPTS_FOR_HUMAN, HelpRequest, ToolCallResult
from kiwi.errors import (
    InputInvalid,
    KiwiError,
    PermissionDenied,
)
from kiwi.explain import outside_run_hint, tool_not_found
from kiwi.items.authoring import copy_to_project as copy_to_project_
from kiwi.items.directive import Directive
from kiwi.items.store import ItemStore, find_project_root, item_kind, project_root_problem
from kiwi.registry.local import write_pulled
from kiwi.toolargs import CONTROL_CHARACTERS, check_arguments, json_kind, stray_argument
from kiwi.upstream.catalog import McpCatalog
from mcp_frontend.answers import (
    EXECUTE_DESCRIPTION,
    INSTRUCTIONS,
    MAX_ATTEMPTS,
    MAX_ID_CHARS,
    MAX_QUERY_CHARS,
    ExecuteAnswer,
    HelpAnswer,
    LoadAnswer,
    SearchAnswer,
    _fetch_from_registry,
    _tool_pull_hint,
    agent_hint,
    answer,
    argument_problems,
    error,
    note_span,
    text_problem,
    unexpected,
)
from mcp_frontend.capabilities import BeyondTools
from mcp_frontend.executing import _checkpoint_refused, _execute, _guidance, progress_message
from mcp_frontend.link import TemporalLink
from mcp_frontend.resources import RunWatches

ItemKind = Literal["directive", "tool", "knowledge", "run", "mcp", "script"]
# Item spaces: 'project' (the project's .ai/; 'local' is the same, as in Kiwi MCP) and 'user'.
Source = Literal["all", "project", "local", "user", "registry"]


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
                    # (Typed as the refusal it is: README trial s39 got the generic KiwiError.)
                    raise PermissionDenied(
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
            return error(
                "run", action, "", InputInvalid("a help signal needs run_id", hint="pass the run's id")
            )
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
                    "message": "the run takes a git checkpoint now, when the project is a git repository, as a "
                    "git.checkpoint call (after a human's approval where git.checkpoint needs one, within its rate "
                    "limits): it is listed under 'checkpoints' in execute(item_type='run', action='status', "
                    "run_id=...), and a refusal under 'last_calls'",
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
