"""Connections to external MCP servers, pooled per server and project.

The worker's MCP activities and the front end's ``mcp`` catalog both use it. Connections are
opened lazily, shared by every caller, closed after an idle timeout, and dropped after a
transport failure so the next attempt reconnects. Placeholders in the registry are resolved
only here, when a connection is made; the values are remembered per connection so results can
be scrubbed of them.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import hashlib
import html
import json
import logging
import os
import re
import stat
import threading
import time
import urllib.parse
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import mcp_types
from mcp.client import Client
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from pydantic import ValidationError

from kiwi import telemetry
from kiwi.devserver import data_dir
from kiwi.errors import KiwiError
from kiwi.items.store import user_space
from kiwi.metrics import MCP_CONNECTIONS, MCP_DROPPED, process_meter
from kiwi.upstream.registry import McpRegistry, McpServerConfig, load_registry, registry_paths
from kiwi.upstream.schemacheck import output_validator
from kiwi.upstream.stdio import StdioLink

logger = logging.getLogger(__name__)

# How the MCP client spells an HTTP error status that carried no JSON-RPC error (streamable_http.py).
HTTP_STATUS_ERROR = "Server returned an error response"
# Errors a retry will not fix: the server said the request itself is wrong.
PERMANENT_CODES = (mcp_types.INVALID_PARAMS, mcp_types.METHOD_NOT_FOUND, mcp_types.INVALID_REQUEST)


def schema_hash(tool: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(tool, sort_keys=True, default=str).encode()).hexdigest()[:16]


# The least a call waits for its answer, however close its deadline.
MIN_WAIT_SECONDS = 0.05


class McpUnavailable(Exception):
    """The server could not be reached or the connection broke (retryable, unless ``lasting``: its
    command is not there, which no retry a second later finds)."""

    def __init__(self, message: str, *, lasting: bool = False) -> None:
        super().__init__(message)
        self.lasting = lasting


class McpRefused(KiwiError):
    """A request a retry will not fix; ``type`` says which kind (ToolNotFound, ToolFailed, ...)."""

    def __init__(self, message: str, kind: str, hint: str = "") -> None:
        super().__init__(message, hint=hint)
        self.type = kind


class McpConnection:
    """One open client session; a task owns the transport's context from open to close."""

    def __init__(self, config: McpServerConfig, secrets: dict[str, str], on_change: Any) -> None:
        self.config = config
        self.secrets = secrets
        self.client: Client | None = None
        self.link: StdioLink | None = None  # a stdio server's transport (see kiwi.upstream.stdio)
        self.busy = 0
        self.last_used = time.monotonic()
        self.broken = False
        self._on_change = on_change
        self._closing = asyncio.Event()
        self._ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._task: asyncio.Task[None] | None = None

    async def open(self) -> None:
        self._task = asyncio.create_task(self._hold(), name=f"mcp-{self.config.name}")
        try:
            await asyncio.wait_for(asyncio.shield(self._ready), timeout=self.config.connect_timeout_seconds)
        except TimeoutError:
            await self.close()
            raise McpUnavailable(
                f"no answer from MCP server '{self.config.name}' within "
                f"{self.config.connect_timeout_seconds:g}s"
            ) from None

    def _transport(self) -> Any:
        c = self.config
        if c.type == "stdio":
            cwd = c.cwd or neutral_folder()
            self.link = StdioLink(c.command, c.args, env=c.env or None, cwd=cwd, errlog=_errlog())
            return self.link.streams()
        if c.type == "sse":
            return sse_client(c.url, headers=c.headers or None)
        return streamable_http_client(c.url, http_client=create_mcp_http_client(headers=c.headers or None))

    async def _hold(self) -> None:
        async def on_message(message: Any) -> None:
            if isinstance(message, mcp_types.ToolListChangedNotification):
                self._on_change()

        try:
            async with Client(
                self._transport(),
                message_handler=on_message,
                read_timeout_seconds=self.config.timeout_seconds,
                cache=None,
            ) as client:
                _bounded_checks(client.session)
                self.client = client
                self._ready.set_result(None)
                while not self._closing.is_set():
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(
                            self._closing.wait(), timeout=min(self.config.idle_timeout_seconds, 5)
                        )
                    if (
                        self.busy == 0
                        and time.monotonic() - self.last_used >= self.config.idle_timeout_seconds
                    ):
                        break
        except BaseException as exc:  # noqa: BLE001 - whatever ends the transport ends this connection
            if not self._ready.done():
                exited = None
                if self.link is not None and not isinstance(exc, asyncio.CancelledError):
                    exited = await self.link.exit_code()
                lasting = _root(exc).__class__ is FileNotFoundError and exited is None
                self._ready.set_exception(
                    McpUnavailable(_describe(exc, self.config.name, exited), lasting=lasting)
                )
            if isinstance(exc, asyncio.CancelledError):
                raise
        finally:
            self.broken = True
            self.client = None

    def short_calls(self) -> bool:
        """Whether ``tools/call`` may skip the SDK's request machinery (see kiwi.upstream.stdio): a stdio
        server on a handshake-era protocol."""
        return (
            self.link is not None
            and self.client is not None
            and self.client.protocol_version in HANDSHAKE_PROTOCOL_VERSIONS
        )

    async def close(self) -> None:
        self._closing.set()
        self.broken = True
        if self._task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._task), timeout=10)
            except (TimeoutError, Exception):  # noqa: BLE001 - closing a dead transport may fail in any way
                self._task.cancel()


class McpPool:
    """Connections and tool schemas per server, shared by every run on this worker."""

    def __init__(self, user: Path | None = None) -> None:
        self.user = user
        # The pool is where secrets are resolved: from here on this process's logs never show them.
        install_log_scrubber()
        self._connections: dict[str, McpConnection] = {}
        self._retired: set[McpConnection] = set()  # out of the pool, calls still in flight on them
        self._closing: set[asyncio.Task[None]] = set()  # connections closing while their calls answer
        self._opened: set[str] = set()  # keys connected before: a new connection is a reconnect
        self._locks: dict[str, asyncio.Lock] = {}
        self._schemas: dict[str, tuple[float, list[dict[str, Any]], dict[str, str]]] = {}
        self._registries: dict[str, tuple[tuple[tuple[int, int, int], ...], McpRegistry]] = {}
        self._paths: dict[tuple[str, str], tuple[Path, list[Path]]] = {}
        # (project root, server name) -> (the registry entry, its key): see _key.
        self._keys: dict[tuple[str, str], tuple[McpServerConfig, str]] = {}

    def registry(self, project_root: str) -> McpRegistry:
        """The registry of ``project_root``, re-read when either file changes."""
        # Checked on every call: one stat per file, the paths worked out once (user space by its variable).
        where = (
            project_root,
            str(self.user) if self.user else os.environ.get("AI_USER_SPACE") or os.environ.get("HOME", ""),
        )
        known = self._paths.get(where)
        if known is None:
            user = self.user or user_space()
            known = self._paths[where] = (user, registry_paths(Path(project_root), user))
        user, paths = known
        stamp = tuple(_stamp(p) for p in paths)
        cached = self._registries.get(project_root)
        if cached is None or cached[0] != stamp:
            cached = (stamp, load_registry(Path(project_root), user))
            self._registries[project_root] = cached
            for warning in cached[1].warnings:
                logger.warning("%s", warning)
        return cached[1]

    def config(self, project_root: str, server: str) -> McpServerConfig:
        try:
            return self.registry(project_root).get(server)
        except KiwiError as exc:
            raise McpRefused(exc.message, "McpServerUnknown", exc.hint) from None

    def _key(self, project_root: str, config: McpServerConfig) -> str:
        # Per project: a server's state (a memory graph, a working folder) never crosses projects.
        # Worked out once per registry entry: every call asks for it (its connection, its schema check),
        # and reading the entry's fingerprint through pydantic's private-attribute path is not free.
        known = self._keys.get((project_root, config.name))
        if known is not None and known[0] is config:
            return known[1]
        key = f"{config.name}:{config.fingerprint()}:{project_root}"
        self._keys[(project_root, config.name)] = (config, key)
        return key

    async def connection(self, project_root: str, config: McpServerConfig) -> McpConnection:
        key = self._key(project_root, config)
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            conn = self._connections.get(key)
            if conn is not None and not conn.broken:
                return conn
            resolved, secrets = config.resolved(project_root)
            remember_secrets(secrets)
            conn = McpConnection(resolved, secrets, lambda: self._schemas.pop(key, None))
            await conn.open()
            self._connections[key] = conn
            if telemetry.active():
                reconnect = "true" if key in self._opened else "false"
                process_meter().create_counter(MCP_CONNECTIONS, "upstream MCP connections opened").add(
                    1, {"server": config.name, "reconnect": reconnect}
                )
            self._opened.add(key)
            return conn

    async def drop(
        self, project_root: str, config: McpServerConfig, conn: McpConnection | None = None
    ) -> None:
        """Close the server's connection (``conn`` only if it is still the current one: a connection
        opened since, with calls of its own in flight, is left alone)."""
        key = self._key(project_root, config)
        current = self._connections.get(key)
        if current is None or (conn is not None and current is not conn):
            return
        del self._connections[key]
        if telemetry.active():
            process_meter().create_counter(MCP_DROPPED, "upstream MCP connections dropped on a failure").add(
                1, {"server": config.name}
            )
        self._close_soon(current)

    def _close_soon(self, conn: McpConnection) -> None:
        """Close ``conn`` without holding up the call that ends it: a hung server takes its close's whole
        grace to end, and a call that waited for it answered past its activity's time, which Temporal
        retried, sending the call again (a ToolTimeout's call, never to be sent again)."""
        task = asyncio.create_task(conn.close(), name=f"mcp-close-{conn.config.name}")
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    def _retire(self, project_root: str, config: McpServerConfig, conn: McpConnection) -> None:
        """No new call goes to ``conn`` (the next one opens a fresh connection); the calls already in
        flight on it keep it until they end, and the last one closes it (see ``_using``)."""
        self._retired.add(conn)  # (closed by its last call, or by close())
        key = self._key(project_root, config)
        if self._connections.get(key) is conn:
            del self._connections[key]

    @contextlib.asynccontextmanager
    async def _using(
        self,
        project_root: str,
        config: McpServerConfig,
        what: str,
        refused_type: str,
        timed_out: float | None = None,
    ) -> AsyncIterator[McpConnection]:
        """The server's connection for one request. An MCP error that will not heal is a refusal
        (``refused_type``); anything else drops the connection, and the activity's retry reconnects.
        ``timed_out``: a tool call's timeout, past which it is a refusal too (ToolTimeout): the request
        reached the server, which may have done what it asked, so sending it again could do it twice."""
        conn = await self.connection(project_root, config)
        conn.busy += 1
        try:
            assert conn.client is not None
            yield conn
        except MCPError as exc:
            # An error answer: the connection carried it, and other runs' calls in flight on it must keep
            # their answers (dropping it ended them, and their retries ran calls the server had done).
            if exc.code in PERMANENT_CODES:
                raise McpRefused(scrub_text(f"{what}: {exc.message}"), refused_type) from None
            if exc.code == mcp_types.CONNECTION_CLOSED:
                await self.drop(project_root, config, conn)
            elif exc.code == mcp_types.REQUEST_TIMEOUT or (
                config.type != "stdio" and exc.message == HTTP_STATUS_ERROR
            ):
                # A server that may be stuck, or an HTTP status the client spelled as an error (a session
                # the server lost on a restart): later calls go to a fresh connection. An error the server
                # answered in JSON-RPC leaves its session as it is.
                self._retire(project_root, config, conn)
                if exc.code == mcp_types.REQUEST_TIMEOUT and timed_out is not None:
                    raise McpRefused(
                        scrub_text(
                            f"{what}: no answer within {timed_out:g}s (the server's timeout in mcp_registry.yaml); "
                            "the server may have done it all the same, so Kiwi does not send it again"
                        ),
                        "ToolTimeout",
                        hint="check whether it took effect before calling again; a call that needs longer "
                        "needs a larger timeout for its server",
                    ) from None
            raise McpUnavailable(scrub_text(f"{what}: {exc.message}")) from None
        except RuntimeError as exc:
            # The server answered and the MCP client refused the answer (structured content that breaks the
            # tool's output schema, an input request Kiwi cannot answer): the call ran, and the connection
            # is sound. Not retried: a retry would run the call again, and its neighbours with it.
            raise McpRefused(
                scrub_text(f"{what}: the server's answer was refused: {exc}"), refused_type
            ) from None
        except Exception as exc:  # noqa: BLE001 - a broken transport surfaces as many exception types
            await self.drop(project_root, config, conn)
            raise McpUnavailable(_describe(exc, config.name)) from None
        finally:
            conn.busy -= 1
            conn.last_used = time.monotonic()
            if conn.busy == 0 and conn in self._retired:
                self._retired.discard(conn)
                self._close_soon(conn)

    async def list_tools(
        self, project_root: str, config: McpServerConfig, refresh: bool = False
    ) -> list[dict]:
        """Every tool the registry lets through, from cache when fresher than the server's TTL."""
        return (await self.listing(project_root, config, refresh))[0]

    async def listing(
        self, project_root: str, config: McpServerConfig, refresh: bool = False
    ) -> tuple[list[dict[str, Any]], dict[str, str]]:
        """:meth:`list_tools` and the :func:`schema_hash` of each tool by name, worked out once per listing."""
        key = self._key(project_root, config)
        cached = self._schemas.get(key)
        if cached and not refresh and time.monotonic() - cached[0] < config.schema_ttl_seconds:
            return cached[1], cached[2]
        tools: list[dict[str, Any]] = []
        cursor: str | None = None
        async with self._using(
            project_root, config, f"MCP server '{config.name}' tools/list", "McpError"
        ) as conn:
            for _ in range(100):
                page = await conn.client.list_tools(cursor=cursor, cache_mode="refresh")
                tools += [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in page.tools]
                cursor = page.next_cursor
                if not cursor:
                    break
        # A server may put what it was started with (a token, a URL) into descriptions and schemas.
        tools = scrub([t for t in tools if not config.tools or t.get("name") in config.tools])
        hashes = {t["name"]: schema_hash(t) for t in tools if "name" in t}
        self._schemas[key] = (time.monotonic(), tools, hashes)
        return tools, hashes

    async def call_tool(
        self,
        project_root: str,
        config: McpServerConfig,
        tool: str,
        arguments: dict[str, Any],
        progress: Any = None,
        deadline: float | None = None,
    ) -> tuple[dict[str, Any], McpConnection]:
        """One tools/call, waiting for its answer the server's ``timeout`` at most, and not past ``deadline``
        (``time.monotonic()``) once connected."""
        if config.tools and tool not in config.tools:
            raise McpRefused(
                f"MCP server '{config.name}' has no tool '{tool}' exposed to Kiwi", "ToolNotFound"
            )
        async with self._using(
            project_root, config, f"{config.name}.{tool}", "ToolFailed", config.timeout_seconds
        ) as conn:
            limit = config.timeout_seconds
            if deadline is not None:
                limit = max(MIN_WAIT_SECONDS, min(limit, deadline - time.monotonic()))
            try:
                if conn.short_calls():
                    assert conn.link is not None and conn.client is not None
                    answer = await conn.link.request(
                        "tools/call",
                        {"name": tool, "arguments": arguments},
                        timeout=limit,
                        progress=progress,
                        traced=telemetry.active(),
                    )
                    result = mcp_types.CallToolResult.model_validate(answer)
                    if not result.is_error:
                        # The SDK's check of structured content against the tool's output schema, as its call makes.
                        await conn.client.session.validate_tool_result(tool, result)
                else:
                    result = await conn.client.call_tool(
                        tool, arguments, read_timeout_seconds=limit, progress_callback=progress
                    )
            except ValidationError as exc:
                # An answer that is no CallToolResult (content that is no list): an answer the client refuses,
                # as RuntimeError below in _using, not a broken transport (which drops the connection under
                # the other runs' calls in flight on it).
                raise RuntimeError(f"malformed result: {_validation_text(exc)}") from None
        return result.model_dump(mode="json", by_alias=True, exclude_none=True), conn

    async def close(self) -> None:
        for conn in [*self._connections.values(), *self._retired]:
            await conn.close()
        self._connections.clear()
        self._retired.clear()
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)


def _bounded_checks(session: Any) -> None:
    """The session checks answers against output schemas in bounded time (kiwi/upstream/schemacheck.py):
    the SDK's own check is its method ``_output_schema_validator``'s validator, built and cached per tool
    (rebuilt when the tool's schema changes)."""
    held: dict[str, tuple[dict[str, Any], Any]] = {}

    def validator(name: str, output_schema: dict[str, Any]) -> Any:
        cached = held.get(name)
        if cached is None or cached[0] != output_schema:
            cached = held[name] = (output_schema, output_validator(name, output_schema))
        return cached[1]

    session._output_schema_validator = validator


def neutral_folder() -> str:
    """Where a stdio server without a ``cwd`` starts: an empty folder of the user's own (KIWI_HOME/mcp-cwd).

    Not the worker's working folder, which is the project when ``kiwi dev`` runs from it: ``python -m``
    puts its working folder first on the import path, and npx and uvx read settings from it, so a file an
    agent wrote into the project (``json.py``, ``.npmrc``) ran in the server the next time it started."""
    folder = data_dir() / "mcp-cwd"
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    return str(folder)


def _validation_text(exc: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(map(str, e['loc'])) or 'result'}: {e['msg']}" for e in exc.errors(include_url=False)[:3]
    )


def _stamp(path: Path) -> tuple[int, int, int]:
    """What changes when a registry file is edited, replaced or removed (zeros: no such file)."""
    try:
        info = os.stat(path)
    except OSError:
        return (0, 0, 0)
    if not stat.S_ISREG(info.st_mode):
        return (0, 0, 0)
    return (info.st_mtime_ns, info.st_size, info.st_ino)


def scrub(value: Any, secrets: dict[str, str] | None = None) -> Any:
    """``value`` with every secret's text replaced by ``[secret NAME]``, in every string (and key) however
    deep, in each form a server may send it back in: as it is, JSON-escaped once, twice or three times (a
    JSON document holding it, as text inside JSON), or percent-encoded (in a URL).

    ``secrets`` defaults to every value this process has resolved for an MCP server (see
    :func:`remember_secrets`), so error texts and logs are scrubbed even before a connection exists.
    """
    secrets = KNOWN_SECRETS if secrets is None else secrets
    if not secrets:
        return value
    forms = _secret_forms(secrets)
    return _scrubbed(value, forms) if forms else value


def scrub_model(model: Any) -> Any:
    """A pydantic ``model`` with every secret this process knows scrubbed from its strings (:func:`scrub`), as
    the same type; the model itself when none is known or none is in it."""
    if not KNOWN_SECRETS:
        return model
    dumped = model.model_dump(mode="json")
    scrubbed = scrub(dumped)
    return model if scrubbed == dumped else type(model).model_validate(scrubbed)


def _secret_forms(secrets: dict[str, str]) -> list[tuple[str, str]]:
    """(text, replacement) for each form of each secret of 4 characters or more, longest first. Worked out
    once per set of secrets: scrub_text runs on every log record of the process."""
    return _forms_of(tuple(sorted(secrets.items())))


@functools.lru_cache(maxsize=64)
def _forms_of(secrets: tuple[tuple[str, str], ...]) -> list[tuple[str, str]]:
    forms: dict[str, str] = {}
    for name, whole in secrets:
        for secret, every in _parts(whole):
            for form in _encodings(secret) if every else _escaped(secret):
                forms.setdefault(form, f"[secret {name}]")
    return sorted(forms.items(), key=lambda kv: -len(kv[0]))


def _random_like(text: str) -> bool:
    """Whether a URL's path segment looks like a key, not a name (`acme-prod-eu-west-1`, `project20240101`): 32
    hex digits or more, or 20 characters or more with upper and lower case letters and digits."""
    if re.fullmatch(r"[0-9a-fA-F]{32,}|[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", text):
        return True
    if len(text) >= 20 and re.fullmatch(r"[a-z0-9]+", text):  # (Mattermost's hook ids)
        return sum(c.isdigit() for c in text) >= 4 and sum(c.isalpha() for c in text) >= 4
    return len(text) >= 20 and bool(
        re.search(r"[a-z]", text) and re.search(r"[A-Z]", text) and re.search(r"\d", text)
    )


def _key_like(text: str, size: int = 16) -> bool:
    """Whether ``text`` looks like a key, not a word: ``size`` characters or more, letters and digits."""
    return len(text) >= size and bool(re.search(r"\d", text)) and bool(re.search(r"[A-Za-z]", text))


def _parts(secret: str) -> list[tuple[str, bool]]:
    """``secret`` and what of it a server or a library may send back alone (review s30), each with whether
    every encoding of it is looked for (else as it is and JSON-escaped): without the blanks around it (a
    secret file's last newline, which the program using it strips); each key-like line of a secret of several
    (a PEM key's body, printed a line at a time; not its armor); of a secret that is a URL, the URL as httpx
    writes it (host lower-cased, a default port dropped), its password (as written and decoded, 8 characters
    or more), the values of its credential-named query parameters and its key-like ones, and its key-like path
    segments (an SSE server's endpoint is another URL with the key in its path); of a secret that is a JSON
    object (a service account's file), its key-like string values, and their lines. No ordinary word: a
    secret's part replaces that text wherever it is (`true` of `&debug=true` made results invalid JSON)."""
    parts = [(secret, True), (secret.strip(), True)]
    text = secret.strip()
    if not text.startswith("{") and "://" not in text:
        # (`Bearer sk-live-...`: the key alone, as a server echoes it or a message wraps it at the space. Not
        # of a JSON document, whose words are its values, quoted: review s30.)
        words = [word.strip("\"',;") for word in text.split()]
        parts += [(word, True) for word in words if word != text and _key_like(word)]
    lines = [line.strip() for line in secret.splitlines()]
    if len(lines) > 1:
        parts += [(line, False) for line in lines if _key_like(line) and not line.startswith("-----")]
    if re.match(r"(?i)^[a-z][a-z0-9+.-]*://", text):
        with contextlib.suppress(ValueError):
            url = urllib.parse.urlsplit(text)
            password = url.password or ""
            parts += [(p, True) for p in (password, urllib.parse.unquote(password)) if len(p) >= 8]
            parts += [
                (value, True)
                for name, value in urllib.parse.parse_qsl(url.query)
                if _CREDENTIAL_NAME.search(name) and len(value) >= 8
            ]
            parts += [(segment, True) for segment in url.path.split("/") if _random_like(segment)]
            with contextlib.suppress(Exception):
                parts.append((str(httpx.URL(text)), True))
    elif text.startswith("{"):
        with contextlib.suppress(ValueError):
            document = json.loads(text)
            for name, value in document.items() if isinstance(document, dict) else ():
                credential = _CREDENTIAL_NAME.search(str(name)) or re.search(
                    r"(?i)hook|pass|pwd|dsn", str(name)
                )
                if isinstance(value, str) and credential and len(value.strip()) >= 8:
                    parts += _parts(value)
    return list(dict.fromkeys((part, every) for part, every in parts if len(part) >= 4))


def _escaped(secret: str) -> list[str]:
    """``secret`` as it is and JSON-escaped once, twice, three times (a JSON document holding it, as text inside
    JSON), with `/` escaped, with Go's escaping of `<`, `>`, `&`, and with `\\u` escapes in upper-case hex
    (`\\u00FC`: Java's, .NET's); and JSON-escaped with its characters as they are (no `\\u` escape)."""
    forms = [
        json.dumps(secret, ensure_ascii=False)[1:-1]
    ]  # (a JSON encoder that writes characters as they are)
    escaped = secret
    for _ in range(4):
        forms += [escaped, escaped.replace("/", "\\/")]
        forms += [escaped.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")]
        forms.append(re.sub(r"\\u[0-9a-f]{4}", lambda m: m.group(0).upper().replace("\\U", "\\u"), escaped))
        escaped = json.dumps(escaped)[1:-1]
    return forms


def _encodings(secret: str) -> list[str]:
    """The forms a secret may come back in: _escaped's; percent-encoded as Python, JavaScript's
    encodeURIComponent and a form do, in upper and lower case hex (a path's `/` kept or not), and twice;
    HTML-escaped (a quote as `&#x27;`, `&#39;` or `&#039;`);
    and in base64 (standard and URL-safe), at any offset in the encoded text (an HTTP Basic header's
    `user:secret`). A value read from a non-UTF-8 environment (lone surrogates) is encoded as the bytes a
    program sends."""
    forms = _escaped(secret)
    for safe in ("", "/", "!*'()"):
        encoded = urllib.parse.quote(secret, safe=safe, errors="surrogateescape")
        forms += [encoded, re.sub(r"%[0-9A-F]{2}", lambda m: m.group(0).lower(), encoded)]
    plus = urllib.parse.quote_plus(secret, errors="surrogateescape")
    forms += [plus, re.sub(r"%[0-9A-F]{2}", lambda m: m.group(0).lower(), plus)]
    # (A quote as HTML escapers other than Python's write it: `&#39;` (Go, Ruby), `&#039;` (PHP).)
    forms += [html.escape(secret), html.escape(secret, quote=False)]
    forms += [html.escape(secret).replace("&#x27;", quote) for quote in ("&#39;", "&#039;")]
    # (Percent-encoded twice: a URL carried as a query value of another.)
    forms.append(urllib.parse.quote(urllib.parse.quote(secret, safe="", errors="surrogateescape"), safe=""))
    raw = secret.encode("utf-8", errors="surrogateescape")
    if len(raw) >= 6:
        for offset, dropped in ((0, 0), (1, 2), (2, 3)):  # (characters that hold bits of what comes before)
            data = b"\0" * offset + raw
            core = base64.b64encode(data[: len(data) // 3 * 3]).decode()[dropped:]
            if len(core) >= 8:
                forms += [core, core.replace("+", "-").replace("/", "_")]
    return list(dict.fromkeys(form for form in forms if len(form) >= 4))


def _scrubbed(value: Any, forms: list[tuple[str, str]]) -> Any:
    if isinstance(value, str):
        for text, replacement in forms:
            if text in value:
                value = value.replace(text, replacement)
        return value
    if isinstance(value, dict):
        return {_scrubbed(k, forms): _scrubbed(v, forms) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_scrubbed(v, forms) for v in value]
    return value


# Every ${NAME} value resolved in this process, by name: what scrub() and the log filter hide.
KNOWN_SECRETS: dict[str, str] = {}


# Query values that are credentials whatever their source (a URL in a log line or an error), after ?, &, ; or
# a fragment's #: a name ending in secret, password, signature or credential (client_secret,
# X-Amz-Signature), or key, token, auth or sig alone or after a credential's prefix (api_key, refresh_token,
# X-Amz-Security-Token; not sort_key, monkey or pageToken); and a URL's password (review s30).
# (A name with secret, password or credential in it, or ending in key, token, auth or sig, but for those that
# name no credential: sort_key, pageToken, monkey. Missing a key leaks it; hiding a cursor costs little.)
def _credential_names(end: str) -> str:
    """The credential names as a pattern, ``end`` the pattern that ends a name (`$`, or `=` in a query)."""
    ordinary = r"(?:(?:sort|page|next|continuation|cursor|partition|idempotency|cache|foreign)[_-]?(?:key|token)|monkey|donkey|turkey|hockey)"
    # (The first alternative looks ahead for its word, then takes the name whole without going back: written
    # as a search from every start it took seconds on a line of `secretsecret...`, review s30.)
    return (
        rf"(?:(?=[\w.-]*(?:secret|passw(?:or)?d|credential|signature))[\w.-]*+(?={end})|"
        rf"(?![\w.-]*{ordinary}{end})[\w.-]*(?:key|token|auth|sig)(?={end}))"
    )


_CREDENTIAL_NAME = re.compile(rf"(?i)^{_credential_names('$')}")
_CREDENTIAL_QUERY = re.compile(rf"(?i)([?&;#]{_credential_names('=')}=)[^&#\s'\"]+")
# (A port is no password: `http://host:8080?email=a@b` kept; `postgresql://app:S3cr#t@db` and `:2024#Winter@`
# hidden. A scheme starts after no scheme character: `\b` let a match start at every `-` of `a-a-a...`,
# seconds on a 64 kB line, review s30.)
_URL_PASSWORD = re.compile(
    r"(?i)((?<![a-z0-9+.-])[a-z][a-z0-9+.-]*://[^/\s:@'\"]*:)(?!\d+(?:[/\s]|$))(?!\d+[?#][^@\s'\"]*=)"
    r"[^/\s@'\"]+(@)"
)


def remember_secrets(secrets: dict[str, str]) -> None:
    """Add resolved secret values to what this process scrubs from results, errors and logs."""
    KNOWN_SECRETS.update({k: v for k, v in secrets.items() if len(v) >= 4})


# What pydantic quotes of a value it refused: `input_value=` and the value's repr (one line: repr escapes newlines),
# then `, input_type=...]`. The repr is cut (head ... tail) before Kiwi sees the text, so a secret in it is no
# longer whole where it is scrubbed: the MCP SDK's HTTP transport puts such a message in the error it raises for a
# malformed answer (hostile review s39: a reflected header's head and tail rebuilt the token). Never shown.
_PYDANTIC_INPUT = re.compile(r"input_value=[^\n]*")


def shown_value(value: Any) -> str:
    """``value`` for an error message: scrubbed of secrets, then cut (cut first, a token it split was no longer
    whole where the message was scrubbed: review s30)."""
    text = scrub_text(repr(scrub(value)))  # (scrubbed before repr too: it escapes a quote in a secret)
    return text if len(text) <= 200 else text[:200] + "..."


def scrub_text(text: str) -> str:
    """``text`` without known secret values, without credential query values (``?api_key=...``) and without the
    values pydantic's messages quote (cut, so no longer whole secrets)."""
    if "input_value=" in text:
        text = _PYDANTIC_INPUT.sub("input_value not shown]", text)
    if KNOWN_SECRETS:
        text = _scrubbed(text, _secret_forms(KNOWN_SECRETS))
    return _URL_PASSWORD.sub(r"\1[redacted]\2", _CREDENTIAL_QUERY.sub(r"\1[redacted]", text))


class SecretLogFilter(logging.Filter):
    """Scrubs every log record of known secret values and credential query values, in place.

    Installed by :func:`install_log_scrubber` as part of the process's log-record factory, so every
    logger (Kiwi's, Temporal's activity and worker loggers, httpx, the MCP SDK) and every handler
    sees the scrubbed text, including the traceback of ``logger.exception``.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a record whose args do not format is left for logging to report
            # (Which prints them as they are: scrubbed first, review s30.)
            record.msg = scrub_text(str(record.msg))
            if isinstance(record.args, tuple):
                record.args = tuple(_shown_arg(arg) for arg in record.args)
            elif isinstance(record.args, dict):
                record.args = {key: _shown_arg(arg) for key, arg in record.args.items()}
            return True
        record.msg, record.args = scrub_text(message), None
        if record.exc_info and not record.exc_text:
            record.exc_text = scrub_text(logging.Formatter().formatException(record.exc_info))
        elif record.exc_text:
            record.exc_text = scrub_text(record.exc_text)
        return True


def _shown_arg(arg: Any) -> str:
    try:
        return scrub_text(repr(arg))
    except Exception:  # noqa: BLE001 - an argument that cannot be shown is named so, never raised to the logger
        return "<unprintable>"


_SCRUBBER = SecretLogFilter()


def install_log_scrubber() -> None:
    """Scrub every log record this process creates from now on (idempotent)."""
    factory = logging.getLogRecordFactory()
    if getattr(factory, "kiwi_scrubs", False):
        return

    def scrubbed(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = factory(*args, **kwargs)
        _SCRUBBER.filter(record)
        return record

    scrubbed.kiwi_scrubs = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(scrubbed)


def _root(exc: BaseException) -> BaseException:
    """The first failure inside task groups."""
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return exc


def _describe(exc: BaseException, server: str, exited: int | None = None) -> str:
    """Why a server is unavailable, from what ended its connection (the first failure inside task groups);
    ``exited``: the exit code of its process, when it ended before the connection was made."""
    exc = _root(exc)
    if isinstance(exc, ValidationError):
        # (Pydantic quotes the value it refused shortened, head and tail, before Kiwi could scrub it: review s30.)
        return scrub_text(
            f"MCP server '{server}' is unavailable: its answer is malformed: {_validation_text(exc)}"
        )
    if exited is not None:
        return scrub_text(
            f"MCP server '{server}' exited at start (exit code {exited}): {type(exc).__name__}: {exc}; its stderr "
            "says why (in the output of what started it: `kiwi dev`, `kiwi worker`, `kiwi doctor`)"
        )
    if isinstance(exc, FileNotFoundError):
        return scrub_text(f"MCP server '{server}' could not start: {exc.filename or exc} not found")
    return scrub_text(f"MCP server '{server}' is unavailable: {type(exc).__name__}: {exc}")


def _errlog() -> Any:
    """Where stdio servers' stderr goes: one pipe per process, whose lines a thread copies to this process's
    stderr (file descriptor 2) scrubbed of secret values. A server may print what it was started with (a
    token in its environment, a URL with a key) to stderr, and the worker's log is no place for it."""
    global _SERVER_STDERR
    with _SERVER_STDERR_LOCK:
        if _SERVER_STDERR is None:
            read_fd, write_fd = os.pipe()
            threading.Thread(
                target=_copy_scrubbed, args=(read_fd,), name="kiwi-mcp-stderr", daemon=True
            ).start()
            _SERVER_STDERR = os.fdopen(write_fd, "w", buffering=1, encoding="utf-8", errors="replace")
        return _SERVER_STDERR


_SERVER_STDERR: Any = None
_SERVER_STDERR_LOCK = threading.Lock()
# Where the scrubbed lines go instead of file descriptor 2, when set (see divert_server_stderr).
_STDERR_SINK: Callable[[str], None] | None = None


def divert_server_stderr(sink: Callable[[str], None] | None) -> None:
    """Hand stdio servers' stderr lines (scrubbed) to ``sink`` instead of this process's stderr; None puts
    them back. `kiwi doctor` shows a server's lines only with its failed check (trial F36: they were mixed
    into its report)."""
    global _STDERR_SINK
    _STDERR_SINK = sink


def _copy_scrubbed(read_fd: int) -> None:
    carry = b""
    with os.fdopen(read_fd, "rb") as source:
        # A line at most 64 kB at a time: a server writing without newlines cannot fill this process's memory.
        # The end of a piece cut short is held back for the next, so a secret the cut splits is scrubbed
        # whole (review s30), and a character's bytes are not split.
        while line := source.readline(65_536):
            data = carry + line
            carry = b""
            if not data.endswith(b"\n"):
                cut = _safe_cut(data)
                data, carry = data[:cut], data[cut:]
            if data:
                _emit(scrub_text(data.decode("utf-8", errors="replace")))
        if carry:
            _emit(scrub_text(carry.decode("utf-8", errors="replace")))


def _safe_cut(data: bytes) -> int:
    """Where to cut ``data``, a piece of a line cut short: before the end by the longest form of a known secret
    (a secret that begins there may go on in the next piece), then after a blank or a quote (where no
    credential a pattern finds goes on: `?sig=...` split there was shown in two halves, review s30), then
    back to the start of any form the cut would split (review s30: a token across the cut was printed in two
    halves), then back to a character's first byte."""
    forms = (
        [f.encode("utf-8", errors="replace") for f, _ in _secret_forms(KNOWN_SECRETS)]
        if KNOWN_SECRETS
        else []
    )
    cut = max(len(data) - max((len(f) for f in forms), default=0), 0)
    blank = max(data.rfind(c, max(cut - 4096, 0), cut) for c in (b" ", b"\t", b"'", b'"'))
    if blank >= 0:
        cut = blank + 1
    # (Never further back than twice the longest form and the blank's reach: a secret that repeats itself,
    # `abcabc...` without a newline, walked the cut back to 0 and held the whole stream, review s30.)
    floor = max(len(data) - 2 * max((len(f) for f in forms), default=0) - 4096, 0)
    moved = True
    while moved:
        moved = False
        for form in forms:
            start = data.find(form, max(cut - len(form) + 1, 0), cut + len(form) - 1)
            if floor <= start < cut:
                cut, moved = start, True
    while 0 < cut < len(data) and data[cut] & 0xC0 == 0x80:
        cut -= 1
    return cut


def _emit(text: str) -> None:
    sink = _STDERR_SINK
    if sink is not None:
        sink(text)
        return
    with contextlib.suppress(OSError):
        os.write(2, text.encode("utf-8", errors="replace"))
