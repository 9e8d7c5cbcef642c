"""Run a child process the way every Kiwi activity does: no shell, capped output, heartbeats,
a timeout, and cancellation that kills the whole process group."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from dataclasses import dataclass

from temporalio import activity
from temporalio.exceptions import ApplicationError

HEARTBEAT_SECONDS = 2.0


@dataclass
class ProcessResult:
    exit_code: int
    stdout: str
    stderr: str
    truncated: bool


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


async def run_process(argv: list[str], *, cwd: str, timeout: float, max_output: int, stdin: str = "",
                      env: dict[str, str] | None = None) -> ProcessResult:
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, cwd=cwd, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, start_new_session=True, env={**os.environ, **(env or {})})
    except FileNotFoundError:
        raise ApplicationError(f"command not found: {argv[0]}", type="CommandNotFound", non_retryable=True) from None
    except PermissionError:
        raise ApplicationError(f"not executable: {argv[0]}", type="CommandNotFound", non_retryable=True) from None
    communicate = asyncio.ensure_future(proc.communicate(stdin.encode()))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    try:
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                _kill_group(proc)
                await asyncio.shield(communicate)
                raise ApplicationError(f"{argv[0]} timed out after {timeout:g}s", type="ToolTimeout",
                                       non_retryable=True)
            done, _ = await asyncio.wait({communicate}, timeout=min(HEARTBEAT_SECONDS, remaining))
            if done:
                break
            if activity.in_activity():
                activity.heartbeat()
    except asyncio.CancelledError:
        _kill_group(proc)
        raise
    stdout, stderr = communicate.result()
    truncated = len(stdout) > max_output or len(stderr) > max_output
    return ProcessResult(proc.returncode if proc.returncode is not None else -1,
                         stdout[:max_output].decode("utf-8", "replace"), stderr[:max_output].decode("utf-8", "replace"),
                         truncated)
