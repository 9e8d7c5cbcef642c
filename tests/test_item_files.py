"""A FIFO named like an item (made by a program an agent was allowed to run) hangs nothing: not the item
index, not loading an item, not a run's kiwi-mcp.load. Before, reading one waited for a writer forever."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from pathlib import Path

import pytest

from activities.items import _read_item
from kiwi.errors import ItemInvalid, ItemNotFound, PermissionDenied
from kiwi.items.store import ItemStore, parse_item
from tests.helpers import directive_md, write_directive


@contextlib.contextmanager
def fifos(*paths: Path):
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        os.mkfifo(path)
    try:
        yield
    finally:
        # A reader stuck opening a FIFO is let go by a writer opening it, so a failing test fails
        # instead of leaving a thread blocked for good.
        for path in paths:
            with contextlib.suppress(OSError):
                os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))


async def test_the_cli_search_indexes_a_project_holding_fifos_named_like_items(project):
    ai = project / ".ai"
    traps = (ai / "directives" / "trap.md", ai / "knowledge" / "trap.md", ai / "scripts" / "trap.py")
    with fifos(*traps):
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "kiwi",
            "search",
            "hello",
            "--json",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    assert "hello_kiwi" in out.decode()
    assert "trap" not in out.decode()


async def test_an_item_swapped_for_a_fifo_after_indexing_is_refused_on_load(project):
    path = project / ".ai" / "directives" / "swapped.md"
    write_directive(path, directive_md('<step name="s"><action>Act.</action></step>', name="swapped"))

    def load_swapped() -> str:
        store = ItemStore(project)  # (the index's SQLite connection belongs to the thread that made it)
        assert store.load("directive", "swapped").parsed is not None
        path.unlink()
        os.mkfifo(path)
        try:
            store.load("directive", "swapped")
        except (ItemInvalid, ItemNotFound) as exc:
            return str(exc.problems[0]) if isinstance(exc, ItemInvalid) else str(exc)
        return "loaded"

    try:
        answer = await asyncio.wait_for(asyncio.to_thread(load_swapped), 20)
    finally:
        with contextlib.suppress(OSError):
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
    # Refreshing the index drops the FIFO, or reading it refuses it: either way, promptly and no content.
    assert "not a regular file" in answer or "no directive 'swapped'" in answer
    # The reader every index refresh and load goes through refuses it by itself.
    parsed, problems = await asyncio.wait_for(asyncio.to_thread(parse_item, "directive", path), 20)
    assert parsed is None and "not a regular file" in str(problems[0])


async def test_a_runs_kiwi_mcp_load_of_a_fifo_is_refused_at_once(project):
    path = project / ".ai" / "knowledge" / "trap.md"
    with fifos(path), pytest.raises(PermissionDenied, match="not a regular file"):
        await asyncio.wait_for(asyncio.to_thread(_read_item, project, "knowledge", path), 20)
