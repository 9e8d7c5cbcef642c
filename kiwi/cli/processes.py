"""``kiwi dev``, ``kiwi worker`` and ``kiwi mcp``: the processes Kiwi runs, their logs and their stop."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from kiwi import telemetry
from kiwi.cli import progress
from kiwi.errors import KiwiError


def _process_start() -> None:
    """What `kiwi worker`, `dev` and `mcp` settle before anything else: plain logs off a terminal, and a
    payload store setting every process can use (refused here, not at the first large call, and before the
    process waits for Temporal)."""
    from activities import confinement
    from kiwi.payloads import check_store

    _plain_logs()
    check_store()
    try:
        confinement.mode()
    except ValueError as exc:
        raise KiwiError(
            str(exc), hint="KIWI_CONFINE: auto (the default), required or off (README: Security)"
        ) from None


def _plain_logs() -> None:
    """Temporal's core colours its log lines unless NO_COLOR is set: written to a file or a pipe (a container's
    log, `> worker.log`), the escape codes went with them. Plain text unless stderr is a terminal."""
    if not (hasattr(sys.stderr, "isatty") and sys.stderr.isatty()):
        os.environ.setdefault("NO_COLOR", "1")


def cmd_worker(args: argparse.Namespace) -> int:
    _process_start()
    from activities import confinement
    from kiwi.connect import connect
    from workers.main import deployment_config, run_worker

    if bool(args.deployment_name) != bool(args.build_id):
        raise KiwiError(
            "--deployment-name and --build-id go together",
            hint="give both to use Worker Versioning, or neither",
        )
    if args.versioning_behavior and not args.deployment_name:
        raise KiwiError(
            "--versioning-behavior means something with Worker Versioning only",
            hint="give --deployment-name and --build-id with it (README: Upgrading workers), or leave it out",
        )
    deployment = (
        deployment_config(args.deployment_name, args.build_id, args.versioning_behavior or "pinned")
        if args.deployment_name
        else None
    )
    health = (args.health_host, args.health_port) if args.health_port is not None else None

    telemetry.setup("kiwi-worker")

    async def go() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()

        def drain() -> None:
            # The stop comes first: a print to an output nobody reads any more (the log collector that
            # read it is gone) raises, and the worker went on running on every SIGTERM after.
            if not stop.is_set():
                stop.set()
                _say(f"kiwi worker: stopping; in-flight activities have {args.drain_seconds:g}s to finish")

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, drain)
        client = await _connected(lambda: connect(args.address, args.namespace), stop, health, args.address)
        if client is None:
            _say("kiwi worker: stopped")
            return 0

        def started() -> None:
            # Printed once the worker polls: whoever waits for this line can send it work.
            _say(f"kiwi worker: task queue '{args.task_queue}' on {client.service_client.config.target_host}")
            if health:
                _say(f"kiwi worker: health at http://{health[0]}:{health[1]}/healthz and /readyz")
            if deployment:
                _say(f"kiwi worker: deployment '{args.deployment_name}', build '{args.build_id}'")
            _say(f"kiwi worker: {confinement.platform_note()}")

        await run_worker(
            client,
            args.task_queue,
            stop,
            sandboxed=args.sandboxed,
            threaded=args.threaded,
            drain=timedelta(seconds=args.drain_seconds),
            health=health,
            deployment=deployment,
            started=started,
        )
        _say("kiwi worker: stopped")
        return 0

    return asyncio.run(go())


async def _connected(
    connect: Callable[[], Awaitable[Any]],
    stop: asyncio.Event,
    health: tuple[str, int] | None,
    address: str | None,
) -> Any:
    """A client once Temporal answers, trying again (every 1 s, then up to every 10 s) until it does or
    ``stop`` is set (None then). Meanwhile the health endpoints answer: live, not ready. A worker started
    before its server (a pod beside it, a machine booting) waits for it instead of ending in a traceback."""
    from kiwi.connect import target
    from kiwi.health import bind_health, serve_health

    listener = bind_health(*health) if health else None
    waiting = asyncio.Event()

    async def not_ready() -> bool:
        return False

    probes = asyncio.create_task(serve_health(listener, not_ready, waiting)) if listener else None
    delay, said = 1.0, False
    try:
        while not stop.is_set():
            try:
                return await connect()
            except RuntimeError as exc:
                if not said:
                    said = True
                    _say(
                        f"kiwi worker: Temporal at {target(address)[0]} does not answer ({exc}); trying again until it "
                        "does (Ctrl-C to stop)"
                    )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)
            delay = min(delay * 2, 10.0)
        return None
    finally:
        waiting.set()
        if probes is not None:
            await probes
        if listener is not None:
            listener.close()


def _say(line: str) -> None:
    """A line on standard output for whoever reads it; once its reader is gone, none raises."""
    try:
        print(line, flush=True)
    except BrokenPipeError:
        with contextlib.suppress(OSError, ValueError):
            progress.quiet_stdout()


def _start_local_registry() -> bool:
    """The user's local registry (embedded PostgreSQL), started and migrated for `kiwi dev`'s lifetime (False
    when KIWI_REGISTRY_URL names another one, or when it cannot start: said, and dev goes on)."""
    from kiwi.registry import registry_url
    from kiwi.registry.embedded import data_folder, held, keep_while_serving, release_kept

    if registry_url():
        print("kiwi dev: registry at KIWI_REGISTRY_URL", flush=True)
        return False
    keep_while_serving()
    try:
        with held():
            pass  # (taken now, kept until kiwi dev stops)
    except KiwiError as exc:
        release_kept()
        print(f"kiwi dev: the local registry did not start: {exc.message} ({exc.hint})", flush=True)
        return False
    print(f"kiwi dev: registry (PostgreSQL, Unix socket) in {data_folder()}", flush=True)
    return True


def cmd_dev(args: argparse.Namespace) -> int:
    _process_start()
    from kiwi.connect import connect, target
    from kiwi.devserver import DevServer, dev_config_file, load_dev_config, port_open, running_dev
    from kiwi.items.store import find_project_root
    from workers.main import run_worker

    config, base = load_dev_config(Path(args.config) if args.config else None)
    # (The file errors name: README trial s39 gave --config cfg/c.yml and was told of temporal-dev.yml.)
    source = args.config or os.environ.get("KIWI_DEV_CONFIG") or str(dev_config_file() or "temporal-dev.yml")
    server = DevServer.from_config(config, base, args.port, args.ui_port, source=source)
    if args.mcp_port:
        config["mcp"]["port"] = args.mcp_port
    if (config.get("mcp") or {}).get("port"):
        server.taken.add(int(config["mcp"]["port"]))  # (bound after the server starts: never its own)
        if not args.no_mcp and (config.get("mcp") or {}).get("http"):
            server.mcp_port = int(config["mcp"]["port"])
    if args.otel:
        os.environ[telemetry.ON_VARIABLE] = "1"
    if telemetry.setup("kiwi-dev"):
        print(f"kiwi dev: OpenTelemetry traces and metrics to {telemetry.describe_endpoint()}", flush=True)
    from activities import confinement

    print(f"kiwi dev: {confinement.platform_note()}", flush=True)

    async def go() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        mcp_settings = config.get("mcp") or {}
        if (
            mcp_settings.get("http")
            and not args.no_mcp
            and port_open(mcp_settings["host"], int(mcp_settings["port"]))
        ):
            raise KiwiError(
                f"the MCP port {mcp_settings['host']}:{mcp_settings['port']} is in use (another `kiwi dev`, "
                "perhaps one scripts/dev started for another folder)",
                hint="stop it (Ctrl-C where it runs), or start this one with --mcp-port N or --no-mcp, or set "
                "mcp.port in temporal-dev.yml",
            )
        await server.start(log=None if not args.verbose else sys.stderr)
        registry_kept = False
        try:
            if server.reused:
                print(
                    f"kiwi dev: reusing the Temporal server already listening on {server.address}", flush=True
                )
                left = running_dev(server.db_file) if server.db_file else None
                if left is not None and (pid := left.orphaned()) is not None:
                    # README trial s34: after a kill -9 of kiwi dev, the next one reused its server, without a UI,
                    # and said nothing; Ctrl-C left that server running.
                    print(
                        f"kiwi dev: that server (pid {pid}) was left running by a `kiwi dev` that ended: its Temporal "
                        f"UI (port {left.ui_port or server.ui_port}) went with it, and this kiwi dev will not stop it; "
                        f"to start afresh with the UI, stop it (`kill {pid}`) and start kiwi dev again",
                        file=sys.stderr,
                        flush=True,
                    )
            else:
                print(
                    f"kiwi dev: Temporal dev server on {server.address} (state in {server.db_file})",
                    flush=True,
                )
                print(f"kiwi dev: Temporal UI at http://{server.ip}:{server.ui_port}", flush=True)
            if target()[0] != server.address:
                # (--port given on the command line: the other commands, run from here, look elsewhere.)
                print(
                    f"kiwi dev: other commands reach it with --address {server.address} or "
                    f"`export TEMPORAL_ADDRESS={server.address}`, and link runs to its UI with "
                    f"`export KIWI_TEMPORAL_UI=http://{server.ip}:{server.ui_port}` (or put the ports in a "
                    "temporal-dev.yml here)",
                    flush=True,
                )
            # (The SDK's "Beginning worker shutdown, will wait 0:00:00 ..." reached the terminal at Ctrl-C, through
            # the INFO handler the MCP SDK sets up: README trial s37. kiwi dev says itself what stopping does.)
            logging.getLogger("temporalio.worker._worker").setLevel(logging.WARNING)
            registry_kept = _start_local_registry()
            # Search attributes: registered by start-dev's flags, or checked on a reused server.
            client = await connect(server.address, server.namespace)
            tasks = [
                asyncio.create_task(
                    run_worker(
                        client,
                        config["worker"]["task_queue"],
                        stop,
                        sandboxed=bool(config["worker"].get("sandboxed")),
                        threaded=bool(config["worker"].get("threaded")),
                    )
                )
            ]
            print(
                f"kiwi dev: worker on task queue '{config['worker']['task_queue']}' (runs of any project, "
                "each against its own project folder)",
                flush=True,
            )
            mcp = config.get("mcp") or {}
            if mcp.get("http") and not args.no_mcp:
                try:
                    from mcp_frontend.transports import serve_http
                except ImportError:
                    serve_http = None
                if serve_http is not None:
                    tasks.append(
                        asyncio.create_task(
                            serve_http(
                                client, mcp["host"], int(mcp["port"]), stop, config["worker"]["task_queue"]
                            )
                        )
                    )
                    served = find_project_root()
                    print(
                        f"kiwi dev: MCP front end at http://{mcp['host']}:{mcp['port']}/mcp for the project "
                        f"{served}",
                        flush=True,
                    )
                    if not (served / ".ai").is_dir():
                        # (README trial s37: `scripts/dev` in the Kiwi checkout served the checkout, with no word.)
                        print(
                            f"kiwi dev: warning: {served} is no Kiwi project (no .ai/ here or above): agents of "
                            "this front end find no directives; `kiwi init` makes one here, or start kiwi dev "
                            "from your project's folder (or with --project PATH)",
                            file=sys.stderr,
                            flush=True,
                        )
            print("kiwi dev: ready; Ctrl-C stops everything", flush=True)
            await stop.wait()
            # The worker and the front end stop themselves on `stop`; cancelling them at once would
            # cut the HTTP server's shutdown short (a traceback on every Ctrl-C).
            _, late = await asyncio.wait(tasks, timeout=15)
            for task in late:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            if registry_kept:
                from kiwi.registry.embedded import release_kept

                release_kept()
            server.stop()
            print("kiwi dev: stopped", flush=True)
        return 0

    return asyncio.run(go())


def cmd_mcp(args: argparse.Namespace) -> int:
    _process_start()
    from mcp_frontend.transports import serve_http, serve_stdio

    telemetry.setup("kiwi-frontend")

    async def go() -> int:
        if not args.http:
            # Up without Temporal: items are served at once, run actions connect when asked.
            await serve_stdio(task_queue=args.task_queue, address=args.address, namespace=args.namespace)
            return 0
        # Up without Temporal too, as on stdio: not ready (/readyz) until Temporal answers, and run actions
        # answer TemporalUnavailable meanwhile, instead of a front end an orchestrator restarts in a loop.
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await serve_http(
            None,
            args.host,
            args.port,
            stop,
            args.task_queue,
            stateless=args.stateless,
            address=args.address,
            namespace=args.namespace,
            drain_seconds=args.drain_seconds,
            announce=lambda: print(
                f"kiwi mcp: streamable HTTP at http://{args.host}:{args.port}/mcp",
                file=sys.stderr,
                flush=True,
            ),
        )
        return 0

    return asyncio.run(go())
