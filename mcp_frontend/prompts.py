"""Directives as MCP prompts, so a client can offer "run directive X" from its prompt menu.

Each valid directive is a prompt of the same name whose arguments are the directive's ``<inputs>``
(required when the input is required and has no default). The prompt's text is an instruction to
the agent: the exact ``execute`` call that starts the run with the arguments given (typed as the
directive declares them), the steps ahead, and how to follow the run. Getting the prompt starts
nothing; the agent's ``execute`` call does, through the same checks as any other.

The prompts follow the files: before each ``prompts/list`` and ``prompts/get`` the registered
prompts are brought in line with the directives on disk (new, changed and deleted files).
"""

from __future__ import annotations

import json
import os
from typing import Any

from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.prompts.base import Prompt, PromptArgument

from kiwi.errors import KiwiError
from kiwi.items.directive import Directive, InputSpec
from kiwi.items.store import ItemStore

PROMPT_METHODS = ("prompts/list", "prompts/get")


class DirectivePrompts:
    """Middleware that keeps one MCP prompt per valid directive registered on ``server``."""

    def __init__(self, store: ItemStore) -> None:
        self.store = store
        self.server: MCPServer | None = None
        # directive name -> (file, modification time) of the prompt registered for it
        self._registered: dict[str, tuple[str, int]] = {}

    async def __call__(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        if ctx.method in PROMPT_METHODS:
            # On the event loop: the store's SQLite connection belongs to this thread.
            self.sync()
        return await call_next(ctx)

    def sync(self) -> None:
        server = self.server
        if server is None:
            return
        records = {r.item_id: r for r in self.store.list_items("directive") if r.valid}
        for name in [n for n in self._registered if n not in records]:
            server.remove_prompt(name)
            del self._registered[name]
        for name, record in records.items():
            try:
                stamp = (record.path, os.stat(record.path).st_mtime_ns)
            except OSError:
                continue
            if self._registered.get(name) == stamp:
                continue
            try:
                parsed = self.store.load("directive", name).parsed
            except KiwiError:
                continue
            if not isinstance(parsed, Directive):
                continue
            if name in self._registered:
                server.remove_prompt(name)
            server.add_prompt(directive_prompt(parsed))
            self._registered[name] = stamp


def directive_prompt(directive: Directive) -> Prompt:
    """The prompt for one directive: its inputs as arguments, the instructions to run it as text."""

    async def render(**arguments: str) -> str:
        return run_instructions(directive, arguments)

    return Prompt(
        name=directive.name,
        title=f"Run directive {directive.name}",
        description=directive.metadata.description or f"Run the directive {directive.name}",
        arguments=[_argument(spec) for spec in directive.inputs],
        fn=render,
    )


def _argument(spec: InputSpec) -> PromptArgument:
    about = spec.description or spec.name
    kind = spec.type if spec.default is None else f"{spec.type}, default {json.dumps(spec.default)}"
    return PromptArgument(
        name=spec.name, description=f"{about} ({kind})", required=spec.required and spec.default is None
    )


def run_instructions(directive: Directive, arguments: dict[str, str]) -> str:
    """What the agent reads: the call that starts the run, and what comes after it."""
    parameters = {
        spec.name: _typed(spec, arguments[spec.name]) for spec in directive.inputs if spec.name in arguments
    }
    call = json.dumps(
        {"item_type": "directive", "action": "run", "item_id": directive.name, "parameters": parameters}
    )
    steps = "\n".join(
        f"{number}. {step.name}: {step.description or step.action or 'runs its tool calls'}".strip()
        for number, step in enumerate(directive.steps, start=1)
    )
    return (
        f"Run the Kiwi directive `{directive.name}` (version {directive.version}): "
        f"{directive.metadata.description}\n\n"
        f"Start it with Kiwi's `execute` tool, with exactly these arguments:\n{call}\n\n"
        f"Its steps:\n{steps}\n\n"
        "The answer holds the run's run_id, its state and the current step's instructions. Steps that "
        "run by themselves do so inside the run; for a step that waits for you (state awaiting_agent), "
        "do its action, making tool calls with execute(item_type='tool', action='call', run_id=RUN_ID, "
        "item_id=TOOL, parameters={...}) (every call is checked against the directive's permissions), "
        "then finish it with execute(item_type='run', action='complete_step', run_id=RUN_ID, "
        "parameters={'step': NAME, 'outputs': {...}}). Read the run at any time with "
        "execute(item_type='run', action='status', run_id=RUN_ID) or the resource kiwi://runs/RUN_ID. "
        "When you need a human, use help(action='escalate', run_id=RUN_ID, reason=..., options=[...])."
    )


def _typed(spec: InputSpec, value: str) -> Any:
    """A prompt argument (always text) as the directive's input type; text the run will refuse stays text."""
    if spec.type == "string":
        return value
    try:
        return json.loads(value)
    except ValueError:
        return value
