"""The wheel a user installs: built from this tree, installed apart from it, and working.

The rest of the suite runs Kiwi from the source tree (an editable install), where a file missing
from the wheel's package data would never be noticed. Here the wheel is built, its contents checked,
and it is installed into a folder of its own; ``kiwi`` from that folder (the dependencies come from the
test environment) answers ``--help``, makes a project with ``kiwi init`` from the packaged scaffold,
validates it, and finds the packaged registry migrations.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # Built from a copy: setuptools leaves build/ behind, whose stale files a later build would pack.
    source = tmp_path_factory.mktemp("source") / "kiwi"
    skip = shutil.ignore_patterns(
        ".git", ".venv", "node_modules", "build", "*.egg-info", "__pycache__", ".*_cache", ".hypothesis"
    )
    shutil.copytree(ROOT, source, ignore=skip, symlinks=True)
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(out),
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert build.returncode == 0, build.stderr[-2000:]
    (built,) = out.glob("kiwi_runtime-*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    target = tmp_path_factory.mktemp("site")
    install = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert install.returncode == 0, install.stderr[-2000:]
    return target


def _kiwi(installed: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """``python -m kiwi ARGS`` with the installed wheel first on the path, run outside the source tree."""
    env = {
        **os.environ,
        "PYTHONPATH": str(installed),
        "AI_USER_SPACE": str(cwd / "user"),
        "KIWI_KEYS_DIR": str(cwd / "keys"),
    }
    return subprocess.run(
        [sys.executable, "-m", "kiwi", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


def test_the_wheel_holds_every_package_and_data_file(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for package in ("kiwi", "workflows", "activities", "workers", "mcp_frontend"):
        sources = {p.relative_to(ROOT).as_posix() for p in (ROOT / package).rglob("*.py")}
        assert sources <= names, f"{package}: missing from the wheel: {sorted(sources - names)[:5]}"
    data = [
        p.relative_to(ROOT).as_posix()
        for p in [
            *(ROOT / "kiwi" / "scaffold").rglob("*"),
            *(ROOT / "kiwi" / "registry" / "migrations").glob("*.sql"),
        ]
        if p.is_file()
    ]
    assert data and set(data) <= names, f"missing data files: {sorted(set(data) - names)}"
    assert not any(n.startswith(("tests/", "bench/", "deploy/")) for n in names)
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "kiwi = kiwi.cli:run" in zipfile.ZipFile(wheel).read(entry_points).decode()


def test_the_installed_wheel_runs_init_validate_and_finds_its_migrations(installed, tmp_path):
    where = _kiwi(installed, tmp_path, "--help")
    assert where.returncode == 0, where.stderr
    assert "init" in where.stdout and "dev" in where.stdout
    origin = subprocess.run(
        [sys.executable, "-c", "import kiwi, kiwi.registry as r; print(kiwi.__file__); print(r.__file__)"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(installed)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert origin.returncode == 0, origin.stderr
    assert all(line.startswith(str(installed)) for line in origin.stdout.split()), origin.stdout

    project = tmp_path / "project"
    project.mkdir()
    init = _kiwi(installed, project, "init")
    assert init.returncode == 0, init.stderr
    assert (project / ".ai" / "directives" / "hello_kiwi.md").is_file()
    assert (project / ".ai" / "tools" / "text" / "word_count" / "tool.yaml").is_file()
    validate = _kiwi(installed, project, "validate", ".ai")
    assert validate.returncode == 0, validate.stdout + validate.stderr

    migrations = sorted((installed / "kiwi" / "registry" / "migrations").glob("*.sql"))
    assert [m.name for m in migrations] == sorted(
        p.name for p in (ROOT / "kiwi" / "registry" / "migrations").glob("*.sql")
    )
