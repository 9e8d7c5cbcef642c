"""The durability promise, measured: N runs while a driver kills a random process with `kill -9` and
starts it again.

    .venv/bin/python bench/chaos.py [--runs 100] [--seed N] [--kill-every 3.0] [--workers 2] [--min-kills 0]

The processes: `kiwi worker`s, one `kiwi mcp --http --stateless` front end (the agent completes its
steps through it), and the Temporal dev server on its SQLite file. The runs are bench_scale_out's: a
third automatic, a third with an agent step, a third with an approval, each step appending a line to
ticks.log, so the directive counts its own side effects. The agent and the approver retry what fails
while a process is down, as real ones would. Victims are drawn in rounds of three, each round a shuffled
order of the three kinds, so every third kill has taken each kind once. With --min-kills K the approver
holds back its approvals until K kills have happened, so the runs cannot all finish before them.

At the end it prints runs started / completed / lost, completed steps re-executed (a duplicate line that
is neither an attempt cut off by a kill nor one Temporal timed out and retried), audit records missing
or duplicated (gaps or repeats in each run's audit sequence numbers), and approvals lost (a run still
waiting for an approval that was sent and accepted). Targets: 0 of each. A failure prints the seed; run
again with --seed to replay the same choices of victims and moments.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402
import httpx2  # noqa: E402
from mcp.client import Client as McpClient  # noqa: E402
from temporalio.client import Client  # noqa: E402
from temporalio.service import RPCError  # noqa: E402

from bench.bench_scale_out import KINDS, activity_retried, make_project, read_ticks  # noqa: E402
from bench.common import start_worker, stop_worker, tuned_dev_server  # noqa: E402
from kiwi.auditlog import read_audit  # noqa: E402
from kiwi.cli.keys import ensure_key  # noqa: E402
from kiwi.converter import data_converter
from kiwi.devserver import free_port  # noqa: E402
from kiwi.errors import TemporalUnavailable  # noqa: E402
from kiwi.items.store import ItemStore  # noqa: E402
from kiwi.runs import RunClient  # noqa: E402
from kiwi.seal import seal_interceptors  # noqa: E402
from kiwi.snapshot import signed_decision  # noqa: E402

# Errors of a call made while a process is down: the caller waits and tries again, as a real agent or
# approver would. (The MCP client's task group wraps a refused connection in an ExceptionGroup; a request
# cut off by the dev server's kill is an RPCError, or Kiwi's TemporalUnavailable.)
TRANSIENT = (
    RuntimeError,
    OSError,
    TimeoutError,
    httpx.HTTPError,
    httpx2.HTTPError,
    ExceptionGroup,
    RPCError,
    TemporalUnavailable,
)


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


class Stack:
    """The processes under test, each killable and restartable."""

    def __init__(self, root: Path, workers: int) -> None:
        self.root = root
        self.server = tuned_dev_server(root)
        self.workers: list[asyncio.subprocess.Process] = []
        self.count = workers
        self.front: asyncio.subprocess.Process | None = None
        self.front_port = free_port()
        self.kills: Counter[str] = Counter()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.front_port}/mcp"

    async def start(self) -> None:
        await self.server.start()
        self.workers = [await start_worker(self.server.address) for _ in range(self.count)]
        await self.start_front()

    async def start_front(self) -> None:
        self.front = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "kiwi", "mcp", "--http", "--stateless", "--port", str(self.front_port),
            "--address", self.server.address, cwd=str(self.root), start_new_session=True,
            stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip

    async def kill(self, victim: str, rng: random.Random) -> None:
        self.kills[victim] += 1
        if victim == "worker":
            i = rng.randrange(len(self.workers))
            await stop_worker(self.workers[i], signal.SIGKILL)
            self.workers[i] = await start_worker(self.server.address)
        elif victim == "front end":
            await stop_worker(self.front, signal.SIGKILL)
            await self.start_front()
        else:
            os.killpg(self.server.process.pid, signal.SIGKILL)
            self.server.process.wait()
            await self.server.start()

    async def stop(self) -> None:
        for proc in [*self.workers, self.front]:
            if proc is not None:
                await stop_worker(proc)
        self.server.stop()


async def retrying(what, *, deadline: float):
    """``await what()`` until it works or ``deadline`` (loop time) passes."""
    loop = asyncio.get_running_loop()
    delay = 0.2
    while True:
        try:
            return await asyncio.wait_for(what(), 30)
        except TRANSIENT:
            if loop.time() > deadline:
                raise
            await asyncio.sleep(delay)
            delay = min(delay * 1.5, 2.0)


VICTIMS = ("worker", "front end", "Temporal dev server")


def victims(rng: random.Random):
    """Kinds of process to kill, in rounds of three: each round a shuffled order of all three."""
    while True:
        yield from rng.sample(VICTIMS, len(VICTIMS))


async def play(
    stack: Stack, runs: RunClient, n: int, approver: str, deadline: float, out: dict, min_kills: int
) -> None:
    """Run ``n`` from start to end: start it, act as its agent or approver, wait for its result.
    The approver sends no approval before ``min_kills`` kills have happened."""
    kind = KINDS[n % len(KINDS)]
    run_id = await retrying(
        lambda: runs.start(f"scale_{kind}", {"n": str(n)}, idempotency_key=f"chaos-{n}"), deadline=deadline
    )
    out["ids"][n] = run_id
    loop = asyncio.get_running_loop()
    while kind != "auto" and loop.time() < deadline:
        status = await retrying(lambda: runs.status(run_id), deadline=deadline)
        if kind == "agent" and status.status == "awaiting_agent" and status.current_step.name == "review":

            async def complete() -> None:
                async with McpClient(stack.url) as mcp:
                    answer = await mcp.call_tool(
                        "execute",
                        {"item_type": "run", "action": "complete_step", "run_id": run_id,
                         "parameters": {"step": "review", "outputs": {"ok": True}}},
                    )  # fmt: skip
                if answer.is_error:
                    # The front end answers a Temporal it could not reach with an error, not an exception:
                    # the agent tries again unless the step is done (an earlier answer lost on the way).
                    now = await runs.status(run_id)
                    if (
                        now.status == "awaiting_agent"
                        and now.current_step
                        and now.current_step.name == "review"
                    ):
                        text = " ".join(getattr(c, "text", "") for c in answer.content)[:200]
                        raise RuntimeError(f"complete_step answered an error: {text}")

            await retrying(complete, deadline=deadline)
            kind = "auto"
        pending = [a for a in status.approvals if a.status == "pending"]
        if kind == "approval" and pending and sum(stack.kills.values()) >= min_kills:

            async def approve(request=pending[0]) -> None:
                execution = await runs.execution(run_id)
                decision = signed_decision(run_id, execution, request, True, approver)
                await runs.handle(run_id).signal("decide_approval", decision)

            await retrying(approve, deadline=deadline)
            out["approved"].add(n)
            kind = "auto"
        await asyncio.sleep(0.3)
    result = await retrying(lambda: runs.handle(run_id).result(), deadline=deadline)
    out["status"][n] = result.status


async def unfinished(runs: RunClient, n: int, run_id: str | None) -> str:
    """What a run the players could not finish was doing when they stopped (the stack is up again), and
    why its workflow tasks failed if they did (a nondeterminism error leaves a run stuck for good)."""
    if run_id is None:
        return f"run {n} ({KINDS[n % len(KINDS)]}) was never started"
    try:
        status = await asyncio.wait_for(runs.status(run_id), 30)
        step = status.current_step.name if status.current_step else None
        said = (
            f"{status.status}, step {step}, approvals {[(a.request_id, a.status) for a in status.approvals]}, "
            f"error {status.error!r}, last calls {[(c.tool, c.status) for c in status.last_calls[-3:]]}"
        )
    except Exception as exc:  # noqa: BLE001 - a diagnostic: whatever stands in the way is the answer
        said = f"status not read: {type(exc).__name__}: {exc}"
    try:
        failures = [
            event.workflow_task_failed_event_attributes.failure.message
            async for event in runs.handle(run_id).fetch_history_events()
            if event.HasField("workflow_task_failed_event_attributes")
        ]
        failed = f"{len(failures)} failed workflow tasks" + (
            f", the last: {failures[-1][:500]}" if failures else ""
        )
    except Exception as exc:  # noqa: BLE001 - as above
        failed = f"history not read: {type(exc).__name__}: {exc}"
    return f"run {n} ({KINDS[n % len(KINDS)]}, {run_id}) unfinished: {said}; {failed}"


async def keep_history(
    runs: RunClient, run_id: str, folder: str | None, name: str = "", history: Any = None
) -> None:
    """With --keep-histories: the run's history (``history``, else fetched) as JSON, for a replay test of
    what went wrong."""
    if folder:
        history = history or await runs.handle(run_id).fetch_history()
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / f"{name}{run_id}.json").write_text(history.to_json())
        say(f"  history kept in {folder}/{name}{run_id}.json")


async def does_not_replay(history) -> str:
    """Why a run's history does not replay in this process ('' when it does): a history a worker cannot
    replay leaves its run unreadable, and stuck for good once its worker's cache loses it."""
    from temporalio.worker import Replayer

    from kiwi.seal import SealInterceptor
    from workers.main import WORKFLOWS

    try:
        await Replayer(
            workflows=WORKFLOWS, data_converter=data_converter, interceptors=[SealInterceptor()]
        ).replay_workflow(history)
    except Exception as exc:  # noqa: BLE001 - a diagnostic: the failure is the answer
        chain, link = [], exc
        while link is not None and len(chain) < 6:
            chain.append(f"{type(link).__name__}: {str(link)[:600]}")
            link = link.__cause__ or link.__context__
        return " <- ".join(chain)
    return ""


def raced(history) -> bool:
    """Whether a human's decision reached the run in the same workflow task as an activity result (it came
    first in the task, a status read from a task that did not finish having shown what it answers)."""
    result_pending = False
    for event in history.events:
        if event.HasField("activity_task_completed_event_attributes"):
            result_pending = True
        elif event.HasField("workflow_task_completed_event_attributes"):
            result_pending = False
        elif (
            result_pending
            and event.HasField("workflow_execution_signaled_event_attributes")
            and event.workflow_execution_signaled_event_attributes.signal_name == "decide_approval"
        ):
            return True
    return False


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--kill-every", type=float, default=3.0, help="mean seconds between kills")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--min-kills",
        type=int,
        default=0,
        help="approvals wait until this many kills have happened (3: every kind of process killed once)",
    )
    parser.add_argument(
        "--max-kills",
        type=int,
        default=0,
        help="stop killing after this many kills and let the runs left finish (0: kill until all finish). A run "
        "still unfinished then is lost, not starved: on a slow host, kills every 1.5 s left one run's player "
        "no window for 140 s",
    )
    parser.add_argument(
        "--keep-histories",
        metavar="DIR",
        help="write the history of each run that went wrong (unfinished, unreadable, approval lost) to DIR",
    )
    parser.add_argument(
        "--timeout", type=float, default=600, help="seconds before unfinished runs count as lost"
    )
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    rng = random.Random(seed)
    say(f"seed {seed}")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        make_project(root)
        for n in range(args.runs):
            (root / "notes").mkdir(exist_ok=True)
            (root / "notes" / f"{n}.txt").write_text("x")
        stack = Stack(root, args.workers)
        await stack.start()
        out: dict = {"ids": {}, "status": {}, "approved": set()}
        try:
            client = await Client.connect(
                stack.server.address, data_converter=data_converter, interceptors=seal_interceptors()
            )
            runs = RunClient(client, ItemStore(root))
            approver = ensure_key()[0]
            loop = asyncio.get_running_loop()
            deadline = loop.time() + args.timeout
            players = asyncio.gather(
                *(play(stack, runs, n, approver, deadline, out, args.min_kills) for n in range(args.runs)),
                return_exceptions=True,
            )
            order = victims(rng)
            while not players.done():
                await asyncio.wait([players], timeout=rng.expovariate(1 / args.kill_every))
                if args.max_kills and sum(stack.kills.values()) >= args.max_kills:
                    say(f"{args.max_kills} kills: the stack stays up while the runs left finish")
                    await asyncio.wait([players])
                elif not players.done():
                    victim = next(order)
                    say(f"kill -9 {victim} ({len(out['status'])}/{args.runs} runs finished)")
                    await stack.kill(victim, rng)
            errors = Counter(
                f"{type(e).__name__}: {e}"[:200] for e in await players if isinstance(e, BaseException)
            )
            for text, count in errors.items():
                say(f"{count} runs' players stopped on {text}")
            for n in range(args.runs):
                if n not in out["status"]:
                    say(await unfinished(runs, n, out["ids"].get(n)))
                    if out["ids"].get(n):
                        await keep_history(runs, out["ids"][n], args.keep_histories)
            lines = read_ticks(root / "ticks.log")
            retried = {
                label
                for label, executions in lines.items()
                if len(executions) > 1
                and await activity_retried(client, out["ids"][int(label.split(":")[0])])
            }
            waiting = unreadable = 0
            for n in out["approved"]:
                try:
                    status = await runs.status(out["ids"][n])
                except Exception as exc:  # noqa: BLE001 - a run whose history no worker replays: say which, and why
                    unreadable += 1
                    # (Why its history does not replay is said, and the history kept, below.)
                    say(f"run {n} ({out['ids'][n]}): status not read ({type(exc).__name__}: {exc})")
                    continue
                if any(a.status == "pending" for a in status.approvals):
                    waiting += 1
                    say(f"run {n} ({out['ids'][n]}): an approval still pending after it was sent")
                    await keep_history(runs, out["ids"][n], args.keep_histories)
            # Every run's history replays, those where a decision raced an activity result included.
            unreplayable = races = 0
            for n, run_id in out["ids"].items():
                history = await runs.handle(run_id).fetch_history()
                if raced(history):
                    races += 1
                    await keep_history(runs, run_id, args.keep_histories, "raced-", history)
                why = await does_not_replay(history)
                if why:
                    unreplayable += 1
                    events = " ".join(str(e.event_type) for e in history.events)
                    say(f"run {n} ({run_id}): its history does not replay here: {why}; event types: {events}")
                    await keep_history(runs, run_id, args.keep_histories, history=history)
            audit_missing = audit_duplicated = 0
            for run_id in out["ids"].values():
                seqs = Counter(r.get("seq") for r in read_audit(str(root), run_id))
                audit_duplicated += sum(c - 1 for c in seqs.values() if c > 1)
                audit_missing += len(set(range(1, max(seqs, default=0) + 1)) - set(seqs))
        finally:
            await stack.stop()
    completed = list(out["status"].values()).count("completed")
    duplicates = {label for label, executions in lines.items() if len(executions) > 1}
    again = duplicates - retried
    print(f"seed {seed}; kills: {dict(stack.kills)}")
    print(f"runs started {len(out['ids'])} / completed {completed} / lost {args.runs - completed}")
    print(f"completed steps re-executed {len(again)} (and {len(duplicates & retried)} retried by Temporal)")
    print(f"audit records missing {audit_missing} / duplicated {audit_duplicated}")
    print(f"approvals lost {waiting} of {len(out['approved'])}")
    print(f"runs whose status no worker could read (their history did not replay) {unreadable}")
    print(
        f"histories that do not replay {unreplayable} of {len(out['ids'])} "
        f"(approvals that raced an activity result: {races})"
    )
    failed = (
        args.runs - completed
        or again
        or audit_missing
        or audit_duplicated
        or waiting
        or unreadable
        or unreplayable
    )
    if failed:
        print(f"FAILED: replay with --seed {seed}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
