"""Protected places a command made or changed, set aside beside themselves (nothing deleted): what a
place is on disk (a repository's layout, its identity) and how it is moved out of the way."""

from __future__ import annotations

import contextlib
import os
import posixpath
import stat

from activities.staging import walk_tree
from kiwi.protected import DEV_CONFIG, DIRECTIVES, GIT_DIR, fold


def _layout_at(root: str, rel: str) -> bool:
    """Whether the folder ``rel`` is a repository by its layout (listed; a HEAD that is a link to a folder is one
    to git, review s31 F2, so the HEAD is lstat'ed)."""
    path = os.path.join(root, rel)
    try:
        entries = os.listdir(path) if not os.path.islink(path) else []
    except OSError:
        return False
    headed = any(n.casefold() == "head" and not _is_dir(os.path.join(path, n)) for n in entries)
    return listed_layout({fold(n) for n in entries}, headed)


_AS_LINK = ".ai"
# Places Kiwi makes itself as folders (the audit trail, directives an agent saves through Kiwi): set aside when
# a command made them anything else (`split ... --additional-suffix=ogs .ai/` made a file `.ai/logs`).
_AS_FOLDER = (".ai/logs", DIRECTIVES)


# What in a repository by its layout says what git runs: its config (core.fsmonitor, core.pager), a commondir
# (the config of another folder), a config.worktree, its hooks.
_SETTINGS = ("config", "commondir", "config.worktree", "hooks")


def place_identity(root: str, rel: str, layout: bool = False) -> tuple[int, ...] | None:
    """What a place is, to tell it from another at the same path: its device and inode, and for a repository
    by its layout its settings' too (with their size and time: a config rewritten in place is another)."""
    try:
        info = os.lstat(os.path.join(root, rel))
    except OSError:
        return None
    identity: tuple[int, ...] = (info.st_dev, info.st_ino)
    for name in _SETTINGS if layout else ():
        try:
            setting = os.lstat(os.path.join(root, rel, name))
            identity += (setting.st_ino, setting.st_size, setting.st_mtime_ns, setting.st_ctime_ns)
        except OSError:
            identity += (-1, -1, -1, -1)
    return identity


def listed_layout(entries: set[str], headed: bool) -> bool:
    """Whether a folder whose entries are ``entries`` (folded) is a git repository by its layout (as
    filesystem.repository_layout, from a listing): ``headed``, a HEAD there that is no folder."""
    return headed and ("commondir" in entries or {"objects", "refs"} <= entries)


def is_layout(root: str, place: str) -> bool:
    """Whether ``place``, one nested_places or layouts_around found, is a repository by its layout (not a
    `.git`, a `.ai`, a `temporal-dev.yml` or a folder that cannot be listed)."""
    return fold(posixpath.basename(place)) not in (GIT_DIR, ".ai", DEV_CONFIG) and _layout_at(root, place)


def set_aside_pieces(root: str, place: str) -> list[str]:
    """What is set aside for ``place``, a place nested_places or layouts_around found made: a repository by its
    layout loses its HEAD, every entry a case-insensitive filesystem reads as one (review s31 F4: `head` set
    aside, `HEAD` left), so it is no repository; the folder and the rest of what is in it stay where they are.
    Anything else is set aside whole."""
    if not is_layout(root, place):
        return [place]
    return [posixpath.normpath(posixpath.join(place, head)) for head in _heads(root, place)]


def _heads(root: str, place: str) -> list[str]:
    try:
        return sorted(n for n in os.listdir(os.path.join(root, place)) if n.casefold() == "head")
    except OSError:
        return []


def _is_dir(path: str) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def set_aside(root: str, places: list[str], stamp: str) -> list[tuple[str, str]]:
    """Each of ``places`` (not there before the command) that is there now, renamed beside itself to
    ``NAME.set-aside-STAMP`` for a human to look at: nothing is deleted, and the rename moves the entry itself,
    never where a link in its place leads. (place, new name) for each."""
    moved = []
    for place in places:
        if place == _AS_LINK and not _is_link(root, place):
            continue
        found = _entry(root, place)
        if found is None:
            continue
        folder, name = found
        if place in _AS_FOLDER and _is_folder(folder, name):
            os.close(folder)
            continue
        aside = f"{name}.set-aside-{stamp}"
        try:
            try:
                os.rename(name, aside, src_dir_fd=folder, dst_dir_fd=folder)
            except PermissionError:
                # (The command may have taken its write from the folder: `cp -a` of a folder of mode 555
                # into the project's root gave the root that mode, review s28.)
                writable = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=folder)
                try:
                    os.fchmod(
                        writable, stat.S_IMODE(os.fstat(writable).st_mode) | stat.S_IWUSR | stat.S_IXUSR
                    )
                finally:
                    os.close(writable)
                os.rename(name, aside, src_dir_fd=folder, dst_dir_fd=folder)
            moved.append((place, posixpath.join(posixpath.dirname(place), aside)))
            _unheaded(os.path.join(root, posixpath.dirname(place), aside), stamp)
        except OSError:
            moved.append((place, ""))  # (named all the same: the call fails for it)
        finally:
            os.close(folder)
    return moved


def _unheaded(path: str, stamp: str) -> None:
    """What was set aside at ``path``: every repository by its layout in it (it, when it is a `.git` folder, and
    those below it: a `.git`'s `modules/m`) loses its HEAD too, so the human who looks at it runs no git there
    with its config (review s31: a `.git` set aside whole was a repository all the same). A folder that cannot be
    listed is given its owner's read and search first (mode 0300 hid one, rounds 3 and 4). Nothing is followed
    through a link. Past _UNHEAD_LIMIT entries, what is set aside is left with mode 000: nothing in it is reached
    without a human's chmod (round 4: a HEAD past the limit was kept)."""
    if not _is_dir(path):
        return
    seen = 0
    pending = [path]
    while pending:
        unlisted: list[str] = []
        for at, subdirs, files in walk_tree(pending.pop(), unlisted):
            _unhead_at(at, [n for n in files if n.casefold() == "head"], stamp)
            seen += len(subdirs) + len(files)
            if seen > _UNHEAD_LIMIT:
                with contextlib.suppress(OSError):
                    os.chmod(path, 0)
                return
        for folder in unlisted:
            _unhead_at(folder, ["HEAD", "head"], stamp)
            with contextlib.suppress(OSError):
                info = os.lstat(folder)
                if stat.S_ISDIR(info.st_mode) and not stat.S_IMODE(info.st_mode) & stat.S_IRUSR:
                    os.chmod(folder, stat.S_IMODE(info.st_mode) | stat.S_IRUSR | stat.S_IXUSR)
                    pending.append(folder)


_UNHEAD_LIMIT = 50_000


def _unhead_at(folder: str, heads: list[str], stamp: str) -> None:
    try:
        at = os.open(folder, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return
    try:
        for head in heads:
            with contextlib.suppress(OSError):
                os.rename(head, f"{head}.set-aside-{stamp}", src_dir_fd=at, dst_dir_fd=at)
    finally:
        os.close(at)


def _is_folder(folder: int, name: str) -> bool:
    try:
        return stat.S_ISDIR(os.stat(name, dir_fd=folder, follow_symlinks=False).st_mode)
    except OSError:
        return True  # (gone: nothing to set aside)


def _is_link(root: str, place: str) -> bool:
    try:
        return stat.S_ISLNK(os.lstat(os.path.join(root, place)).st_mode)
    except OSError:
        return False


def _entry(root: str, place: str) -> tuple[int, str] | None:
    """An open folder holding ``place`` and its last name, when there is an entry of that name (a link too);
    None when there is none, or its folder is no folder of the project's (a link)."""
    parent, name = posixpath.split(place)
    flags = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        folder = os.open(root, flags)
        for part in parent.split("/") if parent else ():
            inner = os.open(part, flags, dir_fd=folder)
            os.close(folder)
            folder = inner
    except OSError:
        return None
    try:
        os.stat(name, dir_fd=folder, follow_symlinks=False)
    except OSError:
        os.close(folder)
        return None
    return folder, name
