"""docker tools: one command in a container, through the Docker-compatible CLI (Podman or Docker).

The container gets no network, a read-only root, no capabilities, no new privileges, CPU, memory,
process and file limits, the tool's own folder read-only at ``/tool``, and only the project paths its
manifest mounts that the run grants (checked here with symlinks resolved, before anything starts). The
image must exist locally; nothing is pulled. At the timeout the engine kills it, and Kiwi removes it.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

from temporalio import activity

from activities.commands import _parse_output, _real_relative
from activities.process import run_process
from kiwi.containertools import ContainerExecutor, read_container_executor
from kiwi.contracts import ContainerToolRequest
from kiwi.errors import CommandNotFound, PermissionDenied, ToolFailed, ToolTimeout
from kiwi.globs import glob_covered, glob_match
from kiwi.protected import granted as protected_granted
from kiwi.protected import protected_root

# Podman as root on these hosts needs runc and explicit limits (the default rlimits cannot be set).
LIMITS = ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024", "--pids-limit", "256"]


def container_engine() -> list[str] | None:
    """The engine's command: ``KIWI_CONTAINER_ENGINE``, else podman, else docker (None: neither)."""
    chosen = os.environ.get("KIWI_CONTAINER_ENGINE") or shutil.which("podman") or shutil.which("docker")
    if not chosen or not shutil.which(chosen):
        return None
    engine = [shutil.which(chosen) or chosen]
    if Path(engine[0]).name == "podman" and not shutil.which("crun") and shutil.which("runc"):
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
        mounts = _mounts(req, executor)
        name = f"kiwi-{tool.tool_id[:40]}-{uuid.uuid4().hex[:12]}"
        argv = [
            *engine,
            "run",
            "--rm",
            "-i",
            "--name",
            name,
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
            "--timeout",
            str(max(1, int(executor.timeout))),
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
        started = time.monotonic()
        try:
            result = await run_process(
                argv,
                cwd=req.project_root,
                timeout=executor.timeout + 15,
                max_output=req.max_output_bytes,
                stdin=json.dumps(req.params),
            )
        finally:
            # Whatever happened to the CLI, the container does not outlive the call.
            await run_process(
                [*engine, "rm", "-f", "--ignore", name], cwd=req.project_root, timeout=60, max_output=10_000
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
        if result.exit_code != 0 and time.monotonic() - started >= executor.timeout:
            # The engine's --timeout killed it (exit 255 or 137, and no message of its own).
            raise ToolTimeout.error(f"docker tool '{tool.tool_id}' timed out after {executor.timeout:g}s")
        if result.exit_code != 0:
            tail = (stderr or result.stdout).strip().splitlines()[-5:]
            raise ToolFailed.error(
                f"docker tool '{tool.tool_id}' exited with {result.exit_code}: " + " | ".join(tail)
            )
        if result.truncated:
            raise ToolFailed.error(
                f"docker tool '{tool.tool_id}' printed more than {req.max_output_bytes:,} bytes"
            )
        try:
            return _parse_output(result.stdout)
        except json.JSONDecodeError as exc:
            raise ToolFailed.error(f"docker tool '{tool.tool_id}' printed invalid JSON: {exc}") from None


def _mounts(req: ContainerToolRequest, executor: ContainerExecutor) -> list[str]:
    """``--volume`` values for the manifest's mounts, each refused unless the run grants all of it."""
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
        volumes.append(
            f"{os.path.join(os.path.realpath(req.project_root), real)}:{mount.target}:{'rw' if mount.write else 'ro'}"
        )
    return volumes


def _holds_protected(root: str, rel: str) -> bool:
    """Whether a folder has a protected place inside (``.git``, ...), which a writable mount would expose."""
    for folder, dirs, files in os.walk(os.path.join(root, rel)):
        for entry in [*dirs, *files]:
            inner = os.path.relpath(os.path.join(folder, entry), root).replace(os.sep, "/")
            if protected_root(inner) is not None:
                return True
    return False
