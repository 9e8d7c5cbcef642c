"""`kiwi validate` catches what the run would refuse, and names the spelling or grant that fixes it."""

from __future__ import annotations

import json

import pytest

from kiwi.cli import main as kiwi
from tests.helpers import directive_md, write

SORT = '<step name="sorted"><tool_call tool="shell.run"><param name="command">sort notes.txt</param></tool_call></step>'


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert kiwi(["init"]) == 0
    return tmp_path


def problems(project, capsys, name: str, body: str, permissions: str) -> list[str]:
    path = write(
        project / ".ai" / "directives" / f"{name}.md", directive_md(body, name=name, permissions=permissions)
    )
    assert kiwi(["validate", str(path), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    return [p["message"] for p in report["items"][0]["problems"] if p["severity"] == "error"]


def test_a_step_calling_shell_without_a_shell_grant_is_an_error_naming_the_grant(project, capsys):
    found = problems(project, capsys, "nogrant", SORT, '<read resource="filesystem" path="**"/>')
    assert any(
        'step "sorted" calls shell.run' in m and '<execute resource="shell" commands="sort"/>' in m
        for m in found
    ), found


def test_a_misspelt_attribute_names_the_right_one(project, capsys):
    found = problems(
        project,
        capsys,
        "typo",
        SORT,
        '<read resource="filesystem" path="**"/><execute resource="shell" command="sort"/>',
    )
    assert any("has no attribute 'command'; did you mean commands=\"sort\"?" in m for m in found), found


def test_a_misspelt_resource_names_the_right_one(project, capsys):
    found = problems(project, capsys, "badres", SORT, '<execute resource="shel" commands="sort"/>')
    assert any('resource="shel"' in m and 'did you mean "shell"?' in m for m in found), found


def test_a_granted_call_validates(project, capsys):
    path = write(
        project / ".ai" / "directives" / "fine.md",
        directive_md(
            SORT,
            name="fine",
            permissions='<read resource="filesystem" path="**"/><execute resource="shell" commands="sort"/>',
        ),
    )
    assert kiwi(["validate", str(path)]) == 0, capsys.readouterr().out
