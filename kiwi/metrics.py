"""Kiwi's own metrics, recorded through Temporal's metric meters: exported over OTLP beside the SDK's
(``temporal_*``) when telemetry is on (``kiwi.telemetry``), no-ops otherwise.

Call latency per activity (proxied MCP, filesystem, shell, local tools) is the SDK's
``temporal_activity_execution_latency`` / ``temporal_local_activity_execution_latency`` by
``activity_type``; Kiwi adds what only it knows.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio.common import MetricMeter

TOOL_CALLS = "kiwi_tool_calls"
TOOL_CALL_DURATION = "kiwi_tool_call_duration"
RUNS_STARTED = "kiwi_runs_started"
RUNS_FINISHED = "kiwi_runs_finished"
APPROVALS_REQUESTED = "kiwi_approvals_requested"
APPROVALS_RESOLVED = "kiwi_approvals_resolved"
MCP_CONNECTIONS = "kiwi_mcp_connections_opened"
MCP_DROPPED = "kiwi_mcp_connections_dropped"
AUDIT_FLUSH_LAG = "kiwi_audit_flush_lag"


def tool_kind(tool: str) -> str:
    """The family a tool's latency is reported under (bounded, unlike tool names)."""
    head = tool.partition(".")[0]
    if head in ("filesystem", "shell", "git"):
        return head
    return "mcp" if "." in tool else "tool"


class RunMetrics:
    """What a run's audit records count: calls by tool and decision, their duration, runs started and
    finished by status, approvals requested and resolved (waiting = requested - resolved)."""

    def __init__(self, meter: MetricMeter) -> None:
        self.calls = meter.create_counter(TOOL_CALLS, "tool calls by tool and decision")
        self.duration = meter.create_histogram_timedelta(
            TOOL_CALL_DURATION, "a tool call from admission to its answer, by tool kind", "ms"
        )
        self.started = meter.create_counter(RUNS_STARTED, "directive runs started")
        self.finished = meter.create_counter(RUNS_FINISHED, "directive runs finished, by status")
        self.requested = meter.create_counter(APPROVALS_REQUESTED, "approvals asked of a human")
        self.resolved = meter.create_counter(APPROVALS_RESOLVED, "approvals decided or timed out")

    def record(self, entry: dict[str, Any]) -> None:
        event = entry.get("event")
        directive = str(entry.get("directive", ""))
        if event == "tool_call":
            tool = str(entry.get("tool", ""))
            decision = str(entry.get("decision", ""))
            # A call made names a tool the run was granted; a refused one names whatever the agent sent, which a
            # label would keep unscrubbed, export to every backend and multiply without bound (hostile review
            # s39: `nosuch.<a secret>`): only its kind then.
            shown = tool if decision == "allowed" else f"{tool_kind(tool)} (not made)"
            self.calls.add(1, {"tool": shown, "decision": decision, "directive": directive})
            self.duration.record(
                timedelta(milliseconds=int(entry.get("duration_ms") or 0)), {"kind": tool_kind(tool)}
            )
        elif event == "run_started":
            self.started.add(1, {"directive": directive})
        elif event == "run_finished":
            self.finished.add(1, {"directive": directive, "status": str(entry.get("status", ""))})
        elif event == "approval_requested":
            self.requested.add(1, {"directive": directive})
        elif event in ("approval_decided", "approval_timed_out"):
            outcome = "timed_out" if event == "approval_timed_out" else str(entry.get("decision", "decided"))
            self.resolved.add(1, {"directive": directive, "outcome": outcome})


def process_meter() -> MetricMeter:
    """The meter of this process's Temporal runtime (for code outside workflows and activities)."""
    from temporalio.runtime import Runtime

    return Runtime.default().metric_meter
