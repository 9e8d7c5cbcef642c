"""``filesystem.*`` activities: every path is walked from the project root's folder, one name at a time.

The workflow checked the path lexically. Here it is checked again (same rule: ``kiwi.protected.granted``
and explicit denials) and then reached by an openat-style walk: the project root is opened as a folder,
and each component is opened relative to its parent's descriptor with ``O_NOFOLLOW``. Every operation
(open, stat, mkdir, rename, unlink, listing) is then made relative to the last folder's descriptor, so
swapping a file or folder for a symlink between the check and the use changes nothing: the walk holds
the real folders, and a link met anywhere is refused, never followed.

Symlink policy: the file tools follow no symlink, wherever it points (inside the project or out). A
path through a link is PermissionDenied; reading, writing, moving or creating over a link is refused;
deleting a link removes the link itself; listing shows a link as ``symlink`` with no size and no target.

``..`` is resolved lexically, as the workflow does (``a/../b`` is ``b``): with no link ever followed,
the lexical path is the real one, so the path that was checked is the path that is touched.
POSIX only (``dir_fd``, ``O_NOFOLLOW``, ``O_DIRECTORY``).
"""

from __future__ import annotations

import base64
import ctypes
import errno
import fcntl
import os
import posixpath
import secrets
import stat
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, BinaryIO

from temporalio import activity
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory

from activities import gitnamed
from activities.batches import answer_batch
from kiwi.contracts import MAX_TEXT_PAYLOAD, BatchResult, FilesystemBatch, FilesystemRequest, json_size
from kiwi.errors import ACTIVITY_REFUSALS, FileNotFound, PermissionDenied, non_retryable
from kiwi.globs import first_match, glob_match
from kiwi.policy import normalise_path
from kiwi.protected import GIT_DIR, fold, granted, names, protected_root
from kiwi.shellpolicy import down_and_up

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | _CLOEXEC
# O_NONBLOCK: opening a FIFO someone planted must not hang the worker; regular files ignore it.
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | _CLOEXEC
# Errors an O_NOFOLLOW open gives for a link (Linux: ELOOP; FreeBSD: EMLINK) or a non-folder.
_LINK_OR_NOT_DIR = (errno.ELOOP, errno.EMLINK, errno.ENOTDIR)
LIST_LIMIT = 1000


def _denied(message: str) -> ApplicationError:
    return PermissionDenied.error(message)


def _error(message: str, kind: str) -> ApplicationError:
    return ApplicationError(message, type=kind, non_retryable=True, category=ApplicationErrorCategory.BENIGN)


class Missing(ApplicationError):
    """FileNotFound: ``raw`` (or a folder on its way) does not exist."""

    def __init__(self, raw: str) -> None:
        super().__init__(
            f"'{raw}' does not exist",
            type=FileNotFound.type,
            non_retryable=True,
            category=ApplicationErrorCategory.BENIGN,  # an answer to the agent, not a fault to log
        )


def _missing(raw: str) -> Missing:
    return Missing(raw)


def _link_refused(raw: str, rel: str) -> ApplicationError:
    return _denied(
        f"'{raw}': '{rel}' is a symbolic link; Kiwi's file tools never follow links (one could lead "
        "outside the project root or out of the grant)"
    )


def relative(raw: str) -> str:
    """``raw`` as a normalised project-relative path (the workflow's rule), or PermissionDenied."""
    rel = normalise_path(raw)
    if not isinstance(rel, str):
        raise _denied(rel.reason)
    return rel


def covered(allowed: list[str], denied: list[str], rel: str) -> bool:
    """The workflow's rule: not explicitly denied, and granted (protected places only by a grant naming them)."""
    return first_match(denied, rel) is None and granted(allowed, rel) is not None


def _require_covered(allowed: list[str], denied: list[str], rel: str, raw: str) -> None:
    hit = first_match(denied, rel)
    if hit is not None:
        raise _denied(f"'{raw}' is '{rel}', which is explicitly denied by '{hit}'")
    if granted(allowed, rel) is None:
        root = protected_root(rel)
        where = f" (in the protected place '{root}', which only a grant naming it reaches)" if root else ""
        raise _denied(f"'{raw}' is '{rel}', which its grant does not cover{where}")


def _join(rel: str, name: str) -> str:
    return name if rel == "." else f"{rel}/{name}"


def _open_root(root: str) -> int:
    # The project root itself is the human's choice (it may sit behind a link, e.g. /tmp on macOS).
    try:
        return os.open(root, os.O_RDONLY | os.O_DIRECTORY | _CLOEXEC)
    except OSError as exc:
        raise _error(f"the project root '{root}' cannot be opened: {exc.strerror}", "FileNotFound") from exc


def _lstat(parent: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        return None


def open_dir(parent: int, name: str, raw: str, rel: str, create: bool = False) -> int:
    """The folder ``name`` in ``parent``, opened without following a link (made first when ``create``)."""
    for _ in range(3):
        try:
            return os.open(name, _DIR_FLAGS, dir_fd=parent)
        except FileNotFoundError:
            if not create:
                raise _missing(raw) from None
            # Made meanwhile, or a link planted meanwhile: the next open says which.
            with suppress(FileExistsError):
                os.mkdir(name, 0o777, dir_fd=parent)
        except OSError as exc:
            if exc.errno not in _LINK_OR_NOT_DIR:
                raise
            info = _lstat(parent, name)
            if info is not None and stat.S_ISLNK(info.st_mode):
                raise _link_refused(raw, rel) from None
            if info is None:
                continue
            raise _error(f"'{raw}': '{rel}' is a file, not a folder", "NotADirectory") from None
    raise _error(f"'{raw}': '{rel}' kept changing while it was opened", "FileNotFound")


def _whole_characters(data: bytes) -> bytes:
    """``data`` less the 1 to 3 bytes of a UTF-8 character its end cuts through (as it is when it ends whole,
    or is no UTF-8 at all)."""
    for back in range(4):
        try:
            (data[: len(data) - back] if back else data).decode("utf-8")
        except UnicodeDecodeError as exc:
            if exc.start < len(data) - 4:
                return data  # (not UTF-8 before its end: read as base64)
            continue
        return data[: len(data) - back] if back else data
    return data


def _as_text(data: bytes) -> str | None:
    """``data`` as text, or None for base64: not UTF-8, or text that JSON would spell several times
    larger than base64 does (control characters), past what a Temporal payload may carry."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return text if json_size(text) <= MAX_TEXT_PAYLOAD else None


# The names that make a folder a repository to git by its layout, whatever the folder's name (git's
# is_git_directory): a HEAD that is no folder, with objects/ and refs/, or with a commondir file naming a folder
# that has them. git run in such a folder, or below it, reads its config (a `core.fsmonitor` it runs).
LAYOUT_NAMES = ("HEAD", "objects", "refs", "commondir")


def repository_layout(folder: int, adding: str | Iterable[str] = "") -> bool:
    """Whether the folder open at ``folder`` is a git repository by its layout, ``adding`` (names about to be
    made there) counted as there. Names as a case-insensitive filesystem sees them: `head` is HEAD there."""
    added = {adding.casefold()} if isinstance(adding, str) else {name.casefold() for name in adding}

    def there(name: str) -> bool:
        return name.casefold() in added or _lstat(folder, name) is not None

    head = _lstat(folder, "HEAD")
    headed = "head" in added or (head is not None and not stat.S_ISDIR(head.st_mode))
    return headed and (there("commondir") or (there("objects") and there("refs")))


def layout_named(grants: list[str], rel: str, made: bool) -> bool:
    """Whether the write grants allow the repository by its layout at ``rel``: one there already by a grant
    whose literal part names it (`write fixtures/bare.git/**`); one ``made`` only by a grant naming its HEAD
    (`write out/new.git/HEAD`): `write src/**` names src, and under it the agent made src a repository whose
    config every git below src obeyed (review s31 F3). A repository inside a `.git` a grant names is git's own
    (`.git/worktrees/w` under `write .git/**`)."""
    place = protected_root(rel)
    if (
        place is not None
        and fold(place.rsplit("/", 1)[-1]) == GIT_DIR
        and any(names(p, place) for p in grants)
    ):
        return True
    if made:
        return rel != "." and any(names(p, f"{rel}/HEAD") for p in grants)
    return any(names(p, rel) for p in grants)


def refuse_layout(folder: int, rel: str, adding: str | Iterable[str], grants: list[str], raw: str) -> None:
    """PermissionDenied when the folder open at ``folder`` (``rel``) is a repository by its layout, or would be
    with ``adding`` made in it, and the grants do not allow it (layout_named). Review s30 F6: a folder the agent
    wrote HEAD, objects/, refs/ and a config into was a repository whose fsmonitor the human's next git ran."""
    if not repository_layout(folder, adding):
        return
    there = repository_layout(folder)
    if layout_named(grants, rel, made=not there):
        return
    where = "the project's root" if rel == "." else f"'{rel}'"
    itself = posixpath.normpath(raw) == rel
    raise _denied(
        f"'{raw}' "
        + ("is a" if there and itself else f"is in {where}, a" if there else f"would make {where} a")
        + " git repository by its layout (a HEAD with objects/ and refs/, or with a commondir): git run "
        "there obeys the config beside them, which may name programs it runs, so Kiwi "
        + (
            "writes in none that no write grant names"
            + ("" if rel == "." else f' (<write resource="filesystem" path="{rel}/**"/> names it)')
            if there
            else "makes none where no write grant names its HEAD"
            + ("" if rel == "." else f' (<write resource="filesystem" path="{rel}/HEAD"/>)')
        )
    )


def refuse_named(
    root: str, changes: list[tuple[str, str, bool]], grants: list[str]
) -> list[gitnamed.Named] | None:
    """PermissionDenied when a change (project-relative path, as given, ``below``: a folder's, its contents
    with it) changes a place git's settings name that no write grant names (activities.gitnamed). The places,
    when it read them (there were changes)."""
    if not changes:
        return None
    named = settings_named(root)
    for rel, raw, below in changes:
        if (item := gitnamed.in_the_way(named, rel, grants, below)) is not None:
            raise _denied(gitnamed.refusal(item, raw))
    return named


def settings_named(root: str) -> list[gitnamed.Named]:
    """gitnamed.named_places, or PermissionDenied when git cannot read its settings."""
    try:
        return gitnamed.named_places(root)
    except gitnamed.Unreadable as exc:
        raise _denied(
            f"Kiwi cannot tell which files git's settings name for git to obey ({exc}), so it changes no file "
            "until a human fixes that"
        ) from None


def refuse_layout_on_the_way(root: str, places: list[tuple[str, str]], grants: list[str]) -> None:
    """refuse_layout for each folder there is from the project's root to each of ``places`` ((where, as given):
    what a command is to write), with every name the command makes in it counted as made (`mkdir -p r/objects
    r/refs`, review s31 F2), and for each place itself when it is a folder (written into). Read only: nothing is
    made, and no link is followed (the walk stops at one, as at a name not there)."""
    made: dict[str, set[str]] = {}
    for rel, _ in places:
        parts = [] if rel == "." else rel.split("/")
        for index, name in enumerate(parts):
            made.setdefault("/".join(parts[:index]) or ".", set()).add(name)
    for rel, raw in places:
        parts = [] if rel == "." else rel.split("/")
        fd = _open_root(root)
        try:
            for index, name in enumerate(parts):
                refuse_layout(
                    fd, "/".join(parts[:index]) or ".", made["/".join(parts[:index]) or "."], grants, raw
                )
                try:
                    child = os.open(name, _DIR_FLAGS, dir_fd=fd)
                except OSError:
                    break  # (not there, a file, or a link: nothing below it to look at)
                os.close(fd)
                fd = child
            else:
                refuse_layout(fd, rel, made.get(rel, ()), grants, raw)
        finally:
            os.close(fd)


def _lock_for(folder: int, name: str) -> None:
    """Hold the folder open at ``folder`` for the one walk that is to make ``name``, one of LAYOUT_NAMES, in it
    (until the descriptor is closed): two calls at once, each making one of a repository's names, each saw the
    folder without the other's. Only a walk that makes things locks, one folder at a time: a move's walk to its
    source locked the folder its walk to the destination then waited for, forever (review s31 F1)."""
    if name.casefold() not in _LAYOUT_FOLDED:
        return
    # Never waited for on the worker's event loop (review s31: a program holding the folder's lock froze the
    # worker): tried for a moment, then refused. Another worker holds it for microseconds.
    for _ in range(_LOCK_TRIES):
        try:
            fcntl.flock(folder, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            time.sleep(0.001)
    raise _error(
        f"another process holds the folder where '{name}' is to be made (a lock on it); try again", "Busy"
    )


_LOCK_TRIES = 20


_LAYOUT_FOLDED = {n.casefold() for n in LAYOUT_NAMES}


@contextmanager
def walk(
    root: str,
    rel: str,
    raw: str,
    create: bool = False,
    whole: bool = False,
    grants: list[str] | None = None,
) -> Iterator[tuple[int, str]]:
    """``(folder fd, last name)`` for ``rel``: every folder on the way opened from the root without links.

    With ``whole`` the last component is opened too (a folder) and the name is ``"."``. With ``grants`` (the
    run's write grants: the walk is a write's), a folder on the way that is a git repository by its layout, or
    would be with the next name made in it, is refused unless a grant names it (refuse_layout).
    Descriptors are closed on exit.
    """
    parts = [] if rel == "." else rel.split("/")
    steps = parts if whole else parts[:-1]
    fd = _open_root(root)
    try:
        for index, name in enumerate(steps):
            if grants is not None:
                if create:
                    _lock_for(fd, name)
                refuse_layout(fd, "/".join(parts[:index]) or ".", name, grants, raw)
            try:
                child = open_dir(fd, name, raw, "/".join(parts[: index + 1]), create=create)
            except OSError as exc:  # e.g. the folder we hold was removed meanwhile
                raise _os_error(exc, raw) from None
            os.close(fd)
            fd = child
        if grants is not None:
            last = "" if whole or not parts else parts[-1]
            if create:
                _lock_for(fd, last)
            refuse_layout(fd, rel if whole else "/".join(parts[:-1]) or ".", last, grants, raw)
        yield fd, ("." if whole or not parts else parts[-1])
    finally:
        os.close(fd)


def confine(root: str, raw: str, allowed: list[str], denied: list[str]) -> Path:
    """The path of ``raw`` under ``root``, or PermissionDenied (non-retryable).

    ``allowed``/``denied`` are globs as written. Every existing component is checked to be a real
    folder or file, not a link; a caller that then uses the path by name should prefer ``walk``.
    """
    rel = relative(raw)
    if any(glob_match(p, rel) for p in denied) or not any(glob_match(p, rel) for p in allowed):
        raise _denied(f"'{raw}' is '{rel}', which its grant does not cover")
    parts = [] if rel == "." else rel.split("/")
    fd = _open_root(root)
    try:
        for index, name in enumerate(parts):
            sofar = "/".join(parts[: index + 1])
            info = _lstat(fd, name)
            if info is None:
                break
            if stat.S_ISLNK(info.st_mode):
                raise _link_refused(raw, sofar)
            if index == len(parts) - 1 or not stat.S_ISDIR(info.st_mode):
                break
            child = open_dir(fd, name, raw, sofar)
            os.close(fd)
            fd = child
    finally:
        os.close(fd)
    return Path(root).resolve() / rel


def _check_tree(
    folder: int,
    rel: str,
    allowed: list[str],
    denied: list[str],
    raw: str,
    moved_to: str | None = None,
    source: str = "",
    *,
    seen: set[tuple[int, int]] | None = None,
) -> None:
    """Everything below ``rel`` must be covered too (and, for a move, its new path): deleting or moving
    ``.ai`` would otherwise take the protected ``.ai/logs`` with it. A repository by its layout is removed or
    moved only where a grant names it, and moved only where the grants allow one to be made (review s31 F6:
    `fixtures/bare.git`, written under a grant naming it, moved to out/evil; round 3: its HEAD deleted, its
    config written, and a rollback made it one again)."""
    layout = repository_layout(folder)
    if layout and not layout_named(allowed, rel, made=False):
        raise _denied(
            f"'{raw}' holds '{rel}', a git repository by its layout that no write grant names: Kiwi changes "
            f'none (<write resource="filesystem" path="{rel}/**"/> names it)'
        )
    if layout and moved_to is not None:
        landed = moved_to + rel[len(source) :]
        if not layout_named(allowed, landed, made=True):
            raise _denied(
                f"'{raw}' holds '{rel}', a git repository by its layout, which would become '{landed}': git run "
                "there obeys its config, and Kiwi makes no repository where no write grant names its HEAD "
                f'(<write resource="filesystem" path="{landed}/HEAD"/>)'
            )
    with os.scandir(folder) as entries:
        found = list(entries)
    for entry in found:
        child = _join(rel, entry.name)
        if seen is not None:  # (what a delete may remove: this, and nothing put here after the check)
            found_now = entry.stat(follow_symlinks=False)
            seen.add((found_now.st_dev, found_now.st_ino))
        targets = [child] if moved_to is None else [child, moved_to + child[len(source) :]]
        for target in targets:
            if not covered(allowed, denied, target):
                root = protected_root(target)
                why = (
                    f"the protected place '{root}', which only a grant naming it reaches"
                    if root
                    else "not covered by its grant"
                )
                raise _denied(
                    f"'{raw}' holds '{child}'"
                    + (f" (it would become '{target}')" if target != child else "")
                    + f": {why}"
                )
        if moved_to is not None and entry.is_symlink():
            # A link keeps its text, read from where it lands (a link below out/p/t leading to out/x led out
            # of the project once out/p/t was moved to out/z): it must lead where the run may write.
            landed = targets[-1]
            text = os.readlink(entry.name, dir_fd=folder)
            led = posixpath.normpath(posixpath.join(posixpath.dirname(landed), text))
            if (
                text.startswith("/")
                or down_and_up(text)  # (`L -> q/../x`, q a link moved along: on disk not where the text says)
                or led == ".."
                or led.startswith("../")
                or not covered(allowed, denied, led)
            ):
                raise _denied(
                    f"'{raw}' holds '{child}', a symbolic link ('{text}'): at '{landed}' it would lead "
                    + (
                        "out of the project"
                        if text.startswith("/") or led.startswith("..")
                        else f"to '{led}'"
                    )
                    + ", where this run may not write; a link keeps its text wherever it goes"
                )
        if entry.is_dir(follow_symlinks=False):
            inner = open_dir(folder, entry.name, raw, child)
            try:
                _check_tree(inner, child, allowed, denied, raw, moved_to, source, seen=seen)
            finally:
                os.close(inner)


def _same(found: os.stat_result, checked: os.stat_result) -> bool:
    """Whether ``found`` is the file or folder ``checked`` was (not another one put under its name since)."""
    return (found.st_dev, found.st_ino) == (checked.st_dev, checked.st_ino)


def _changed(raw: str, destination: str = "", put_back: bool = True) -> ApplicationError:
    if not put_back:
        # (Review s39, third round: the put-back was by name and blind, and moved a link another program put at
        # the destination, or overwrote a file saved there since; when it failed, the error said nothing moved.)
        activity.logger.warning("filesystem.move of %s: an unchecked entry left at %s", raw, destination)
        return _denied(
            f"'{raw}' was replaced by another program while Kiwi moved it (between its check and the move), and "
            f"what Kiwi moved could not be put back safely: it is at '{destination}', unchecked; look at it before "
            "anything uses it"
        )
    return _denied(
        f"'{raw}' was replaced by another program while Kiwi moved it (between its check and the move): it is put "
        "back, and nothing unchecked is moved; call again once nothing else renames it"
    )


def _renameat2() -> Any:
    """libc's renameat2 (Linux), or None."""
    try:
        call = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return None
    call.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    return call


_RENAMEAT2 = _renameat2()
_RENAME_NOREPLACE = 1


def _put_back(src_parent: int, src_name: str, dst_parent: int, dst_name: str, moved: os.stat_result) -> bool:
    """Move back what this move put at the destination: only the entry it moved (``moved``, seen there right after
    the rename), never a link, and never over anything at the source name since (renameat2 RENAME_NOREPLACE). False
    when it did not (the caller says where it is)."""
    there = _lstat(dst_parent, dst_name)
    if there is None or not _same(there, moved) or stat.S_ISLNK(there.st_mode) or _RENAMEAT2 is None:
        return False
    done = _RENAMEAT2(dst_parent, os.fsencode(dst_name), src_parent, os.fsencode(src_name), _RENAME_NOREPLACE)
    return done == 0


def _remove_contents(folder: int, raw: str, rel: str, checked: set[tuple[int, int]] | None = None) -> None:
    """Empty the folder open at ``folder`` through descriptors; links inside are removed, never followed. With
    ``checked`` (what the check before saw), only those: a file or folder another program put under a checked name
    since is kept, and the delete refused (review s39, second round: a folder outside the grant, swapped in below
    the checked one, was emptied)."""
    with os.scandir(folder) as entries:
        found = list(entries)
    for entry in found:
        child = _join(rel, entry.name)
        now = os.stat(entry.name, dir_fd=folder, follow_symlinks=False)
        if checked is not None and (now.st_dev, now.st_ino) not in checked:
            raise _unchecked(raw, child)
        if stat.S_ISDIR(now.st_mode):
            try:
                inner = os.open(entry.name, _DIR_FLAGS, dir_fd=folder)
            except OSError as exc:
                if exc.errno not in _LINK_OR_NOT_DIR:
                    raise
                raise _unchecked(raw, child) from None  # swapped for a link or a file meanwhile
            try:
                if checked is not None and not _same(os.fstat(inner), now):
                    raise _unchecked(raw, child)
                _remove_contents(inner, raw, child, checked)
            finally:
                os.close(inner)
            os.rmdir(entry.name, dir_fd=folder)
        elif checked is None:
            os.unlink(entry.name, dir_fd=folder)
        else:
            # Checked where no other program can swap it: under a name of Kiwi's own in the same folder, then
            # removed (review s39, third round: a denied file exchanged with a checked one between the check and
            # the unlink, both by name, was removed).
            private = f".kiwi-delete-{secrets.token_hex(8)}"
            os.rename(entry.name, private, src_dir_fd=folder, dst_dir_fd=folder)
            taken = os.stat(private, dir_fd=folder, follow_symlinks=False)
            if (taken.st_dev, taken.st_ino) not in checked:
                if _RENAMEAT2 is not None:
                    _RENAMEAT2(
                        folder, os.fsencode(private), folder, os.fsencode(entry.name), _RENAME_NOREPLACE
                    )
                raise _unchecked(raw, child)
            os.unlink(private, dir_fd=folder)


def _unchecked(raw: str, child: str) -> ApplicationError:
    return _denied(
        f"'{raw}' changed while Kiwi deleted it: '{child}' is not what Kiwi checked (another program put it there "
        "since); it is kept, with what was not deleted yet"
    )


def _read_all(fd: int, limit: int) -> bytes:
    chunks, left = [], limit
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _write_atomic(parent: int, name: str, data: bytes | BinaryIO, mode: int | None) -> None:
    """A temp file made with O_EXCL|O_NOFOLLOW in ``parent``, then renamed over ``name`` (same folder fd).
    ``data``: the bytes, or an open file to copy a MB at a time (an unpacked file may be large)."""
    tmp = f".kiwi-{secrets.token_hex(8)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _CLOEXEC, 0o666, dir_fd=parent)
    try:
        try:
            if mode is not None:
                os.fchmod(fd, mode)
            chunks = iter(lambda: data.read(1 << 20), b"") if not isinstance(data, bytes) else iter((data,))
            for chunk in chunks:
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        os.rename(tmp, name, src_dir_fd=parent, dst_dir_fd=parent)
    except BaseException:
        with suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=parent)
        raise


def _os_error(exc: OSError, raw: str) -> ApplicationError:
    kinds = {
        errno.ENOENT: "FileNotFound",
        errno.EISDIR: "IsADirectory",
        errno.ENOTDIR: "NotADirectory",
        errno.ENOTEMPTY: "FileExists",
        errno.EEXIST: "FileExists",
        errno.EACCES: "PermissionDenied",
        errno.EPERM: "PermissionDenied",
        errno.EINVAL: "InputInvalid",
    }
    return _error(f"'{raw}': {exc.strerror}", kinds.get(exc.errno or 0, "FilesystemError"))


# Refusals a run does not retry (kiwi.errors.ACTIVITY_REFUSALS, as the workflow's RETRY).
NOT_RETRIED = frozenset(non_retryable(*ACTIVITY_REFUSALS))


class FilesystemActivities:
    """Filesystem side effects. Writes are atomic (temp file + rename), so a retried write is harmless."""

    @activity.defn(name="read_file")
    async def read_file(self, req: FilesystemRequest) -> dict[str, Any]:
        rel = relative(req.path)
        _require_covered(req.allowed, req.denied, rel, req.path)
        with walk(req.project_root, rel, req.path) as (parent, name):
            try:
                fd = os.open(name, _READ_FLAGS, dir_fd=parent)
            except FileNotFoundError:
                raise _missing(req.path) from None
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.EMLINK):
                    raise _link_refused(req.path, rel) from None
                raise _os_error(exc, req.path) from None
            try:
                info = os.fstat(fd)
                if stat.S_ISDIR(info.st_mode):
                    raise _error(f"'{req.path}' is a folder; use filesystem.list", "IsADirectory")
                if not stat.S_ISREG(info.st_mode):
                    raise _error(f"'{req.path}' is not a regular file", "FileNotFound")
                if req.denied and info.st_nlink > 1:
                    # (A human's hard link docs/notes to secrets/key is that file: its name is no denial's.)
                    raise _denied(
                        f"'{req.path}' is a file with other names (hard links), and this run denies paths: one "
                        "of its names may be one of them"
                    )
                data = _read_all(fd, req.max_bytes)
            finally:
                os.close(fd)
        size = info.st_size
        if size > req.max_bytes and req.encoding == "utf-8":
            # A cut inside a character made the text base64 (second review s34): cut before it instead.
            data = _whole_characters(data)
        text = _as_text(data)
        if text is not None:
            return {"path": req.path, "content": text, "size": size, "truncated": size > req.max_bytes}
        return {
            "path": req.path,
            "content": base64.b64encode(data).decode(),
            "encoding": "base64",
            "size": size,
            "truncated": size > req.max_bytes,
        }

    @activity.defn(name="read_many")
    async def read_many(self, batch: FilesystemBatch) -> BatchResult:
        """filesystem.read and filesystem.list calls a run made together (see activities.batches)."""
        run = {"read": self.read_file, "list": self.list_directory}
        return await answer_batch(
            (
                (f"filesystem.{operation} {request.path}", run[operation](request))
                for operation, request in zip(batch.operations, batch.requests, strict=True)
            ),
            NOT_RETRIED,
            idempotent=True,
        )

    @activity.defn(name="write_file")
    async def write_file(self, req: FilesystemRequest) -> dict[str, Any]:
        rel = relative(req.path)
        _require_covered(req.allowed, req.denied, rel, req.path)
        if rel == ".":
            raise _error("'.' is the project's root folder, not a file", "IsADirectory")
        content = req.content or ""
        data = base64.b64decode(content) if req.encoding == "base64" else content.encode("utf-8")
        refuse_named(req.project_root, [(rel, req.path, False)], req.allowed)
        with walk(req.project_root, rel, req.path, create=True, grants=req.allowed) as (parent, name):
            info = _lstat(parent, name)
            if info is not None and stat.S_ISLNK(info.st_mode):
                raise _link_refused(req.path, rel)
            if info is not None and stat.S_ISDIR(info.st_mode):
                raise _error(f"'{req.path}' is a folder", "IsADirectory")
            mode = stat.S_IMODE(info.st_mode) if info is not None and stat.S_ISREG(info.st_mode) else None
            try:
                # A link or folder swapped in after the lstat is replaced (a link) or refused by rename
                # (a folder): the rename is relative to the folder we hold and follows nothing.
                _write_atomic(parent, name, data, mode)
            except OSError as exc:
                raise _os_error(exc, req.path) from None
        return {"path": req.path, "bytes": len(data)}

    @activity.defn(name="list_directory")
    async def list_directory(self, req: FilesystemRequest) -> dict[str, Any]:
        """Entries of a folder. Links are ``symlink`` (no size, no target); an entry the read grant does not
        cover is listed by name only (type and size null); nothing is stat'ed through a link."""
        rel = relative(req.path)
        _require_covered(req.allowed, req.denied, rel, req.path)
        with walk(req.project_root, rel, req.path, whole=True) as (folder, _):
            with os.scandir(folder) as scan:
                found = sorted(scan, key=lambda e: e.name)
            entries = []
            for entry in found[:LIST_LIMIT]:
                if entry.is_symlink():
                    entries.append({"name": entry.name, "type": "symlink", "size": None})
                    continue
                if not covered(req.allowed, req.denied, _join(rel, entry.name)):
                    entries.append({"name": entry.name, "type": None, "size": None})
                    continue
                try:
                    info = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                kind = (
                    "dir"
                    if stat.S_ISDIR(info.st_mode)
                    else "file"
                    if stat.S_ISREG(info.st_mode)
                    else "symlink"
                    if stat.S_ISLNK(info.st_mode)
                    else "other"
                )
                entries.append(
                    {"name": entry.name, "type": kind, "size": info.st_size if kind == "file" else None}
                )
        result: dict[str, Any] = {"path": req.path, "entries": entries}
        if len(found) > LIST_LIMIT:
            result["truncated"] = True
        return result

    @activity.defn(name="create_directory")
    async def create_directory(self, req: FilesystemRequest) -> dict[str, Any]:
        rel = relative(req.path)
        _require_covered(req.allowed, req.denied, rel, req.path)
        refuse_named(req.project_root, [(rel, req.path, False)], req.allowed)
        with walk(req.project_root, rel, req.path, create=True, whole=True, grants=req.allowed):
            pass
        return {"path": req.path, "created": True}

    @activity.defn(name="delete_path")
    async def delete_path(self, req: FilesystemRequest) -> dict[str, Any]:
        rel = relative(req.path)
        if rel == ".":
            raise _denied("refusing to delete the project root")
        _require_covered(req.allowed, req.denied, rel, req.path)
        refuse_named(req.project_root, [(rel, req.path, True)], req.allowed)
        try:
            with walk(req.project_root, rel, req.path, grants=req.allowed) as (parent, name):
                info = _lstat(parent, name)
                if info is None:
                    return {"path": req.path, "deleted": False}
                if stat.S_ISDIR(info.st_mode):
                    # Checked and emptied through one descriptor, so what was checked is what goes.
                    folder = open_dir(parent, name, req.path, rel)
                    seen: set[tuple[int, int]] = set()
                    try:
                        _check_tree(folder, rel, req.allowed, req.denied, req.path, seen=seen)
                        _remove_contents(folder, req.path, rel, seen)
                    finally:
                        os.close(folder)
                    os.rmdir(name, dir_fd=parent)
                else:
                    # A file or a link: unlink removes the entry itself and follows nothing.
                    os.unlink(name, dir_fd=parent)
        except (Missing, FileNotFoundError):
            return {"path": req.path, "deleted": False}
        except OSError as exc:
            raise _os_error(exc, req.path) from None
        return {"path": req.path, "deleted": True}

    @activity.defn(name="move_path")
    async def move_path(self, req: FilesystemRequest) -> dict[str, Any]:
        source, destination = relative(req.path), relative(req.destination)
        for rel, raw in ((source, req.path), (destination, req.destination)):
            if rel == ".":
                raise _denied("the project root cannot be moved or replaced")
            _require_covered(req.allowed, req.denied, rel, raw)
        if destination == source or destination.startswith(source + "/"):
            raise _error(f"cannot move '{req.path}' into itself ('{req.destination}')", "InputInvalid")
        refuse_named(
            req.project_root, [(source, req.path, True), (destination, req.destination, True)], req.allowed
        )
        result = {"source": req.path, "destination": req.destination}
        try:
            with walk(req.project_root, source, req.path, grants=req.allowed) as (src_parent, src_name):
                info = _lstat(src_parent, src_name)
                if info is None:
                    if self._exists(req.project_root, destination, req.destination):
                        return {**result, "moved": False}
                    raise _missing(req.path)
                if stat.S_ISLNK(info.st_mode):
                    raise _link_refused(req.path, source)
                if stat.S_ISDIR(info.st_mode):
                    folder = open_dir(src_parent, src_name, req.path, source)
                    try:
                        if not _same(os.fstat(folder), info):
                            raise _changed(req.path)
                        _check_tree(folder, source, req.allowed, req.denied, req.path, destination, source)
                    finally:
                        os.close(folder)
                with walk(
                    req.project_root, destination, req.destination, create=True, grants=req.allowed
                ) as (
                    dst_parent,
                    dst_name,
                ):
                    there = _lstat(dst_parent, dst_name)
                    if there is not None and stat.S_ISLNK(there.st_mode):
                        raise _link_refused(req.destination, destination)
                    os.rename(src_name, dst_name, src_dir_fd=src_parent, dst_dir_fd=dst_parent)
                    landed = _lstat(dst_parent, dst_name)
                    if landed is None or not _same(landed, info):
                        # Renamed by name, so what moved is what had the name then: another program that swapped
                        # another folder (or a link) in after the check moved that one unchecked (hostile review
                        # s39: a folder holding a link out of the project landed). Put back, and refused.
                        put = landed is not None and _put_back(
                            src_parent, src_name, dst_parent, dst_name, landed
                        )
                        raise _changed(req.path, req.destination, put)
                    if stat.S_ISDIR(info.st_mode):
                        # What is inside was checked by name before the rename, and a folder swapped in below it
                        # since moved along unchecked (review s39, second round): checked again where it landed,
                        # through the folder that moved (the one checked: review s39, third round), and put back
                        # if it fails.
                        self._check_landed(req, info, landed, (src_parent, src_name), (dst_parent, dst_name))
        except Missing:
            if self._exists(req.project_root, destination, req.destination):
                return {**result, "moved": False}
            raise
        except OSError as exc:
            raise _os_error(exc, req.path) from None
        return {**result, "moved": True}

    @staticmethod
    def _check_landed(
        req: FilesystemRequest,
        info: os.stat_result,
        landed: os.stat_result,
        source: tuple[int, str],
        target: tuple[int, str],
    ) -> None:
        """The moved folder's tree checked where it landed, through the folder that landed; put back (or said to be
        left there) when it is not the one checked or its tree is refused."""
        destination = relative(req.destination)
        try:
            folder = open_dir(*target, req.destination, destination)
        except ApplicationError:
            folder = None
        refused: ApplicationError | None = None
        try:
            if folder is None or not _same(os.fstat(folder), info):
                raise _changed(req.path, req.destination, False)
            try:
                _check_tree(folder, destination, req.allowed, req.denied, req.path, destination, destination)
            except ApplicationError as exc:
                refused = exc
        finally:
            if folder is not None:
                os.close(folder)
        if refused is not None:
            if _put_back(*source, *target, landed):
                raise refused
            raise _changed(req.path, req.destination, False) from refused

    @staticmethod
    def _exists(root: str, rel: str, raw: str) -> bool:
        """Whether ``rel`` exists (a retried move finds its source gone and its destination there)."""
        try:
            with walk(root, rel, raw) as (parent, name):
                return _lstat(parent, name) is not None
        except ApplicationError:
            return False
