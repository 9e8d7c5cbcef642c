"""``execute``: item actions and run actions (start, status, calls, cancel, poll), the runs' tool
lists and the guidance handed to the agent."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import anyio

from kiwi.errors import (
    InputInvalid,
    KiwiError,
    PermissionDenied,
    Problem,
    RunStateConflict,
)
from kiwi.explain import grants_some_call
from kiwi.harness import load_harness
from kiwi.items.authoring import delete_item, link_knowledge, save_directive, save_knowledge
from kiwi.items.store import ItemStore
from kiwi.policy import PermissionSet
from kiwi.runs import RunClient
from kiwi.toolargs import json_kind
from mcp_frontend.answers import INSTRUCTIONS, _publish, agent_hint, next_move
from mcp_frontend.link import TemporalLink
from workflows.directive_run.options import HELD


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
    from kiwi.toolargs import BUILTIN_DESCRIPTIONS, BUILTIN_SCHEMAS

    found: dict[str, dict[str, Any]] = {}
    for tool, schema in BUILTIN_SCHEMAS.items():
        if grants_some_call(grants, tool):
            found[tool] = {
                "type": "built-in",
                "description": BUILTIN_DESCRIPTIONS.get(tool, ""),
                "input_schema": schema,
            }
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
            # (README trial s38: the agent learnt that a call waits for a human only when it answered pending.)
            **_approvals(directive, link.store.project_root, started.grants or directive.grants()),
            **(
                {"deviation_rules": _deviation_guidance(directive.metadata.deviation_rules, new_id)}
                if directive.metadata.deviation_rules
                else {}
            ),
            **({"waiting_for": status.waiting_for} if status.waiting_for else {}),
            "instructions": next_move(status),
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
                hint=f"parameters={{'step': {step!r}, 'outputs': {{NAME: value, ...}}}} (the names the step's "
                "instructions ask for, in the run's current_step.action)",
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


def _approvals(directive: Any, project_root: Path, grants: Any) -> dict[str, Any]:
    """The run answer's word on the calls that wait for a human, when some of those it may make do."""
    from kiwi.items.validation import run_approvals

    patterns = [p for p in run_approvals(directive, project_root) if grants.may_call(p)]
    if not patterns:
        return {}
    return {
        "approvals": {
            "tools": patterns,
            "note": "a call of these waits for a human's signed approval: it answers `pending` with a call_id, "
            "which execute(item_type='run', action='poll', run_id=RUN, item_id=CALL_ID) follows until the human "
            "decides",
        }
    }
