"""``kiwi`` subcommands that talk to Temporal: dev, worker, mcp, run, runs, status, call, complete-step,
cancel, resume, approve, reject, decide, approvals, audit. Each serves one project (``--project``,
``KIWI_PROJECT``, or the folder's) unless ``--all-projects``."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import math
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args

from kiwi import telemetry
from kiwi.cli import positive, progress
from kiwi.cli.audit import cmd_audit
from kiwi.cli.connection import _connection, _port, _project, _seconds
from kiwi.cli.processes import cmd_dev, cmd_mcp, cmd_worker
from kiwi.cli.safeout import one_line
from kiwi.cli.statusview import asked_by, print_status
from kiwi.contracts import HELD, TERMINAL, RunStatusName, ToolCallResult
from kiwi.errors import InputInvalid, KiwiError
from kiwi.explain import outside_run_hint, tool_not_found

if TYPE_CHECKING:
    from kiwi.runs import RunClient


def _pairs(values: list[str] | None, what: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in values or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InputInvalid(f"{what} '{item}' is not KEY=VALUE", hint=f"e.g. --{what} name=world")
        if key in out and out[key] != value:
            # (README trial s38: the last of two silently won.)
            raise InputInvalid(
                f"{what} '{key}' is given twice ('{out[key]}' and '{value}')",
                hint=f"give it once (for an array, one value with its items separated by commas: --{what} "
                f"{key}='a, b')",
            )
        out[key] = value
    return out


def _outputs(values: list[str] | None) -> dict[str, Any]:
    """Step outputs: JSON values when they parse (true, 3, [..]), strings otherwise."""
    out = {}
    for key, value in _pairs(values, "output").items():
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


async def _run_client(args: argparse.Namespace):
    from kiwi.connect import connect, unreachable_hint
    from kiwi.items.store import ItemStore, find_project_root
    from kiwi.runs import RunClient

    try:
        client = await connect(getattr(args, "address", None), getattr(args, "namespace", None))
    except RuntimeError as exc:
        tried = getattr(args, "address", None)
        raise KiwiError(f"cannot reach Temporal: {exc}", hint=unreachable_hint(tried)) from None
    return RunClient(
        client,
        ItemStore(find_project_root()),
        task_queue=args.task_queue,
        all_projects=bool(getattr(args, "all_projects", False)),
    )


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, default=str))


async def _watch(runs, run_id: str, as_json: bool, until_done: bool, args: Any = None) -> Any:
    """Follow a run (see kiwi.cli.progress); Ctrl-C stops the watching, never the run."""
    if args is not None:
        args.watching = run_id  # main() tells the user the run goes on
    return await progress.watch(
        runs,
        run_id,
        as_json=as_json,
        until_done=until_done,
        show=print_status,
        json_lines=until_done and as_json,  # (`status --watch --json`: a line per change, then the end)
    )


def _with_runs(
    command: Callable[[argparse.Namespace, RunClient], Awaitable[int]],
) -> Callable[[argparse.Namespace], int]:
    """A CLI command that steers runs: connect, hand it a RunClient, run it to its exit code."""

    @functools.wraps(command)
    def run(args: argparse.Namespace) -> int:
        async def go() -> int:
            return await command(args, await _run_client(args))

        return asyncio.run(go())

    return run


def cmd_run(args: argparse.Namespace) -> int:
    """Start a directive run; the arguments are checked before Temporal is asked anything."""
    deadline = args.deadline
    if deadline is not None and not (math.isfinite(deadline) and deadline > 0):
        raise InputInvalid(
            f"--deadline must be a positive number of seconds, got {deadline:g}",
            hint="e.g. --deadline 3600 (an hour), or leave it out for no deadline",
        )
    _pairs(args.input, "input")
    return _start_run(args)


@_with_runs
async def _start_run(args: argparse.Namespace, runs: RunClient) -> int:
    _warn_refused_steps(runs, args.name)
    started = await runs.launch(
        args.name,
        _pairs(args.input, "input"),
        idempotency_key=args.idempotency_key,
        deadline_seconds=args.deadline,
    )
    run_id = started.run_id
    if started.existing and not args.json:
        # (README trial s34: it said "started" of the run the key had started before.)
        print(
            f"existing run {run_id}: idempotency key {args.idempotency_key!r} started it before; nothing new started"
        )
    try:
        return await _follow_started(args, runs, run_id, started.existing)
    except KiwiError as exc:
        exc.details = {"run_id": run_id}  # (started all the same: --json says which run)
        raise


def _warn_refused_steps(runs: RunClient, name: str) -> None:
    """The step calls `kiwi validate` marks FAIL because the directive's own permissions refuse them: the run
    starts (a step behind a condition may never run), and stops at such a step if it reaches it; said first."""
    from kiwi.harness import load_harness
    from kiwi.items.validation import local_params, ungranted_calls
    from kiwi.keys import load_trusted
    from kiwi.snapshot import directive_trust, run_grants, shown_path

    try:
        directive, text, path = runs.store.load_directive(name)
        harness = load_harness(runs.store.project_root, runs.store.user)
        trust = directive_trust(
            text, harness.signatures, load_trusted(runs.store.project_root, runs.store.user).with_role("sign")
        )
    except KiwiError:
        return  # (the start says what is wrong with it)
    shown = shown_path(path)
    # The grants its run gets: an unsigned or changed directive's are what it shares with the base policy
    # (README trial s36: such a run started with no word, and failed at once at a call its file grants).
    grants = run_grants(directive, trust, harness)
    own: set[tuple[int, int]] = set()
    if trust.grants != "declared":
        own = {(p.line, p.column) for p in ungranted_calls(directive, shown)}
        sys.stderr.write(f"kiwi run: warning: {shown} is {trust.note}\n")
    # (And the <param>s a local tool does not take: second README trial s35, the run started without a word.)
    for problem in [
        *ungranted_calls(directive, shown, grants),
        *local_params(directive, runs.store.local_tools(), shown),
    ]:
        if (
            trust.grants != "declared"
            and (problem.line, problem.column) not in own
            and "; add <" in problem.message
        ):
            # (Its own <permissions> grant the call: signing is the fix, not the grant the refusal names. README
            # trial s36, second round; and said whole, not after the refusal's "has none": trial s37.)
            why = {
                "modified": "it was changed after it was signed",
                "valid": f"its signer ({trust.signer}) is not a trusted key",
            }.get(trust.signature, "it is not signed")
            problem.message = (
                problem.message.split(", which the run would refuse", 1)[0]
                + f", which its <permissions> grant; but {why}, so its runs get only the base policy, which does "
                f"not: `kiwi sign {shown}`"
            )
        sys.stderr.write(
            f"kiwi run: warning: {problem}; the run stops there if it reaches it (`kiwi validate {shown}`)\n"
        )


async def _follow_started(
    args: argparse.Namespace, runs: RunClient, run_id: str, existing: bool = False
) -> int:
    """What `kiwi run` prints once its run started: the run's status, or with --wait its progress."""
    # (A status asked during the first task would cost the run another task. No worker took the task: said
    # at once, not after the status query's own wait too.)
    limit = progress.status_seconds()
    if not await runs.first_task_done(run_id, deadline=limit):
        raise await progress.no_worker(runs, run_id, f"took {run_id}'s first task within {limit:g}s")
    if not args.wait:
        status = await progress.read_status(runs, run_id)
        if args.json:
            print(_status_json(status, existing))
        else:
            if not existing:
                print(f"started {run_id}")
            print_status(status)
        # A run that has already failed (or timed out, or was cancelled) by the time it is shown is a failure
        # for scripts too, as with --wait (README trial s34: `failed` was printed with exit 0).
        return 1 if status.status in ENDED_BADLY else 0
    if not args.json:
        print(
            ("following it" if existing else f"started {run_id}; following it")
            + " until it finishes or waits for the agent or a human (Ctrl-C stops watching)"
        )
    status = await _watch(runs, run_id, args.json, until_done=False, args=args)
    if args.json:
        print(_status_json(status, existing))
    return 0 if status.status in ("completed", "awaiting_agent", "awaiting_approval") else 1


def _key(text: str) -> str:
    """``--idempotency-key``: some text (README trial s34: an empty one was taken as none, starting a run each time)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an idempotency key is some text, not empty")
    return text


def _status_json(status: Any, existing: bool) -> str:
    """A started run's status as `kiwi run --json` prints it: ``existing`` when its idempotency key had started
    it before (README trial s34: a script could not tell)."""
    shown = json.loads(status.model_dump_json())
    return json.dumps({**({"existing": True} if existing else {}), **shown}, indent=2)


# The states of a run that ended without doing its work.
ENDED_BADLY = tuple(s for s in TERMINAL if s != "completed")


def _directive_meant(runs: RunClient, name: str | None) -> str:
    """'; did you mean NAME?' for a --directive that names no directive of the project (README trial s36: `kiwi
    runs --directive helo_kiwi` said no runs, and nothing of the filter)."""
    import difflib

    if not name:
        return ""
    try:
        known = sorted({r.item_id for r in runs.store.list_items("directive")})
    except KiwiError:
        return ""
    if name in known:
        return ""
    near = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    return f"; no directive is called '{name}'" + (f": did you mean {near[0]}?" if near else "")


@_with_runs
async def cmd_runs(args: argparse.Namespace, runs: RunClient) -> int:
    rows = await runs.list_runs(
        status=args.status, directive=args.directive, limit=args.limit, sessions=args.sessions
    )
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    where = "in any project" if runs.all_projects else f"in {runs.project}"
    if not rows:
        # (Runs are listed per task queue: runs started with --task-queue X are X's. s18 trial.)
        print(
            "no runs"
            + (f" of directive '{args.directive}'" if args.directive else "")
            + (f" with status {args.status}" if args.status else "")
            + f" {where} on task queue '{runs.task_queue}'"
            + _directive_meant(runs, args.directive)
        )
        print(
            "(runs of other projects: `kiwi runs --all-projects`; started on another task queue: "
            "`kiwi runs --task-queue NAME`)"
        )
        if not runs.all_projects and not (Path(runs.project) / ".ai").is_dir():
            # (README trial s38: from a folder that is no project, this looked like an empty project.)
            print(
                f"({runs.project} is no Kiwi project (no .ai/ at or above it): run this from your project's "
                "folder, or pass --project PATH)"
            )
        return 0
    header = f"{'RUN':<40} {'STATUS':<17} {'STEP':<20} STARTED"
    print(header + ("  PROJECT" if runs.all_projects else ""))
    for row in rows:
        started = progress.readable_time(row["started"])
        state = progress.state(row["status"]) + " " * max(0, 17 - len(row["status"]))
        line = f"{row['run_id']:<40} {state} {row['step'] or '':<20} {started}"
        print(line + (f"  {row['project'] or '-'}" if runs.all_projects else ""))
    return 0


@_with_runs
async def cmd_approvals(args: argparse.Namespace, runs: RunClient) -> int:
    pending = await runs.pending_approvals(args.limit)
    more = (
        f"(runs past the first {args.limit} with a pending approval are not listed: `kiwi approvals --limit N` "
        "looks at more)"
    )
    if args.json:
        _print_json(pending)
        if pending.more:
            print(more, file=sys.stderr)
        return 0
    if not pending:
        # (Per task queue, as runs are listed: README trial s39 missed a run's approval on another queue.)
        print(
            "no pending approvals"
            + ("" if runs.all_projects else f" in {runs.project}")
            + f" on task queue '{runs.task_queue}'"
        )
        # (README trial s38: an escalation waiting for a human is no approval; where it shows was not said.)
        print(
            "(an agent's escalation, or a held run, waits for you too: `kiwi runs --status awaiting_human`; "
            "runs started on another task queue: `kiwi approvals --task-queue NAME`)"
        )
        if not runs.all_projects and not (Path(runs.project) / ".ai").is_dir():
            # (README trial s39: as `kiwi runs` says it.)
            print(
                f"({runs.project} is no Kiwi project (no .ai/ at or above it): run this from your project's "
                "folder, or pass --project PATH)"
            )
        return 0
    for a in pending:
        print(f"{a['run_id']} {a['request_id']}: {one_line(a['summary'] or a['tool'])} ({asked_by(a)})")
        print(
            f"  asked {progress.readable_time(a['requested_at'])}, until {progress.readable_time(a['expires_at'])}"
        )
        print(f"  args_hash {a['args_hash']}")
        print(
            f"  kiwi approve {a['run_id']} {a['request_id']}  |  kiwi reject {a['run_id']} {a['request_id']}"
        )
    if pending.more:
        print(more)
    return 0


@_with_runs
async def cmd_status(args: argparse.Namespace, runs: RunClient) -> int:
    from kiwi.connect import ui_url

    if args.watch:
        status = await _watch(runs, args.run, args.json, until_done=True, args=args)
    else:
        status = await progress.read_status(runs, args.run)
    activities = [] if status.status in TERMINAL else await runs.activities(args.run)
    link = ui_url(args.run, args.address, args.namespace)
    trace_link = telemetry.trace_url(status.trace_id)
    if args.json:
        data = {
            **status.model_dump(mode="json"),
            "activities": activities,
            "ui": link,
            "trace_url": trace_link,
        }
        if args.watch:  # (JSON lines: this last one is the run's end)
            print(json.dumps(data, default=str), flush=True)
        else:
            _print_json(data)
        return _watched_exit(args, status)
    if not args.watch:
        print_status(status)
    for activity in activities:
        print(f"  {progress.activity_line(activity)}")
    if link:
        print(f"  Temporal UI: {link}")
    if status.trace_id:
        print(f"  Trace: {trace_link or status.trace_id}")
    return _watched_exit(args, status)


def _watched_exit(args: argparse.Namespace, status: Any) -> int:
    """`kiwi status --watch` exits as `kiwi run --wait` does: 1 for a run that ended other than completed
    (README trial s36: it exited 0 for a failed and a timed-out run); a plain `kiwi status` reads, exit 0."""
    return 1 if args.watch and status.status in TERMINAL and status.status != "completed" else 0


@_with_runs
async def cmd_complete_step(args: argparse.Namespace, runs: RunClient) -> int:
    result = await runs.complete_step(args.run, args.step, _outputs(args.output))
    print(
        result.model_dump_json(indent=2)
        if args.json
        else f"step {result.step} completed; run is {result.status}"
        + (f", next step {result.next_step}" if result.next_step else "")
    )
    return 0


def cmd_call(args: argparse.Namespace) -> int:
    """Make one tool call; the arguments are checked before Temporal is asked anything."""
    args.arguments = _call_arguments(args.tool, args.arguments)
    return _make_call(args)


def _arguments_text(text: str | None) -> str | None:
    """The arguments as given: ``@FILE`` is the file's text, ``-`` standard input's (a command line holds
    a few hundred KB at most: a 300 KB write failed with 'Argument list too long'; s18 trial)."""
    if text == "-":
        return sys.stdin.read()
    if text and text.startswith("@"):
        path = Path(text[1:]).expanduser()
        try:
            return path.read_text(encoding="utf-8")
        except OSError as exc:
            raise InputInvalid(
                f"cannot read the arguments from {path}: {exc.strerror}",
                hint="@FILE names a file holding the JSON object; - reads it from standard input",
            ) from None
        except UnicodeDecodeError:
            raise InputInvalid(f"{path} is not UTF-8 text", hint="the arguments are a JSON object") from None
    return text


def _call_arguments(tool: str, text: str | None) -> dict[str, Any]:
    """``kiwi call``'s arguments: a JSON object that fits the tool (raises InputInvalid saying what to send)."""
    from kiwi.toolargs import check_arguments

    example = (
        'e.g. kiwi call filesystem.read \'{"path": "notes/hello.md"}\' (a JSON object, in single quotes)'
    )
    text = _arguments_text(text)
    try:
        arguments = json.loads(text) if text else {}
    except json.JSONDecodeError as exc:
        raise InputInvalid(f"arguments are not JSON: {exc.msg} at column {exc.colno}", hint=example) from None
    except RecursionError:
        raise InputInvalid("arguments are nested too deeply to read", hint=example) from None
    if not isinstance(arguments, dict):
        kind = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
            type(arguments), "a number"
        )
        raise InputInvalid(
            f"arguments must be a JSON object of named arguments, got {kind}: {text}", hint=example
        )
    problem = check_arguments(tool, arguments)
    if problem is not None:
        raise InputInvalid(problem.reason, hint=problem.hint)
    return arguments


# How long `kiwi call` waits for a call's answer before it says what the call waits for (an approval, a slow
# tool), and then how often it says so again while it keeps waiting.
CALL_NOTICE_SECONDS = 5.0
CALL_NOTICE_EVERY = 30.0


async def _answered(runs: RunClient, args: argparse.Namespace, arguments: dict[str, Any]) -> ToolCallResult:
    """The call's answer, however long it takes; while it waits (for a human to approve it, for a slow tool),
    a line on stderr says what for and, for an approval, the command that answers it (README trial s33: a
    call waiting for approval printed nothing until someone ran `kiwi approve` elsewhere)."""
    if args.run:
        result = await runs.call_tool_waiting(
            args.run, args.tool, arguments, client_name=args.client, wait_seconds=CALL_NOTICE_SECONDS
        )
    else:
        result = await runs.session_call(args.client, args.tool, arguments, wait_seconds=CALL_NOTICE_SECONDS)
    while result.status == "pending":
        run_id, call_id = result.result["run_id"], result.result["call_id"]
        request = await runs.waiting_approval(run_id, args.tool, arguments)
        said = (
            f"waits for a human to approve it ({request.request_id}, until {progress.readable_time(request.expires_at)}): "
            f"`kiwi approve {run_id} {request.request_id}` or `kiwi reject {run_id} {request.request_id}`"
            if request is not None
            else "is still running; it goes on in the run"
        )
        print(
            f"kiwi call: {args.tool} {said} (Ctrl-C stops waiting, not the call)", file=sys.stderr, flush=True
        )
        result = await runs.poll_call(run_id, call_id, wait_seconds=CALL_NOTICE_EVERY)
    return result


@_with_runs
async def _make_call(args: argparse.Namespace, runs: RunClient) -> int:
    arguments = args.arguments
    result = tool_not_found(await _answered(runs, args, arguments), in_run=bool(args.run), agent=False)
    if not args.run:
        local = runs.store.local_tools()
        result.hint = outside_run_hint(result.status, result.hint, args.tool, local, agent=False)
    if args.json:
        print(result.model_dump_json(indent=2))
    else:
        seq = f" (call #{result.call_seq})" if result.call_seq else ""
        kind = f" {result.error_type}" if result.error_type else ""
        print(f"{progress.state_of_call(result.status)}{kind}: {result.tool}{seq}")
        if result.result is not None:
            print(json.dumps(result.result, indent=2, default=str))
        for label, text in (("reason", result.reason), ("hint", result.hint)):
            if text:
                print(f"{label}: {text}")
        for warning in result.warnings:
            print(f"warning: {warning}")
    return 0 if result.status == "ok" else 1


@_with_runs
async def cmd_cancel(args: argparse.Namespace, runs: RunClient) -> int:
    children = await runs.cancel(args.run, args.reason, children=not args.keep_children)
    text = f"cancel requested for {args.run}" + (
        f", and for the child runs it started: {', '.join(children)}" if children else ""
    )
    _emit_done(args, {"run_id": args.run, "cancel_requested": True, "children_cancelled": children}, text)
    return 0


def _emit_done(args: argparse.Namespace, data: dict[str, Any], text: str) -> None:
    if getattr(args, "json", False):
        _print_json(data)
    else:
        print(text)


@_with_runs
async def cmd_resume(args: argparse.Namespace, runs: RunClient) -> int:
    taken, children = await runs.resume_with_children(args.run, args.reason, by=args.by)
    text = f"{args.run} resumed" if taken else await _not_taken(runs, args.run, "resume")
    if children and not taken:
        text = f"{args.run} is not held; resumed the child runs it held: {', '.join(children)}"
    elif children:
        text += f", and the child runs it held: {', '.join(children)}"
    _emit_done(
        args,
        {
            "run_id": args.run,
            "resumed": taken,
            "children_resumed": children,
            "sent": True,
            "by": args.by or "",
        },
        text,
    )
    return 0


async def _not_taken(runs: RunClient, run_id: str, what: str) -> str:
    """What a command says of a decision or resume no worker took yet: which worker to start (the run's own task
    queue: README trial s39 was told `kiwi dev` while it ran, on another queue)."""
    queue = runs.task_queue
    with contextlib.suppress(Exception):
        queue = (await asyncio.wait_for(runs.handle(run_id).describe(), 5)).task_queue or queue
    return (
        f"{what} sent to {run_id}; no worker has taken it yet (the run takes it when one runs on its task queue "
        f"'{queue}': `kiwi dev` or `kiwi worker --task-queue {queue}`; `kiwi status {run_id}` shows it)"
    )


@_with_runs
async def cmd_approve(args: argparse.Namespace, runs: RunClient) -> int:
    from kiwi.keys import default_key
    from kiwi.snapshot import signed_decision

    approved = args.command == "approve"
    if args.print_signal:
        status = await runs.answered_status(args.run)
        if status is not None:
            execution, approvals = status.execution, status.approvals
        else:  # (no worker answers: what Temporal and the audit trail keep)
            execution, approvals = await runs.approvals_without_worker(args.run)
        request = next((a for a in approvals if a.request_id == args.request), None)
        if request is None:
            raise KiwiError(
                f"run {args.run} has no approval request '{args.request}'",
                hint=f"see `kiwi status {args.run}`",
            )
        decision = signed_decision(
            args.run,
            execution,
            request,
            approved,
            default_key(args.by, option="--as", role="approve", project_root=runs.store.project_root),
            args.reason,
        )
        print(decision.model_dump_json())
        return 0
    request = await runs.decide_approval(args.run, args.request, approved, by=args.by, reason=args.reason)
    verb = "approved" if approved else "rejected"
    _emit_done(
        args,
        {"run_id": args.run, "approved": approved, **request.model_dump(mode="json")},
        f"{verb} {request.request_id}: {one_line(request.summary)}"
        if request.status != "pending"
        else await _not_taken(runs, args.run, f"'{verb}' for {request.request_id}"),
    )
    return 0


@_with_runs
async def cmd_decide(args: argparse.Namespace, runs: RunClient) -> int:
    taken = await runs.decide(args.run, args.request, args.option, by=args.by, note=args.note)
    held = ""
    if taken:
        # (A run held for something else stays held: a stuck agent's hold waits for a resume. Second trial s36.)
        status = await runs.answered_status(args.run)
        if status is not None and status.status in HELD and status.hold_reason:
            held = f"; the run stays held ({status.hold_reason}): `kiwi resume {args.run}` lets it carry on"
    _emit_done(
        args,
        {"run_id": args.run, "request_id": args.request, "option": args.option, "taken": taken},
        f"answered {args.request}: {args.option}{held}"
        if taken
        else await _not_taken(runs, args.run, f"the answer to {args.request}"),
    )
    return 0


def _approval_id(text: str) -> str:
    """An approval's id as `kiwi status` prints it (approval-3), or its bare number (README trial s38)."""
    return f"approval-{text}" if text.isdigit() else text


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("dev", help="start the embedded stack: Temporal dev server + worker + MCP front end")
    p.add_argument(
        "--config",
        help="temporal-dev.yml to read (default: KIWI_DEV_CONFIG, else the --project's temporal-dev.yml, else "
        "./temporal-dev.yml, else the one at the project's root, else built-in defaults)",
    )
    p.add_argument("--port", type=_port, help="Temporal gRPC port (default 7233; overrides temporal.port)")
    p.add_argument(
        "--ui-port", type=_port, help="Temporal UI port (default 8233; overrides temporal.ui_port)"
    )
    p.add_argument(
        "--mcp-port", type=_port, help="MCP HTTP front end port (default 8765; overrides mcp.port)"
    )
    p.add_argument("--no-mcp", action="store_true", help="do not start the MCP HTTP front end")
    p.add_argument("--verbose", action="store_true", help="show the Temporal server's own log")
    p.add_argument(
        "--otel",
        action="store_true",
        help="export OpenTelemetry traces and metrics (OTLP; OTEL_EXPORTER_OTLP_ENDPOINT, default "
        "http://127.0.0.1:4318); same as KIWI_OTEL=1",
    )
    _project(p, scope=False)
    p.set_defaults(func=cmd_dev)

    p = sub.add_parser(
        "worker",
        help="run a worker: DirectiveRun workflows and all activities (for runs of any project; each "
        "run's activities work in its own project folder)",
        epilog="Shell commands run confined by the kernel (Landlock) where it can: KIWI_CONFINE=auto (default), "
        "required (refuse shell commands without it, or whose protected places it cannot hold read-only) or off; "
        "README: Security, The kernel's wall.",
    )
    _connection(p, scope=False, project=False)
    p.add_argument(
        "--sandboxed",
        action="store_true",
        help="run workflows in the Temporal Python sandbox (determinism checks; slower, see README)",
    )
    p.add_argument(
        "--threaded",
        action="store_true",
        help="run each workflow task on a thread, with the Temporal SDK's deadlock detection (default: on "
        "the worker's event loop, faster; a stuck loop is logged with its stack; see README)",
    )
    p.add_argument(
        "--drain-seconds",
        type=_seconds,
        default=30.0,
        metavar="SECONDS",
        help="on SIGTERM or Ctrl-C, stop polling and give in-flight activities this long to finish before "
        "cancelling them (default 30; keep an orchestrator's kill deadline longer)",
    )
    p.add_argument(
        "--health-port",
        type=_port,
        metavar="PORT",
        help="serve /healthz (liveness) and /readyz (ready while polling, not while draining) on this port "
        "(default: no health endpoints)",
    )
    p.add_argument(
        "--health-host",
        default="127.0.0.1",
        help="bind address of the health endpoints (default 127.0.0.1; 0.0.0.0 for a pod's probes)",
    )
    p.add_argument(
        "--deployment-name",
        help="Worker Versioning: the worker deployment this worker belongs to (with --build-id; see README)",
    )
    p.add_argument("--build-id", help="Worker Versioning: this worker's build id (with --deployment-name)")
    p.add_argument(
        "--versioning-behavior",
        choices=["pinned", "auto-upgrade"],
        default=None,
        help="with Worker Versioning: pinned keeps a run on the build it started on (default); auto-upgrade "
        "moves running runs to the current build",
    )
    p.set_defaults(func=cmd_worker)

    p = sub.add_parser("run", help="start a directive run")
    p.add_argument("name", help="directive name")
    p.add_argument(
        "--input",
        "-i",
        action="append",
        metavar="KEY=VALUE",
        help="an input, one per input (repeatable): the value as its declared type reads it: a string as "
        "written, a number, true/false for a boolean, an array's items separated by commas ('a, b') or JSON "
        "('[1, 2]'), an object as JSON",
    )
    p.add_argument(
        "--idempotency-key",
        type=_key,
        help="the same key returns the run it started instead of starting another (running or ended; other "
        "inputs with the same key are refused)",
    )
    p.add_argument(
        "--deadline",
        type=float,
        metavar="SECONDS",
        help="time the run out after this long (checked while it waits for the agent and before each call of "
        "an automatic step; a call already running ends by its own timeout)",
    )
    p.add_argument(
        "--wait",
        action="store_true",
        help="follow the run until it finishes or waits for the agent or a human (an approval, a hold), "
        "printing progress (Ctrl-C stops watching, not the run); exit 0 when it completed or waits for the "
        "agent or an approval",
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    _connection(p, scope=False)  # (a run starts in this project: --all-projects means nothing here)
    p.set_defaults(func=cmd_run)

    p = sub.add_parser(
        "runs", help="list this project's runs (--all-projects: every project's), from Temporal visibility"
    )
    p.add_argument(
        "--status",
        choices=get_args(RunStatusName),
        metavar="STATE",
        help=f"only runs in this state: {', '.join(get_args(RunStatusName))}",
    )
    p.add_argument("--directive", help="only runs of this directive")
    p.add_argument(
        "--limit",
        type=positive,
        default=50,
        help="at most this many, running runs first, then the most recently closed (default 50)",
    )
    p.add_argument(
        "--sessions",
        action="store_true",
        help="list projects' sessions too (the workflows that take calls made outside a run)",
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    _connection(p)
    p.set_defaults(func=cmd_runs)

    p = sub.add_parser(
        "status",
        help="show a run: state, steps and their outputs, what it waits for and the command that answers "
        "it, last calls, activity attempts, its Temporal UI address",
    )
    p.add_argument("run", help="run id (run-DIRECTIVE-SHORTID)")
    p.add_argument(
        "--watch",
        action="store_true",
        help="follow until the run finishes, printing progress (Ctrl-C stops watching, not the run); with "
        "--json, one line of JSON per change, the last one the run's end",
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    _connection(p)
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("complete-step", help="complete the step a run waits on, with outputs")
    p.add_argument("run", help="run id")
    p.add_argument("step", help="step name")
    p.add_argument(
        "--output",
        "-o",
        action="append",
        metavar="KEY=VALUE",
        help="an output (repeatable; JSON values such as true or 3 are parsed)",
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    _connection(p)
    p.set_defaults(func=cmd_complete_step)

    p = sub.add_parser(
        "call", help="make a tool call through a run's policy, or the base policy outside runs"
    )
    p.add_argument("tool", help="tool id, e.g. filesystem.read or word_count")
    p.add_argument(
        "arguments",
        nargs="?",
        help="arguments as a JSON object; @FILE reads them from a file, - from standard input (for large ones)",
    )
    p.add_argument(
        "--run",
        help="the run whose grants apply (default: your session, with the base policy of agent_harness.yaml)",
    )
    p.add_argument(
        "--client",
        default="cli",
        help="the name this caller goes by in the audit trail (default: cli); calls outside a run share the "
        "project's one session (and rate budget) whatever the name",
    )
    p.add_argument("--json", action="store_true", help="print the whole result as JSON")
    _connection(p)
    p.set_defaults(func=cmd_call)

    p = sub.add_parser("cancel", help="cancel a run (and the child runs it started that still run)")
    p.add_argument("run", help="run id")
    p.add_argument(
        "--reason",
        default="cancelled from the CLI",
        help="why (recorded in the audit trail and shown by `kiwi status`)",
    )
    p.add_argument(
        "--keep-children",
        action="store_true",
        help="leave the child runs it started running (default: cancel them with it)",
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    _connection(p)
    p.set_defaults(func=cmd_cancel)

    p = sub.add_parser("mcp", help="serve the MCP front end (search, load, execute, help) on stdio or HTTP")
    p.add_argument("--http", action="store_true", help="serve streamable HTTP at /mcp instead of stdio")
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="HTTP bind address (default 127.0.0.1; any other needs KIWI_MCP_TOKEN)",
    )
    p.add_argument("--port", type=_port, default=8765, help="HTTP port (default 8765)")
    p.add_argument(
        "--stateless",
        action="store_true",
        help="with --http: keep no MCP session in this process, so several front ends behind a load "
        "balancer can serve one client in turn",
    )
    p.add_argument(
        "--drain-seconds",
        type=_seconds,
        default=30.0,
        metavar="SECONDS",
        help="with --http, on SIGTERM or Ctrl-C: answer 503 on /readyz and give the answers in flight this long "
        "before closing the port (default 30; keep an orchestrator's kill deadline longer)",
    )
    _connection(p, scope=False)
    p.set_defaults(func=cmd_mcp)

    p = sub.add_parser(
        "resume",
        help="let a run that stopped as stuck or awaiting_human carry on (and the child runs it held)",
    )
    p.add_argument("run", help="run id")
    p.add_argument("--reason", default="", help="why (recorded in the audit trail)")
    p.add_argument(
        "--as",
        "--by",
        dest="by",
        metavar="KEY",
        help="your approver key that signs it (default: your only key, or with several the one trusted to approve; see `kiwi keys`)",
    )
    _connection(p)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_resume)

    for name, verb in (("approve", "approve"), ("reject", "reject")):
        p = sub.add_parser(name, help=f"{verb} a call that waits for approval (see `kiwi status RUN`)")
        p.add_argument("run", help="run id")
        p.add_argument(
            "request", type=_approval_id, help="approval request id, e.g. approval-3 (or just its number: 3)"
        )
        p.add_argument("--reason", default="", help="why (recorded in the run and its audit trail)")
        p.add_argument(
            "--as",
            "--by",
            dest="by",
            metavar="KEY",
            help="your approver key that signs the decision (default: your only key, or with several the one trusted to approve; see `kiwi keys`)",
        )
        p.add_argument(
            "--print-signal",
            action="store_true",
            help="print the signed decide_approval signal as JSON instead of sending it (to send with "
            "`temporal workflow signal` or the Temporal UI)",
        )
        p.add_argument("--json", action="store_true", help="print JSON")
        _connection(p)
        p.set_defaults(func=cmd_approve)

    p = sub.add_parser("decide", help="answer an agent's escalation with one of its options")
    p.add_argument("run", help="run id")
    p.add_argument("request", help="escalation id, e.g. decision-3a040699 (`kiwi status RUN` lists it)")
    p.add_argument("option", help="the chosen option")
    p.add_argument("--note", "--reason", dest="note", default="", help="a note for the agent")
    p.add_argument(
        "--as",
        "--by",
        dest="by",
        metavar="KEY",
        help="your approver key that signs the answer (default: your only key, or with several the one trusted to approve; see `kiwi keys`)",
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    _connection(p)
    p.set_defaults(func=cmd_decide)

    p = sub.add_parser("audit", help="print a run's audit trail (.ai/logs/audit)")
    p.add_argument("run", help="run id")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--event", help="only these events (comma list: tool_call,approval_requested,...)")
    p.add_argument("--decision", help="only these decisions (comma list: allowed,denied,rate_limited,...)")
    p.add_argument("--tool", help="only calls of these tools (comma list: shell.run,git.commit,...)")
    _connection(p)
    p.set_defaults(func=cmd_audit)

    p = sub.add_parser("approvals", help="list the approval requests waiting for a human, across runs")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument(
        "--limit",
        type=positive,
        default=200,
        help="look at this many runs with a pending approval at most, running ones in Temporal's order "
        "(default 200; says so when there are more)",
    )
    _connection(p)
    p.set_defaults(func=cmd_approvals)
