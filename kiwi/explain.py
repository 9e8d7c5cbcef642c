"""What a refusal or a failed run means to its user, and what fixes it.

The run's own messages are part of its history, so they stay as the run wrote them; these are
computed by the client (the CLI and the MCP front end) from the run's snapshot and status.
"""

from __future__ import annotations

import difflib
import re
from typing import Any

from kiwi.contracts import RunSnapshot, RunTrust, ToolCallResult
from kiwi.guards import is_external_mcp
from kiwi.items.directive import callable_tool
from kiwi.policy import BUILTIN_TOOLS, FILESYSTEM_TOOLS, KIWI_MCP_ACTIONS, KIWI_MCP_TOOLS, PermissionSet

_READS = ("filesystem.read", "filesystem.list")


def trust_hint(trust: RunTrust | None, directive: str, path: str) -> str:
    """Why a run has only the base policy's grants, and the command that gives it its own ("" when it has
    them). ``path``: the directive's file as the user should type it."""
    if trust is None or trust.grants != "base":
        return ""
    why = (
        "was changed after it was signed"
        if trust.signature == "modified"
        else f"is signed by '{trust.signer}', a key Kiwi does not trust for signing"
        if trust.signer
        else "is not signed"
    )
    # Signing is the fix only for content the human stands behind: an agent that may edit directives (the
    # MCP front end's directive update) adds the grant it was refused and is then told to ask for a
    # signature, so the hint says what a signature gives and to read the <permissions> first.
    return (
        f"directive '{directive}' {why}, so its runs get only what agent_harness.yaml's base policy "
        "allows, not its own <permissions>; signing it gives its runs whatever its <permissions> now "
        f"grant, whoever wrote them (agents can edit directives): read them in {path} first, and if its "
        f"content is yours, sign it with `kiwi sign {path}` and start a new run"
    )


def grants_some_call(grants: PermissionSet, tool: str) -> bool:
    """Whether ``grants`` allow some call of the built-in or local ``tool`` (``filesystem.read`` when any
    path may be read, ``shell.run`` when any program may run); each call is still checked in full."""
    if tool in grants.deny_tools or "*" in grants.deny_tools:
        return False
    if tool in FILESYSTEM_TOOLS:
        return bool(grants.fs_read if tool in _READS else grants.fs_write)
    if tool == "shell.run":
        return bool(grants.shell)
    return grants.check_tool_id(tool).allowed


def callable_tools(snap: RunSnapshot) -> list[str]:
    """The tools a run may call: those it has (built-in, local, declared MCP servers') that its grants allow.

    A tool is listed when some call of it can be allowed (``filesystem.read`` when any path may be read);
    each call is still checked in full. A granted MCP server's tools are ``SERVER.TOOL``, or ``SERVER.*``
    when every tool the server offers is granted and the directive names none.
    """
    grants = snap.grants
    local = frozenset(snap.local_tools)
    found = []
    for tool in (*BUILTIN_TOOLS, *KIWI_MCP_TOOLS, *sorted(local)):
        if callable_tool(tool, snap.directive, local) and grants_some_call(grants, tool):
            found.append(tool)
    for server in snap.directive.metadata.tools.mcps:
        granted = [*grants.mcp.get(server.name, []), *grants.mcp.get(server.alias or server.name, [])]
        denied = grants.deny_mcp.get(server.name, [])
        if "*" in denied:
            continue
        if "*" in granted:
            names = list(server.tools) or ["*"]
        else:
            names = [t for t in dict.fromkeys(granted) if not server.tools or t in server.tools]
        found += [f"{server.name}.{name}" for name in names if name not in denied]
    return found


def not_found_hint(tool: str, snap: RunSnapshot, *, outside_run: bool = False) -> str:
    """The hint of a call of a tool the run does not have: the tools it may call instead ("" when the run
    has the tool, a declared MCP server's, and the server's own answer says what it offers)."""
    if callable_tool(tool, snap.directive, frozenset(snap.local_tools)):
        return ""
    callable_ = callable_tools(snap)
    tools = ", ".join(callable_) or "none (its grants allow no tool)"
    # (The one meant, first: README trial s36, `kiwi call wordcount` listed the tools without saying.)
    near = difflib.get_close_matches(tool, callable_, n=1, cutoff=0.75)
    meant = f"did you mean {near[0]}? " if near else ""
    return (
        f"{meant}tools you can call outside a run: {tools}"
        if outside_run
        else f"{meant}tools this run can call: {tools}"
    )


# The grant a refusal's hint asks for, as <permissions> writes it (kiwi.policy, kiwi.shellpolicy).
_PATH_GRANT = re.compile(r'<(read|write) resource="filesystem" path="([^"]+)"/>')
_SHELL_GRANT = re.compile(r'<execute resource="shell" commands="([^"]+)"/>')
_NETWORK_GRANT = re.compile(r'<execute resource="network" hosts="([^"]+)"/>')


def base_policy_grant(tool: str, local_tools: Any, hint: str = "") -> str:
    """The agent_harness.yaml line (flow style) that grants ``tool`` in the base policy (calls outside a run):
    the path or program the refusal's ``hint`` asks <permissions> for, when it names one (README trial s35:
    the line said ``PATH/**`` for a call that had named its path)."""
    if found := _PATH_GRANT.search(hint):
        return f'internal_tools: {{filesystem: {{{found[1]}: ["{found[2]}"]}}}}'
    if found := _NETWORK_GRANT.search(hint):
        # (README trial s39: an api tool's host was refused outside a run, and the line named the tool.)
        return f'internal_tools: {{network: {{hosts: ["{found[1]}"]}}}}'
    if tool in FILESYSTEM_TOOLS:
        kind = "read" if tool in _READS else "write"
        return f'internal_tools: {{filesystem: {{{kind}: ["PATH/**"]}}}}'
    if tool == "shell.run":
        program = found[1] if (found := _SHELL_GRANT.search(hint)) else "PROGRAM"
        return f"internal_tools: {{shell: {{allowed_commands: [{program}]}}}}"
    if is_external_mcp(tool, local_tools):
        server, name = tool.split(".", 1)
        return f"internal_tools: {{mcps: {{{server}: {{tools: [{name}]}}}}}}"
    return f"internal_tools: {{tools: [{tool}]}}"


# What a human uses outside a run instead of each of Kiwi's meta-tools.
_COMMANDS = {"search": "kiwi search", "load": "kiwi show", "execute": "kiwi run", "help": "kiwi --help"}


# A run's id (kiwi.contracts.run_workflow_id: run-DIRECTIVE-SHORT_ID), sent where a tool's id goes.
_RUN_ID = re.compile(r"run-[A-Za-z0-9_.-]{1,100}-[0-9a-f]{10}")


def tool_not_found(result: ToolCallResult, *, in_run: bool, agent: bool) -> ToolCallResult:
    """A ToolNotFound answer as its caller reads it: outside a run it says so (the session that answers it
    calls itself "this run"), and a run's id given as the tool says where it goes (README trial s33)."""
    if result.error_type != "ToolNotFound":
        return result
    if not in_run and result.reason == f"no tool '{result.tool}' in this run":
        result.reason = f"no tool '{result.tool}' outside a run (the base policy's tools)"
    if _RUN_ID.fullmatch(result.tool):
        where = (
            f"execute(item_type='tool', action='call', run_id='{result.tool}', item_id=TOOL, parameters={{...}})"
            if agent
            else f"kiwi call TOOL '{{...}}' --run {result.tool}"
        )
        run, tool = ("run_id", "item_id") if agent else ("--run", "TOOL")
        result.hint = f"'{result.tool}' is a run's id, not a tool's: the run goes in {run}, the tool's id in {tool}: {where}"
    return result


def outside_run_hint(status: str, hint: str, tool: str, local_tools: Any, *, agent: bool) -> str:
    """The hint of a call outside a run: its grants are agent_harness.yaml's base policy, so a missing
    grant is added there (``internal_tools``), not to a directive's <permissions>. ``agent``: said to an
    agent over MCP (the front end's calls), else to a human at the command line."""
    if status != "denied":
        return hint
    if tool in KIWI_MCP_TOOLS:
        action = KIWI_MCP_ACTIONS[tool]
        instead = f"call the front end's own {action} tool" if agent else f"use `{_COMMANDS[action]}`"
        return (
            f"outside a run, {instead} instead; {tool} is for runs whose directive grants it "
            '(<execute resource="kiwi-mcp" action="..."/>)'
        )
    if "<permissions>" not in hint:
        return hint  # refused for another reason than a missing grant: its own hint says what to do
    grant = base_policy_grant(tool, local_tools, hint)
    if agent:
        return (
            f"outside a run the base policy applies: a human merges `{grant}` into .ai/config/agent_harness.yaml (into its internal_tools: when it has one); "
            "or run a directive that grants it (execute(item_type='directive', action='run', ...)) and call "
            "with its run_id"
        )
    return (
        f"outside a run the base policy applies: merge `{grant}` into .ai/config/agent_harness.yaml (into its internal_tools: when it has one); or start a "
        "run of a directive that grants it (`kiwi run NAME`) and make the call in it with --run RUN_ID"
    )
