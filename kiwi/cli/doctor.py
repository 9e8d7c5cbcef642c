"""``kiwi doctor`` (is everything Kiwi needs here, each problem with its fix) and ``kiwi completion``."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kiwi.errors import KiwiError
from kiwi.searchpath import search_path

if TYPE_CHECKING:
    from kiwi.devserver import RunningDev


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    hint: str = ""
    warning: bool = False  # a problem only for some uses (no node: no npm MCP servers)


def _python() -> Check:
    version = ".".join(map(str, sys.version_info[:3]))
    ok = sys.version_info >= (3, 11)
    return Check("python", ok, f"Python {version} at {sys.executable}", "" if ok else "install Python 3.11")


def _node() -> Check:
    path = search_path(os.environ.get("PATH", os.defpath))  # (the PATH an MCP server is started with)
    node, npx = shutil.which("node", path=path), shutil.which("npx", path=path)
    if node and npx:
        return Check("node", True, f"node at {node}, npx at {npx}")
    return Check(
        "node",
        False,
        "node/npx not on PATH: MCP servers started with npx (mcp_registry.yaml) cannot start",
        "install Node.js (it brings npm and npx), or use only servers started otherwise",
        warning=True,
    )


def _containers() -> Check:
    from activities.container import container_engine

    engine = container_engine()
    if engine:
        return Check("container engine", True, f"docker tools run with {' '.join(engine)}")
    return Check(
        "container engine",
        False,
        "neither podman nor docker on PATH: docker tools cannot run",
        "install podman (Debian: podman and runc) or docker where the worker runs, or set KIWI_CONTAINER_ENGINE",
        warning=True,
    )


def _confinement() -> Check:
    """Whether the worker's kernel confines shell commands (activities/confinement.py)."""
    from activities import confinement

    try:
        note, abi, mode = confinement.platform_note(), confinement.available(), confinement.mode()
    except ValueError as exc:
        return Check("confinement", False, str(exc), "set KIWI_CONFINE to auto, required or off")
    if abi and os.geteuid() == 0:
        return Check(
            "confinement",
            False,
            f"{note}; this process runs as root, which owns the system's files: a command can still change "
            "their modes",
            "run Kiwi's worker as a user of its own (deploy/ does: README, Security, The kernel's wall)",
            warning=True,
        )
    if abi and confinement.namespaces_refused():
        return Check(
            "confinement",
            False,
            note,
            "allow the worker's user unprivileged user namespaces (Debian: sysctl "
            "kernel.unprivileged_userns_clone=1; Ubuntu 24.04+: an AppArmor profile that allows userns for the "
            "worker's Python) so each shell command runs in namespaces of its own (protected places held read-only, "
            "its processes ending with it)",
            warning=mode != "required",
        )
    if abi:
        return Check("confinement", True, note)
    return Check(
        "confinement",
        False,
        note,
        "shell commands still pass Kiwi's checks; for the kernel's wall too, run the worker on Linux 5.13+ "
        "with Landlock enabled (lsm=...,landlock)"
        if mode != "off"
        else "unset KIWI_CONFINE to confine them where the kernel can",
        warning=mode != "required",
    )


def _git_layouts(root: Path) -> Check:
    """Whether the human's git takes a folder for a repository by its layout alone (HEAD, objects/, refs/),
    whatever its name: Kiwi lets no agent make one it may write (README: Repositories by their layout); git
    set to use one only when told keeps one that came another way from running its config."""
    # (Found as Kiwi finds its own: none of a project's, review s32 round 7.)
    git = shutil.which("git", path=search_path(os.environ.get("PATH", os.defpath), str(root)))
    if not git:
        return Check("git", True, "no git on PATH: git.* tools and git commands are not available here")
    import subprocess

    # (git reads this setting from the user's and the system's config only, never a repository's own.)
    values = [
        subprocess.run(
            [git, "config", scope, "--get", "safe.bareRepository"], capture_output=True, text=True, cwd=root
        ).stdout.strip()
        for scope in ("--global", "--system")
    ]
    value = next((v for v in values if v), "")
    if value == "explicit":
        return Check("git", True, "safe.bareRepository=explicit: git uses a bare repository only when told")
    return Check(
        "git",
        False,
        f"safe.bareRepository is {value or 'not set'}: git run in a folder holding git's layout (HEAD, objects/, "
        "refs/), whatever its name, obeys the config beside it",
        "git config --global safe.bareRepository explicit (on the machines where you run git on projects "
        "agents write)",
        warning=True,
    )


def _payload_store() -> Check:
    """Where payloads of 256 KB and more go (kiwi/payloads.py), and whether this process can write there."""
    import os
    import stat

    from kiwi.payloads import STORE_VARIABLE, store_folder, unwritable

    folder = store_folder()
    if folder is None:
        return Check(
            "payload store",
            False,
            f"{STORE_VARIABLE}=off: payloads travel inline, and a run's task past 4 MB ends the run",
            f"unset {STORE_VARIABLE} (or name a folder every Kiwi process shares)",
            warning=True,
        )
    if not folder.exists():
        # (Looked at, not made: README trial s39 found a folder `kiwi doctor` made for a store it only checked.)
        above = next((p for p in folder.parents if p.exists()), None)
        if above is not None and above.is_dir() and os.access(above, os.W_OK | os.X_OK):
            return Check(
                "payload store", True, f"{folder}, not made yet: the first Kiwi process to use it makes it"
            )
        return Check(
            "payload store",
            False,
            f"{folder} cannot be written: it is not made yet, and {above} is no folder this user may write in",
            f"make {folder} writable for this user, or set {STORE_VARIABLE} to a folder that is",
        )
    problem = unwritable(folder)
    if problem:
        return Check(
            "payload store",
            False,
            problem,
            f"make {folder} writable for this user, or set {STORE_VARIABLE} to a folder that is",
        )
    mode = folder.stat().st_mode
    if mode & stat.S_IWOTH and not mode & stat.S_ISVTX:
        # Any user of the machine can remove or replace what runs stored there: a replaced file is refused by
        # its hash, and the run that needs it cannot go on.
        return Check(
            "payload store",
            False,
            f"{folder} is writable by every user of this machine (mode {stat.S_IMODE(mode):o}): they can remove "
            "or replace the payloads runs stored there, and a run whose payload is gone cannot go on",
            f"chmod 700 {folder} (or 770 for a group of Kiwi users), or set {STORE_VARIABLE} to a folder of "
            "Kiwi's own",
            warning=True,
        )
    shared = "" if os.environ.get(STORE_VARIABLE) else " (every Kiwi process of this user on this machine)"
    return Check("payload store", True, f"{folder}, writable{shared}")


def _seal() -> Check:
    """The seal key (kiwi/seal.py): readable, and where it comes from."""
    import os

    from kiwi.seal import ACCEPTED_VARIABLE, KEY_VARIABLE, accepted_keys, key_path, seal_key

    try:
        seal_key()
        accepted = accepted_keys()
    except KiwiError as exc:
        return Check("seal key", False, exc.message, exc.hint)
    if os.environ.get(KEY_VARIABLE, "").strip():
        where = f"{KEY_VARIABLE}: every worker, front end and CLI of the deployment must hold the same one"
    else:
        where = f"{key_path()} (every Kiwi process of this user on this machine)"
    if accepted:
        where += (
            f"; {len(accepted)} more key(s) accepted ({ACCEPTED_VARIABLE}, while the key changes: remove it "
            "once every process holds the new one)"
        )
    return Check("seal key", True, where)


def _temporal_binary() -> Check:
    from kiwi.devserver import temporal_binary

    try:
        return Check("temporal binary", True, temporal_binary())
    except KiwiError as exc:
        return Check("temporal binary", False, exc.message, exc.hint)


async def _temporal(address: str | None, namespace: str | None) -> list[Check]:
    from kiwi.connect import connect, target
    from kiwi.contracts import SEARCH_ATTRIBUTES
    from kiwi.runs import RunClient

    try:
        where, ns = target(address, namespace)
    except KiwiError as exc:  # a temporal.toml profile that cannot be read
        return [Check("temporal", False, exc.message, exc.hint)]
    try:
        client = await asyncio.wait_for(connect(address, namespace), 5)
        from temporalio.api.workflowservice.v1 import GetSystemInfoRequest

        await asyncio.wait_for(client.workflow_service.get_system_info(GetSystemInfoRequest()), 5)
    except (RuntimeError, OSError, TimeoutError) as exc:
        running = _running_dev_here()
        # (README trial s34: doctor said "--address 127.0.0.1:N" while its own kiwi dev check named the port.)
        elsewhere = running.address if running and running.address != where else None
        return [
            Check(
                "temporal",
                False,
                f"no Temporal server answers at {where}: {str(exc).splitlines()[0] if str(exc) else 'timeout'}",
                f"`kiwi dev` runs at {elsewhere}: reach it with --address {elsewhere} or "
                f"TEMPORAL_ADDRESS={elsewhere} (or put its port in a temporal-dev.yml here, which kiwi dev and the "
                "other commands both read)"
                if elsewhere
                else "start one with `kiwi dev`; one already running on another port (`kiwi dev --port N`) is "
                "reached with --address 127.0.0.1:N or TEMPORAL_ADDRESS=127.0.0.1:N (or put the port in a "
                "temporal-dev.yml here, which kiwi dev and the other commands both read)",
            )
        ]
    from kiwi.items.store import ItemStore, find_project_root

    ready = await RunClient(client, ItemStore(find_project_root()))._check_search_attributes()
    return [
        Check("temporal", True, f"Temporal answers at {where} (namespace {ns})"),
        Check(
            "search attributes",
            ready,
            ", ".join(a.name for a in SEARCH_ATTRIBUTES) + " registered"
            if ready
            else "Kiwi's search attributes are not all registered (runs cannot be listed by project)",
            "" if ready else "start the server with `kiwi dev` once: it registers them on a server it reuses",
        ),
    ]


def _database(config: dict[str, Any], base: Path) -> Path:
    """The Temporal database the settings name (the user's own by default): one `kiwi dev` runs on it."""
    from kiwi.devserver import data_dir

    t = config["temporal"]
    return base / t["db_file"] if t.get("db_file") else data_dir() / "temporal.sqlite"


def _running_dev_here() -> RunningDev | None:
    """The `kiwi dev` running on the database this folder's settings name."""
    from kiwi.devserver import load_dev_config, running_dev

    try:
        config, base = load_dev_config(None)
    except KiwiError:
        return None
    return running_dev(_database(config, base))


async def _ports() -> list[Check]:
    from kiwi.devserver import answers_as_temporal, load_dev_config, loopback, port_open, running_dev

    try:
        config, base = load_dev_config(None)
    except KiwiError as exc:
        return [Check("temporal-dev.yml", False, exc.message, exc.hint)]
    checks = []
    t, mcp = config["temporal"], config["mcp"]
    database = _database(config, base)
    running = running_dev(database)
    if running is not None and loopback(running.address.rpartition(":")[0].strip("[]")):
        # One `kiwi dev` runs on a database: its ports are the ones to check, whatever this folder's settings
        # say (`kiwi dev --port N` from another folder; a second one here would not start: README trial s33).
        return await _running_ports(running, database)
    for what, host, port in (
        ("Temporal gRPC", t["ip"], t["port"]),
        ("Temporal UI", t["ip"], t["ui_port"]),
        ("MCP HTTP", mcp["host"], mcp["port"]),
    ):
        busy = port_open(host, int(port))
        expected = _SERVES.get(what)
        if not busy:
            checks.append(Check(f"port {port}", True, f"{what} port {host}:{port} is free for `kiwi dev`"))
        elif what == "Temporal gRPC" and await answers_as_temporal(f"{host}:{port}"):
            checks.append(
                Check(f"port {port}", True, f"{what} port {host}:{port}: a Temporal server (reused)")
            )
        elif expected and _who(host, int(port)) == expected:
            checks.append(_serving(what, host, int(port)))
        else:
            checks.append(
                _port_warning(
                    port,
                    f"{what} port {host}:{port} is in use (by `kiwi dev` already running, or another program)",
                    "if it is not Kiwi, stop that program or set another port in temporal-dev.yml",
                )
            )
    return checks


# What answers on kiwi dev's HTTP ports (see _who).
_SERVES = {"Temporal UI": "the Temporal UI", "MCP HTTP": "a Kiwi MCP front end"}


def _serving(what: str, host: str, port: int) -> Check:
    return Check(f"port {port}", True, f"{what} port {host}:{port}: {_SERVES[what]} (`kiwi dev` running)")


def _port_warning(port: int | str, detail: str, fix: str) -> Check:
    return Check(f"port {port}", False, detail, fix, warning=True)


async def _running_ports(running: RunningDev, database: Path) -> list[Check]:
    """The ports of the `kiwi dev` that holds ``database`` (its lock's line), each checked for what answers."""
    from kiwi.connect import target
    from kiwi.devserver import answers_as_temporal

    host, _, grpc = running.address.rpartition(":")
    named = [f"Temporal gRPC {running.address}"]
    named += [f"Temporal UI port {running.ui_port}"] if running.ui_port else []
    named += [f"MCP port {running.mcp_port}"] if running.mcp_port else []
    here = target(None)[0]
    left = running.orphaned()
    if left is not None:
        # (README trial s34: after a kill -9 of kiwi dev, the fix given was to restart kiwi dev, which reuses the
        # server it left, without its UI.)
        return [
            Check(
                "kiwi dev",
                False,
                f"the `kiwi dev` that started the Temporal server on {database} has ended; the server (pid {left}) "
                f"runs on at {running.address} without the UI, worker and MCP front end it started with",
                f"stop it (`kill {left}`) and start `kiwi dev` again; a `kiwi dev` started now reuses it, UI-less",
            )
        ]
    checks = [
        Check(
            "kiwi dev",
            True,
            f"`kiwi dev` runs on {database}: {', '.join(named)}",
            ""
            if here == running.address
            else f"commands here look for Temporal at {here}: reach this one with --address {running.address} "
            f"or TEMPORAL_ADDRESS={running.address}",
        )
    ]
    if await answers_as_temporal(running.address):
        checks.append(
            Check(f"port {grpc}", True, f"Temporal gRPC port {running.address}: `kiwi dev`'s server")
        )
    else:
        checks.append(
            _port_warning(
                grpc,
                f"`kiwi dev` holds {database}, but nothing answers as Temporal at {running.address}",
                "it may be starting; if it stays so, stop that `kiwi dev` (Ctrl-C where it runs) and start it again",
            )
        )
    for what, port in (("Temporal UI", running.ui_port), ("MCP HTTP", running.mcp_port)):
        if not port:
            continue
        if _who(host, port) == _SERVES[what]:
            checks.append(_serving(what, host, port))
        else:
            checks.append(
                _port_warning(
                    port,
                    f"{what} port {host}:{port} of the running `kiwi dev` does not answer as {_SERVES[what]}",
                    "it may be starting; if it stays so, stop that `kiwi dev` and start it again",
                )
            )
    return checks


def _who(host: str, port: int) -> str:
    """Whose HTTP server answers on a port: Kiwi's MCP front end answers /healthz and /readyz as its health
    routes do (they name nothing, by design: see README, Health and shutdown), the Temporal UI answers
    /api/v1/settings with its Auth settings; '' for anything else."""
    import httpx

    base = f"http://{host}:{port}"
    with httpx.Client(timeout=2, trust_env=False) as http:
        try:
            live, ready = http.get(base + "/healthz"), http.get(base + "/readyz")
            if (live.status_code, live.json()) == (200, {"status": "ok"}) and ready.json() in (
                {"status": "ready"},
                {"status": "not ready"},
            ):
                return "a Kiwi MCP front end"
        except (httpx.HTTPError, ValueError):
            pass
        try:
            settings = http.get(base + "/api/v1/settings").json()
            if isinstance(settings, dict) and "Auth" in settings:
                return "the Temporal UI"
        except (httpx.HTTPError, ValueError):
            pass
    return ""


def _configs(root: Path) -> list[Check]:
    from kiwi.harness import load_harness
    from kiwi.items.store import user_space
    from kiwi.items.validation import harness_tool_problems
    from kiwi.keys import load_trusted
    from kiwi.upstream.registry import load_registry

    checks = [
        Check(
            "project",
            (root / ".ai").is_dir(),
            f"project {root}" + ("" if (root / ".ai").is_dir() else " has no .ai/ folder"),
            "" if (root / ".ai").is_dir() else "make one with `kiwi init`, or pass --project PATH",
        )
    ]
    absent = {
        "agent_harness.yaml": "no file: the built-in harness settings",
        "mcp_registry.yaml": "no file: no external MCP servers",
        "trusted_keys.yaml": "no file: no key trusted yet (`kiwi keys init` creates yours and trusts it)",
    }
    for name, load in (
        ("agent_harness.yaml", load_harness),
        ("mcp_registry.yaml", load_registry),
        ("trusted_keys.yaml", load_trusted),
    ):
        files = [p for p in (user_space() / "config" / name, root / ".ai" / "config" / name) if p.is_file()]
        try:
            loaded = load(root, user_space())
        except KiwiError as exc:
            problems = getattr(exc, "problems", None)
            detail = "; ".join(str(p) for p in problems) if problems else exc.message
            checks.append(Check(name, False, detail, exc.hint or f"fix {name} as the message says"))
            continue
        # (As `kiwi validate` reads it: a misspelt approval tool was "valid" here, second README trial s35.)
        named = harness_tool_problems(root, loaded) if name == "agent_harness.yaml" else []
        errors = [p.message for p in named if p.severity == "error"]
        if errors:
            checks.append(Check(name, False, "; ".join(errors), f"fix {name} as the message says"))
        else:
            detail = "valid: " + ", ".join(map(str, files)) if files else absent[name]
            checks.append(Check(name, True, detail))
    return checks


async def _mcp_servers(root: Path) -> list[Check]:
    from kiwi.upstream.catalog import McpCatalog
    from kiwi.upstream.pool import divert_server_stderr
    from kiwi.upstream.registry import load_registry

    try:
        registry = load_registry(root, _user_space())
    except KiwiError:
        return []  # reported by the config check
    checks = []
    for name, why in registry.skipped.items():
        checks.append(Check(f"mcp {name}", False, f"skipped: {why}", "see mcp_registry.yaml", warning=True))
    # The servers' stderr is kept, not printed among the checks: shown with a check that fails. One server at a
    # time, stopped (its process group with it) before the next starts, so what a failing check shows is its
    # own server's (review s22 F-4: a server still running spoke into the next one's check).
    said: list[str] = []
    divert_server_stderr(said.append)
    try:
        for name in sorted(registry.servers):
            said.clear()
            catalog = McpCatalog(root)
            try:
                tools = await asyncio.wait_for(catalog._tools(name), 60)  # noqa: SLF001 - the same start a run makes
                failed = ""
            except (KiwiError, TimeoutError) as exc:
                failed = exc.message if isinstance(exc, KiwiError) else "did not answer within 60s"
            finally:
                await catalog.pool.close()
            if not failed:
                checks.append(Check(f"mcp {name}", True, f"starts; {len(tools)} tools"))
                continue
            tail = " | ".join(line.strip() for line in said[-5:] if line.strip())
            checks.append(
                Check(
                    f"mcp {name}",
                    False,
                    failed + (f"; its stderr ended: {tail[-600:]}" if tail else ""),
                    f"check the '{name}' entry of mcp_registry.yaml",
                )
            )
    finally:
        divert_server_stderr(None)
    return checks


def _user_space() -> Path:
    from kiwi.items.store import user_space

    return user_space()


def cmd_doctor(args: argparse.Namespace) -> int:
    from kiwi.cli.progress import paint
    from kiwi.items.store import find_project_root

    root = find_project_root()

    async def go() -> list[Check]:
        checks = [
            _python(),
            _node(),
            _containers(),
            _confinement(),
            _temporal_binary(),
            _payload_store(),
            _seal(),
            _git_layouts(root),
        ]
        temporal = await _temporal(args.address, args.namespace)
        checks += temporal
        checks += await _ports()
        checks += _configs(root)
        if not args.no_mcp:
            checks += await _mcp_servers(root)
        return checks

    checks = asyncio.run(go())
    failed = [c for c in checks if not c.ok and not c.warning]
    if args.json:
        print(json.dumps({"ok": not failed, "checks": [asdict(c) for c in checks]}, indent=2))
    else:
        for c in checks:
            mark = (
                paint("ok  ", "green")
                if c.ok
                else paint("warn", "yellow")
                if c.warning
                else paint("FAIL", "red")
            )
            print(f"{mark} {c.name}: {c.detail}")
            if c.hint and not c.ok:
                print(f"     fix: {c.hint}")
        warned = [c for c in checks if not c.ok and c.warning]
        if failed:
            print(f"{len(failed)} problem(s) above" + (f", and {len(warned)} warning(s)" if warned else ""))
        else:
            # (README trial s38: "all good" under three warnings read as nothing to look at.)
            print(
                f"no problem; {len(warned)} warning(s) above, each only for some uses"
                if warned
                else "all good"
            )
    return 1 if failed else 0


# ---------------------------------------------------------------- completion


def _options(parser: argparse.ArgumentParser) -> list[str]:
    return sorted(o for a in parser._actions for o in a.option_strings)  # noqa: SLF001


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """A parser's subcommands by name (argparse offers no public walk of its parsers)."""
    found: dict[str, argparse.ArgumentParser] = {}
    for action in parser._actions:  # noqa: SLF001
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            found.update(action.choices)
    return found


def _words(
    parser: argparse.ArgumentParser,
) -> tuple[list[str], dict[str, list[str]], dict[str, list[str]]]:
    """The top-level options, each command's options (``registry`` and ``registry yank`` alike) and the
    actions of the commands that have them (``keys``, ``registry``...), read from the parser (so
    completion cannot drift)."""
    commands: dict[str, list[str]] = {}
    actions: dict[str, list[str]] = {}
    for name, sub in _subparsers(parser).items():
        commands[name] = _options(sub)
        nested = _subparsers(sub)
        if nested:
            actions[name] = sorted(nested)
            for action, inner in nested.items():
                commands[f"{name} {action}"] = _options(inner)
    return _options(parser), commands, actions


def completion_script(shell: str, parser: argparse.ArgumentParser) -> str:
    top, commands, actions = _words(parser)
    names = " ".join(sorted(c for c in commands if " " not in c))
    cases = "\n".join(
        f'        "{name}") opts="{" ".join(opts)}" ;;' for name, opts in sorted(commands.items())
    )
    nested = "\n".join(
        f'        {name}) acts="{" ".join(acts)}" ;;' for name, acts in sorted(actions.items())
    )
    bash = f"""# kiwi completion for bash: eval "$(kiwi completion bash)" (or save it under bash-completion's folder)
_kiwi() {{
    local cur="${{COMP_WORDS[COMP_CWORD]}}" cmd="" act="" acts="" i opts=""
    for ((i = 1; i < COMP_CWORD; i++)); do
        case "${{COMP_WORDS[i]}}" in -*) ;; *) if [ -z "$cmd" ]; then cmd="${{COMP_WORDS[i]}}"; \
elif [ -z "$act" ]; then act="${{COMP_WORDS[i]}}"; fi ;; esac
    done
    if [ -z "$cmd" ]; then
        COMPREPLY=($(compgen -W "{names} {" ".join(top)}" -- "$cur"))
        return
    fi
    case "$cmd" in
{nested}
    esac
    if [ -n "$acts" ] && [ -z "$act" ] && [[ "$cur" != -* ]]; then
        COMPREPLY=($(compgen -W "$acts" -- "$cur"))
        return
    fi
    [ -n "$acts" ] && [ -n "$act" ] && cmd="$cmd $act"
    case "$cmd" in
{cases}
    esac
    if [[ "$cur" == -* ]]; then
        COMPREPLY=($(compgen -W "$opts" -- "$cur"))
    else
        COMPREPLY=($(compgen -f -- "$cur"))
    fi
}}
complete -o filenames -F _kiwi kiwi
"""
    if shell == "bash":
        return bash
    # zsh runs the bash function through its bashcompinit layer.
    return (
        '# kiwi completion for zsh: eval "$(kiwi completion zsh)"\nautoload -U +X bashcompinit && bashcompinit\n'
        + bash
    )


def cmd_completion(args: argparse.Namespace) -> int:
    from kiwi.cli import build_parser

    print(completion_script(args.shell, build_parser()), end="")
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    from kiwi.cli.connection import _connection

    p = sub.add_parser(
        "doctor",
        help="check what Kiwi needs: Python, node, Temporal reachable, ports, config files, MCP servers",
    )
    p.add_argument(
        "--no-mcp", action="store_true", help="do not start the configured MCP servers to check them"
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    _connection(p, scope=False)
    p.set_defaults(func=cmd_doctor)

    p = sub.add_parser("completion", help='print a shell completion script: eval "$(kiwi completion bash)"')
    p.add_argument("shell", choices=("bash", "zsh"), help="your shell")
    p.set_defaults(func=cmd_completion)
