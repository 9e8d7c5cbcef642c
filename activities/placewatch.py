"""Places whose settings a human's tools obey (a ``.git``, a nested ``.ai``), watched around a shell
command: held read-only for it, set aside when it made or changed one."""

from __future__ import annotations

import contextlib
import os
import posixpath
import stat

from activities import gitnamed
from activities.diskchecks import _denied, _written
from activities.filesystem import (
    settings_named,
)
from activities.unpacking import _Watch
from kiwi.contracts import CommandRequest
from kiwi.protected import names
from kiwi.shellpolicy import (
    PathArgument,
)


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
    """What a command (or a rollback) made, and where each is set aside (confinement.set_aside's answer)."""
    return (
        ", ".join(_made(place) for place, _ in moved)
        + ", set aside for a human to look at: "
        + ", ".join(f"'{aside}'" if aside else f"'{place}' (could not be moved)" for place, aside in moved)
    )


def _made(place: str) -> str:
    """``place``, a place a command made, as its failure names it: a HEAD set aside made its folder a
    repository by its layout (confinement.set_aside_pieces)."""
    if posixpath.basename(place).casefold() == "head":
        folder = posixpath.dirname(place) or "."
        return (
            f"'{folder}' a git repository by its layout (its '{posixpath.basename(place)}'; one is made only "
            f'where a grant names its HEAD, <write resource="filesystem" path="{folder}/HEAD"/>)'
        )
    return f"'{place}'"
