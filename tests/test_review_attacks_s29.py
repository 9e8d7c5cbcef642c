"""Review s29: hostile reviews of the MCP front end's grants and of shell.run, as an agent would attack them,
against the real stack (a Temporal server, Kiwi's worker, real programs). Each test's docstring says the attack
and the safe outcome."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.test_attack_shell import agent_run, shell


def _repository(project: Path, files: dict[str, str]) -> None:
    """The project a git repository with ``files`` (path: text) committed."""
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    for rel, text in files.items():
        (project / rel).parent.mkdir(parents=True, exist_ok=True)
        (project / rel).write_text(text)
    git = ["git", "-C", str(project), "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    subprocess.run([*git, "add", *files], check=True)
    subprocess.run([*git, "commit", "-qm", "the human's"], check=True)


def _grants(commands: str, read: str | tuple[str, ...] = "**", write: str | tuple[str, ...] = "**") -> str:
    """A directive's <permissions>: the read and write globs (one or several) and the shell programs."""
    reads = (read,) if isinstance(read, str) else read
    writes = (write,) if isinstance(write, str) else write
    return (
        "".join(f'<read resource="filesystem" path="{g}"/>' for g in reads)
        + "".join(f'<write resource="filesystem" path="{g}"/>' for g in writes)
        + f'<execute resource="shell" commands="{commands}"/>'
    )


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["split", "--filter=touch PWNED-split", "notes/a.md"], "'--filter=touch PWNED-split' is refused"),
        (["split", "-l", "1", "--fil", "touch PWNED-split", "notes/a.md"], "'--fil' is refused"),
        (["sdiff", "--diff-program=./run-me", "notes/a.md", "notes/b.md"], "with it sdiff starts"),
        (["diff3", "--diff-prog=./run-me", "notes/a.md", "notes/b.md", "notes/a.md"], "with it diff3 starts"),
        (["install", "-s", "--strip-program=./run-me", "notes/a.md", "out"], "'install' is refused"),
        (["groff", "-U", "notes/a.md"], "'groff' is refused: it starts other programs"),
    ],
)
async def test_a_granted_program_starts_no_program_an_option_names(runs, project, argv, said):
    """Attack (review s29): `split --filter=CMD` runs CMD through /bin/sh, and `sdiff`/`diff3 --diff-program`,
    `install -s --strip-program` run the program named; the checks let each pass, so one grant of split gave an
    unconfined worker every program (the approver's key read, the agent's own call approved). The worker now
    refuses them (abbreviations too), and programs that start their helpers (groff) whole; nothing runs."""
    (project / "notes").mkdir()
    (project / "notes" / "a.md").write_text("a\nb\n")
    (project / "notes" / "b.md").write_text("a\nc\n")
    (project / "run-me").write_text("#!/bin/sh\ntouch PWNED-program\n")
    (project / "run-me").chmod(0o755)
    run_id = await agent_run(runs, project, "starter", _grants(argv[0]))
    result = await shell(runs, run_id, *argv)
    assert result.status == "denied" and said in result.reason, result
    assert not list(project.rglob("PWNED*"))
    if argv[0] == "split":  # (what split is for runs)
        plain = await shell(runs, run_id, "split", "-l", "1", "notes/a.md", "notes/part-")
        assert plain.status == "ok" and (project / "notes" / "part-ab").read_text() == "b\n", plain


async def test_a_grant_of_the_root_folder_alone_reads_no_file_below_it(runs, project):
    """Attack (review s29): a run that may read `.` (the root folder alone: its listing) and `notes/**` read
    every file of the project: `.` was taken for `**` where grants are compared, so git printed the whole history
    (`git show HEAD`, `git grep`), and `grep -r KEY .` read every file, the folder alone being all that was
    checked. Both refused now; what `.` is for, listing the root, runs."""
    _repository(project, {"private.txt": "the human's SECRET-29\n"})
    (project / "notes").mkdir()
    (project / "notes" / "a.md").write_text("a\n")
    run_id = await agent_run(
        runs, project, "rootreader", _grants("git,grep,ls", read=(".", "notes/**"), write=())
    )
    for argv, said in [
        (["grep", "-r", "SECRET", "."], "no read grant covers all of it"),
        (["grep", "-r", "SECRET"], "no read grant covers all of it"),
        (["git", "show", "HEAD"], "may not read all of the project"),
        (["git", "grep", "SECRET"], "may not read all of the project"),
    ]:
        result = await shell(runs, run_id, *argv)
        assert result.status == "denied" and said in result.reason, (argv, result)
        assert "SECRET-29" not in str(result)
    listed = await shell(runs, run_id, "ls", ".")
    assert listed.status == "ok" and "private.txt" in listed.result["stdout"], listed
    notes = await shell(runs, run_id, "grep", "-r", "a", "notes")
    assert notes.status == "ok" and notes.result["exit_code"] == 0, notes


@pytest.mark.parametrize(
    ("write", "argv", "said"),
    [
        (".", ["cp", "notes/conftest.py", "."], "would be written as 'conftest.py'"),
        (
            ".",
            ["mv", "notes/conftest.py", "."],
            "would be written as 'conftest.py'|contains the protected place",
        ),
        ("src", ["cp", "notes/conftest.py", "src"], "would be written as 'src/conftest.py'"),
        ("src", ["cp", "-r", "notes", "src"], "writes whole"),
        ("src", ["rm", "-r", "src"], "writes whole"),
    ],
)
async def test_a_grant_of_a_folder_alone_writes_nothing_inside_it(runs, project, write, argv, said):
    """Attack (review s29): with `write .` (the root folder alone), `cp notes/conftest.py .` wrote a
    `conftest.py` at the root, which the human's next pytest runs outside every wall: for cp, mv and ln into a
    folder only the folder was checked against the grants. With `write src`, `cp -r notes src` and `rm -r src`
    wrote and deleted all of src/. Refused now, and nothing changes."""
    (project / "notes").mkdir()
    (project / "notes" / "conftest.py").write_text("import os  # the agent's\n")
    (project / "src").mkdir()
    (project / "src" / "keep.py").write_text("kept\n")
    run_id = await agent_run(runs, project, "folderwriter", _grants("cp,mv,rm", write=(write, "notes/**")))
    result = await shell(runs, run_id, *argv)
    assert result.status == "denied" and any(s in result.reason for s in said.split("|")), result
    assert not (project / "conftest.py").exists() and not (project / "src" / "conftest.py").exists()
    assert (project / "notes" / "conftest.py").exists() and (
        project / "src" / "keep.py"
    ).read_text() == "kept\n"
    assert not (project / "src" / "notes").exists()


def test_a_parent_granting_the_root_folder_alone_covers_no_childs_files():
    """A parent run whose grant is `.` does not cover a child's `notes/**` (it covered everything): the child
    asking for more than its parent is an escalation, as for any other grant."""
    from kiwi.globs import glob_covered

    assert not glob_covered("notes/**", ".")
    assert not glob_covered("**", ".")
    assert glob_covered(".", ".") and glob_covered(".", "**")
    assert glob_covered("notes/**", "**")


def _committed_src(project: Path) -> None:
    """A repository whose src/sub/deep.py the human changed and has not committed."""
    _repository(project, {"src/sub/deep.py": "committed\n"})
    (project / "src" / "sub" / "deep.py").write_text("the human's work, not committed\n")


@pytest.mark.parametrize(
    ("write", "argv"),
    [
        ("*", ["git", "restore", "src"]),
        ("src", ["git", "checkout", "HEAD", "--", "src"]),
        ("s*", ["git", "rm", "-q", "-r", "-f", "src"]),
        ("src/*", ["git", "mv", "src/sub", "src/sub2"]),
        ("**/sub", ["git", "restore", "-s", "HEAD", "--", "src/sub"]),
    ],
)
async def test_git_rewrites_no_folder_a_grant_names_alone(runs, project, write, argv):
    """Attack (review s29, second round): git's paths were checked as names, so a grant naming a folder alone
    (`*`, `src`, `s*`, `src/*`, `**/sub`) let `git restore src` revert, `git rm -r -f src` delete and `git mv`
    move everything below it (the human's uncommitted work lost), where `rm -r src` was refused. The worker now
    reads a path git rewrites that is a folder, or nothing, as the whole tree below it."""
    _committed_src(project)
    run_id = await agent_run(runs, project, "gitwriter", _grants("git", write=write))
    result = await shell(runs, run_id, *argv)
    assert result.status == "denied" and "whole" in result.reason, result
    assert (project / "src" / "sub" / "deep.py").read_text() == "the human's work, not committed\n"


async def test_git_restores_a_file_a_glob_grant_names(runs, project):
    """What a file grant is for still runs: `git restore src/sub/deep.py` under `write src/**/*.py`."""
    _committed_src(project)
    run_id = await agent_run(runs, project, "gitfile", _grants("git", write="src/**/*.py"))
    result = await shell(runs, run_id, "git", "restore", "src/sub/deep.py")
    assert result.status == "ok" and result.result["exit_code"] == 0, result
    assert (project / "src" / "sub" / "deep.py").read_text() == "committed\n"


@pytest.mark.parametrize("program", ["prove", "pdb3", "cpp-12", "x86_64-linux-gnu-gcc", "vim.basic", "rbash"])
async def test_a_variant_of_a_refused_programs_name_is_refused(runs, project, program):
    """Attack (review s29, second round): `prove` (Perl's test runner) and `pdb3` ran the agent's code, and
    versioned or target-named programs (`cpp-12`, `x86_64-linux-gnu-gcc`, `vim.basic`) escaped the lists of
    programs that start others. The worker refuses them by name, and by the name they are a variant of."""
    run_id = await agent_run(runs, project, "variant", _grants(program))
    result = await shell(runs, run_id, program, "notes.txt")
    assert result.status == "denied" and "is refused" in result.reason, result


async def test_find_reads_its_starting_points_not_the_cwd(runs, project):
    """`find src -name x` with `read src/**` and `read .` (the cwd, the root folder alone) reads src, not the
    cwd: it runs (a false refusal of the second round), and `find -name x` (the cwd whole) is refused."""
    (project / "src").mkdir()
    (project / "src" / "x").write_text("x\n")
    run_id = await agent_run(runs, project, "finder", _grants("find", read=("src/**", "."), write=()))
    found = await shell(runs, run_id, "find", "src", "-name", "x")
    assert found.status == "ok" and found.result["stdout"].strip() == "src/x", found
    whole = await shell(runs, run_id, "find", "-name", "x")
    assert whole.status == "denied" and "no read grant covers all of it" in whole.reason, whole


async def test_git_brings_back_a_deleted_file_a_file_grant_names_but_not_a_deleted_folder(runs, project):
    """A path git restores that is not on disk is what it is in git: a deleted file restored under the file's
    grant runs (the third round's false refusal: nothing there counted as a folder), and a deleted folder under
    `write *` (the folder alone) is refused as the whole folder, found in git's index."""
    _committed_src(project)
    (project / "src" / "sub" / "deep.py").unlink()
    run_id = await agent_run(runs, project, "restorer", _grants("git", write=("src/**/*.py", "*")))
    folder = await shell(runs, run_id, "git", "restore", "src")
    assert folder.status == "denied" and "writes whole" in folder.reason, folder
    (project / "src" / "sub").rmdir()
    (project / "src").rmdir()
    gone = await shell(runs, run_id, "git", "checkout", "HEAD", "--", "src")
    assert gone.status == "denied" and "a folder git would write whole" in gone.reason, gone
    assert not (project / "src").exists()
    restored = await shell(runs, run_id, "git", "restore", "src/sub/deep.py")
    assert restored.status == "ok" and restored.result["exit_code"] == 0, restored
    assert (project / "src" / "sub" / "deep.py").read_text() == "committed\n"


async def test_git_moves_a_file_into_a_folder_the_grants_cover(runs, project):
    """`git mv a.txt docs` under `write *.txt` and `write docs/**` runs (the third round's false refusal: the
    file was taken for a folder); `git mv a.txt docs` under `write *.txt` and `write docs` (the folder alone)
    is refused, docs/a.txt being no path it may write."""
    _repository(project, {"a.txt": "a\n", "docs/index.md": "docs\n"})
    run_id = await agent_run(runs, project, "mover", _grants("git", write=("*.txt", "docs")))
    refused = await shell(runs, run_id, "git", "mv", "a.txt", "docs")
    assert refused.status == "denied" and "would be moved to 'docs/a.txt'" in refused.reason, refused
    run_id = await agent_run(runs, project, "mover2", _grants("git", write=("*.txt", "docs/**")))
    moved = await shell(runs, run_id, "git", "mv", "a.txt", "docs")
    assert moved.status == "ok" and moved.result["exit_code"] == 0, moved
    assert (project / "docs" / "a.txt").read_text() == "a\n"


@pytest.mark.parametrize(
    "program", ["c99-gcc", "pydoc3.11", "cpan5.36-x86_64-linux-gnu", "vim.gtk3", "memusage"]
)
async def test_wrappers_and_script_tools_that_run_code_are_refused(runs, project, program):
    """Attack (review s29, third round): `c99-gcc -wrapper sh,-c,...`, `pydoc3 ./evil.py`, `cpan -j cfg.pm`,
    `memusage sh -c ...` ran programs or the project's code, their names on no list (or a variant no rule
    reduced). Refused by the worker."""
    run_id = await agent_run(runs, project, "wrapper", _grants(program))
    result = await shell(runs, run_id, program, "notes.txt")
    assert result.status == "denied" and "is refused" in result.reason, result


@pytest.mark.parametrize(
    "argv",
    [
        ["git", "restore", "-sHEAD~1", "src"],
        ["git", "restore", "-WsHEAD~1", "--", "./src/"],
        ["git", "restore", "--source=HEAD~1", "src"],
        ["git", "checkout", "-q", "HEAD~1", "--", "src"],
        ["git", "checkout", "--conflict", "merge", "HEAD~1", "--", "src"],
    ],
)
async def test_git_brings_back_no_folder_from_an_older_commit_under_a_folder_alone(runs, project, argv):
    """Attack (review s29, fourth round): src/ removed from the index and HEAD, still in HEAD~1: `git restore
    -sHEAD~1 src` under `write *` wrote all of src/ (the revision in `-sREV` was not read, nor one after
    `--conflict merge`). Refused, and nothing is written."""
    _committed_src(project)
    git = ["git", "-C", str(project), "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    subprocess.run([*git, "rm", "-q", "-r", "-f", "src"], check=True)
    subprocess.run([*git, "commit", "-qm", "no src"], check=True)
    run_id = await agent_run(runs, project, "older", _grants("git,touch", write="*"))
    result = await shell(runs, run_id, *argv)
    assert result.status == "denied" and "a folder git would write whole" in result.reason, result
    assert not (project / "src").exists()


async def test_a_file_where_a_folder_was_does_not_hide_it_from_git(runs, project):
    """`touch src` over a deleted src/ (still in git's index), then `git restore src` under `write *`: git
    would remove the file and write all of src/; refused."""
    _committed_src(project)
    subprocess.run(["rm", "-rf", str(project / "src")], check=True)
    run_id = await agent_run(runs, project, "placeholder", _grants("git,touch", write="*"))
    touched = await shell(runs, run_id, "touch", "src")
    assert touched.status == "ok", touched
    for argv in (["git", "restore", "src"], ["git", "checkout", "--", "src"]):
        result = await shell(runs, run_id, *argv)
        assert result.status == "denied" and "a folder git would write whole" in result.reason, (argv, result)
    assert (project / "src").is_file()


def test_name_variants_refuse_wrappers_and_leave_ordinary_tools():
    """The worker's name rules (fourth round): `heaptrack` and `mvnDebug` start what they are given and are
    refused; a target triplet's tools (`x86_64-linux-gnu-objdump`) and hyphened tools named after no refused
    program's wrapper (`clang-format`, `gcc-nm`) are not, as they were not before this session."""
    from kiwi.shellpolicy import worker_refusal

    for refused in ("heaptrack", "mvnDebug", "c99-gcc", "x86_64-linux-gnu-gcc", "x86_64", "vim.gtk3"):
        assert worker_refusal(refused), refused
    for ordinary in ("x86_64-linux-gnu-objdump", "clang-format", "gcc-nm", "objdump", "sha256sum", "b2sum"):
        assert not worker_refusal(ordinary), ordinary


async def test_unstaging_a_folder_writes_no_file_and_runs(runs, project):
    """`git restore --staged src` changes git's index alone: it runs under `write *` (the sixth round's false
    refusal), and the human's work in src/ stays; with `--worktree` (or `-SW`) it rewrites src/ and is refused."""
    _committed_src(project)
    subprocess.run(["git", "-C", str(project), "add", "src"], check=True)
    run_id = await agent_run(runs, project, "unstager", _grants("git", write="*"))
    for argv in (["git", "restore", "--staged", "--worktree", "src"], ["git", "restore", "-SW", "src"]):
        refused = await shell(runs, run_id, *argv)
        assert refused.status == "denied" and "whole" in refused.reason, (argv, refused)
    unstaged = await shell(runs, run_id, "git", "restore", "--staged", "src")
    assert unstaged.status == "ok" and unstaged.result["exit_code"] == 0, unstaged
    assert (project / "src" / "sub" / "deep.py").read_text() == "the human's work, not committed\n"
    status = subprocess.run(
        ["git", "-C", str(project), "status", "--porcelain", "src"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert status.stdout.startswith(" M"), status.stdout  # (changed in the working tree, no longer staged)
