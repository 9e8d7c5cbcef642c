"""What a command's cwd needs (session 30): a read grant only where the program reads it, and find reads its
starting points, not its cwd. Before, under `read src/**` every command run from the root was refused, and
under a denial below the cwd `find src` was. Against the real stack (a Temporal server, Kiwi's worker, real
programs); the refusals that stay are the attacks."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kiwi.shellpolicy import check_argv
from tests.test_attack_shell import agent_run, shell


def _permissions(commands: str, read: str = "src/**", deny: str = "") -> str:
    return (
        f'<read resource="filesystem" path="{read}"/><write resource="filesystem" path="out/**"/>'
        + (f'<deny resource="filesystem" path="{deny}"/>' if deny else "")
        + f'<execute resource="shell" commands="{commands}"/>'
    )


def _project(project: Path) -> None:
    (project / "src").mkdir()
    (project / "src" / "a.txt").write_text("alpha\n")
    (project / "secrets").mkdir()
    (project / "secrets" / "key.txt").write_text("canary-key\n")
    (project / "out").mkdir()


async def test_a_command_that_reads_only_the_paths_it_names_runs_from_an_unread_cwd(runs, project):
    """Under `read src/**` alone, `cat src/a.txt`, `find src` and `cp src/a.txt out/` run from the root, and
    what lists or searches the root itself is refused, naming the grant that would let it: `ls`, `grep -r` and
    `find` given no path, and git."""
    _project(project)
    run_id = await agent_run(runs, project, "reader", _permissions("cat,find,cp,ls,grep,git"))

    cat = await shell(runs, run_id, "cat", "src/a.txt")
    found = await shell(runs, run_id, "find", "src")
    copied = await shell(runs, run_id, "cp", "src/a.txt", "out/a.txt")

    assert cat.status == "ok" and cat.result["stdout"] == "alpha\n", cat
    assert found.status == "ok" and found.result["stdout"].split() == ["src", "src/a.txt"], found
    assert copied.status == "ok" and (project / "out" / "a.txt").read_text() == "alpha\n", copied
    for argv, grant in (
        (["ls"], "."),
        (["grep", "-r", "canary"], "**"),
        (["find"], "**"),
        (["find", "-name", "key.txt"], "**"),
    ):
        refused = await shell(runs, run_id, *argv)
        assert refused.status == "denied" and "cwd '.' may not be read" in refused.reason, (argv, refused)
        assert f'<read resource="filesystem" path="{grant}"/>' in refused.hint, (argv, refused.hint)
        assert "canary" not in str(refused), refused
    git = await shell(runs, run_id, "git", "status")
    assert git.status == "denied" and "git reads every file" in git.reason, git


async def test_a_denied_cwd_is_refused_whatever_the_program_reads(runs, project):
    """A cwd a denial names is refused though the program reads only the paths it is given: `cat key.txt`
    run in secrets/ under `<deny path="secrets/**"/>` prints nothing."""
    _project(project)
    run_id = await agent_run(runs, project, "reader", _permissions("cat", read="**", deny="secrets/**"))

    result = await shell(runs, run_id, "cat", "key.txt", cwd="secrets")

    assert result.status == "denied" and "secrets" in result.reason, result
    assert "canary" not in str(result), result


async def test_find_reads_its_starting_points_not_its_cwd(runs, project):
    """Under `<deny path="secrets/**"/>`, `find src` runs (it was refused: the cwd, which holds secrets/, was
    counted as read); `find .` and `find` given no starting point, which read secrets/, are refused."""
    _project(project)
    run_id = await agent_run(runs, project, "finder", _permissions("find", read="**", deny="secrets/**"))

    found = await shell(runs, run_id, "find", "src", "-name", "*.txt")

    assert found.status == "ok" and found.result["stdout"].split() == ["src/a.txt"], found
    for argv in (["find", ".", "-name", "key.txt"], ["find", "-name", "key.txt"]):
        refused = await shell(runs, run_id, *argv)
        assert refused.status == "denied" and "secrets/**" in refused.reason, (argv, refused)


@pytest.mark.skipif(shutil.which("rg") is None, reason="no rg on this machine")
async def test_rg_reads_no_ignore_file_above_the_project_nor_in_an_unread_cwd(runs, project, monkeypatch):
    """Review s30: rg reads the ignore files of every folder above the one it searches, out of the project up
    to the file system's root, and of its cwd, and prints a line it cannot parse in its error. On a worker
    without the kernel's wall (where rg, a program Kiwi models, runs), `rg alpha .` in src/ printed a
    `.ignore` beside the project. The worker now runs rg there with --no-ignore (it reads no ignore file,
    so it also searches what they would hide); and rg needs its cwd read, whatever it searches."""
    monkeypatch.setenv("KIWI_CONFINE", "off")
    _project(project)
    (project.parent / ".ignore").write_text("canary-OUTSIDE{unclosed\n")
    (project / ".ignore").write_text("canary-ROOT{unclosed\n")
    run_id = await agent_run(runs, project, "searcher", _permissions("rg", read="src/**"))

    found = await shell(runs, run_id, "rg", "alpha", ".", cwd="src")
    # (`--` as an option's value: the --no-ignore Kiwi adds went after it, as a pattern: review s30.)
    dashes = await shell(runs, run_id, "rg", "-e", "--", "alpha", ".", cwd="src")
    refused = await shell(runs, run_id, "rg", "alpha", "src")

    assert found.status == "ok" and "a.txt:alpha" in found.result["stdout"], found
    assert "canary" not in json.dumps(found.result), found.result
    assert dashes.status == "ok" and "canary" not in json.dumps(dashes.result), dashes.result
    assert refused.status == "denied" and "cwd '.' may not be read" in refused.reason, refused


def test_a_program_by_another_name_needs_its_cwd_read():
    """Review s30: the cwd rule folded names, so a named `HEAD` (no head: Debian's HTTP client) ran from an
    unread cwd as head would."""
    refused = check_argv(["HEAD", "src/a.txt"], allowed=["HEAD"], read_grants=["src/**"])
    assert not refused.allowed and "cwd '.' may not be read" in refused.reason, refused
    assert check_argv(["head", "src/a.txt"], allowed=["head"], read_grants=["src/**"]).allowed


async def test_a_backup_into_a_folder_is_no_write_beside_the_folder(runs, project):
    """Session 30 left a false refusal: `cp -b src/a.txt out/` was refused as writing 'out~', the name a
    backup of out itself would have; cp writes into a folder, and backs up what it replaces there (out/a.txt~).
    It runs now."""
    _project(project)
    (project / "out" / "a.txt").write_text("the first\n")
    run_id = await agent_run(runs, project, "backer", _permissions("cp"))

    copied = await shell(runs, run_id, "cp", "-b", "src/a.txt", "out/")

    assert copied.status == "ok" and copied.result["exit_code"] == 0, copied
    assert (project / "out" / "a.txt").read_text() == "alpha\n"
    assert (project / "out" / "a.txt~").read_text() == "the first\n"
    assert not (project / "out~").exists()


async def test_a_wildcard_nothing_expands_is_named_when_the_program_fails(runs, project):
    """README trial s38: `wc -l data/*.txt` failed with wc's "No such file", and nothing said that no shell runs
    to expand the pattern. The failed call's answer now says so; a file whose name holds `*` is no pattern."""
    (project / "data").mkdir()
    (project / "data" / "a.txt").write_text("one\n")
    (project / "data" / "b*.txt").write_text("two\n")
    run_id = await agent_run(
        runs,
        project,
        "count",
        '<read resource="filesystem" path="data/**"/><execute resource="shell" commands="wc"/>',
    )

    failed = await shell(runs, run_id, "wc", "-l", "data/*.txt")
    named = await shell(runs, run_id, "wc", "-l", "data/b*.txt")

    assert failed.status == "ok" and failed.result["exit_code"] != 0, failed
    assert failed.result["note"].startswith(
        "nothing expands data/*.txt: Kiwi runs the program without a shell"
    )
    assert named.result["exit_code"] == 0 and "note" not in named.result, named
    await runs.cancel(run_id)
