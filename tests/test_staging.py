"""A docker tool's mounts go through a private copy (activities/staging.py): the attacks on the copy
and on the write-back, on real files (the end-to-end runs are in tests/test_container_tools.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from temporalio.exceptions import ApplicationError

from activities.staging import remove, stage_in, write_back
from tests.helpers import write


def test_the_copy_holds_the_folder_and_no_link_from_it(tmp_path):
    write(tmp_path / "data" / "a.txt", "a")
    write(tmp_path / "data" / "sub" / "b.txt", "b")
    write(tmp_path / "secret" / "key.txt", "secret")
    (tmp_path / "data" / "key").symlink_to(tmp_path / "secret" / "key.txt")
    (tmp_path / "data" / "secrets").symlink_to(tmp_path / "secret")
    staged = stage_in(str(tmp_path), "data", "mount 'data'")
    try:
        copied = sorted(
            os.path.relpath(os.path.join(folder, name), staged.path)
            for folder, dirs, names in os.walk(staged.path)
            for name in [*dirs, *names]
        )
        assert copied == ["a.txt", "sub", "sub/b.txt"]
        assert not str(staged.path).startswith(str(tmp_path))
    finally:
        remove(staged)
    assert not os.path.exists(staged.path)


def test_attack_a_folder_swapped_for_a_link_after_the_check_is_refused_not_copied(tmp_path):
    # What the engine would have mounted by name: 'data' swapped for a link to 'secret' after the check.
    write(tmp_path / "secret" / "key.txt", "secret")
    (tmp_path / "data").symlink_to(tmp_path / "secret")
    with pytest.raises(ApplicationError) as refused:
        stage_in(str(tmp_path), "data", "mount 'data'")
    assert "link" in str(refused.value)
    write(tmp_path / "nested" / "x.txt", "x")
    (tmp_path / "nested" / "inner").symlink_to(tmp_path / "secret")
    with pytest.raises(ApplicationError):
        stage_in(str(tmp_path), "nested/inner", "mount 'nested/inner'")


def test_attack_the_write_back_keeps_nothing_when_one_path_is_not_granted(tmp_path):
    write(tmp_path / "out" / "a.txt", "a")
    staged = stage_in(str(tmp_path), "out", "mount 'out'")
    try:
        write(Path(staged.path) / "a.txt", "changed")
        write(Path(staged.path) / ".git/hooks/pre-commit", "#!/bin/sh\nevil\n")  # a protected place
        with pytest.raises(ApplicationError) as refused:
            write_back(str(tmp_path), staged, ["out/**"], [], "mount 'out'")
        assert "out/.git" in str(refused.value) and "nothing it wrote was kept" in str(refused.value)
        assert (tmp_path / "out" / "a.txt").read_text() == "a"
        assert not (tmp_path / "out" / ".git").exists()
        with pytest.raises(ApplicationError):
            write_back(str(tmp_path), staged, ["out/**"], ["out/a.txt"], "mount 'out'")  # denied explicitly
        assert (tmp_path / "out" / "a.txt").read_text() == "a"
    finally:
        remove(staged)


def test_attack_the_write_back_follows_no_link_planted_in_the_project_meanwhile(tmp_path):
    write(tmp_path / "out" / "sub" / "a.txt", "a")
    write(tmp_path / "elsewhere" / "a.txt", "not yours")
    staged = stage_in(str(tmp_path), "out", "mount 'out'")
    try:
        write(Path(staged.path) / "sub/a.txt", "changed")
        # While the tool ran, the project's out/sub became a link to a folder outside the grant.
        (tmp_path / "out" / "sub" / "a.txt").unlink()
        (tmp_path / "out" / "sub").rmdir()
        (tmp_path / "out" / "sub").symlink_to(tmp_path / "elsewhere")
        with pytest.raises(ApplicationError) as refused:
            write_back(str(tmp_path), staged, ["out/**"], [], "mount 'out'")
        assert "link" in str(refused.value)
        assert (tmp_path / "elsewhere" / "a.txt").read_text() == "not yours"
    finally:
        remove(staged)


def test_a_mount_larger_than_a_tool_carries_is_refused_with_the_fix(tmp_path, monkeypatch):
    import tempfile

    import activities.staging as staging

    monkeypatch.setattr(staging, "MAX_ENTRIES", 3)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    for i in range(5):
        write(tmp_path / "big" / f"{i}.txt", "x")
    with pytest.raises(ApplicationError) as refused:
        stage_in(str(tmp_path), "big", "docker tool 't': mount 'big'")
    assert "more than 3 entries" in str(refused.value) and "smaller folder" in str(refused.value.details)
    assert os.listdir(scratch) == []  # the half-made copy is gone
