"""Layers point one way. Read every module's imports (top-level and inside functions) and check them.

kiwi (domain) <- workflows <- workers
     ^   ^          ^
     |   activities |
     |              |
kiwi.runs (client) -+-> mcp_frontend, kiwi.cli (the command line may use everything)
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CLI = ("kiwi.cli", "kiwi.cli.runs", "kiwi.cli.keys", "kiwi.__main__")
CLIENT = ("kiwi.runs", "kiwi.connect")


def layer(module: str) -> str:
    if module in CLI or module.startswith("kiwi.cli."):
        return "cli"
    if module in CLIENT or module.startswith("kiwi.runs."):
        return "client"
    return module.split(".")[0] if module.split(".")[0] != "kiwi" else "domain"


# What each layer may not import.
FORBIDDEN = {
    "domain": {"workflows", "activities", "workers", "mcp_frontend", "client", "cli"},
    "activities": {"workflows", "workers", "mcp_frontend", "client", "cli"},
    "workflows": {"workers", "mcp_frontend", "client", "cli"},
    "client": {"activities", "workers", "mcp_frontend", "cli"},
    "mcp_frontend": {"activities", "workers", "cli"},
    "workers": {"mcp_frontend", "client", "cli"},
    "cli": set(),
}


def modules() -> list[tuple[str, Path]]:
    found = []
    for package in ("kiwi", "workflows", "activities", "workers", "mcp_frontend"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if "scaffold" in path.parts:
                continue
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found.append((name, path))
    return found


def imported(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


OWN = ("kiwi", "workflows", "activities", "workers", "mcp_frontend")


@pytest.mark.parametrize(("module", "path"), modules(), ids=[m for m, _ in modules()])
def test_a_module_imports_only_from_the_layers_below_it(module, path):
    mine = layer(module)
    wrong = sorted(
        name
        for name in imported(path)
        if name.split(".")[0] in OWN and _known(name) and layer(_known(name)) in FORBIDDEN[mine]
    )
    assert not wrong, f"{module} ({mine}) imports {wrong}"


def _known(name: str) -> str:
    """The module an imported name belongs to ('kiwi.cli.main' -> 'kiwi.cli')."""
    known = {m for m, _ in modules()}
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name


def test_the_layer_rules_see_the_modules_they_speak_of():
    names = {m for m, _ in modules()}
    assert {
        "kiwi.policy",
        "kiwi.runs",
        "kiwi.cli",
        "workflows.directive_run.workflow",
        "activities.filesystem",
        "mcp_frontend.server",
        "workers.main",
    } <= names
    assert layer("kiwi.admission") == "domain" and layer("kiwi.cli.runs") == "cli"
    assert layer("kiwi.runs.calls") == "client" and layer("kiwi.runsheet") == "domain"


def _unpassed_imports(path: Path) -> list[str]:
    """Top-level imports of kiwi/activities outside ``workflow.unsafe.imports_passed_through()``."""
    found = []
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        else:
            continue
        found += [
            f"line {node.lineno}: {name}" for name in names if name.split(".")[0] in ("kiwi", "activities")
        ]
    return found


WORKFLOW_MODULES = [(m, p) for m, p in modules() if m.startswith("workflows.")]


@pytest.mark.parametrize(("module", "path"), WORKFLOW_MODULES, ids=[m for m, _ in WORKFLOW_MODULES])
def test_workflow_code_takes_kiwi_modules_through_the_sandbox_pass_through(module, path):
    """An import outside the pass-through re-imports the module inside the sandbox: its pydantic classes
    then differ from the passed-through ones and a child run's input fails validation on every workflow
    task, so the run hangs instead of failing (how a merge once stalled CI)."""
    assert not _unpassed_imports(path), (
        f"{module} imports outside imports_passed_through(): {_unpassed_imports(path)}"
    )


def test_the_sandbox_import_check_sees_an_import_outside_the_pass_through(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from temporalio import workflow\nwith workflow.unsafe.imports_passed_through():\n"
        "    from kiwi.errors import InputInvalid\nfrom kiwi.contracts import RunSnapshot\n",
        encoding="utf-8",
    )
    assert _unpassed_imports(bad) == ["line 4: kiwi.contracts"]
    assert len(WORKFLOW_MODULES) >= 10


def test_no_source_file_is_over_a_thousand_lines():
    """STYLE: files at most 1,000 lines (fastmcp's cap; aim near 500). Six were over before session 36's split
    (kiwi/shellpolicy.py at 3,982); this keeps them under."""
    over = {
        str(path.relative_to(ROOT)): lines
        for package in ("kiwi", "workflows", "activities", "workers", "mcp_frontend")
        for path in (ROOT / package).rglob("*.py")
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > 1000
    }
    assert not over, f"split these by concern (STYLE, 'Size and state'): {over}"
