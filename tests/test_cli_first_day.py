"""The command line as a new user meets it: live progress on waits, retried activities in `kiwi status`,
pending approvals across runs, messages that say what a run is, and the small things (--version, --json,
completion, doctor, colour only on a terminal, no tracebacks)."""

from __future__ import annotations

import asyncio
import json
import os
import pty
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from temporalio import activity

from activities.commands import CommandActivities
from kiwi.contracts import LocalToolRequest
from kiwi.upstream.pool import McpPool
from tests.helpers import approver, awaiting_step, directive_md, kiwi_cli, wait_for, write, write_directive
from workers.main import SANDBOX, WORKFLOWS, KiwiWorker, activities

RUN_ID = re.compile(r"run-[a-z_]+-[0-9a-f]{10}")


def connection(runs) -> list[str]:
    return ["--address", runs.client.service_client.config.target_host, "--task-queue", runs.task_queue]


async def _watching(runs, run_id: str, *more: str, env: dict[str, str] | None = None) -> Any:
    """`kiwi status RUN --watch` as a process of its own, its output piped."""
    return await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "kiwi", "status", run_id, "--watch", *more, *connection(runs)),
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        # Ctrl-C as a terminal sends it: a suite started in the background by a shell (`cmd &`) runs with SIGINT
        # ignored, which its children inherit, and Python then never raises KeyboardInterrupt (CI s34: the
        # watcher ran on).
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def approval_directive(project: Path) -> None:
    """A directive whose automatic step deletes a file: a call that waits for a human's approval."""
    write(project / ".ai" / "config" / "agent_harness.yaml", "approvals:\n  tools: [filesystem.delete]\n")
    approver("alice")
    write(project / "notes" / "old.txt", "old")
    write_directive(
        project / ".ai" / "directives" / "tidy.md",
        directive_md(
            '<step name="clean"><tool_call tool="filesystem.delete">'
            '<param name="path">notes/old.txt</param></tool_call></step>',
            name="tidy",
            permissions='<read resource="filesystem" path="**"/><write resource="filesystem" path="notes/**"/>',
        ),
    )


async def test_a_wait_on_an_approval_shows_progress_and_ctrl_c_stops_watching_not_the_run(runs, project):
    approval_directive(project)
    # `kiwi run --wait` stops as the run waits for the approval (s18: it waited out the approval's hour).
    code, out, err = await asyncio.wait_for(kiwi_cli("run", "tidy", "--wait", *connection(runs)), 120)
    assert code == 0 and "awaiting_approval" in out, out + err
    run_id = RUN_ID.search(out).group(0)
    # `kiwi status --watch` follows it on, with a progress line while nothing changes.
    proc = await _watching(runs, run_id, env={**os.environ, "KIWI_PROGRESS_SECONDS": "1", "NO_COLOR": "1"})
    seen = ""

    async def read_until(marker: str) -> None:
        nonlocal seen
        while marker not in seen:
            line = await asyncio.wait_for(proc.stdout.readline(), 60)
            assert line, f"kiwi run exited before printing {marker!r}:\n{seen}"
            seen += line.decode()

    await read_until("still awaiting_approval")  # nothing changed for a second: a progress line
    await read_until(f"kiwi approve {run_id} approval-1")  # what answers it
    assert "waiting for approval approval-1 of filesystem.delete notes/old.txt" in seen
    assert "until " in seen and "asked " in seen
    proc.send_signal(signal.SIGINT)
    rest, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 130
    assert f"stopped watching {run_id}; the run goes on" in err.decode() and "Traceback" not in err.decode()
    assert (await runs.status(run_id)).status == "awaiting_approval"  # the run did not stop

    # The pending approval, listed across runs, as text and JSON.
    code, out, _ = await kiwi_cli("approvals", *connection(runs))
    # Asked by the directive's step, not "by cli" (the client that started the run: review s36).
    assert code == 0 and f"{run_id} approval-1: filesystem.delete notes/old.txt (step clean)" in out, out
    assert f"kiwi approve {run_id} approval-1" in out
    code, out, _ = await kiwi_cli("status", run_id, *connection(runs))
    assert "  approval-1 filesystem.delete notes/old.txt step clean: pending (until " in out, out
    code, out, _ = await kiwi_cli("approvals", "--json", *connection(runs))
    (pending,) = json.loads(out)
    assert pending["run_id"] == run_id and pending["request_id"] == "approval-1" and pending["args_hash"]
    assert pending["project"] == str(project)
    # Past its limit of runs, it says others are not listed (review s38: cut at 200 runs without a word).
    code, out, err = await asyncio.wait_for(kiwi_cli("run", "tidy", "--wait", *connection(runs)), 120)
    second = RUN_ID.search(out).group(0)
    code, out, _ = await kiwi_cli("approvals", "--limit", "1", *connection(runs))
    assert code == 0 and out.count(" approval-1: ") == 1, out
    assert "runs past the first 1 with a pending approval are not listed: `kiwi approvals --limit N`" in out
    code, out, _ = await kiwi_cli("approvals", *connection(runs))
    assert {run_id, second} <= set(
        re.findall(r"^(run-\S+) approval-1:", out, re.M)
    ) and "not listed" not in out
    await runs.cancel(second)

    # `kiwi status --watch --json` (trial F27: it printed nothing while the run waited): a JSON line per
    # change, the last one the run's end.
    watcher = await _watching(runs, run_id, "--json")
    first = json.loads(await asyncio.wait_for(watcher.stdout.readline(), 60))
    assert first["run_id"] == run_id and first["status"] == "awaiting_approval", first
    # (The bare number names it too: README trial s38 typed `kiwi approve RUN 1` and was told no such request.)
    code, out, err = await kiwi_cli("approve", run_id, "1", "--by", "alice", "--json", *connection(runs))
    assert code == 0, err
    decided = json.loads(out)
    assert decided["approved"] is True and decided["request_id"] == "approval-1"
    await wait_for(lambda: _status(runs, run_id, "completed"), what="the approved run to finish")
    rest, err = await asyncio.wait_for(watcher.communicate(), 60)
    assert watcher.returncode == 0, err.decode()
    lines = [json.loads(line) for line in rest.decode().splitlines()]
    assert lines and lines[-1]["status"] == "completed" and "activities" in lines[-1], lines
    assert all(line["status"] != "completed" for line in lines[:-1]), lines
    assert not (project / "notes" / "old.txt").exists()
    code, out, _ = await kiwi_cli("approvals", *connection(runs))
    assert code == 0 and f"no pending approvals in {project} on task queue '{runs.task_queue}'" in out, out
    assert "`kiwi approvals --task-queue NAME`" in out


async def test_status_watch_exits_1_for_a_run_that_ends_other_than_completed(runs, project):
    """README trial s36: `kiwi status --watch` exited 0 for a failed and a timed-out run, while `kiwi run --wait`
    exits 1; a script that waits on it took them for done."""
    approval_directive(project)
    run_id = await runs.start("tidy", {})
    await wait_for(lambda: _status(runs, run_id, "awaiting_approval"), what="the call to wait for approval")
    watcher = await _watching(runs, run_id)
    await asyncio.wait_for(watcher.stdout.readline(), 60)  # (watching)
    await runs.cancel(run_id, "not today")
    out, err = await asyncio.wait_for(watcher.communicate(), 60)
    assert watcher.returncode == 1 and "cancelled" in out.decode(), (out, err)


async def _status(runs, run_id, wanted):
    return (await runs.status(run_id)).status == wanted


async def test_kiwi_status_shows_an_activity_retried_after_a_failure(temporal_env, project):
    """A stand-in for the local-tool activity fails its first attempt (a worker lost mid-call); the
    second attempt runs until released. `kiwi status` shows attempt 2 and why the first one failed."""
    from kiwi.items.store import ItemStore
    from kiwi.runs import RunClient

    release = asyncio.Event()

    @activity.defn(name="run_local_tool")
    async def run_local_tool(req: LocalToolRequest) -> dict:
        if activity.info().attempt == 1:
            raise RuntimeError("the worker running word_count went away")
        while not release.is_set():
            activity.heartbeat()
            await asyncio.sleep(0.2)
        return {"words": 6, "lines": 1}

    pool = McpPool()
    kept = [a for a in activities(pool) if a != CommandActivities.run_local_tool]
    kept = [a for a in kept if getattr(a, "__name__", "") != "run_local_tool"]
    runs = RunClient(
        temporal_env.client, ItemStore(project), task_queue="kiwi-test-retry-" + os.urandom(4).hex()
    )
    worker = KiwiWorker(
        temporal_env.client,
        mcp_pool=pool,
        task_queue=runs.task_queue,
        workflows=WORKFLOWS,
        activities=[*kept, run_local_tool],
        workflow_runner=SANDBOX,
    )
    async with worker:
        # `kiwi run --wait` follows the run through the long step, printing its activity's attempts.
        follow = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "kiwi",
            "run",
            "hello_kiwi",
            "--input",
            "name=Ada",
            "--wait",
            *connection(runs),
            env={**os.environ, "KIWI_PROGRESS_SECONDS": "1", "NO_COLOR": "1"},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        seen = ""
        while "retried: attempt 2" not in seen:
            line = await asyncio.wait_for(follow.stdout.readline(), 60)
            assert line, f"kiwi run exited early:\n{seen}"
            seen += line.decode()
        run_id = RUN_ID.search(seen).group(0)
        assert re.search(r"still running at step count_words \(for \d+s, since", seen)
        code, out, err = await kiwi_cli("status", run_id, *connection(runs))
        assert code == 0, err
        assert re.search(r"activity run_local_tool (scheduled|started), retried: attempt 2", out)
        assert "last failure: the worker running word_count went away" in out
        code, out, _ = await kiwi_cli("status", run_id, "--json", *connection(runs))
        (active,) = json.loads(out)["activities"]
        assert active["attempt"] == 2 and active["activity"] == "run_local_tool"
        release.set()
        rest, _ = await asyncio.wait_for(follow.communicate(), 60)
        assert follow.returncode == 0 and "awaiting_agent" in rest.decode()


async def test_resume_on_a_finished_run_and_audit_on_a_new_run_say_what_the_run_is(runs, project):
    run_id = await runs.start("hello_kiwi", {"name": "Ada"})
    await awaiting_step(runs, run_id, "confirm")
    approver("ops")
    code, _, err = await kiwi_cli("resume", run_id, "--by", "ops", *connection(runs))
    assert code == 1 and f"run {run_id} is awaiting_agent, not stopped" in err
    await runs.complete_step(run_id, "confirm", {"confirmed": True})
    await runs.handle(run_id).result()
    code, _, err = await kiwi_cli("resume", run_id, "--by", "ops", *connection(runs))
    assert code == 1 and "no run" not in err
    assert f"run {run_id} has finished (completed); there is nothing to resume" in err
    code, _, err = await kiwi_cli("cancel", run_id, *connection(runs))
    assert code == 1 and f"run {run_id} has finished (completed)" in err

    # A run Temporal knows whose trail is not written yet is no typo. (Its records are removed here
    # to stand for the moment before the first flush.)
    other = await runs.start("hello_kiwi", {"name": "Bo"})
    await awaiting_step(runs, other, "confirm")
    for path in (project / ".ai" / "logs" / "audit").rglob(f"{other}.jsonl"):
        path.unlink()
    code, _, err = await kiwi_cli("audit", other, *connection(runs))
    assert code == 1 and f"run {other} is awaiting_agent and has written no audit records yet" in err
    assert "typo" not in err and "run ids look like" not in err
    code, _, err = await kiwi_cli("audit", "run-nothing-0000000000", *connection(runs))
    assert code == 1 and "run ids look like" in err


async def test_runs_has_a_header_and_readable_times_and_status_shows_outputs_and_the_ui(runs, project):
    run_id = await runs.start("hello_kiwi", {"name": "Ada"})
    await awaiting_step(runs, run_id, "confirm")

    async def listed():
        code, out, _ = await kiwi_cli("runs", *connection(runs))
        return out if run_id in out else None

    out = await wait_for(listed, what="the run in `kiwi runs`")
    header, row = out.splitlines()[:2]
    assert header.split() == ["RUN", "STATUS", "STEP", "STARTED"]
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \(\d+s ago\)", row)
    code, out, _ = await kiwi_cli(
        "status", run_id, *connection(runs), env={"KIWI_TEMPORAL_UI": "http://ui.example:8080"}
    )
    assert 'result = {"words": 6, "lines": 1}' in out  # count_words' output
    assert f"Temporal UI: http://ui.example:8080/namespaces/default/workflows/{run_id}" in out
    assert f"kiwi complete-step {run_id} confirm" in out


def test_version_completion_and_json_everywhere():
    out = subprocess.run([sys.executable, "-m", "kiwi", "--version"], capture_output=True, text=True)
    assert out.returncode == 0 and re.fullmatch(r"kiwi \d+\.\d+\.\d+\n", out.stdout)
    from kiwi.cli import build_parser
    from kiwi.cli.doctor import _words

    _, commands, actions = _words(build_parser())
    assert {"yank", "versions"} <= set(actions["registry"]) and "--json" in commands["registry versions"]
    for name in ("run", "runs", "status", "call", "complete-step", "approve", "reject", "decide", "resume",
                 "cancel", "audit", "approvals", "doctor", "validate", "search", "show", "init", "sign"):  # fmt: skip
        assert "--json" in commands[name], name
    script = subprocess.run(
        [sys.executable, "-m", "kiwi", "completion", "bash"], capture_output=True, text=True
    ).stdout
    # Complete `kiwi sta` and `kiwi status --wa` in a real bash with the script loaded.
    probe = (
        script
        + '\nCOMP_WORDS=(kiwi sta); COMP_CWORD=1; _kiwi; echo "${COMPREPLY[@]}"'
        + '\nCOMP_WORDS=(kiwi status --wa); COMP_CWORD=2; _kiwi; echo "${COMPREPLY[@]}"'
        # Trial F17: the actions of a command that has them, and an action's own options.
        + '\nCOMP_WORDS=(kiwi registry ve); COMP_CWORD=2; _kiwi; echo "${COMPREPLY[@]}"'
        + '\nCOMP_WORDS=(kiwi registry versions --ty); COMP_CWORD=3; _kiwi; echo "${COMPREPLY[@]}"'
        + '\nCOMP_WORDS=(kiwi payloads --he); COMP_CWORD=2; _kiwi; echo "${COMPREPLY[@]}"'
    )
    lines = subprocess.run(["bash", "-c", probe], capture_output=True, text=True).stdout.splitlines()
    assert lines == ["status", "--watch", "versions", "--type", "--help"]
    zsh = subprocess.run([sys.executable, "-m", "kiwi", "completion", "zsh"], capture_output=True, text=True)
    assert "bashcompinit" in zsh.stdout and "complete -o filenames -F _kiwi kiwi" in zsh.stdout


async def test_doctor_names_each_problem_with_its_fix(runs, project):
    code, out, err = await kiwi_cli("doctor", "--no-mcp", "--json", *connection(runs))
    report = json.loads(out)
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["temporal"]["ok"] and checks["search attributes"]["ok"] and checks["python"]["ok"]
    assert checks["agent_harness.yaml"]["ok"] and checks["project"]["ok"]
    # Which files were read, or that there is none: never "valid" for a file that is not there.
    harness = project / ".ai" / "config" / "agent_harness.yaml"
    assert checks["agent_harness.yaml"]["detail"] == f"valid: {harness}"
    assert not (project / ".ai" / "config" / "mcp_registry.yaml").exists()
    assert checks["mcp_registry.yaml"] == {**checks["mcp_registry.yaml"], "ok": True,
                                           "detail": "no file: no external MCP servers"}  # fmt: skip
    assert checks["payload store"]["ok"] and checks["payload store"]["detail"].startswith(
        os.path.join(os.environ["KIWI_HOME"], "payloads")
    )
    # A store this user cannot write to is a failure with its fix.
    blocked = project / "not-a-folder"
    blocked.write_text("a file where the store should be")
    code, out, _ = await kiwi_cli(
        "doctor",
        "--no-mcp",
        "--json",
        *connection(runs),
        env={"KIWI_PAYLOAD_STORE": str(blocked / "payloads")},
    )
    store = {c["name"]: c for c in json.loads(out)["checks"]}["payload store"]
    assert code == 1 and not store["ok"] and not store["warning"] and "KIWI_PAYLOAD_STORE" in store["hint"]
    # A store not made yet is looked at, not made (README trial s39: doctor made the folder it checked).
    later = project / "later" / "store"
    code, out, _ = await kiwi_cli(
        "doctor", "--no-mcp", "--json", *connection(runs), env={"KIWI_PAYLOAD_STORE": str(later)}
    )
    store = {c["name"]: c for c in json.loads(out)["checks"]}["payload store"]
    assert store["ok"] and "not made yet" in store["detail"] and not (project / "later").exists(), store
    # A store every user of the machine may write to: they could remove or replace what runs stored there.
    open_store = project / "open-store"
    open_store.mkdir()
    open_store.chmod(0o777)
    code, out, _ = await kiwi_cli(
        "doctor", "--no-mcp", "--json", *connection(runs), env={"KIWI_PAYLOAD_STORE": str(open_store)}
    )
    store = {c["name"]: c for c in json.loads(out)["checks"]}["payload store"]
    assert not store["ok"] and store["warning"] and "mode 777" in store["detail"]
    assert f"chmod 700 {open_store}" in store["hint"]
    # Its last line counts the warnings (README trial s38: "all good" under three warnings).
    report = json.loads(out)
    failed = [c for c in report["checks"] if not c["ok"] and not c["warning"]]
    warned = [c for c in report["checks"] if not c["ok"] and c["warning"]]
    code, text, _ = await kiwi_cli(
        "doctor", "--no-mcp", *connection(runs), env={"KIWI_PAYLOAD_STORE": str(open_store)}
    )
    assert warned and "all good" not in text
    assert text.rstrip("\n").splitlines()[-1] == (
        f"{len(failed)} problem(s) above, and {len(warned)} warning(s)"
        if failed
        else f"no problem; {len(warned)} warning(s) above, each only for some uses"
    ), text
    # Whether docker tools can run here, and what to install when not.
    code, out, _ = await kiwi_cli(
        "doctor",
        "--no-mcp",
        "--json",
        *connection(runs),
        env={"KIWI_CONTAINER_ENGINE": "kiwi-no-such-engine"},
    )
    engine = {c["name"]: c for c in json.loads(out)["checks"]}["container engine"]
    assert not engine["ok"] and engine["warning"] and "install podman" in engine["hint"]
    # Whether the human's git obeys a folder holding git's layout, whatever its name (README: Repositories by
    # their layout): a warning with its fix, ok once set.
    for setting, ok in (("", False), ("[safe]\n\tbareRepository = explicit\n", True)):
        (project.parent / "gitconfig").write_text(setting)
        code, out, _ = await kiwi_cli(
            "doctor",
            "--no-mcp",
            "--json",
            *connection(runs),
            env={"GIT_CONFIG_GLOBAL": str(project.parent / "gitconfig"), "GIT_CONFIG_SYSTEM": os.devnull},
        )
        git = {c["name"]: c for c in json.loads(out)["checks"]}["git"]
        assert git["ok"] is ok and git["warning"] is not ok, git
        assert ok or "git config --global safe.bareRepository explicit" in git["hint"]
    write(project / ".ai" / "config" / "agent_harness.yaml", "rate_limits:\n  filesystem.write: lots\n")
    code, out, _ = await kiwi_cli("doctor", "--no-mcp", "--address", "127.0.0.1:1", cwd=project)
    assert code == 1
    assert (
        "FAIL temporal: no Temporal server answers at 127.0.0.1:1" in out
        and "fix: start one with `kiwi dev`" in out
    )
    assert "FAIL agent_harness.yaml:" in out and "filesystem.write" in out


def test_colour_only_on_a_terminal_and_never_with_no_color(project):
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}

    def doctor(extra: dict[str, str], terminal: bool) -> str:
        argv = [sys.executable, "-m", "kiwi", "doctor", "--no-mcp", "--address", "127.0.0.1:1"]
        if not terminal:
            return subprocess.run(argv, capture_output=True, text=True, env={**env, **extra}).stdout
        leader, follower = pty.openpty()
        proc = subprocess.Popen(argv, stdout=follower, stderr=subprocess.DEVNULL, env={**env, **extra})
        os.close(follower)
        seen = b""
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # the terminal closed with the process
                break
            if not chunk:
                break
            seen += chunk
        proc.wait()
        os.close(leader)
        return seen.decode()

    assert "\033[" in doctor({}, terminal=True)
    assert "\033[" not in doctor({"NO_COLOR": "1"}, terminal=True)
    assert "\033[" not in doctor({}, terminal=False)


def test_no_traceback_when_the_reader_goes_away_or_a_file_is_missing(project):
    read, write_end = os.pipe()
    os.close(read)  # the reader is gone before anything is written
    proc = subprocess.run(
        [sys.executable, "-m", "kiwi", "completion", "bash"],
        stdout=write_end,
        stderr=subprocess.PIPE,
        text=True,
    )
    os.close(write_end)
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr
    proc = subprocess.run(
        [sys.executable, "-m", "kiwi", "sign", "missing.md"], capture_output=True, text=True, cwd=project
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr and "missing.md" in proc.stderr


async def test_an_agent_reading_a_missing_file_puts_no_traceback_in_the_workers_console(
    temporal_env, project
):
    from kiwi.items.store import ItemStore
    from kiwi.runs import RunClient

    runs = RunClient(
        temporal_env.client, ItemStore(project), task_queue="kiwi-test-quiet-" + os.urandom(4).hex()
    )
    worker = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "kiwi",
        "worker",
        *connection(runs),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    try:
        await asyncio.wait_for(worker.stdout.readline(), 60)  # "kiwi worker: task queue ..."
        run_id = await runs.start("hello_kiwi", {"name": "Ada"})
        await awaiting_step(runs, run_id, "confirm")
        result = await runs.call_tool(run_id, "filesystem.read", {"path": "notes/missing.md"})
        assert result.status == "error" and result.error_type == "FileNotFound"
        denied = await runs.call_tool(run_id, "filesystem.read", {"path": "../outside.md"})
        assert denied.status == "denied"
    finally:
        os.killpg(worker.pid, signal.SIGINT)
        _, err = await asyncio.wait_for(worker.communicate(), 60)
    assert "Traceback" not in err.decode() and "Completing activity as failed" not in err.decode()


def test_scripts_dev_after_scripts_test_installs_nothing_and_prints_the_kiwi_command(tmp_path):
    """scripts/test installed Kiwi with its test extras; scripts/dev needs fewer, so it installs nothing,
    says where `kiwi` is and how to put it on the PATH, and runs `kiwi dev` in the folder it came from."""
    repo = Path(__file__).resolve().parents[1]
    proc = subprocess.run(
        ["bash", str(repo / "scripts" / "dev"), "--help"], cwd=tmp_path, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert "installing" not in proc.stderr
    assert f"the command is {repo}/.venv/bin/kiwi" in proc.stderr
    assert f'export PATH="{repo}/.venv/bin:$PATH"' in proc.stderr
    assert "usage: kiwi dev" in proc.stdout and "--project PATH" in proc.stdout


async def test_kiwi_dev_says_when_its_mcp_port_is_taken(temporal_env, project, tmp_path):
    from kiwi.devserver import free_port

    blocker = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    taken = blocker.sockets[0].getsockname()[1]
    host, port = temporal_env.client.service_client.config.target_host.rsplit(":", 1)
    settings = tmp_path / "dev.yml"
    settings.write_text(f"temporal:\n  port: {port}\n  ui_port: {free_port()}\nmcp:\n  port: {taken}\n")
    try:
        code, _, err = await kiwi_cli("dev", cwd=project, env={"KIWI_DEV_CONFIG": str(settings)})
    finally:
        blocker.close()
    assert code == 1 and f"the MCP port 127.0.0.1:{taken} is in use" in err and "--no-mcp" in err
    assert "Traceback" not in err


async def test_doctor_starts_each_configured_mcp_server(project):
    # A server that talks on stderr and works, and one that says why it stops (trial F36: their stderr was
    # mixed into doctor's report; now only a failing server's is shown, with its check).
    write(
        project / "chatty.py",
        "import os, sys\nsys.stderr.write('chatty: starting up, all fine\\n')\nsys.stderr.flush()\n"
        "os.execv(sys.executable, [sys.executable, '-m', 'mcp_server_time', '--local-timezone', 'UTC'])\n",
    )
    write(
        project / "dies.py",
        "import sys\nsys.stderr.write('fatal: no config at /etc/dies.conf\\n')\nsys.exit(3)\n",
    )
    write(
        project / ".ai" / "config" / "mcp_registry.yaml",
        f"""\
mcps:
  clock:
    command: {sys.executable}
    args: ["-m", "mcp_server_time", "--local-timezone", "UTC"]
  broken:
    command: /nonexistent/mcp-server
  chatty:
    command: {sys.executable}
    args: ["{project / "chatty.py"}"]
  dies:
    command: {sys.executable}
    args: ["{project / "dies.py"}"]
""",
    )
    code, out, err = await kiwi_cli("doctor", "--json", "--address", "127.0.0.1:1", cwd=project)
    checks = {c["name"]: c for c in json.loads(out)["checks"]}
    assert checks["mcp clock"]["ok"] and "tools" in checks["mcp clock"]["detail"]
    assert not checks["mcp broken"]["ok"] and "mcp_registry.yaml" in checks["mcp broken"]["hint"]
    assert checks["mcp chatty"]["ok"], checks["mcp chatty"]
    assert "chatty: starting up" not in out + err
    assert not checks["mcp dies"]["ok"]
    assert "its stderr ended: fatal: no config at /etc/dies.conf" in checks["mcp dies"]["detail"]
    assert "fatal: no config" not in err
    assert code == 1


async def test_status_without_any_worker_says_so_instead_of_hanging(temporal_env, project):
    from kiwi.items.store import ItemStore
    from kiwi.runs import RunClient

    runs = RunClient(
        temporal_env.client, ItemStore(project), task_queue="kiwi-test-noworker-" + os.urandom(4).hex()
    )
    run_id = await runs.start("hello_kiwi", {"name": "Ada"})
    # (No --task-queue: the hint names the run's own queue, not this command's default; s19 trial.)
    address = ["--address", runs.client.service_client.config.target_host]
    code, _, err = await kiwi_cli("status", run_id, *address, env={"KIWI_STATUS_SECONDS": "1"})
    assert code == 1 and f"no worker answered {run_id}'s status within 1s" in err
    assert "(the run waits on without one)" in err
    assert f"`kiwi worker` on task queue '{runs.task_queue}'" in err and "Traceback" not in err
    await runs.handle(run_id).terminate("test over")
    # An ended run waits for nothing: it says so (README trial s39: "the run waits on" of a completed run, its
    # worker stopped since).
    from workers.main import build_worker

    async with build_worker(temporal_env.client, runs.task_queue):
        done = await runs.start("hello_kiwi", {"name": "Ada"})
        await awaiting_step(runs, done, "confirm")
        await runs.complete_step(done, "confirm", {"confirmed": True})
        await runs.handle(done).result()
    code, _, err = await kiwi_cli("status", done, *address, env={"KIWI_STATUS_SECONDS": "1"})
    assert (
        code == 1 and "the run has ended (completed), and a worker reads its details from its history" in err
    )
    assert "waits on" not in err, err


def test_bootstrap_installs_only_when_the_caller_needs_more(tmp_path):
    """scripts/bootstrap.sh's stamp: a dev install after a test install installs nothing; a test install
    after a dev install adds the test extras; a changed pyproject reinstalls what was there."""
    repo = Path(__file__).resolve().parents[1]
    fake = tmp_path / "checkout"
    (fake / "scripts").mkdir(parents=True)
    (fake / "scripts" / "bootstrap.sh").write_text((repo / "scripts" / "bootstrap.sh").read_text())
    (fake / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    (fake / "constraints.txt").write_text("")
    python = fake / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    # A stand-in for the venv's python that records each pip command instead of installing.
    python.write_text(f'#!/bin/sh\necho "$*" >> {tmp_path}/pip.log\n')
    python.chmod(0o755)

    def bootstrap(extras: str) -> list[str]:
        log = tmp_path / "pip.log"
        log.unlink(missing_ok=True)
        subprocess.run(
            ["bash", "-c", f'KIWI_EXTRAS="{extras}" source scripts/bootstrap.sh'], cwd=fake, check=True
        )
        return [line for line in log.read_text().splitlines() if " -e " in line] if log.exists() else []

    assert bootstrap("") == ["-m pip install --quiet --disable-pip-version-check -c constraints.txt -e ."]
    assert bootstrap("") == []
    assert [line.split()[-1] for line in bootstrap("test")] == [".[test]"]
    assert bootstrap("") == []  # scripts/dev after scripts/test: the install has what dev needs
    assert bootstrap("test") == []
    (fake / "pyproject.toml").write_text("[project]\nname = 'x'\nversion = '2'\n")
    assert [line.split()[-1] for line in bootstrap("")] == [".[test]"]  # keeps the extras it had


async def test_kiwi_run_json_with_no_worker_names_the_run_it_started(runs, project):
    """Found by the s18 README trial: `kiwi run --json` with no worker answered an error without the run's
    id, though the run had started (only the message's text named it)."""
    address = runs.client.service_client.config.target_host
    code, out, err = await kiwi_cli(
        "run",
        "hello_kiwi",
        "--input",
        "name=Ada",
        "--json",
        "--address",
        address,
        "--task-queue",
        "kiwi-nobody",
        env={"KIWI_STATUS_SECONDS": "1"},
    )
    assert code == 1, out + err
    shown = json.loads(out)
    assert shown["run_id"].startswith("run-hello_kiwi-") and shown["run_id"] in shown["message"], shown
    # Said as soon as no worker took the run's first task (it also waited out the status query's own
    # KIWI_STATUS_SECONDS after that: 20 s by default before a new user without `kiwi dev` heard anything).
    assert f"no worker took {shown['run_id']}'s first task within 1s" in shown["message"], shown
    assert "kiwi-nobody" in shown["hint"], shown
    await runs.client.get_workflow_handle(shown["run_id"]).terminate("test over")


async def test_a_payload_store_that_cannot_be_written_stops_worker_and_front_ends_at_start(project, tmp_path):
    """Trial F35: `kiwi worker` and `kiwi mcp` started with a store they could not write, and the first
    large call failed long after. Each refuses at start now (a store under a file: not even root writes there),
    before it waits for Temporal."""
    (tmp_path / "a-file").write_text("")
    env = {"KIWI_PAYLOAD_STORE": str(tmp_path / "a-file" / "store")}
    for argv in (("worker", "--address", "127.0.0.1:1"), ("mcp", "--http", "--port", "1"), ("mcp",)):
        code, out, err = await asyncio.wait_for(kiwi_cli(*argv, cwd=project, env=env), 60)
        assert code == 1, (argv, out, err)
        assert f"the payload store {tmp_path / 'a-file' / 'store'} cannot be written" in err, (argv, err)
        assert "Traceback" not in err and "does not answer" not in err, (argv, err)
    code, out, err = await kiwi_cli("doctor", "--no-mcp", "--json", cwd=project, env=env)
    checks = {c["name"]: c for c in json.loads(out)["checks"]}
    assert not checks["payload store"]["ok"] and "cannot be written" in checks["payload store"]["detail"]


async def test_runs_of_a_misspelt_directive_name_the_one_meant(runs, project):
    """README trial s36: `kiwi runs --directive helo_kiwi` said "no runs in PROJECT", nothing of the filter nor of
    the name meant."""
    from tests.helpers import kiwi_cli

    await runs.start("hello_kiwi", {"name": "Ada"})
    code, out, _ = await kiwi_cli("runs", "--directive", "helo_kiwi", *connection(runs), cwd=project)
    assert code == 0 and out.startswith(f"no runs of directive 'helo_kiwi' in {project}"), out
    assert "; no directive is called 'helo_kiwi': did you mean hello_kiwi?" in out, out
    code, out, _ = await kiwi_cli("runs", "--directive", "hello_kiwi", *connection(runs), cwd=project)
    assert code == 0 and "run-hello_kiwi-" in out, out


async def test_an_input_given_twice_and_runs_outside_a_project_say_so(runs, project, tmp_path_factory):
    """README trial s38: `--input marker=X --input marker=Y` ran with Y, silently; `kiwi runs` from a folder that
    is no project printed "no runs in FOLDER", as for an empty project."""
    code, _, err = await kiwi_cli(
        "run", "hello_kiwi", "--input", "name=A", "--input", "name=B", *connection(runs), cwd=project
    )
    assert code == 1 and "input 'name' is given twice ('A' and 'B')" in err, err
    assert not await runs.list_runs(), "no run started"
    elsewhere = tmp_path_factory.mktemp("not-a-project")
    code, out, _ = await kiwi_cli("runs", *connection(runs), cwd=elsewhere)
    assert code == 0 and f"{elsewhere} is no Kiwi project (no .ai/ at or above it)" in out, out
    code, out, _ = await kiwi_cli("approvals", *connection(runs), cwd=elsewhere)  # (README trial s39)
    assert code == 0 and f"{elsewhere} is no Kiwi project (no .ai/ at or above it)" in out, out
    code, out, _ = await kiwi_cli("runs", *connection(runs), cwd=project)
    assert code == 0 and "is no Kiwi project" not in out, out


def test_kiwi_init_keeps_what_kiwi_writes_out_of_version_control(tmp_path, monkeypatch):
    """README trial s38: after `kiwi init` in a repository, `git status` listed the audit trail and the search
    index (.ai/logs, .ai/.cache) as files to commit. The scaffold's .ai/.gitignore keeps them out."""
    from kiwi.cli import main as kiwi_main

    monkeypatch.chdir(tmp_path)
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    assert kiwi_main(["init"]) == 0
    write(tmp_path / ".ai" / "logs" / "audit" / "2026-11-28" / "run.jsonl", "{}\n")
    write(tmp_path / ".ai" / ".cache" / "index.sqlite", "x")
    listed = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=all"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\n")
    assert "?? .ai/directives/hello_kiwi.md" in listed, listed  # the project's own files are still seen
    assert not [line for line in listed if "/logs/" in line or "/.cache/" in line], listed


async def test_a_misspelt_run_is_named_before_an_approver_key_is_chosen(runs, project):
    """README trial s39: with two approver keys, `kiwi approve run-nope 1` and `kiwi resume nope` said to choose a
    key with --as; with --as, that there is no such run. The run is looked up first."""
    approver("alice")
    approver("bob")
    for argv in (
        ["approve", "run-nope", "1"],
        ["resume", "run-nope"],
        ["decide", "run-nope", "decision-1", "a"],
    ):
        code, _, err = await kiwi_cli(*argv, *connection(runs))
        assert code == 1 and "no run 'run-nope'" in err and "--as" not in err, (argv, err)


async def test_search_outside_a_project_says_it_is_none(tmp_path):
    """README trial s39: `kiwi search hello` outside a project said only `no items match 'hello'`, where `kiwi runs`
    says the folder is no project."""
    code, out, _ = await kiwi_cli("search", "hello", "--source", "project", cwd=tmp_path)
    assert code == 0 and f"no items match 'hello' ({tmp_path} is no Kiwi project" in out, out
