"""Project folders handed to a container through a private copy, so no path is ever mounted by name.

A container engine mounts a host path by name, after Kiwi has checked it: a folder swapped for a
symbolic link between the check and the mount would give the container another place. Instead, the
granted folder is copied into a folder of the worker's own (made with ``mkdtemp``, which nothing else can
write) by descriptors opened without following a link, and that copy is mounted. After a tool that
succeeded, a writable mount's changes are written back the same way: every path checked against the
run's write grants first (nothing is written if one is not covered), then each changed or new file
written atomically and each removed file removed, through descriptors, never following a link. Links
the tool made are not copied back.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import stat
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import BinaryIO

from temporalio.exceptions import ApplicationError

from activities.filesystem import _CLOEXEC, _write_atomic, covered, open_dir, refuse_named, walk
from activities.process import remove_tree
from kiwi.errors import PermissionDenied, ToolFailed

# The bits of a mode Kiwi writes back into the project (an archive's member, a container's file): none that lets
# the group or others write (review s31: `tar -x` of a member of mode 0777 made it writable by every user).
_KEPT_MODE = 0o755

# What a mount may carry into a container (and back): beyond it the call fails and says so.
MAX_BYTES = 256 * 1024 * 1024
MAX_ENTRIES = 20_000
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | _CLOEXEC


@dataclass
class Staged:
    """One mount's private copy: ``path`` is what the engine mounts; ``files`` the SHA-256 of every
    regular file copied in (relative to the mount), to tell what the tool changed."""

    rel: str
    path: str
    is_dir: bool
    files: dict[str, str] = field(default_factory=dict)
    dirs: set[str] = field(default_factory=set)


class _Budget:
    def __init__(self, what: str) -> None:
        self.what = what
        self.bytes = 0
        self.entries = 0

    def take(self, size: int) -> None:
        self.bytes += size
        self.entries += 1
        if self.bytes > MAX_BYTES or self.entries > MAX_ENTRIES:
            raise ToolFailed.error(
                f"{self.what} holds more than {MAX_ENTRIES:,} entries or {MAX_BYTES // 2**20} MB, more than a "
                "docker tool's mount carries",
                {"hint": "mount a smaller folder (the manifest's mounts.source)"},
            )


def stage_in(root: str, rel: str, what: str) -> Staged:
    """A private copy of the project's ``rel`` (a folder or a file), reached from ``root`` without links."""
    parent_dir = tempfile.mkdtemp(prefix="kiwi-mount-")
    budget = _Budget(what)
    try:
        with walk(root, rel, rel) as (parent, name):
            info = os.stat(name, dir_fd=parent, follow_symlinks=False)
            if stat.S_ISREG(info.st_mode):
                staged = Staged(rel=rel, path=os.path.join(parent_dir, "file"), is_dir=False)
                staged.files[""] = _copy_file(parent, name, staged.path, budget)
                return staged
            folder = open_dir(parent, name, rel, rel)
        staged = Staged(rel=rel, path=os.path.join(parent_dir, "mount"), is_dir=True)
        os.mkdir(staged.path, 0o755)
        try:
            _copy_tree(folder, staged.path, "", staged, budget)
        finally:
            os.close(folder)
        return staged
    except BaseException:
        remove_tree(parent_dir)
        raise


def remove(staged: Staged) -> None:
    remove_tree(os.path.dirname(staged.path))


def _copy_file(parent: int, name: str, target: str, budget: _Budget) -> str:
    fd = os.open(name, _FILE_FLAGS, dir_fd=parent)
    digest = hashlib.sha256()
    try:
        info = os.fstat(fd)
        budget.take(info.st_size)
        with open(target, "wb") as out:
            while chunk := os.read(fd, 1 << 20):
                digest.update(chunk)
                out.write(chunk)
        os.chmod(target, (stat.S_IMODE(info.st_mode) & 0o777) | stat.S_IRUSR)
    finally:
        os.close(fd)
    return digest.hexdigest()


def _copy_tree(folder: int, target: str, prefix: str, staged: Staged, budget: _Budget) -> None:
    with os.scandir(folder) as entries:
        found = list(entries)
    for entry in found:
        inner = f"{prefix}{entry.name}"
        if entry.is_dir(follow_symlinks=False):
            budget.take(0)
            child = open_dir(folder, entry.name, inner, inner)
            try:
                os.mkdir(os.path.join(target, entry.name), 0o755)
                staged.dirs.add(inner)
                _copy_tree(child, os.path.join(target, entry.name), inner + "/", staged, budget)
            finally:
                os.close(child)
        elif entry.is_file(follow_symlinks=False):
            try:
                staged.files[inner] = _copy_file(folder, entry.name, os.path.join(target, entry.name), budget)
            except OSError as exc:
                if exc.errno != errno.ELOOP:
                    raise
                # Swapped for a link since it was listed: not copied, as links are not.
        # Links, sockets, devices: not copied (a link would name a place of the host, not of the tool).


def write_back(root: str, staged: Staged, allowed: list[str], denied: list[str], what: str) -> list[str]:
    """The tool's changes to a writable mount, into the project; the project paths written or removed."""
    if not staged.is_dir:
        after = {"": _sha256(staged.path)} if os.path.isfile(staged.path) else {}
        dirs: set[str] = set()
    else:
        after, dirs = _listing(staged.path)
    changed = [p for p, digest in after.items() if staged.files.get(p) != digest]
    removed = [p for p in staged.files if p not in after]
    made = sorted(d for d in dirs if d not in staged.dirs)
    targets = {p: _project_path(staged.rel, p) for p in [*changed, *removed, *made]}
    refused = [t for t in targets.values() if not covered(allowed, denied, t)]
    if refused:
        raise PermissionDenied.error(
            f"{what}: the tool wrote '{refused[0]}', which this run may not write; nothing it wrote was kept",
            {
                "hint": f'grant <write resource="filesystem" path="{refused[0]}"/>, or have the tool write elsewhere'
            },
        )
    refuse_named(root, [(t, t, False) for t in targets.values()], allowed)
    for inner in made:
        with walk(root, targets[inner], targets[inner], create=True, whole=True, grants=allowed):
            pass
    for inner in changed:
        source = staged.path if not staged.is_dir else os.path.join(staged.path, inner)
        with open(source, "rb") as handle:
            data = handle.read()
        with walk(root, targets[inner], targets[inner], create=True, grants=allowed) as (parent, name):
            _write_atomic(parent, name, data, stat.S_IMODE(os.stat(source).st_mode) & _KEPT_MODE)
    for inner in removed:
        with walk(root, targets[inner], targets[inner]) as (parent, name):
            info = os.stat(name, dir_fd=parent, follow_symlinks=False)
            if stat.S_ISREG(info.st_mode):
                os.unlink(name, dir_fd=parent)
    return sorted(targets[p] for p in [*changed, *removed, *made])


# What an unpacking may bring into the project (its apparent size: a 10 KB archive can hold a sparse 2 GB
# file, review of the staged unpacking F5).
UNPACK_MAX_BYTES = 1024 * 1024 * 1024
UNPACK_MAX_ENTRIES = 100_000


def walk_tree(top: str, unlisted: list[str] | None = None) -> Iterator[tuple[str, list[str], list[str]]]:
    """``os.walk(top, followlinks=False)`` without recursion: Python 3.11's recurses once per level, so a
    folder 1,500 levels deep (`mkdir -p` of one long path) raised RecursionError in the worker (review s26).
    A folder that cannot be listed (a path past PATH_MAX, a mode without read) is left out, and added to
    ``unlisted`` when given. The caller may prune ``subdirs`` in place, as with os.walk."""
    pending = [top]
    while pending:
        folder = pending.pop()
        try:
            with os.scandir(folder) as listing:
                entries = [(entry.name, entry.is_dir(follow_symlinks=False)) for entry in listing]
        except OSError:
            if unlisted is not None:
                unlisted.append(folder)
            continue
        subdirs = [name for name, is_dir in entries if is_dir]
        yield folder, subdirs, [name for name, is_dir in entries if not is_dir]
        pending += [os.path.join(folder, name) for name in reversed(subdirs)]


def disk_usage(top: str) -> tuple[int, int]:
    """The bytes ``top``'s files take on disk (a sparse file only what it holds) and its entries."""
    used = entries = 0
    for folder, subdirs, names in walk_tree(top):
        entries += len(subdirs) + len(names)
        for name in names:
            with contextlib.suppress(OSError):
                used += os.lstat(os.path.join(folder, name)).st_blocks * 512
    return used, entries


def too_big(what: str) -> ApplicationError:
    return ToolFailed.error(
        f"{what}: the archive unpacks to more than {UNPACK_MAX_ENTRIES:,} entries or "
        f"{UNPACK_MAX_BYTES // 2**30} GB; nothing it unpacked was kept",
        {"hint": "unpack a part of it (name the members to take), or use a tool of your own"},
    )


def unpack_back(
    root: str, staged: Staged, allowed: list[str], denied: list[str], what: str, *, keep: bool
) -> tuple[list[str], list[str], list[str]]:
    """What an archive program unpacked into ``staged`` (a folder of the worker's own), into the project
    under ``staged.rel``: every path checked against the grants first (nothing is written if one is not
    covered), then folders made and files written through descriptors that never follow a link, a MB at a
    time, keeping their times. ``keep``: files already there are left as they are. A file the project
    cannot take (a folder of that name, a link on the way) is left out and named, as tar leaves out a member
    it cannot write. The paths written, those problems, and what was left out as no file or folder (links,
    devices...: relative to ``staged.path``)."""
    files: dict[str, os.stat_result] = {}
    dirs: list[str] = []
    others: list[str] = []
    total = 0
    for folder, subdirs, names in walk_tree(staged.path):
        inner = os.path.relpath(folder, staged.path)
        prefix = "" if inner == "." else inner.replace(os.sep, "/") + "/"
        for name in [*subdirs, *names]:
            info = os.lstat(os.path.join(folder, name))
            if stat.S_ISDIR(info.st_mode):
                dirs.append(prefix + name)
            elif stat.S_ISREG(info.st_mode):
                files[prefix + name] = info
                total += info.st_size
            else:
                others.append(prefix + name)
            if len(files) + len(dirs) > UNPACK_MAX_ENTRIES or total > UNPACK_MAX_BYTES:
                raise too_big(what)
    targets = {p: _project_path(staged.rel, p) for p in [*dirs, *files]}
    refused = [t for t in targets.values() if not covered(allowed, denied, t)]
    if refused:
        raise PermissionDenied.error(
            f"{what}: the archive holds '{refused[0]}', which this run may not write; nothing it unpacked was "
            "kept",
            {"hint": f'grant <write resource="filesystem" path="{refused[0]}"/>, or unpack elsewhere'},
        )
    refuse_named(root, [(t, t, False) for t in targets.values()], allowed)
    written: list[str] = []
    problems: list[str] = []
    for inner in [*sorted(dirs), *files]:
        try:
            info = files.get(inner)
            if info is None:
                with walk(root, targets[inner], targets[inner], create=True, whole=True, grants=allowed):
                    pass
                continue
            with walk(root, targets[inner], targets[inner], create=True, grants=allowed) as (parent, name):
                if keep and _present(parent, name):
                    continue
                with _staged_file(staged.path, inner) as source:
                    _write_atomic(parent, name, source, stat.S_IMODE(info.st_mode) & _KEPT_MODE)
                os.utime(name, ns=(info.st_atime_ns, info.st_mtime_ns), dir_fd=parent, follow_symlinks=False)
            written.append(targets[inner])
        except (OSError, ApplicationError) as exc:
            why = exc.message if isinstance(exc, ApplicationError) else (exc.strerror or str(exc))
            problems.append(f"{targets[inner]}: not written: {why}")
    return written, problems, sorted(others)


def _staged_file(top: str, inner: str) -> BinaryIO:
    """``inner`` below the staging folder ``top``, opened without following a link on the way and only if it
    is a regular file: a process the archive program left behind could have swapped a folder for a link to a
    file the worker may read (review s26: 592 copies of a root-only file out of 2,000)."""
    folder = os.open(top, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        *parts, name = inner.split("/")
        for part in parts:
            inside = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder)
            os.close(folder)
            folder = inside
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=folder)
    finally:
        os.close(folder)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "no longer a file")
    return os.fdopen(fd, "rb")


def _present(parent: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def _listing(top: str) -> tuple[dict[str, str], set[str]]:
    files: dict[str, str] = {}
    dirs: set[str] = set()
    for folder, subdirs, names in walk_tree(top):
        inner = os.path.relpath(folder, top)
        prefix = "" if inner == "." else inner.replace(os.sep, "/") + "/"
        for sub in subdirs:
            if not os.path.islink(os.path.join(folder, sub)):
                dirs.add(prefix + sub)
        for name in names:
            path = os.path.join(folder, name)
            if stat.S_ISREG(os.lstat(path).st_mode):  # links and the like stay in the copy
                files[prefix + name] = _sha256(path)
    return files, dirs


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _project_path(rel: str, inner: str) -> str:
    return rel if not inner else f"{rel}/{inner}"
