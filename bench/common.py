"""What the benchmarks share: a scratch Kiwi project and the tuned dev server, and percentiles."""

from __future__ import annotations

import os
from pathlib import Path

from kiwi.cli import main as kiwi
from kiwi.devserver import DEFAULTS, DevServer, free_port


def scratch_project(root: Path) -> None:
    """`kiwi init` in ``root`` (made the current folder), with an empty user space beside it."""
    os.environ["AI_USER_SPACE"] = str(root / "user")
    os.chdir(root)
    kiwi(["init", "--json"])


def tuned_dev_server(root: Path) -> DevServer:
    """The dev server with `kiwi dev`'s default tuning, on free loopback ports, state in ``root``."""
    t = DEFAULTS["temporal"]
    return DevServer(ip="127.0.0.1", port=free_port(), ui_port=free_port(), db_file=root / "temporal.sqlite",
                     pragmas=t["sqlite_pragmas"], dynamic_config=t["dynamic_config"])


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * p))]


def cpu_seconds(pid: int | None = None) -> float:
    """User + system CPU time a process has used so far (this process when ``pid`` is None)."""
    if pid is None:
        times = os.times()
        return times.user + times.system
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
