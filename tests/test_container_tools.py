"""docker tools in a real container (Podman or Docker, with an image built here from busybox-static):
what a granted call gets, and the attacks: no network, a read-only root, no mount the run does not
grant (symlinks and protected places included), killed at its timeout, never an image pulled."""

from __future__ import annotations

import shutil
import subprocess
import tarfile
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from activities.container import container_engine
from tests.helpers import awaiting_step, directive_md, write, write_directive

BUSYBOX = shutil.which("busybox")


@pytest.fixture(scope="module")
def image(tmp_path_factory) -> str:
    """A local image holding only a static busybox (no registry is reachable, so nothing is pulled)."""
    engine = container_engine()
    if engine is None:
        pytest.skip("no container engine (podman or docker) on this machine")
    if (
        BUSYBOX is None
        or "static" not in subprocess.run(["file", "-L", BUSYBOX], capture_output=True, text=True).stdout
    ):
        pytest.skip("no static busybox to build the test image from (Debian: busybox-static)")
    root = tmp_path_factory.mktemp("image")
    (root / "bin").mkdir()
    shutil.copy(BUSYBOX, root / "bin" / "busybox")
    for applet in ("sh", "cat", "echo", "sleep", "ls", "printf"):
        (root / "bin" / applet).symlink_to("busybox")
    archive = root.parent / "image.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(root, arcname=".")
    name = f"localhost/kiwi-test-busybox:{uuid.uuid4().hex[:8]}"
    made = subprocess.run([*engine, "import", str(archive), name], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"the container engine cannot import an image here: {made.stderr.strip()[-200:]}")
    yield name
    subprocess.run([*engine, "rmi", "-f", name], capture_output=True)


def docker_tool(project: Path, tool_id: str, image: str, script: str, extra: str = "") -> None:
    folder = project / ".ai" / "tools" / "boxed" / tool_id
    write(folder / "run.sh", textwrap.dedent(script))
    write(
        folder / "tool.yaml",
        f"tool_id: {tool_id}\ntool_type: docker\nexecutor:\n  image: {image}\n"
        "  command: [/bin/sh, /tool/run.sh]\n" + textwrap.indent(textwrap.dedent(extra), "  "),
    )


def directive(project: Path, tools: list[str], permissions: str = "") -> None:
    write_directive(
        project / ".ai" / "directives" / "boxes.md",
        directive_md(
            '<step name="work"><action>Use the tools.</action></step>',
            name="boxes",
            permissions=f'<execute resource="tool" id="{",".join(tools)}"/>{permissions}',
        ),
    )


async def started(runs) -> str:
    run_id = await runs.start("boxes", {})
    await awaiting_step(runs, run_id, "work")
    return run_id


async def test_a_docker_tool_runs_with_its_parameters_and_a_granted_mount(runs, project, image):
    write(project / "data" / "in.txt", "from the project")
    docker_tool(
        project,
        "reader",
        image,
        """\
        params=$(cat)
        printf '{"params": %s, "data": "%s", "name": "%s"}' "$params" "$(cat /data/in.txt)" "$KIWI_PARAM_NAME"
        """,
        "mounts:\n  - {source: data, target: /data}\ntimeout: 30\n",
    )
    directive(project, ["reader"], '<read resource="filesystem" path="data/**"/>')
    run_id = await started(runs)
    result = await runs.call_tool(run_id, "reader", {"name": "ada"})
    assert result.status == "ok", result
    assert result.result == {"params": {"name": "ada"}, "data": "from the project", "name": "ada"}
    await runs.cancel(run_id, "done")


async def test_attack_a_docker_tool_gets_no_network_no_writable_root_and_no_ungranted_mount(
    runs, project, image
):
    write(project / "data" / "in.txt", "readable")
    write(project / "secret" / "key.txt", "not for tools")
    (project / "outside_link").symlink_to(project.parent)
    write(project / "repo" / "notes.txt", "notes")
    write(project / "repo" / ".git" / "config", "[core]\n")
    docker_tool(
        project,
        "prober",
        image,
        """\
        echo pwned > /etc/pwned 2>/dev/null && root=writable || root=read-only
        echo x > /data/new.txt 2>/dev/null && data=writable || data=read-only
        printf '{"root": "%s", "data": "%s", "interfaces": "%s"}' "$root" "$data" "$(ls /sys/class/net | tr '\\n' ' ')"
        """,
        "mounts:\n  - {source: data, target: /data}\ntimeout: 30\n",
    )
    for tool_id, source, write_flag in (
        ("ungranted", "secret", "false"),
        ("escaping", "outside_link", "false"),
        ("widened", "data", "true"),
        ("hooks", "repo", "true"),
    ):
        docker_tool(
            project,
            tool_id,
            image,
            "echo ran > /mnt/ran.txt\necho '{}'\n",
            f"mounts:\n  - {{source: {source}, target: /mnt, write: {write_flag}}}\n",
        )
    directive(
        project,
        ["prober", "ungranted", "escaping", "widened", "hooks"],
        '<read resource="filesystem" path="data/**"/><write resource="filesystem" path="repo/**"/>',
    )
    run_id = await started(runs)
    probed = await runs.call_tool(run_id, "prober", {})
    assert probed.status == "ok", probed
    # Only the loopback interface: no way out. The root and a read grant's mount cannot be written.
    assert probed.result == {"root": "read-only", "data": "read-only", "interfaces": "lo "}
    assert not (project / "data" / "new.txt").exists()
    for tool_id, says in (
        ("ungranted", "may not read all of 'secret'"),
        ("escaping", "outside the project"),
        ("widened", "may not write all of 'data'"),  # granted for reading only
        ("hooks", "may not write all of 'repo'"),  # the grant covers repo/** but .git inside is protected
    ):
        refused = await runs.call_tool(run_id, tool_id, {})
        assert refused.status == "denied" and says in refused.reason, (tool_id, refused)
    assert not list(project.rglob("ran.txt")) and not (project.parent / "ran.txt").exists()
    await runs.cancel(run_id, "done")


async def test_docker_tool_errors_timeout_missing_image_and_failure(runs, project, image):
    engine = container_engine()
    # A name of this test's own: other test runs on the machine may have a "sleepy" container of theirs.
    sleepy = f"sleepy_{uuid.uuid4().hex[:8]}"
    docker_tool(project, sleepy, image, "sleep 30\n", "timeout: 2\n")
    docker_tool(project, "failing", image, "echo 'it went wrong' >&2\nexit 3\n")
    docker_tool(project, "imageless", "localhost/kiwi-no-such-image:1", "echo '{}'\n")
    directive(project, [sleepy, "failing", "imageless"])
    run_id = await started(runs)
    slept = await runs.call_tool(run_id, sleepy, {})
    assert slept.error_type == "ToolTimeout" and "timed out after 2s" in slept.reason, slept
    left = subprocess.run(
        [*engine, "ps", "-a", "--filter", f"name=kiwi-{sleepy}", "-q"], capture_output=True, text=True
    )
    assert left.stdout.strip() == ""
    failed = await runs.call_tool(run_id, "failing", {})
    assert failed.error_type == "ToolFailed" and "exited with 3: it went wrong" in failed.reason, failed
    missing = await runs.call_tool(run_id, "imageless", {})
    assert missing.error_type == "ToolFailed" and "is not on this machine; Kiwi never pulls" in missing.reason
    await runs.cancel(run_id, "done")


async def test_a_writable_mount_comes_back_to_the_project_file_by_file_and_no_link_does(runs, project, image):
    # The container works on a private copy; what it leaves there comes back once it exits 0: new and
    # changed files written, removed ones removed, links it made left behind (they would name host paths).
    write(project / "out" / "keep.txt", "kept")
    write(project / "out" / "change.txt", "before")
    write(project / "out" / "gone.txt", "to remove")
    docker_tool(
        project,
        "writer",
        image,
        """\
        echo after > /out/change.txt
        rm /out/gone.txt
        mkdir -p /out/new
        echo fresh > /out/new/made.txt
        ln -s /etc/passwd /out/passwd
        echo '{"done": true}'
        """,
        "mounts:\n  - {source: out, target: /out, write: true}\ntimeout: 30\n",
    )
    docker_tool(
        project,
        "failing_writer",
        image,
        "echo half > /out/keep.txt\nexit 3\n",
        "mounts:\n  - {source: out, target: /out, write: true}\ntimeout: 30\n",
    )
    directive(project, ["writer", "failing_writer"], '<write resource="filesystem" path="out/**"/>')
    run_id = await started(runs)
    result = await runs.call_tool(run_id, "writer", {})
    assert result.status == "ok" and result.result == {"done": True}, result
    assert (project / "out" / "change.txt").read_text() == "after\n"
    assert (project / "out" / "new" / "made.txt").read_text() == "fresh\n"
    assert (project / "out" / "keep.txt").read_text() == "kept"
    assert not (project / "out" / "gone.txt").exists()
    assert not (project / "out" / "passwd").exists() and not (project / "out" / "passwd").is_symlink()
    # A tool that fails leaves the project as it was.
    failed = await runs.call_tool(run_id, "failing_writer", {})
    assert failed.status == "error" and "exited with 3" in failed.reason, failed
    assert (project / "out" / "keep.txt").read_text() == "kept"
    await runs.cancel(run_id, "done")


async def test_stopped_containers_kiwi_left_behind_are_pruned_and_no_others(image, tmp_path, monkeypatch):
    # A worker killed mid-call leaves its stopped container behind (no --rm: the logs are read first).
    # Kiwi's containers carry a label; stopped ones past STALE are pruned. Here STALE is a moment ahead
    # (a Unix time: "0s" leaves out a container made in the same second), so both stopped containers are
    # old enough: only the labelled one goes, and a running one stays.
    import activities.container as container

    engine = container_engine()
    names = [f"kiwi-test-{kind}-{uuid.uuid4().hex[:8]}" for kind in ("left", "foreign", "running")]
    left, foreign, running = names
    try:
        for name, label, command in (
            (left, ["--label", container.LABEL], ["echo", "left"]),
            (foreign, [], ["echo", "foreign"]),
            (running, ["--label", container.LABEL], ["sleep", "60"]),
        ):
            made = subprocess.run(
                [*engine, "run", "-d", "--name", name, *label, *container.LIMITS, image, *command],
                capture_output=True,
                text=True,
            )
            assert made.returncode == 0, made.stderr
        subprocess.run([*engine, "wait", left, foreign], capture_output=True, timeout=60)
        monkeypatch.setattr(container, "STALE", str(int(time.time()) + 60))
        monkeypatch.setattr(container, "_last_prune", [float("-inf")])
        await container.prune_abandoned(engine, str(tmp_path))
        listed = subprocess.run(
            [*engine, "ps", "-a", "--format", "{{.Names}}"], capture_output=True, text=True
        ).stdout.split()
        assert left not in listed and foreign in listed and running in listed, listed
    finally:
        subprocess.run([*engine, "rm", "-f", *names], capture_output=True)
