"""Attacks through shell.run and git against a real Temporal server and worker: the agent tries to turn an
allowed program into another one, read outside the project, dodge a blocked command, or make git run
what a planted .git/config says. Each is denied (or runs nothing), and the audit trail says why."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from activities.audit import read_audit
from kiwi.contracts import ToolCallResult
from tests.helpers import directive_md, wait_for, waits_for_agent, write, write_directive

SHELL = "git,find,ls,cat,rm,printenv"


def shell_directive(commands: str = SHELL) -> str:
    return directive_md(
        '<step name="work"><action>Work with the shell.</action></step>',
        name="sheller",
        permissions='<read resource="filesystem" path="**"/><write resource="filesystem" path="**"/>'
        f'<execute resource="shell" commands="{commands}"/>'
        '<execute resource="tool" id="git.status,git.checkpoint,git.commit,git.diff"/>',
    )


async def start(runs, project: Path, commands: str = SHELL) -> str:
    write_directive(project / ".ai" / "directives" / "sheller.md", shell_directive(commands))
    if not (project / ".git").exists():
        subprocess.run(["git", "init", "-q", str(project)], check=True)
    run_id = await runs.start("sheller", {})

    async def waiting():
        return (await runs.status(run_id)).status == "awaiting_agent"

    await wait_for(waiting, what="sheller to wait for the agent")
    return run_id


async def audited_denial(project: Path, run_id: str, reason: str) -> dict:
    async def found():
        records = [
            r
            for r in read_audit(str(project), run_id)
            if r["event"] == "tool_call" and r["decision"] == "denied" and r.get("reason") == reason
        ]
        return records[0] if records else None

    return await wait_for(found, what=f"the denial '{reason}' in the audit trail")


async def agent_run(runs, project: Path, name: str, permissions: str) -> str:
    """A run of a one-step agent directive ``name`` with ``permissions``, waiting for the agent."""
    write_directive(
        project / ".ai" / "directives" / f"{name}.md",
        directive_md('<step name="work"><action>Work.</action></step>', name=name, permissions=permissions),
    )
    run_id = await runs.start(name, {})
    await wait_for(lambda: waits_for_agent(runs, run_id), what=f"{name} to wait for the agent")
    return run_id


async def shell(runs, run_id: str, *argv: str, cwd: str = ".") -> ToolCallResult:
    """The agent's shell.run of ``argv`` in ``cwd``."""
    return await runs.call_tool(run_id, "shell.run", {"argv": list(argv), "cwd": cwd})


def outside_folder(project: Path) -> Path:
    """A folder of its own beside the project (a place no run may reach)."""
    outside = project.parent / f"outside-{uuid.uuid4().hex[:8]}"
    outside.mkdir()
    return outside


def pwned(*places: Path) -> list[Path]:
    return [p for place in places for p in place.rglob("PWNED*")]


@pytest.mark.parametrize(
    ("commands", "args", "named"),
    [
        (SHELL, {"argv": ["git", "-c", "alias.x=!touch PWNED", "x"]}, "'-c'"),
        (SHELL, {"argv": ["find", ".", "-exec", "touch", "PWNED", ";"]}, "'-exec'"),
        (SHELL, {"command": "ls /etc"}, "'/etc'"),
        (SHELL, {"command": "git diff /etc/passwd /dev/null"}, "'/etc/passwd'"),
        (SHELL, {"command": "git diff --no-index /etc/passwd /dev/null"}, "'git diff --no-index' is refused"),
        (SHELL, {"command": "git -C /tmp status"}, "'-C'"),
        (SHELL, {"command": "rm -fr important"}, "blocked by the harness policy ('rm -rf')"),
        (SHELL, {"command": "rm --recursive --force important"}, "blocked by the harness policy ('rm -rf')"),
        ("env,touch", {"command": "env touch PWNED"}, "'env'"),
        ("*", {"argv": ["python3", "-c", "open('PWNED', 'w')"]}, "'python3'"),
        ("*", {"argv": ["bash", "-c", "touch PWNED"]}, "'bash'"),
        (SHELL, {"command": "cat ../../../../../etc/passwd"}, "leaves the project root"),
        (SHELL, {"command": "ls", "cwd": "/etc"}, "absolute path"),
    ],
)
async def test_an_allowed_program_cannot_run_another_or_read_outside(runs, project, commands, args, named):
    (project / "important").mkdir()
    (project / "important" / "keep.txt").write_text("keep")
    run_id = await start(runs, project, commands)
    result = await runs.call_tool(run_id, "shell.run", args)
    assert result.status == "denied", result
    assert named in result.reason, result.reason
    assert result.result is None
    assert not pwned(project, project.parent) and (project / "important" / "keep.txt").read_text() == "keep"
    await audited_denial(project, run_id, result.reason)


async def test_a_symlink_in_the_project_does_not_lead_cat_out_of_it(runs, project):
    (project / "notes").mkdir(exist_ok=True)
    (project / "notes" / "etc").symlink_to("/etc")
    run_id = await start(runs, project)
    result = await runs.call_tool(run_id, "shell.run", {"command": "cat notes/etc/passwd"})
    assert result.status == "denied" and "outside the project" in result.reason, result
    assert "root:" not in str(result.result)
    listing = await runs.call_tool(run_id, "shell.run", {"command": "ls", "cwd": "notes/etc"})
    assert listing.status == "denied", listing
    await audited_denial(project, run_id, result.reason)


async def test_a_worker_secret_is_not_in_a_commands_environment(runs, project, monkeypatch):
    monkeypatch.setenv("KIWI_TEST_SECRET", "hunter2-kiwi")
    monkeypatch.setenv("TEMPORAL_TEST_TOKEN", "hunter3-temporal")
    run_id = await start(runs, project)
    result = await runs.call_tool(run_id, "shell.run", {"command": "printenv"})
    assert result.status == "ok", result
    shown = result.result["stdout"]
    assert "hunter2-kiwi" not in shown and "KIWI_TEST_SECRET" not in shown and "hunter3-temporal" not in shown
    assert "GIT_CONFIG_NOSYSTEM=1" in shown and "PATH=" in shown


def plant_malicious_git_config(project: Path, marks: Path) -> None:
    """The repository came this way: every setting that would make git run a program."""
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    hook = f"#!/bin/sh\ntouch {marks}/PWNED_hook_$(basename $0)\n"
    for place in (project / ".git" / "hooks", project / "evilhooks"):
        for name in ("pre-commit", "post-commit", "post-checkout", "commit-msg", "sign"):
            write(place / name, hook).chmod(0o755)
    write(project / ".gitattributes", "* filter=evil\n")
    with (project / ".git" / "config").open("a") as config:
        config.write(
            f"[core]\n\tfsmonitor = touch {marks}/PWNED_fsmonitor\n\thooksPath = evilhooks\n"
            f"\tpager = touch {marks}/PWNED_pager\n\teditor = touch {marks}/PWNED_editor\n"
            f"[alias]\n\tst = !touch {marks}/PWNED_alias\n"
            f'[filter "evil"]\n\tclean = touch {marks}/PWNED_clean\n\tsmudge = touch {marks}/PWNED_smudge\n'
            f"\trequired = true\n"
            # (format = ssh: signing runs gpg.ssh.program, which Kiwi's forced settings did not name.)
            f"[gpg]\n\tprogram = touch {marks}/PWNED_gpg\n\tformat = ssh\n[commit]\n\tgpgSign = false\n"
            f'[gpg "ssh"]\n\tprogram = {project}/evilhooks/sign\n'
            f'[gpg "x509"]\n\tprogram = {project}/evilhooks/sign\n'
            "[user]\n\tname = Repo Owner\n\temail = owner@example.com\n"
            f"\tsigningkey = {project}/evilhooks/key\n"
        )


async def test_a_planted_git_config_runs_nothing_through_shell_git_or_kiwis_git_tools(
    runs, project, tmp_path_factory
):
    marks = tmp_path_factory.mktemp("marks")
    plant_malicious_git_config(project, marks)
    (project / "notes").mkdir(exist_ok=True)
    (project / "notes" / "a.md").write_text("a")
    run_id = await start(runs, project)
    status = await runs.call_tool(run_id, "shell.run", {"command": "git status --porcelain"})
    assert status.status == "ok" and "notes/" in status.result["stdout"], status
    alias = await runs.call_tool(run_id, "shell.run", {"command": "git st"})
    assert alias.status == "denied" and "'git st'" in alias.reason
    added = await runs.call_tool(run_id, "shell.run", {"command": "git add notes/a.md"})
    assert added.status == "ok" and added.result["exit_code"] == 0, added
    assert (await runs.call_tool(run_id, "git.status", {})).status == "ok"
    checkpoint = await runs.call_tool(run_id, "git.checkpoint", {"message": "before"})
    assert checkpoint.status == "ok" and checkpoint.result["available"], checkpoint
    committed = await runs.call_tool(run_id, "git.commit", {"message": "m"})
    assert committed.status == "ok" and committed.result["committed"], committed
    await runs.call_tool(run_id, "filesystem.write", {"path": "notes/a.md", "content": "b"})
    signed = await runs.call_tool(
        run_id, "shell.run", {"argv": ["git", "commit", "-S", "-m", "s", "--", "notes/a.md"]}
    )
    assert signed.status == "ok" and signed.result["exit_code"] != 0, signed  # gpg.program is "false"
    switched = await runs.call_tool(run_id, "shell.run", {"argv": ["git", "checkout", "-b", "other"]})
    assert switched.status == "ok" and switched.result["exit_code"] == 0, switched
    assert list(marks.iterdir()) == [] and not pwned(project)


async def test_shell_git_is_refused_in_a_repository_whose_config_runs_a_diff_program(
    runs, project, tmp_path_factory
):
    marks = tmp_path_factory.mktemp("marks")
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    write(project / ".gitattributes", "*.md diff=evil\n")
    with (project / ".git" / "config").open("a") as config:
        config.write(
            f'[diff "evil"]\n\ttextconv = touch {marks}/PWNED_textconv\n'
            f"[diff]\n\texternal = touch {marks}/PWNED_external\n"
        )
    run_id = await start(runs, project)
    result = await runs.call_tool(run_id, "shell.run", {"command": "git diff"})
    assert (
        result.status == "denied"
        and "diff.external" in result.reason
        and "diff.evil.textconv" in result.reason
    )
    own = await runs.call_tool(run_id, "git.diff", {})
    assert own.status == "ok", own
    assert list(marks.iterdir()) == []
    await audited_denial(project, run_id, result.reason)


async def test_find_delete_runs_only_where_the_grant_names_the_option(runs, project):
    write(project / "tmp" / "scratch.txt", "x")
    run_id = await start(runs, project, commands="find")
    denied = await runs.call_tool(run_id, "shell.run", {"argv": ["find", "tmp", "-delete"]})
    assert denied.status == "denied" and "'-delete'" in denied.reason and 'options="-delete"' in denied.hint
    assert (project / "tmp" / "scratch.txt").exists()
    await audited_denial(project, run_id, denied.reason)
    write_directive(
        project / ".ai" / "directives" / "sweeper.md",
        directive_md(
            '<step name="work"><action>Sweep.</action></step>',
            name="sweeper",
            permissions='<read resource="filesystem" path="**"/><write resource="filesystem" path="tmp/**"/>'
            '<execute resource="shell" commands="find" options="-delete"/>',
        ),
    )
    sweeper = await runs.start("sweeper", {})

    async def waiting():
        return (await runs.status(sweeper)).status == "awaiting_agent"

    await wait_for(waiting, what="sweeper to wait for the agent")
    allowed = await runs.call_tool(
        sweeper, "shell.run", {"argv": ["find", "tmp", "-name", "*.txt", "-delete"]}
    )
    assert allowed.status == "ok" and allowed.result["exit_code"] == 0
    assert not (project / "tmp" / "scratch.txt").exists()


async def test_a_bare_repository_written_into_a_plain_project_runs_nothing(runs, project, tmp_path_factory):
    """Found by review: in a project that is no git repository, the agent writes HEAD, objects/, refs/ and a
    config with core.fsmonitor at the root; git then took the root for a bare repository and ran it. The file
    tools now refuse the last of those names; made all the same, Kiwi's git does not take the root for one."""
    marks = tmp_path_factory.mktemp("marks")
    write_directive(
        project / ".ai" / "directives" / "writer.md",
        directive_md(
            '<step name="work"><action>Write.</action></step>',
            name="writer",
            permissions='<read resource="filesystem" path="**"/><write resource="filesystem" path="**"/>'
            '<execute resource="shell" commands="git"/><execute resource="tool" id="git.status,git.checkpoint"/>',
        ),
    )
    run_id = await runs.start("writer", {})
    await wait_for(lambda: waits_for_agent(runs, run_id), what="writer to wait for the agent")
    planted = {
        "HEAD": "ref: refs/heads/main\n",
        "objects/.keep": "",
        "refs/heads/.keep": "",
        "config": f'[core]\n\tworktree = .\n\tfsmonitor = "touch {marks}/PWNED_fsmonitor"\n'
        f'\thooksPath = hooks\n[alias]\n\tst = "!touch {marks}/PWNED_alias"\n',
        "hooks/post-checkout": f"#!/bin/sh\ntouch {marks}/PWNED_hook\n",
    }
    for path, content in planted.items():
        written = await runs.call_tool(run_id, "filesystem.write", {"path": path, "content": content})
        if path.startswith("refs/"):
            # (The name that completes git's layout is refused now: tests/test_repository_layouts.py.)
            assert written.status == "denied" and "would make the project's root a git" in written.reason
        else:
            assert written.status == "ok", written
    # As if it got there another way: Kiwi's own git still runs nothing of it.
    (project / "refs" / "heads").mkdir(parents=True)
    for tool, args in (
        ("git.status", {}),
        ("git.checkpoint", {"message": "x"}),
        ("shell.run", {"command": "git status"}),
        ("shell.run", {"command": "git log"}),
    ):
        await runs.call_tool(run_id, tool, args)
    assert list(marks.iterdir()) == [] and not pwned(project)


def _tar_bytes(members: list[tuple[str, str | None, str]]) -> str:
    """A ustar archive as text (names, links and contents ASCII: every byte below 0x80), so the agent can
    write it with filesystem.write. ``members``: (name, link target or None, content)."""
    import io
    import tarfile

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as archive:
        for name, target, content in members:
            info = tarfile.TarInfo(name)
            info.mtime = 0
            if target is not None:
                info.type, info.linkname = tarfile.SYMTYPE, target
                archive.addfile(info)
            else:
                info.size = len(content)
                archive.addfile(info, io.BytesIO(content.encode()))
    data = buffer.getvalue()
    assert max(data) < 0x80
    return data.decode("ascii")


async def test_attack_two_archives_write_through_a_link_the_first_unpacked(runs, project, tmp_path_factory):
    """Review s19 F21: one archive unpacks a link to a place outside the project, a second a file below the
    link: tar wrote that file through the link, outside the project (a ~/.bashrc, a tool's code). Archives
    are now unpacked into the worker's own folder, and what they hold copied in without following a link;
    links are left out and named. The agent writes both archives itself."""
    outside = tmp_path_factory.mktemp("outside")
    run_id = await start(runs, project, "tar")
    (project / "sub").mkdir()
    for name, members in (
        ("a.tar", [("link", str(outside), "")]),
        ("b.tar", [("link/ESCAPED.txt", None, "written outside"), ("notes/fine.txt", None, "unpacked")]),
    ):
        wrote = await runs.call_tool(
            run_id, "filesystem.write", {"path": name, "content": _tar_bytes(members)}
        )
        assert wrote.status == "ok", wrote
    first = await runs.call_tool(run_id, "shell.run", {"command": "tar -xvf a.tar -C sub"})
    second = await runs.call_tool(run_id, "shell.run", {"command": "tar -xf b.tar -C sub"})
    assert not list(outside.iterdir())
    assert first.status == "ok" and first.result["exit_code"] == 0, first
    assert "1 link(s)" in first.result["stderr"] and "sub/link" in first.result["stderr"], first.result
    assert "kiwi-unpack" not in str(first.result)  # (the worker's own folder is not shown)
    assert second.status == "ok" and second.result["exit_code"] == 0, second
    assert not (project / "sub" / "link").is_symlink()
    assert (project / "sub" / "notes" / "fine.txt").read_text() == "unpacked"
    assert (
        project / "sub" / "link" / "ESCAPED.txt"
    ).read_text() == "written outside"  # (a folder of its own)

    # A link that got into the project some other way (a user's, or one moved so it points elsewhere) is
    # not followed either: nothing is written, and the call says why.
    (project / "sub2").mkdir()
    (project / "sub2" / "link").symlink_to(outside)
    third = await runs.call_tool(run_id, "shell.run", {"command": "tar -xf b.tar -C sub2"})
    assert third.status == "ok" and third.result["exit_code"] == 2, third
    assert "kiwi: sub2/link/ESCAPED.txt: not written" in third.result["stderr"], third.result
    assert "symbolic link" in third.result["stderr"], third.result
    assert not list(outside.iterdir())


async def test_an_unpacking_keeps_what_the_project_has_when_told_to(runs, project):
    """tar -k (and unzip -n) still leave files already there as they are; without it they are replaced."""
    run_id = await start(runs, project, "tar")
    write(project / "out" / "same.txt", "mine")
    archive = _tar_bytes([("same.txt", None, "theirs"), ("new.txt", None, "new")])
    assert (
        await runs.call_tool(run_id, "filesystem.write", {"path": "a.tar", "content": archive})
    ).status == "ok"
    kept = await runs.call_tool(run_id, "shell.run", {"command": "tar -xkf a.tar -C out"})
    assert kept.status == "ok", kept
    assert (project / "out" / "same.txt").read_text() == "mine"
    assert (project / "out" / "new.txt").read_text() == "new"
    assert (project / "out" / "new.txt").stat().st_mtime == 0  # (the archive's time, as tar keeps it)
    replaced = await runs.call_tool(run_id, "shell.run", {"argv": ["tar", "xf", "a.tar", "-C", "out"]})
    assert replaced.status == "ok" and replaced.result["exit_code"] == 0, replaced
    assert (project / "out" / "same.txt").read_text() == "theirs"


async def test_attack_two_zip_archives_write_through_a_link_the_first_unpacked(
    runs, project, tmp_path_factory
):
    """The same as the tar attack above with unzip, which also restores links (Info-ZIP, on Unix)."""
    import shutil
    import stat
    import zipfile

    if shutil.which("unzip") is None:
        pytest.skip("no unzip on this machine (Debian: unzip)")
    outside = tmp_path_factory.mktemp("outside")
    link = zipfile.ZipInfo("link")
    link.external_attr = (stat.S_IFLNK | 0o777) << 16
    with zipfile.ZipFile(project / "a.zip", "w") as archive:
        archive.writestr(link, str(outside))
    with zipfile.ZipFile(project / "b.zip", "w") as archive:
        archive.writestr("link/ESCAPED.txt", "written outside")
    run_id = await start(runs, project, "unzip")
    (project / "sub").mkdir()
    first = await runs.call_tool(run_id, "shell.run", {"command": "unzip a.zip -d sub"})
    second = await runs.call_tool(run_id, "shell.run", {"command": "unzip -o b.zip -d sub"})
    assert not list(outside.iterdir())
    assert not (project / "sub" / "link").is_symlink()
    assert first.status == "ok" and "1 link(s)" in first.result["stderr"], first
    assert second.status == "ok" and (project / "sub" / "link" / "ESCAPED.txt").is_file(), second


# Review s23 of the staged unpacking (a helper attacking it on the real stack): each of these wrote outside
# the project, into a protected place or over a file the run may not write, or ran a program.


async def _put(runs, run_id: str, path: str, data: bytes) -> None:
    import base64

    wrote = await runs.call_tool(
        run_id,
        "filesystem.write",
        {"path": path, "content": base64.b64encode(data).decode(), "encoding": "base64"},
    )
    assert wrote.status == "ok", wrote


async def test_attack_a_files_from_list_carries_no_options_for_tar(runs, project, tmp_path_factory):
    """GNU tar reads `-C DIR` and `--directory=DIR` lines in a -T list: one sent the unpacking out of the
    project, and in create mode read a file from outside into an archive."""
    outside = tmp_path_factory.mktemp("outside")
    (outside / "secret.txt").write_text("SECRET")
    run_id = await start(runs, project, "tar")
    await _put(runs, run_id, "a.tar", _tar_bytes([("ESCAPED.txt", None, "written outside")]).encode())
    await _put(runs, run_id, "list.txt", f"-C {outside}\nESCAPED.txt\n".encode())
    await _put(runs, run_id, "more.txt", f"--directory={outside}\nsecret.txt\n".encode())
    (project / "sub").mkdir()
    unpacked = await runs.call_tool(run_id, "shell.run", {"command": "tar -x -f a.tar -C sub -T list.txt"})
    made = await runs.call_tool(run_id, "shell.run", {"command": "tar -c -f out.tar -T more.txt"})
    shown = await runs.call_tool(run_id, "shell.run", {"command": "tar -xO -f out.tar"})
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]
    assert "SECRET" not in str(shown.result), shown
    assert unpacked.status == "ok" and "Not found in archive" in unpacked.result["stderr"], unpacked
    assert made.status == "denied" and "tar -T names the files" in made.reason, made  # (and refused now)


@pytest.mark.parametrize(
    ("commands", "argv", "named"),
    [
        ("tar", ["tar", "-x", "-f", "a.tar", "--one-top-level=../../../../../x"], "'--one-top-level'"),
        (
            "tar",
            ["tar", "-x", "-v", "-f", "a.tar", "-C", "out", "--index-file=src/main.py"],
            "'--index-file'",
        ),
        ("tar", ["tar", "-x", "-f", "a.tar", "--volno=src/main.py"], "'--volno-file'"),
        ("tar", ["tar", "-x", "--no-verbatim-files-from", "-T", "list.txt", "-f", "a.tar"], "verbatim"),
        # Old-style letters were read as flags only: I ran the program named after them.
        ("tar", ["tar", "xIf", "sh x.sh", "a.tar"], "'-I'"),
        ("tar", ["tar", "cFf", "x.sh", "b.tar", "out"], "'-F'"),
        ("tar", ["tar", "xgf", "src/main.py", "a.tar"], "'-g'"),
        ("unzip", ["unzip", "-:", "a.zip", "-d", "out"], "'-:'"),
        # Second review s23: --no-null turned the forced --verbatim-files-from off again; a -T list's names
        # were never checked in create mode (any host file); zip -qTT CMD ran CMD (-TT only refused whole);
        # zip -T runs unzip through sh; --recurse-paths is -r without the rule that -r needs -y.
        ("tar", ["tar", "-x", "--no-null", "-T", "list.txt", "-f", "a.tar", "-C", "out"], "'--no-null'"),
        ("tar", ["tar", "-c", "-f", "out/o.tar", "-T", "list.txt"], "tar -T names the files"),
        ("zip", ["zip", "-T", "-qTT", "touch PWNED;", "out/o.zip", "x.sh"], "'-T'"),
        ("zip", ["zip", "--recurse-paths", "out/o.zip", "src"], "zip -r follows symbolic links"),
        # Third review s23 (code against the real binaries): forms each program reads otherwise than Kiwi's
        # parser did. `xIf-` is old style to tar (its first word has no dash) and ran ./x.sh; -V takes the rest
        # of its word, so -xVO unpacked into the project unstaged; after the zipfile, unzip takes '-l*' for a
        # member, not a listing; zip -O=../x wrote outside; unzip -x before the zipfile makes the next word it.
        ("tar", ["tar", "xIf-", "./x.sh", "a.tar"], "not a form Kiwi reads"),
        ("tar", ["tar", "-xVO", "-f", "a.tar"], "not a form Kiwi reads"),
        ("unzip", ["unzip", "-o", "a.zip", "-l*"], "not a form Kiwi reads"),
        ("zip", ["zip", "-q", "-O=../z.zip", "out/o.zip", "x.sh"], "not a form Kiwi reads"),
        ("unzip", ["unzip", "-p", "-x", "../secret.zip"], "not a form Kiwi reads"),
        ("tar", ["tar", "-d", "-f", "a.tar"], "not a form Kiwi reads"),
        # Fourth review s23: tar reads `--newer-mtime --` as a date and goes on with options, where Kiwi's
        # parser took the end of options (`-f/anywhere` then written, `--checkpoint-action=exec=` run);
        # old-style f took `-C` for the archive's name and tar then read --diff; zip's -x list before the
        # archive's name took it; zip -m -r and tar --remove-files of `.` deleted .git (checked as files).
        ("tar", ["tar", "-c", "--newer-mtime", "--", "-fout/o.tar", "x.sh"], "not a form Kiwi reads"),
        ("tar", ["tar", "f", "-C", "--diff"], "not a form Kiwi reads"),
        ("zip", ["zip", "-x", "a", "out/o.zip", "-q", "src/main.py", "x.sh"], "not a form Kiwi reads"),
        ("zip", ["zip", "-r", "-y", "-m", "out/o.zip", "."], "protected place '.git'"),
        ("tar", ["tar", "--remove-files", "-cf", "out/o.tar", "."], "protected place '.git'"),
        # Fifth review s23: zip -f/-u act on the archive's own entries, whose names it carries (`../../x`):
        # -fm read and deleted files outside the project; tar -a starts a compressor picked by the name.
        ("zip", ["zip", "-fm", "out/o.zip"], "not a form Kiwi reads"),
        ("zip", ["zip", "-u", "out/o.zip"], "not a form Kiwi reads"),
        ("tar", ["tar", "-caf", "out/o.tar.lzo", "src"], "not a form Kiwi reads"),
    ],
)
async def test_attack_archive_options_that_write_or_run_what_kiwi_does_not_check(
    runs, project, commands, argv, named
):
    write(project / "src" / "main.py", "important = True\n")
    write(project / "x.sh", "touch PWNED\ncat\n")
    (project / "out").mkdir()
    run_id = await start(runs, project, commands)
    result = await runs.call_tool(run_id, "shell.run", {"argv": argv})
    assert result.status == "denied" and named in result.reason, result
    assert (project / "src" / "main.py").read_text() == "important = True\n"
    assert not pwned(project)


async def test_an_archive_named_host_colon_path_is_a_local_file_not_a_remote_shell(runs, project):
    """GNU tar takes `-f HOST:PATH` for a remote archive and runs rsh (ssh where rsh is ssh) to reach it."""
    run_id = await start(runs, project, "tar")
    result = await runs.call_tool(run_id, "shell.run", {"command": "tar -tf localhost:x"})
    assert result.status == "ok" and result.result["exit_code"] != 0, result
    assert "remote shell" not in result.result["stderr"] and "Cannot open" in result.result["stderr"], result
    refused = await runs.call_tool(run_id, "shell.run", {"command": "tar --no-force-local -tf localhost:x"})
    assert refused.status == "denied" and "'--no-force-local'" in refused.reason, refused


async def test_a_sparse_archive_cannot_bring_gigabytes_into_the_project(runs, project, tmp_path):
    """A 10 KB archive held a sparse 2 GB file, which the worker read whole into memory and wrote dense."""
    import subprocess

    subprocess.run(["truncate", "-s", "1500M", str(tmp_path / "big")], check=True)
    subprocess.run(["tar", "-c", "-S", "-f", str(project / "sp.tar"), "-C", str(tmp_path), "big"], check=True)
    assert (project / "sp.tar").stat().st_size < 100_000
    run_id = await start(runs, project, "tar")
    (project / "sub").mkdir()
    result = await runs.call_tool(run_id, "shell.run", {"command": "tar -x -f sp.tar -C sub"})
    assert result.status == "error" and "unpacks to more than" in result.reason, result
    assert not (project / "sub" / "big").exists()


async def test_a_member_the_project_cannot_take_is_left_out_and_named(runs, project):
    """A file where the project has a folder, a folder where it has a file: those members are left out and
    named, the others unpacked, and the command fails (as tar does); it failed with a raw OSError, after
    retries, leaving a half-done unpacking."""
    run_id = await start(runs, project, "tar")
    (project / "sub" / "x").mkdir(parents=True)
    write(project / "sub" / "y", "a file")
    archive = _tar_bytes(
        [("x", None, "file over a folder"), ("y/z", None, "under a file"), ("ok.txt", None, "ok")]
    )
    await _put(runs, run_id, "a.tar", archive.encode())
    result = await runs.call_tool(run_id, "shell.run", {"command": "tar -x -f a.tar -C sub"})
    assert result.status == "ok" and result.result["exit_code"] == 2, result
    err = result.result["stderr"]
    assert "kiwi: sub/x: not written" in err and "kiwi: sub/y/z: not written" in err, err
    assert (project / "sub" / "ok.txt").read_text() == "ok" and (
        project / "sub" / "y"
    ).read_text() == "a file"


def test_the_workers_own_folder_is_not_shown_even_cut_short():
    from activities.unpacking import _unnamed

    into = "/tmp/kiwi-unpack-abc123/into"
    assert _unnamed(f"x: {into}/a.txt\n", into, "sub") == "x: sub/a.txt\n"
    assert _unnamed(f"x: {into}/a\n extracting: {into[:17]}", into, "sub") == "x: sub/a\n extracting: "
    assert _unnamed("extracting: /tmp", into, "sub") == "extracting: /tmp"  # (too short to tell)


async def test_an_unpacking_is_stopped_once_it_writes_past_the_limit(tmp_path, monkeypatch):
    """Second review s23 F10: a 988-byte archive of one 1.2 GB member wrote all of it to the worker's disk
    before the limit was checked. The folder is measured while the program runs, and the program's process
    group is killed once it passes the limit (here 8 MB; a writer that never stops stands for the archive)."""
    import asyncio

    from activities import unpacking
    from activities.process import run_process
    from kiwi.errors import ToolFailed

    monkeypatch.setattr(unpacking, "UNPACK_MAX_BYTES", 8 * 1024 * 1024)
    monkeypatch.setattr(unpacking, "UNPACK_WATCH_SECONDS", 0.05)
    folder = tmp_path / "into"
    folder.mkdir()
    script = f'i=0; while true; do i=$((i+1)); head -c 1048576 /dev/zero > "{folder}/f$i"; done'
    running = asyncio.ensure_future(
        run_process(["sh", "-c", script], cwd=str(tmp_path), timeout=60, max_output=1000)
    )
    with pytest.raises(Exception) as stopped:
        await unpacking._within_limits(running, str(folder), "tar (unpacking into 'sub')")
    assert ToolFailed.type in repr(stopped.value) and "unpacks to more than" in str(stopped.value)
    assert running.done()
    assert sum(p.stat().st_size for p in folder.iterdir()) < 60 * 1024 * 1024


async def test_attack_tar_members_named_before_c_reach_no_protected_place(runs, project):
    """Second review s23 F1: -C applies to the names after it, and the rewriting replaced the one -C without
    putting one first: members matched before it went to the command's folder, the project (.git/hooks)."""
    run_id = await start(runs, project, "tar")
    archive = _tar_bytes([(".git/hooks/pre-commit", None, "touch PWNED\n"), ("ok.txt", None, "ok")])
    await _put(runs, run_id, "a.tar", archive.encode())
    (project / "sub").mkdir()
    argv = ["tar", "-x", "--wildcards", "-f", "a.tar", "*", "-C", "sub", "ok.txt"]
    result = await runs.call_tool(run_id, "shell.run", {"argv": argv})
    assert not (project / ".git" / "hooks" / "pre-commit").exists()
    assert result.status == "denied" and "sub/.git" in result.reason, result  # (protected at any depth)
    assert not (project / "sub" / ".git").exists()


async def test_attack_tar_names_after_c_are_checked_where_tar_reads_them(runs, project, tmp_path_factory):
    """Second review s23 F4: in create mode, a name after -C DIR was checked against the command's folder:
    from cwd sub, `tar -c -f ../o.tar -C .. ../outside/secret.txt` archived a file outside the project."""
    outside = project.parent / f"outside-{project.name}"
    outside.mkdir()
    (outside / "secret.txt").write_text("SECRET")
    run_id = await start(runs, project, "tar")
    (project / "sub").mkdir()
    argv = ["tar", "-c", "-f", "../o.tar", "-C", "..", f"../{outside.name}/secret.txt"]
    result = await runs.call_tool(run_id, "shell.run", {"argv": argv, "cwd": "sub"})
    assert result.status == "denied" and "leaves the project root" in result.reason, result
    assert not (project / "o.tar").exists()
    fine = await runs.call_tool(
        run_id, "shell.run", {"argv": ["tar", "-c", "-f", "../o.tar", "-C", "..", "x"], "cwd": "sub"}
    )
    assert fine.status == "ok", fine  # (a name in the project, after -C: as before)


async def test_attack_archive_writes_and_deletes_are_checked_as_writes(runs, project):
    """Second review s23 F6, F7: zip -lf (a log file) and zip -O wrote, zip -m and tar --remove-files
    deleted, and tar --add-file=.env read a denied file, each checked as a read (or not at all)."""
    from tests.helpers import directive_md, wait_for, write_directive

    write_directive(
        project / ".ai" / "directives" / "packer.md",
        directive_md(
            '<step name="work"><action>Pack.</action></step>',
            name="packer",
            permissions='<read resource="filesystem" path="**"/><write resource="filesystem" path="out/**"/>'
            '<deny resource="filesystem" path=".env"/><execute resource="shell" commands="tar,zip"/>',
        ),
    )
    write(project / "src" / "log.py", "keep = True\n")
    write(project / "src" / "moved.txt", "stays")
    write(project / ".env", "API_KEY=SECRET")
    (project / "out").mkdir()
    run_id = await runs.start("packer", {})

    async def waiting():
        return (await runs.status(run_id)).status == "awaiting_agent"

    await wait_for(waiting, what="packer to wait for the agent")
    for argv, named in (
        # (zip -lf and -O: refused as forms Kiwi does not read, since the third review.)
        (["zip", "out/a.zip", "-lf", "src/log.py", "src/moved.txt"], "'-lf'"),
        (["zip", "-O", "src/new", "out/a.zip", "src/moved.txt"], "'-O'"),
        (["zip", "-m", "out/b.zip", "src/moved.txt"], "src/moved.txt"),
        (["tar", "-c", "-f", "out/c.tar", "--remove-files", "src/moved.txt"], "src/moved.txt"),
        (["tar", "-c", "-f", "out/d.tar", "--add-file=.env"], ".env"),
    ):
        result = await runs.call_tool(run_id, "shell.run", {"argv": argv})
        assert result.status == "denied" and named in result.reason, (argv, result)
    assert (project / "src" / "log.py").read_text() == "keep = True\n"
    assert (project / "src" / "moved.txt").read_text() == "stays"
    assert not (project / "out" / "d.tar").exists()


async def test_attack_a_folder_inside_unzips_exclude_list_is_not_where_it_unpacks(runs, project):
    """Third review s23 F3: unzip takes the first -d it meets, inside an -x list too: `-x -d ../evil` beat
    the private folder's -d added at the end, and the files went outside the project."""
    import io
    import zipfile

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("f.txt", "unpacked")
    run_id = await start(runs, project, "unzip")
    await _put(runs, run_id, "a.zip", buffer.getvalue())
    evil = project.parent / f"evil-{project.name}"
    argv = ["unzip", "-o", "a.zip", "-d", "sub", "-x", "-d", f"../{evil.name}"]
    result = await runs.call_tool(run_id, "shell.run", {"argv": argv})
    assert not evil.exists()
    assert result.status == "ok" and (project / "sub" / "f.txt").read_text() == "unpacked", result


async def test_attack_a_folder_read_reaches_no_path_the_run_denies(runs, project):
    """Left by session 23: a program that reads everything below a folder (grep -r, rg, tar -c, zip -r, cp -r,
    ls -R, find, du) checked the folder against the run's denied paths, not what lies below it: `grep -r KEY
    .` read secrets/ under <deny path="secrets/**"/>. A link given as the folder (grep -r follows it) is
    checked where it leads, by the worker."""
    write(project / "secrets" / "key.txt", "TOPSECRET\n")
    write(project / "src" / "app.py", "keep = 'TOPSECRET is not here'\n")
    (project / "out").mkdir()
    (project / "everything").symlink_to(".")
    run_id = await agent_run(
        runs,
        project,
        "searcher",
        '<read resource="filesystem" path="**"/><write resource="filesystem" path="out/**"/>'
        '<deny resource="filesystem" path="secrets/**"/>'
        '<execute resource="shell" commands="grep,rg,tar,zip,cp,ls,find,du"/>',
    )
    for argv in (
        ["grep", "-r", "TOPSECRET", "."],
        ["grep", "-rn", "TOPSECRET"],
        ["grep", "--recursive", "TOPSECRET", "."],
        ["grep", "-d", "recurse", "TOPSECRET", "."],
        ["rg", "TOPSECRET"],
        ["tar", "-c", "-f", "out/a.tar", "."],
        ["tar", "cf", "out/b.tar", "."],
        ["zip", "-r", "-y", "out/c.zip", "."],
        ["cp", "-r", ".", "out/copy"],
        ["ls", "-R"],
        ["find", ".", "-name", "*.txt"],
        ["du", "-a"],
        ["grep", "-r", "TOPSECRET", "everything"],
        # The review of the rule (s24): an option's file is no path; GNU's unique starts of long options.
        ["grep", "-r", "TOPSECRET", "--exclude-from=-"],
        ["grep", "--recur", "TOPSECRET"],
        ["grep", "-d", "rec", "TOPSECRET", "."],
        ["cp", "--arc", ".", "out/copy"],
    ):
        result = await runs.call_tool(run_id, "shell.run", {"argv": argv})
        assert result.status == "denied", (argv, result)
        assert "secrets/**" in result.reason and "TOPSECRET" not in str(result.result), (argv, result)
    assert sorted(p.name for p in (project / "out").iterdir()) == []
    # A folder that holds nothing the run denies is read as before.
    result = await runs.call_tool(run_id, "shell.run", {"argv": ["grep", "-rn", "TOPSECRET", "src"]})
    assert result.status == "ok" and "is not here" in result.result["stdout"], result


async def test_attack_a_folder_moved_or_deleted_takes_no_denied_path_with_it(runs, project):
    """Found with the folder reads: `mv data out/data` put data/secrets/ where no denial named it (and `cat`
    then read it), `rm -r data` deleted it and `chmod -R` changed it, each checked as the folder alone."""
    key = project / "data" / "secrets" / "key.txt"
    write(key, "TOPSECRET\n")
    write(project / "data" / "notes.txt", "notes\n")
    (project / "out").mkdir()
    run_id = await agent_run(
        runs,
        project,
        "mover",
        '<read resource="filesystem" path="**"/><write resource="filesystem" path="**"/>'
        '<deny resource="filesystem" path="data/secrets/**"/>'
        '<execute resource="shell" commands="mv,rm,chmod,cat"/>',
    )
    for argv in (
        ["mv", "data", "out/data"],
        ["mv", "-t", "out", "data"],
        ["rm", "-r", "data"],
        ["chmod", "-R", "000", "data"],
    ):
        result = await runs.call_tool(run_id, "shell.run", {"argv": argv})
        assert result.status == "denied" and "data/secrets/**" in result.reason, (argv, result)
    assert key.read_text() == "TOPSECRET\n" and oct(key.stat().st_mode & 0o777) != "0o0"
    assert not (project / "out" / "data").exists()
    # What holds nothing denied moves as before.
    result = await runs.call_tool(run_id, "shell.run", {"argv": ["mv", "data/notes.txt", "out/notes.txt"]})
    assert result.status == "ok" and (project / "out" / "notes.txt").read_text() == "notes\n", result


async def test_attack_a_list_of_names_reads_no_file_outside_the_project(runs, project, tmp_path_factory):
    """s24 review: `sort --files0-from=LIST` (and wc's, du's, find's, file -f, a checksum's -c) read the files
    a list names, never checked: a list the agent wrote (or sent on standard input) named a file outside the
    project, and sort printed it."""
    outside = tmp_path_factory.mktemp("outside") / "secret.txt"
    outside.write_text("OUTSIDE-SECRET\n")
    write(project / "out" / "list", f"{outside}\0")
    write(project / "out" / "names", f"{outside}\n")
    write(project / "out" / "sums", f"{'0' * 64}  {outside}\n")
    run_id = await agent_run(
        runs,
        project,
        "lister",
        '<read resource="filesystem" path="**"/><write resource="filesystem" path="out/**"/>'
        '<execute resource="shell" commands="sort,wc,file,sha256sum"/>',
    )
    for arguments in (
        {"argv": ["sort", "--files0-from=out/list"]},
        # (Read from standard input, which a command gets none of: shell.run takes no `stdin`, refused since s34.)
        {"argv": ["wc", "--files0-from=-"]},
        {"argv": ["file", "-f", "out/names"]},
        {"argv": ["sha256sum", "-c", "out/sums"]},
    ):
        result = await runs.call_tool(run_id, "shell.run", arguments)
        assert result.status == "denied" and "from a list" in result.reason, (arguments, result)
        assert "OUTSIDE-SECRET" not in str(result.result)


async def test_a_denial_that_names_no_place_refuses_a_folder_only_where_it_matches_on_disk(runs, project):
    """`<deny path="**/.env"/>` can match below any folder: the run leaves it to the worker, which refuses
    `grep -r` over a folder that holds a .env and runs it over one that does not."""
    write(project / "src" / "app.py", "TOKEN = 'from the environment'\n")
    write(project / "deploy" / ".env", "TOKEN=TOPSECRET\n")
    run_id = await agent_run(
        runs,
        project,
        "envsafe",
        '<read resource="filesystem" path="**"/><deny resource="filesystem" path="**/.env"/>'
        '<execute resource="shell" commands="grep"/>',
    )
    result = await runs.call_tool(run_id, "shell.run", {"argv": ["grep", "-rn", "TOKEN", "src"]})
    assert result.status == "ok" and "from the environment" in result.result["stdout"], result
    for argv in (["grep", "-rn", "TOKEN", "deploy"], ["grep", "-rn", "TOKEN", "."], ["grep", "-rn", "TOKEN"]):
        result = await runs.call_tool(run_id, "shell.run", {"argv": argv})
        assert result.status == "denied" and "'**/.env'" in result.reason, (argv, result)
        assert "TOPSECRET" not in str(result.result)


def test_the_worker_looks_through_a_bounded_number_of_entries_for_a_denied_path(tmp_path, monkeypatch):
    """The worker's on-disk check of a folder read walks the folder (links not followed) and refuses a folder
    too big to look through, naming the limit, rather than reading it unchecked."""
    from temporalio.exceptions import ApplicationError

    from activities import diskchecks
    from kiwi.contracts import CommandRequest

    for name in ("a.py", "b.py", "c.py", "deep/er/d.py"):
        write(tmp_path / "src" / name, "x = 1\n")
    (tmp_path / "src" / "link").symlink_to(tmp_path / "deploy")
    write(tmp_path / "deploy" / ".env", "TOKEN=TOPSECRET\n")

    def request(*argv: str) -> CommandRequest:
        return CommandRequest(
            project_root=str(tmp_path), argv=list(argv), read_grants=["**"], deny_fs=["**/.env"]
        )

    diskchecks._checked_cwd(request("grep", "-r", "x", "src"))  # (the link to deploy/ is not followed)
    with pytest.raises(ApplicationError, match=r"'\*\*/\.env'"):
        diskchecks._checked_cwd(request("grep", "-r", "x", "."))
    monkeypatch.setattr(diskchecks, "DENIED_WALK_LIMIT", 3)
    with pytest.raises(ApplicationError, match="more than 3 entries to look through"):
        diskchecks._checked_cwd(request("grep", "-r", "x", "src"))


async def test_attack_dot_dot_after_a_link_or_a_backslash_name_leaves_no_project(
    runs, project, tmp_path_factory
):
    """Second review s24: Kiwi read `X/X/../../outside/f` as its text says (inside the project), the kernel
    from where the link X leads (outside); and `\\` is a separator to Kiwi but part of a name here, so
    `a\\b\\c\\d/../../../outside/f` went three folders up from one. Each read and write left the project."""
    outside = tmp_path_factory.mktemp("outside")
    (outside / "secret.txt").write_text("OUTSIDE-SECRET\n")
    (project / "out" / "a\\b\\c\\d").mkdir(parents=True)
    (project / "out" / "X").symlink_to(".")
    # From out/ the project's parent is two folders up, the outside folder beside the project.
    up = f"../../{outside.name}"
    run_id = await agent_run(
        runs,
        project,
        "linker",
        '<read resource="filesystem" path="out/**"/><write resource="filesystem" path="out/**"/>'
        '<execute resource="shell" commands="cat,cp,tee,mkdir"/>',
    )
    for arguments in (
        {"argv": ["cat", f"X/X/{up}/secret.txt"], "cwd": "out"},
        {"argv": ["cp", f"X/X/{up}/secret.txt", "copied.txt"], "cwd": "out"},
        {"argv": ["tee", f"X/X/{up}/written.txt"], "cwd": "out"},
        {"argv": ["cat", f"a\\b\\c\\d/../{up}/secret.txt"], "cwd": "out"},
        {"argv": ["tee", f"a\\b\\c\\d/../{up}/written.txt"], "cwd": "out"},
    ):
        result = await runs.call_tool(run_id, "shell.run", arguments)
        assert result.status != "ok", (arguments, result)
        assert "OUTSIDE-SECRET" not in str(result.result), (arguments, result)
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]
    assert not (project / "out" / "copied.txt").exists()


def test_diff_of_a_folder_does_not_follow_a_link_in_it_out_of_the_project(tmp_path, tmp_path_factory):
    """Second review s24: `diff L a/b` compared L with a/b/L, following a/b/L, a link out of the project (or to
    a place the run may not read). The worker meets each link in a folder diff reads where it leads."""
    from temporalio.exceptions import ApplicationError

    from activities import diskchecks
    from kiwi.contracts import CommandRequest

    outside = tmp_path_factory.mktemp("outside") / "secret.txt"
    outside.write_text("OUTSIDE-SECRET\n")
    write(tmp_path / "out" / "L", "")
    (tmp_path / "out" / "a").mkdir()
    (tmp_path / "out" / "a" / "L").symlink_to(outside)
    write(tmp_path / "secrets" / "key.txt", "KEY\n")
    (tmp_path / "out" / "b").mkdir()
    (tmp_path / "out" / "b" / "L").symlink_to(tmp_path / "secrets" / "key.txt")

    def request(*argv: str) -> CommandRequest:
        return CommandRequest(project_root=str(tmp_path), argv=list(argv), read_grants=["out/**"], cwd="out")

    with pytest.raises(ApplicationError, match="which leads out of the project"):
        diskchecks._checked_cwd(request("diff", "L", "a"))
    with pytest.raises(ApplicationError, match="a place this run may not read"):
        diskchecks._checked_cwd(request("diff", "L", "b"))
    diskchecks._checked_cwd(request("diff", "L", "L"))


async def test_attack_options_read_as_the_program_reads_them_write_and_read_nothing_outside(
    runs, project, tmp_path_factory
):
    """Third review s24: `uniq -5 IN OUT` wrote OUT unchecked (Kiwi took -5 for an operand), `chmod -w,a+rwx
    FILE` changed a file outside the project (the mode read as options), `grep --binary KEY FILE` printed a
    file outside it (--binary taken for an abbreviation of --binary-files, swallowing the pattern)."""
    outside = tmp_path_factory.mktemp("outside")
    (outside / "secret.txt").write_text("OUTSIDE-SECRET\n")
    (outside / "secret.txt").chmod(0o600)
    write(project / "out" / "in.txt", "a\na\n")
    up = f"../../{outside.name}"
    run_id = await agent_run(
        runs,
        project,
        "opts",
        '<read resource="filesystem" path="out/**"/><write resource="filesystem" path="out/**"/>'
        '<execute resource="shell" commands="uniq,chmod,grep"/>',
    )
    for argv in (
        ["uniq", "-5", "in.txt", f"{up}/made.txt"],
        ["chmod", "-w,a+rwx", f"{up}/secret.txt"],
        ["grep", "--binary", "OUTSIDE", f"{up}/secret.txt"],
    ):
        result = await runs.call_tool(run_id, "shell.run", {"argv": argv, "cwd": "out"})
        assert result.status == "denied" and "leaves the project" in result.reason, (argv, result)
        assert "OUTSIDE-SECRET" not in str(result.result)
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]
    assert oct((outside / "secret.txt").stat().st_mode & 0o777) == "0o600"


async def test_attack_abbreviations_and_hard_links_change_no_file_the_run_may_not_write(runs, project):
    """Fourth review s24: `git rm --f src/a.txt` deleted it (git read --force, Kiwi --format, swallowing the
    path); a hard link made out/h another name for src/a.txt, so writing out/h wrote src/a.txt. git now takes
    no abbreviation (it stops with an error), and the worker refuses to write a file with other names."""
    write(project / "src" / "a.txt", "hello\n")
    (project / "out").mkdir()
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    subprocess.run(["git", "-C", str(project), "add", "src/a.txt"], check=True)
    os.link(project / "src" / "a.txt", project / "out" / "h")  # (made by a human, or before the rules)
    run_id = await agent_run(
        runs,
        project,
        "linked",
        '<read resource="filesystem" path="**"/><write resource="filesystem" path="out/**"/>'
        '<execute resource="shell" commands="git,tee,chmod,cp"/>',
    )
    removed = await runs.call_tool(run_id, "shell.run", {"argv": ["git", "rm", "--f", "src/a.txt"]})
    assert removed.status != "ok" or removed.result["exit_code"] != 0, removed
    assert "abbreviated" in str(removed.result) + removed.reason, removed
    written = await runs.call_tool(run_id, "shell.run", {"argv": ["tee", "out/h"]})
    assert written.status == "denied" and "hard links" in written.reason, written
    # Third review s25: nor through a folder the program works on whole (chmod -R, cp -r into it).
    write(project / "out" / "new" / "h", "PAYLOAD\n")
    mode = (project / "src" / "a.txt").stat().st_mode
    for argv in (["chmod", "-R", "777", "out"], ["cp", "-rT", "out/new", "out"]):
        result = await runs.call_tool(run_id, "shell.run", {"argv": argv})
        assert result.status == "denied" and "hard links" in result.reason, (argv, result)
    assert (project / "src" / "a.txt").read_text() == "hello\n"
    assert (project / "src" / "a.txt").stat().st_mode == mode


async def test_attack_a_new_branch_with_force_rewrites_no_file(runs, project):
    """Fifth review s24: `git checkout -f -b NAME` was taken for a new branch where HEAD is (the tree left as
    it is), but -f resets every tracked file to HEAD, which the agent can point at any tree: a human's
    uncommitted edit was lost and protected files rolled back."""
    write(project / "src" / "a.txt", "committed\n")
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    subprocess.run(["git", "-C", str(project), "add", "src/a.txt"], check=True)
    subprocess.run(
        ["git", "-C", str(project), "-c", "user.name=h", "-c", "user.email=h@x", "commit", "-qm", "c"],
        check=True,
    )
    write(project / "src" / "a.txt", "the human's edit\n")
    (project / "out").mkdir()
    run_id = await agent_run(
        runs,
        project,
        "brancher",
        '<read resource="filesystem" path="**"/><write resource="filesystem" path="out/**"/>'
        '<execute resource="shell" commands="git"/>',
    )
    for argv in (
        ["git", "checkout", "-f", "-b", "evil"],
        ["git", "checkout", "-fb", "evil"],
        ["git", "restore", "-p"],
    ):
        result = await runs.call_tool(run_id, "shell.run", {"argv": argv, "cwd": "out"})
        assert result.status == "denied", (argv, result)
    assert (project / "src" / "a.txt").read_text() == "the human's edit\n"
    made = await runs.call_tool(run_id, "shell.run", {"argv": ["git", "checkout", "-q", "-b", "topic"]})
    assert made.status == "ok" and made.result["exit_code"] == 0, made
    assert (project / "src" / "a.txt").read_text() == "the human's edit\n"


async def test_attack_an_option_kiwi_never_read_runs_nothing(runs, project):
    """Session 25: an option a program's spec did not name passed as a harmless flag, so `diff --paginate A B`
    (or `diff -l`) ran the program pr; the recorded history of the code before shows its page header
    (tests/histories/shell_options_before-*). Every option is now one Kiwi has read: the rest are refused,
    an abbreviation of several too; the options a program has still run."""
    write(project / "out" / "a.txt", "a\n")
    write(project / "out" / "b.txt", "b\n")
    run_id = await agent_run(
        runs,
        project,
        "closed",
        '<read resource="filesystem" path="out/**"/><execute resource="shell" commands="diff,ls,sort"/>',
    )
    for argv, named in (
        (["diff", "--paginate", "a.txt", "b.txt"], "runs the program pr"),
        (["diff", "-ul", "a.txt", "b.txt"], "runs the program pr"),
        (["sort", "--no-such-option", "a.txt"], "is not an option of sort that Kiwi knows"),
        (["ls", "--co", "."], "abbreviates several of ls's options"),
    ):
        result = await runs.call_tool(run_id, "shell.run", {"argv": argv, "cwd": "out"})
        assert result.status == "denied" and named in result.reason, (argv, result)
        assert result.result is None
    for argv in (
        ["diff", "-u", "a.txt", "b.txt"],
        ["ls", "-la", "--color=never", "."],
        ["sort", "-r", "a.txt"],
    ):
        result = await runs.call_tool(run_id, "shell.run", {"argv": argv, "cwd": "out"})
        assert result.status == "ok" and result.result["exit_code"] in (0, 1), (argv, result)
        assert "Page 1" not in result.result["stdout"]


def test_the_worker_refuses_an_option_kiwi_never_read_whatever_the_run_decided(tmp_path):
    """A run that started before KNOWN_OPTIONS decides as it did (it allowed `diff --paginate`); the worker
    that runs the command refuses it all the same."""
    from temporalio.exceptions import ApplicationError

    from activities import diskchecks
    from kiwi.contracts import CommandRequest

    write(tmp_path / "a.txt", "a\n")

    def request(*argv: str) -> CommandRequest:
        return CommandRequest(project_root=str(tmp_path), argv=list(argv), read_grants=["**"])

    with pytest.raises(ApplicationError, match="runs the program pr"):
        diskchecks._checked_cwd(request("diff", "--paginate", "a.txt", "a.txt"))
    with pytest.raises(ApplicationError, match="is not an option of sort that Kiwi knows"):
        diskchecks._checked_cwd(request("sort", "--no-such-option", "a.txt"))
    diskchecks._checked_cwd(request("diff", "-u", "a.txt", "a.txt"))


async def test_attack_a_merge_strategy_runs_no_program(runs, project, tmp_path_factory, monkeypatch):
    """`git merge -s NAME` runs the program git-merge-NAME from PATH (a folder on the worker's PATH that
    someone can write to, here one made by the test). Only git's own strategies are taken."""
    from kiwi.protected import PROTECTED_ROOTS

    bin_dir = tmp_path_factory.mktemp("bin")
    marker = bin_dir / "PWNED"
    script = bin_dir / "git-merge-pwn"
    script.write_text(f"#!/bin/sh\ntouch {marker}\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    write(project / "src" / "a.txt", "one\n")
    subprocess.run(["git", "init", "-q", "-b", "main", str(project)], check=True)
    identity = ["-c", "user.name=h", "-c", "user.email=h@x"]
    subprocess.run(["git", "-C", str(project), "add", "src/a.txt"], check=True)
    subprocess.run(["git", "-C", str(project), *identity, "commit", "-qm", "one"], check=True)
    subprocess.run(["git", "-C", str(project), "checkout", "-q", "-b", "other"], check=True)
    for branch, name in (("other", "b.txt"), ("main", "c.txt")):  # (so that a merge needs its strategy)
        subprocess.run(["git", "-C", str(project), "checkout", "-q", branch], check=True)
        write(project / "src" / name, f"{branch}\n")
        subprocess.run(["git", "-C", str(project), "add", f"src/{name}"], check=True)
        subprocess.run(["git", "-C", str(project), *identity, "commit", "-qm", branch], check=True)
    run_id = await agent_run(
        runs,
        project,
        "merger",
        '<read resource="filesystem" path="**"/><write resource="filesystem" path="**"/>'.join(
            f'<write resource="filesystem" path="{place}/**"/>'
            for place in (".git", *PROTECTED_ROOTS, ".ai/directives", ".ai/proposals", "temporal-dev.yml")
        )
        + '<execute resource="shell" commands="git"/>',
    )
    for argv in (
        ["git", "merge", "-s", "pwn", "other"],
        ["git", "merge", "-qspwn", "other"],
        ["git", "merge", "--strategy=pwn", "other"],
    ):
        result = await runs.call_tool(run_id, "shell.run", {"argv": argv})
        assert not marker.exists(), (argv, result)
        assert result.status == "denied" and "git-merge-pwn" in result.reason, (argv, result)
    merged = await runs.call_tool(run_id, "shell.run", {"argv": ["git", "merge", "-s", "ort", "other"]})
    assert merged.status == "ok" and merged.result["exit_code"] == 0, merged


async def test_attack_a_link_moved_into_place_or_named_by_its_target_writes_nothing_it_may_not(runs, project):
    """Review s25: a link's text is checked where the link is made; moved (`mv`), it can lead elsewhere, and
    `cp f out` then wrote through out/f, never checked, to a file outside the project. `cp f config` replaced
    a denied config/f the same way, `ln -sf ../out/f` in config replaced it with a link (ln with one operand
    makes ./NAME), and `uniq -- -5 OUT` wrote OUT (after `--`, -5 is uniq's input, OUT its output)."""
    outside = outside_folder(project)
    (outside / "victim.txt").write_text("untouched\n")
    write(project / "src" / "a.txt", "PAYLOAD\n")
    write(project / "out" / "prod.env", "DB_PASSWORD=attacker\n")
    write(project / "out" / "-5", "PAYLOAD\n")
    write(project / "config" / "prod.env", "DB_PASSWORD=real\n")
    run_id = await agent_run(
        runs,
        project,
        "mover",
        '<read resource="filesystem" path="**"/><write resource="filesystem" path="out/**"/>'
        '<execute resource="shell" commands="mkdir,ln,mv,cp,uniq"/>',
    )

    sh = functools.partial(shell, runs, run_id)

    for argv in (
        ["mkdir", "-p", "out/a/b"],
        ["ln", "-s", f"../../{outside.name}/victim.txt", "out/a/b/a.txt"],  # (out/outside-.../victim.txt)
    ):
        made = await sh(*argv)
        assert made.status == "ok" and made.result["exit_code"] == 0, (argv, made)
    moved = await sh("mv", "out/a/b/a.txt", "out")  # (since the second review: see the test below)
    assert moved.status == "denied" and "a link keeps its text" in moved.reason, moved
    (project / "out" / "a/b/a.txt").rename(project / "out" / "a.txt")  # (moved by a human, or before)
    copied = await sh("cp", "src/a.txt", "out")
    assert copied.status == "denied" and "outside the project" in copied.reason, copied
    assert (outside / "victim.txt").read_text() == "untouched\n"
    written = await sh("uniq", "--", "-5", "../src/a.txt", cwd="out")
    assert written.status == "denied" and "src/a.txt" in written.reason, written
    assert (project / "src" / "a.txt").read_text() == "PAYLOAD\n"
    linked = await sh("ln", "-s", "out/a.txt")
    assert linked.status == "denied" and "write" in linked.reason, linked
    assert not (project / "a.txt").is_symlink()


async def test_attack_a_copy_into_a_folder_replaces_no_denied_file(runs, project):
    write(project / "out" / "prod.env", "DB_PASSWORD=attacker\n")
    write(project / "config" / "prod.env", "DB_PASSWORD=real\n")
    run_id = await agent_run(
        runs,
        project,
        "copier",
        '<read resource="filesystem" path="**"/><write resource="filesystem" path="**"/>'
        '<deny resource="filesystem" path="config/prod.env"/><execute resource="shell" commands="cp,mv,ln"/>',
    )
    for argv, cwd in (
        (["cp", "out/prod.env", "config"], "."),
        (["cp", "-t", "config", "out/prod.env"], "."),
        (["mv", "out/prod.env", "config"], "."),
        (["ln", "-sf", "../out/prod.env"], "config"),
    ):
        result = await runs.call_tool(run_id, "shell.run", {"argv": argv, "cwd": cwd})
        assert result.status == "denied" and "config/prod.env" in result.reason, (argv, result)
    assert (project / "config" / "prod.env").read_text() == "DB_PASSWORD=real\n"
    assert not (project / "config" / "prod.env").is_symlink()


async def test_attack_a_folder_copied_whole_writes_through_no_link_in_its_way(runs, project):
    """`cp -r src out` into an existing out/src writes every file below it through any link already there (one
    moved into place, its text leading out of the project): the worker looks below each folder cp -r writes
    into, and every link there must lead where the run may write."""
    outside = outside_folder(project)
    (outside / "a.txt").write_text("untouched\n")
    write(project / "src" / "a.txt", "PAYLOAD\n")
    (project / "out" / "src").mkdir(parents=True)
    (project / "out" / "src" / "a.txt").symlink_to(outside / "a.txt")
    run_id = await agent_run(
        runs,
        project,
        "treecopy",
        '<read resource="filesystem" path="**"/><write resource="filesystem" path="out/**"/>'
        '<execute resource="shell" commands="cp"/>',
    )
    for argv in (["cp", "-r", "src", "out"], ["cp", "-a", "src", "out/"], ["cp", "-R", "src/.", "out/src"]):
        result = await runs.call_tool(run_id, "shell.run", {"argv": argv})
        assert result.status == "denied" and "out/src/a.txt" in result.reason, (argv, result)
        assert (outside / "a.txt").read_text() == "untouched\n"
    (project / "out" / "src" / "a.txt").unlink()
    write(project / "out" / "elsewhere.txt", "old\n")
    (project / "out" / "src" / "a.txt").symlink_to(project / "out" / "elsewhere.txt")  # (a link it may write)
    copied = await runs.call_tool(run_id, "shell.run", {"argv": ["cp", "-r", "src", "out"]})
    assert copied.status == "ok" and copied.result["exit_code"] == 0, copied
    assert (project / "out" / "elsewhere.txt").read_text() == "PAYLOAD\n"


async def test_attack_a_link_moved_by_the_command_itself_leads_nowhere_it_may_not(runs, project):
    """Second review s25: each check is made before the command runs, and cp, mv and ln take their operands in
    order, so one operand can put a link where its text leads out of the project and a later one go through
    it: `cp -r A B out` overwrote a file outside, `cp -r --parents` wrote into a folder outside, `mv` moved
    outside and denied files into out/, `ln` hard-linked them. A link moved or copied as a link is now
    checked from where it lands: it must lead where the run may write."""
    outside = outside_folder(project)
    (outside / "dir").mkdir()
    (outside / "victim").write_text("ORIGINAL\n")
    (outside / "dir" / "v").write_text("ORIGINAL\n")
    write(project / "src" / "a.txt", "SRC\n")
    write(project / "config" / "prod.env", "SECRET=1\n")
    harness = project / ".ai" / "config" / "agent_harness.yaml"
    harness.write_text(harness.read_text().replace("max_warnings: 5", "max_warnings: 50"))  # (quiet steps)
    run_id = await agent_run(
        runs,
        project,
        "chains",
        '<read resource="filesystem" path="**"/><write resource="filesystem" path="out/**"/>'
        '<deny resource="filesystem" path="config/prod.env"/><execute resource="shell" commands="mkdir,ln,cp,mv"/>',
    )

    sh = functools.partial(shell, runs, run_id)

    up = f"../../../{outside.name}"
    for argv, cwd in (
        (["mkdir", "-p", "out/p/x/c", "out/q/c", "out/p/x/y/c", "out/t"], "."),
        (["ln", "-s", f"{up}/victim", "out/p/x/c/F"], "."),  # (out/outside-.../victim, from out/p/x/c)
        (["ln", "-s", f"../{up}/dir", "out/p/x/y/c/D"], "."),
        (["ln", "-s", "../../../config", "out/p/x/y/c/K"], "."),  # (out/config)
        (["cp", "src/a.txt", "out/q/c/F"], "."),
        (["ln", "-s", "c", "out/p/x/y/L"], "."),  # (a link to the folder c, for cp -H)
        (["ln", "-s", "..", "out/p/x/y/U"], "."),  # (a link to out/p/x: ln -s into it makes out/p/x/NAME)
    ):
        made = await sh(*argv, cwd=cwd)
        assert made.status == "ok" and made.result["exit_code"] == 0, (argv, made)
    several = "give {} one source at a time"
    for argv, cwd, named in (
        (["cp", "-r", "out/p/x/c", "out/q/c", "out"], ".", several.format("cp")),
        (["cp", "-a", "out/p/x/c", "out/q/c", "out"], ".", several.format("cp")),
        (["cp", "-r", "--parents", "c", "c/D/v", "../../../t"], "out/p/x/y", several.format("cp")),
        (["mv", "out/p/x/y/c", "out/t/c/D/v", "out/t/c/K/prod.env", "out/t"], ".", several.format("mv")),
        (["ln", "out/p/x/y/c/D", "out/p/x/y/c/K", "out/t"], ".", several.format("ln")),
        (["mv", "out/p/x/c", "out/t"], ".", "a link keeps its text"),
        (["cp", "-a", "out/p/x/y/c", "out/t"], ".", "a link keeps its text"),
        (["ln", "out/p/x/c/F", "out/t"], ".", "a link keeps its text"),
        # Third review s25: -T puts a folder's entries in the destination itself, -H copies the folder a
        # link leads to (links below it too), and ln -s into a folder makes FOLDER/NAME, read from there.
        (["cp", "-rT", "out/p/x/c", "out/t"], ".", "a link keeps its text"),
        (["mv", "-T", "out/p/x/c", "out/t"], ".", "a link keeps its text"),
        (["cp", "-rH", "out/p/x/y/L", "out/t"], ".", "a link keeps its text"),
        (["ln", "-s", f"../{up}/victim", "out/p/x/y/U"], ".", "a link keeps its text"),
    ):
        result = await sh(*argv, cwd=cwd)
        assert result.status == "denied" and named in result.reason, (argv, result)
    assert (outside / "victim").read_text() == "ORIGINAL\n"
    assert (outside / "dir" / "v").read_text() == "ORIGINAL\n"
    assert (project / "config" / "prod.env").read_text() == "SECRET=1\n"
    assert sorted(p.name for p in (project / "out" / "t").iterdir()) == []
    # A link that leads where the run may write goes where it likes.
    for argv in (
        ["ln", "-s", "a.txt", "out/t/L"],
        ["mv", "out/t/L", "out/t/M"],
        ["cp", "-a", "out/t/M", "out/t/N"],
    ):
        moved = await sh(*argv)
        assert moved.status == "ok" and moved.result["exit_code"] == 0, (argv, moved)


async def test_attack_a_hard_link_to_a_denied_file_reads_nothing(runs, project):
    """Third review s25: a denied file with another name (a human's hard link, docs/notes for secrets/key) was
    read under that name, alone or in a folder (`cat docs/notes`, `grep -r KEY docs`). With denials in force,
    a file with other names is not read."""
    write(project / "secrets" / "key", "TOPSECRET\n")
    write(project / "docs" / "readme", "hello\n")
    os.link(project / "secrets" / "key", project / "docs" / "notes")
    run_id = await agent_run(
        runs,
        project,
        "hardread",
        '<read resource="filesystem" path="**"/><deny resource="filesystem" path="secrets/**"/>'
        '<execute resource="shell" commands="cat,grep"/>',
    )
    for argv in (["cat", "docs/notes"], ["grep", "-r", "TOP", "docs"]):
        result = await runs.call_tool(run_id, "shell.run", {"argv": argv})
        assert result.status == "denied" and "hard links" in result.reason, (argv, result)
        assert "TOPSECRET" not in str(result.result)
    read = await runs.call_tool(run_id, "filesystem.read", {"path": "docs/notes"})
    assert read.status == "denied" and "hard links" in read.reason, read
    shown = await runs.call_tool(run_id, "shell.run", {"argv": ["cat", "docs/readme"]})
    assert shown.status == "ok" and shown.result["stdout"] == "hello\n", shown


async def test_attack_a_file_read_on_the_side_or_a_link_moved_another_way_reads_nothing(runs, project):
    """Fourth review s25: rg reads an ignore file in every folder it searches (printing its lines in errors),
    tree --info reads .info files: a link out/.ignore made while out/c was a folder, then out/c made a link to
    config, printed the denied config/prod.env. `cp -r L/ DEST` (the slash follows L) and filesystem.move of
    a folder moved links unchecked, and `ln -sn TEXT DIR` read TEXT from DIR's parent."""
    outside = outside_folder(project)
    (outside / "victim").write_text("OUTSIDE_SECRET\n")
    write(project / "config" / "prod.env", "DB_PASSWORD=hunter2\n")
    write(project / "out" / "hello.txt", "hello\n")
    (project / "out" / "c").mkdir()
    (project / "out" / ".ignore").symlink_to("c/prod.env")  # (made while out/c was a folder)
    (project / "out" / "c").rmdir()
    (project / "out" / "c").symlink_to("../config")
    (project / "out" / "p" / "t").mkdir(parents=True)
    (project / "out" / "p" / "t" / "v").symlink_to(
        f"../../../{outside.name}/victim"
    )  # (out/outside-.../victim)
    (project / "out" / "L").symlink_to("p/t")
    (project / "out" / "d").mkdir()
    (project / "out" / "d" / "k").symlink_to("../../config")  # (config, from out/d)
    harness = project / ".ai" / "config" / "agent_harness.yaml"
    harness.write_text(harness.read_text().replace("max_warnings: 5", "max_warnings: 50"))
    run_id = await agent_run(
        runs,
        project,
        "sideread",
        '<read resource="filesystem" path="**"/><write resource="filesystem" path="out/**"/>'
        '<deny resource="filesystem" path="config/prod.env"/>'
        '<execute resource="shell" commands="rg,tree,cp,ln"/>',
    )
    for argv, named in (
        (["rg", "hello", "out"], "rg reads the ignore file 'out/.ignore'"),
        (["tree", "--info", "out"], "reads a .info file in every folder"),
        (["cp", "-r", "out/L/", "out/z"], "a link keeps its text"),
        (["ln", "-sn", "k/prod.env", "out/d"], "a link keeps its text"),
    ):
        result = await runs.call_tool(run_id, "shell.run", {"argv": argv})
        assert result.status == "denied" and named in result.reason, (argv, result)
        assert "hunter2" not in str(result.result) and "OUTSIDE_SECRET" not in str(result.result)
    moved = await runs.call_tool(run_id, "filesystem.move", {"source": "out/p/t", "destination": "out/z"})
    assert moved.status == "denied" and "a link keeps its text" in moved.reason, moved
    assert not (project / "out" / "z").exists()
    (project / "out" / ".ignore").unlink()
    found = await runs.call_tool(run_id, "shell.run", {"argv": ["rg", "hello", "out"]})
    if shutil.which("rg"):  # (the refusals above are the worker's, made before it looks for the program)
        assert found.status == "ok" and "hello" in found.result["stdout"], found
    else:
        assert "rg reads the ignore file" not in found.reason, found


async def test_attack_git_mv_moves_no_link_where_it_leads_elsewhere(runs, project):
    outside = outside_folder(project)
    (project / "out" / "a" / "b").mkdir(parents=True)
    (project / "out" / "a" / "b" / "v").symlink_to(f"../../../{outside.name}/victim")
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    subprocess.run(["git", "-C", str(project), "add", "out/a"], check=True)
    run_id = await agent_run(
        runs,
        project,
        "gitmover",
        '<read resource="filesystem" path="**"/><write resource="filesystem" path="out/**"/>'
        '<execute resource="shell" commands="git"/>',
    )
    moved = await runs.call_tool(run_id, "shell.run", {"argv": ["git", "mv", "out/a/b", "out/b"]})
    assert moved.status == "denied" and "a link keeps its text" in moved.reason, moved
    assert (project / "out" / "a" / "b" / "v").is_symlink()


async def test_attack_git_goes_through_no_link_standing_where_a_tracked_folder_was(runs, project):
    """Fifth review s25: git opens and unlinks the files it tracks by their names. With out/c (tracked) moved
    away and a link to ../.ai put in its place, `git rm -r -f out` deleted the audit trail and `git grep`
    printed protected files; through a link to a folder outside the project, files outside it."""
    outside = outside_folder(project)
    (outside / "logs").mkdir()
    (outside / "logs" / "a.txt").write_text("OUTSIDE\n")
    write(project / "out" / "c" / "logs" / "a.txt", "mine\n")
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    subprocess.run(["git", "-C", str(project), "add", "out"], check=True)
    (project / "out" / "c").rename(project / "out" / "c_old")
    (project / "out" / "c").symlink_to(f"../../{outside.name}")  # (made as the review showed it can be)
    run_id = await agent_run(
        runs,
        project,
        "gitthrough",
        '<read resource="filesystem" path="**"/><write resource="filesystem" path="out/**"/>'
        '<execute resource="shell" commands="git"/>',
    )
    for argv in (["git", "rm", "-r", "-f", "-q", "out"], ["git", "grep", "-e", ".", "--", "out"]):
        result = await runs.call_tool(run_id, "shell.run", {"argv": argv})
        assert result.status == "denied" and "is now a symbolic link" in result.reason, (argv, result)
        assert "OUTSIDE" not in str(result.result)
    assert (outside / "logs" / "a.txt").read_text() == "OUTSIDE\n"
    (project / "out" / "c").unlink()
    (project / "out" / "c_old").rename(project / "out" / "c")
    listed = await runs.call_tool(run_id, "shell.run", {"argv": ["git", "grep", "-e", "mine", "--", "out"]})
    assert listed.status == "ok" and "mine" in listed.result["stdout"], listed


def test_the_last_of_h_l_p_decides_whether_cp_and_ln_follow_a_source_link(tmp_path):
    """Sixth review s25: GNU cp and ln take the last of -H/-L/-P; Kiwi took any -H or -L for following, so
    `cp -H -P -r L out` (L a link whose text leads out of the project from out/) went unchecked."""
    from temporalio.exceptions import ApplicationError

    from activities import diskchecks
    from kiwi.contracts import CommandRequest

    (tmp_path / "a" / "b" / "c").mkdir(parents=True)
    (tmp_path / "out").mkdir()
    (tmp_path / "a" / "b" / "c" / "L").symlink_to(
        "../../../x"
    )  # (x at the root from a/b/c; outside from out/)

    def request(*argv: str) -> CommandRequest:
        return CommandRequest(
            project_root=str(tmp_path), argv=list(argv), read_grants=["**"], write_grants=["**"]
        )

    for argv in (["cp", "-H", "-P", "-r", "a/b/c/L", "out"], ["cp", "-HPr", "a/b/c/L", "out"]):
        with pytest.raises(ApplicationError, match="a link keeps its text"):
            diskchecks._checked_cwd(request(*argv))
    with pytest.raises(ApplicationError, match="a link keeps its text"):
        diskchecks._checked_cwd(request("ln", "-L", "-P", "a/b/c/L", "out"))


async def test_attack_an_input_is_one_word_of_a_steps_command(runs, project):
    """README trial s36: a step's `sort {file}`, run with the input `src/fruits.txt -o notes/pwn.txt`, became
    `sort src/fruits.txt -o notes/pwn.txt`: whoever gives the inputs (an agent starting the run) gave the program
    an option the directive's author never wrote, and it wrote notes/pwn.txt. A placeholder's value is now part
    of the one word the directive wrote."""
    write(project / "src" / "fruits.txt", "pear\napple\n")
    write_directive(
        project / ".ai" / "directives" / "sorter.md",
        directive_md(
            '<step name="sorted"><tool_call tool="shell.run"><param name="command">sort {file}</param>'
            "</tool_call></step>"
            '<step name="look"><action>Look at the result.</action></step>',
            name="sorter",
            permissions='<read resource="filesystem" path="**"/><write resource="filesystem" path="notes/**"/>'
            '<execute resource="shell" commands="sort"/>',
            inputs='<input name="file" type="string" required="true"/>',
        ),
    )
    run_id = await runs.start("sorter", {"file": "src/fruits.txt -o notes/pwn.txt"})
    await wait_for(lambda: waits_for_agent(runs, run_id), what="the agent step")
    status = await runs.status(run_id)
    result = status.steps[0].outputs["result"]
    assert result["exit_code"] != 0 and "src/fruits.txt -o notes/pwn.txt" in result["stderr"], result
    assert not (project / "notes" / "pwn.txt").exists()
    # `kiwi status` shows the one word as one (second trial s36: `sort src/fruits.txt -o notes/pwn.txt` read as -o).
    assert status.last_calls[-1].summary == "shell.run sort 'src/fruits.txt -o notes/pwn.txt'", (
        status.last_calls
    )
    fine = await runs.start("sorter", {"file": "src/fruits.txt"})
    await wait_for(lambda: waits_for_agent(runs, fine), what="the agent step")
    result = (await runs.status(fine)).steps[0].outputs["result"]
    assert result["exit_code"] == 0 and result["stdout"] == "apple\npear\n", result


def test_a_commands_placeholders_fill_words_never_make_them():
    """kiwi.templating.command_words: the directive's words, each filled by itself; a word that is one
    placeholder of an array input is its items, a word each (the way a directive passes many paths)."""
    from kiwi.templating import command_words

    inputs = {"inputs": {"file": "a b -o x", "paths": ["notes/a b.md", "notes/c.md"], "n": 2}}
    assert command_words("shell.run", {"command": "sort {file}"}, inputs) == ["sort", "a b -o x"]
    assert command_words("shell.run", {"command": "sort -k{n} '{file}.txt'"}, inputs) == [
        "sort",
        "-k2",
        "a b -o x.txt",
    ]
    assert command_words("shell.run", {"command": "ls -l {paths}"}, inputs) == [
        "ls",
        "-l",
        "notes/a b.md",
        "notes/c.md",
    ]
    # An agent's step outputs are one word, a list too (review s36, second round: `-o` came from them).
    context = {**inputs, "steps": {"pick": {"outputs": {"file": ["-o", "notes/important.md", "src/a.txt"]}}}}
    assert command_words("shell.run", {"command": "sort {steps.pick.outputs.file}"}, context) == [
        "sort",
        '["-o", "notes/important.md", "src/a.txt"]',
    ]
    assert command_words("shell.run", {"command": "sort {pick.file}"}, context)[1].startswith('["-o"')
    assert command_words("shell.run", {"command": "ls notes"}, inputs) is None  # (no placeholder: as written)
    assert (
        command_words("shell.run", {"argv": ["ls", "{file}"]}, inputs) is None
    )  # (argv: one word each already)
    assert command_words("filesystem.read", {"path": "{file}"}, inputs) is None


async def test_a_number_option_is_an_option_not_a_path(runs, project):
    """README trial s36: `ls -1 notes` and `head -5 notes/x.txt` were refused inside a run, `read not allowed on
    '-1'` (the word read as a path), with the hint to grant read on `-1`. `ls -1` is one of ls's options, and
    head's `-5` is `-n 5`; a number that is no option of the program is still refused as a path it names."""
    write(project / "notes" / "x.txt", "".join(f"{n}\n" for n in range(9)))
    run_id = await agent_run(
        runs,
        project,
        "lister",
        '<read resource="filesystem" path="notes/**"/><execute resource="shell" commands="ls,head,cat"/>',
    )
    listed = await shell(runs, run_id, "ls", "-1", "notes/x.txt")
    assert listed.status == "ok" and listed.result["stdout"] == "notes/x.txt\n", listed
    first = await shell(runs, run_id, "head", "-5", "notes/x.txt")
    assert first.status == "ok" and first.result["stdout"] == "0\n1\n2\n3\n4\n", first
    refused = await shell(runs, run_id, "cat", "-5", "notes/x.txt")
    assert refused.status == "denied", refused


def test_every_built_in_says_what_it_does_and_shell_run_how_it_runs():
    """README trial s36: a run's `local_tools` gave shell.run's schema alone, which said nothing of command or argv
    nor that no shell runs them."""
    from kiwi.toolargs import BUILTIN_DESCRIPTIONS, BUILTIN_SCHEMAS

    assert set(BUILTIN_SCHEMAS) == set(BUILTIN_DESCRIPTIONS)
    described = BUILTIN_DESCRIPTIONS["shell.run"]
    assert all(
        word in described for word in ("'command'", "'argv'", "never through a shell", "'cwd'", "'timeout'")
    )
