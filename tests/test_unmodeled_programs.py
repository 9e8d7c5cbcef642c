"""Programs Kiwi does not model (a signed directive names them: Kiwi reads their words as reads and knows no
option of theirs that writes or starts a program) run only inside the kernel's wall. On a worker that confines
no command (no Landlock, KIWI_CONFINE=off), the worker refuses them; the programs Kiwi models run as before.
Against the real stack (a Temporal server, Kiwi's worker, real programs)."""

from __future__ import annotations

import base64
import io
import os
import shutil
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from temporalio.exceptions import ApplicationError

from activities import confinement
from kiwi.shellpolicy import unchecked_names
from tests.test_attack_shell import agent_run, audited_denial, shell


def _grants(commands: str, write: str = "") -> str:
    """Read the project, write ``write`` (a glob; nothing when empty), run ``commands``."""
    return (
        '<read resource="filesystem" path="**"/>'
        + (f'<write resource="filesystem" path="{write}"/>' if write else "")
        + f'<execute resource="shell" commands="{commands}"/>'
    )


async def test_an_unconfined_worker_refuses_a_program_it_does_not_model(runs, project, monkeypatch):
    """Kiwi reads dd's words only for the paths they name, as reads: `of=PWNED` passed a run that may read the
    project and write nothing. Behind the kernel's wall dd could write nothing there; on a worker with no wall
    (here KIWI_CONFINE=off), it made the file. The worker now refuses dd there, naming why and what to do;
    `ls`, which Kiwi models, still runs."""
    monkeypatch.setenv("KIWI_CONFINE", "off")
    (project / "notes.txt").write_text("one\n")
    run_id = await agent_run(runs, project, "copier", _grants("dd,ls"))

    result = await shell(runs, run_id, "dd", "if=notes.txt", "of=PWNED")

    assert result.status == "denied", result
    assert "'dd' is not a program Kiwi models" in result.reason, result.reason
    assert "confines no command (KIWI_CONFINE=off)" in result.reason and "unset KIWI_CONFINE" in result.reason
    assert not (project / "PWNED").exists()
    await audited_denial(project, run_id, result.reason)
    listed = await shell(runs, run_id, "ls")
    assert listed.status == "ok" and "notes.txt" in listed.result["stdout"], listed


@pytest.mark.skipif(confinement.landlock.abi_version() == 0, reason="this kernel has no Landlock")
async def test_a_confined_worker_runs_it_inside_the_wall(runs, project, monkeypatch):
    """Where the kernel confines commands, dd runs, and writes nothing the run may not."""
    monkeypatch.setenv("KIWI_CONFINE", "auto")
    (project / "notes.txt").write_text("one\n")
    run_id = await agent_run(runs, project, "copier", _grants("dd"))

    printed = await shell(runs, run_id, "dd", "if=notes.txt", "status=none")
    written = await shell(runs, run_id, "dd", "if=notes.txt", "of=PWNED")

    assert printed.status == "ok" and printed.result["stdout"] == "one\n", printed
    assert written.status == "ok" and written.result["exit_code"] != 0, written
    assert "Permission denied" in written.result["stderr"], written.result
    assert not (project / "PWNED").exists()


def test_kiwi_doctor_says_such_programs_are_refused_where_nothing_is_confined(monkeypatch):
    monkeypatch.setenv("KIWI_CONFINE", "off")
    note = confinement.platform_note()
    assert note.startswith("shell commands are not confined")
    assert note.endswith("programs Kiwi does not model are refused"), note


@pytest.mark.skipif(shutil.which("iconv") is None, reason="no iconv on this machine")
async def test_a_protected_name_at_the_end_of_a_cluster_of_options_is_refused(runs, project):
    """Review s30: `iconv -co.git p.txt` in sub/ (-c, then -o with the rest of the word) under `write sub/**`
    made `sub/.git`, a repository whose settings (`gitdir:` a folder of the agent's, with core.fsmonitor) the
    human's next `git status` there ran. The worker read `-o.git`, not every tail of `-co.git`. Now refused."""
    (project / "sub").mkdir()
    (project / "sub" / "p.txt").write_text("gitdir: stage/g\n")
    run_id = await agent_run(runs, project, "converter", _grants("iconv", write="sub/**"))

    result = await shell(runs, run_id, "iconv", "-f", "utf-8", "-t", "utf-8", "-co.git", "p.txt", cwd="sub")

    assert result.status == "denied" and "names the protected place 'sub/.git'" in result.reason, result
    assert not (project / "sub" / ".git").exists()


async def test_a_program_by_another_name_is_no_program_kiwi_models(
    runs, project, tmp_path_factory, monkeypatch
):
    """Review s30: `HEAD` was read as coreutils' `head` (names are folded), so commands="*" ran it, and the wall
    gave it a modeled program's rules. On Debian HEAD is libwww-perl's HTTP client; here dd under that name.
    commands="*" now refuses it; named, it is a program Kiwi does not model: behind the wall it writes only
    the files a finer grant matches, and `dd of=src/x.py` under `write src/*.md` fails."""
    tools = tmp_path_factory.mktemp("bin")
    shutil.copy(shutil.which("dd") or "/bin/dd", tools / "HEAD")
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    (project / "src").mkdir()
    (project / "src" / "a.md").write_text("agent's\n")
    (project / "src" / "x.py").write_text("human's\n")
    grants = '<read resource="filesystem" path="**"/><write resource="filesystem" path="src/*.md"/>'
    star = await agent_run(runs, project, "star", grants + '<execute resource="shell" commands="*"/>')
    named = await agent_run(runs, project, "named", grants + '<execute resource="shell" commands="HEAD"/>')

    refused = await shell(runs, star, "HEAD", "if=src/a.md", "of=src/x.py")
    written = await shell(runs, named, "HEAD", "if=src/a.md", "of=src/x.py")

    assert refused.status == "denied" and "'HEAD' is not the name of a program Kiwi models" in refused.reason
    assert (project / "src" / "x.py").read_text() == "human's\n"
    if confinement.landlock.abi_version():
        assert written.status == "ok" and written.result["exit_code"] != 0, written
        assert "Permission denied" in written.result["stderr"], written.result
    else:
        assert written.status == "denied" and "not a program Kiwi models" in written.reason, written


async def test_a_program_that_changes_owners_or_attributes_is_refused(runs, project):
    """Review s30: Landlock has no rule for a file's owner, group or attributes, and `chattr +A` changed a
    file outside the grants. The worker refuses such programs whatever the grant names."""
    (project / "notes.txt").write_text("one\n")
    run_id = await agent_run(runs, project, "owner", _grants("chgrp"))

    result = await shell(runs, run_id, "chgrp", str(os.getgid()), "notes.txt")

    assert result.status == "denied" and "'chgrp' is refused: it changes the owner" in result.reason, result


@pytest.mark.skipif(shutil.which("jar") is None, reason="no jar on this machine")
async def test_a_program_that_writes_the_names_inside_its_input_is_refused(runs, project):
    """`jar xf notes.zip` in sub/ writes the names inside the archive, which no word of the command shows: an
    entry `.git` made `sub/.git`, a repository whose settings the human's git runs. Refused, as patch, cpio
    and 7z are (session 30: jar, uudecode, unsquashfs, dpkg-deb, munpack, gtar and kin)."""
    (project / "sub").mkdir()
    with zipfile.ZipFile(project / "notes.zip", "w") as archive:
        archive.writestr(".git", "gitdir: stage/g\n")
    run_id = await agent_run(runs, project, "unpacker", _grants("jar", write="sub/**"))

    result = await shell(runs, run_id, "jar", "xf", "../notes.zip", cwd="sub")

    assert result.status == "denied" and "'jar' is refused: it writes the files named inside" in result.reason
    assert not (project / "sub" / ".git").exists()


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (
            ["lrzip", "-d", "sub/.git.lrz"],
            "'sub/.git.lrz' less its last suffix names the protected place 'sub/.git'",
        ),
        (["lzop", "-d", "-o", "x", "temporal-dev.yml.lzo"], "names the protected place 'temporal-dev.yml'"),
        (["uudecode", "mail.txt"], "'uudecode' is refused: it writes the files named inside"),
        (["unsquashfs", "-d", "out", "image.sqfs"], "'unsquashfs' is refused"),
        (["unshar", "bundle.shar"], "'unshar' is refused: it starts other programs"),
        (
            ["objcopy", "-O", "binary", "--dump-section=.data=sub/.git", "a.o"],
            "names the protected place 'sub/.git'",
        ),
        (["objcopy", "--dump-section", ".data=sub/.git", "a.o"], "names the protected place 'sub/.git'"),
        (["gpgtar", "--extract", "a.tar"], "'gpgtar' is refused: it writes the files named inside"),
        (
            ["install", "-d", "-m", "777", "."],
            "'install' is refused: it changes the owner, group or attributes",
        ),
    ],
)
def test_the_worker_refuses_names_a_program_would_make_from_its_input(argv, said):
    """The worker's check of a program Kiwi does not model (kiwi.shellpolicy.unchecked_names, run on every
    command whatever the run decided): a decompressor Kiwi has no list entry for writes `NAME.lrz` as `NAME`,
    and programs that take the names they write from what they read, or run a shell, are refused."""
    refused = unchecked_names(argv, ".", ["**"])
    assert refused is not None and said in refused.reason, refused
    assert unchecked_names(["lrzip", "-d", "notes.txt.lrz"], ".", ["**"]) is None
    # (Naming a place to leave it out is no write: review s30, third round.)
    for leaves_out in (
        ["cloc", "--exclude-dir=.git,node_modules", "."],
        ["jq", "-r", ".name,.git.url", "p.json"],
    ):
        assert unchecked_names(leaves_out, ".", ["**"]) is None, leaves_out


@pytest.mark.skipif(confinement.landlock.abi_version() == 0, reason="this kernel has no Landlock")
async def test_a_repository_a_program_kiwi_does_not_model_made_is_set_aside(
    runs, project, tmp_path_factory, monkeypatch
):
    """A program Kiwi does not model may take the names it writes from what it reads, where no word of the
    command shows them; lists name the known ones (patch, jar, ...), and cannot name them all. Here GNU tar
    under another name (`tarball`, which Kiwi reads as a program it does not know) unpacks an archive the agent
    wrote with filesystem.write holding `.git`, into sub/, which the run may write whole. sub/.git was a
    repository whose settings the human's next git there runs. Kiwi now looks below such folders after the
    program: the `.git` it made is set aside, nothing deleted, and the call fails naming it."""
    tools = tmp_path_factory.mktemp("bin")
    shutil.copy(shutil.which("tar") or "/bin/tar", tools / "tarball")
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    (project / "sub").mkdir()
    (project / "sub" / "kept.txt").write_text("the human's\n")
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as made:
        entry = tarfile.TarInfo(".git")
        entry.size = len(b"gitdir: stage/g\n")
        made.addfile(entry, io.BytesIO(b"gitdir: stage/g\n"))
    run_id = await agent_run(runs, project, "unpacker", _grants("tarball", write="sub/**"))
    wrote = await runs.call_tool(
        run_id,
        "filesystem.write",
        {"path": "sub/a.tar", "content": base64.b64encode(archive.getvalue()).decode(), "encoding": "base64"},
    )
    assert wrote.status == "ok", wrote

    result = await shell(runs, run_id, "tarball", "-xf", "a.tar", cwd="sub")

    assert result.status == "denied" and "the command made 'sub/.git'" in result.reason, result
    assert not (project / "sub" / ".git").exists()
    aside = [p.name for p in (project / "sub").iterdir() if p.name.startswith(".git.set-aside-")]
    assert len(aside) == 1 and (project / "sub" / aside[0]).read_text() == "gitdir: stage/g\n", aside
    assert (project / "sub" / "kept.txt").read_text() == "the human's\n"


def _python_as(tools: Path, name: str) -> None:
    """The system's Python under another name, first on PATH: a program Kiwi does not model that runs the code
    it is given (as a directive could grant one by mistake), to make what no list of programs foresees."""
    shutil.copy(
        os.path.realpath("/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable),
        tools / name,
    )


@pytest.mark.skipif(confinement.landlock.abi_version() == 0, reason="this kernel has no Landlock")
@pytest.mark.parametrize("how", ["past-the-limit", "unlistable"])
async def test_a_repository_hidden_from_the_watch_is_set_aside_all_the_same(
    runs, project, tmp_path_factory, monkeypatch, how
):
    """Review s30, third round: the watch for a `.git` a program Kiwi does not model made gave up past 200,000
    entries (the program made them, and its `.git` stayed), and did not look into a folder it could not list
    (git needs none: mode 0311 hid `x/.git` from the walk and not from the human's git). Both are set aside now:
    all of what the command made is looked through, and a folder that cannot be listed is set aside whole."""
    tools = tmp_path_factory.mktemp("bin")
    _python_as(tools, "maker")
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(confinement, "NESTED_WALK_LIMIT", 50)  # (the limit, small: the same code path)
    (project / "sub").mkdir()
    code = {  # (what the agent writes with filesystem.write, as sub/make.py)
        "past-the-limit": "import os\nfor i in range(80): open(f'f{i}', 'w').close()\n"
        "os.makedirs('zz/.git'); open('zz/.git/config', 'w').write('[core]\\n\\tfsmonitor = touch PWNED\\n')\n",
        "unlistable": "import os\nos.makedirs('x/.git'); open('x/.git/config', 'w').write('[core]\\n')\n"
        "os.chmod('x', 0o311)\n",
    }[how]
    (project / "sub" / "make.py").write_text(code)
    run_id = await agent_run(runs, project, "maker", _grants("maker", write="sub/**"))

    result = await shell(runs, run_id, "maker", "make.py", cwd="sub")

    # (A worker running as root lists the folder all the same, and finds the `.git` in it.)
    made = "sub/zz/.git" if how == "past-the-limit" else "sub/x/.git" if os.geteuid() == 0 else "sub/x"
    assert result.status == "denied" and f"the command made '{made}'" in result.reason, result
    assert not (project / made).exists() and not (project / "sub" / "x" / ".git").exists()
    assert [p.name for p in (project / made).parent.iterdir() if ".set-aside-" in p.name], result


@pytest.mark.skipif(confinement.landlock.abi_version() == 0, reason="this kernel has no Landlock")
async def test_a_repository_made_elsewhere_first_is_held_where_it_is_found(
    runs, project, tmp_path_factory, monkeypatch
):
    """Review s30, third round: under `write build/**` (build/ not made yet) the wall let any program make
    folders in the project's root, where no watch looked: `src/.git/objects`; then under `write src/**` the same
    `.git` was there before the command, and its settings were written with an fsmonitor. A program Kiwi does not
    model now makes no folder for a grant whose folder is not made, and the repositories below what it may
    write whole are held read-only for it."""
    tools = tmp_path_factory.mktemp("bin")
    _python_as(tools, "maker")
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    if confinement.namespaces_refused():
        pytest.skip(f"no mount namespace here: {confinement.namespaces_refused()}")
    (project / "src").mkdir()
    (project / "vendor" / "lib" / ".git").mkdir(parents=True)
    (project / "vendor" / "lib" / ".git" / "config").write_text("[core]\n")
    early = await agent_run(runs, project, "early", _grants("maker", write="build/**"))
    later = await agent_run(runs, project, "later", _grants("maker", write="vendor/**"))

    (project / "steps").mkdir()  # (what the agent writes with filesystem.write)
    (project / "steps" / "first.py").write_text("import os\nos.makedirs('src/.git/objects')\n")
    (project / "steps" / "then.py").write_text(
        "open('vendor/lib/.git/config', 'a').write('\\tfsmonitor = x\\n')\n"
    )
    made = await shell(runs, early, "maker", "steps/first.py")
    written = await shell(runs, later, "maker", "steps/then.py")

    assert made.status == "ok" and made.result["exit_code"] != 0, made
    assert not (project / "src" / ".git").exists()
    assert written.status == "ok" and written.result["exit_code"] != 0, written
    assert "Read-only file system" in written.result["stderr"], written.result
    assert (project / "vendor" / "lib" / ".git" / "config").read_text() == "[core]\n"


async def test_a_program_of_the_project_named_like_a_modeled_one_is_not_one(
    runs, project, monkeypatch, tmp_path
):
    """Review s30, third round: `../bin/echo` (a file the agent wrote, named like echo) counted as echo, a
    program Kiwi models, so the rules for the others were not its. The run refuses a path for a command; the
    worker refuses it too, and a PATH entry into the project finds no modeled program there."""
    from activities.commands import CommandActivities
    from activities.diskchecks import _modeled
    from activities.process import child_env
    from kiwi.contracts import CommandRequest

    request = CommandRequest(
        project_root=str(project), argv=["../bin/echo", "x"], cwd="sub", read_grants=["**"]
    )
    (project / "bin").mkdir()
    (project / "bin" / "echo").write_text("#!/bin/sh\n")
    (project / "bin" / "echo").chmod(0o755)
    (project / "sub").mkdir()

    with pytest.raises(ApplicationError, match="give the command by name, not by path"):
        await CommandActivities().run_command(request)
    assert _modeled(CommandRequest(project_root=str(project), argv=["echo", "x"]))
    # A PATH entry into the project is none a child searches (kiwi.searchpath, review s32): its echo is found
    # by no command, modeled or not.
    assert str(project / "bin") not in child_env({"PATH": str(project / "bin")}, project=str(project))["PATH"]


@pytest.mark.skipif(confinement.landlock.abi_version() == 0, reason="this kernel has no Landlock")
@pytest.mark.parametrize("how", ["gitdir-file", "renamed-above"])
async def test_a_nested_repository_is_not_reached_around_its_hold(
    runs, project, tmp_path_factory, monkeypatch, how
):
    """Review s30, fourth round. A `.git` file (`gitdir: ../gd`, git's separate git folder) was held, the folder it
    points to was not, and its settings were written with an fsmonitor. And the hold is on the place, not the
    folder above: renaming that folder, then making a `.git` where it was, got past the hold and the watch,
    which compared names (the human's repository was set aside, the planted one kept). Now the folder a `.git`
    file points to is held too, and the watch compares what each place is."""
    tools = tmp_path_factory.mktemp("bin")
    _python_as(tools, "maker")
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    if confinement.namespaces_refused():
        pytest.skip(f"no mount namespace here: {confinement.namespaces_refused()}")
    (project / "sub" / "w").mkdir(parents=True)
    (project / "sub" / "gd").mkdir()
    (project / "sub" / "gd" / "config").write_text("[core]\n")
    (project / "sub" / "w" / ".git").write_text("gitdir: ../gd\n")
    (project / "sub" / "r7" / ".git").mkdir(parents=True)
    (project / "sub" / "r7" / ".git" / "config").write_text("[core]\n")
    steps = {
        "gitdir-file": "open('gd/config', 'a').write('\\tfsmonitor = touch PWNED\\n')\n",
        "renamed-above": "import os\nos.rename('r7', 'old')\nos.makedirs('r7/.git')\n"
        "open('r7/.git/config', 'w').write('[core]\\n\\tfsmonitor = touch PWNED\\n')\n",
    }
    (project / "sub" / "step.py").write_text(steps[how])
    run_id = await agent_run(runs, project, "maker", _grants("maker", write="sub/**"))

    result = await shell(runs, run_id, "maker", "step.py", cwd="sub")

    if how == "gitdir-file":
        assert result.status == "ok" and "Read-only file system" in result.result["stderr"], result
        assert (project / "sub" / "gd" / "config").read_text() == "[core]\n"
    else:
        assert result.status == "denied" and "'sub/r7/.git'" in result.reason, result
        assert not (project / "sub" / "r7" / ".git").exists()


@pytest.mark.skipif(
    not confinement.landlock.seccomp_filtered(), reason="no seccomp filter on this architecture"
)
@pytest.mark.skipif(confinement.landlock.abi_version() == 0, reason="this kernel has no Landlock")
async def test_a_program_kiwi_does_not_model_makes_no_file_writable_by_others(
    runs, project, tmp_path_factory, monkeypatch
):
    """Review s30: Landlock has no rule for a file's mode, and the programs that change modes are refused by
    name; a copy under another name (`myinstall -m 777`) made files its user owns, the project's and any
    other, writable by every user of the machine. A program Kiwi does not model may give no file a group or
    world write bit now (the kernel's filter answers EPERM): not by chmod, not by a umask that lets one through
    (umask 0), not by an ACL (an extended attribute); it still sets the modes builds set (0755) and a stricter
    umask."""
    tools = tmp_path_factory.mktemp("bin")
    _python_as(tools, "maker")
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    outside = tmp_path_factory.mktemp("elsewhere") / "profile"
    outside.write_text("the human's\n")
    outside.chmod(0o644)
    (project / "built").write_text("#!/bin/sh\n")
    (project / "chmod.py").write_text(
        "import os\n"
        "def tried(what, call):\n"
        "    try:\n"
        "        call(); print(what, 'done')\n"
        "    except OSError as exc:\n"
        "        print(what, exc.strerror)\n"
        f"for path, mode in (('built', 0o755), ('built', 0o777), ({str(outside)!r}, 0o666)):\n"
        "    tried(oct(mode), lambda: os.chmod(path, mode))\n"
        "tried('umask 0', lambda: os.umask(0))\n"
        "tried('umask 077', lambda: os.umask(0o077) and os.umask(0o022))\n"
        "tried('acl', lambda: os.setxattr('built', 'system.posix_acl_access', b'\\2\\0\\0\\0'))\n"
        "open('made', 'w').close(); print(oct(os.stat('made').st_mode & 0o777))\n"
    )
    run_id = await agent_run(runs, project, "moder", _grants("maker", write="**"))

    result = await shell(runs, run_id, "maker", "chmod.py")

    assert result.status == "ok", result
    lines = result.result["stdout"].splitlines()
    assert lines[:6] == [
        "0o755 done",
        "0o777 Operation not permitted",
        "0o666 Operation not permitted",
        "umask 0 Operation not permitted",  # (a file made 0666 under umask 0 is writable by all)
        "umask 077 done",  # (a stricter mask, as ssh-keygen sets, is set)
        "acl Operation not permitted",  # (an ACL is an extended attribute: setfacl o+w)
    ], lines
    assert int(lines[6], 8) & 0o022 == 0, lines
    assert (project / "built").stat().st_mode & 0o777 == 0o755 and outside.stat().st_mode & 0o777 == 0o644


@pytest.mark.skipif(confinement.landlock.abi_version() == 0, reason="this kernel has no Landlock")
async def test_a_repository_behind_a_link_refuses_the_command_naming_the_link(
    runs, project, tmp_path_factory, monkeypatch
):
    """Session 30 left a failure with no hint: a nested `.git` that is a link (as `repo` makes them) cannot be
    held read-only, so a program Kiwi does not model, which may write its folder whole, does not start; the
    call said only that the kernel refused to confine it. It names the link and what to do now."""
    if confinement.namespaces_refused():
        pytest.skip(f"no mount namespace here: {confinement.namespaces_refused()}")
    tools = tmp_path_factory.mktemp("bin")
    _python_as(tools, "maker")
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    (project / "sub").mkdir()
    (project / "gitdirs" / "sub.git").mkdir(parents=True)
    (project / "sub" / ".git").symlink_to("../gitdirs/sub.git")
    (project / "sub" / "make.py").write_text("open('made.txt', 'w').write('x')\n")
    run_id = await agent_run(runs, project, "maker", _grants("maker", write="sub/**"))

    result = await shell(runs, run_id, "maker", "make.py", cwd="sub")

    assert result.status == "error" and "'sub/.git' is a symbolic link" in result.reason, result
    assert "replaces the link with what it leads to" in result.reason
    assert not (project / "sub" / "made.txt").exists()


async def test_an_archive_member_is_written_writable_by_no_one_else(runs, project):
    """Review s31, third round: the program Kiwi does not model may give no file a group or world write bit,
    and `tar -x` (Kiwi unpacks through a folder of its own, then writes each member into the project itself)
    gave a member of mode 0777 its mode whole. Kiwi writes a member's mode without those bits; the rest is
    kept (0755)."""
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as made:
        entry = tarfile.TarInfo("run.sh")
        entry.size, entry.mode = len(b"#!/bin/sh\n"), 0o777
        made.addfile(entry, io.BytesIO(b"#!/bin/sh\n"))
    run_id = await agent_run(runs, project, "unpacker", _grants("tar", write="out/**"))
    content = base64.b64encode(archive.getvalue()).decode()
    wrote = await runs.call_tool(
        run_id, "filesystem.write", {"path": "out/a.tar", "content": content, "encoding": "base64"}
    )
    assert wrote.status == "ok", wrote

    result = await shell(runs, run_id, "tar", "-xf", "a.tar", cwd="out")

    assert result.status == "ok" and result.result["exit_code"] == 0, result
    assert (project / "out" / "run.sh").stat().st_mode & 0o777 == 0o755
