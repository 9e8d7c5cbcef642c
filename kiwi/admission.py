"""Admission of one tool call: lookup, permission, rate limit, loop detection.

Pure and deterministic: the ``DirectiveRun`` workflow calls :func:`admit` with its snapshot, its
state and ``workflow.now()``, and records the outcome in history; tests call it directly. A refusal
means the call is not executed; an admitted call has been counted (rate limits, loop hashes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from kiwi.contracts import RunSnapshot, RunState, ToolCallResult
from kiwi.errors import InputInvalid, McpUnavailable, PermissionDenied, RateLimited, ToolNotFound
from kiwi.guards import LOOP_KEPT, detect_loop, digest, rate_patterns
from kiwi.items.directive import callable_tool
from kiwi.policy import BUILTIN_TOOLS, KIWI_MCP_TOOLS, Decision, spellings
from kiwi.toolargs import check_arguments

# How many recent call (and result) hashes loop detection looks back over.
LOOP_WINDOW = LOOP_KEPT


@dataclass
class Admission:
    """``refusal`` is set when the call must not run; ``warning`` is a loop warning for an admitted call."""

    refusal: ToolCallResult | None = None
    warning: str = ""


def admit(
    tool: str,
    args: dict[str, Any],
    seq: int,
    *,
    snap: RunSnapshot,
    state: RunState,
    now: float,
    check_args: bool = True,
    kiwi_tools: bool = True,
    granted_by: str = "",
    one_execute: bool = False,
    counted: frozenset[str] = frozenset(),
) -> Admission:
    """Decide whether call ``seq`` may run; ``now`` is workflow time in epoch seconds.

    Order: the tool must exist in this run (built-in, local, or offered by a declared MCP server),
    its arguments must fit it (``check_args``; runs started before that check replay without it),
    the grants must allow it, every rate limit must have room; then it is counted and checked for
    loops. Only an admitted call changes ``state``. ``kiwi_tools``: Kiwi's meta-tools (``kiwi-mcp.*``)
    are tools of the run (runs started before they were replay without them). ``granted_by``: the grant
    that stands in for the tool's own (kiwi-mcp execute for the ``directive.run`` it makes); the tool's
    explicit denials, rate limits and loop checks still apply. ``one_execute``: a denial or rate limit
    naming ``kiwi-mcp.execute`` or ``kiwi-mcp.run`` holds for both (runs started before decide each apart).
    ``counted``: rate-limit patterns the call that made this one (kiwi-mcp.execute of a tool) already
    counted: one agent call, counted once under ``*``.
    """
    names = spellings(tool) if one_execute else (tool,)
    refusal = lookup(tool, seq, snap, state, kiwi_tools=kiwi_tools)
    if refusal is not None:
        return Admission(refusal)
    problem = check_arguments(tool, args) if check_args else None
    if problem is not None:
        return Admission(
            ToolCallResult(
                status="error",
                tool=tool,
                error_type=InputInvalid.type,
                call_seq=seq,
                reason=problem.reason,
                hint=problem.hint,
            )
        )
    decision = snap.grants.check(
        tool, args, blocked_commands=snap.limits.blocked_commands, kiwi_tools=kiwi_tools
    )
    if not decision.allowed and granted_by and snap.grants.explicit_denial(tool) is None:
        decision = Decision(allowed=True, checked_against=[granted_by])
    for other in (n for n in names if n != tool) if decision.allowed else ():
        decision = snap.grants.explicit_denial(other) or decision
    if not decision.allowed:
        return Admission(
            ToolCallResult(
                status="denied",
                tool=tool,
                reason=decision.reason,
                hint=decision.hint,
                error_type=PermissionDenied.type,
                call_seq=seq,
            )
        )
    limits = snap.limits
    patterns = [p for p in _patterns(names, limits.rate_limits, snap, kiwi_tools) if p not in counted]
    for pattern in patterns:
        if state.call_counts.get(pattern, 0) + 1 > limits.rate_limits[pattern]:
            return _rate_limited(
                tool, seq, f"rate limit for {pattern} is {limits.rate_limits[pattern]} calls per run"
            )
    windows = (
        [p for p in _patterns(names, limits.rate_windows, snap, kiwi_tools) if p not in counted]
        if limits.rate_windows
        else []
    )
    for pattern in windows:
        calls, seconds = limits.rate_windows[pattern]
        calls -= state.window_reserved.get(pattern, 0)  # handed to running child runs
        recent = [t for t in state.rate_times.get(pattern, []) if t > now - seconds]
        state.rate_times[pattern] = recent
        if len(recent) >= calls:
            wait = math.ceil(recent[0] + seconds - now) if recent else seconds
            return _rate_limited(
                tool,
                seq,
                f"rate limit for {pattern} is {calls} calls per {seconds:g}s",
                f"try again in {wait:g}s",
            )
    for pattern in patterns:
        state.call_counts[pattern] = state.call_counts.get(pattern, 0) + 1
    for pattern in windows:
        state.rate_times[pattern].append(now)
    state.loop_hashes = (state.loop_hashes + [digest([tool, args])])[-LOOP_WINDOW:]
    warning = detect_loop(state.loop_hashes, limits.loop_repeat_threshold)
    if warning:
        state.loop_warnings += 1
    return Admission(warning=warning)


def counted_patterns(tool: str, snap: RunSnapshot, *, kiwi_tools: bool, one_execute: bool) -> frozenset[str]:
    """The rate-limit patterns (calls per run and per window) an admitted call of ``tool`` counted."""
    names = spellings(tool) if one_execute else (tool,)
    limits = snap.limits
    return frozenset(
        _patterns(names, limits.rate_limits, snap, kiwi_tools)
        + (_patterns(names, limits.rate_windows, snap, kiwi_tools) if limits.rate_windows else [])
    )


def _patterns(
    names: tuple[str, ...], limits: dict[str, Any], snap: RunSnapshot, kiwi_tools: bool
) -> list[str]:
    """The rate-limit patterns that count a call of the tool spelled ``names``, each once."""
    found = [
        p for name in names for p in rate_patterns(name, limits, snap.local_tools, kiwi_tools=kiwi_tools)
    ]
    return list(dict.fromkeys(found))


def _rate_limited(tool: str, seq: int, reason: str, hint: str = "") -> Admission:
    return Admission(
        ToolCallResult(
            status="rate_limited",
            tool=tool,
            error_type=RateLimited.type,
            call_seq=seq,
            reason=reason,
            hint=hint,
        )
    )


def lookup(
    tool: str, seq: int, snap: RunSnapshot, state: RunState, *, kiwi_tools: bool = True
) -> ToolCallResult | None:
    """A ``ToolNotFound``/``McpUnavailable`` error when this run has no such tool, else None."""
    if not callable_tool(tool, snap.directive, frozenset(snap.local_tools), kiwi_tools=kiwi_tools):
        meta = KIWI_MCP_TOOLS if kiwi_tools else ()
        known = ", ".join(sorted([*BUILTIN_TOOLS, *meta, *snap.local_tools]))
        return ToolCallResult(
            status="error",
            tool=tool,
            error_type=ToolNotFound.type,
            call_seq=seq,
            reason=f"no tool '{tool}' in this run",
            hint=f"tools this run can call: {known}",
        )
    server, _, name = tool.partition(".")
    context = state.mcp_context.get(server)
    if context is None or not name:
        return None
    if not context.available:
        return ToolCallResult(
            status="error",
            tool=tool,
            error_type=McpUnavailable.type,
            call_seq=seq,
            reason=f"MCP server '{server}' is unavailable in this run: {context.error}",
            hint=context.hint,
        )
    if name not in context.tool_hashes:
        offered = ", ".join(sorted(context.tool_hashes)) or "none"
        return ToolCallResult(
            status="error",
            tool=tool,
            error_type=ToolNotFound.type,
            call_seq=seq,
            reason=f"MCP server '{server}' offers no tool '{name}' to this run",
            hint=f"tools of {server} this run can call: {offered}",
        )
    return None
