"""Files of the project that git's settings name, outside any git folder: a team's `.gitconfig` that
`.git/config` includes, the hooks folder `core.hooksPath` names (husky's `.husky/_`), a program a setting runs
by its path. git run in the project obeys them, and the human's `git status` runs a `core.fsmonitor` written
there before the human has looked at anything (review s31 round 3, F2/F6). Kiwi changes them only where a write
grant names them, with the file tools, a program it models or one it does not. Each test is the attack, against
the real stack (a Temporal server, Kiwi's worker, real programs, real git)."""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
from pathlib import Path

import pytest

from tests.helpers import approver
from tests.test_attack_shell import agent_run, pwned, shell
from tests.test_repository_layouts import FSMONITOR, _grants, _tool_grants, approved_rollback

TEAM = "[user]\n\tname = The Team\n"
# What git writing the whole project (`git checkout B`) needs granted: a grant naming each protected place there.
_PLACES = (
    ".git",
    ".ai/config",
    ".ai/tools",
    ".ai/directives",
    ".ai/logs",
    ".ai/.cache",
    ".ai/scripts",
    ".kiwi",
)
_WHOLE_PROJECT = "**,temporal-dev.yml," + ",".join(f"{place}/**" for place in (*_PLACES, ".ai/proposals"))


def _repository(project: Path, *settings: tuple[str, str]) -> None:
    """The project a git repository (the human's), with ``settings`` in its `.git/config`."""
    if not (project / ".git").exists():
        subprocess.run(["git", "init", "-q", "-b", "main", str(project)], check=True)
    for key, value in settings:
        subprocess.run(["git", "-C", str(project), "config", "--add", key, value], check=True)


def _humans_git_status(project: Path) -> None:
    """What the human does to look at the agent's work: `git status`, which runs a `core.fsmonitor`."""
    subprocess.run(["git", "-C", str(project), "status", "--short"], capture_output=True, check=False)


async def _write(runs, run_id: str, path: str, content: str):
    return await runs.call_tool(run_id, "filesystem.write", {"path": path, "content": content})


async def test_a_team_gitconfig_the_repository_includes_is_written_only_where_a_grant_names_it(runs, project):
    """`.git/config` includes `../.gitconfig` (a team's settings, in the project). Under `write **` the agent
    wrote a `core.fsmonitor` there, which the human's next `git status` ran. Refused now, naming the setting
    and the grant that reaches it; `write .gitconfig` does."""
    _repository(project, ("include.path", "../.gitconfig"))
    (project / ".gitconfig").write_text(TEAM)
    run_id = await agent_run(runs, project, "team", _grants(write="**"))

    refused = await _write(runs, run_id, ".gitconfig", FSMONITOR)
    _humans_git_status(project)

    assert refused.status == "denied", refused
    assert "include.path in .git/config" in refused.reason and 'path=".gitconfig"' in refused.reason, refused
    assert (project / ".gitconfig").read_text() == TEAM
    assert pwned(project) == []
    # The rest of the project is written as before.
    assert (await _write(runs, run_id, "notes.txt", "x\n")).status == "ok"

    named = await agent_run(runs, project, "named", _grants(write="**,.gitconfig"))
    assert (await _write(runs, run_id := named, ".gitconfig", TEAM + "# kept\n")).status == "ok", run_id
    assert (project / ".gitconfig").read_text().endswith("# kept\n")


async def test_an_include_not_there_yet_is_made_by_no_write_move_or_archive(runs, project):
    """The include names a file that is not there (a team's file each member makes): a write there, a folder
    moved into its place holding it, an archive unpacked holding it, each made it; all refused now."""
    _repository(project, ("include.path", "../x/team/settings.cfg"))
    (project / "x").mkdir()
    (project / "stage").mkdir()
    (project / "stage" / "settings.cfg").write_text(FSMONITOR)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        archive.add(project / "stage" / "settings.cfg", arcname="team/settings.cfg")
    (project / "a.tar").write_bytes(buffer.getvalue())
    run_id = await agent_run(runs, project, "maker", _grants("tar", write="**"))

    written = await _write(runs, run_id, "x/team/settings.cfg", FSMONITOR)
    moved = await runs.call_tool(run_id, "filesystem.move", {"source": "stage", "destination": "x/team"})
    unpacked = await shell(runs, run_id, "tar", "-xf", "a.tar", "-C", "x")
    _humans_git_status(project)

    for result in (written, moved, unpacked):
        assert result.status == "denied" and "include.path in .git/config" in result.reason, result
    assert list((project / "x").iterdir()) == []
    assert pwned(project) == []


async def test_includes_are_followed_through_an_include_and_past_a_branch_condition(runs, project):
    """An included file that includes another (its path relative to the first), and an include whose condition
    (`onbranch:feature`) leaves it out now: the human switches branch later, and git reads it then."""
    _repository(
        project,
        ("include.path", "../.gitconfig"),
        ("includeIf.onbranch:feature.path", "../feature.cfg"),
    )
    (project / ".gitconfig").write_text("[include]\n\tpath = conf/more.cfg\n")
    (project / "feature.cfg").write_text("[include]\n\tpath = deep.cfg\n")
    run_id = await agent_run(runs, project, "deep", _grants(write="**"))

    more = await _write(runs, run_id, "conf/more.cfg", FSMONITOR)
    deep = await _write(runs, run_id, "deep.cfg", FSMONITOR)

    assert more.status == "denied" and "include.path in .gitconfig" in more.reason, more
    assert deep.status == "denied" and "include.path in feature.cfg" in deep.reason, deep
    assert not (project / "conf").exists() and not (project / "deep.cfg").exists()


async def test_the_hooks_folder_is_changed_only_where_a_grant_names_it(runs, project):
    """husky: `core.hooksPath = .husky/_`, a folder git ignores (`git status` shows nothing written there) whose
    hooks git runs at the human's next commit. Nothing in it is written, and the folder is not deleted or moved
    (a new one in its place). Each hook there runs the project's `.husky/NAME` (review s32: `.husky/pre-commit`
    written, the human's commit ran it): those are named too; the rest of `.husky` is the project's."""
    _repository(project, ("core.hooksPath", ".husky/_"))
    hooks = project / ".husky" / "_"
    hooks.mkdir(parents=True)
    (hooks / "h").write_text("#!/bin/sh\n")
    run_id = await agent_run(runs, project, "husky", _grants(write="**"))

    hook = await _write(runs, run_id, ".husky/_/pre-commit", "#!/bin/sh\ntouch PWNED\n")
    deleted = await runs.call_tool(run_id, "filesystem.delete", {"path": ".husky"})
    moved = await runs.call_tool(run_id, "filesystem.move", {"source": ".husky/_", "destination": "old"})

    for result in (hook, deleted, moved):
        assert result.status == "denied" and "core.hookspath in .git/config" in result.reason, result
        assert 'path=".husky/_/**"' in result.reason
    assert sorted(p.name for p in hooks.iterdir()) == ["h"]
    husky = await _write(runs, run_id, ".husky/pre-commit", "touch PWNED\n")
    assert husky.status == "denied" and 'path=".husky/pre-commit"' in husky.reason, husky
    assert (await _write(runs, run_id, ".husky/README.md", "hooks\n")).status == "ok"


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("core.fsmonitor", "scripts/watch.sh"),
        # Review s32: a program given with arguments, or through the shell, named nothing.
        ("core.fsmonitor", "sh scripts/watch.sh"),
        ("core.fsmonitor", "FOO=1 scripts/watch.sh --fast"),
        ("core.fsmonitor", "cd scripts && ./watch.sh"),
        ("core.fsmonitor", '"$(git rev-parse --show-toplevel)/scripts/watch.sh"'),
        ("diff.lockb.textconv", "python3 scripts/watch.sh"),
        ("alias.st", "!scripts/watch.sh; git status"),
        ("hook.lint.command", "scripts/watch.sh"),  # (config-based hooks, git 2.54)
        ("remote.origin.uploadpack", "scripts/watch.sh"),
        # Review s32, second round: a shell's -c text, env -C, a variable's default, a glob, a substitution's
        # path, and a module Python loads from the work tree's top.
        ("core.fsmonitor", "sh -c 'scripts/watch.sh \"$@\"' -"),
        ("core.fsmonitor", "env -C scripts ./watch.sh"),
        ("core.fsmonitor", '"${WATCHER:-scripts/watch.sh}"'),
        ("core.fsmonitor", "scripts/watch*.sh"),
        ("core.fsmonitor", '"$(git rev-parse --show-cdup)scripts/watch.sh"'),
        ("filter.nb.clean", '"/usr/bin/python3" -m scripts.watch'),
        # Third round: past a -c text, cd's options, wrappers, a variable as the program, a file a variable or
        # a redirection names, Python's -c imports.
        ("core.fsmonitor", "sh -c 'command -v watchman' || scripts/watch.sh"),
        ("core.fsmonitor", "cd -P scripts && ./watch.sh"),
        ("core.fsmonitor", "env -Cscripts ./watch.sh"),
        ("core.fsmonitor", "timeout 5 sh scripts/watch.sh"),
        ("core.fsmonitor", '"$SHELL" scripts/watch.sh'),
        ("core.fsmonitor", "BASH_ENV=scripts/watch.sh bash -c true"),
        ("core.fsmonitor", "sh -s < scripts/watch.sh"),
        ("core.fsmonitor", "python3 -c 'import scripts.watch'"),
        # Fourth round: option clusters with -c, -o's value, `.`/`source`, eval.
        ("core.fsmonitor", "bash -lc 'scripts/watch.sh'"),
        ("core.fsmonitor", "sh -ec -- 'scripts/watch.sh'"),
        ("core.fsmonitor", "sh -o errexit scripts/watch.sh"),
        ("core.fsmonitor", "bash -c 'source scripts/watch.sh; true'"),
        ("core.fsmonitor", "eval 'sh scripts/watch.sh'"),
        # Fifth round: a wrapper's options with values, a PATH= word, env -S.
        ("core.fsmonitor", "nice -n 5 sh scripts/watch.sh"),
        ("core.fsmonitor", "PATH=scripts:$PATH watch.sh"),
        ("core.fsmonitor", "env -S 'sh scripts/watch.sh'"),
    ],
)
async def test_a_program_a_setting_runs_is_a_setting(runs, project, key, value):
    """`core.fsmonitor = scripts/watch.sh` (a team's watcher, in the project): the program git runs at every
    `git status` is as much a setting as the line naming it, however the setting gives it."""
    _repository(project, (key, value))
    run_id = await agent_run(runs, project, "watcher", _grants(write="**"))
    python = "-m " in value or "import " in value  # (`python3 -m scripts.watch` loads scripts/watch.py)
    program = "scripts/watch.py" if python else "scripts/watch.sh"

    refused = await _write(runs, run_id, program, "#!/bin/sh\ntouch PWNED\n")

    assert refused.status == "denied" and f"{key.lower()} in .git/config" in refused.reason, refused
    assert not (project / program).exists()
    assert (await _write(runs, run_id, "notes.txt", "x\n")).status == "ok"


async def test_a_program_a_setting_computes_refuses_every_write(runs, project):
    """`core.fsmonitor = $(cat .watcher)`: which file of the project runs is told only when git runs it."""
    _repository(project, ("core.fsmonitor", "$(cat .watcher)"))
    run_id = await agent_run(runs, project, "computed", _grants(write="**"))

    refused = await _write(runs, run_id, "notes.txt", "x\n")

    assert refused.status == "denied" and "computes the program git runs" in refused.reason, refused
    assert not (project / "notes.txt").exists()


@pytest.mark.parametrize("own", [False, True])
async def test_a_submodules_settings_name_files_too(runs, project, tmp_path_factory, own):
    """Review s32: the outer `git status` runs in each submodule, with the submodule's settings (kept in
    `.git/modules/lib`, or, ``own``, in `lib/.git`: a clone added as one, second round); an include there named
    `lib/.gitconfig`, which the agent wrote."""
    upstream = tmp_path_factory.mktemp("upstream")
    subprocess.run(["git", "init", "-q", "-b", "main", str(upstream)], check=True)
    (upstream / "lib.txt").write_text("lib\n")
    human = ["-c", "user.name=t", "-c", "user.email=t@example.invalid", "-c", "protocol.file.allow=always"]
    subprocess.run(["git", "-C", str(upstream), *human, "add", "-A"], check=True)
    subprocess.run(["git", "-C", str(upstream), *human, "commit", "-qm", "lib"], check=True)
    _repository(project)
    if own:
        subprocess.run(["git", *human, "clone", "-q", str(upstream), str(project / "lib")], check=True)
    subprocess.run(
        ["git", "-C", str(project), *human, "submodule", "-q", "add", str(upstream), "lib"], check=True
    )
    subprocess.run(["git", "-C", str(project / "lib"), "config", "include.path", "../.gitconfig"], check=True)
    if not own:
        subprocess.run(
            ["git", "-C", str(project / "lib"), "config", "include.path", "../../../lib/.gitconfig"],
            check=True,
        )
    run_id = await agent_run(runs, project, "submodule", _grants(write="**"))

    refused = await _write(runs, run_id, "lib/.gitconfig", FSMONITOR)
    _humans_git_status(project)

    config = "lib/.git/config" if own else ".git/modules/lib/config"
    assert refused.status == "denied" and f"include.path in {config}" in refused.reason, refused
    assert not (project / "lib" / ".gitconfig").exists()
    assert pwned(project) == []


async def test_a_hook_that_is_a_link_names_the_script_it_leads_to(runs, project):
    """Review s32, second round: `ln -s ../../scripts/pre-commit.sh .git/hooks/pre-commit`, a common way to
    share hooks: the script, written by the agent, ran at the human's next commit."""
    _repository(project)
    (project / "scripts").mkdir()
    (project / "scripts" / "pre-commit.sh").write_text("#!/bin/sh\nexit 0\n")
    os.symlink("../../scripts/pre-commit.sh", project / ".git" / "hooks" / "pre-commit")
    run_id = await agent_run(runs, project, "linked", _grants(write="**"))

    refused = await _write(runs, run_id, "scripts/pre-commit.sh", "#!/bin/sh\ntouch PWNED\n")

    assert refused.status == "denied" and "the hook pre-commit, a link to it" in refused.reason, refused
    assert (project / "scripts" / "pre-commit.sh").read_text() == "#!/bin/sh\nexit 0\n"


async def test_a_worktree_in_the_project_has_its_settings_taken_from_its_own_top(runs, project):
    """Review s32, second round: `git worktree add .worktrees/feat` (as agent tools make them): a program's path
    and the hooks folder are taken from each worktree's own top, where `git status` there runs them."""
    _repository(project, ("core.fsmonitor", "scripts/watch.sh"))
    (project / "readme.txt").write_text("x\n")
    human = ["git", "-C", str(project), "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    subprocess.run([*human, "-c", "core.fsmonitor=false", "add", "-A"], check=True)
    subprocess.run([*human, "-c", "core.fsmonitor=false", "commit", "-qm", "x"], check=True)
    subprocess.run(
        [*human, "-c", "core.fsmonitor=false", "worktree", "add", "-q", ".worktrees/feat"], check=True
    )
    run_id = await agent_run(runs, project, "worktree", _grants(write="**"))

    refused = await _write(runs, run_id, ".worktrees/feat/scripts/watch.sh", "#!/bin/sh\ntouch PWNED\n")

    assert refused.status == "denied" and "core.fsmonitor in .git/config" in refused.reason, refused
    assert not (project / ".worktrees" / "feat" / "scripts").exists()


async def test_a_bare_repository_with_worktrees_in_the_project(runs, project, tmp_path_factory):
    """Review s32, second round: the layout `.bare/` with a `.git` file `gitdir: ./.bare` and a worktree per
    branch refused every write (git finds no work tree at the project's folder). Each worktree's settings are
    read from its own top."""
    human = ["-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    upstream = tmp_path_factory.mktemp("upstream")
    subprocess.run(["git", "init", "-q", "-b", "main", str(upstream)], check=True)
    subprocess.run(
        ["git", "-C", str(upstream), *human, "commit", "-q", "--allow-empty", "-m", "x"], check=True
    )
    subprocess.run(["git", "clone", "-q", "--bare", str(upstream), str(project / ".bare")], check=True)
    (project / ".git").write_text("gitdir: ./.bare\n")
    subprocess.run(["git", "-C", str(project), "config", "core.fsmonitor", "scripts/watch.sh"], check=True)
    subprocess.run(
        ["git", "-C", str(project), *human, "-c", "core.fsmonitor=false", "worktree", "add", "-q", "main"],
        check=True,
    )
    run_id = await agent_run(runs, project, "bare", _grants(write="**"))

    wrote = await _write(runs, run_id, "main/readme.txt", "x\n")
    refused = await _write(runs, run_id, "main/scripts/watch.sh", "#!/bin/sh\ntouch PWNED\n")

    assert wrote.status == "ok", wrote
    assert refused.status == "denied" and "core.fsmonitor in .bare/config" in refused.reason, refused


@pytest.mark.parametrize(
    ("value", "written"),
    [
        ("sh -o errexit watch", "watch"),
        ("true\nsh watch", "watch"),  # (a newline ends a command)
        ("bash -c 'source .fsmonitor-env; true'", ".fsmonitor-env"),
        ("eval 'sh watch'", "watch"),
        ("watchman-wrapper --root . watch", "watch"),  # (a word of a program Kiwi does not know, when there)
        ("timeout -s KILL 5 sh watch", "watch"),  # (fifth round)
        ("exec -a n sh watch", "watch"),
        ("bash -c \"bash <<< 'sh watch'\"", "watch"),  # (sixth round: a here-string's text)
        ("sh \\\nwatch", "watch"),  # (a backslash-newline)
    ],
)
async def test_a_file_at_the_top_a_status_setting_runs_is_a_setting(runs, project, value, written):
    """Review s32, fourth round: forms of `core.fsmonitor` that run a file of the work tree's top named by no
    `/`: the human's `git status` ran the agent's file."""
    _repository(project, ("core.fsmonitor", value))
    (project / written).write_text("#!/bin/sh\nexit 0\n")  # (the human's)
    run_id = await agent_run(runs, project, "top", _grants(write="**"))

    refused = await _write(runs, run_id, written, "#!/bin/sh\ntouch PWNED\n")

    assert refused.status == "denied" and "core.fsmonitor in .git/config" in refused.reason, refused
    assert (project / written).read_text() == "#!/bin/sh\nexit 0\n"


@pytest.mark.parametrize("where", ["relative", "project-venv"])
async def test_kiwis_own_git_is_none_of_the_projects(runs, project, monkeypatch, tmp_path_factory, where):
    """Review s32, fourth round: the worker's PATH reaching into the project (a relative entry, or the project's
    `.venv/bin` activated before `kiwi dev`): Kiwi's own git found the agent's `git` there, and ran it at its
    next write (reading git's settings) and checkpoint. Kiwi's git is the first outside the project."""
    marks = tmp_path_factory.mktemp("marks")
    folder = project / ("node_modules/.bin" if where == "relative" else ".venv/bin")
    folder.mkdir(parents=True)
    (folder / "git").write_text(f'#!/bin/sh\ntouch {marks}/RAN\nexec /usr/bin/env -i git "$@"\n')
    (folder / "git").chmod(0o755)
    _repository(project)
    entry = "node_modules/.bin" if where == "relative" else str(folder)
    monkeypatch.setenv("PATH", f"{entry}{os.pathsep}{os.environ['PATH']}")
    run_id = await agent_run(runs, project, "pathy", _tool_grants(write="**"))

    wrote = await _write(runs, run_id, "notes.txt", "x\n")
    checkpoint = await runs.call_tool(run_id, "git.checkpoint", {"message": "x"})

    assert wrote.status == "ok" and checkpoint.status == "ok", (wrote, checkpoint)
    assert list(marks.iterdir()) == []


async def test_what_a_glob_a_setting_runs_matches_is_held_and_set_aside(runs, project, maker):
    """Review s32, fourth round: `alias.lint = !sh scripts/lint-*.sh`: a program Kiwi does not model wrote
    `scripts/lint-a.sh`, neither held nor set aside (the glob's own path is never there). What it matches is
    held; what it matches after a command and not before is set aside."""
    _repository(project, ("alias.lint", "!sh scripts/lint-*.sh"))
    (project / "scripts").mkdir()
    (project / "scripts" / "lint-a.sh").write_text("exit 0\n")
    (project / "make.py").write_text(  # (the held lint-a.sh cannot be appended to: read-only)
        "import contextlib\nwith contextlib.suppress(OSError):\n    open('scripts/lint-a.sh', 'a').write('x')\n"
        "open('scripts/lint-b.sh', 'w').write('touch PWNED\\n')\n"
    )
    run_id = await agent_run(runs, project, "globber", _grants("maker", write="**"))

    result = await shell(runs, run_id, "maker", "make.py")

    assert result.status == "denied" and "the command changed 'scripts/lint-b.sh'" in result.reason, result
    assert (project / "scripts" / "lint-a.sh").read_text() == "exit 0\n"
    assert not (project / "scripts" / "lint-b.sh").exists()


async def test_a_module_not_there_is_not_to_be_made_empty(runs, project, maker):
    """Review s32, fourth round: nbstripout's filter (`python3 -m nbstripout`, which `git status` runs): the
    refusal of a program Kiwi does not model said to make `nbstripout.py` empty, which then broke the filter.
    It says to grant narrower folders instead."""
    _repository(project, ("filter.nbstripout.clean", '"/usr/bin/python3" -m nbstripout'))
    (project / "make.py").write_text("open('made.txt', 'w').write('x')\n")
    run_id = await agent_run(runs, project, "notebooks", _grants("maker", write="**"))

    refused = await shell(runs, run_id, "maker", "make.py")

    assert refused.status == "denied" and "where it could make 'nbstripout" in refused.reason, refused
    assert "make it (empty)" not in refused.reason and "grant narrower folders" in refused.reason


async def test_a_glob_git_status_runs_refuses_a_program_kiwi_does_not_model(runs, project, maker):
    """Review s32, fifth round: `sh -c 'for f in hooks.d/*.sh; do sh "$f"; done'` as `core.fsmonitor`: a program
    Kiwi does not model made `hooks.d/b.sh`, and an editor's `git status` ran it before Kiwi set it aside (a new
    match cannot be held). Such a program does not run where it could make one."""
    _repository(project, ("core.fsmonitor", "sh -c 'for f in hooks.d/*.sh; do sh \"$f\"; done'"))
    (project / "hooks.d").mkdir()
    (project / "hooks.d" / "a.sh").write_text("exit 0\n")
    (project / "make.py").write_text("open('hooks.d/b.sh', 'w').write('touch PWNED\\n')\n")
    run_id = await agent_run(runs, project, "globber", _grants("maker", write="**"))

    refused = await shell(runs, run_id, "maker", "make.py")
    written = await _write(runs, run_id, "hooks.d/c.sh", "touch PWNED\n")

    assert refused.status == "denied" and "'hooks.d/*.sh'" in refused.reason, refused
    assert written.status == "denied", written
    assert sorted(p.name for p in (project / "hooks.d").iterdir()) == ["a.sh"]


async def test_a_local_tool_runs_no_program_of_the_project_on_the_workers_path(
    runs, project, monkeypatch, tmp_path_factory
):
    """Review s32, fifth round: the project's `.venv/bin` on the worker's PATH (activated before `kiwi dev`):
    a human's bash tool started the agent's `bash` there, unconfined, with the tool's secrets. A child's PATH
    has no folder of the project."""
    from tests.helpers import bash_tool, write

    marks = tmp_path_factory.mktemp("marks")
    venv = project / ".venv" / "bin"
    write(venv / "bash", f'#!/bin/sh\ntouch {marks}/RAN\nexec /bin/bash "$@"\n').chmod(0o755)
    monkeypatch.setenv("PATH", f"{venv}{os.pathsep}{os.environ['PATH']}")
    bash_tool(project, "hello", 'echo \'{"said": "hello"}\'\n', "Says hello")
    run_id = await agent_run(
        runs, project, "tooly", _grants(write="**") + '<execute resource="tool" id="hello"/>'
    )

    called = await runs.call_tool(run_id, "hello", {})

    assert called.status == "ok" and called.result == {"said": "hello"}, called
    assert list(marks.iterdir()) == []


async def test_reading_the_settings_runs_none_of_them(runs, project, tmp_path_factory):
    """Review s32, third round: Kiwi's own `git ls-files` (reading which submodules there are, at every write)
    ran the repository's `core.fsmonitor`, in the worker, with its environment. Kiwi's git reads with its
    hardening on the command line."""
    outside = tmp_path_factory.mktemp("human")
    marker = outside / "RAN"
    (outside / "watch.sh").write_text(f"#!/bin/sh\ntouch {marker}\n")
    (outside / "watch.sh").chmod(0o755)
    _repository(project, ("core.fsmonitor", str(outside / "watch.sh")))
    (project / "readme.txt").write_text("x\n")
    subprocess.run(["git", "-C", str(project), "-c", "core.fsmonitor=false", "add", "readme.txt"], check=True)
    run_id = await agent_run(runs, project, "quiet", _grants(write="**"))

    wrote = await _write(runs, run_id, "notes.txt", "x\n")

    assert wrote.status == "ok", wrote
    assert not marker.exists()
    subprocess.run(["git", "-C", str(project), "ls-files", "--stage"], capture_output=True, check=True)
    assert marker.exists()  # (what the human's git does: the program is there and runs)


async def test_a_module_a_setting_git_status_runs_loads_refuses_a_program_kiwi_does_not_model(
    runs, project, maker
):
    """Review s32, third round: `core.fsmonitor = python3 -m watcher` with no `watcher.py`: a program Kiwi does
    not model made one, and an editor's `git status` meanwhile ran it. A setting `git status` runs names what
    its program loads as it names the program."""
    _repository(project, ("core.fsmonitor", "python3 -m watcher"))
    (project / "make.py").write_text("open('made.txt', 'w').write('x')\n")
    run_id = await agent_run(runs, project, "loader", _grants("maker", write="**"))

    refused = await shell(runs, run_id, "maker", "make.py")

    assert refused.status == "denied" and "where it could make 'watcher" in refused.reason, refused


@pytest.mark.parametrize(
    ("key", "value", "written"),
    [
        ("credential.helper", "!/usr/bin/gh auth git-credential", "auth/views.py"),  # (gh auth setup-git)
        ("alias.t", "!npm test", "test/x.txt"),
        ("alias.r", "!git rebase origin/main", "origin/notes.txt"),
        ("alias.x", "!f() { echo $(echo $(date)); }; f", "notes.txt"),
        ("filter.lfs.smudge", "git-lfs smudge -- %f", "smudge"),
        # Third round: a backquote in single quotes and an arithmetic substitution refused every write; a
        # module Python loads named a data folder of the same name whole.
        ("core.pager", "tr -d '`'", "notes.txt"),
        ("core.pager", "echo $((1+2)) | less", "notes.txt"),
        ("diff.json.textconv", "python3 -m json.tool", "json/data.json"),
        # Fourth round: a filter's sed expression and a computed editor (no `git status` runs an editor).
        ("filter.redact.clean", "sed -e 's/^password=.*/password=REDACTED/'", "notes.txt"),
        ("core.editor", "$(brew --prefix)/bin/nvim", "bin/tool.sh"),
        ("core.editor", '"$(command -v nvim)"', "notes.txt"),
        ("alias.fmt", "!black src/ tests/", "src/app.py"),  # (fifth round: a folder an alias names)
    ],
)
async def test_common_settings_refuse_no_ordinary_write(runs, project, maker, key, value, written):
    """Review s32, second round: `gh auth setup-git` named `auth/`, `!npm test` `test/`, `!git rebase origin/main`
    a missing `origin/main` that refused every program Kiwi does not model, and an alias's nested substitution
    every write. An alias runs when the human types it (its program only is named); an argument is a file only
    for a program that runs it (`sh x`)."""
    _repository(project, (key, value))
    (project / written).parent.mkdir(parents=True, exist_ok=True)  # (there: a folder `auth/` was named)
    (project / written).write_text("")
    (project / "make.py").write_text("open('made.txt', 'w').write('x')\n")
    run_id = await agent_run(runs, project, "ordinary", _grants("maker", write="**"))

    wrote = await _write(runs, run_id, written, "x\n")
    ran = await shell(runs, run_id, "maker", "make.py")

    assert wrote.status == "ok", wrote
    assert ran.status == "ok" and ran.result["exit_code"] == 0, ran


async def test_a_hooks_folder_not_there_refuses_a_program_kiwi_does_not_model(
    runs, project, maker, tmp_path_factory, monkeypatch
):
    """Review s32, second round: the user's `core.hooksPath = .githooks`, and no `.githooks` in the project: a
    program Kiwi does not model could make it, with a `post-index-change` hook the `git status` of an editor
    runs meanwhile (only a folder that is there can be held). Such a program does not run; made empty by the
    human, the folder is held, and it runs."""
    home = tmp_path_factory.mktemp("home")
    (home / ".gitconfig").write_text("[core]\n\thooksPath = .githooks\n")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    _repository(project)
    (project / "make.py").write_text("open('made.txt', 'w').write('x')\n")
    run_id = await agent_run(runs, project, "hooks", _grants("maker", write="**"))

    refused = await shell(runs, run_id, "maker", "make.py")
    (project / ".githooks").mkdir()
    ran = await shell(runs, run_id, "maker", "make.py")

    assert refused.status == "denied" and "where it could make '.githooks'" in refused.reason, refused
    assert ran.status == "ok" and ran.result["exit_code"] == 0, ran


@pytest.mark.parametrize("repository", [True, False])
async def test_the_users_own_settings_name_places_of_the_project_too(
    runs, project, tmp_path_factory, monkeypatch, repository
):
    """`git config --global core.hooksPath .githooks`: a relative hooks folder, of every repository the user
    works in, this one's too (the human's git reads the user's settings; Kiwi's own git calls do not). Review
    s32, second round: in a project that is no repository yet too (`git init` there makes one)."""
    home = tmp_path_factory.mktemp("home")
    (home / ".gitconfig").write_text("[core]\n\thooksPath = .githooks\n")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    if repository:
        _repository(project)
    run_id = await agent_run(runs, project, "global", _grants(write="**"))

    refused = await _write(runs, run_id, ".githooks/post-checkout", "#!/bin/sh\ntouch PWNED\n")

    assert refused.status == "denied" and "the user's or the system's git settings" in refused.reason, refused
    assert str(home) not in refused.reason  # (no path of the machine in a message to the agent)
    assert not (project / ".githooks").exists()


@pytest.mark.parametrize(
    "argv",
    [
        ["tee", ".gitconfig"],
        ["cp", "stage/.gitconfig", "."],
        ["mv", "stage/.gitconfig", ".gitconfig"],
        ["rm", "-r", "scripts"],
    ],
)
async def test_a_program_kiwi_models_changes_none(runs, project, argv):
    """The words of a program Kiwi models name the file, or a folder it writes whole that holds it: refused
    before it runs."""
    _repository(project, ("include.path", "../.gitconfig"), ("core.fsmonitor", "scripts/watch.sh"))
    (project / ".gitconfig").write_text(TEAM)
    (project / "scripts").mkdir()
    (project / "scripts" / "watch.sh").write_text("#!/bin/sh\n")
    (project / "stage").mkdir()
    (project / "stage" / ".gitconfig").write_text(FSMONITOR)
    run_id = await agent_run(runs, project, "modeled", _grants(argv[0], write="**"))

    result = await shell(runs, run_id, *argv)

    assert result.status == "denied" and "which git's settings name" in result.reason, result
    assert (project / ".gitconfig").read_text() == TEAM
    assert (project / "scripts" / "watch.sh").exists()


async def test_a_program_kiwi_does_not_model_changes_none(runs, project, maker):
    """A program Kiwi does not model writes the project whole: the team's `.gitconfig` is held read-only for it
    (its write fails, and the rest of what it does is done)."""
    _repository(project, ("include.path", "../.gitconfig"))
    (project / ".gitconfig").write_text(TEAM)
    (project / "make.py").write_text(
        "try:\n"
        f"    open('.gitconfig', 'a').write({FSMONITOR!r})\n"
        "except OSError as exc:\n"
        "    print('refused:', exc.strerror)\n"
        "open('notes.txt', 'w').write('done\\n')\n"
    )
    run_id = await agent_run(runs, project, "maker", _grants("maker", write="**"))

    result = await shell(runs, run_id, "maker", "make.py")
    _humans_git_status(project)

    assert result.status == "ok" and "refused: Read-only file system" in result.result["stdout"], result
    assert (project / ".gitconfig").read_text() == TEAM
    assert (project / "notes.txt").read_text() == "done\n"
    assert pwned(project) == []


async def test_a_program_kiwi_does_not_model_does_not_run_where_it_could_make_one(runs, project, maker):
    """Review s32: an include not there yet cannot be held; made by such a program (`dd of=new.cfg`), it was
    there for a `git status` run meanwhile (an editor's, a prompt's) to obey until the command ended and Kiwi
    set it aside. Such a program does not run where it could make one; the call says how to go on."""
    _repository(project, ("include.path", "../new.cfg"))
    (project / "make.py").write_text(f"open('new.cfg', 'w').write({FSMONITOR!r})\n")
    run_id = await agent_run(runs, project, "maker", _grants("maker", write="**"))

    result = await shell(runs, run_id, "maker", "make.py")

    assert result.status == "denied" and "where it could make 'new.cfg'" in result.reason, result
    assert "make it (empty) first" in result.reason
    assert not (project / "new.cfg").exists()
    (project / "new.cfg").write_text("")  # (the human makes it: held from then on)
    held = await shell(runs, run_id, "maker", "make.py")
    assert held.status == "ok" and held.result["exit_code"] != 0, held  # (its write fails: read-only)
    assert (project / "new.cfg").read_text() == ""


async def test_a_hook_not_there_is_set_aside_after_a_program_kiwi_does_not_model(runs, project, maker):
    """A hook not there (`.husky/pre-rebase`) runs at a commit or a rebase, not at a `git status`: such a program
    runs where it could make one (a husky project has few of git's hooks), and one it made is set aside after it.
    git-lfs's settings (`git-lfs smudge -- %f`, every user of it has them) name no file `smudge`."""
    _repository(
        project,
        ("core.hooksPath", ".husky/_"),
        ("filter.lfs.smudge", "git-lfs smudge -- %f"),
        ("filter.lfs.process", "git-lfs filter-process"),
    )
    (project / ".husky" / "_").mkdir(parents=True)
    (project / ".husky" / "_" / "h").write_text("#!/bin/sh\n")
    (project / "make.py").write_text(
        "import sys\nopen('notes.txt', 'w').write('x')\n"
        "if sys.argv[1:] == ['hook']:\n    open('.husky/pre-rebase', 'w').write('touch PWNED\\n')\n"
    )
    run_id = await agent_run(runs, project, "maker", _grants("maker", write="**"))

    plain = await shell(runs, run_id, "maker", "make.py")
    hooked = await shell(runs, run_id, "maker", "make.py", "hook")

    assert plain.status == "ok" and plain.result["exit_code"] == 0, plain
    assert hooked.status == "denied" and "the command changed '.husky/pre-rebase'" in hooked.reason, hooked
    assert not (project / ".husky" / "pre-rebase").exists()
    assert [p.name for p in (project / ".husky").iterdir() if p.name.startswith("pre-rebase.set-aside-")]


async def test_git_making_a_named_file_sets_it_aside(runs, project):
    """A branch that tracks the include the worktree does not have: git checking it out makes it (git writes the
    project whole, so its words are not refused), and it is set aside after, the call failing naming it."""
    _repository(project, ("include.path", "../new.cfg"))
    git = ["git", "-C", str(project), "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    git += ["-c", "core.fsmonitor=false"]  # (the branch made here runs nothing)
    (project / "readme.txt").write_text("x\n")
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "the human's"], check=True)
    subprocess.run([*git, "checkout", "-qb", "evil"], check=True)
    (project / "new.cfg").write_text(FSMONITOR)
    subprocess.run([*git, "add", "new.cfg"], check=True)
    subprocess.run([*git, "commit", "-qm", "the agent's"], check=True)
    subprocess.run([*git, "checkout", "-q", "main"], check=True)
    assert not (project / "new.cfg").exists() and pwned(project) == []
    run_id = await agent_run(runs, project, "switcher", _grants("git", write=_WHOLE_PROJECT))

    result = await shell(runs, run_id, "git", "checkout", "evil")
    _humans_git_status(project)

    assert result.status == "denied", result
    assert "the command changed 'new.cfg', which git's settings name (include.path in .git/config)" in (
        result.reason
    )
    assert not (project / "new.cfg").exists()
    assert [p.name for p in project.iterdir() if p.name.startswith("new.cfg.set-aside-")], result
    assert pwned(project) == []


async def test_a_named_file_with_another_name_refuses_commands_that_write(runs, project, maker):
    """`ln .gitconfig notes` (made before): a program Kiwi does not model, held off `.gitconfig`, writes the
    team's settings by its other name. (A program Kiwi models is refused a file with other names already.)"""
    _repository(project, ("include.path", "../.gitconfig"))
    (project / ".gitconfig").write_text(TEAM)
    os.link(project / ".gitconfig", project / "notes")
    (project / "append.py").write_text(f"open('notes', 'a').write({FSMONITOR!r})\n")
    run_id = await agent_run(runs, project, "linked", _grants("maker", write="**"))

    result = await shell(runs, run_id, "maker", "append.py")

    assert result.status == "denied" and "has other names (hard links)" in result.reason, result
    assert (project / ".gitconfig").read_text() == TEAM


@pytest.mark.parametrize("whose", ["the project's", "the user's"])
async def test_settings_git_cannot_read_refuse_every_write(
    runs, project, whose, tmp_path_factory, monkeypatch
):
    """A config file git cannot parse (an included one of the project, or the user's own): Kiwi cannot tell what
    the settings name, so it writes nothing, and says why and what to do, naming no path of the machine."""
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    _repository(project, ("include.path", "../.gitconfig"))
    broken = project / ".gitconfig" if whose == "the project's" else home / ".gitconfig"
    broken.write_text("[core\n")
    (project / "readme.txt").write_text("read me\n")
    run_id = await agent_run(runs, project, "broken", _grants(write="**"))

    refused = await _write(runs, run_id, "notes.txt", "x\n")

    assert refused.status == "denied", refused
    assert "cannot tell which files git's settings name" in refused.reason, refused.reason
    assert "bad config line 1" in refused.reason and "until a human fixes that" in refused.reason
    assert str(home) not in refused.reason and str(project) not in refused.reason, refused.reason
    assert ("~/.gitconfig" if whose == "the user's" else ".gitconfig") in refused.reason
    assert not (project / "notes.txt").exists()
    # Reading is not writing.
    read = await runs.call_tool(run_id, "filesystem.read", {"path": "readme.txt"})
    assert read.status == "ok" and read.result["content"] == "read me\n", read


async def test_git_switches_branches_and_writes_no_named_file(runs, project):
    """git writes the whole project (`git checkout B`), so its words are not refused for a file it may not touch
    (a husky project's agent switches branches); the team's `.gitconfig` is held read-only for it, so a branch
    whose `.gitconfig` runs a program (one the agent committed with `git apply --cached`, which writes no file)
    is not checked out over it. (A command's git writes the whole project only under grants naming each
    protected place there: README, Shell.)"""
    _repository(project, ("include.path", "../.gitconfig"))
    (project / ".gitconfig").write_text(TEAM)
    git = ["git", "-C", str(project), "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    git += ["-c", "core.fsmonitor=false"]  # (the branch made here runs nothing)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "the human's"], check=True)
    subprocess.run([*git, "checkout", "-qb", "evil"], check=True)
    (project / ".gitconfig").write_text(FSMONITOR)
    subprocess.run([*git, "commit", "-qam", "the agent's"], check=True)
    subprocess.run([*git, "checkout", "-q", "main"], check=True)
    assert (project / ".gitconfig").read_text() == TEAM and pwned(project) == []
    run_id = await agent_run(runs, project, "switcher", _grants("git", write=_WHOLE_PROJECT))

    other = await shell(runs, run_id, "git", "checkout", "-b", "other")
    evil = await shell(runs, run_id, "git", "checkout", "evil")
    _humans_git_status(project)

    assert other.status == "ok" and other.result["exit_code"] == 0, other
    # (Held read-only for git, the file stays the human's; git says so, and switches all the same.)
    assert evil.status == "ok" and "unable to unlink old '.gitconfig'" in evil.result["stderr"], evil
    assert (project / ".gitconfig").read_text() == TEAM
    assert pwned(project) == []


async def test_a_rollback_writes_no_named_file_back(runs, project):
    """A checkpoint taken while the agent could write `.gitconfig` (no include named it yet) holds the agent's
    `.gitconfig`; the human then made it the team's and included it. A rollback to that checkpoint (a human
    approves it, reading the run's summary) wrote the agent's back. It leaves such files as they are now."""
    _repository(project)
    approver("alice")
    run_id = await agent_run(runs, project, "roller", _tool_grants(write="**"))
    assert (await _write(runs, run_id, ".gitconfig", FSMONITOR)).status == "ok"
    assert (await _write(runs, run_id, "notes.txt", "first\n")).status == "ok"
    checkpoint = await runs.call_tool(run_id, "git.checkpoint", {"message": "before"})
    assert checkpoint.status == "ok" and checkpoint.result["available"], checkpoint
    (project / ".gitconfig").write_text(TEAM)  # (the human's, from now on included)
    _repository(project, ("include.path", "../.gitconfig"))
    assert (await _write(runs, run_id, "notes.txt", "second\n")).status == "ok"

    rolled = await approved_rollback(runs, run_id, checkpoint)  # (a human approves it)
    _humans_git_status(project)

    assert rolled.status == "ok", rolled
    assert (project / "notes.txt").read_text() == "first\n"  # (the rest is rolled back)
    assert (project / ".gitconfig").read_text() == TEAM
    assert pwned(project) == []


# What git's settings name is read as the human's git reads it (unit tests of activities.gitnamed with real git:
# the refusals built on it are the attacks above).


def test_a_project_below_the_work_trees_top_reads_includes_from_there(tmp_path):
    """Review s32: git prints a config file's origin relative to the work tree's top (it moves there first);
    taken from the project's folder below it, `../proj/.gitconfig` was read as `proj/proj/.gitconfig`."""
    from activities import gitnamed

    project = tmp_path / "proj"
    project.mkdir()
    _repository(tmp_path, ("include.path", "../proj/.gitconfig"))
    (project / ".gitconfig").write_text(TEAM)

    assert [n.place for n in gitnamed.named_places(str(project))] == [".gitconfig"]


@pytest.mark.skipif(os.getuid() != 0, reason="only root gives a project to another user")
def test_a_repository_another_user_owns_is_read_all_the_same(project):
    """Review s32: a project another user owns (a container's bind mount): git reads no `.git/config` there
    ("dubious ownership") and said nothing, so nothing was named."""
    from activities import gitnamed

    _repository(project, ("include.path", "../.gitconfig"))
    for folder, subdirs, files in os.walk(project):
        for name in [folder, *(os.path.join(folder, n) for n in subdirs + files)]:
            os.lchown(name, 65534, 65534)

    assert ".gitconfig" in [n.place for n in gitnamed.named_places(str(project))]


def test_no_git_where_the_worker_runs_names_nothing_it_can_tell(project, tmp_path_factory, monkeypatch):
    """Review s32: with no git on the worker's PATH nothing was named, though the human's git obeys the
    settings all the same. In a repository that is an answer Kiwi cannot give: Unreadable."""
    from activities import gitnamed

    _repository(project, ("include.path", "../.gitconfig"))
    monkeypatch.setenv("PATH", str(tmp_path_factory.mktemp("empty")))

    with pytest.raises(gitnamed.Unreadable, match="git is not installed where Kiwi's worker runs"):
        gitnamed.named_places(str(project))


async def test_a_rollback_puts_back_no_link_above_a_named_file(runs, project):
    """Review s32, third round: the checkpoint held `scripts`, a link to the agent's folder; the human then made
    `scripts/watch.sh` theirs and named it in `core.fsmonitor`. The rollback put the link back over the folder,
    and `git status` ran the agent's `watch.sh`. A rollback leaves a named file, and what is above it, as it is."""
    _repository(project)
    approver("alice")
    (project / "evil").mkdir()
    (project / "evil" / "watch.sh").write_text("#!/bin/sh\ntouch PWNED\n")
    os.symlink("evil", project / "scripts")  # (the agent's, by a command it could run then)
    run_id = await agent_run(runs, project, "roller", _tool_grants(write="**"))
    checkpoint = await runs.call_tool(run_id, "git.checkpoint", {"message": "before"})
    assert checkpoint.status == "ok" and checkpoint.result["available"], checkpoint
    (project / "scripts").unlink()
    (project / "scripts").mkdir()
    (project / "scripts" / "watch.sh").write_text("#!/bin/sh\nexit 0\n")  # (the human's)
    _repository(project, ("core.fsmonitor", "scripts/watch.sh"))

    rolled = await approved_rollback(runs, run_id, checkpoint)

    assert rolled.status == "ok", rolled
    assert not (project / "scripts").is_symlink()
    assert (project / "scripts" / "watch.sh").read_text() == "#!/bin/sh\nexit 0\n"


def test_a_linked_worktree_project_runs_no_git_of_its_own(tmp_path, monkeypatch):
    """Review s32, fifth round: the project a linked worktree (its git folder in the main repository, outside
    the project, with no `.ai` above it), the project's `.venv/bin` on the worker's PATH: Kiwi's reading of
    git's settings looked for git with the git folder as the project, and ran the agent's `.venv/bin/git`."""
    from activities import gitnamed

    main, project, marks = tmp_path / "main", tmp_path / "wt", tmp_path / "marks"
    marks.mkdir()
    human = ["-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    subprocess.run(["git", "init", "-q", "-b", "main", str(main)], check=True)
    subprocess.run(["git", "-C", str(main), *human, "commit", "-q", "--allow-empty", "-m", "x"], check=True)
    subprocess.run(["git", "-C", str(main), "worktree", "add", "-q", "-b", "wt", str(project)], check=True)
    venv = project / ".venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "git").write_text(f'#!/bin/sh\ntouch {marks}/RAN\nexec /usr/bin/env -i git "$@"\n')
    (venv / "git").chmod(0o755)
    monkeypatch.setenv("PATH", f"{venv}{os.pathsep}{os.environ['PATH']}")

    gitnamed.named_places(str(project))

    assert list(marks.iterdir()) == []


def _planted_on_path(project: Path, name: str, marks: Path, monkeypatch) -> None:
    """The agent's program ``name`` in the project's `.venv/bin`, which is on the worker's PATH (the human
    activated the project's venv before `kiwi dev`): running it leaves a mark."""
    venv = project / ".venv" / "bin"
    venv.mkdir(parents=True, exist_ok=True)
    (venv / name).write_text(f"#!/bin/sh\ntouch {marks}/{name}\nexit 1\n")
    (venv / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{venv}{os.pathsep}{os.environ['PATH']}")


def test_the_container_engine_is_none_of_a_projects(project, tmp_path_factory, monkeypatch):
    """Review s32, sixth round: docker tools' engine was found on the worker's PATH as it is: the agent's
    `.venv/bin/podman` was the engine every docker tool call ran, unconfined."""
    from activities.container import container_engine

    marks = tmp_path_factory.mktemp("marks")
    _planted_on_path(project, "podman", marks, monkeypatch)

    engine = container_engine()

    assert engine is None or not engine[0].startswith(str(project)), engine


async def test_an_mcp_server_is_started_from_no_folder_of_a_project(project, tmp_path_factory, monkeypatch):
    """Review s32, sixth round: an MCP server's command (`npx`) was looked for on the worker's PATH as it is:
    the agent's `node_modules/.bin/npx`, on it, started with the server's secrets. Its PATH has no folder of a
    Kiwi project."""
    from kiwi.upstream.stdio import StdioLink

    marks = tmp_path_factory.mktemp("marks")
    _planted_on_path(project, "kiwi-test-server", marks, monkeypatch)
    link = StdioLink("kiwi-test-server", [])

    with pytest.raises(Exception):  # noqa: B017 (not found: how the launcher says so is its own)
        async with link.streams():
            pass

    assert list(marks.iterdir()) == []


@pytest.mark.parametrize("value", ["sh${IFS}watch", "bash -c \"sh $'watch'\""])
async def test_words_a_shell_makes_that_kiwi_cannot_read_refuse_every_write(runs, project, value):
    """Review s32, sixth round: `sh${IFS}watch` and `$'...'` quoting make words a shell makes and Kiwi's reading
    does not: for a setting `git status` runs, that is a program Kiwi cannot tell."""
    _repository(project, ("core.fsmonitor", value))
    run_id = await agent_run(runs, project, "ifs", _grants(write="**"))

    refused = await _write(runs, run_id, "watch", "touch PWNED\n")

    assert refused.status == "denied" and "computes the program git runs" in refused.reason, refused


def test_a_path_entry_that_is_a_link_in_a_project_is_left_out(project, tmp_path_factory, monkeypatch):
    """Review s32, seventh round: the project's `.venv` made a link to `/usr` passed (its real path is no
    project's), and the PATH kept its text, which the agent could point at its own folder later. An entry is
    left out where it is written and where it leads, and kept as the folder it leads to. Nothing left is no
    empty PATH (the current folder to a shell)."""
    from kiwi.searchpath import NOWHERE, search_path

    (project / ".venv").symlink_to("/usr")
    linked = str(project / ".venv" / "bin")

    assert linked not in search_path(f"{linked}{os.pathsep}/usr/bin").split(os.pathsep)
    assert search_path(f"{linked}{os.pathsep}relative") == NOWHERE


def test_kiwi_doctor_runs_no_git_of_the_project(project, tmp_path_factory, monkeypatch):
    """Review s32, seventh round: `kiwi doctor`'s check of git's settings ran the `git` found on PATH as it was,
    the project's `.venv/bin/git`."""
    from kiwi.cli.doctor import _git_layouts

    marks = tmp_path_factory.mktemp("marks")
    _planted_on_path(project, "git", marks, monkeypatch)

    _git_layouts(project)

    assert list(marks.iterdir()) == []


async def test_a_program_a_status_setting_finds_on_the_path_in_the_project(runs, project, monkeypatch):
    """Review s32, seventh round: `filter.lfs.process = git-lfs filter-process` (what `git lfs install` writes),
    the project's `.venv/bin` on PATH (the human's, as the worker's, started from their shell): the agent wrote
    `.venv/bin/git-lfs`, which the human's `git status` found and ran."""
    venv = project / ".venv" / "bin"
    venv.mkdir(parents=True)
    monkeypatch.setenv("PATH", f"{venv}{os.pathsep}{os.environ['PATH']}")
    _repository(project, ("filter.lfs.process", "git-lfs filter-process"))
    run_id = await agent_run(runs, project, "lfs", _grants(write="**"))

    refused = await _write(runs, run_id, ".venv/bin/git-lfs", "#!/bin/sh\ntouch PWNED\n")

    assert refused.status == "denied" and "filter.lfs.process in .git/config" in refused.reason, refused
    assert not (venv / "git-lfs").exists()
