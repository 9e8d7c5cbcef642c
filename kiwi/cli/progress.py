"""What the command line shows while it waits on a run, and how it writes times and colour.

A wait prints the run whenever its state changes, and every ``KIWI_PROGRESS_SECONDS`` (default 30)
while nothing changes: what the run waits for, since when, until when, and the command that answers it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from datetime import UTC, datetime
from typing import Any

from kiwi.cli.safeout import one_line
from kiwi.contracts import HELD, TERMINAL, RunStatus, is_session
from kiwi.errors import KiwiError, RunInOtherProject, RunNotFound


def quiet_stdout() -> None:
    """The reader went away (`kiwi runs | head`, a log collector gone): what follows goes nowhere, and
    nobody is told (Python's own flush at exit would fail too)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


# ---------------------------------------------------------------- colour and times


def colour_on(stream: Any = None) -> bool:
    """Colour only on a terminal, and never with NO_COLOR set (https://no-color.org)."""
    stream = stream or sys.stdout
    return bool(not os.environ.get("NO_COLOR") and hasattr(stream, "isatty") and stream.isatty())


_CODES = {"green": "32", "red": "31", "yellow": "33", "dim": "2", "bold": "1"}
_STATE_COLOURS = {
    "completed": "green",
    "failed": "red",
    "timed_out": "red",
    "cancelled": "dim",
    "awaiting_agent": "yellow",
    "awaiting_approval": "yellow",
    "awaiting_human": "yellow",
    "stuck": "red",
}


def paint(text: str, colour: str) -> str:
    return f"\033[{_CODES[colour]}m{text}\033[0m" if colour in _CODES and colour_on() else text


def state(text: str) -> str:
    """A run state, coloured by what it asks of a human (on a terminal)."""
    return paint(text, _STATE_COLOURS.get(text, ""))


def state_of_call(status: str) -> str:
    """A call's outcome (ok, denied, error, ...), coloured on a terminal."""
    return paint(status, "green" if status == "ok" else "yellow" if status == "pending" else "red")


def parse_time(value: str) -> datetime | None:
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except (ValueError, AttributeError):
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def readable_time(value: str | datetime | None, now: datetime | None = None) -> str:
    """``2026-11-22 14:03:07 (5m ago)`` in local time; "" for no time."""
    moment = value if isinstance(value, datetime) else parse_time(value or "")
    if moment is None:
        return str(value or "")
    now = now or datetime.now(UTC)
    delta = (now - moment).total_seconds()
    relative = f"{duration(abs(delta))} {'ago' if delta >= 0 else 'from now'}"
    return f"{moment.astimezone().strftime('%Y-%m-%d %H:%M:%S')} ({relative})"


def duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    if seconds < 86400:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 86400}d{seconds % 86400 // 3600:02d}h"


# ---------------------------------------------------------------- what answers a waiting run


def answers(status: RunStatus) -> list[str]:
    """What the run waits for, with its deadline and the command that answers it, one line each."""
    run = status.run_id
    lines = []
    for a in status.approvals:
        if a.status == "pending":
            until = f", until {readable_time(a.expires_at)}" if a.expires_at else ""
            lines.append(
                f"approval {a.request_id} of {one_line(a.summary or a.tool)} (asked {readable_time(a.requested_at)}"
                f"{until}): answer with `kiwi approve {run} {a.request_id}` or `kiwi reject {run} {a.request_id}`"
            )
    for d in status.decisions:
        if not d.answer:
            # (A human may resume the run without answering: the run goes on, the question stays open.)
            went_on = (
                "; the run was resumed without an answer, and an answer still reaches the agent"
                if status.status not in HELD
                else ""
            )
            lines.append(
                f"escalation {d.request_id}: {one_line(d.reason)} (asked {readable_time(d.asked_at)}{went_on}): answer "
                f"with `kiwi decide {run} {d.request_id} {one_line('|'.join(d.options)) or 'OPTION'}`"
            )
    if status.status == "awaiting_agent" and is_session(status.run_id, status.directive):
        lines.append(
            "calls outside a run: this is the project's session, which takes them for as long as the project "
            "lives (nothing to complete; `kiwi cancel` ends it, and the next such call starts another)"
        )
    elif status.status == "awaiting_agent" and status.current_step:
        lines.append(
            f"the agent to complete step {status.current_step.name}: the agent calls execute(item_type='run', "
            f"action='complete_step'), or `kiwi complete-step {run} {status.current_step.name} --output KEY=VALUE`"
        )
    if status.status in HELD and status.hold_reason.startswith("escalation "):
        # (README trial s38: this said "let it carry on with kiwi resume" under the decide that answers it.)
        lines.append(
            "a human: answering the escalation (above) lets the run go on with the answer; `kiwi resume "
            f"{run} --reason ...` lets it go on unanswered"
        )
    elif status.status in HELD:
        lines.append(
            f"a human: the run stopped ({one_line(status.hold_reason or status.status)}); let it carry on with "
            f"`kiwi resume {run} --reason ...`"
        )
    return lines


# ---------------------------------------------------------------- watching


def progress_every() -> float:
    try:
        return max(0.5, float(os.environ.get("KIWI_PROGRESS_SECONDS", "30")))
    except ValueError:
        return 30.0


# What `kiwi run --wait` stops at besides the run's end: nothing happens until someone acts (an approval
# waited an hour, printing a line every 30 s, before the trial's script went on).
WAITS_FOR_SOMEONE = ("awaiting_agent", "awaiting_approval", "awaiting_human", "stuck")


async def watch(
    runs: Any, run_id: str, *, as_json: bool, until_done: bool, show: Any, json_lines: bool = False
) -> RunStatus:
    """Follow a run: ``show(status)`` on every change, a progress line on long waits.

    Returns when the run ends (or, unless ``until_done``, when it waits for the agent or a human:
    ``WAITS_FOR_SOMEONE``). With ``as_json`` nothing is printed on the way, unless ``json_lines``: then
    each change before the end is one line of JSON (the caller prints the end).
    """
    loop = asyncio.get_running_loop()
    last = None
    since = datetime.now(UTC)
    next_note = loop.time() + progress_every()
    delay = 0.2
    while True:
        try:
            status = await read_status(runs, run_id)
        except (RunNotFound, RunInOtherProject):
            raise
        except KiwiError as exc:
            # No worker answers the status query (all stopped, say): the run waits on; so do we.
            if not as_json and loop.time() >= next_note:
                print(f"{datetime.now().astimezone():%H:%M:%S} {exc.message}; still watching", flush=True)
                if exc.hint:
                    print(f"  {exc.hint}", flush=True)
                next_note = loop.time() + progress_every()
            await asyncio.sleep(2.0)
            continue
        key = (
            status.status,
            status.current_step.name if status.current_step else None,
            status.calls,
            tuple(a.status for a in status.approvals),
        )
        if key != last:
            if not as_json:
                show(status)
            elif json_lines and status.status not in TERMINAL:
                print(json.dumps(status.model_dump(mode="json"), default=str), flush=True)
            last, since = key, datetime.now(UTC)
            next_note = loop.time() + progress_every()
        elif not as_json and loop.time() >= next_note:
            await _note(runs, status, since)
            next_note = loop.time() + progress_every()
        if status.status in TERMINAL or (not until_done and status.status in WAITS_FOR_SOMEONE):
            return status
        sys.stdout.flush()
        await asyncio.sleep(delay)
        delay = min(delay * 1.5, 2.0)


async def read_status(runs: Any, run_id: str) -> RunStatus:
    """The run's status query, or an error saying no worker answered it (the run itself waits on).

    A worker answers the query; with none running, Temporal holds it. ``KIWI_STATUS_SECONDS``
    (default 10) bounds the wait.
    """
    limit = status_seconds()
    try:
        # (asyncio.timeout, not wait_for: Python 3.11's wait_for loses a cancellation that comes as the query
        # answers, so the Ctrl-C that cancels a `kiwi status --watch` was lost and the watch went on: CI s34.)
        async with asyncio.timeout(limit):
            return await runs.status(run_id)
    except TimeoutError:
        raise await no_worker(runs, run_id, f"answered {run_id}'s status within {limit:g}s") from None


def status_seconds() -> float:
    """How long a command waits for a worker to answer (``KIWI_STATUS_SECONDS``, default 10)."""
    try:
        return max(0.1, float(os.environ.get("KIWI_STATUS_SECONDS", "10")))
    except ValueError:
        return 10.0


async def no_worker(runs: Any, run_id: str, what: str) -> KiwiError:
    """The error of a command no worker answered: ``what`` it did not do, and which worker to start."""
    from temporalio.client import WorkflowExecutionStatus

    queue, ended = runs.task_queue, ""
    with contextlib.suppress(Exception):  # (the run's own queue, not this command's --task-queue)
        described = await asyncio.wait_for(runs.handle(run_id).describe(), 5)
        queue = described.task_queue or queue
        if described.status not in (None, WorkflowExecutionStatus.RUNNING):
            ended = described.status.name.lower().replace("_", " ")
    return KiwiError(
        # (README trial s39: a finished run's status, with no worker, said the run "waits on".)
        f"no worker {what}: the run has ended ({ended}), and a worker reads its details from its history"
        if ended
        else f"no worker {what} (the run waits on without one)",
        hint=f"start `kiwi dev` or `kiwi worker` on task queue '{queue}' (with Worker Versioning, "
        "a worker of the run's deployment version: a plain worker takes nothing once the queue has a "
        "current version; see README, Upgrading workers)",
    )


async def _note(runs: Any, status: RunStatus, since: datetime) -> None:
    """One line on a long wait: still in this state, since when, and what it waits for."""
    waited = duration((datetime.now(UTC) - since).total_seconds())
    step = f" at step {status.current_step.name}" if status.current_step else ""
    print(
        f"{datetime.now().astimezone():%H:%M:%S} {status.run_id} still {state(status.status)}{step} "
        f"(for {waited}, since {since.astimezone():%H:%M:%S})",
        flush=True,
    )
    for line in answers(status):
        print(f"  waiting for {line}", flush=True)
    if status.status == "running":
        for activity in await runs.activities(status.run_id):
            print(f"  {activity_line(activity)}", flush=True)


def activity_line(activity: dict[str, Any]) -> str:
    retry = f", retried: attempt {activity['attempt']}" if activity["attempt"] > 1 else ""
    failure = f" (last failure: {activity['last_failure']})" if activity["last_failure"] else ""
    return f"activity {activity['activity']} {activity['state']}{retry}{failure}"
