"""The kernel's wall behind Kiwi's shell checks (activities/confinement.py, kiwi/landlock.py): attacks that get
past a check made before the program runs, or that no check sees, against a real Temporal server and worker,
and the wall itself, on real programs and the real kernel. Skipped where the kernel has no Landlock."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import resource
import select
import shutil
import signal
import socket
import subprocess
from pathlib import Path

import pytest
from temporalio.exceptions import ApplicationError

from activities import confinement, diskchecks
from activities.process import remove_tree, run_process
from activities.staging import _staged_file, disk_usage
from kiwi.contracts import CommandRequest
from tests.test_attack_shell import agent_run, outside_folder, shell

pytestmark = pytest.mark.skipif(
    confinement.landlock.abi_version() == 0,
    reason="this kernel has no Landlock (Linux 5.13+, enabled at boot)",
)


# A Python of the system's, whose library is in /usr (a user's Python elsewhere is no place a command reads).
SYSTEM_PYTHON = "/usr/bin/python3"


def permissions(commands: str, write: str = "out/**") -> str:
    return (
        f'<read resource="filesystem" path="**"/><write resource="filesystem" path="{write}"/>'
        f'<execute resource="shell" commands="{commands}"/>'
    )


@pytest.mark.parametrize("confine", ["auto", "off"])
async def test_a_folder_swapped_for_a_link_while_the_program_runs_is_not_written_through(
    runs, project, monkeypatch, confine
):
    """`split pipe out/part-` passes every check (out/ is a folder of the project the run may write); split
    then waits for its input, and makes its first output file only once it has read some. Meanwhile out/ becomes a link to
    a folder outside the project (another run, or a process of the agent's). The kernel's wall holds where
    the check made before could not. With KIWI_CONFINE=off the worker refuses split, a program Kiwi does not
    model; with that refusal lifted, the same race writes outside (the attack is real)."""
    monkeypatch.setenv("KIWI_CONFINE", confine)
    (project / "out").mkdir()
    os.mkfifo(project / "pipe")
    outside = outside_folder(project)
    run_id = await agent_run(runs, project, "splitter", permissions("split"))
    if confine == "off":
        refused = await shell(runs, run_id, "split", "pipe", "out/part-")
        assert refused.status == "denied" and "confines no command (KIWI_CONFINE=off)" in refused.reason
        monkeypatch.setattr(diskchecks, "_unmodeled_needs_the_wall", lambda *_: None)
    call = asyncio.create_task(shell(runs, run_id, "split", "pipe", "out/part-"))

    # Opening the pipe for writing returns once split has opened it for reading: the checks are behind it.
    writer = await asyncio.to_thread(open, project / "pipe", "w")
    (project / "out").rename(project / "out.before")
    (project / "out").symlink_to(outside)
    with writer:
        writer.write("taken\n")
    result = await call

    assert result.status == "ok", result
    if confine == "off":
        assert (outside / "part-aa").read_text() == "taken\n"  # (the attack is real: what the wall stops)
        return
    assert not (outside / "part-aa").exists()
    assert result.result["exit_code"] != 0 and "Permission denied" in result.result["stderr"], result.result


@pytest.mark.parametrize("held", [True, False])
async def test_a_write_grant_of_the_whole_project_does_not_reach_its_protected_places(
    runs, project, monkeypatch, held
):
    """`write **` does not reach `.ai/config` (the MCP registry: the commands the worker runs as servers,
    unconfined), `.git` or Kiwi's other places unless a grant names them; the checks hold that for the paths
    a command names, but Landlock's rule for the project's folder holds for everything below it. So the race
    of the first test, aimed at `.ai/config` (`out` swapped for a link to it while `split` waits), wrote
    Kiwi's configuration with every check passing. Those places are now held read-only for the command (a
    mount namespace of its own). Without that (held=False), the same race writes there."""
    if not held:
        monkeypatch.setattr(confinement, "held_places", lambda *args, **kwargs: [])
    elif confinement.namespaces_refused():
        pytest.skip(f"no mount namespace here: {confinement.namespaces_refused()}")
    (project / "out").mkdir()
    (project / ".ai" / "config").mkdir(exist_ok=True)
    os.mkfifo(project / "pipe")
    run_id = await agent_run(runs, project, "splitter", permissions("split,touch", write="**"))
    call = asyncio.create_task(shell(runs, run_id, "split", "pipe", "out/part-"))

    # (Opened once split reads it; a command that never starts fails the test instead of holding it.)
    writer = await asyncio.wait_for(asyncio.to_thread(open, project / "pipe", "w"), 120)
    (project / "out").rename(project / "out.before")
    (project / "out").symlink_to(project / ".ai" / "config")
    with writer:
        writer.write("mcps:\n  everything:\n    command: /tmp/attackers-server\n")
    result = await call

    assert result.status == "ok", result
    if not held:
        assert (project / ".ai" / "config" / "part-aa").exists()  # (the attack is real: what holding stops)
        return
    assert not (project / ".ai" / "config" / "part-aa").exists()
    assert "Read-only file system" in result.result["stderr"], result.result
    # What the grant is for still works: a new file at the project's root.
    made = await shell(runs, run_id, "touch", "made-at-the-root.txt")
    assert made.status == "ok" and made.result["exit_code"] == 0, made
    assert (project / "made-at-the-root.txt").exists()


async def test_a_protected_place_a_link_stands_in_for_refuses_the_command(tree):
    """Review s27, third round: a link put in a protected place's stead (`.kiwi` leading to `out`) stopped
    the holding of every place after it, silently: a place that is there and cannot be held now refuses the
    command."""
    project, _ = tree
    if confinement.namespaces_refused():
        pytest.skip(f"no mount namespace here: {confinement.namespaces_refused()}")
    (project / ".ai" / "config").mkdir(parents=True)
    (project / ".kiwi").symlink_to("out")
    with pytest.raises(ApplicationError, match=r"holding \.kiwi read-only"):
        await confined(request(project, write=["**"]), "touch", ".ai/config/mcp_registry.yaml")
    assert not (project / ".ai" / "config" / "mcp_registry.yaml").exists()


@pytest.mark.parametrize("confine", ["auto", "off"])
async def test_a_folder_read_does_not_read_the_protected_places_in_it(runs, project, monkeypatch, confine):
    """`grep -r TOKEN .` with read `**`: Kiwi's checks let it run (refusing it would refuse every search of the
    project), and grep read the repository's credentials and Kiwi's configuration along with the project.
    The wall lets it list them and read none; `cat .git/config` is refused by the checks, as before."""
    monkeypatch.setenv("KIWI_CONFINE", confine)
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    with (project / ".git" / "config").open("a") as config:
        config.write('[remote "origin"]\n\turl = https://kiwi:canary-token@example.com/r.git\n')
    (project / ".ai" / "config" / "canary.yaml").write_text("secret: canary-token\n")
    # A submodule's git folder (actions/checkout writes a token's extraHeader there) and a worktree's settings.
    submodule = project / ".git" / "modules" / "vendor" / "lib"
    submodule.mkdir(parents=True)
    (submodule / "HEAD").write_text("ref: refs/heads/main\n")
    (submodule / "config").write_text("[http]\n\textraheader = AUTHORIZATION: basic canary-token-sub\n")
    (project / ".git" / "worktrees" / "wt").mkdir(parents=True)
    (project / ".git" / "worktrees" / "wt" / "config.worktree").write_text("[x]\n\ty = canary-token-wt\n")
    (project / "src").mkdir()
    (project / "src" / "notes.txt").write_text("where is the canary-token?\n")
    run_id = await agent_run(runs, project, "searcher", permissions("grep"))

    result = await shell(runs, run_id, "grep", "-r", "canary-token", ".")

    assert result.status == "ok", result
    found = result.result["stdout"]
    assert "./src/notes.txt:where is the canary-token?" in found, result.result
    if confine == "off":
        assert "kiwi:canary-token@" in found and "canary-token-sub" in found  # (what the wall stops)
        return
    assert "kiwi:canary-token@" not in found and "secret: canary-token" not in found, found
    assert "canary-token-sub" not in found and "canary-token-wt" not in found, found
    assert "./.git/config: Permission denied" in result.result["stderr"], result.result


async def test_git_config_written_during_a_folder_read_is_not_read(runs, project):
    """A rule is held by a file, not by a name: git writes .git/config.lock and renames it over .git/config, so
    a command whose rules were made while the lock existed read the new config (review s26: `grep -r` beside
    `git branch -u`, seven times in 3,181). Made certain here: grep reads a pipe first, and the rename
    happens while it waits."""
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    lock = project / ".git" / "config.lock"
    lock.write_text(
        (project / ".git" / "config").read_text() + "[x]\n\turl = https://kiwi:canary-token@h/r\n"
    )
    os.mkfifo(project / "pipe")
    run_id = await agent_run(runs, project, "racer", permissions("grep"))
    call = asyncio.create_task(shell(runs, run_id, "grep", "-r", "canary-token", "pipe", "."))

    writer = await asyncio.to_thread(open, project / "pipe", "w")  # (grep holds the pipe: its rules are made)
    lock.rename(project / ".git" / "config")
    with writer:
        writer.write("nothing\n")
    result = await call

    assert result.status == "ok", result
    assert "kiwi:canary-token@" not in result.result["stdout"], result.result
    assert "./.git/config: Permission denied" in result.result["stderr"], result.result


async def test_kiwis_own_git_runs_nothing_a_nested_repository_configures(runs, project, tmp_path):
    """Kiwi's own git (the git.status, git.diff and git.commit tools) runs unconfined, with the project's filter
    drivers turned off. A repository the agent made inside the project and added (a gitlink), with a clean
    filter in its own `.git/config`, ran that filter: git looked inside to see whether it changed (review
    s27: the second review of the launcher; the program it ran outlived the call too). Kiwi's git now never
    looks into a nested repository, and where git add does anyway, it runs confined: no shell, so such a
    filter runs nothing."""
    from tests.test_attack_shell import start

    marker = tmp_path / "filter-ran"
    identity = ["-c", "user.name=k", "-c", "user.email=k@example.com"]
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    vendor = project / "vendor"
    vendor.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=vendor, check=True)
    (vendor / "f.txt").write_text("1\n")
    subprocess.run(["git", *identity, "add", "-A"], cwd=vendor, check=True)
    subprocess.run(["git", *identity, "commit", "-qm", "v"], cwd=vendor, check=True)
    subprocess.run(["git", *identity, "add", "-A"], cwd=project, check=True)
    subprocess.run(["git", *identity, "commit", "-qm", "p"], cwd=project, check=True)
    # What the agent's commands can do with write **: settings of the nested repository's own, and a change.
    subprocess.run(["git", "config", "filter.x.clean", f"touch {marker}; cat"], cwd=vendor, check=True)
    (vendor / ".gitattributes").write_text("* filter=x\n")
    (vendor / "f.txt").write_text("2\n")
    run_id = await start(runs, project)

    for tool, args in (
        ("git.status", {}),
        ("git.diff", {}),
        ("git.checkpoint", {}),
        ("git.commit", {"message": "m"}),
    ):
        result = await runs.call_tool(run_id, tool, args)
        assert result.status == "ok", (tool, result)
        assert not marker.exists(), f"{tool} ran the nested repository's filter"


async def test_a_hidden_file_with_another_name_refuses_the_command(runs, project):
    """A hard link to .git/config elsewhere in the project (made before, by anyone) would read it under its
    other name: shell commands are refused until a human removes it."""
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    os.link(project / ".git" / "config", project / "notes")
    run_id = await agent_run(runs, project, "searcher", permissions("grep"))

    result = await shell(runs, run_id, "grep", "-r", "core", ".")

    assert result.status == "error" or result.status == "denied", result
    assert "'.git/config' has another name in the project (a hard link)" in str(result), result
    assert "repositoryformatversion" not in str(result)


async def test_a_granted_program_that_starts_another_starts_nothing(
    runs, project, monkeypatch, tmp_path_factory
):
    """A directive grants a program Kiwi does not know (`launch`, which is env under another name): Kiwi cannot
    tell that it starts the program it is given. The kernel lets it execute nothing but itself."""
    tools = tmp_path_factory.mktemp("bin")
    shutil.copy("/usr/bin/env", tools / "launch")
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    (project / "out").mkdir()
    run_id = await agent_run(runs, project, "launcher", permissions("launch"))

    result = await shell(runs, run_id, "launch", "touch", "out/PWNED")

    assert result.status == "ok", result
    assert result.result["exit_code"] == 126 and "Permission denied" in result.result["stderr"], result.result
    assert not (project / "out" / "PWNED").exists()


# ---------------------------------------------------------------- the wall itself, program by program


def request(project: Path, read: list[str] | None = None, write: list[str] | None = None) -> CommandRequest:
    return CommandRequest(
        project_root=str(project), argv=["true"], read_grants=read or ["**"], write_grants=write or ["out/**"]
    )


async def confined(req: CommandRequest, *argv: str, into: str = ""):
    return await run_process(
        list(argv),
        cwd=req.project_root,
        timeout=30,
        max_output=100_000,
        confine=(
            confinement.available(),
            lambda program, temp: confinement.shell_rules(req, program, temp, into),
        ),
    )


@pytest.fixture
def tree(tmp_path):
    project = tmp_path / "project"
    (project / "out").mkdir(parents=True)
    (project / "config").mkdir()
    (project / "config" / "prod.env").write_text("TOKEN=1\n")
    (project / "src").mkdir()
    (project / "src" / "a.txt").write_text("a\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("outside secret\n")
    return project, outside


async def test_a_program_reads_and_writes_only_where_the_run_may(tree):
    project, outside = tree
    req = request(project, read=["src/**"], write=["out/**"])

    assert (await confined(req, "cat", "src/a.txt")).stdout == "a\n"
    assert (await confined(req, "cp", "src/a.txt", "out/b.txt")).exit_code == 0
    assert (project / "out" / "b.txt").read_text() == "a\n"
    for argv in (
        ["cat", str(outside / "secret")],
        ["cat", "config/prod.env"],  # (in the project, no grant reaches it)
        ["cp", "src/a.txt", "config/x"],
        ["cp", "src/a.txt", str(outside / "x")],
        ["rm", "src/a.txt"],
        ["ln", "-s", "x", "src/link"],
    ):
        result = await confined(req, *argv)
        assert result.exit_code != 0 and "Permission denied" in result.stderr, (argv, result)
    assert (project / "src" / "a.txt").exists() and not (project / "config" / "x").exists()
    assert not (outside / "x").exists() and not (project / "src" / "link").exists()


async def test_the_workers_own_files_and_processes_are_out_of_reach(tree):
    """/proc (the worker's environment and its secrets), the worker's home, other folders of the machine."""
    project, _ = tree
    req = request(project)
    for argv in (["cat", f"/proc/{os.getpid()}/environ"], ["ls", str(Path.home())], ["cat", "/etc/hostname"]):
        result = await confined(req, *argv)
        assert result.exit_code != 0 and "Permission denied" in result.stderr, (argv, result)


async def test_a_program_the_agent_wrote_is_not_executed(tree):
    project, _ = tree
    shutil.copy("/usr/bin/true", project / "out" / "mine")
    req = request(project)
    result = await confined(req, "env", "out/mine")
    assert result.exit_code == 126 and "Permission denied" in result.stderr, result
    assert (await confined(req, "env", "--version")).exit_code == 0  # (the program itself runs)


async def test_no_tcp_connection_and_no_signal_leaves_the_command(tree):
    project, _ = tree
    req = request(project)
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        result = await confined(req, "bash", "-c", f": > /dev/tcp/127.0.0.1/{port}")
        assert result.exit_code != 0 and "Permission denied" in result.stderr, result
        assert select.select([server], [], [], 0)[0] == []  # (no connection waits to be accepted)
    if confinement.available() < 6:
        return  # (signals are scoped from Landlock ABI 6)
    victim = subprocess.Popen(["sleep", "60"])
    try:
        result = await confined(req, "kill", "-9", str(victim.pid))
        assert result.exit_code != 0, result
        assert victim.poll() is None
    finally:
        victim.kill()
        victim.wait()


async def test_what_programs_need_still_works(tree):
    """A temporary folder of the command's own, scripts (egrep runs grep), git with its repository."""
    project, _ = tree
    req = request(project, write=["**"])
    made = await confined(req, "mktemp")
    assert made.exit_code == 0 and made.stdout.strip(), made
    assert not Path(made.stdout.strip()).exists()  # (the command's folder goes with it)
    if shutil.which("egrep"):
        assert (await confined(req, "egrep", "a|b", "src/a.txt")).stdout == "a\n"
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    assert (await confined(req, "git", "add", "src/a.txt")).exit_code == 0
    committed = await confined(
        req, "git", "-c", "user.name=k", "-c", "user.email=k@example.com", "commit", "-q", "-m", "one"
    )
    assert committed.exit_code == 0, committed
    assert "one" in (await confined(req, "git", "log", "--oneline")).stdout


async def test_an_archive_unpacks_only_into_kiwis_staging_folder(tree, tmp_path):
    """tar and unzip unpack into a folder of the worker's, from which Kiwi copies into the project without
    following a link (see README: Shell): the program itself writes nowhere else, not even the run's folders."""
    project, outside = tree
    staging = tmp_path / "staging"
    staging.mkdir()
    member = outside / "planted"
    member.write_text("from the archive\n")
    subprocess.run(["tar", "-c", "-P", "-f", str(project / "src" / "a.tar"), str(member)], check=True)
    member.unlink()
    req = request(project, write=["**"])

    escaped = await confined(req, "tar", "-x", "-P", "-f", "src/a.tar", into=str(staging))
    into_project = await confined(req, "tar", "-x", "-f", "src/a.tar", "-C", "out", into=str(staging))
    staged = await confined(req, "tar", "-x", "-f", "src/a.tar", "-C", str(staging), into=str(staging))

    assert escaped.exit_code != 0 and not member.exists(), escaped
    assert into_project.exit_code != 0 and not any((project / "out").iterdir()), into_project
    assert staged.exit_code == 0, staged
    assert (staging / str(member).lstrip("/")).read_text() == "from the archive\n"


# Review s26 (a helper attacking the wall alone, its checks bypassed): each of these got past the first version.


async def test_a_program_of_the_project_decides_no_rule(tree):
    """An agent's script whose #! line names, as Kiwi read it, a link to / (the kernel keeps the \\r Kiwi
    stripped, and runs the link named with it) got EXECUTE and READ on every file of the machine; a program at
    the project's root made the root readable, and a FIFO named as the interpreter held the worker. Nothing
    read from a program of the project decides a rule now: it runs with the system's loader, or not at all."""
    project, outside = tree
    out = project / "out"
    (out / "a").symlink_to("/")
    (out / "a\r").symlink_to(shutil.which("cat"))
    script = out / "s"
    script.write_text(f"#!{out}/a\r {outside}/secret\n")
    script.chmod(0o755)
    os.mkfifo(out / "fifo")
    held = out / "h"
    held.write_text(f"#!{out}/fifo\n")
    held.chmod(0o755)
    shutil.copy(shutil.which("cat"), project / "mycat")
    req = request(project, read=["src/**"], write=["out/**"])

    for argv in ([str(script)], [str(held)]):
        ran = await asyncio.wait_for(_outcome(req, *argv), timeout=20)
        assert "outside secret" not in ran and "Permission denied" in ran, (argv, ran)
    assert (await confined(req, "./mycat", "src/a.txt")).stdout == "a\n"  # (the system's loader runs it)
    refused = await confined(req, "./mycat", "config/prod.env")
    assert refused.exit_code != 0 and "TOKEN" not in refused.stdout, refused


async def _outcome(req: CommandRequest, *argv: str) -> str:
    """What running ``argv`` confined showed: its output, or the error that it could not start."""
    try:
        result = await confined(req, *argv)
    except Exception as exc:  # (an ApplicationError: the program could not be executed)
        return f"Permission denied ({exc})"
    return result.stdout + result.stderr


async def test_no_socket_of_any_kind_and_no_capability(tree, tmp_path):
    """Landlock has no rule for UDP, raw or UNIX sockets reached by path (a container engine's is root on the
    host), or for a file's owner: a seccomp filter refuses every socket, and a worker running as root hands
    its command no capability."""
    if not os.path.exists(SYSTEM_PYTHON):
        pytest.skip("no system Python (/usr/bin/python3) to make the calls from")
    project, _ = tree
    req = request(project, write=["**"])
    listening = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with listening, udp:
        listening.bind(str(tmp_path / "engine.sock"))
        listening.listen()
        udp.bind(("127.0.0.1", 0))
        engine, port = str(tmp_path / "engine.sock"), udp.getsockname()[1]
        code = (
            "import os, socket\n"
            f"for family, kind, to in ((socket.AF_UNIX, socket.SOCK_STREAM, {engine!r}), "
            f"(socket.AF_INET, socket.SOCK_DGRAM, ('127.0.0.1', {port}))):\n"
            "    try:\n"
            "        s = socket.socket(family, kind); s.connect(to); s.send(b'x'); print('reached')\n"
            "    except OSError as e: print('refused', e.errno)\n"
            "try:\n"
            "    os.chown('src/a.txt', 12345, 12345); print('chowned')\n"
            "except OSError as e: print('refused', e.errno)\n"
        )
        result = await confined(req, SYSTEM_PYTHON, "-c", code)
        assert result.stdout.split("\n")[:2] == ["refused 13", "refused 13"], result
        # A datagram from an end of a socket pair, addressed by path (review s26), and System V shared memory.
        code = (
            "import ctypes, socket\n"
            "try:\n"
            f"    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM); a.sendto(b'x', {engine!r})\n"
            "    print('reached')\n"
            "except OSError as e: print('refused', e.errno)\n"
            "libc = ctypes.CDLL(None, use_errno=True)\n"
            "print('shm', libc.shmget(0, 4096, 0o1600), ctypes.get_errno())\n"
        )
        more = await confined(req, SYSTEM_PYTHON, "-c", code)
        assert more.stdout.split("\n")[:2] == ["refused 13", "shm -1 13"], more
        assert select.select([listening, udp], [], [], 0)[0] == []
    if os.geteuid() == 0:
        assert "chowned" not in result.stdout and (project / "src" / "a.txt").stat().st_uid == 0, result


async def test_no_set_id_bit_is_set(tree):
    """A worker running as root owns the system's files: a set-user-ID bit set on one (or on a file made in
    the project) would hand root to any local user. Every other mode is the command's to set."""
    project, _ = tree
    req = request(project, write=["**"])
    for argv in (
        ["chmod", "u+s", "src/a.txt"],
        ["chmod", "4755", "src/a.txt"],
        ["install", "-m", "2755", "src/a.txt", "out/b"],
    ):
        result = await confined(req, *argv)
        assert result.exit_code != 0 and "Operation not permitted" in result.stderr, (argv, result)
    assert not (project / "src" / "a.txt").stat().st_mode & 0o6000
    assert not (project / "out" / "b").exists() or not (project / "out" / "b").stat().st_mode & 0o6000
    assert (await confined(req, "chmod", "755", "src/a.txt")).exit_code == 0
    assert (project / "src" / "a.txt").stat().st_mode & 0o777 == 0o755


async def test_compressed_archives_are_made_and_read(tree):
    """GNU tar runs the compressor its option names (gzip for -z) through /bin/sh: the programs besides itself
    it may start (review s26: compressed archives could be neither made nor unpacked)."""
    project, _ = tree
    req = request(project, write=["out/**"])
    made = await confined(req, "tar", "-czf", "out/src.tgz", "src")
    listed = await confined(req, "tar", "-tzf", "out/src.tgz")
    assert made.exit_code == 0 and listed.stdout.split() == ["src/", "src/a.txt"], (made, listed)


async def test_no_other_process_is_limited_and_no_memory_file_is_executed(tree):
    """prlimit reaches every process of the same user (a limit of 5 files, or 1 s of CPU, on the worker), which
    Landlock's signal scope does not cover; a program written into a memory file executes without Landlock's
    check (review s26)."""
    if not os.path.exists(SYSTEM_PYTHON):
        pytest.skip("no system Python (/usr/bin/python3) to make the calls from")
    project, _ = tree
    # (Another process: in the command's own PID namespace the worker has no number; a child of its own has.)
    code = (
        "import os, resource, time\n"
        "other = os.fork()\n"
        "if other == 0: os.close(1); os.close(2); time.sleep(30); os._exit(0)\n"
        "for what, call in (('prlimit', lambda: resource.prlimit(other, resource.RLIMIT_NOFILE, (5, 5))),"
        " ('memfd', lambda: os.memfd_create('x')), ('own', lambda: resource.prlimit(0, resource.RLIMIT_CORE)),"
        " ('affinity', lambda: os.sched_setaffinity(other, {0})),"
        " ('priority', lambda: os.setpriority(os.PRIO_USER, 0, 15))):\n"
        "    try:\n"
        "        call(); print(what, 'done')\n"
        "    except OSError as e: print(what, 'refused', e.errno)\n"
    )
    result = await confined(request(project), SYSTEM_PYTHON, "-c", code)
    assert result.stdout.split("\n")[:5] == [
        "prlimit refused 1",
        "memfd refused 13",
        "own done",
        "affinity refused 1",
        "priority refused 13",  # (review s26: every process of the worker's user reniced)
    ], result
    assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] > 5


def _running(pid: int) -> bool:
    """Whether ``pid`` is a process that has not ended (a zombie has)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _ended(pid: int):
    async def probe() -> bool:
        return not _running(pid)

    return probe


def _marked(marker: str) -> list[int]:
    """The processes whose command line holds ``marker``."""
    found = []
    for entry in os.listdir("/proc"):
        with contextlib.suppress(OSError, ValueError), open(f"/proc/{entry}/cmdline", "rb") as f:
            if marker.encode() in f.read() and _running(int(entry)):
                found.append(int(entry))
    return found


async def test_nothing_a_command_starts_outlives_the_call(tree):
    """What a command leaves running was killed with its process group when the call ended (and by the
    keeper when the worker died). A process that made a session or a group of its own (setsid, setpgid: a
    daemon's double fork) was out of reach of both and outlived the call, running on with what the command
    could reach; so did one that kept changing its process id (a fork, then its parent exits) while the
    session was looked through (review s27). The seccomp filter refuses setsid, and a confined command runs
    in a PID namespace of its own, all of whose processes the kernel kills when the program ends."""
    if not os.path.exists(SYSTEM_PYTHON):
        pytest.skip("no system Python (/usr/bin/python3) to make the calls from")
    project, _ = tree
    marker = f"kiwi-left-behind-{os.getpid()}"
    os.mkfifo(project / "out" / "ping")
    # Every process of the walker says it lives into out/ping while someone reads it; a new process id
    # every half millisecond (a fork, then its parent exits), which a look through /proc could miss.
    walker = (
        "import os, sys, time\n"
        "os.close(int(sys.argv[1]))\n"  # (it runs: the command may end)
        "end = time.monotonic() + 15\n"  # (a walker that got out ends by itself: this test leaves nothing)
        "while time.monotonic() < end:\n"
        "    try:\n"
        "        fd = os.open('out/ping', os.O_WRONLY | os.O_NONBLOCK); os.write(fd, b'alive\\n'); os.close(fd)\n"
        "    except OSError: pass\n"
        "    if os.fork(): os._exit(0)\n"
        "    time.sleep(0.0005)\n"
    )
    code = (
        "import os, sys, time\n"
        "ran, gone = os.pipe()\n"
        "os.set_inheritable(gone, True)\n"
        "if os.fork() == 0:\n"
        "    os.close(ran)\n"
        "    for what, call in (('setsid', os.setsid), ('setpgid', lambda: os.setpgid(0, 0))):\n"
        "        try:\n"
        "            call(); print(what, 'done')\n"
        "        except OSError as e: print(what, 'refused', e.errno)\n"
        "    sys.stdout.flush(); os.close(1); os.close(2)\n"  # (the call ends once its output is closed)
        f"    os.execv(sys.executable, [sys.executable, '-c', {walker!r}, str(gone), {marker!r}])\n"
        "os.close(gone); os.read(ran, 1)\n"  # (the pipe closes when the walker runs)
        "for _ in range(150):\n"  # (idle members, each in a group of its own: a look through them is longer)
        "    if os.fork() == 0: os.setpgid(0, 0); os.close(1); os.close(2); time.sleep(60); os._exit(0)\n"
    )
    try:
        result = await confined(request(project), SYSTEM_PYTHON, "-c", code)
        assert result.stdout.split()[:5] == ["setsid", "refused", "1", "setpgid", "done"], result
        ping = os.open(project / "out" / "ping", os.O_RDONLY | os.O_NONBLOCK)
        try:
            # (No process is left to say it lives: three seconds of silence, the one wait for what must not come.)
            said = select.select([ping], [], [], 3)[0] and os.read(ping, 100)
        finally:
            os.close(ping)
        assert not said, f"a process the command left outlived the call: {said!r}"
    finally:
        for pid in _marked(marker):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)


async def test_a_command_ends_as_its_program_ends(tree):
    """A confined command's program runs in a PID namespace of its own, below a small init: as the
    namespace's first process it was shielded by the kernel from the signals it sends itself (`kill $$` did
    nothing, abort() ended as a segfault), and a program killed with SIGKILL was reported as exit 1
    (review s27, fourth round). The call sees the program's own exit code or signal."""
    project, _ = tree
    req = request(project)
    cases = [(("sh", "-c", "exit 3"), 3), (("sh", "-c", "kill $$; echo survived"), -signal.SIGTERM)]
    if os.path.exists(SYSTEM_PYTHON):
        cases += [
            ((SYSTEM_PYTHON, "-c", "import os; os.abort()"), -signal.SIGABRT),
            ((SYSTEM_PYTHON, "-c", "import os; os.kill(os.getpid(), 9)"), -signal.SIGKILL),
            ((SYSTEM_PYTHON, "-c", "import os; print(os.getpid() != 1)"), 0),
        ]
    for argv, code in cases:
        result = await confined(req, *argv)
        assert result.exit_code == code and "survived" not in result.stdout, (argv, result)
        assert result.stdout.strip() in ("", "True"), (argv, result)


async def test_what_the_program_does_cannot_change_how_the_call_says_it_ended(tree):
    """Review s27, fifth round: the init that reports the program's end ran under the program's own
    confinement and was dumpable, so a process of the command took its report pipe (pidfd_getfd) and wrote
    the exit status it liked (a command failing with 42 reported 0); and a SIGINT to the command's group
    (`trap '' INT; kill -INT 0`) ended the init as a KeyboardInterrupt, reported as exit 1."""
    project, _ = tree
    req = request(project)
    trapped = await confined(req, "sh", "-c", "trap '' INT; kill -INT 0; echo alive; exit 3")
    assert (trapped.exit_code, trapped.stdout) == (3, "alive\n"), trapped
    if not os.path.exists(SYSTEM_PYTHON):
        return
    forge = (
        "import ctypes, os\n"
        "libc = ctypes.CDLL(None, use_errno=True); libc.syscall.restype = ctypes.c_long\n"
        "init = libc.syscall(434, 1, 0)\n"  # pidfd_open(1): the namespace's init
        "for fd in range(3, 16):\n"
        "    got = libc.syscall(438, init, fd, 0)\n"  # pidfd_getfd
        "    if got >= 0:\n"
        "        try: os.write(got, b'\\0\\0\\0\\0')\n"
        "        except OSError: pass\n"
        "os._exit(42)\n"
    )
    forged = await confined(req, SYSTEM_PYTHON, "-c", forge)
    assert forged.exit_code == 42, forged


def _zombies_of(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
            if fields[0] == "Z" and int(fields[1]) == pid:
                found.append(int(entry))
    return found


async def test_no_process_a_command_makes_is_the_workers_child(tree):
    """clone with CLONE_PARENT makes the new process a child of the command's parent: the worker, which
    reaps only the processes it started. Twenty such clones left twenty zombies in the worker (review s27),
    and enough of them take all of its processes. The filter refuses the flag (and clone3, whose flags
    are in memory: callers fall back to clone); fork and threads still work."""
    if not os.path.exists(SYSTEM_PYTHON):
        pytest.skip("no system Python (/usr/bin/python3) to make the calls from")
    if confinement.landlock.platform.machine() != "x86_64":
        pytest.skip("the raw clone call is written for x86_64")
    project, _ = tree
    before = set(_zombies_of(os.getpid()))
    code = (
        "import ctypes, os, threading\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "made = 0\n"
        "for _ in range(5):\n"
        "    pid = libc.syscall(56, 0x8000 | 17, 0, 0, 0, 0)\n"  # clone(CLONE_PARENT | SIGCHLD)
        "    if pid == 0: os._exit(0)\n"
        "    made += pid > 0\n"
        "print('clone', made, ctypes.get_errno())\n"
        "pid = os.fork()\n"
        "if pid == 0: os._exit(3)\n"
        "print('fork', os.waitpid(pid, 0)[1] >> 8)\n"
        "t = threading.Thread(target=print, args=('thread',)); t.start(); t.join()\n"
    )
    result = await confined(request(project), SYSTEM_PYTHON, "-c", code)
    assert result.stdout.split("\n")[:3] == ["clone 0 1", "fork 3", "thread"], result
    assert set(_zombies_of(os.getpid())) <= before


async def test_a_command_gets_the_signals_the_system_gives_a_program(tree):
    """Python ignores SIGPIPE and SIGXFSZ, and an ignored signal stays ignored across execve: through the
    launcher, a shell loop writing into a pipe whose reader had gone ran until its timeout (review s27). A
    program now gets both as the system leaves them."""
    project, _ = tree
    req = request(project)
    looped = await confined(req, "sh", "-c", 'while :; do echo x; done | { read line; echo "$line"; }')
    assert looped.stdout == "x\n" and looped.exit_code == 0, looped
    plain = await run_process(
        ["grep", "SigIgn", "/proc/self/status"], cwd=str(project), timeout=30, max_output=1000
    )
    ignored = int(
        plain.stdout.split()[1], 16
    )  # (what the worker inherited ignored, as nohup's SIGHUP, stays so)
    assert not ignored & (1 << (signal.SIGPIPE - 1) | 1 << (signal.SIGXFSZ - 1)), plain


async def test_gits_automatic_gc_runs_with_the_command(tree):
    """git detaches its automatic gc into a session of its own, which a confined command may not make
    (`fatal: setsid failed`), and which outlived the call: Kiwi's git runs it in the foreground."""
    project, _ = tree
    subprocess.run(["git", "init", "-q"], cwd=project, check=True)
    subprocess.run(["git", "config", "gc.auto", "1"], cwd=project, check=True)
    subprocess.run(["git", "config", "gc.autoPackLimit", "1"], cwd=project, check=True)
    packs = project / ".git" / "objects" / "pack"
    for index in range(3):  # (three packs: more than gc.autoPackLimit)
        (project / "src" / f"f{index}.txt").write_text(f"{index}\n")
        subprocess.run(["git", "add", "-A"], cwd=project, check=True)
        subprocess.run(["git", "repack", "-q"], cwd=project, check=True)
    assert len(list(packs.glob("*.pack"))) == 3
    result = await confined(request(project, write=["**"]), "git", "gc", "--auto")
    assert result.exit_code == 0 and "setsid" not in result.stderr, result
    assert "Auto packing the repository for optimum performance" in result.stderr, result
    assert len(list(packs.glob("*.pack"))) == 1  # (done by the call, not after it)


async def test_git_merges_with_its_own_strategy_and_starts_no_shell_for_a_script_one(tree):
    """A merge of one branch runs in git itself (ort); an octopus merge runs git-merge-octopus, a /bin/sh
    script of git's own, and git may start no shell (review s28: a shell under git's rules ran what a
    repository's settings named and wrote its `.git`), so it fails and leaves the tree as it was."""
    project, _ = tree
    req = request(project, write=["**"])
    git = ["git", "-c", "user.name=k", "-c", "user.email=k@example.com"]
    subprocess.run(["git", "init", "-q", "-b", "main", str(project)], check=True)
    for step in (["add", "."], ["commit", "-qm", "one"], ["branch", "b1"], ["branch", "b2"]):
        subprocess.run([*git, *step], cwd=project, check=True)
    for branch in ("b1", "b2"):
        subprocess.run([*git, "checkout", "-q", branch], cwd=project, check=True)
        (project / "src" / f"{branch}.txt").write_text(branch)
        subprocess.run([*git, "add", "."], cwd=project, check=True)
        subprocess.run([*git, "commit", "-qm", branch], cwd=project, check=True)
    subprocess.run([*git, "checkout", "-q", "main"], cwd=project, check=True)

    octopus = await confined(req, *git, "merge", "--no-edit", "b1", "b2")
    assert octopus.exit_code != 0 and "git-merge-octopus" in octopus.stderr, octopus
    assert not (project / "src" / "b1.txt").exists() and not (project / "src" / "b2.txt").exists()

    merged = await confined(req, *git, "merge", "--no-edit", "b1")
    assert merged.exit_code == 0, merged
    assert (project / "src" / "b1.txt").exists()


async def test_a_repository_kept_elsewhere_in_the_project_keeps_its_settings(tree):
    """`git init --separate-git-dir=.bare .` keeps the settings in .bare/config, which a folder read printed
    (review s26); git itself still reads its repository."""
    project, _ = tree
    subprocess.run(["git", "init", "-q", f"--separate-git-dir={project / '.bare'}", str(project)], check=True)
    subprocess.run(
        ["git", "config", "http.extraheader", "AUTHORIZATION: basic canary-bare"], cwd=project, check=True
    )
    req = request(project, write=["**"])

    found = await confined(req, "grep", "-r", "canary-bare", ".")
    status = await confined(req, "git", "status", "--short")

    assert "AUTHORIZATION" not in found.stdout and "./.bare/config: Permission denied" in found.stderr, found
    assert status.exit_code == 0 and "src/" in status.stdout, status


async def test_a_commands_output_is_not_held_past_its_limit(tree):
    """`yes` until its timeout: the worker held all it printed before cutting it to the limit (7 GB in 8 s,
    review s26), enough to end the worker and every run on it."""
    project, _ = tree
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(ApplicationError, match="timed out"):
        await run_process(["yes"], cwd=str(project), timeout=3, max_output=1000)
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mb < 200, f"the worker grew by {grown_mb:.0f} MB"


async def test_a_folder_too_deep_for_python_is_walked_and_removed(tree, tmp_path):
    """1,500 nested folders (one `mkdir -p`) raised RecursionError in the worker's walks and left its folders
    behind (review s26): the command's own temporary folder, and an archive's staging folder."""
    project, _ = tree
    code = (
        "import os\nos.chdir(os.environ['TMPDIR'])\nfor _ in range(1500):\n    os.mkdir('d'); os.chdir('d')\n"
    )
    result = await confined(request(project), SYSTEM_PYTHON, "-c", code + "print(os.environ['TMPDIR'])")
    assert result.exit_code == 0 and not os.path.exists(result.stdout.strip()), result
    (tmp_path / "staged").mkdir()
    subprocess.run(["mkdir", "-p", "/".join(["d"] * 1500)], cwd=tmp_path / "staged", check=True)
    try:
        assert disk_usage(str(tmp_path / "staged"))[1] == 1500
    finally:
        remove_tree(str(tmp_path / "staged"))  # (pytest's own clean-up of old folders recurses too)
    assert not (tmp_path / "staged").exists()


def test_a_fifo_named_git_does_not_hold_the_worker(tmp_path):
    """The worker reads a `.git` file to find a git folder kept elsewhere: a FIFO in its place held the worker's
    event loop until something wrote to it (review s26)."""
    os.mkfifo(tmp_path / ".git")
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        looking = pool.submit(confinement.hidden_places, str(tmp_path))
        try:
            assert looking.result(timeout=20) == list(confinement.UNREAD)
        finally:
            if not looking.done():  # (the old code waits: a writer lets it go, so the test ends)
                os.close(os.open(tmp_path / ".git", os.O_WRONLY | os.O_NONBLOCK))


def test_a_hard_link_to_a_settings_file_is_found_however_many_submodules(tmp_path):
    """Past the 10,000 entries the walk of .git/modules looks through, all of it is hidden; a hard link to a
    submodule's config deep in it still refuses shell commands (review s26)."""
    modules = tmp_path / ".git" / "modules" / "a"
    for index in range(10_001):
        (modules / f"x{index}").mkdir(parents=True)
    (modules / "sub").mkdir()
    (modules / "sub" / "HEAD").write_text("ref: refs/heads/main\n")
    (modules / "sub" / "config").write_text("[http]\n\textraheader = secret\n")
    os.link(modules / "sub" / "config", tmp_path / "notes")

    assert ".git/modules" in confinement.hidden_places(str(tmp_path))
    assert confinement.unread_elsewhere(str(tmp_path)) == ".git/modules/a/sub/config"


async def test_a_timed_out_command_ends_though_a_process_it_left_holds_its_output(tmp_path):
    """A process that leaves the command's group (setsid) and keeps its output open held the call past its
    timeout, with no heartbeat, until Temporal ran it again beside it (review s26)."""
    if not os.path.exists(SYSTEM_PYTHON):
        pytest.skip("no system Python (/usr/bin/python3) to leave a process behind")
    gate = tmp_path / "gate"
    os.mkfifo(gate)
    code = f"import os, time\nif os.fork() == 0:\n    os.setsid(); open({str(gate)!r}).read()\nelse:\n    time.sleep(60)\n"
    try:
        with pytest.raises(ApplicationError, match="timed out"):
            await asyncio.wait_for(
                run_process([SYSTEM_PYTHON, "-c", code], cwd=str(tmp_path), timeout=1, max_output=100), 60
            )
    finally:
        with contextlib.suppress(OSError):
            os.close(os.open(gate, os.O_WRONLY | os.O_NONBLOCK))  # (the process left behind ends)


def test_an_unpacked_file_is_copied_from_kiwis_folder_only(tmp_path):
    """What an archive program left in the staging folder is opened without following a link on the way: a
    process it left behind swapped a folder for a link to one outside, and the worker copied 592 files it may
    read (review s26)."""
    staging, outside = tmp_path / "staging", tmp_path / "outside"
    staging.mkdir()
    outside.mkdir()
    (outside / "secret.txt").write_text("outside secret")
    (staging / "d").symlink_to(outside)
    (staging / "e").mkdir()
    (staging / "e" / "f.txt").write_text("unpacked")

    with _staged_file(str(staging), "e/f.txt") as source:
        assert source.read() == b"unpacked"
    with pytest.raises(OSError):
        _staged_file(str(staging), "d/secret.txt")


async def test_a_grant_is_never_widened_to_the_folder_around_it(tree):
    """A write grant for a folder not made yet gave its nearest folder (the project) to the command; a grant
    for one file gave the folder it is in."""
    project, _ = tree
    (project / "real").mkdir()
    (project / "real" / "f.txt").write_text("old\n")
    req = request(project, write=["build/**", "real/f.txt"])

    assert (await confined(req, "mkdir", "-p", "build/x")).exit_code == 0
    assert (await confined(req, "cp", "src/a.txt", "real/f.txt")).exit_code == 0
    assert (project / "real" / "f.txt").read_text() == "a\n"
    for argv in (["touch", "src/new"], ["touch", "real/other"], ["cp", "src/a.txt", "new.txt"]):
        result = await confined(req, *argv)
        assert result.exit_code != 0 and "Permission denied" in result.stderr, (argv, result)
    assert (
        await confined(req, "cp", "src/a.txt", "build/x/b.txt")
    ).exit_code == 0  # (made: the next command)


def test_a_grants_folder_is_its_part_before_the_first_wildcard():
    assert confinement.literal_part("src/**") == "src"
    assert confinement.literal_part("out/*.txt") == "out"
    assert confinement.literal_part("*.md") == ""
    assert confinement.literal_part("docs/api/index.md") == "docs/api/index.md"
    assert confinement.literal_part("a/{b,c}/d") == "a/{b,c}/d"  # (Kiwi's globs have no braces)
    assert confinement.literal_part("real//b/./c/**") == "real/b/c"
    assert confinement.literal_part("out/../src/**") == "out"  # (stops there: never wider)


def test_a_bad_setting_is_named(monkeypatch):
    monkeypatch.setenv("KIWI_CONFINE", "maybe")
    with pytest.raises(ValueError, match="KIWI_CONFINE='maybe': use auto, required or off"):
        confinement.mode()


async def test_a_program_kiwi_does_not_model_writes_only_the_files_its_grant_matches(tree):
    """`dd of=src/x.py` under `write src/*.md` (review s29): Kiwi reads a program it does not model only for
    the paths its words name, as reads, so the wall's rule was the grant's folder, `src`, and dd wrote any file
    in it. Such a program now changes in place the files the grant matches, and makes, removes or renames
    none; a program Kiwi models keeps the grant's folder (its writes are checked by name before it runs)."""
    project, _ = tree
    (project / "src" / "notes.md").write_text("old notes\n")
    req = request(project, write=["src/*.md"])

    for argv in (
        ["dd", "if=src/a.txt", "of=src/x.py"],
        ["dd", "if=src/a.txt", "of=src/new.md"],
        ["dd", "if=src/a.txt", "of=src/a.txt", "conv=notrunc"],
    ):
        result = await confined(req, *argv)
        assert result.exit_code != 0 and "Permission denied" in result.stderr, (argv, result)
    assert not (project / "src" / "x.py").exists() and not (project / "src" / "new.md").exists()
    assert (project / "src" / "a.txt").read_text() == "a\n"

    written = await confined(req, "dd", "if=src/a.txt", "of=src/notes.md")
    assert written.exit_code == 0, written
    assert (project / "src" / "notes.md").read_text() == "a\n"
    copied = await confined(req, "cp", "src/a.txt", "src/copy.md")
    assert copied.exit_code == 0, copied
    assert (project / "src" / "copy.md").read_text() == "a\n"


async def test_a_file_a_finer_grant_matches_is_not_written_by_another_of_its_names(tree):
    """Review s30: `src/h.md`, a hard link to `config/prod.env`, matched `write src/*.md`, and Landlock's rule
    holds for the file, so for every name of it: dd wrote config/prod.env by both names. A file with other
    names gets no rule."""
    project, _ = tree
    os.link(project / "config" / "prod.env", project / "src" / "h.md")
    req = request(project, write=["src/*.md"])

    for target in ("src/h.md", "config/prod.env"):
        result = await confined(req, "dd", "if=src/a.txt", f"of={target}")
        assert result.exit_code != 0 and "Permission denied" in result.stderr, (target, result)
    assert (project / "config" / "prod.env").read_text() == "TOKEN=1\n"


def test_a_program_that_is_git_by_another_name_gets_no_rule_for_the_repository(tree, tmp_path):
    """Review s30: `git-receive-pack`, a link to git, was given git's rules (its repository read and written)
    by the file it leads to, though Kiwi checked it as a program it does not model, not as git."""
    project, _ = tree
    (project / ".git").mkdir()
    git = shutil.which("git")
    assert git is not None
    (tmp_path / "git-receive-pack").symlink_to(os.path.realpath(git))
    req = request(project, write=["**"])

    as_git = confinement.shell_rules(req, git, str(tmp_path))
    by_another_name = confinement.shell_rules(req, str(tmp_path / "git-receive-pack"), str(tmp_path))

    repository = (os.path.realpath(project), ".git", False)
    assert as_git.paths.get(repository, 0) & confinement.landlock.WRITE_FILE
    assert not by_another_name.paths.get(repository, 0) & confinement.landlock.WRITE_FILE
    assert ".git" in by_another_name.held and ".git" not in as_git.held  # (read-only for all but git)
