"""Archives unpacked by the worker (``tar x``, ``unzip``): staged, checked entry by entry against the
run's grants, then moved into the project, within size and count limits."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import tempfile
from pathlib import Path
from typing import Any

from activities import confinement
from activities.diskchecks import _confinement, _written
from activities.filesystem import (
    layout_named,
)
from activities.process import run_process
from activities.staging import (
    UNPACK_MAX_BYTES,
    UNPACK_MAX_ENTRIES,
    Staged,
    disk_usage,
    remove_tree,
    too_big,
    unpack_back,
)
from kiwi.contracts import CommandRequest
from kiwi.protected import names
from kiwi.shellpolicy import (
    PathArgument,
    Unpacking,
    program_name,
)


async def _unpack(req: CommandRequest, unpack: Unpacking, cwd: Path, env: dict[str, str]) -> dict[str, Any]:
    """``tar -x`` or ``unzip`` run into a folder of the worker's own, then what it unpacked copied into the
    project by the worker (see :class:`kiwi.shellpolicy.Unpacking`): every path checked against the run's
    write grants first (nothing is kept if one is not covered), files written through descriptors that never
    follow a link, links left out (and named)."""
    folder = tempfile.mkdtemp(prefix="kiwi-unpack-")
    staged = Staged(rel=unpack.target, path=os.path.join(folder, "into"), is_dir=True)
    try:
        os.mkdir(staged.path, 0o700)
        what = f"{unpack.program} (unpacking into '{unpack.target}')"
        running = asyncio.ensure_future(
            run_process(
                unpack.argv(staged.path),
                cwd=str(cwd),
                project=req.project_root,
                timeout=req.timeout_seconds,
                max_output=req.max_output_bytes,
                stdin=req.stdin,
                env=env,
                confine=_confinement(req, into=staged.path),
            )
        )
        result = await _within_limits(running, staged.path, what)
        _, problems, left_out = await asyncio.to_thread(
            unpack_back, req.project_root, staged, req.write_grants, req.deny_fs, what, keep=unpack.keep
        )
    finally:
        remove_tree(folder)
    # (The worker's own folder is no place of the project: its name is not shown, cut short or whole.)
    stdout, stderr = (_unnamed(text, staged.path, unpack.target) for text in (result.stdout, result.stderr))
    if left_out:
        more = " ..." if len(left_out) > 10 else ""
        shown = ", ".join(f"{unpack.target}/{p}" for p in left_out[:10]) + more
        stderr += (
            f"kiwi: {len(left_out)} link(s) or special file(s) in the archive were not unpacked (Kiwi writes "
            f"no links into the project): {shown}\n"
        )
    for problem in problems[:20]:
        stderr += f"kiwi: {problem}\n"
    # (As tar does with a member it cannot write: the others are unpacked, and the command fails.)
    exit_code = result.exit_code or (2 if problems else 0)
    return {"exit_code": exit_code, "stdout": stdout, "stderr": stderr, "truncated": result.truncated}


async def _within_limits(running: asyncio.Future[Any], folder: str, what: str) -> Any:
    """The unpacking's result, once it ends; stopped (its process group killed) as soon as what it wrote
    passes the limits, so that a small archive cannot fill the worker's disk before they are checked."""
    try:
        while True:
            done, _ = await asyncio.wait({running}, timeout=UNPACK_WATCH_SECONDS)
            if done:
                return running.result()
            used, entries = await asyncio.to_thread(disk_usage, folder)
            if used > UNPACK_MAX_BYTES or entries > UNPACK_MAX_ENTRIES:
                raise too_big(what)
    finally:
        if not running.done():
            running.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await running


# How often an unpacking's folder is measured while the program runs.
UNPACK_WATCH_SECONDS = 0.5


def _unnamed(text: str, path: str, shown: str) -> str:
    """``text`` with ``path`` written as ``shown``, and a start of ``path`` that ends it (output cut at the
    limit) dropped."""
    text = text.replace(path, shown)
    for length in range(len(path) - 1, 4, -1):
        if text.endswith(path[:length]):
            return text[:-length]
    return text


@dataclasses.dataclass
class _Watch:
    """What Kiwi looks at before and after a shell command for places whose settings a human's tools obey
    (confinement.nested_places: a `.git`, a repository by its layout, a `.ai` or `temporal-dev.yml` below the
    root), to hold those there read-only for it and set aside those it made.
    - A program Kiwi does not model (``whole``): the folders the wall lets it write whole.
    - A program Kiwi models that writes: the folders of the write grants, whole (a link swapped between the
      check of its words and its run sent `tee l/HEAD` into another folder, review s31 F5), and the folders
      above what it writes (layouts_around); followed by identity (`mv vendor/lib moved` makes nothing)."""

    root: str
    grants: list[str]
    folders: list[str]
    written: list[str]
    whole: bool
    git: bool

    @classmethod
    def of(cls, req: CommandRequest, paths: list[PathArgument], modeled: bool, root: str) -> _Watch:
        written = [place for place, _ in _written(req, paths, modeled)]
        folders = (
            []
            if modeled and not written
            else confinement.whole_write_folders(req)
            if not modeled
            else confinement.write_folders(req)
        )
        git = modeled and program_name(req.argv[0]) == "git"
        return cls(root, req.write_grants, folders, written, not modeled, git)

    def look(self, limit: int | None) -> dict[str, tuple[int, ...]] | None:
        found = confinement.nested_places(self.root, self.folders, self.grants, limit) if self.folders else {}
        if found is not None and self.written:
            found.update(confinement.layouts_around(self.root, self.written, self.grants))
        return found

    def held(self, before: dict[str, tuple[int, ...]]) -> list[str]:
        """What is held read-only for the command: all it found, but a repository by its layout a write grant
        names, and, for git, any repository by its layout (what git writes there is mostly the repository's
        own content: `git restore` of a test fixture's bare repository it tracks, review s31 F8; its settings
        are watched all the same, see made)."""
        return sorted(
            place
            for place in before
            if place != "."
            and not self._allowed(place, made=False)
            # (A link cannot be held, and the command is refused where one is to be: for a program Kiwi models,
            # whose words are checked against `.git` wherever a link leads, a `.git` link, as `repo` makes them,
            # would refuse every command that writes.)
            and (self.whole or not os.path.islink(os.path.join(self.root, place)))
        )

    def _allowed(self, place: str, made: bool) -> bool:
        """Whether the grants let the command write ``place`` (``made``: make it). A repository by its layout as
        layout_named says (git writes in any there, not make one); anything else where a grant names it (`write
        sub/.git/**` for `git init sub`)."""
        if confinement.is_layout(self.root, place):
            return (self.git and not made) or layout_named(self.grants, place, made=made)
        return any(names(g, place) for g in self.grants)

    def made(self, before: dict[str, tuple[int, ...]], after: dict[str, tuple[int, ...]]) -> list[str]:
        """What to set aside: each place there after and not before, but what the grants let it make.
        - A repository by its layout by path and identity, its settings with it (confinement.place_identity):
          one moved (`mv fixtures/bare.git out/x`) or made in the inode of one removed (`git checkout B`),
          and one whose config, commondir or hooks changed (git restoring the agent's config into the human's
          fixture, review s31), is made; allowed only where a grant names its HEAD (one that was there: its
          folder).
        - Anything else by identity for a program Kiwi models (`mv vendor/lib moved` makes nothing), by path
          and identity for one it does not (a folder renamed above a `.git` and one made in its old place);
          allowed where a grant names it (`write sub/.git/**` for `git init sub`)."""
        known = set(before.values())
        found = []
        for place, identity in after.items():
            layout = confinement.is_layout(self.root, place)
            if before.get(place) == identity or not (layout or self.whole) and identity in known:
                continue
            # (git may write in a repository there, not change its settings: `made` unless it is a new one.)
            if layout and layout_named(self.grants, place, made=place not in before):
                continue
            if not layout and self._allowed(place, made=True):
                continue
            found += confinement.set_aside_pieces(self.root, place)
        return sorted(found)
