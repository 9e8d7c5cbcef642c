"""The filesystem activities, called directly: paths are walked from the project root without following
links, grants use the workflow's rule, and a symlink swapped in between check and use gets nothing out.

The race tests are the attack: a thread keeps swapping ``victim`` between a real file or folder and a
symlink to a folder outside the project, while the agent's calls run; the secret never comes back and
nothing outside changes. Bounded iterations, no timing asserts."""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from temporalio.exceptions import ApplicationError

from activities.filesystem import FilesystemActivities, confine
from kiwi.contracts import FilesystemRequest
from tests.helpers import SECRET, Swapper, snapshot

FS = FilesystemActivities()
TRIES = 300


def request(project: Path, path: str, allowed=("**",), denied=(), **extra) -> FilesystemRequest:
    return FilesystemRequest(
        project_root=str(project), path=path, allowed=list(allowed), denied=list(denied), **extra
    )


def make_tree(base: Path) -> tuple[Path, Path]:
    """project/{a/b, b, a/deep/c, link_out -> outside, link_in -> a, a/link_out -> outside, a/link_in -> ../b}."""
    project, outside = base / "project", base / "outside"
    (project / "a" / "deep").mkdir(parents=True)
    outside.mkdir()
    (outside / "secret").write_text(SECRET)
    (outside / "a").mkdir()
    (outside / "a" / "b").write_text(SECRET)
    (outside / "b").write_text(SECRET)
    (project / "a" / "b").write_text("inside a/b")
    (project / "b").write_text("inside b")
    (project / "a" / "deep" / "c").write_text("inside a/deep/c")
    (project / "link_out").symlink_to(outside, target_is_directory=True)
    (project / "a" / "link_out").symlink_to(outside, target_is_directory=True)
    (project / "link_in").symlink_to(project / "a", target_is_directory=True)
    (project / "a" / "link_in").symlink_to("../b")
    return project, outside


@pytest.fixture
def tree(tmp_path):
    return make_tree(tmp_path)


async def refused(call, kind: str = "PermissionDenied") -> str:
    with pytest.raises(ApplicationError) as info:
        await call
    assert info.value.type == kind and info.value.non_retryable, (info.value.type, str(info.value))
    return str(info.value)


# ------------------------------------------------------------------ reading and listing


async def test_a_link_is_never_followed_wherever_it_points(tree):
    project, outside = tree
    for path in ("link_out/secret", "link_out", "a/link_out/secret", "link_in/b", "a/link_in", "link_in"):
        message = await refused(FS.read_file(request(project, path)))
        assert "symbolic link" in message and "outside the project root" in message
    assert "symbolic link" in await refused(FS.list_directory(request(project, "link_out")))
    assert "symbolic link" in await refused(FS.list_directory(request(project, "link_in")))
    assert (await FS.read_file(request(project, "a/b")))["content"] == "inside a/b"
    # ".." is the workflow's lexical rule, so the checked path is the touched one.
    assert (await FS.read_file(request(project, "link_out/../a/b")))["content"] == "inside a/b"
    await refused(FS.read_file(request(project, "../outside/secret")))
    await refused(FS.read_file(request(project, str(outside / "secret"))))


async def test_listing_shows_links_as_links_and_names_only_what_the_grant_does_not_cover(tree):
    project, _ = tree
    (project / ".git").mkdir()
    (project / "private.txt").write_text("1234567")
    listing = await FS.list_directory(
        request(project, ".", allowed=[".", "a/**", "b", "link_in", "link_out"])
    )
    entries = {e["name"]: e for e in listing["entries"]}
    assert entries["link_out"] == {"name": "link_out", "type": "symlink", "size": None}
    assert entries["link_in"] == {"name": "link_in", "type": "symlink", "size": None}
    assert entries["a"] == {"name": "a", "type": "dir", "size": None}
    assert entries["b"] == {"name": "b", "type": "file", "size": len("inside b")}
    # Not covered (and .git, a protected place that "**" would not reach either): the name only.
    assert entries["private.txt"] == {"name": "private.txt", "type": None, "size": None}
    assert entries[".git"] == {"name": ".git", "type": None, "size": None}
    everything = {e["name"]: e for e in (await FS.list_directory(request(project, ".")))["entries"]}
    assert everything[".git"]["type"] is None and everything["private.txt"]["size"] == 7
    denied = await FS.list_directory(request(project, ".", denied=["private.txt"]))
    assert {e["name"]: e for e in denied["entries"]}["private.txt"]["type"] is None


async def test_reading_a_fifo_or_a_folder_is_an_error_and_does_not_hang(tree):
    project, _ = tree
    os.mkfifo(project / "pipe")
    await refused(FS.read_file(request(project, "pipe")), "FileNotFound")
    await refused(FS.read_file(request(project, "a")), "IsADirectory")
    await refused(FS.read_file(request(project, "nope/x")), "FileNotFound")
    await refused(FS.read_file(request(project, "b/x")), "NotADirectory")


# ------------------------------------------------------------------ grants: the workflow's rule


@pytest.mark.parametrize(
    "path",
    [
        ".git/config",
        "src/.git/config",
        ".ai/config/agent_harness.yaml",
        ".ai/logs/audit/2025-01-01/run-x.jsonl",
        ".ai/tools/x/main.py",
        ".ai/scripts/x.py",
        ".ai/.cache/x",
        ".kiwi/x",
    ],
)
async def test_write_everything_does_not_reach_protected_places(tree, path):
    project, _ = tree
    before = snapshot(project)
    message = await refused(FS.write_file(request(project, path, content="pwned")))
    assert "protected place" in message
    await refused(FS.create_directory(request(project, path)))
    assert snapshot(project) == before
    # A grant that names the place is a human's (signed) choice.
    await FS.write_file(request(project, path, allowed=["**", path.rsplit("/", 1)[0] + "/**"], content="ok"))
    assert (project / path).read_text() == "ok"


async def test_an_explicit_denial_wins(tree):
    project, _ = tree
    message = await refused(FS.read_file(request(project, "a/b", denied=["a/**"])))
    assert "explicitly denied by 'a/**'" in message
    await refused(FS.write_file(request(project, "b", allowed=["a/**"], content="x")))
    assert (project / "b").read_text() == "inside b"


async def test_deleting_or_moving_a_folder_that_holds_a_protected_place_is_refused(tree):
    project, _ = tree
    audit = project / ".ai" / "logs" / "audit" / "2025-01-01" / "run-x.jsonl"
    audit.parent.mkdir(parents=True)
    audit.write_text('{"seq": 1}\n')
    (project / "src" / ".git").mkdir(parents=True)
    before = snapshot(project)
    assert "'.ai/logs'" in await refused(FS.delete_path(request(project, ".ai")))
    assert "'src/.git'" in await refused(FS.delete_path(request(project, "src")))
    assert "protected place" in await refused(FS.move_path(request(project, ".ai", destination="old_ai")))
    assert snapshot(project) == before
    # The other way round: a folder that would become a protected place when moved.
    (project / "evil" / "tools" / "x").mkdir(parents=True)
    (project / "evil" / "tools" / "x" / "main.py").write_text("import os")
    (project / "fresh").mkdir()
    (project / "evil2" / "logs").mkdir(parents=True)
    message = await refused(FS.move_path(request(project, "evil", destination="fresh/.git")))
    assert "protected place '.git'" not in message or "fresh/.git" in message
    bare = project / "bare"
    bare.mkdir()
    (bare / "evil" / "tools" / "x").mkdir(parents=True)
    message = await refused(FS.move_path(request(bare, "evil", destination=".ai")))
    assert "'.ai/tools'" in message and not (bare / ".ai").exists()


# ------------------------------------------------------------------ writing, deleting, moving


async def test_writes_are_atomic_idempotent_make_parents_and_keep_the_mode(tree):
    project, outside = tree
    req = request(project, "new/deeper/file.txt", content="hello")
    assert (await FS.write_file(req))["bytes"] == 5
    assert (await FS.write_file(req))["bytes"] == 5  # a retry
    assert (project / "new" / "deeper" / "file.txt").read_text() == "hello"
    script = project / "run.sh"
    script.write_text("old")
    script.chmod(0o755)
    await FS.write_file(request(project, "run.sh", content="#!/bin/sh\n"))
    assert stat.S_IMODE(script.stat().st_mode) == 0o755 and script.read_text() == "#!/bin/sh\n"
    assert not [p for p in project.rglob(".kiwi-*.tmp")]
    # Over a link, or through one: refused, the link and what it points at untouched.
    before = snapshot(outside)
    await refused(FS.write_file(request(project, "link_out/secret", content="x")))
    await refused(FS.write_file(request(project, "link_out/new/file", content="x")))
    await refused(FS.write_file(request(project, "a/link_in", content="x")))
    await refused(FS.create_directory(request(project, "link_out/made")))
    assert snapshot(outside) == before and os.readlink(project / "a" / "link_in") == "../b"
    await refused(FS.write_file(request(project, "a", content="x")), "IsADirectory")


async def test_delete_removes_links_not_what_they_point_at(tree):
    project, outside = tree
    before = snapshot(outside)
    assert (await FS.delete_path(request(project, "link_out")))["deleted"] is True
    assert not (project / "link_out").exists() and snapshot(outside) == before
    assert (await FS.delete_path(request(project, "a")))["deleted"] is True  # holds a/link_out -> outside
    assert not (project / "a").exists() and snapshot(outside) == before
    assert (await FS.delete_path(request(project, "a")))["deleted"] is False  # a retry
    await refused(FS.delete_path(request(project, "link_in/b")))
    await refused(FS.delete_path(request(project, ".")))


async def test_move_checks_both_ends_and_a_retry_is_harmless(tree):
    project, outside = tree
    before = snapshot(outside)
    moved = await FS.move_path(request(project, "b", destination="c/d/b"))
    assert moved["moved"] is True and (project / "c" / "d" / "b").read_text() == "inside b"
    assert (await FS.move_path(request(project, "b", destination="c/d/b")))["moved"] is False
    await refused(FS.move_path(request(project, "c/d/b", destination="link_out/b")))
    await refused(FS.move_path(request(project, "link_out/secret", destination="stolen")))
    await refused(FS.move_path(request(project, "link_in", destination="x")))
    await refused(FS.move_path(request(project, "c/d/b", destination="elsewhere/b", allowed=["c/**"])))
    await refused(FS.move_path(request(project, "a", destination="a/inner")), "InputInvalid")
    assert snapshot(outside) == before and not (project / "stolen").exists()


def test_confine_refuses_a_path_through_a_link(tree):
    project, _ = tree
    assert confine(str(project), "a/deep/c", ["**"], []) == project.resolve() / "a" / "deep" / "c"
    assert confine(str(project), "a/not/yet", ["**"], []) == project.resolve() / "a" / "not" / "yet"
    for path in ("link_out", "link_out/x", "link_in/deep", "../x"):
        with pytest.raises(ApplicationError) as info:
            confine(str(project), path, ["**"], [])
        assert info.value.type == "PermissionDenied"


# ------------------------------------------------------------------ the property

SEGMENTS = st.sampled_from(["a", "b", "..", ".", "link_out", "link_in", "", "deep", "c"])
PATHS = st.lists(SEGMENTS, min_size=1, max_size=6).map("/".join)
GRANTS = st.sampled_from([["**"], ["a/**"], ["b", "a/deep/**"], ["link_out/**", "a/**"], ["."]])


@pytest.fixture(scope="module")
def fixed_tree(tmp_path_factory):
    return make_tree(tmp_path_factory.mktemp("fixed"))


def _lexical(path: str) -> str:
    return os.path.normpath(path.replace("\\", "/"))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=PATHS, grants=GRANTS)
def test_a_path_resolves_inside_the_project_and_its_grant_or_not_at_all(fixed_tree, path, grants):
    project, outside = fixed_tree
    rel = _lexical(path)

    def call(coro):
        try:
            return asyncio.run(coro)
        except ApplicationError as exc:
            assert exc.type in ("PermissionDenied", "FileNotFound", "IsADirectory", "NotADirectory"), exc
            assert exc.non_retryable
            return None

    read = call(FS.read_file(request(project, path, allowed=grants)))
    if read is not None:
        real = project / rel
        assert SECRET not in read["content"] and not any(p.is_symlink() for p in [real, *real.parents])
        assert read["content"] == real.read_text() and _covered(grants, rel)
    listing = call(FS.list_directory(request(project, path, allowed=grants)))
    if listing is not None:
        real = project / rel
        assert (
            real.is_dir() and not any(p.is_symlink() for p in [real, *real.parents]) and _covered(grants, rel)
        )
        assert sorted(e["name"] for e in listing["entries"]) == sorted(os.listdir(real))
    before_out = snapshot(outside)
    wpath = "w" if rel == "." else path + "/w"
    written = call(FS.write_file(request(project, wpath, allowed=grants, content="w")))
    assert snapshot(outside) == before_out
    if written is not None:
        target = project / _lexical(wpath)
        assert target.read_text() == "w" and not any(p.is_symlink() for p in [target, *target.parents])
        assert _covered(grants, _lexical(wpath))
        target.unlink()


def _covered(grants: list[str], rel: str) -> bool:
    from kiwi.protected import granted

    return granted(grants, rel) is not None


# ------------------------------------------------------------------ races: the attack


@pytest.fixture
def attack(tmp_path):
    project, outside = tmp_path / "project", tmp_path / "outside"
    project.mkdir()
    outside.mkdir()
    (outside / "secret").write_text(SECRET)
    (outside / "only_outside.txt").write_text("x")
    return project, outside


async def attempt(coro):
    try:
        return await coro
    except ApplicationError as exc:
        return exc


@pytest.mark.parametrize("kind", ["dir", "file"])
async def test_a_symlink_swapped_in_never_lets_a_read_or_list_out(attack, kind):
    project, outside = attack
    before = snapshot(outside)
    path = "victim/secret" if kind == "dir" else "victim"
    results = []
    with Swapper(project, outside, kind) as swapper:
        # At least TRIES calls, and more (bounded) until one met the real victim, so the race was run.
        for tried in range(TRIES * 10):
            if tried >= TRIES and any(isinstance(r, dict) for r in results):
                break
            results.append(await attempt(FS.read_file(request(project, path))))
            if kind == "dir":
                results.append(await attempt(FS.list_directory(request(project, "victim"))))
    assert swapper.swaps > 0
    for result in results:
        if isinstance(result, dict) and "content" in result:
            assert SECRET not in result["content"] and result["size"] == len("inside")
        elif isinstance(result, dict):
            names = {e["name"] for e in result["entries"]}
            assert "only_outside.txt" not in names
            assert all(e["size"] in (None, len("inside")) for e in result["entries"])
    assert any(isinstance(r, dict) for r in results), "no call ever saw the real victim: no race was tried"
    assert snapshot(outside) == before


@pytest.mark.parametrize("kind", ["dir", "file"])
async def test_a_symlink_swapped_in_never_lets_a_write_move_or_delete_land_outside(attack, kind):
    project, outside = attack
    before = snapshot(outside)
    path = "victim/secret" if kind == "dir" else "victim"
    with Swapper(project, outside, kind) as swapper:
        for i in range(TRIES):
            await attempt(FS.write_file(request(project, path, content=f"written {i}")))
            await attempt(
                FS.write_file(
                    request(project, f"{path}.new" if kind == "file" else "victim/new", content="new")
                )
            )
            await attempt(FS.move_path(request(project, path, destination="stash/secret")))
            await attempt(FS.move_path(request(project, "stash/secret", destination=path)))
            await attempt(
                FS.create_directory(request(project, "victim/made" if kind == "dir" else "victim.d"))
            )
            if i % 3 == 0:
                await attempt(FS.delete_path(request(project, path)))
            if i % 7 == 0:
                await attempt(FS.delete_path(request(project, "victim")))
            assert snapshot(outside) == before
    assert swapper.swaps > 0
    # A move may carry a link swapped in at the last moment (rename moves the link, never its target);
    # the file tools still refuse to read through it.
    for path in ("stash/secret", "victim", "victim/secret"):
        read = await attempt(FS.read_file(request(project, path)))
        assert isinstance(read, ApplicationError) or SECRET not in read["content"]
    assert snapshot(outside) == before


# ------------------------------------------------------------------ the audit trail


def audit_batch(project: Path, seqs, run_id: str = "run-demo-1"):
    from kiwi.contracts import AuditBatch

    return AuditBatch(
        project_root=str(project),
        run_id=run_id,
        records=[
            {"seq": s, "time": "2025-01-02T03:04:05", "event": "tool_call", "tool": "filesystem.read"}
            for s in seqs
        ],
    )


@pytest.mark.parametrize(
    "planted",
    [".ai/logs", ".ai/logs/audit", ".ai/logs/audit/2025-01-02", ".ai/logs/audit/2025-01-02/run-demo-1.jsonl"],
)
async def test_a_symlink_planted_in_the_audit_folder_never_redirects_records(tmp_path, planted):
    from activities.audit import AuditActivities, read_audit_trail

    project, outside = tmp_path / "project", tmp_path / "outside"
    (project / planted).parent.mkdir(parents=True)
    outside.mkdir()
    (project / planted).symlink_to(outside / "x" if planted.endswith(".jsonl") else outside)
    with pytest.raises(ApplicationError) as info:
        await AuditActivities().write_audit_records(audit_batch(project, [1, 2]))
    # Retryable: the workflow keeps the records until a human removes the link.
    assert info.value.type == "AuditPathUnsafe" and not info.value.non_retryable
    assert planted in str(info.value) and "symbolic link" in str(info.value)
    assert list(outside.iterdir()) == []
    trail = read_audit_trail(str(project), "run-demo-1")
    assert trail.records == [] and any("symbolic link" in p for p in trail.problems)
    (project / planted).unlink()
    assert await AuditActivities().write_audit_records(audit_batch(project, [1, 2])) == 2


async def test_a_corrupt_audit_line_loses_no_record_and_kiwi_audit_names_it(project, capsys):
    from activities.audit import AuditActivities, audit_path, read_audit
    from kiwi.cli import main as kiwi_main

    writer = AuditActivities()
    assert await writer.write_audit_records(audit_batch(project, [1, 2, 3])) == 3
    path = audit_path(str(project), "run-demo-1", "2025-01-02")
    with path.open("ab") as handle:
        handle.write(b'{"seq": 4, "time": "2025-01-02T03:0')  # a torn write: the worker died mid-line
    # The retried flush finds record 3 as the last good one and writes 4 and 5 on lines of their own.
    assert await writer.write_audit_records(audit_batch(project, [4, 5])) == 2
    assert await writer.write_audit_records(audit_batch(project, [4, 5])) == 0  # and only once
    with path.open("ab") as handle:
        handle.write(b'\xff\xfe garbage\n{"seq": Infinity}\n["seq", 99]\n')
    assert await writer.write_audit_records(audit_batch(project, [6])) == 1
    assert [r["seq"] for r in read_audit(str(project), "run-demo-1")] == [1, 2, 3, 4, 5, 6]

    assert kiwi_main(["audit", "run-demo-1"]) == 1
    out, err = capsys.readouterr()
    assert [line.split()[0] for line in out.splitlines()] == ["SEQ", "1", "2", "3", "4", "5", "6"]
    where = ".ai/logs/audit/2025-01-02/run-demo-1.jsonl"
    assert f"{where} line 4 could not be read (not JSON" in err
    assert f"{where} line 7 could not be read (not UTF-8 text)" in err
    assert f"{where} line 8 could not be read (not an audit record" in err
    assert f"{where} line 9 could not be read (not an audit record" in err
    assert "printed the 6 records that could be read" in err and "Traceback" not in out + err


async def test_a_tail_of_garbage_does_not_make_the_writer_forget_what_it_wrote(tmp_path):
    from activities.audit import AuditActivities, audit_path, read_audit

    writer = AuditActivities()
    await writer.write_audit_records(audit_batch(tmp_path, range(1, 4)))
    with audit_path(str(tmp_path), "run-demo-1", "2025-01-02").open("ab") as handle:
        handle.write(b"x" * 70_000 + b"\n")
    assert await writer.write_audit_records(audit_batch(tmp_path, [2, 3, 4])) == 1
    assert [r["seq"] for r in read_audit(str(tmp_path), "run-demo-1")] == [1, 2, 3, 4]
