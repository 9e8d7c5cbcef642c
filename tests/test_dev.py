"""`kiwi dev` as a user runs it: dev server + worker + MCP front end, a run end to end, clean Ctrl-C."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import sys
from pathlib import Path

import pytest
from temporalio.client import Client

from kiwi.converter import data_converter
from kiwi.devserver import DevServer, free_port, load_dev_config
from kiwi.errors import KiwiError
from kiwi.items.store import ItemStore
from kiwi.metrics import RUNS_STARTED
from kiwi.runs import RunClient
from kiwi.seal import seal_interceptors
from tests.helpers import OtlpReceiver, distinct_ports, wait_for


async def read_until(stream, marker: bytes, timeout: float = 90) -> bytes:
    seen = b""

    async def go():
        nonlocal seen
        while marker not in seen:
            line = await stream.readline()
            if not line:
                raise AssertionError(
                    f"kiwi dev exited before printing {marker!r}; output so far:\n{seen.decode()}"
                )
            seen += line
        return seen

    return await asyncio.wait_for(go(), timeout)


async def test_kiwi_dev_serves_runs_and_stops_cleanly(project, tmp_path, monkeypatch):
    port, ui, mcp = distinct_ports(3)
    # With --otel (and its endpoint): Temporal's and Kiwi's metrics reach the OTLP endpoint.
    otlp = OtlpReceiver().__enter__()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", otlp.url)
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "500")
    config = tmp_path / "dev.yml"
    config.write_text(
        f"temporal:\n  port: {port}\n  ui_port: {ui}\n  db_file: state/temporal.sqlite\nmcp:\n  port: {mcp}\n"
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "kiwi",
        "dev",
        "--config",
        str(config),
        "--otel",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        out = await read_until(proc.stdout, b"ready")
        assert f"Temporal UI at http://127.0.0.1:{ui}".encode() in out
        # Its ports are none the other commands would find from here: it says what they need.
        assert f"export TEMPORAL_ADDRESS=127.0.0.1:{port}`".encode() in out
        assert f"export KIWI_TEMPORAL_UI=http://127.0.0.1:{ui}`".encode() in out
        assert f"MCP front end at http://127.0.0.1:{mcp}/mcp".encode() in out
        assert b"is no Kiwi project" not in out  # (it serves one)
        assert b"kiwi dev: registry (PostgreSQL, Unix socket) in" in out
        assert f"OpenTelemetry traces and metrics to {otlp.url} (http/protobuf)".encode() in out
        assert (tmp_path / "state" / "temporal.sqlite").exists()
        client = await Client.connect(
            f"127.0.0.1:{port}", data_converter=data_converter, interceptors=seal_interceptors()
        )
        runs = RunClient(client, ItemStore(project))
        run_id = await runs.start("hello_kiwi", {"name": "Dev"})
        assert run_id.startswith("run-hello_kiwi-")
        assert await runs._check_search_attributes() is True

        async def waiting():
            return (await runs.status(run_id)).status == "awaiting_agent"

        await wait_for(waiting, timeout=60, what="the run to wait for the agent")

        async def listed_waiting():  # the visibility store catches up a moment after the run's own state
            listed = await runs.list_runs(status="awaiting_agent")
            return listed if [r["run_id"] for r in listed] == [run_id] else None

        listed = await wait_for(listed_waiting, timeout=60, what="the run listed as awaiting_agent")
        assert listed[0]["step"] == "confirm"

        async def kiwi_metrics():
            return RUNS_STARTED in otlp.metrics

        await wait_for(kiwi_metrics, timeout=30, what="kiwi dev --otel exporting metrics")

        # kiwi doctor knows the running kiwi dev's three ports for what they are.
        checks = await _doctor_checks(config, project)
        assert checks[f"port {port}"]["ok"] and "`kiwi dev`'s server" in checks[f"port {port}"]["detail"]
        assert (
            checks[f"port {ui}"]["ok"]
            and "the Temporal UI (`kiwi dev` running)" in checks[f"port {ui}"]["detail"]
        )
        assert checks[f"port {mcp}"]["ok"], checks[f"port {mcp}"]
        assert "a Kiwi MCP front end (`kiwi dev` running)" in checks[f"port {mcp}"]["detail"]
        # From a folder whose settings name other ports (the running one was started with flags, or for another
        # folder), on the same database: doctor checks the running one's ports, read from its lock, and says
        # how to reach it (it checked this folder's ports, all free: README trial s33).
        elsewhere = tmp_path / "elsewhere.yml"
        others = distinct_ports(3, avoid={port, ui, mcp})
        elsewhere.write_text(
            f"temporal:\n  port: {others[0]}\n  ui_port: {others[1]}\n  db_file: state/temporal.sqlite\n"
            f"mcp:\n  port: {others[2]}\n"
        )
        checks = await _doctor_checks(elsewhere, project)
        dev = checks["kiwi dev"]
        assert (
            dev["ok"]
            and f"Temporal gRPC 127.0.0.1:{port}, Temporal UI port {ui}, MCP port {mcp}" in dev["detail"]
        )
        assert f"TEMPORAL_ADDRESS=127.0.0.1:{port}" in dev["hint"], dev
        # (README trial s34: the failed Temporal check's fix said `--address 127.0.0.1:N` beside it.)
        temporal = checks["temporal"]
        assert (
            not temporal["ok"]
            and f"no Temporal server answers at 127.0.0.1:{others[0]}" in temporal["detail"]
        )
        assert temporal["hint"].startswith(f"`kiwi dev` runs at 127.0.0.1:{port}: reach it with --address"), (
            temporal
        )
        assert all(checks[f"port {p}"]["ok"] for p in (port, ui, mcp)), checks
        assert not any(f"port {p}" in checks for p in others), checks

        # A second kiwi dev on other ports but the same database stops before starting a server.
        second = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "kiwi", "dev", "--config", str(config), "--port", str(free_port(avoid={port, ui, mcp})),
            "--ui-port", str(free_port(avoid={port, ui, mcp})), "--mcp-port", str(free_port(avoid={port, ui, mcp})),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, start_new_session=True,
        )  # fmt: skip
        _, err = await asyncio.wait_for(second.communicate(), 60)
        assert second.returncode == 1, err.decode()
        database = tmp_path / "state" / "temporal.sqlite"
        assert f"another Temporal dev server already runs on {database}".encode() in err, err.decode()
        assert f"gRPC port 127.0.0.1:{port}".encode() in err
        assert b"temporal.db_file" in err and b"Traceback" not in err
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        rest = await asyncio.wait_for(proc.stdout.read(), 60)
        await proc.wait()
        otlp.__exit__()
    assert proc.returncode == 0 and b"kiwi dev: stopped" in rest
    assert b"Beginning worker shutdown" not in rest  # (the SDK's INFO line: README trial s37)
    # The local registry stopped with it.
    from kiwi.registry.embedded import running_url

    assert running_url() == ""


async def test_kiwi_dev_in_a_folder_that_is_no_project_says_so(tmp_path):
    """README trial s37: `scripts/dev` run in the Kiwi checkout served the checkout (no .ai/) to agents, with no
    word; the walkthrough's project was elsewhere."""
    port, ui, mcp = distinct_ports(3)
    config = tmp_path / "dev.yml"
    config.write_text(
        f"temporal:\n  port: {port}\n  ui_port: {ui}\n  db_file: state/temporal.sqlite\nmcp:\n  port: {mcp}\n"
    )
    folder = tmp_path / "checkout"
    folder.mkdir()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "kiwi", "dev", "--config", str(config), cwd=folder,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        out = await read_until(proc.stdout, b"ready")
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        out += await asyncio.wait_for(proc.stdout.read(), 60)
        await proc.wait()
    assert (
        f"kiwi dev: warning: {folder} is no Kiwi project (no .ai/ here or above): agents of this front end find no "
        "directives; `kiwi init` makes one here".encode()
        in out
    ), out.decode()


async def test_kiwi_dev_refuses_a_port_taken_by_something_else(project, tmp_path):
    blocker = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    port = blocker.sockets[0].getsockname()[1]
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "kiwi",
            "dev",
            "--port",
            str(port),
            "--no-mcp",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        _, err = await asyncio.wait_for(proc.communicate(), 60)
    finally:
        blocker.close()
    assert proc.returncode == 1
    assert f"port {port} on 127.0.0.1 is taken by something that is not a Temporal server".encode() in err
    assert b"Traceback" not in err


def test_the_dev_config_refuses_a_sandbox_setting_that_is_not_true_or_false(tmp_path):
    config = tmp_path / "temporal-dev.yml"
    config.write_text("worker:\n  sandboxed: yes please\n")
    with pytest.raises(KiwiError, match="worker.sandboxed is 'yes please'; expected true or false"):
        load_dev_config(config)
    config.write_text("worker:\n  sandboxed: true\n")
    assert load_dev_config(config)[0]["worker"] == {
        "task_queue": "kiwi",
        "sandboxed": True,
        "threaded": False,
    }
    config.write_text("worker:\n  threaded: 1\n")
    with pytest.raises(KiwiError, match="worker.threaded is 1; expected true or false"):
        load_dev_config(config)
    config.write_text("worker:\n  threaded: true\n")
    assert load_dev_config(config)[0]["worker"]["threaded"] is True


async def test_kiwi_dev_refuses_a_taken_ui_port_before_starting_anything(project, tmp_path):
    blocker = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    ui = blocker.sockets[0].getsockname()[1]
    config = tmp_path / "dev.yml"
    config.write_text("temporal:\n  db_file: state/temporal.sqlite\n")
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "kiwi", "dev", "--config", str(config), "--port", str(free_port()),
            "--ui-port", str(ui), "--no-mcp",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        _, err = await asyncio.wait_for(proc.communicate(), 60)
    finally:
        blocker.close()
    assert proc.returncode == 1
    assert f"the Temporal UI port 127.0.0.1:{ui} is in use".encode() in err, err.decode()
    assert b"temporal.ui_port" in err and b"--ui-port" in err and b"Traceback" not in err
    assert not (tmp_path / "state" / "temporal.sqlite").exists()


async def test_a_dev_server_that_exits_at_start_is_quoted_from_its_log(tmp_path):
    database = tmp_path / "taken.sqlite"
    database.mkdir()  # a folder where the database file should be: SQLite cannot open it
    server = DevServer(ip="127.0.0.1", port=free_port(), ui_port=free_port(), db_file=database)
    with pytest.raises(KiwiError) as caught:
        await server.start()
    server.stop()
    assert "the Temporal dev server exited with code 1: " in caught.value.message
    assert "unable to open database file" in caught.value.message
    assert caught.value.hint == f"its whole output is in {tmp_path / 'taken.sqlite.log'}"
    assert "unable to open database file" in (tmp_path / "taken.sqlite.log").read_text()


def test_ports_picked_for_the_dev_server_are_never_ones_it_or_kiwi_dev_will_bind(monkeypatch):
    """A CI run's `kiwi dev` did not start: the port picked for Temporal's own UI (behind Kiwi's gate) was the
    gate's port, free at that moment. The kernel hands out the ports below in turn: the taken ones are passed."""
    import kiwi.devserver as devserver

    handed = iter([5002, 5001, 5003, 5002, 6001, 6002])

    class Socket:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def bind(self, address):
            self.port = next(handed)

        def getsockname(self):
            return ("127.0.0.1", self.port)

    monkeypatch.setattr(devserver.socket, "socket", Socket)
    server = DevServer(ip="127.0.0.1", port=5001, ui_port=5002)
    server.taken.add(5003)  # kiwi dev's MCP port
    argv = server.command()
    assert argv[argv.index("--ui-port") + 1] == "6001" and argv[argv.index("--http-port") + 1] == "6002", argv


async def _doctor_checks(config: Path, project: Path) -> dict[str, dict]:
    """`kiwi doctor --no-mcp --json`'s checks by name, run from ``project`` with the dev settings ``config``."""
    doctor = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "kiwi", "doctor", "--no-mcp", "--json",
        env={**os.environ, "KIWI_DEV_CONFIG": str(config)}, cwd=str(project),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    said, _ = await asyncio.wait_for(doctor.communicate(), 120)
    return {c["name"]: c for c in json.loads(said)["checks"]}


async def test_kiwi_dev_says_so_when_it_reuses_the_server_a_killed_kiwi_dev_left(project, tmp_path):
    """README trial s34: after `kill -9` of kiwi dev its Temporal server lives on (it holds the database's lock);
    the next kiwi dev reused it without its UI, said nothing, and its Ctrl-C left that server running. It now
    names the server's process and how to start afresh."""
    port, ui = distinct_ports(2)
    config = tmp_path / "dev.yml"
    config.write_text(f"temporal:\n  port: {port}\n  ui_port: {ui}\n  db_file: state/temporal.sqlite\n")

    async def dev() -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(
            sys.executable, "-m", "kiwi", "dev", "--config", str(config), "--no-mcp",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip

    first = await dev()
    second = None
    left = 0
    try:
        await read_until(first.stdout, b"ready")
        os.kill(first.pid, signal.SIGKILL)  # (kiwi dev alone: its server, in its session, lives on)
        await first.wait()
        # kiwi doctor says so too (its fix was to restart kiwi dev, which reuses the server, UI-less).
        dev_check = (await _doctor_checks(config, project))["kiwi dev"]
        assert not dev_check["ok"] and "has ended; the server (pid " in dev_check["detail"], dev_check
        assert dev_check["hint"].startswith("stop it (`kill "), dev_check
        second = await dev()
        out = (await read_until(second.stdout, b"kiwi dev: ready")).decode()  # ("already" holds "ready")
        assert f"reusing the Temporal server already listening on 127.0.0.1:{port}" in out, out
        said = re.search(r"that server \(pid (\d+)\) was left running by a `kiwi dev` that ended", out)
        assert said, out
        left = int(said[1])
        assert f"UI (port {ui}) went with it" in out and f"`kill {left}`" in out, out
        assert b"start-dev" in Path(f"/proc/{left}/cmdline").read_bytes()
    finally:
        if second is not None:
            os.killpg(second.pid, signal.SIGINT)
            await asyncio.wait_for(second.wait(), 60)
        for group in (first.pid, left):  # (what the killed one left: its session, and the server, in its own)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGTERM) if group else None

        async def gone() -> bool:
            try:  # (ended: no entry, or a zombie its new parent has not reaped)
                return not left or Path(f"/proc/{left}/stat").read_text().split(") ")[1][0] == "Z"
            except (OSError, IndexError):
                return True

        await wait_for(gone, what="the server the killed kiwi dev left to stop")
