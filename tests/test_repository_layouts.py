"""A folder is a git repository by its layout, whatever its name: a HEAD with objects/ and refs/ (or with a
commondir naming a folder that has them). git run in it, or below it, reads the config beside them, and runs
the `core.fsmonitor` that config names (review s30 F6). An agent that may write a folder made one with the file
tools, and the human's next `git status` there ran the agent's program. Kiwi now writes no such folder that no
write grant names: not with the file tools, not with a program it models, not with one it does not model.
Against the real stack (a Temporal server, Kiwi's worker, real programs, real git)."""

from __future__ import annotations

import asyncio
import base64
import io
import os
import subprocess
import tarfile
from pathlib import Path

import pytest

from activities import confinement, setaside
from tests.helpers import approver, wait_for
from tests.test_attack_shell import agent_run, shell
from tests.test_humans import pending_approval

FSMONITOR = "[core]\n\tfsmonitor = touch PWNED\n"


def _grants(commands: str = "", write: str = "out/**") -> str:
    return (
        '<read resource="filesystem" path="**"/>'
        + "".join(f'<write resource="filesystem" path="{w}"/>' for w in write.split(","))
        + (f'<execute resource="shell" commands="{commands}"/>' if commands else "")
    )


def _is_repository(folder: Path) -> bool:
    """What the human's git says of ``folder``: a repository it would use (and whose config it would obey)."""
    found = subprocess.run(
        ["git", "-C", str(folder), "rev-parse", "--git-dir"],
        capture_output=True,
        text=True,
        env={**os.environ, "GIT_CEILING_DIRECTORIES": str(folder.parent)},
    )
    return found.returncode == 0


def _committed_fixture(project: Path) -> Path:
    """The project a git repository whose commit holds a test fixture's bare repository, tests/fixtures/repo.git
    (the human's): its path."""
    subprocess.run(["git", "init", "-q", "-b", "main", str(project)], check=True)
    bare = project / "tests" / "fixtures" / "repo.git"
    subprocess.run(["git", "init", "-q", "--bare", str(bare)], check=True)
    git = ["git", "-C", str(project), "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "the human's"], check=True)
    return bare


async def _write(runs, run_id: str, path: str, content: str = "x\n"):
    return await runs.call_tool(run_id, "filesystem.write", {"path": path, "content": content})


@pytest.mark.parametrize("last", ["HEAD", "refs/heads/main", "objects/info/x"])
async def test_the_file_tools_make_no_repository_by_its_layout(runs, project, last):
    """Each of a repository's names, written last, is refused where the others are there, and nothing of it is
    written: in any order, the folder never becomes a repository (git agrees), and the rest was written."""
    run_id = await agent_run(runs, project, "layout", _grants())
    pieces = {
        "HEAD": "ref: refs/heads/main\n",
        "refs/heads/main": "",
        "objects/info/x": "",
        "config": FSMONITOR,
    }
    for path in [p for p in pieces if p != last]:
        assert (await _write(runs, run_id, f"out/r/{path}", pieces[path])).status == "ok", path

    refused = await _write(runs, run_id, f"out/r/{last}", pieces[last])

    assert refused.status == "denied", refused
    assert "would make 'out/r' a git repository by its layout" in refused.reason, refused.reason
    assert 'path="out/r/HEAD"' in refused.reason  # (the grant that would allow it, named)
    assert not (project / "out" / "r" / last).exists()
    assert not _is_repository(project / "out" / "r")
    assert (project / "out" / "r" / "config").read_text() == FSMONITOR


async def test_a_commondir_counts_as_objects_and_refs(runs, project):
    """A HEAD beside a `commondir` naming a folder that has objects/ and refs/ (no HEAD there: no repository by
    itself) is a repository too, with that folder's config."""
    run_id = await agent_run(runs, project, "common", _grants())
    for path in ("out/c/objects/x", "out/c/refs/x", "out/c/config"):
        assert (await _write(runs, run_id, path, FSMONITOR)).status == "ok", path
    assert (await _write(runs, run_id, "out/w/commondir", "../c\n")).status == "ok"

    refused = await _write(runs, run_id, "out/w/HEAD", "ref: refs/heads/main\n")

    assert refused.status == "denied" and "would make 'out/w' a git repository" in refused.reason, refused
    assert not _is_repository(project / "out" / "w")


async def test_making_a_folder_or_moving_one_in_is_refused_as_writing_is(runs, project):
    """filesystem.create (a folder) and filesystem.move complete a repository as filesystem.write does: refused alike."""
    run_id = await agent_run(runs, project, "mover", _grants())
    for path in ("out/r/HEAD", "out/r/objects/x", "out/s/refs/x"):
        assert (await _write(runs, run_id, path, "ref: refs/heads/main\n")).status == "ok", path

    made = await runs.call_tool(run_id, "filesystem.create", {"path": "out/r/refs"})
    moved = await runs.call_tool(
        run_id, "filesystem.move", {"source": "out/s/refs", "destination": "out/r/refs"}
    )

    assert made.status == "denied" and "would make 'out/r' a git repository" in made.reason, made
    assert moved.status == "denied" and "would make 'out/r' a git repository" in moved.reason, moved
    assert not (project / "out" / "r" / "refs").exists() and (project / "out" / "s" / "refs" / "x").exists()
    assert not _is_repository(project / "out" / "r")


async def test_a_repository_the_human_made_is_written_only_by_a_grant_naming_it(runs, project):
    """A bare repository the project holds (a test fixture) is a repository by its layout: under `write
    fixtures/**` its config is not the agent's to write; a grant naming it reaches it."""
    bare = project / "fixtures" / "bare.git"
    subprocess.run(["git", "init", "-q", "--bare", str(bare)], check=True)
    before = (bare / "config").read_text()
    broad = await agent_run(runs, project, "broad", _grants(write="fixtures/**"))
    named = await agent_run(runs, project, "named", _grants(write="fixtures/bare.git/**"))

    refused = await _write(runs, broad, "fixtures/bare.git/config", FSMONITOR)
    assert refused.status == "denied", refused
    assert (
        "'fixtures/bare.git/config' is in 'fixtures/bare.git', a git repository by its layout"
        in refused.reason
    )
    assert (bare / "config").read_text() == before

    allowed = await _write(runs, named, "fixtures/bare.git/description", "the human's fixture\n")
    assert allowed.status == "ok", allowed
    assert (bare / "description").read_text() == "the human's fixture\n"


async def test_a_program_kiwi_models_makes_no_repository_by_its_layout(runs, project):
    """`touch out/r/HEAD` where out/r has objects/ and refs/ is refused before it runs; `cp -r` of the human's
    bare repository (readable, not writable) into out/ makes one where no word of the command names HEAD: the
    copy's HEAD is set aside after the command, and the call fails naming it."""
    bare = project / "fixtures" / "bare.git"
    subprocess.run(["git", "init", "-q", "--bare", str(bare)], check=True)
    run_id = await agent_run(runs, project, "copier", _grants("mkdir,touch,cp"))
    assert (await shell(runs, run_id, "mkdir", "-p", "out/r/objects", "out/r/refs")).status == "ok"

    touched = await shell(runs, run_id, "touch", "out/r/HEAD")
    copied = await shell(runs, run_id, "cp", "-r", "fixtures/bare.git", "out/copy")

    assert touched.status == "denied" and "would make 'out/r' a git repository" in touched.reason, touched
    assert not (project / "out" / "r" / "HEAD").exists()
    assert copied.status == "denied", copied
    assert "the command made 'out/copy' a git repository by its layout (its 'HEAD';" in copied.reason
    assert not _is_repository(project / "out" / "copy")
    assert [p.name for p in (project / "out" / "copy").iterdir() if p.name.startswith("HEAD.set-aside-")]
    assert (project / "out" / "copy" / "config").is_file()  # (the rest stays where it is, for the human)


@pytest.mark.skipif(confinement.landlock.abi_version() == 0, reason="this kernel has no Landlock")
async def test_a_repository_below_what_a_program_kiwi_models_writes_is_held(runs, project):
    """`cp -r stage/. fixtures/` copies files over those below fixtures/, the config of the bare repository
    there too: no word names it. The repositories by their layout below what the command writes are held
    read-only for it, as the project's `.git` is."""
    if confinement.namespaces_refused():
        pytest.skip(f"no mount namespace here: {confinement.namespaces_refused()}")
    bare = project / "fixtures" / "bare.git"
    subprocess.run(["git", "init", "-q", "--bare", str(bare)], check=True)
    before = (bare / "config").read_text()
    run_id = await agent_run(runs, project, "overlay", _grants("cp", write="fixtures/**,stage/**"))
    assert (await _write(runs, run_id, "stage/bare.git/config", FSMONITOR)).status == "ok"

    copied = await shell(runs, run_id, "cp", "-r", "stage/.", "fixtures/")

    assert copied.status == "ok" and copied.result["exit_code"] != 0, copied
    assert "Read-only file system" in copied.result["stderr"], copied.result
    assert (bare / "config").read_text() == before


async def test_an_archive_unpacks_no_repository_by_its_layout(runs, project):
    """tar (which Kiwi unpacks through a folder of its own, then writes into the project itself) leaves out the
    HEAD that would make a repository, names it, and unpacks the rest."""
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as made:
        for name, data in (("r/objects/x", b""), ("r/refs/x", b""), ("r/config", FSMONITOR.encode())):
            entry = tarfile.TarInfo(name)
            entry.size = len(data)
            made.addfile(entry, io.BytesIO(data))
        entry = tarfile.TarInfo("r/HEAD")
        entry.size = len(b"ref: refs/heads/main\n")
        made.addfile(entry, io.BytesIO(b"ref: refs/heads/main\n"))
    run_id = await agent_run(runs, project, "unpacker", _grants("tar"))
    content = base64.b64encode(archive.getvalue()).decode()
    wrote = await runs.call_tool(
        run_id, "filesystem.write", {"path": "out/a.tar", "content": content, "encoding": "base64"}
    )
    assert wrote.status == "ok", wrote

    result = await shell(runs, run_id, "tar", "-xf", "a.tar", cwd="out")

    assert result.status == "ok" and result.result["exit_code"] != 0, result
    assert "out/r/HEAD: not written" in result.result["stderr"], result.result
    assert "would make 'out/r' a git repository" in result.result["stderr"]
    assert not (project / "out" / "r" / "HEAD").exists() and (project / "out" / "r" / "config").exists()
    assert not _is_repository(project / "out" / "r")


@pytest.mark.skipif(confinement.landlock.abi_version() == 0, reason="this kernel has no Landlock")
@pytest.mark.parametrize(
    ("made", "aside", "said"),
    [
        ("x", "x/HEAD", "'sub/x' a git repository by its layout (its 'HEAD';"),
        (".ai", ".ai", "'sub/.ai'"),
        ("temporal-dev.yml", "temporal-dev.yml", "'sub/temporal-dev.yml'"),
    ],
)
async def test_a_program_kiwi_does_not_model_makes_none_either(runs, project, maker, made, aside, said):
    """A program Kiwi does not model, writing sub/ whole, made a repository by its layout, a Kiwi project's
    `.ai` (kiwi run in sub/ takes it for its project's: its trusted keys, its harness) or a `temporal-dev.yml`
    (the server `kiwi dev` starts there): Kiwi looked below for a `.git` only. Each is set aside now, nothing
    deleted, and the call fails naming it."""
    (project / "sub").mkdir()
    code = {
        "x": "import os\nfor d in ('x/objects', 'x/refs'): os.makedirs(d)\n"
        f"open('x/HEAD', 'w').write('ref: refs/heads/main\\n'); open('x/config', 'w').write({FSMONITOR!r})\n",
        ".ai": "import os\nos.makedirs('.ai/config'); open('.ai/config/agent_harness.yaml', 'w').write('x: 1\\n')\n",
        "temporal-dev.yml": "open('temporal-dev.yml', 'w').write('port: 1\\n')\n",
    }[made]
    (project / "sub" / "make.py").write_text(code)
    run_id = await agent_run(runs, project, "maker", _grants("maker", write="sub/**"))

    result = await shell(runs, run_id, "maker", "make.py", cwd="sub")

    assert result.status == "denied" and f"the command made {said}" in result.reason, result
    assert not (project / "sub" / aside).exists()
    folder = (project / "sub" / aside).parent
    assert [p.name for p in folder.iterdir() if p.name.startswith(f"{Path(aside).name}.set-aside-")], result
    if made == "x":
        assert not _is_repository(project / "sub" / "x")


async def test_a_grant_names_no_repository_made_at_its_own_folder(runs, project):
    """Review s31 F3: `write src/**` named src, so under it the agent made src a repository (HEAD, objects/,
    refs/, a config), whose config every git run below src obeyed. A repository is made only where a grant
    names its HEAD; `write out/new.git/HEAD` (with the rest) allows it there."""
    (project / "src" / "pkg").mkdir(parents=True)
    run_id = await agent_run(runs, project, "src", _grants(write="src/**"))
    opted = await agent_run(runs, project, "opted", _grants(write="out/**,out/new.git/HEAD"))
    for path in ("src/config", "src/objects/x", "src/refs/heads/main"):
        assert (await _write(runs, run_id, path, FSMONITOR)).status == "ok", path
    for path in ("out/new.git/objects/x", "out/new.git/refs/heads/main"):
        assert (await _write(runs, opted, path)).status == "ok", path

    refused = await _write(runs, run_id, "src/HEAD", "ref: refs/heads/main\n")
    allowed = await _write(runs, opted, "out/new.git/HEAD", "ref: refs/heads/main\n")

    assert refused.status == "denied" and "would make 'src' a git repository" in refused.reason, refused
    assert 'path="src/HEAD"' in refused.reason
    assert not _is_repository(project / "src") and not _is_repository(project / "src" / "pkg")
    assert allowed.status == "ok", allowed
    assert _is_repository(project / "out" / "new.git")


async def test_a_move_never_waits_for_itself(runs, project):
    """Review s31 F1: filesystem.move of out/r/objects to out/r/refs locked out/r for its source, then waited
    for that lock for its destination: the worker's event loop stopped for good. It answers now."""
    run_id = await agent_run(runs, project, "renamer", _grants())
    assert (await runs.call_tool(run_id, "filesystem.create", {"path": "out/r/objects"})).status == "ok"

    moved = await asyncio.wait_for(
        runs.call_tool(run_id, "filesystem.move", {"source": "out/r/objects", "destination": "out/r/refs"}),
        timeout=60,
    )

    assert moved.status == "ok" and moved.result["moved"], moved
    assert (project / "out" / "r" / "refs").is_dir()


async def test_a_repository_moved_out_of_the_folder_a_grant_names_is_refused(runs, project):
    """Review s31 F6: under `write fixtures/bare.git/**` the agent may write the human's bare repository;
    filesystem.move then carried it, config and all, to out/evil, where no grant names one."""
    bare = project / "fixtures" / "bare.git"
    subprocess.run(["git", "init", "-q", "--bare", str(bare)], check=True)
    run_id = await agent_run(runs, project, "carrier", _grants(write="fixtures/bare.git/**,out/**"))

    moved = await runs.call_tool(
        run_id, "filesystem.move", {"source": "fixtures/bare.git", "destination": "out/evil"}
    )

    assert moved.status == "denied" and "which would become 'out/evil'" in moved.reason, moved
    assert bare.is_dir() and not (project / "out" / "evil").exists()


async def test_a_head_that_is_a_link_and_folders_made_in_one_command_make_no_repository(runs, project):
    """Review s31 F2: HEAD a link to refs/heads (a folder once made: git takes a link HEAD whose text starts
    `refs/`), then `mkdir -p out/r/objects out/r/refs/heads` in one command. Each path alone made no
    repository, and the watch after it took the link for a folder. The command is refused before it runs."""
    run_id = await agent_run(runs, project, "linker", _grants("ln,mkdir"))
    assert (await _write(runs, run_id, "out/r/config", FSMONITOR)).status == "ok"
    linked = await shell(runs, run_id, "ln", "-s", "refs/heads", "out/r/HEAD")
    assert linked.status == "ok" and linked.result["exit_code"] == 0, linked

    made = await shell(runs, run_id, "mkdir", "-p", "out/r/objects", "out/r/refs/heads")

    assert made.status == "denied" and "would make 'out/r' a git repository" in made.reason, made
    assert not _is_repository(project / "out" / "r")


@pytest.mark.skipif(confinement.landlock.abi_version() == 0, reason="this kernel has no Landlock")
async def test_every_head_of_a_repository_made_is_set_aside(runs, project, maker):
    """Review s31 F4: with `head` and `HEAD` both in the folder, the watch set aside `head` and left `HEAD`:
    the folder stayed a repository. Every entry read as HEAD is set aside."""
    (project / "sub").mkdir()
    (project / "sub" / "make.py").write_text(
        "import os\nfor d in ('r/objects', 'r/refs'): os.makedirs(d)\n"
        "open('r/head', 'w').write('x\\n'); open('r/HEAD', 'w').write('ref: refs/heads/main\\n')\n"
        f"open('r/config', 'w').write({FSMONITOR!r})\n"
    )
    run_id = await agent_run(runs, project, "maker", _grants("maker", write="sub/**"))

    result = await shell(runs, run_id, "maker", "make.py", cwd="sub")

    assert result.status == "denied" and "'sub/r' a git repository by its layout" in result.reason, result
    assert sorted(
        p.name.split(".set-aside-")[0] for p in (project / "sub" / "r").iterdir() if ".set-aside-" in p.name
    ) == ["HEAD", "head"]
    assert not _is_repository(project / "sub" / "r")


@pytest.mark.skipif(confinement.landlock.abi_version() == 0, reason="this kernel has no Landlock")
async def test_git_rewrites_a_test_fixtures_repository_it_tracks(runs, project):
    """Review s31 F8: the bare repository of a test fixture, tracked by the project's git, was held read-only
    for git too: `git stash` left the tree half done ("unable to unlink"), and `git restore -- tests` failed.
    What git writes there is the repository's own content: git is not held out of it."""
    bare = _committed_fixture(project)
    (bare / "description").write_text("changed by the human\n")
    run_id = await agent_run(runs, project, "restorer", _grants("git", write="tests/**"))

    restored = await shell(runs, run_id, "git", "restore", "--", "tests")

    assert restored.status == "ok" and restored.result["exit_code"] == 0, restored
    assert (bare / "description").read_text() != "changed by the human\n"


async def test_a_repository_moved_by_a_shell_command_is_one_made(runs, project):
    """Review s31, second round: under `write **` and `write fixtures/bare.git/**` the agent wrote the named
    fixture's config, then `mv fixtures/bare.git out/evil` carried it where no grant names a repository
    (filesystem.move refused this; mv kept its identity, and the watch took it for one moved, not made). A
    repository by its layout is followed by its path: at a new one it is made, and loses its HEAD."""
    bare = project / "fixtures" / "bare.git"
    subprocess.run(["git", "init", "-q", "--bare", str(bare)], check=True)
    run_id = await agent_run(runs, project, "carrier", _grants("mv", write="**,fixtures/bare.git/**"))
    assert (await _write(runs, run_id, "fixtures/bare.git/config", FSMONITOR)).status == "ok"

    moved = await shell(runs, run_id, "mv", "fixtures/bare.git", "out-evil")

    assert moved.status == "denied" and "the command made 'out-evil' a git repository" in moved.reason, moved
    assert 'path="out-evil/HEAD"' in moved.reason
    assert not _is_repository(project / "out-evil")


async def test_git_writing_the_agents_config_into_the_humans_repository_is_undone(runs, project):
    """Review s31, second round: git is not held out of a repository by its layout (what it writes there is
    mostly the repository's own content), so the agent staged a config of its own at the fixture's path
    (moving the fixture away first, writing there, `git add`, moving it back) and `git checkout --` wrote it
    into the human's bare repository, whose identity had not changed. A repository's settings are part of
    what the watch compares: whatever the route, no folder git takes for a repository ends with the agent's
    config."""
    _committed_fixture(project)
    run_id = await agent_run(runs, project, "stager", _grants("git,mv,rm", write="tests/**,.git/**"))

    for argv in (
        ["mv", "tests/fixtures", "tests/keep"],
        ["write", "tests/fixtures/repo.git/config"],
        ["git", "add", "tests/fixtures/repo.git/config"],
        ["rm", "-r", "tests/fixtures"],
        ["mv", "tests/keep", "tests/fixtures"],
        ["git", "checkout", "--", "tests/fixtures"],
    ):
        if argv[0] == "write":
            await _write(runs, run_id, argv[1], FSMONITOR)
        else:
            await shell(runs, run_id, *argv)

    repositories = [
        d for d in project.rglob("*") if d.is_dir() and ".git" not in d.parts and _is_repository(d)
    ]
    assert not [d for d in repositories if "PWNED" in (d / "config").read_text()], repositories


@pytest.mark.skipif(confinement.landlock.abi_version() == 0, reason="this kernel has no Landlock")
async def test_a_grant_of_matching_files_reaches_none_in_a_repository(runs, project, maker):
    """Review s31, second round: under `write tests/**/config` a program Kiwi does not model may change the
    files the grant matches, and the config of the human's bare repository in tests/ was one. Those inside a
    repository by its layout no grant names are left out."""
    bare = project / "tests" / "fixtures" / "repo.git"
    subprocess.run(["git", "init", "-q", "--bare", str(bare)], check=True)
    (project / "tests" / "app").mkdir()
    (project / "tests" / "app" / "config").write_text("the app's\n")
    before = (bare / "config").read_text()
    (project / "edit.py").write_text(
        "import sys\n"
        "for path in sys.argv[1:]:\n"
        "    try:\n"
        "        open(path, 'a').write('\\tfsmonitor = touch PWNED\\n'); print(path, 'written')\n"
        "    except OSError as exc:\n"
        "        print(path, exc.strerror)\n"
    )
    run_id = await agent_run(runs, project, "editor", _grants("maker", write="tests/**/config"))

    result = await shell(
        runs, run_id, "maker", "edit.py", "tests/app/config", "tests/fixtures/repo.git/config"
    )

    assert result.status == "ok", result
    assert result.result["stdout"].splitlines() == [
        "tests/app/config written",
        "tests/fixtures/repo.git/config Permission denied",
    ], result.result
    assert (bare / "config").read_text() == before


@pytest.mark.skipif(confinement.landlock.abi_version() == 0, reason="this kernel has no Landlock")
async def test_a_program_kiwi_does_not_model_keeps_a_umask_of_022_it_was_not_given(runs, project, maker):
    """Review s31, second round: the filter refuses `umask 0`, but a worker started under umask 000 (or 002)
    handed it on, and the program's new files were writable by every user. It starts with 022 kept."""
    (project / "make.py").write_text("import os\nopen('out/made', 'w').close(); os.mkdir('out/dir')\n")
    (project / "out").mkdir()
    run_id = await agent_run(runs, project, "maker", _grants("maker"))
    kept = os.umask(0)
    try:
        result = await shell(runs, run_id, "maker", "make.py")
    finally:
        os.umask(kept)

    assert result.status == "ok" and result.result["exit_code"] == 0, result
    assert (project / "out" / "made").stat().st_mode & 0o022 == 0
    assert (project / "out" / "dir").stat().st_mode & 0o022 == 0


@pytest.mark.skipif(confinement.landlock.abi_version() == 0, reason="this kernel has no Landlock")
async def test_a_folder_another_process_holds_locked_refuses_at_once(runs, project, maker):
    """Review s31, second round: a program Kiwi does not model took a lock on out/r and kept it; the next
    filesystem.write of out/r/refs waited for it on the worker's event loop, and the whole worker stood still
    (the program's own timeout never fired). The file tools wait a moment, then refuse, naming why."""
    (project / "out" / "r").mkdir(parents=True)
    (project / "hold.py").write_text(
        "import fcntl, os, time\n"
        "fd = os.open('out/r', os.O_RDONLY)\nfcntl.flock(fd, fcntl.LOCK_EX)\n"
        "open('out/held', 'w').close()\n"
        "while not os.path.exists('out/done'):\n    time.sleep(0.01)\n"
    )
    holder = await agent_run(runs, project, "holder", _grants("maker"))
    writer = await agent_run(runs, project, "writer", _grants())
    held = asyncio.create_task(shell(runs, holder, "maker", "hold.py"))

    async def locked() -> bool:
        return (project / "out" / "held").exists()

    await wait_for(locked, what="the program to hold out/r")
    refused = await asyncio.wait_for(_write(runs, writer, "out/r/refs/x"), timeout=60)
    (project / "out" / "done").touch()
    ended = await held

    assert refused.status != "ok" and "another process holds the folder" in refused.reason, refused
    assert ended.status == "ok" and ended.result["exit_code"] == 0, ended
    assert not (project / "out" / "r" / "refs").exists()


async def approved_rollback(runs, run_id: str, checkpoint) -> object:
    """The agent's git.rollback to ``checkpoint`` (git.checkpoint's answer), approved by a human ("alice", an
    approver the test made), and its answer."""
    rollback = asyncio.create_task(
        runs.call_tool(run_id, "git.rollback", {"checkpoint": checkpoint.result["checkpoint"]})
    )
    (request,) = await wait_for(
        lambda: pending_approval(runs, run_id), what="the rollback to ask for approval"
    )
    await runs.decide_approval(run_id, request.request_id, True, by="alice")
    return await asyncio.wait_for(rollback, timeout=60)


def _tool_grants(write: str = "out/**") -> str:
    return _grants("rm,mkdir", write=write) + (
        '<execute resource="tool" id="git.checkpoint"/><execute resource="tool" id="git.rollback"/>'
    )


async def test_a_rollback_puts_no_repository_together(runs, project):
    """Review s31, third round: git.rollback writes a checkpoint's files back with no watch after it. The
    agent wrote out/evil.git/HEAD and config (no repository: no objects/ or refs/), checkpointed, removed
    HEAD, made objects/ and refs/, and rolled back: HEAD came back, and out/evil.git was a repository with
    the agent's config. The rollback is watched as a command is: what it made loses its HEAD."""
    subprocess.run(["git", "init", "-q", "-b", "main", str(project)], check=True)
    approver("alice")
    run_id = await agent_run(runs, project, "roller", _tool_grants())
    for path, text in (("out/evil.git/HEAD", "ref: refs/heads/main\n"), ("out/evil.git/config", FSMONITOR)):
        assert (await _write(runs, run_id, path, text)).status == "ok", path
    checkpoint = await runs.call_tool(run_id, "git.checkpoint", {"message": "before"})
    assert checkpoint.status == "ok" and checkpoint.result["available"], checkpoint
    assert (await shell(runs, run_id, "rm", "out/evil.git/HEAD")).status == "ok"
    made = await shell(runs, run_id, "mkdir", "out/evil.git/objects", "out/evil.git/refs")
    assert made.status == "ok" and made.result["exit_code"] == 0, made

    rolled = await approved_rollback(runs, run_id, checkpoint)  # (a human approves it)

    assert rolled.status == "denied", rolled
    assert "the checkpoint's files made 'out/evil.git' a git repository by its layout" in rolled.reason
    assert not _is_repository(project / "out" / "evil.git")


async def test_the_file_tools_delete_nothing_in_a_repository_no_grant_names(runs, project):
    """Review s31, third round: filesystem.delete took the HEAD of the human's bare repository out from under
    `write tests/**` (shell rm was refused); with no HEAD it was no repository, its config the agent's to
    write, and a rollback put HEAD back. Deleting in one, or one whole, is refused as writing in one is."""
    bare = project / "tests" / "a.git"
    subprocess.run(["git", "init", "-q", "--bare", str(bare)], check=True)
    run_id = await agent_run(runs, project, "deleter", _grants(write="tests/**"))

    head = await runs.call_tool(run_id, "filesystem.delete", {"path": "tests/a.git/HEAD"})
    whole = await runs.call_tool(run_id, "filesystem.delete", {"path": "tests"})

    assert head.status == "denied" and "is in 'tests/a.git', a git repository" in head.reason, head
    assert whole.status == "denied" and "holds 'tests/a.git', a git repository" in whole.reason, whole
    assert (bare / "HEAD").is_file() and _is_repository(bare)


@pytest.mark.skipif(confinement.landlock.abi_version() == 0, reason="this kernel has no Landlock")
async def test_a_git_folder_set_aside_holds_no_repository_below_it(runs, project, maker):
    """Review s31, second round: a `.git` a program Kiwi does not model made was set aside whole, as
    `.git.set-aside-STAMP`, a repository by its layout all the same: the human who looked at it ran the agent's
    pager. Third round: with its own HEAD set aside, the one below it (`.git/modules/m`) stayed one. Every
    repository in what is set aside loses its HEAD."""
    aside = await _git_folder_set_aside(runs, project, "x/.git/modules/m")

    assert not _is_repository(aside) and not _is_repository(aside / "modules" / "m")


async def _git_folder_set_aside(runs, project, *more: str, files: int = 0) -> Path:
    """Where a `.git` that `maker` (a program Kiwi does not model) made in sub/x, with the agent's config, is set
    aside: the repositories ``more`` made too, and ``files`` entries more in it. The call fails naming it."""
    (project / "sub").mkdir()
    (project / "sub" / "make.py").write_text(
        "import os\n"
        f"for top in ('x/.git', *{more!r}):\n"
        "    for d in ('objects', 'refs'): os.makedirs(f'{top}/{d}', exist_ok=True)\n"
        "    open(f'{top}/HEAD', 'w').write('ref: refs/heads/main\\n')\n"
        f"    open(f'{{top}}/config', 'w').write({FSMONITOR!r})\n"
        f"for i in range({files}): open(f'x/.git/f{{i}}', 'w').close()\n"
    )
    run_id = await agent_run(runs, project, "maker", _grants("maker", write="sub/**"))

    result = await shell(runs, run_id, "maker", "make.py", cwd="sub")

    assert result.status == "denied" and "the command made 'sub/x/.git'" in result.reason, result
    (aside,) = [p for p in (project / "sub" / "x").iterdir() if p.name.startswith(".git.set-aside-")]
    return aside


async def test_a_rollback_removes_nothing_in_a_repository(runs, project):
    """Review s31, fourth round: the human's fixture was left out of the checkpoint by .gitignore; the agent
    emptied .gitignore, and the rollback removed the fixture's files as made since (its HEAD, its config), after
    which its config was the agent's to write. A rollback removes nothing in a repository by its layout."""
    subprocess.run(["git", "init", "-q", "-b", "main", str(project)], check=True)
    (project / ".gitignore").write_text("tests/a.git/\n")
    bare = project / "tests" / "a.git"
    subprocess.run(["git", "init", "-q", "--bare", str(bare)], check=True)
    approver("alice")
    run_id = await agent_run(runs, project, "roller", _tool_grants(write="tests/**,.gitignore"))
    checkpoint = await runs.call_tool(run_id, "git.checkpoint", {"message": "before"})
    assert checkpoint.status == "ok" and checkpoint.result["available"], checkpoint
    assert (await _write(runs, run_id, ".gitignore", "")).status == "ok"

    rolled = await approved_rollback(runs, run_id, checkpoint)  # (a human approves it)

    assert rolled.status == "ok", rolled
    assert not [p for p in rolled.result["removed"] if p.startswith("tests/a.git/")], rolled.result
    assert (bare / "HEAD").is_file() and (bare / "config").is_file() and _is_repository(bare)


@pytest.mark.skipif(confinement.landlock.abi_version() == 0, reason="this kernel has no Landlock")
async def test_a_git_folder_set_aside_past_the_limit_loses_its_head_all_the_same(
    runs, project, maker, monkeypatch
):
    """Review s31, fourth round: what is set aside is looked through up to a limit, and a `.git` holding more
    entries than that kept its HEAD (the count was checked before the folder's HEAD was renamed). Each folder's
    HEAD goes first; past the limit the rest is left with mode 000."""
    monkeypatch.setattr(setaside, "_UNHEAD_LIMIT", 50)  # (the limit, small: the same code path)

    aside = await _git_folder_set_aside(runs, project, files=80)

    assert aside.stat().st_mode & 0o777 == 0
    aside.chmod(0o700)  # (a human's chmod, to look)
    assert not (aside / "HEAD").exists() and not _is_repository(aside)


async def test_without_the_wall_a_config_copied_over_is_found_by_its_settings(runs, project, monkeypatch):
    """Where no command is confined (KIWI_CONFINE=off: nothing can be held read-only), a program Kiwi models
    still runs beside the human's bare repository (`touch`), and `cp -r stage/. fixtures/`, which copies the
    agent's config over the repository's where no word names it, is found after it by the repository's
    settings: it loses its HEAD, and the call fails naming it."""
    monkeypatch.setenv("KIWI_CONFINE", "off")
    bare = project / "fixtures" / "bare.git"
    subprocess.run(["git", "init", "-q", "--bare", str(bare)], check=True)
    run_id = await agent_run(runs, project, "overlay", _grants("cp,touch", write="fixtures/**,stage/**"))
    assert (await _write(runs, run_id, "stage/bare.git/config", FSMONITOR)).status == "ok"

    touched = await shell(runs, run_id, "touch", "fixtures/notes.txt")
    copied = await shell(runs, run_id, "cp", "-r", "stage/.", "fixtures/")

    assert touched.status == "ok" and touched.result["exit_code"] == 0, touched
    assert copied.status == "denied", copied
    assert "the command made 'fixtures/bare.git' a git repository by its layout" in copied.reason
    assert not _is_repository(bare)
