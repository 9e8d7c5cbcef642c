"""Workers scale out and survive a crash: 3 `kiwi worker` processes share the task queue, N mixed runs
(automatic steps, an agent step, an approval) go through them, and one worker is killed with `kill -9`
halfway through.

    .venv/bin/python bench/bench_scale_out.py [--runs 600] [--workers 3] [--concurrency 25]

Every run's steps call the `tick` tool, which appends one line per execution to ticks.log naming the
step, the worker process that ran it and when, so the directive counts its own side effects. The bench
prints runs completed per worker (by the worker that ran a run's last step), runs lost, the recovery
time (from the kill until every run whose earlier step ran on the killed worker had its next step done
by another), and the steps executed more than once. Activities are at least once: an attempt cut off
by `kill -9` (its first execution was on the killed worker) or one Temporal timed out (a second
attempt in the run's history) may have done its work before it ran again; those are shown apart. Any
other duplicate is a completed step run twice, and the target for those is 0.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from temporalio.client import Client  # noqa: E402

from bench.common import gather_limited, scratch_project, start_worker, stop_worker, tuned_dev_server  # noqa: E402
from kiwi.cli.keys import ensure_key  # noqa: E402
from kiwi.converter import data_converter
from kiwi.items.store import ItemStore  # noqa: E402
from kiwi.runs import RunClient  # noqa: E402
from kiwi.seal import seal_interceptors  # noqa: E402
from kiwi.snapshot import signed_decision  # noqa: E402
from tests.helpers import directive_md, write, write_directive  # noqa: E402

TICK = """import os
import time


def main(label: str) -> dict:
    fd = os.open("ticks.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{label} {os.getppid()} {time.time():.3f}\\n".encode())
    finally:
        os.close(fd)
    return {"ticked": label}
"""
KINDS = ("auto", "agent", "approval")


def phase(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def tick(step: str) -> str:
    return f'<step name="{step}"><tool_call tool="tick"><param name="label">{{n}}:{step}</param></tool_call></step>'


def make_project(root: Path) -> None:
    scratch_project(root)
    write(
        root / ".ai" / "tools" / "tick" / "tool.yaml",
        "tool_id: tick\ntool_type: python\nexecutor:\n  entrypoint: main.py\nparameters:\n"
        "  - name: label\n    type: string\n    required: true\nmutates_state: true\n",
    )
    write(root / ".ai" / "tools" / "tick" / "main.py", TICK)
    write(root / ".ai" / "config" / "agent_harness.yaml", "approvals:\n  tools: [filesystem.delete]\n")
    middle = {
        "auto": "",
        "agent": '<step name="review"><action>Look at ticks.log and say ok.</action></step>',
        "approval": '<step name="clean"><tool_call tool="filesystem.delete">'
        '<param name="path">notes/{n}.txt</param></tool_call></step>',
    }
    for kind in KINDS:
        write_directive(
            root / ".ai" / "directives" / f"scale_{kind}.md",
            directive_md(
                tick("first") + middle[kind] + tick("second"),
                name=f"scale_{kind}",
                permissions='<execute resource="tool" id="tick"/><write resource="filesystem" path="notes/**"/>',
                inputs='<input name="n" type="string" required="true"/>',
            ),
        )


async def drive(runs: RunClient, n: int, approver: str, ids: dict[int, str]) -> str:
    """Start run ``n``, play its agent or approver when it waits for one, and return its final status."""
    kind = KINDS[n % len(KINDS)]
    run_id = ids[n] = await runs.start(f"scale_{kind}", {"n": str(n)})
    while kind != "auto":
        status = await runs.status(run_id)
        if kind == "agent" and status.status == "awaiting_agent" and status.current_step.name == "review":
            await runs.complete_step(run_id, "review", {"ok": True})
            break
        pending = [a for a in status.approvals if a.status == "pending"]
        if kind == "approval" and pending:
            decision = signed_decision(run_id, await runs.execution(run_id), pending[0], True, approver)
            await runs.handle(run_id).signal("decide_approval", decision)
            break
        await asyncio.sleep(0.2)
    return (await runs.handle(run_id).result()).status


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=600)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=25)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        make_project(root)
        for n in range(args.runs):
            write(root / "notes" / f"{n}.txt", "x")
        server = tuned_dev_server(root)
        await server.start()
        workers = [await start_worker(server.address) for _ in range(args.workers)]
        killed_pid, killed_at = 0, 0.0
        try:
            client = await Client.connect(
                server.address, data_converter=data_converter, interceptors=seal_interceptors()
            )
            runs = RunClient(client, ItemStore(root))
            approver = ensure_key()[0]
            phase(f"{args.runs} runs over {args.workers} workers")
            done = 0
            ids: dict[int, str] = {}

            async def counted(n: int) -> str:
                nonlocal done, killed_pid, killed_at
                status = await drive(runs, n, approver, ids)
                done += 1
                if done == args.runs // 2 and not killed_pid:
                    victim = workers[0]
                    killed_pid, killed_at = victim.pid, time.time()
                    phase(f"kill -9 worker {victim.pid} with {done} runs completed")
                    await stop_worker(victim, 9)
                return status

            t0 = time.perf_counter()
            statuses = await gather_limited(args.concurrency, [counted(n) for n in range(args.runs)])
            elapsed = time.perf_counter() - t0
            lines = read_ticks(root / "ticks.log")
            retried = {
                label
                for label, runs_ in lines.items()
                if len(runs_) > 1 and await activity_retried(client, ids[int(label.split(":")[0])])
            }
        finally:
            for worker in workers:
                await stop_worker(worker)
            server.stop()
        report(lines, retried, statuses, killed_pid, killed_at, elapsed, args)


def read_ticks(log: Path) -> dict[str, list[tuple[int, float]]]:
    """Each step's executions: (worker pid, time) per line the tick tool wrote."""
    lines: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for line in log.read_text().splitlines():
        label, pid, at = line.split()
        lines[label].append((int(pid), float(at)))
    return lines


async def activity_retried(client: Client, run_id: str) -> bool:
    """Whether the run's history shows an activity that ran more than one attempt. Temporal records
    only an activity's last attempt: a retry shows as an ActivityTaskStarted with attempt above 1."""
    history = await client.get_workflow_handle(run_id).fetch_history()
    return any(
        event.HasField("activity_task_started_event_attributes")
        and event.activity_task_started_event_attributes.attempt > 1
        for event in history.events
    )


def report(
    lines: dict[str, list[tuple[int, float]]],
    retried: set[str],
    statuses: list[str],
    killed_pid: int,
    killed_at: float,
    elapsed: float,
    args: argparse.Namespace,
) -> None:
    by_worker = Counter(lines[f"{n}:second"][-1][0] for n in range(args.runs) if lines[f"{n}:second"])
    handed_over = [
        lines[f"{n}:second"][-1][1] - killed_at
        for n in range(args.runs)
        if lines[f"{n}:first"]
        and lines[f"{n}:first"][0][0] == killed_pid
        and lines[f"{n}:second"]
        and lines[f"{n}:second"][-1][0] != killed_pid
        and lines[f"{n}:second"][-1][1] > killed_at
    ]
    duplicates = {label: runs for label, runs in lines.items() if len(runs) > 1}
    # At least once: an attempt cut off by the kill, or one Temporal timed out (and retried), may have
    # done its work already. A duplicate with neither is a completed step run again.
    cut_off = {label for label, runs in duplicates.items() if runs[0][0] == killed_pid}
    timed_out = set(duplicates) & retried - cut_off
    again = set(duplicates) - cut_off - timed_out
    completed = statuses.count("completed")
    print(f"{args.runs} runs ({', '.join(KINDS)}), {args.workers} workers, {elapsed:.1f} s")
    print(f"completed {completed}, lost {args.runs - completed}")
    for pid, count in sorted(by_worker.items()):
        print(f"  worker {pid}{' (killed)' if pid == killed_pid else ''}: {count} runs finished")
    if handed_over:
        print(
            f"recovery: {len(handed_over)} runs moved off the killed worker; the first step done by another "
            f"worker {min(handed_over):.1f} s after the kill, the last {max(handed_over):.1f} s"
        )
    print(
        f"steps executed twice: {len(again)} completed steps re-executed (target 0); {len(cut_off)} cut off "
        f"mid-flight by the kill and {len(timed_out)} retried by Temporal (attempt 2 or more in the history), "
        "run again as activities are at least once"
    )
    for label in sorted(duplicates):
        runs_ = ", ".join(f"worker {pid} at kill{at - killed_at:+.1f}s" for pid, at in duplicates[label])
        print(f"  {label}: {runs_}")


if __name__ == "__main__":
    asyncio.run(main())
