"""Python tools' own environments: a tool's ``requires`` packages installed once into a virtual
environment shared by every tool with the same requirements (keyed by their hash), and ``lib/``.

An environment is built in a temporary folder and renamed into place when pip succeeded, so a
half-built one is never used; a lock file keeps two workers (or two calls) from building it twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

from activities.process import run_process
from kiwi.contracts import LocalToolSpec
from kiwi.devserver import data_dir
from kiwi.errors import ToolFailed
from kiwi.upstream.pool import scrub, scrub_text

BUILD_TIMEOUT = 600.0
READY = ".kiwi-requirements.json"
# What pip needs from the worker's environment to reach the index it is configured for.
_INSTALLER_ENV = (
    "PIP_",
    "UV_",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "no_proxy",
)
_LOCKS: dict[str, asyncio.Lock] = {}


def environments_dir() -> Path:
    """Where tool environments live: ``KIWI_HOME/tool-envs`` (see ``kiwi.devserver.data_dir``)."""
    return data_dir() / "tool-envs"


def requirement_key(packages: list[str]) -> str:
    """The environment's name: the hash of the requirements and of the Python that builds it."""
    what = {"python": f"{sys.implementation.name}-{sys.version_info[0]}.{sys.version_info[1]}"}
    what["packages"] = sorted(p.strip() for p in packages)  # type: ignore[assignment]
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:20]


def lib_folder(entrypoint: str) -> str | None:
    """The ``lib/`` of the tools folder (``.ai/tools/lib`` or ``.ai/scripts/lib``) the tool is in, if any."""
    for parent in Path(entrypoint).parents:
        if parent.name in ("tools", "scripts"):
            lib = parent / "lib"
            return str(lib) if lib.is_dir() else None
    return None


async def tool_python(tool: LocalToolSpec) -> str:
    """The Python that runs ``tool``: the worker's own, or its requirements' environment (built once)."""
    if not tool.required_packages:
        return sys.executable
    key = requirement_key(tool.required_packages)
    target = environments_dir() / key
    python = target / "bin" / "python"
    if (target / READY).is_file():
        return str(python)
    async with _LOCKS.setdefault(key, asyncio.Lock()):
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target.parent / f"{key}.lock", "w") as lock:
            await asyncio.to_thread(fcntl.flock, lock, fcntl.LOCK_EX)
            try:
                if not (target / READY).is_file():
                    await _build(tool, target)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
    return str(python)


async def _build(tool: LocalToolSpec, target: Path) -> None:
    scratch = target.with_name(f"{target.name}.building-{os.getpid()}")
    shutil.rmtree(scratch, ignore_errors=True)
    installer_env = {k: v for k, v in os.environ.items() if k.startswith(_INSTALLER_ENV)}
    try:
        made = await run_process(
            [sys.executable, "-m", "venv", str(scratch)],
            cwd=str(target.parent),
            timeout=120,
            max_output=100_000,
        )
        if made.exit_code != 0:
            raise ToolFailed.error(
                f"tool '{tool.tool_id}': making its environment failed: {_tail(made.stderr)}"
            )
        installed = await run_process(
            [
                str(scratch / "bin" / "python"),
                "-m",
                "pip",
                "install",
                "--disable-pip-version-check",
                "--no-input",
                "--quiet",
                *tool.required_packages,
            ],
            cwd=str(target.parent),
            timeout=BUILD_TIMEOUT,
            max_output=1_000_000,
            env=installer_env,
        )
        if installed.exit_code != 0:
            raise ToolFailed.error(
                f"tool '{tool.tool_id}': installing {', '.join(tool.required_packages)} failed: "
                # (pip's words may hold the index's or the proxy's credentials: review s30.)
                + _tail(scrub_text(scrub(installed.stderr or installed.stdout, installer_env))),
                {"hint": "check requires.packages in its tool.yaml (names and versions pip can find)"},
            )
        (scratch / READY).write_text(json.dumps(sorted(tool.required_packages)))
        os.rename(scratch, target)
    finally:
        with contextlib.suppress(OSError):
            shutil.rmtree(scratch, ignore_errors=True)


def _tail(text: str) -> str:
    return " | ".join(text.strip().splitlines()[-5:]) or "(no output)"
