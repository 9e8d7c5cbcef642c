"""``kiwi audit RUN``: a run's audit trail, read from the project's (or its owner's) .ai/logs/audit/."""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import sys
from typing import Any

from temporalio.service import RPCError

from kiwi.cli.safeout import one_line
from kiwi.errors import KiwiError, RunInOtherProject


def _audit_detail(record: dict[str, Any]) -> str:
    """What an audit record says besides its event and subject: what a call was asked and by whom, the reason or
    result, and who decided what (the text view showed no request id, option, approver or error type: s18 trial;
    nor a call's arguments or whether the agent or a step made it, only its result: README trial s38)."""
    from kiwi.guards import summarise_call

    parts = []
    tool, arguments = record.get("tool"), record.get("arguments")
    if isinstance(tool, str) and isinstance(arguments, dict):
        asked = summarise_call(tool, arguments).removeprefix(tool).strip()
        if asked and record.get("origin"):
            asked = f"{asked} [{record['origin']}]"
        elif record.get("origin"):
            asked = f"[{record['origin']}]"
        if asked:
            parts.append(asked + (" ->" if record.get("event") == "tool_call" else ""))
    parts.append(
        str(record.get("reason") or record.get("result") or record.get("status") or record.get("error") or "")
    )
    if record.get("request_id") and (record.get("tool") or record.get("step")):
        parts.append(str(record["request_id"]))
    if record.get("option"):
        parts.append(f"option {record['option']}")
    if record.get("by"):
        parts.append(f"by {record['by']}")
    if record.get("note"):
        parts.append(f"note: {record['note']}")
    if record.get("error_type"):
        parts.append(f"({record['error_type']})")
    return " ".join(p for p in parts if p)


def _wanted(record: dict[str, Any], args: argparse.Namespace) -> bool:
    """Whether ``record`` passes `kiwi audit`'s --event, --decision and --tool filters (each a comma list)."""
    for key, given in (("event", args.event), ("decision", args.decision), ("tool", args.tool)):
        if given and str(record.get(key, "")) not in {v.strip() for v in given.split(",")}:
            return False
    return True


def _unmatched_filters(records: list[dict[str, Any]], args: argparse.Namespace) -> None:
    """Say on stderr which filter value no record of the trail has, with the one meant (README trial s38:
    `--event toolcall` printed an empty table, as if the run had made no call)."""
    import difflib

    for key, given in (("event", args.event), ("decision", args.decision), ("tool", args.tool)):
        present = sorted({str(r[key]) for r in records if r.get(key)})
        for value in (v.strip() for v in (given or "").split(",") if v.strip()):
            if value not in present:
                near = difflib.get_close_matches(value, present, n=1)
                print(
                    f"kiwi: no record of this trail has {key} '{value}'"
                    + (
                        f"; did you mean '{near[0]}'?"
                        if near
                        else f" (it has: {', '.join(present) or 'none'})"
                    ),
                    file=sys.stderr,
                )


def cmd_audit(args: argparse.Namespace) -> int:
    """Print a run's audit trail; a file or line that cannot be read is named on stderr (exit 1)."""
    from activities.audit import read_audit_trail
    from kiwi.items.store import find_project_root

    root = str(find_project_root())
    trail = read_audit_trail(root, args.run)
    state = ""
    if not trail.records and not trail.problems:
        # Not in this project's trail: ask Temporal whose run it is and what it is doing.
        owner, state = _run_in_temporal(args)
        if owner and owner != root and not args.all_projects:
            raise RunInOtherProject(
                f"run {args.run} belongs to the project {owner}, not to {root}; its audit trail is in "
                f"{owner}/.ai/logs/audit/",
                hint=f"run the command from {owner}, or pass --project {owner} (or --all-projects)",
            )
        if owner and owner != root:
            trail = read_audit_trail(owner, args.run)
    if not trail.records and not trail.problems:
        if state:
            raise KiwiError(
                f"run {args.run} is {state} and has written no audit records yet",
                hint="records are written at each step boundary and within a second while a step waits; "
                f"try again in a moment, and see `kiwi status {args.run}`",
            )
        raise KiwiError(
            f"no audit records for run '{args.run}' under .ai/logs/audit/",
            hint="run ids look like run-hello_kiwi-1a2b3c4d5e; list them with `kiwi runs`",
        )
    shown = [r for r in trail.records if _wanted(r, args)]
    _unmatched_filters(trail.records, args)
    if args.json:
        print(json.dumps(shown, indent=2))
    else:
        width = max((len(str(r.get("event", ""))) for r in trail.records), default=15)
        # (A header, as `kiwi runs` has: README trial s37.)
        # (Local time, as every time the CLI prints as text: README trial s39 read UTC here, local in `kiwi runs`.)
        print(f"{'SEQ':>4} {'TIME':<23} {'EVENT':<{width}} {'DECISION':<12} {'TOOL/STEP':<22} DETAIL")
        for r in shown:
            what = r.get("tool") or r.get("step") or r.get("child_run") or r.get("request_id") or ""
            decision = r.get("decision", "")
            print(
                f"{r['seq']:>4} {_local(str(r.get('time', ''))):<23} {str(r.get('event', '')):<{width}} "
                f"{decision:<12} {what:<22} {one_line(_audit_detail(r))[:120]}"
            )
    for problem in trail.problems:
        print(f"kiwi: {problem}", file=sys.stderr)
    if trail.problems:
        print(f"kiwi: printed the {len(trail.records)} records that could be read", file=sys.stderr)
        return 1
    return 0


def _local(time: str) -> str:
    """An audit record's time (ISO, UTC) in local time, to the millisecond; as it is when it is no time."""
    from kiwi.cli.progress import parse_time

    moment = parse_time(time)
    if moment is None:
        return time[:23]
    local = moment.astimezone()
    return f"{local:%Y-%m-%d %H:%M:%S}.{local.microsecond // 1000:03d}"


def _run_in_temporal(args: argparse.Namespace) -> tuple[str, str]:
    """(the run's project, its state) as Temporal knows them; ("", "") when it cannot tell."""
    from kiwi.connect import connect
    from kiwi.contracts import PROJECT_ATTR, STATUS_ATTR

    async def go() -> tuple[str, str]:
        try:
            client = await asyncio.wait_for(connect(args.address, args.namespace), 5)
            description = await asyncio.wait_for(client.get_workflow_handle(args.run).describe(), 5)
        except (RuntimeError, OSError, TimeoutError, RPCError):
            return "", ""
        attrs = description.typed_search_attributes
        closed = description.status.name.lower() if description.status else ""
        state = attrs.get(STATUS_ATTR) or closed
        return attrs.get(PROJECT_ATTR) or "", state

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(go())
    # Called from inside an event loop (a program embedding main()): ask from a thread of its own.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, go()).result()
