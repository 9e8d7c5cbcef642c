"""Places whose settings a human's tools obey (a ``.git``, a nested ``.ai``), watched around a shell
command: held read-only for it, set aside when it made or changed one."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import posixpath
import stat

from activities import confinement, gitnamed, setaside
from activities.diskchecks import _denied, _written
from activities.filesystem import layout_named, settings_named
from kiwi.contracts import CommandRequest
from kiwi.protected import names
from kiwi.shellpolicy import PathArgument, program_name


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
        if setaside.is_layout(self.root, place):
            return (self.git and not made) or layout_named(self.grants, place, made=made)
        return any(names(g, place) for g in self.grants)

    def made(self, before: dict[str, tuple[int, ...]], after: dict[str, tuple[int, ...]]) -> list[str]:
        """What to set aside: each place there after and not before, but what the grants let it make.
        - A repository by its layout by path and identity, its settings with it (setaside.place_identity):
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
            layout = setaside.is_layout(self.root, place)
            if before.get(place) == identity or not (layout or self.whole) and identity in known:
                continue
            # (git may write in a repository there, not change its settings: `made` unless it is a new one.)
            if layout and layout_named(self.grants, place, made=place not in before):
                continue
            if not layout and self._allowed(place, made=True):
                continue
            found += setaside.set_aside_pieces(self.root, place)
        return sorted(found)


def _settings_in_reach(
    req: CommandRequest, watch: _Watch, named: list[gitnamed.Named] | None
) -> list[gitnamed.Named]:
    """The places git's settings name (activities.gitnamed; ``named``, when _checked_cwd read them a moment
    before) that the command may write (the folders its watch looks at) and no write grant names: held
    read-only for it (_holdable), and set aside after it when it changed or made one. A file of them with
    another name (a hard link) refuses the command: written by that name, it changes; so does one not there
    that a program Kiwi does not model could make."""
    if not watch.folders:
        return []
    if named is None:
        named = settings_named(req.project_root)
    found = [
        item
        for item in gitnamed.with_matches(watch.root, named)
        if gitnamed.reached(item, watch.folders) and not any(names(g, item.place) for g in req.write_grants)
    ]
    # (A glob `git status` runs, `hooks.d/*.sh`: a new match cannot be held whatever matches now, round 5.)
    missing = [
        item
        for item in found
        if not item.later and (gitnamed.is_glob(item) or not gitnamed.there(watch.root, item))
    ]
    if watch.whole and missing:
        # (Made by it, one would be there for a human's git to obey until the command ends: only one that is
        # there can be held. Review s32: `dd of=.gitconfig` read by a `git status` run meanwhile. One git obeys
        # later, at a commit, a checkout or an alias, not a status, is set aside after it.)
        item = missing[0]
        raise _denied(
            f"'{os.path.basename(req.argv[0])}' is a program Kiwi does not model, which may write "
            f"{', '.join(repr(f or '.') for f in watch.folders)} whole, where it could make '{item.place}', "
            f"which git's settings name ({item.why}) and which is not there to hold read-only for it: "
            # (Never "make it" for a program's file: an empty `nbstripout.py` breaks the filter that loads it.)
            + ("make it (empty) first, " if gitnamed.safe_made_empty(item) else "")
            + "grant narrower folders, or use a program Kiwi models"
        )
    for item in found:
        with contextlib.suppress(OSError):
            info = os.lstat(os.path.join(watch.root, item.place))
            if stat.S_ISREG(info.st_mode) and info.st_nlink > 1:
                raise _denied(
                    f"'{item.place}', which git's settings name ({item.why}), has other names (hard links): written "
                    "by one of them, it changes, so Kiwi runs no command that writes there until a human removes "
                    "the other names"
                )
    return found


def _holdable(root: str, item: gitnamed.Named, whole: bool) -> bool:
    """Whether ``item`` is held read-only for a command: when it is there, and, for a program Kiwi models, no
    link (a link cannot be held, and the command is refused where one is to be held; the checks of its words
    keep such a program from writing it, and its watch sets aside what changed it)."""
    path = os.path.join(root, item.place)
    return os.path.lexists(path) and (whole or not os.path.islink(path))


def _written_now(req: CommandRequest, paths: list[PathArgument], modeled: bool) -> list[str]:
    """Where the paths a program Kiwi models writes are now: a link on the way may have been changed while it
    ran (review s31 F5)."""
    try:
        return [place for place, _ in _written(req, paths, modeled)]
    except OSError:
        return []


def _made_and_aside(moved: list[tuple[str, str]]) -> str:
    """What a command (or a rollback) made, and where each is set aside (setaside.set_aside's answer)."""
    return (
        ", ".join(_made(place) for place, _ in moved)
        + ", set aside for a human to look at: "
        + ", ".join(f"'{aside}'" if aside else f"'{place}' (could not be moved)" for place, aside in moved)
    )


def _made(place: str) -> str:
    """``place``, a place a command made, as its failure names it: a HEAD set aside made its folder a
    repository by its layout (setaside.set_aside_pieces)."""
    if posixpath.basename(place).casefold() == "head":
        folder = posixpath.dirname(place) or "."
        return (
            f"'{folder}' a git repository by its layout (its '{posixpath.basename(place)}'; one is made only "
            f'where a grant names its HEAD, <write resource="filesystem" path="{folder}/HEAD"/>)'
        )
    return f"'{place}'"
