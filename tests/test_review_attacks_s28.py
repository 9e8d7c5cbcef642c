"""Review s28: a hostile review of shell.run's checks and the kernel's wall, as an agent would attack them,
against the real stack (a Temporal server, Kiwi's worker, real programs confined by the kernel).

The wall holds Kiwi's protected places at the project's root read-only only where they exist; these attacks
made the ones that did not exist yet (`.kiwi`, `temporal-dev.yml`, `.ai/config`, a nested `.git`) through
commands the checks let pass, read `.git/config` through git, and made git run a shell that wrote the
repository's settings a command the human's next `git status` ran. Each test's docstring says the attack and
the safe outcome.
"""

from __future__ import annotations

import asyncio
import gzip
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from activities import confinement
from kiwi.contracts import CommandRequest
from tests.helpers import approver, pending_approvals, wait_for, write
from tests.test_attack_shell import agent_run, shell
from tests.test_confinement import SYSTEM_PYTHON, confined

LINUX = sys.platform.startswith("linux")


def _commands(names: str, *, write: str = "**") -> str:
    return (
        f'<read resource="filesystem" path="**"/><write resource="filesystem" path="{write}"/>'
        f'<execute resource="shell" commands="{names}"/>'
    )


def _stage(project: Path) -> None:
    """A folder of the project holding what would be Kiwi's places at the root (a vendored tree, an unpacked
    archive): the agent copies it over the project's root."""
    for rel, text in {
        "stage/.kiwi/planted": "planted\n",
        "stage/temporal-dev.yml": "mcp: {host: 0.0.0.0}\n",
        "stage/notes.md": "notes\n",
    }.items():
        (project / rel).parent.mkdir(parents=True, exist_ok=True)
        (project / rel).write_text(text)


@pytest.mark.parametrize(
    "argv",
    [
        ["cp", "-a", "stage/.", "."],
        ["cp", "--arch", "stage/.", "."],
        ["cp", "-al", "stage/.", "."],
        ["cp", "-r", "-t", ".", "stage/."],
        ["cp", "-r", "--target-directory=.", "stage/."],
    ],
)
async def test_cp_archive_or_into_a_target_folder_makes_no_protected_place_at_the_root(runs, project, argv):
    """Attack: `cp -a stage/. .` (and `cp -r -t . stage/.`) copies a folder holding `.kiwi` and
    `temporal-dev.yml` over the project's root, where neither exists yet, so the kernel holds neither: only
    `-r` was read as copying folders whole, and a `-t` folder as one file. Now refused, as `cp -r stage/. .`
    is, and nothing is made."""
    _stage(project)
    run_id = await agent_run(runs, project, "copier", _commands("cp"))
    result = await shell(runs, run_id, *argv)
    assert result.status == "denied", result
    assert "contains the protected place" in result.reason, result.reason
    assert not (project / ".kiwi").exists() and not (project / "temporal-dev.yml").exists()
    copied = await shell(runs, run_id, "cp", "-a", "stage/notes.md", "copied.md")  # (what cp -a is for)
    assert copied.status == "ok" and (project / "copied.md").read_text() == "notes\n", copied


async def test_cp_archive_into_ai_makes_no_config_when_a_grant_is_inside_ai(runs, project):
    """Attack: with `write .ai/knowledge/**` beside `write **`, `.ai` is held place by place, and a place
    not made yet (`.ai/config`, here removed) is not held: `cp -a stage/. .ai` made `.ai/config` with the
    agent's harness and trusted keys. Now refused."""
    (project / "stage" / "config").mkdir(parents=True)
    (project / "stage" / "config" / "agent_harness.yaml").write_text("permissions: everything\n")
    run_id = await agent_run(
        runs,
        project,
        "copier",
        _commands("cp") + '<write resource="filesystem" path=".ai/knowledge/**"/>',
    )
    shutil.rmtree(project / ".ai" / "config")
    result = await shell(runs, run_id, "cp", "-a", "stage/.", ".ai")
    assert result.status == "denied" and "'.ai/config'" in result.reason, result
    assert not (project / ".ai" / "config").exists()


async def test_git_diff_no_index_does_not_print_the_repositorys_settings(runs, project):
    """Attack: `git diff --no-index empty .` compares an empty folder with the project: git's rules let it
    read `.git` (other programs get `Permission denied` for `.git/config`), so it printed the remote's
    credentials. Now refused, naming diff -u as the way to compare files."""
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    with (project / ".git" / "config").open("a") as config:
        config.write('[remote "origin"]\n\turl = https://user:SECRET-TOKEN-123@example.invalid/x.git\n')
    (project / "empty").mkdir()
    run_id = await agent_run(runs, project, "differ", _commands("git"))
    result = await shell(runs, run_id, "git", "diff", "--no-index", "empty", ".")
    assert result.status == "denied" and "--no-index" in result.reason and "diff -u" in result.hint, result
    assert "SECRET-TOKEN" not in str(result)


@pytest.mark.parametrize(
    ("argv", "cwd", "made"),
    [
        (["dd", "if=notes/y.txt", "of=temporal-dev.yml"], ".", "temporal-dev.yml"),
        (["dd", "if=../notes/y.txt", "of=.git"], "sub", "sub/.git"),
        (["dd", "if=notes/y.txt", "of=.KIWI"], ".", ".KIWI"),
        (["dd", "-o.kiwi"], ".", ".kiwi"),
        (
            ["split", "-l", "1", "-a", "1", "--additional-suffix=ml", "notes/y.txt", "temporal-dev."],
            ".",
            "temporal-dev.yml",
        ),
        (["split", "-l", "1", "-a", "1", "notes/y.txt", "sub/.gi"], ".", "sub/.git"),
        (["csplit", "-f", "sub/.gi", "-b", "t%.0d", "notes/y.txt", "2"], ".", "sub/.git"),
    ],
)
async def test_a_program_kiwi_does_not_know_makes_no_protected_place_by_a_word_that_is_no_path(
    runs, project, argv, cwd, made
):
    """Attack: a program a grant names but Kiwi does not know has its path-like words checked; `of=NAME`
    (no '/') was not one, and split and csplit make their names from a prefix and a suffix, so `dd
    of=temporal-dev.yml`, `split ... temporal-dev.` and `csplit -f sub/.gi -b 't%.0d'` made protected places
    (a nested `.git` file pointing git at a repository the agent built). The worker refuses them."""
    (project / "notes").mkdir(exist_ok=True)
    (project / "notes" / "y.txt").write_text("gitdir: ../stage\nsecond\nthird\n")
    (project / "sub").mkdir()
    run_id = await agent_run(runs, project, "writer", _commands("dd,split,csplit"))
    result = await shell(runs, run_id, *argv, cwd=cwd)
    assert result.status == "denied", result
    assert "protected place" in result.reason or "'csplit' is refused" in result.reason, result.reason
    assert not (project / made).exists()
    assert not any(
        p.name.casefold().startswith(("temporal-dev", ".git", ".kiwi"))
        for p in project.rglob("*")
        if p != project / ".ai" / ".gitignore"  # (kiwi init's)
    )
    split = await shell(runs, run_id, "split", "-l", "1", "notes/y.txt", "sub/part-")  # (what split is for)
    assert split.status == "ok" and (project / "sub" / "part-ab").read_text() == "second\n", split


async def test_git_runs_no_shell_a_repositorys_settings_name(runs, project, monkeypatch):
    """Attack: a repository's config sets `trailer.t.cmd` to a shell command appending `core.fsmonitor` to
    `.git/config` (review s28 planted it in a repository of the agent's, a `.git` file in sub/ pointing at a
    folder it wrote); `git commit --trailer t=1` ran it through /bin/sh, which git's rules let write the
    project's `.git`: the human's next `git status` then ran the agent's command, unconfined. The worker
    refuses git in a repository whose settings name such a command, and confined git runs no shell at all
    (here with that check taken away)."""
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    marker = project.parent / "human-pwned"
    command = f"printf '[core]\\n\\tfsmonitor = touch {marker}\\n' >> .git/config; echo X"
    with (project / ".git" / "config").open("a") as config:
        config.write(f'[trailer "t"]\n\tcmd = "{command}"\n')
    settings = (project / ".git" / "config").read_text()
    write(project / "a.txt", "a")
    subprocess.run(["git", "-C", str(project), "add", "a.txt"], check=True)
    run_id = await agent_run(runs, project, "committer", _commands("git"))
    argv = ["git", "commit", "--allow-empty", "--trailer", "t=1", "-m", "msg", "--", "a.txt"]

    refused = await shell(runs, run_id, *argv)
    assert refused.status == "denied" and "trailer.t.cmd" in refused.reason, refused

    if not confinement.available():
        return
    import activities.repochecks

    monkeypatch.setattr(activities.repochecks, "_UNSAFE_GIT_KEY", activities.repochecks._FILTER_KEY)
    ran = await shell(runs, run_id, *argv)
    assert ran.status == "ok", ran
    assert (project / ".git" / "config").read_text() == settings
    subprocess.run(["git", "-C", str(project), "status", "--short"], capture_output=True, check=True)
    assert not marker.exists()


@pytest.mark.skipif(not LINUX, reason="Landlock and PID namespaces are Linux's")
async def test_a_program_that_asks_to_be_traced_and_stops_does_not_end_as_exit_0(tmp_path):
    """Attack on the exit status Kiwi reports: a program asks the namespace's first process (its parent,
    Kiwi's init) to trace it and stops itself; the init took the stop for an end and reported it, the
    supervisor refused that report and exited as the init had, 0: a command that would have failed with 42
    read as a success. A traced stop now ends the program (SIGKILL)."""
    if not confinement.available() or confinement.namespaces_refused():
        pytest.skip("no Landlock or no namespaces here: the program is not below Kiwi's init")
    req = CommandRequest(project_root=str(tmp_path), argv=["true"], read_grants=["**"], write_grants=["**"])
    code = (
        "import ctypes, os, signal; ctypes.CDLL(None).ptrace(0, 0, 0, 0); "
        "os.kill(os.getpid(), signal.SIGSTOP); os._exit(42)"
    )
    result = await confined(req, SYSTEM_PYTHON, "-c", code)
    assert result.exit_code == -9, result
    plain = await confined(req, SYSTEM_PYTHON, "-c", "import os; os._exit(42)")
    assert plain.exit_code == 42, plain  # (an exit is reported as it was)


async def test_a_protected_place_a_command_made_where_there_was_none_is_set_aside(runs, project, monkeypatch):
    """The kernel holds a protected place only where it is (a place is held by mounting on it), so a route
    the checks miss (here `dd of=temporal-dev.yml` with the worker's check of such words taken away) made
    `temporal-dev.yml`, which the human's next `kiwi dev` reads. The worker looks for the places that were
    not there after each command: one the command made is set aside beside itself, nothing deleted, and the
    call fails naming it. A place that was there before, and what a grant names, are left as they are."""
    import activities.diskchecks

    monkeypatch.setattr(activities.diskchecks, "unchecked_names", lambda *args, **kwargs: None)
    (project / "notes").mkdir(exist_ok=True)
    (project / "notes" / "y.txt").write_text("mcp: {host: 0.0.0.0}\n")
    (project / ".kiwi").mkdir()
    run_id = await agent_run(runs, project, "writer", _commands("dd"))

    result = await shell(runs, run_id, "dd", "if=notes/y.txt", "of=temporal-dev.yml")
    assert result.status == "denied", result
    assert "'temporal-dev.yml'" in result.reason and "set aside" in result.reason, result.reason
    assert not (project / "temporal-dev.yml").exists()
    (aside,) = project.glob("temporal-dev.yml.set-aside-*")
    assert aside.read_text() == "mcp: {host: 0.0.0.0}\n" and aside.name in result.reason

    kept = await shell(runs, run_id, "dd", "if=notes/y.txt", "of=notes/copy.txt")  # (nothing made there)
    assert kept.status == "ok" and (project / "notes" / "copy.txt").exists(), kept
    assert (project / ".kiwi").is_dir() and not list(project.glob(".kiwi.set-aside-*"))


# ---------------------------------------------------------------- the second review of the day


def _nested_repository(project: Path, points_at: str, *, version: int = 0) -> None:
    """sub/.git, a `.git` file pointing at ``points_at`` (a git folder the agent wrote under a name that is not
    protected, or the project's own), as a route the checks missed would leave it."""
    if points_at == "../stage":
        stage = project / "stage"
        for rel in ("objects/info", "refs/heads"):
            (stage / rel).mkdir(parents=True)
        (stage / "HEAD").write_text("ref: refs/heads/main\n")
        (stage / "config").write_text(f"[core]\n\trepositoryformatversion = {version}\n")
    (project / "sub" / "empty").mkdir(parents=True)
    (project / "sub" / ".git").write_text(f"gitdir: {points_at}\n")


@pytest.mark.parametrize(
    ("points_at", "version", "argv", "said"),
    [
        # git refuses a repository of a format it does not know and works as if there were none: `git diff A
        # B` is then --no-index, under git's rules that may read .git (it printed the remote's credentials).
        ("../stage", 99, ["git", "diff", "empty", ".."], "finds no repository"),
        # A repository of the agent's (its settings the agent's: a trailer's cmd, an fsmonitor).
        ("../stage", 0, ["git", "status"], "not the project's"),
        # The project's own git folder with sub/ as its work tree: `git add -- .` staged sub's files at the
        # root's paths (.ai/config/..., temporal-dev.yml), for the human's next checkout to write.
        ("../.git", 0, ["git", "add", "--", "."], "not the project's"),
    ],
)
async def test_shell_git_works_only_in_the_projects_own_repository(
    runs, project, points_at, version, argv, said
):
    """Attack: git run in a folder whose `.git` file points elsewhere works in another repository, or in none;
    each way it reached what the project's repository keeps from it. shell.run's git now runs only in the
    project's repository (its root the work tree), its submodules and worktrees."""
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    with (project / ".git" / "config").open("a") as config:
        config.write('[remote "origin"]\n\turl = https://user:SECRET-TOKEN-123@example.invalid/x.git\n')
    _nested_repository(project, points_at, version=version)
    run_id = await agent_run(runs, project, "gitter", _commands("git"))
    result = await shell(runs, run_id, *argv, cwd="sub")
    assert result.status == "denied" and said in result.reason, result
    assert "SECRET-TOKEN" not in str(result)
    at_root = await shell(runs, run_id, "git", "status", "--short")  # (the project's own: runs)
    assert at_root.status == "ok" and at_root.result["exit_code"] == 0, at_root


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["patch", "-p0", "-i", "notes/fix.diff"], "'patch' is refused"),
        (["gzip", "-d", "sub/.git.gz"], "'sub/.git'"),
        (["gzip", "-dN", "notes/x.gz"], "'-dN'"),
        (["split", "-l", "1", "-a", "3", "notes/y.txt", "sub/."], "'.git'"),
        (["git", "init", "--", "sub"], "'sub/.git'"),
    ],
)
async def test_a_nested_protected_place_is_not_made_by_a_name_the_command_does_not_hold(
    runs, project, argv, said
):
    """Attack: programs that take the names they write from what they read (a diff's `+++ sub/.git`, the
    name kept in a gzip file), from what a suffix leaves (`gzip -d sub/.git.gz`), from a prefix that begins a
    protected name (`split ... sub/.`), or after `--` (`git init -- sub`) made nested `.git` files and
    folders, which the kernel holds nowhere. Refused, and nothing is made."""
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    (project / "notes").mkdir(exist_ok=True)
    (project / "notes" / "y.txt").write_text("gitdir: ../stage\n")
    (project / "sub").mkdir()
    subprocess.run(["gzip", "-k", str(project / "notes" / "y.txt")], check=True)
    (project / "notes" / "y.txt.gz").rename(project / "sub" / ".git.gz")
    (project / "notes" / "x.gz").write_bytes((project / "sub" / ".git.gz").read_bytes())
    # (A command gets no standard input: patch reads the diff from a file.)
    (project / "notes" / "fix.diff").write_text(
        "--- /dev/null\n+++ sub/.git\n@@ -0,0 +1 @@\n+gitdir: ../stage\n"
    )
    run_id = await agent_run(runs, project, "maker", _commands("patch,gzip,split,git"))
    result = await runs.call_tool(run_id, "shell.run", {"argv": argv})
    assert result.status == "denied" and said in result.reason, result
    assert not (project / "sub" / ".git").exists()
    assert not [
        p for p in (project / "sub").iterdir() if p.name.casefold().startswith(".git") and p.suffix != ".gz"
    ]


async def test_ai_made_a_link_to_a_folder_of_the_agents_is_set_aside(tmp_path):
    """Attack: where a project has no `.ai`, `ln -s stage .ai` (the checks protect the places in `.ai`, not
    the name `.ai`) gave Kiwi the agent's harness, trusted keys and tools to read through the link. A `.ai`
    the command made a link is set aside as the other places are; a folder `.ai` it made is the project's."""
    from temporalio.exceptions import ApplicationError

    from activities.commands import CommandActivities

    project = tmp_path / "project"
    (project / "stage" / "config").mkdir(parents=True)
    (project / "stage" / "config" / "agent_harness.yaml").write_text("agent's: true\n")

    def request(*argv: str) -> CommandRequest:
        return CommandRequest(
            project_root=str(project), argv=list(argv), read_grants=["**"], write_grants=["**"]
        )

    with pytest.raises(ApplicationError) as refused:
        await CommandActivities().run_command(request("ln", "-s", "stage", ".ai"))
    assert "'.ai'" in str(refused.value) and "set aside" in str(refused.value)
    assert not (project / ".ai").exists() and not (project / ".ai").is_symlink()
    (aside,) = project.glob(".ai.set-aside-*")
    assert aside.is_symlink()

    made = await CommandActivities().run_command(request("mkdir", "-p", ".ai/knowledge"))
    assert made["exit_code"] == 0 and (project / ".ai" / "knowledge").is_dir()


async def test_a_whole_tree_copy_through_a_link_to_the_root_is_refused(runs, project):
    """Attack: `d` a link to the project's root, `cp -r stage/. d` passed the run's checks (d holds no
    protected place by its name) and the worker's (d leads into the project), and wrote `.kiwi` there. The
    worker checks a whole-tree write where it leads as the run checks it by its name."""
    _stage(project)
    (project / "d").symlink_to(".")
    run_id = await agent_run(runs, project, "copier", _commands("cp"))
    result = await shell(runs, run_id, "cp", "-r", "stage/.", "d")
    assert result.status == "denied" and "contains the protected place" in result.reason, result
    assert not (project / ".kiwi").exists() and not list(project.glob(".kiwi*"))


# ---------------------------------------------------------------- the third review of the day


async def test_a_rollback_neither_removes_nor_writes_back_kiwis_protected_places(runs, project):
    """Attack: `.gitignore` naming `.ai/config/` while a checkpoint is taken leaves the harness and trusted
    keys out of it; with `.gitignore` emptied, `git.rollback` took them for files made since and removed them
    (the project's limits gone to the defaults). A rollback now neither removes nor writes back Kiwi's
    protected places: a human changes those."""
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    approver("alice")
    harness = (project / ".ai" / "config" / "agent_harness.yaml").read_text()
    (project / "temporal-dev.yml").write_text("temporal: {port: 7233}\n")
    run_id = await agent_run(
        runs,
        project,
        "roller",
        _commands("ls") + '<execute resource="tool" id="git.checkpoint,git.rollback"/>',
    )
    hide = await runs.call_tool(
        run_id, "filesystem.write", {"path": ".gitignore", "content": ".ai/config/\ntemporal-dev.yml\n"}
    )
    assert hide.status == "ok", hide
    made = await runs.call_tool(run_id, "git.checkpoint", {"message": "before"})
    assert made.status == "ok" and made.result["available"], made
    unhide = await runs.call_tool(run_id, "filesystem.write", {"path": ".gitignore", "content": ""})
    assert unhide.status == "ok", unhide
    (project / "notes").mkdir(exist_ok=True)
    (project / "notes" / "since.txt").write_text("made since\n")

    rollback = asyncio.create_task(
        runs.call_tool(run_id, "git.rollback", {"checkpoint": made.result["checkpoint"]})
    )  # (a rollback waits for a human's approval: kiwi init's harness)

    async def asked() -> list:
        return await pending_approvals(runs, run_id)

    (request,) = await wait_for(asked, what="the rollback to ask for approval")
    await runs.decide_approval(run_id, request.request_id, True, by="alice")
    rolled = await asyncio.wait_for(rollback, timeout=60)
    assert rolled.status == "ok", rolled
    assert rolled.result["removed"] == ["notes/since.txt"], rolled.result
    assert (project / ".ai" / "config" / "agent_harness.yaml").read_text() == harness
    assert (project / "temporal-dev.yml").read_text() == "temporal: {port: 7233}\n"


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["gzip", "-d", "-r", "sub"], "'-r'"),
        (["gzip", "-d", "--rec", "sub"], "'--rec'"),
        (["gzip", "-d", "--na", "notes/x.gz"], "'--na'"),
        (["gzip", "-S", "it", "sub/.g"], "'-S'"),
        (["split", "-a", "1", "-n", "12", "--additional-suffix=ogs", "notes/y.txt", ".ai/"], "'.ai/logs'"),
    ],
)
async def test_options_and_prefixes_the_checks_did_not_read_make_no_protected_place(
    runs, project, argv, said
):
    """Attack: `gzip -d -r sub` (and `--rec`) decompressed `sub/.git.gz` into `sub/.git` without the file's
    name on the command line; `--na` is `--name`, the name kept in the file; `-S it` made `sub/.git` from
    `sub/.g` compressed; `split ... .ai/` made a file `.ai/logs` (the prefix `.ai/` was not read as `.ai`).
    A decompressor takes only the options Kiwi reads; split's prefix `.ai/` is `.ai`."""
    (project / "notes").mkdir(exist_ok=True)
    (project / "notes" / "y.txt").write_text("".join(f"line {n}\n" for n in range(24)))
    (project / "sub").mkdir()
    (project / "sub" / ".git.gz").write_bytes(gzip.compress(b"gitdir: ../stage\n"))
    (project / "sub" / ".g").write_text("x\n")
    (project / "notes" / "x.gz").write_bytes((project / "sub" / ".git.gz").read_bytes())
    run_id = await agent_run(
        runs,
        project,
        "maker",
        _commands("gzip,split") + '<write resource="filesystem" path=".ai/knowledge/**"/>',
    )
    result = await shell(runs, run_id, *argv)
    assert result.status == "denied" and said in result.reason, result
    assert not (project / "sub" / ".git").exists() and not (project / ".ai" / "logs").is_file()
    plain = await shell(runs, run_id, "gzip", "-dk", "notes/x.gz")  # (what gzip is for)
    assert plain.status == "ok" and (project / "notes" / "x").read_text() == "gitdir: ../stage\n", plain


async def test_ai_logs_made_a_file_where_there_was_none_is_set_aside(tmp_path, monkeypatch):
    """Attack: a file `.ai/logs` (made by `split ... --additional-suffix=ogs .ai/` before split read `.ai/`
    as `.ai`; here by `dd of=.ai/logs` with the worker's word check taken away) stands where Kiwi writes the
    audit trail; with a write grant inside `.ai`, the kernel holds `.ai` place by place, and only where they
    are. Kiwi makes `.ai/logs` and `.ai/directives` itself, as folders, so another kind of entry made there
    is set aside."""
    from temporalio.exceptions import ApplicationError

    import activities.diskchecks
    from activities.commands import CommandActivities

    monkeypatch.setattr(activities.diskchecks, "unchecked_names", lambda *args, **kwargs: None)
    project = tmp_path / "project"
    (project / ".ai").mkdir(parents=True)
    (project / "y.txt").write_text("not an audit record\n")
    request = CommandRequest(
        project_root=str(project),
        argv=["dd", "if=y.txt", "of=.ai/logs"],
        read_grants=["**"],
        write_grants=["**", ".ai/knowledge/**"],
    )
    with pytest.raises(ApplicationError) as refused:
        await CommandActivities().run_command(request)
    assert "'.ai/logs'" in str(refused.value) and "set aside" in str(refused.value)
    assert not (project / ".ai" / "logs").exists()
    (aside,) = (project / ".ai").glob("logs.set-aside-*")
    assert aside.read_text() == "not an audit record\n"


def _with_a_submodule(project: Path, tmp_path: Path) -> Path:
    """The project a repository with a submodule at vendor/lib (git's own `submodule add`); its git folder."""
    source = tmp_path / "lib-source"
    git = [
        "git",
        "-c",
        "user.name=t",
        "-c",
        "user.email=t@example.invalid",
        "-c",
        "protocol.file.allow=always",
    ]
    subprocess.run(["git", "init", "-q", str(source)], check=True)
    (source / "lib.txt").write_text("the library\n")
    subprocess.run([*git, "-C", str(source), "add", "lib.txt"], check=True)
    subprocess.run([*git, "-C", str(source), "commit", "-qm", "the library's first commit"], check=True)
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    subprocess.run(
        [*git, "-C", str(project), "submodule", "-q", "add", str(source), "vendor/lib"], check=True
    )
    subprocess.run([*git, "-C", str(project), "commit", "-qm", "vendor lib"], check=True)
    return project / ".git" / "modules" / "vendor" / "lib"


async def test_shell_git_works_in_a_submodule(runs, project, tmp_path):
    """A submodule's git folder sets `core.worktree` back to its own work tree, which shell.run refused as a
    setting that moves git's work tree: git worked in no submodule. That one value is now git's own, and
    `git status` and `git log` run in vendor/lib."""
    git_dir = _with_a_submodule(project, tmp_path)
    assert "worktree" in (git_dir / "config").read_text()
    run_id = await agent_run(runs, project, "gitter", _commands("git"))
    status = await shell(runs, run_id, "git", "status", "--short", cwd="vendor/lib")
    assert status.status == "ok" and status.result["exit_code"] == 0, status
    log = await shell(runs, run_id, "git", "log", "--oneline", cwd="vendor/lib")
    assert log.status == "ok" and "the library's first commit" in log.result["stdout"], log


@pytest.mark.parametrize(
    ("worktree", "said"), [("../../../..", "core.worktree"), ("../../../../.ai", "core.worktree")]
)
async def test_a_submodules_worktree_moved_to_the_root_or_a_protected_place_is_refused(
    runs, project, tmp_path, worktree, said
):
    """Attack (as planted in the submodule's git folder): `core.worktree` naming the project's root or `.ai`,
    so that git in vendor/lib checks its files out there. Still refused, naming the setting."""
    git_dir = _with_a_submodule(project, tmp_path)
    subprocess.run(
        ["git", "config", "--file", str(git_dir / "config"), "core.worktree", worktree], check=True
    )
    run_id = await agent_run(runs, project, "gitter", _commands("git"))
    result = await shell(runs, run_id, "git", "status", "--short", cwd="vendor/lib")
    assert result.status == "denied" and said in result.reason, result


@pytest.mark.skipif(shutil.which("xz") is None, reason="needs xz")
async def test_split_prefixes_and_decompressor_threads_that_make_no_protected_place_run(runs, project):
    """What the s28 rules refused with no protected place in reach: split's prefix `t` or `i` (each begins a
    protected name, with no letters after it that split could add), an additional suffix `.yml`, and `xz -T0`
    (the threads option). They run; the attacks beside them stay refused."""
    (project / "notes").mkdir(exist_ok=True)
    (project / "notes" / "y.txt").write_text("first\nsecond\n")
    run_id = await agent_run(runs, project, "splitter", _commands("split,xz"))
    for argv, made in [
        (["split", "-l", "1", "notes/y.txt", "notes/t"], "notes/taa"),
        (["split", "-l", "1", "notes/y.txt", "notes/i"], "notes/iab"),
        (["split", "-l", "1", "--additional-suffix=.yml", "notes/y.txt", "notes/part-"], "notes/part-aa.yml"),
        (["xz", "-T0", "-k", "notes/y.txt"], "notes/y.txt.xz"),
        (["xz", "-d", "-T", "2", "-c", "notes/y.txt.xz"], None),
    ]:
        result = await shell(runs, run_id, *argv)
        assert result.status == "ok" and result.result["exit_code"] == 0, (argv, result)
        assert made is None or (project / made).is_file(), (argv, made)
        if made is None:
            assert result.result["stdout"] == "first\nsecond\n"
    for argv, said in [
        (["split", "-l", "1", "--additional-suffix=-dev.yml", "notes/y.txt", "t"], "temporal-dev.yml"),
        (["xz", "-d", "-T", "notes/.git.xz"], "-T takes a number of threads"),
    ]:
        result = await shell(runs, run_id, *argv)
        assert result.status == "denied" and said in result.reason, (argv, result)
    assert not (project / "temporal-dev.yml").exists()


async def test_a_moved_submodule_does_not_lead_git_to_another_folders_files(runs, project, tmp_path):
    """Attack (review s29): after `git mv vendor/lib moved` (git writes `core.worktree = ../../../../moved`),
    `mv moved m2` and `ln -s src moved`: git run in m2 found the submodule's git folder through m2/.git, and
    its work tree through the link, src/, so `git restore` in m2 wrote the library's files in src/ (and `git
    rm -f` deleted src/'s), outside what the command's folder said. A submodule's `core.worktree` counts as git's own only when it leads, with no link, to
    the folder the command runs in, whose `.git` file points back at it."""
    _with_a_submodule(project, tmp_path)
    (project / "src").mkdir()
    (project / "src" / "keep.txt").write_text("the human's\n")
    # (The human's `git mv`: confined, the agent's may not write the submodule's `.git` file.)
    subprocess.run(["git", "-C", str(project), "mv", "vendor/lib", "moved"], check=True)
    run_id = await agent_run(runs, project, "mover", _commands("git,mv,ln"))
    for argv in (["mv", "moved", "m2"], ["ln", "-s", "src", "moved"]):
        step = await shell(runs, run_id, *argv)
        assert step.status == "ok" and step.result["exit_code"] == 0, (argv, step)
    result = await shell(runs, run_id, "git", "restore", "--source=HEAD", "--", "lib.txt", cwd="m2")
    assert result.status == "denied" and "core.worktree" in result.reason, result
    assert sorted(p.name for p in (project / "src").iterdir()) == ["keep.txt"]
    (project / "moved").unlink()
    (project / "m2").rename(project / "moved")  # (back where git's settings say: git works there again)
    back = await shell(runs, run_id, "git", "log", "--oneline", cwd="moved")
    assert back.status == "ok" and "the library's first commit" in back.result["stdout"], back
