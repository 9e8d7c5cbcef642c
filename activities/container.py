"""docker tools: one command in a container, through the Docker-compatible CLI (Podman or Docker).

The container gets no network, a read-only root, no capabilities, no new privileges, CPU, memory,
process and file limits, the tool's own folder read-only at ``/tool``, and only the project paths its
manifest mounts that the run grants (checked here with symlinks resolved, before anything starts, and
handed over as a private copy, never mounted by name: see ``activities/staging.py``). The
image must exist locally; nothing is pulled. At the timeout Kiwi kills it (the engine's own --timeout is a
backstop for a worker that died), and Kiwi removes it whatever happened, after reading its logs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.diskchecks import _parse_output, _real_relative
from activities.process import ProcessResult, run_process
from activities.staging import Staged, remove, stage_in, write_back
from kiwi.containertools import ContainerExecutor, read_container_executor
from kiwi.contracts import ContainerToolRequest
from kiwi.errors import CommandNotFound, PermissionDenied, ToolFailed, ToolTimeout
from kiwi.globs import glob_covered, glob_match
from kiwi.protected import granted as protected_granted
from kiwi.protected import protected_root
from kiwi.searchpath import search_path

# Podman as root on these hosts needs runc and explicit limits (the default rlimits cannot be set).
LIMITS = ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024", "--pids-limit", "256"]
# After the activity's own deadline: how long the engine CLI may take to end once its container is
# killed, and the engine's --timeout backstop for a container whose worker died mid-call.
KILL_GRACE_SECONDS = 30
BACKSTOP_SECONDS = 60
# Every container Kiwi starts carries this label. One whose worker died mid-call (the activity then runs
# again elsewhere) is left stopped; stopped ones older than STALE (far past the longest call: a 3,600 s
# timeout, the backstop, the grace) are removed, at most once per PRUNE_EVERY seconds per worker.
LABEL = "kiwi.docker-tool=1"
STALE = "2h"
PRUNE_EVERY = 600.0
_last_prune = [float("-inf")]


async def prune_abandoned(engine: list[str], cwd: str) -> None:
    """Remove Kiwi's stopped containers older than ``STALE`` (never a running one, never another's)."""
    now = asyncio.get_running_loop().time()
    if now - _last_prune[0] < PRUNE_EVERY:
        return
    _last_prune[0] = now
    await _engine(
        engine,
        "container",
        "prune",
        "-f",
        "--filter",
        f"label={LABEL}",
        "--filter",
        f"until={STALE}",
        cwd=cwd,
    )


def container_engine() -> list[str] | None:
    """The engine's command: ``KIWI_CONTAINER_ENGINE``, else podman, else docker (None: neither)."""
    # (Found on a PATH with no folder of a Kiwi project: the agent's `.venv/bin/podman` ran, review s32 round 6.)
    path = search_path(os.environ.get("PATH", os.defpath))
    chosen = (
        os.environ.get("KIWI_CONTAINER_ENGINE")
        or shutil.which("podman", path=path)
        or shutil.which("docker", path=path)
    )
    if not chosen or not shutil.which(chosen, path=path):
        return None
    engine = [shutil.which(chosen, path=path) or chosen]
    if (
        Path(engine[0]).name == "podman"
        and not shutil.which("crun", path=path)
        and shutil.which("runc", path=path)
    ):
        engine += ["--runtime", "runc"]
    return engine


class ContainerToolActivities:
    @activity.defn(name="run_container_tool")
    async def run_container_tool(self, req: ContainerToolRequest) -> Any:
        tool = req.tool
        try:
            executor = read_container_executor(tool.executor)
        except ValueError as exc:
            raise ToolFailed.error(f"docker tool '{tool.tool_id}' has a broken manifest: {exc}") from None
        engine = container_engine()
        if engine is None:
            raise CommandNotFound.error(
                f"docker tool '{tool.tool_id}' needs a container engine, and the worker has none",
                {"hint": "install podman (or docker) where the worker runs, or set KIWI_CONTAINER_ENGINE"},
            )
        checked = _mounts(req, executor)
        await prune_abandoned(engine, req.project_root)
        staged: list[tuple[Staged, str, bool]] = []
        try:
            for real, target, write in checked:
                what = f"docker tool '{tool.tool_id}': mount '{real}'"
                staged.append(
                    (await asyncio.to_thread(stage_in, req.project_root, real, what), target, write)
                )
            return await self._run(req, executor, engine, staged)
        finally:
            for copy, _, _ in staged:
                await asyncio.to_thread(remove, copy)

    async def _run(
        self,
        req: ContainerToolRequest,
        executor: ContainerExecutor,
        engine: list[str],
        staged: list[tuple[Staged, str, bool]],
    ) -> Any:
        tool = req.tool
        mounts = [f"{copy.path}:{target}:{'rw' if write else 'ro'}" for copy, target, write in staged]
        name = f"kiwi-{tool.tool_id[:40]}-{uuid.uuid4().hex[:12]}"
        argv = [
            *engine,
            # No --rm: the container is kept until its logs are read, then removed (finally, below).
            "run",
            "-i",
            "--name",
            name,
            "--label",
            LABEL,
            "--pull",
            "never",
            "--network",
            "none",
            "--read-only",
            "--cap-drop",
            "all",
            "--security-opt",
            "no-new-privileges",
            "--cpus",
            f"{executor.cpus:g}",
            "--memory",
            executor.memory,
            *LIMITS,
            # A backstop for a worker that dies mid-call: the activity stops the container at its own
            # deadline (below), well before this.
            "--timeout",
            str(max(1, int(executor.timeout)) + BACKSTOP_SECONDS),
            "--workdir",
            executor.workdir,
            "--volume",
            f"{Path(tool.entrypoint).parent}:/tool:ro",
            *[arg for mount in mounts for arg in ("--volume", mount)],
            *[
                arg
                for key, value in req.params.items()
                for arg in (
                    "--env",
                    f"KIWI_PARAM_{key.upper()}={value if isinstance(value, str) else json.dumps(value)}",
                )
            ],
            "--",
            executor.image,
            *executor.command,
        ]
        try:
            result, timed_out = await _run_until_deadline(argv, engine, name, req, executor.timeout)
            if result is not None and not timed_out:
                result = await _with_logs(engine, name, req, result)
        finally:
            # Whatever happened to the CLI, the container does not outlive the call.
            await _engine(engine, "rm", "-f", "--ignore", name, cwd=req.project_root)
        if timed_out:
            # Decided by who stopped it (this activity, at its deadline), never guessed from an exit code.
            raise ToolTimeout.error(f"docker tool '{tool.tool_id}' timed out after {executor.timeout:g}s")
        assert result is not None
        if result.exit_code == 0:
            # The container is gone: what it left in its writable mounts goes back to the project.
            for copy, _, write in staged:
                if write:
                    what = f"docker tool '{tool.tool_id}': mount '{copy.rel}'"
                    await asyncio.to_thread(
                        write_back, req.project_root, copy, req.write_grants, req.deny_fs, what
                    )
        stderr = result.stderr.strip()
        if "image not known" in stderr or "No such image" in stderr:
            raise ToolFailed.error(
                f"docker tool '{tool.tool_id}': image '{executor.image}' is not on this machine; Kiwi never pulls "
                "images",
                {
                    "hint": f"build or load it where the worker runs (e.g. `podman build -t {executor.image} .`)"
                },
            )
        if result.exit_code != 0:
            tail = (stderr or result.stdout).strip().splitlines()[-5:]
            raise ToolFailed.error(
                f"docker tool '{tool.tool_id}' exited with {result.exit_code}: "
                + (" | ".join(tail) or "(no output)")
            )
        if result.truncated:
            raise ToolFailed.error(
                f"docker tool '{tool.tool_id}' printed more than {req.max_output_bytes:,} bytes"
            )
        try:
            return _parse_output(result.stdout)
        except json.JSONDecodeError as exc:
            raise ToolFailed.error(f"docker tool '{tool.tool_id}' printed invalid JSON: {exc}") from None


async def _run_until_deadline(
    argv: list[str], engine: list[str], name: str, req: ContainerToolRequest, timeout: float
) -> tuple[ProcessResult | None, bool]:
    """Run the engine's ``run`` command; at ``timeout`` kill the container ourselves.

    Returns the CLI's result and whether this activity's deadline stopped it. At the deadline the
    container is killed by name (``kill`` also works where the CLI's own process group is not the
    container's) until the CLI has ended; a container not started yet when the first kill is sent
    is killed by the next one. The CLI's own limit (``KILL_GRACE_SECONDS`` later) ends a CLI that
    hangs even so; that is a timeout too.
    """
    run = asyncio.ensure_future(
        run_process(
            argv,
            cwd=req.project_root,
            timeout=timeout + KILL_GRACE_SECONDS,
            max_output=req.max_output_bytes,
            stdin=json.dumps(req.params),
        )
    )
    try:
        done, _ = await asyncio.wait({run}, timeout=timeout)
        if done:
            return run.result(), False
        while not run.done():
            await _engine(engine, "kill", name, cwd=req.project_root)
            await asyncio.wait({run}, timeout=1.0)
        try:
            return run.result(), True
        except ApplicationError as exc:
            if exc.type == ToolTimeout.type:
                return None, True
            raise
    except asyncio.CancelledError:
        run.cancel()  # kills the CLI's process group; the caller removes the container
        raise


async def _with_logs(
    engine: list[str], name: str, req: ContainerToolRequest, result: ProcessResult
) -> ProcessResult:
    """``result`` with each stream completed from the container's logs.

    The engine's CLI passes on only what the container prints once the CLI is attached: a tool that
    prints and exits at once can lose its whole output (seen with Podman 4). The logs hold all of it,
    stdout and stderr apart; where they cannot be read (no container, a logging driver that keeps
    none), the CLI's streams stand.
    """
    try:
        logs = await run_process(
            [*engine, "logs", name], cwd=req.project_root, timeout=60, max_output=req.max_output_bytes
        )
    except ApplicationError:
        return result
    if logs.exit_code != 0:
        return result
    return ProcessResult(
        result.exit_code,
        logs.stdout if len(logs.stdout) > len(result.stdout) else result.stdout,
        logs.stderr if len(logs.stderr) > len(result.stderr) else result.stderr,
        result.truncated or logs.truncated,
    )


async def _engine(engine: list[str], *args: str, cwd: str) -> None:
    """One engine command whose failure is not the call's (kill or remove a container that may be gone)."""
    with contextlib.suppress(ApplicationError):
        await run_process([*engine, *args], cwd=cwd, timeout=60, max_output=10_000)


def _mounts(req: ContainerToolRequest, executor: ContainerExecutor) -> list[tuple[str, str, bool]]:
    """(project path, container path, writable) of the manifest's mounts, each refused unless the run
    grants all of it. The project path is then copied (activities/staging.py), never mounted by name."""
    volumes = []
    for mount in executor.mounts:
        mode = "write" if mount.write else "read"
        real = _real_relative(req.project_root, mount.source)
        if real is None:
            raise PermissionDenied.error(
                f"docker tool '{req.tool.tool_id}': mount '{mount.source}' resolves to a place outside the project"
            )
        if real == ".":
            raise PermissionDenied.error(
                f"docker tool '{req.tool.tool_id}': the whole project cannot be mounted; mount the folders it needs"
            )
        grants = req.write_grants if mount.write else req.read_grants
        whole = f"{real}/**"
        covered = any(
            glob_covered(whole, g)
            or glob_covered(real, g)
            and not os.path.isdir(os.path.join(req.project_root, real))
            for g in grants
        )
        denied = [
            d
            for d in req.deny_fs
            if glob_match(d, real) or glob_covered(d, whole) or d.startswith(real + "/") or d.startswith("**")
        ]
        protected = protected_root(real) is not None and protected_granted(grants, real) is None
        if not covered or denied or protected or (mount.write and _holds_protected(req.project_root, real)):
            raise PermissionDenied.error(
                f"docker tool '{req.tool.tool_id}': this run may not {mode} all of '{real}' (mount {mount.target})"
                + (f"; denied by '{denied[0]}'" if denied else "")
                + f'; add <{mode} resource="filesystem" path="{real}/**"/> to <permissions>'
            )
        volumes.append((real, mount.target, mount.write))
    return volumes


def _holds_protected(root: str, rel: str) -> bool:
    """Whether a folder has a protected place inside (``.git``, ...), which a writable mount would expose."""
    for folder, dirs, files in os.walk(os.path.join(root, rel)):
        for entry in [*dirs, *files]:
            inner = os.path.relpath(os.path.join(folder, entry), root).replace(os.sep, "/")
            if protected_root(inner) is not None:
                return True
    return False
