"""Help topics: what the front end's ``help`` and a run's ``kiwi-mcp.help`` answer. Pure text."""

from __future__ import annotations

from typing import Any

PERMISSIONS = (
    "Calls are checked against the directive's <permissions>: filesystem read/write globs "
    "('*' stays in one folder, '**' crosses folders), tool ids, shell command allowlists, MCP "
    'tool allowlists, network hosts, and Kiwi\'s meta-tools (<execute resource="kiwi-mcp" '
    'action="search,load,help,execute"/>). Denials come back with a hint naming the grant that would allow them.'
)
BUILTINS = (
    "Built-in tools: filesystem.read/write/list/create/delete/move (path relative to the project), "
    "shell.run (command or argv; no shell syntax), git.status/diff/commit/checkpoint/rollback, "
    "directive.run (a child run)."
)
KIWI_MCP = (
    "Kiwi's meta-tools inside a run, each needing its kiwi-mcp grant: "
    "kiwi-mcp.search {query, item_type, category, limit} finds the project's directives, tools and "
    "knowledge; kiwi-mcp.load {item_type, item_id} reads one item; kiwi-mcp.help {topic} is this help; "
    "kiwi-mcp.execute (kiwi-mcp.run) {item_type: 'directive', action: 'run', item_id, inputs} starts a "
    "child run with no more than this run's grants, {item_type: 'tool', item_id, parameters} calls a tool "
    "through this run (the tool's own grant applies). Creating, updating, deleting or publishing items is "
    "not available inside a run."
)
RUNS = (
    "A run does its steps in order: automatic steps make their tool calls by themselves; an agent step "
    "waits until the agent completes it with its outputs. Every call, from a step or the agent, is checked "
    "(grants, rate limits, loop detection, approvals) and audited."
)
DIRECTIVES = (
    "A directive is Markdown with one ```xml block: <metadata> (description, <permissions>, tools), "
    "<inputs>, and a <process> of <step>s with <tool_call>s and <action> text for the agent."
)
TOPICS = {
    "permissions": PERMISSIONS,
    "tools": BUILTINS,
    "kiwi-mcp": KIWI_MCP,
    "runs": RUNS,
    "directives": DIRECTIVES,
}


def run_help(topic: str, local_tools: dict[str, Any]) -> dict[str, Any]:
    """``kiwi-mcp.help``: one topic (or all of them) for an agent inside a run; ``local_tools`` maps the
    run's local tool ids to their input schemas, listed under ``tools``."""
    topic = (topic or "").strip().lower()
    chosen = {topic: TOPICS[topic]} if topic in TOPICS else dict(TOPICS)
    if "tools" in chosen:
        listed = ", ".join(sorted(local_tools)) or "none"
        chosen["tools"] = f"{BUILTINS} Local tools of this run: {listed}."
    return {
        "topic": topic if topic in TOPICS else "all",
        "help": "\n\n".join(chosen.values()),
        "topics": sorted(TOPICS),
        **({"note": f"no topic '{topic}'; every topic is shown"} if topic and topic not in TOPICS else {}),
    }
