"""docker tools: what a manifest's ``executor`` section may say (pure).

A docker tool runs one command in a container of a locally built image, never pulled, with no network,
a read-only root, no capabilities, CPU, memory and process limits, and only the project folders its
manifest mounts, each of which the run must grant (read, or write for ``write: true``).
"""

from __future__ import annotations

import posixpath
import re
from typing import Any

from pydantic import BaseModel, Field

EXECUTOR_KEYS = {"type", "image", "command", "mounts", "workdir", "cpus", "memory", "timeout", "network"}
_MEMORY = re.compile(r"^[0-9]+[kmg]?$", re.IGNORECASE)


class Mount(BaseModel):
    source: str  # a folder or file of the project, relative to its root
    target: str  # where the container sees it (absolute)
    write: bool = False


class ContainerExecutor(BaseModel):
    """A docker tool's ``executor`` section, read."""

    image: str
    command: list[str] = Field(default_factory=list)
    mounts: list[Mount] = Field(default_factory=list)
    workdir: str = "/tool"
    cpus: float = 1.0
    memory: str = "256m"
    timeout: float = 60.0


def read_container_executor(executor: dict[str, Any]) -> ContainerExecutor:
    """The executor section as a :class:`ContainerExecutor`; ``ValueError`` says what is wrong."""
    unknown = sorted(set(executor) - EXECUTOR_KEYS)
    if unknown:
        raise ValueError(
            f"docker executor has no key '{unknown[0]}'; it takes {', '.join(sorted(EXECUTOR_KEYS - {'type'}))}"
        )
    if not isinstance(executor.get("image"), str) or not executor["image"]:
        raise ValueError("docker tool needs executor.image (a locally built image; Kiwi never pulls one)")
    command = executor.get("command", [])
    if isinstance(command, str):
        raise ValueError(
            'executor.command is a list of arguments (["/bin/sh", "/tool/run.sh"]); Kiwi runs no shell strings'
        )
    if executor.get("network") not in (None, False, "none"):
        raise ValueError(
            "executor.network: a container gets no network (it cannot be held to the run's granted hosts); "
            "call HTTP APIs with an api tool"
        )
    try:
        read = ContainerExecutor(
            image=executor["image"],
            command=[str(c) for c in command],
            mounts=[
                Mount(**m) if isinstance(m, dict) else Mount(source="", target="")
                for m in executor.get("mounts") or []
            ],
            workdir=str(executor.get("workdir", "/tool")),
            cpus=float(executor.get("cpus", 1.0)),
            memory=str(executor.get("memory", "256m")),
            timeout=float(executor.get("timeout", 60)),
        )
    except (TypeError, ValueError) as exc:
        raise ValueError(f"docker executor: {exc}") from None
    for mount in read.mounts:
        source = posixpath.normpath(mount.source) if mount.source else ""
        if (
            not source
            or source.startswith(("/", ".."))
            or not mount.target.startswith("/")
            or any(c in source + mount.target for c in ":,\n")  # would split the engine's --volume value
        ):
            raise ValueError(
                "executor.mounts: each is {source: PROJECT/RELATIVE/PATH, target: /ABSOLUTE/PATH, write: false}"
            )
    if not 0 < read.cpus <= 64 or not _MEMORY.match(read.memory):
        raise ValueError("executor.cpus is a number of CPUs (e.g. 1) and executor.memory a size (e.g. 256m)")
    if not 0 < read.timeout <= 3600:
        raise ValueError("executor.timeout is seconds, more than 0 and at most 3600")
    return read
