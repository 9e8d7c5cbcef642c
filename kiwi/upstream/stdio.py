"""Kiwi's own stdio transport to an MCP server, and a short way for ``tools/call`` over it (#20).

The MCP SDK's client speaks over this transport as over its own ``stdio_client``: the same process set-up
(only the SDK's safe environment plus the registry's ``env``, a session of its own so the whole process
tree can be stopped, stderr to the worker's scrubbed copy) and the same shutdown (stdin closed, a grace
period, then SIGTERM and SIGKILL to the process group). On Linux the server also dies with the process that
started it, and so does what the server started in its process group (``kiwi/lifetime.py``): a worker killed
with ``kill -9`` leaves no server behind, even one stuck in a call that would never read the end of its stdin. Every message reaches the SDK, save one kind: the
answer to a request sent with :meth:`StdioLink.request`. Those are written as one JSON line and their
answers picked out as the line arrives, in the pipe's own callback. The SDK's way (a reader task, memory
streams, a receive loop, a response stream per request, models built and validated at each end) handed
the answer through four tasks, and a proxied call inside a run spent ~0.6 ms more waiting for it than the
same request made by hand.

Only what is plain JSON-RPC goes the short way: ``tools/call`` on a connection that negotiated a
handshake-era protocol (2025-11-25 and before); traced, it makes the SDK client's span and carries its
trace context. Everything else (initialize, listings, 2026-07-28 connections, requests the server sends,
notifications) is the SDK's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TextIO

import anyio
import mcp_types as types
from mcp.client.stdio import get_default_environment
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage
from opentelemetry.propagate import inject
from opentelemetry.trace import SpanKind, StatusCode, get_tracer

from kiwi.lifetime import Launch, keeper_ready, kept, launches
from kiwi.searchpath import search_path

logger = logging.getLogger(__name__)

# After stdin closes, how long the server has to exit before SIGTERM, and then before SIGKILL (the SDK's).
EXIT_GRACE_SECONDS = 2.0
KILL_GRACE_SECONDS = 2.0
# The longest line a server may send (a result of this size is far past what a run holds): a server
# writing without newlines cannot fill the worker's memory.
MAX_LINE_BYTES = 64 * 1024 * 1024
# Lines queued for the SDK before the pipe is paused until it catches up.
SDK_BACKLOG = 64
# Ids of requests sent the short way: integers far above the SDK's own (which count up from 0), so an
# answer is never taken for the other's.
FIRST_ID = 1 << 40

# The MCP SDK's own tracer name: a traced short call's span is the one its client makes.
_TRACER = get_tracer("mcp-python-sdk")

Progress = Callable[[float, float | None, str | None], Awaitable[None]]


class StdioLink(asyncio.SubprocessProtocol):
    """One MCP server process over stdio: the SDK client's transport (:meth:`streams`) and :meth:`request`."""

    def __init__(
        self,
        command: str,
        args: list[str],
        *,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        errlog: TextIO | None = None,
    ) -> None:
        self.command, self.args, self.env, self.cwd, self.errlog = command, args, env, cwd, errlog
        self.pid: int | None = None
        self._transport: asyncio.SubprocessTransport | None = None
        self._buffer = bytearray()
        self._pending: dict[int, tuple[asyncio.Future[dict[str, Any]], Progress | None]] = {}
        self._next_id = FIRST_ID
        self._for_sdk: deque[SessionMessage | Exception | None] = deque()
        self._sdk_waiting = asyncio.Event()
        self._paused = False
        # Cleared while the pipe to the server's stdin holds more than its high-water mark (pause_writing).
        self._writable = asyncio.Event()
        self._writable.set()
        self._closed = False
        self._exited = asyncio.Event()
        self._reports: set[asyncio.Future[None]] = set()
        self._not_started = False  # (the launcher could not execute the server: no exit code of its)

    # ------------------------------------------------------------------ the SDK client's transport
    @contextlib.asynccontextmanager
    async def streams(self) -> AsyncIterator[tuple[Any, Any]]:
        """Start the server and yield ``(read_stream, write_stream)`` for ``mcp.client.Client``; on exit,
        stop the server (stdin closed, then SIGTERM and SIGKILL to its process group, each after a grace)."""
        loop = asyncio.get_running_loop()
        env = get_default_environment() | (self.env or {})
        # (No folder of a Kiwi project on its PATH: the agent's `node_modules/.bin/npx` started, round 6.)
        env["PATH"] = search_path(env.get("PATH", os.defpath))
        # Through the launcher (kiwi/lifetime.py): the server dies with a worker killed by kill -9, and no
        # Python runs between fork and exec in this threaded process.
        launch = Launch(self.command, [self.command, *self.args], env, search=True) if launches() else None
        keeper_ready()
        with launch.spawning() if launch else contextlib.nullcontext():
            await loop.subprocess_exec(
                lambda: self,
                *(launch.argv if launch else [self.command, *self.args]),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=self.errlog,
                env=launch.env if launch else env,
                cwd=self.cwd,
                start_new_session=True,
                pass_fds=launch.fds if launch else (),
            )
        to_sdk, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
        write_stream, from_sdk = anyio.create_memory_object_stream[SessionMessage](0)
        try:
            # (What the server starts in its group, behind npx or uv run, dies with it and with the worker.)
            async with kept(self.pid) if self.pid else contextlib.nullcontext():
                if launch is not None:
                    await self._started(launch)
                async with anyio.create_task_group() as tasks:
                    tasks.start_soon(self._deliver, to_sdk)
                    tasks.start_soon(self._write_sdk, from_sdk)
                    try:
                        yield read_stream, write_stream
                    finally:
                        with anyio.CancelScope(shield=True):
                            await self.stop()
                        tasks.cancel_scope.cancel()
        finally:
            for stream in (read_stream, write_stream, to_sdk, from_sdk):
                await stream.aclose()

    async def _started(self, launch: Launch) -> None:
        """Wait until the launcher has executed the server; if it could not (no such program: the
        FileNotFoundError a direct start raises), the launcher is reaped and its pipes closed."""
        try:
            await launch.started()
        except BaseException:
            self._not_started = True
            if self.pid:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.pid, signal.SIGKILL)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(KILL_GRACE_SECONDS):
                    await self._exited.wait()
            if self._transport is not None:
                self._transport.close()
            raise

    async def _deliver(self, to_sdk: Any) -> None:
        """Hand the SDK what the server sent it, in order; its end of the stream closes with the pipe."""
        async with to_sdk:
            while True:
                while not self._for_sdk:
                    self._sdk_waiting.clear()
                    await self._sdk_waiting.wait()
                item = self._for_sdk.popleft()
                if item is None:
                    return
                if self._paused and len(self._for_sdk) < SDK_BACKLOG // 4:
                    self._paused = False
                    self._pipe(1, "resume_reading")
                try:
                    await to_sdk.send(item)
                except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                    return

    async def _write_sdk(self, from_sdk: Any) -> None:
        async with from_sdk:
            async for message in from_sdk:
                text = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                await self._drained()
                if not self._write(text.encode() + b"\n"):
                    break
        # stdin is gone (or the SDK closed its end): the session sees the connection end.
        self._for_sdk.append(None)
        self._sdk_waiting.set()

    # ------------------------------------------------------------------ the short way
    async def request(
        self,
        method: str,
        params: dict[str, Any],
        *,
        timeout: float | None,
        progress: Progress | None = None,
        traced: bool = False,
    ) -> dict[str, Any]:
        """Send one request and answer its result. Raises what the SDK raises: MCPError with the server's
        error, with REQUEST_TIMEOUT after ``timeout`` seconds (a ``notifications/cancelled`` is sent), with
        CONNECTION_CLOSED when the server's output ends. ``traced``: in the SDK's client span (``MCP send
        METHOD NAME``), its trace context in the request's ``_meta``, as the SDK's own request is."""
        if self._closed:
            raise MCPError(code=types.CONNECTION_CLOSED, message="Connection closed")
        self._next_id += 1
        request_id = self._next_id
        if progress is not None:
            params = {**params, "_meta": {**(params.get("_meta") or {}), "progressToken": request_id}}
        if not traced:
            answer = await self._exchange(request_id, method, params, timeout, progress)
        else:
            target = params.get("name")
            with _TRACER.start_as_current_span(
                f"MCP send {method}{f' {target}' if isinstance(target, str) else ''}",
                kind=SpanKind.CLIENT,
                attributes={"mcp.method.name": method, "jsonrpc.request.id": str(request_id)},
            ) as span:
                meta = dict(params.get("_meta") or {})
                inject(meta)
                if meta:
                    params = {**params, "_meta": meta}
                answer = await self._exchange(request_id, method, params, timeout, progress)
                error = answer.get("error")
                if isinstance(error, dict):
                    code = str(error.get("code"))
                    span.set_attributes({"error.type": code, "rpc.response.status_code": code})
                    from kiwi.upstream.pool import scrub_text  # (pool imports this module)

                    span.set_status(StatusCode.ERROR, scrub_text(str(error.get("message", ""))))
        error = answer.get("error")
        if error is not None:
            if not isinstance(error, dict):
                raise MCPError(code=types.INTERNAL_ERROR, message=f"malformed error answer: {_shown(error)}")
            code = error.get("code")
            # A code that is no integer (a string, null, a list) is an error answer all the same: that call
            # fails, and the connection, which carried it, stays (int() of it raised, and the pool dropped it).
            raise MCPError(
                code=code if type(code) is int else types.INTERNAL_ERROR,
                message=str(error.get("message", "")),
                data=error.get("data"),
            )
        result = answer.get("result")
        if not isinstance(result, dict):
            raise MCPError(code=types.INTERNAL_ERROR, message=f"malformed result: {_shown(result)}")
        return result

    async def _exchange(
        self,
        request_id: int,
        method: str,
        params: dict[str, Any],
        timeout: float | None,
        progress: Progress | None,
    ) -> dict[str, Any]:
        """Write the request line and wait for its answer (the whole JSON-RPC message)."""
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = (future, progress)
        written = False
        try:
            line = json.dumps({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
            try:
                async with asyncio.timeout(timeout):
                    # As the SDK's client awaits its write: a server that stops reading its input makes the
                    # call wait (within its timeout), not the worker hold every line it is sent.
                    await self._drained()
                    if not self._write(line.encode() + b"\n"):
                        raise MCPError(code=types.CONNECTION_CLOSED, message="Connection closed")
                    written = True
                    return await future
            except TimeoutError:
                if written:
                    self._cancel(request_id, f"timed out after {timeout:g}s")
                raise MCPError(code=types.REQUEST_TIMEOUT, message=f"Request {method!r} timed out") from None
            except asyncio.CancelledError:
                if written:
                    self._cancel(request_id, "caller cancelled")
                raise
        finally:
            self._pending.pop(request_id, None)

    def _cancel(self, request_id: int, reason: str) -> None:
        self._write(
            json.dumps(
                {
                    "jsonrpc": "2.0",
                    "method": "notifications/cancelled",
                    "params": {"requestId": request_id, "reason": reason},
                }
            ).encode()
            + b"\n"
        )

    async def _drained(self) -> None:
        """Wait until the pipe to the server's stdin is below its high-water mark (or gone)."""
        while not self._writable.is_set() and not self._closed:
            await self._writable.wait()

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    def _write(self, data: bytes) -> bool:
        """Queue ``data`` on the server's stdin (one write: lines never interleave). False once it is gone."""
        pipe = self._transport.get_pipe_transport(0) if self._transport is not None else None
        if self._closed or pipe is None or pipe.is_closing():
            return False
        try:
            pipe.write(data)
        except (OSError, RuntimeError):
            return False
        return True

    # ------------------------------------------------------------------ asyncio.SubprocessProtocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        self.pid = self._transport.get_pid()  # type: ignore[union-attr]

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        if fd != 1:
            return
        self._buffer += data
        lines = []
        start = 0
        while (end := self._buffer.find(b"\n", start)) >= 0:
            lines.append(bytes(self._buffer[start:end]))
            start = end + 1
        # Out of the buffer before they are read: a line that raises is never read again with the next chunk.
        del self._buffer[:start]
        for line in lines:
            self._line(line)
        if len(self._buffer) > MAX_LINE_BYTES:
            logger.warning(
                "MCP server (pid %s) sent a line of over %d bytes; closing it", self.pid, MAX_LINE_BYTES
            )
            self._buffer.clear()
            self._end()
            if self._transport is not None:
                self._transport.get_pipe_transport(0).close()  # type: ignore[union-attr]

    def _line(self, line: bytes) -> None:
        if not line.strip():
            return
        try:
            message = json.loads(line)
        except (ValueError, RecursionError):  # (nested past the recursion limit: not JSON-RPC either)
            message = None
        if isinstance(message, dict):
            request_id = _request_id(message.get("id"))
            if "method" not in message and request_id is not None and request_id in self._pending:
                future = self._pending[request_id][0]
                if not future.done():
                    future.set_result(message)
                return
            if message.get("method") == "notifications/progress":
                params = message.get("params")
                token = _request_id(params.get("progressToken")) if isinstance(params, dict) else None
                if token is not None and token > FIRST_ID:
                    waiting = self._pending.get(token)
                    if waiting is not None and waiting[1] is not None:
                        # A task per report, started in order (the callbacks Kiwi passes do not wait on anything),
                        # held until it ends: the loop keeps only a weak reference to a task.
                        task = asyncio.ensure_future(_report(waiting[1], params))
                        self._reports.add(task)
                        task.add_done_callback(self._reports.discard)
                    return
            if request_id is not None and request_id > FIRST_ID and "method" not in message:
                return  # the late answer of a request given up on: nobody waits for it
        try:
            item: SessionMessage | Exception = SessionMessage(
                types.jsonrpc_message_adapter.validate_json(line, by_name=False)
            )
        except ValueError as exc:
            logger.warning("MCP server (pid %s) sent a line that is not JSON-RPC", self.pid)
            item = exc
        self._for_sdk.append(item)
        self._sdk_waiting.set()
        if len(self._for_sdk) >= SDK_BACKLOG and not self._paused:
            self._paused = True
            self._pipe(1, "pause_reading")

    def _pipe(self, fd: int, action: str) -> None:
        pipe = self._transport.get_pipe_transport(fd) if self._transport is not None else None
        if pipe is not None:
            with contextlib.suppress(RuntimeError, AttributeError):
                getattr(pipe, action)()

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        if fd == 1:
            self._end()
        elif fd == 0:
            self._writable.set()  # nothing waits to write to a pipe that is gone

    def process_exited(self) -> None:
        self._exited.set()

    async def exit_code(self, within: float = 1.0) -> int | None:
        """The server process's exit code once it has exited (waiting ``within`` seconds for it: a process
        whose output ended is reaped a moment later), else None."""
        if self._transport is None or self._not_started:
            return None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(within):
                await self._exited.wait()
        return self._transport.get_returncode()

    def _end(self) -> None:
        """The server's output ended: every request waiting the short way fails, and the SDK sees the end."""
        if self._closed:
            return
        self._closed = True
        self._writable.set()
        for future, _ in self._pending.values():
            if not future.done():
                future.set_exception(MCPError(code=types.CONNECTION_CLOSED, message="Connection closed"))
        self._for_sdk.append(None)
        self._sdk_waiting.set()

    async def stop(self) -> None:
        """Close stdin; SIGTERM the process group after EXIT_GRACE_SECONDS, SIGKILL after KILL_GRACE_SECONDS."""
        transport = self._transport
        if transport is None:
            return
        self._end()
        with contextlib.suppress(Exception):
            transport.get_pipe_transport(0).close()  # type: ignore[union-attr]
        for sig, grace in (
            (None, EXIT_GRACE_SECONDS),
            (signal.SIGTERM, KILL_GRACE_SECONDS),
            (signal.SIGKILL, 2.0),
        ):
            if sig is not None and self.pid is not None:
                # The server leads its own session: its children get the signal with it.
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.pid, sig)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(grace):
                    await self._exited.wait()
            if self._exited.is_set():
                break
        if not self._exited.is_set():
            logger.warning("MCP server process %s is still alive after SIGKILL; abandoning it", self.pid)
        transport.close()


def _request_id(value: Any) -> int | None:
    """An answer's id or a progress token as an id of ours: an integer, or one echoed as a string (\"7\"),
    which the SDK correlates too (``coerce_request_id``, as the TypeScript SDK); anything else is no id of ours."""
    if type(value) is int:
        return value
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            return int(value)
    return None


async def _report(progress: Progress, params: dict[str, Any]) -> None:
    with contextlib.suppress(Exception):
        value = params.get("progress")
        total = params.get("total")
        message = params.get("message")
        await progress(
            float(value) if isinstance(value, int | float) else 0.0,
            float(total) if isinstance(total, int | float) else None,
            message if isinstance(message, str) else None,
        )


def _shown(value: Any) -> str:
    from kiwi.upstream.pool import shown_value  # (pool imports this module)

    return shown_value(value)
