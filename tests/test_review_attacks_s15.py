"""Review s15: a hostile agent stalls a worker that runs workflow tasks on its event loop (#20).

Since workers/main.py runs workflow tasks inline (the SDK's debug_mode), a workflow task that computes for
long holds the whole worker: every other run's tasks, every activity, heartbeats and polling. What the
workflow computes from an agent's call is the call's admission (kiwi/admission.py: argument checks, grants,
rate and loop checks), so an argument that makes admission slow is an attack on every run of the worker.

Measured on the 2-core review host (times of the helper alone, worst input within the 1.5 MB argument limit):

- a path an agent names against a grant with two ``**`` (``src/**/tests/**/*.py``): the glob's regex tried
  every pair of places for its two ``**`` (kiwi/globs.py): 246 ms for a 1 KB path against
  ``**/a/**/a/**/x``, 17 s for 4 KB, hours for 1 MB; a name against ``*a*a*a*b``: 2.8 s for 4 KB. Fixed:
  each run of segments another ``**`` follows, and each middle part of a name, is matched where it first
  occurs, atomically: 5-20 ms for 1.5 MB paths, the same answers (a differential check against the old
  regexes, 1.2 million pattern-path pairs).
- a ``shell.run`` command of 1.5 MB (``ls a/b a/b ...``): 3.05 s of shlex and path checks (``argv``: 1.4 s),
  then the run_command activity re-checked each path on disk on the same loop (270 ms per 16,000 paths):
  against the real worker, no answer in 12 s. Fixed: a command is at most ``MAX_COMMAND_BYTES`` (64 KiB:
  90 ms), refused as InputInvalid before any word is checked; protected_root folds a path's segments only
  when its text holds ".git".
- first_match cached its candidate patterns by the path's first segment: 200 paths of 1 MB held 385 MB of
  the worker (8192 entries: 8 GB). Fixed: keyed by a first segment the patterns name, else "".
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import re
import signal
import time
import uuid

import pytest
from temporalio.client import WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError

from kiwi.contracts import CallToolRequest
from kiwi.globs import _candidates, first_match, glob_match, glob_segments
from kiwi.items.store import ItemStore
from kiwi.policy import SHOWN_PATH_CHARS, PermissionSet
from kiwi.runs import RunClient
from kiwi.toolargs import MAX_COMMAND_BYTES, check_arguments, oversized_command
from tests.helpers import awaiting_step, directive_md, kiwi_worker, write, write_directive
from workflows.directive_run.workflow import DirectiveRun

BODY = '<step name="work"><action>Do the work.</action></step>'


async def _stall_during(runs: RunClient, probe_run: str, attack) -> tuple[object, float, int]:
    """``attack()``'s answer, and the longest a call of another run of the same worker waited meanwhile
    (each probe reads a path of its own, so loop detection never holds the probing run)."""
    done = asyncio.Event()
    waits: list[float] = []
    waiting_since = [0.0]  # when the probe in flight was sent

    async def probe() -> None:
        index = 0
        while not done.is_set() or index < 2:
            index += 1
            started = waiting_since[0] = time.monotonic()
            answer = await runs.call_tool(probe_run, "filesystem.read", {"path": f"notes/probe-{index}.md"})
            waits.append(time.monotonic() - started)
            assert answer.call_seq, answer  # (a real answer from the run)

    prober = asyncio.create_task(probe())
    attacking = asyncio.create_task(attack())
    answered, _ = await asyncio.wait({attacking}, timeout=12)
    done.set()
    if not answered:
        stuck = 0.0 if prober.done() else time.monotonic() - waiting_since[0]
        for task in (attacking, prober):
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        raise AssertionError(
            f"the attacked call had no answer after 12 s, and another run's call had waited {stuck:.1f} s "
            f"({len(waits)} answered before it)"
        )
    answer = attacking.result()
    await asyncio.wait_for(prober, 12)
    return answer, max(waits), len(waits)


async def _setup(temporal_env, project, permissions: str):
    write_directive(
        project / ".ai" / "directives" / "target.md",
        directive_md(BODY, name="target", permissions=permissions),
    )
    write(project / "notes" / "a.md", "a\n")
    address = temporal_env.client.service_client.config.target_host
    queue = f"kiwi-s15-{uuid.uuid4().hex[:8]}"
    runs = RunClient(temporal_env.client, ItemStore(project), task_queue=queue)
    worker = await kiwi_worker(address, queue)  # inline workflow tasks: no --threaded
    attacked = await runs.start("target", {})
    probing = await runs.start("target", {})
    await awaiting_step(runs, attacked, "work")
    await awaiting_step(runs, probing, "work")
    return runs, worker, attacked, probing


async def _stop(worker: asyncio.subprocess.Process) -> None:
    if worker.returncode is None:
        os.killpg(worker.pid, signal.SIGKILL)  # (a worker stuck in a regex does not answer SIGTERM)
        await worker.wait()


async def test_attack_a_long_path_against_a_grant_with_two_globstars_does_not_stall_the_worker(
    temporal_env, project
):
    """Attack: the run may read ``src/**/tests/**/*.py`` (a signed directive's ordinary grant). The agent
    reads ``src/tests/tests/.../tests/x`` (200 KB). The glob's regex tried every pair of places for the two
    ``**``: the worker's event loop, and so every run on the worker, stopped for minutes (hours at 1 MB).
    Safe: the read is refused as ungranted at once; another run's calls meanwhile answer as usual."""
    runs, worker, attacked, probing = await _setup(
        temporal_env,
        project,
        '<read resource="filesystem" path="src/**/tests/**/*.py"/>\n'
        '<read resource="filesystem" path="notes/**"/>',
    )
    try:
        path = "src/" + "tests/" * 33_000 + "x"
        answer, longest, probes = await _stall_during(
            runs, probing, lambda: runs.call_tool(attacked, "filesystem.read", {"path": path})
        )
        assert answer.status == "denied" and "read not allowed" in answer.reason, answer.reason[:200]
        assert longest < 1.0, f"another run's call waited {longest:.1f}s ({probes} calls)"
        # The grant still means what it says.
        write(project / "src" / "a" / "tests" / "b" / "t.py", "ok\n")
        granted = await runs.call_tool(attacked, "filesystem.read", {"path": "src/a/tests/b/t.py"})
        assert granted.status == "ok", granted
    finally:
        await _stop(worker)


async def test_attack_a_huge_shell_command_is_refused_before_its_words_are_checked(temporal_env, project):
    """Attack: the run may run ``ls`` (as kiwi init's base policy lets a session). The agent sends ``ls a/b a/b
    ...``, 1.5 MB: admission parsed and checked 375,000 paths, 3 s on the worker's loop, and the
    run_command activity as long again on the same loop: every run of the worker waited. Safe: a command
    over MAX_COMMAND_BYTES is InputInvalid, naming the limit and what to do, before any word is checked;
    another run's calls meanwhile answer as usual, and a command within the limit still runs."""
    runs, worker, attacked, probing = await _setup(
        temporal_env,
        project,
        '<read resource="filesystem" path="**"/>\n<execute resource="shell" commands="ls"/>',
    )
    try:
        command = "ls " + "a/b " * 370_000
        answer, longest, probes = await _stall_during(
            runs, probing, lambda: runs.call_tool(attacked, "shell.run", {"command": command})
        )
        assert answer.status == "error" and answer.error_type == "InputInvalid", answer.reason[:200]
        assert f"over the limit of {MAX_COMMAND_BYTES:,}" in answer.reason
        assert "fewer paths per command" in answer.hint
        assert longest < 1.0, f"another run's call waited {longest:.1f}s ({probes} calls)"
        # A caller that skips the client's check (the update sent as it is) meets the run's validator.
        request = CallToolRequest(tool="shell.run", arguments={"command": command}, client="raw")
        refused, longest, probes = await _stall_during(
            runs, probing, lambda: _update_failure(runs, attacked, request)
        )
        assert refused is not None and refused.type == "InputInvalid", refused
        assert f"over the limit of {MAX_COMMAND_BYTES:,}" in refused.message
        assert longest < 1.0, f"another run's call waited {longest:.1f}s ({probes} calls)"
        ran = await runs.call_tool(attacked, "shell.run", {"argv": ["ls", "notes"] + ["notes/a.md"] * 2000})
        assert ran.status == "ok", ran
    finally:
        await _stop(worker)


async def _update_failure(runs: RunClient, run_id: str, request: CallToolRequest) -> ApplicationError | None:
    """The failure of the call_tool update sent straight to the run (None when it was taken)."""
    try:
        await runs.handle(run_id).execute_update(DirectiveRun.call_tool, request)
    except WorkflowUpdateFailedError as exc:
        return exc.cause if isinstance(exc.cause, ApplicationError) else None
    return None


# ---------------------------------------------------------------- the helpers alone


def _plain_regex(pattern: str) -> re.Pattern[str]:
    """kiwi.globs.compile_glob before s15: each ``*`` as ``[^/]*`` and each ``**`` as ``(?:.*/)?``, the
    reference the linear regexes must agree with."""
    if pattern.strip() in (".", "./"):
        return re.compile(r"\.\Z")
    segments = glob_segments(pattern)  # (unchanged by s15)
    out = []
    for index, segment in enumerate(segments):
        last = index == len(segments) - 1
        if segment == "**":
            out.append("(?:/.*)?" if last and index else ("(?:.*/)?" if not last else ".*"))
            continue
        part = "".join("[^/]*" if c == "*" else "[^/]" if c == "?" else re.escape(c) for c in segment)
        out.append(part + ("" if last else "/"))
    return re.compile("".join(out).replace("/(?:/.*)?", "(?:/.*)?") + r"\Z", re.DOTALL)


def test_globs_answer_as_before_on_every_small_pattern_and_path():
    """The linear regexes decide exactly what the plain ones did (random patterns with ``*``, ``**``, ``?``
    against random paths; 1.2 million pairs agreed in the review, a sample here)."""
    rng = random.Random(15)
    pattern_segments = [
        "a",
        "b",
        "*",
        "**",
        "?",
        "a*",
        "*a",
        "*a*b",
        "a?",
        "?*",
        "*b*",
        "a*a*a",
        "*?*",
        "*.py",
    ]
    path_segments = ["a", "b", "ab", "ba", "aa", "x", "aab", "abab", "aaa", "a.py", "aba"]
    for _ in range(3000):
        pattern = "/".join(rng.choice(pattern_segments) for _ in range(rng.randint(1, 5)))
        for _ in range(10):
            path = "/".join(rng.choice(path_segments) for _ in range(rng.randint(1, 7)))
            assert glob_match(pattern, path) == bool(_plain_regex(pattern).match(path)), (pattern, path)


@pytest.mark.parametrize(
    ("pattern", "path"),
    [
        ("src/**/tests/**/*.py", "src/" + "tests/" * 250_000 + "x"),
        ("**/a/**/a/**/x", "a/" * 750_000 + "y"),
        ("**/*a*a*a*b", "a" * 1_500_000),
        ("**/*a*a*a*b", ("a" * 250 + "/") * 6000),
    ],
)
def test_a_path_of_1_5_mb_is_matched_in_linear_time(pattern, path):
    """Before s15 these took hours (the first) down to seconds for 4 KB (the last); now milliseconds. (The
    bound is far above that, for a loaded machine, and far below what backtracking takes at this length.)"""
    started = time.perf_counter()
    assert first_match([pattern, "notes/**"], path) is None
    assert time.perf_counter() - started < 2.0


def test_the_glob_cache_holds_no_agents_names():
    """Attack: paths whose first segment is 1 MB of text, each another: the cache of candidate patterns
    was keyed by that segment and kept 8192 of them (8 GB of the worker's memory). Safe: a first segment
    no pattern names is cached as one key."""
    patterns = ["**/.env", "src/**", "notes/**"]
    first_match(patterns, "x/y")
    before = _candidates.cache_info().currsize
    for index in range(20):
        assert first_match(patterns, f"{index}" + "a" * 1_000_000 + "/x") is None
    assert _candidates.cache_info().currsize == before


def test_a_command_is_checked_for_its_size_before_its_words():
    """A command at the limit is sent as before; one byte more is InputInvalid naming the limit, called
    directly or through kiwi-mcp.execute, without a word of it type-checked. Admission itself does not check the size (runs that took longer commands before
    the limit replay as they ran)."""
    assert oversized_command("shell.run", {"command": "x" * MAX_COMMAND_BYTES}) is None
    assert oversized_command("shell.run", {"argv": ["ls"] + ["a"] * (MAX_COMMAND_BYTES // 2 - 2)}) is None
    over = oversized_command("shell.run", {"command": "x" * (MAX_COMMAND_BYTES + 1)})
    assert over is not None and f"over the limit of {MAX_COMMAND_BYTES:,}" in over.reason
    nested = {
        "item_type": "tool",
        "item_id": "shell.run",
        "parameters": {"command": "x" * (MAX_COMMAND_BYTES + 1)},
    }
    assert "over the limit" in oversized_command("kiwi-mcp.execute", nested).reason
    assert "over the limit" in oversized_command("kiwi-mcp.run", nested).reason
    assert check_arguments("shell.run", {"command": "ls " * 30_000}) is None  # (admission as before)
    huge = oversized_command("shell.run", {"argv": ["ls"] + ["a/b"] * 250_000})
    assert huge is not None and "over the limit" in huge.reason
    lone = oversized_command("shell.run", {"command": "ls \ud800" * 20_000})  # (never raises)
    assert lone is not None and "over the limit" in lone.reason


def test_a_refusal_of_a_huge_path_spells_out_a_bounded_part_of_it():
    """Found by the s15 review: a denied path of 1.4 MB came back whole in the refusal's reason and in its
    hint (2.8 MB), into the run's history and its audit trail. Now each shows at most SHOWN_PATH_CHARS of it,
    its start and end around the count; a short path is shown whole as before."""
    path = "notes/" + "x" * 1_400_000 + "/end.md"
    perms = PermissionSet(fs_read=["docs/**"], deny_fs=["secret/**"])
    refused = perms.check_path("read", path)
    assert not refused.allowed
    assert len(refused.reason) + len(refused.hint) < 3 * SHOWN_PATH_CHARS
    assert (
        "notes/xxx" in refused.reason
        and "end.md" in refused.reason
        and "1,400,013 characters" in refused.reason
    )
    denied = perms.check_path("read", "secret/" + "y" * 5000)
    assert not denied.allowed and len(denied.reason) < 2 * SHOWN_PATH_CHARS and "secret/**" in denied.reason
    short = perms.check_path("read", "notes/a.md")
    assert short.reason == "read not allowed on 'notes/a.md'" and 'path="notes/**"' in short.hint
