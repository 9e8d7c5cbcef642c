"""``agent_harness.yaml``: base policy for calls outside a directive, rate limits, loop thresholds.

Project ``.ai/config/`` over user ``~/.ai/config/``: keys in the project file win, key by key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from kiwi import yamltext
from kiwi.contracts import RunLimits
from kiwi.errors import ItemInvalid, Problem
from kiwi.policy import PermissionSet


class HarnessConfig(BaseModel):
    limits: RunLimits = Field(default_factory=RunLimits)
    base_policy: PermissionSet = Field(default_factory=PermissionSet)
    sources: list[str] = Field(default_factory=list)


def _load(path: Path) -> dict[str, Any]:
    data = yamltext.read(path)
    if not isinstance(data, dict):
        raise ItemInvalid([Problem("agent_harness.yaml must be a YAML mapping", str(path), 1, 1)])
    return data


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


RATE_UNITS = {"second": 1.0, "minute": 60.0, "hour": 3600.0, "day": 86400.0}


def set_rate(limits: RunLimits, pattern: str, value: Any, key: str) -> None:
    """A rate limit for ``pattern``: a whole number counts calls per run, "N/minute" (second, hour,
    day) counts calls in that sliding window of workflow time."""
    count, _, unit = str(value).strip().partition("/")
    unit = unit.strip().rstrip("s")
    calls = int(count) if count.strip().isdigit() else -1
    if calls < 0 or (unit and unit not in RATE_UNITS):
        raise ValueError(f"{key} is '{value}'; expected a whole number of calls per run or N/second, N/minute, "
                         "N/hour or N/day, e.g. 100/minute")
    # One limit per pattern: a window replaces the pattern's per-run default, and the reverse.
    if unit:
        limits.rate_limits.pop(pattern, None)
        limits.rate_windows[pattern] = (calls, RATE_UNITS[unit])
    else:
        limits.rate_windows.pop(pattern, None)
        limits.rate_limits[pattern] = calls


def load_harness(project_root: Path, user_space: Path) -> HarnessConfig:
    data: dict[str, Any] = {}
    sources = []
    for path in (user_space / "config" / "agent_harness.yaml", project_root / ".ai" / "config" / "agent_harness.yaml"):
        if path.is_file():
            data = _merge(data, _load(path))
            sources.append(str(path))
    limits = RunLimits()
    try:
        if isinstance(data.get("rate_limits"), dict):
            for pattern, value in data["rate_limits"].items():
                set_rate(limits, str(pattern), value, f"rate_limits.{pattern}")
        loops = data.get("loop_detection") or {}
        limits.loop_repeat_threshold = int(loops.get("repeat_threshold", limits.loop_repeat_threshold))
        limits.loop_max_warnings = int(loops.get("max_warnings", limits.loop_max_warnings))
        runs = data.get("runs") or {}
        limits.max_updates_before_continue = int(runs.get("continue_as_new_after_updates",
                                                          limits.max_updates_before_continue))
        limits.audit_batch_size = int(runs.get("audit_batch_size", limits.audit_batch_size))
        children = data.get("child_runs") or {}
        escalation = str(children.get("on_escalation", limits.on_escalation))
        if escalation not in ("deny", "intersect"):
            raise ValueError(f"child_runs.on_escalation is '{escalation}'; expected deny or intersect")
        limits.on_escalation = escalation  # type: ignore[assignment]
        approvals = data.get("approvals") or {}
        if not isinstance(approvals, dict):
            raise ValueError("approvals must be a mapping (tools, timeout_seconds, on_timeout, webhook)")
        if str(approvals.get("on_timeout", "deny")) != "deny":
            raise ValueError(f"approvals.on_timeout is '{approvals['on_timeout']}'; only deny is supported "
                             "(a call nobody approved never runs)")
        if "tools" in approvals:
            limits.approval_tools = [str(t) for t in approvals["tools"] or []]
        limits.approval_timeout_seconds = float(approvals.get("timeout_seconds", limits.approval_timeout_seconds))
        if limits.approval_timeout_seconds <= 0:
            raise ValueError("approvals.timeout_seconds must be positive")
        limits.approval_webhook = str(approvals.get("webhook") or "")
        tools = data.get("internal_tools") or {}
        shell = tools.get("shell") or {}
        if "blocked_commands" in shell:
            limits.blocked_commands = [str(c) for c in shell["blocked_commands"]]
        fs = tools.get("filesystem") or {}
        mcps = tools.get("mcps") or {}
        if not isinstance(mcps, dict):
            raise ValueError("internal_tools.mcps must map server names to {enabled, tools}")
        for name, entry in mcps.items():
            entry = entry or {}
            if not isinstance(entry, dict):
                raise ValueError(f"internal_tools.mcps.{name} must be a mapping (enabled, tools, rate_limit, "
                                 "require_approval)")
            if "rate_limit" in entry:
                set_rate(limits, f"{name}.*", entry["rate_limit"], f"internal_tools.mcps.{name}.rate_limit")
            limits.approval_tools += [f"{name}.{t}" for t in entry.get("require_approval") or []]
        base = PermissionSet(fs_read=[str(p) for p in fs.get("read", [])],
                             fs_write=[str(p) for p in fs.get("write", [])],
                             shell=[str(c) for c in shell.get("allowed_commands", [])],
                             tools=[str(t) for t in tools.get("tools", [])],
                             mcp={str(name): [str(t) for t in (entry or {}).get("tools", ["*"])]
                                  for name, entry in mcps.items() if (entry or {}).get("enabled", True)})
    except (TypeError, ValueError) as exc:
        raise ItemInvalid([Problem(f"agent_harness.yaml: {exc}", sources[-1] if sources else "")]) from None
    return HarnessConfig(limits=limits, base_policy=base, sources=sources)
