"""Archives unpacked by the worker (``tar x``, ``unzip``): staged, checked entry by entry against the
run's grants, then moved into the project, within size and count limits."""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
from pathlib import Path
from typing import Any

from activities.diskchecks import _confinement
from activities.process import run_process
from activities.staging import (
    UNPACK_MAX_BYTES,
    UNPACK_MAX_ENTRIES,
    Staged,
    disk_usage,
    remove_tree,
    too_big,
    unpack_back,
)
from kiwi.contracts import CommandRequest
from kiwi.shellpolicy import Unpacking


async def _unpack(req: CommandRequest, unpack: Unpacking, cwd: Path, env: dict[str, str]) -> dict[str, Any]:
    """``tar -x`` or ``unzip`` run into a folder of the worker's own, then what it unpacked copied into the
    project by the worker (see :class:`kiwi.shellpolicy.Unpacking`): every path checked against the run's
    write grants first (nothing is kept if one is not covered), files written through descriptors that never
    follow a link, links left out (and named)."""
    folder = tempfile.mkdtemp(prefix="kiwi-unpack-")
    staged = Staged(rel=unpack.target, path=os.path.join(folder, "into"), is_dir=True)
    try:
        os.mkdir(staged.path, 0o700)
        what = f"{unpack.program} (unpacking into '{unpack.target}')"
        running = asyncio.ensure_future(
            run_process(
                unpack.argv(staged.path),
                cwd=str(cwd),
                project=req.project_root,
                timeout=req.timeout_seconds,
                max_output=req.max_output_bytes,
                stdin=req.stdin,
                env=env,
                confine=_confinement(req, into=staged.path),
            )
        )
        result = await _within_limits(running, staged.path, what)
        _, problems, left_out = await asyncio.to_thread(
            unpack_back, req.project_root, staged, req.write_grants, req.deny_fs, what, keep=unpack.keep
        )
    finally:
        remove_tree(folder)
    # (The worker's own folder is no place of the project: its name is not shown, cut short or whole.)
    stdout, stderr = (_unnamed(text, staged.path, unpack.target) for text in (result.stdout, result.stderr))
    if left_out:
        more = " ..." if len(left_out) > 10 else ""
        shown = ", ".join(f"{unpack.target}/{p}" for p in left_out[:10]) + more
        stderr += (
            f"kiwi: {len(left_out)} link(s) or special file(s) in the archive were not unpacked (Kiwi writes "
            f"no links into the project): {shown}\n"
        )
    for problem in problems[:20]:
        stderr += f"kiwi: {problem}\n"
    # (As tar does with a member it cannot write: the others are unpacked, and the command fails.)
    exit_code = result.exit_code or (2 if problems else 0)
    return {"exit_code": exit_code, "stdout": stdout, "stderr": stderr, "truncated": result.truncated}


async def _within_limits(running: asyncio.Future[Any], folder: str, what: str) -> Any:
    """The unpacking's result, once it ends; stopped (its process group killed) as soon as what it wrote
    passes the limits, so that a small archive cannot fill the worker's disk before they are checked."""
    try:
        while True:
            done, _ = await asyncio.wait({running}, timeout=UNPACK_WATCH_SECONDS)
            if done:
                return running.result()
            used, entries = await asyncio.to_thread(disk_usage, folder)
            if used > UNPACK_MAX_BYTES or entries > UNPACK_MAX_ENTRIES:
                raise too_big(what)
    finally:
        if not running.done():
            running.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await running


# How often an unpacking's folder is measured while the program runs.
UNPACK_WATCH_SECONDS = 0.5


def _unnamed(text: str, path: str, shown: str) -> str:
    """``text`` with ``path`` written as ``shown``, and a start of ``path`` that ends it (output cut at the
    limit) dropped."""
    text = text.replace(path, shown)
    for length in range(len(path) - 1, 4, -1):
        if text.endswith(path[:length]):
            return text[:-length]
    return text
