"""Kiwi's own files in a project (``.ai/config/...``), read without following links.

What Kiwi reads from ``.ai/config`` decides what every run may do: the harness (base policy, approvals,
blocked commands), the MCP registry (which programs are started, with which secrets), the trusted keys
(whose signature grants a directive its permissions). A link at ``.ai`` or ``.ai/config`` would make Kiwi
read those from wherever it points: a folder an agent can write. The file tools and shell commands never
leave such a link (``.ai`` is held by the kernel while a command runs, and one a command made is set aside
after it), so this is the last wall, not the first: each name is opened one at a time from the project root
with ``O_NOFOLLOW``, as the audit trail's are (``kiwi.auditlog``), and a link or a non-folder on the way is
an error naming it, never a quiet fall-back to no file (a harness that quietly went missing would drop its
approvals). The project root itself, and the user's ``~/.ai``, are the human's own and are followed.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from kiwi.errors import ItemInvalid, Problem

CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | CLOEXEC


def _unsafe(project_root: Path, where: str, what: str) -> ItemInvalid:
    return ItemInvalid(
        [
            Problem(
                f"'{where}' is {what}; Kiwi reads its configuration only from real folders and files in the "
                f"project, never through a link (replace it with the folder or file itself)",
                str(project_root / where),
            )
        ]
    )


def read_bytes(project_root: Path | str, rel: str, limit: int) -> bytes | None:
    """The bytes of the project's file ``rel`` (e.g. ``.ai/config/agent_harness.yaml``); None when it does not
    exist. ItemInvalid when a name on the way is a link or not a folder, when the file is a link or not a
    regular file, or when it holds more than ``limit`` bytes (nothing past the limit is read)."""
    root = Path(project_root)
    parts = [p for p in rel.split("/") if p]
    folder = _open_folder(root, parts[:-1])
    if folder is None:
        return None
    try:
        fd = os.open(parts[-1], _FILE, dir_fd=folder)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _unsafe(root, rel, "a symbolic link" if exc.errno == errno.ELOOP else exc.strerror) from None
    finally:
        os.close(folder)
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise _unsafe(root, rel, "not a regular file")
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise ItemInvalid(
            [Problem(f"file is over the limit of {limit:,} bytes for a config file", str(root / rel))]
        )
    return data


def real_folder(project_root: Path | str, rel: str) -> bool:
    """Whether the project's folder ``rel`` exists with no link on the way (False when it does not exist);
    ItemInvalid when a name on the way is a link or not a folder."""
    folder = _open_folder(Path(project_root), [p for p in rel.split("/") if p])
    if folder is None:
        return False
    os.close(folder)
    return True


def _open_folder(root: Path, parts: list[str]) -> int | None:
    """The folder ``parts`` below the project root, opened one name at a time without following a link; None
    when a name is missing, ItemInvalid when one is a link or not a folder."""
    try:
        folder = os.open(root, os.O_RDONLY | os.O_DIRECTORY | CLOEXEC)
    except FileNotFoundError:
        return None
    for index, name in enumerate(parts):
        try:
            inner = os.open(name, _FOLDER, dir_fd=folder)
        except FileNotFoundError:
            os.close(folder)
            return None
        except OSError as exc:
            what = _what(exc, folder, name)
            os.close(folder)
            raise _unsafe(root, "/".join(parts[: index + 1]), what) from None
        os.close(folder)
        folder = inner
    return folder


def _what(exc: OSError, folder: int, name: str) -> str:
    """What stands at ``name`` that is no folder (O_NOFOLLOW | O_DIRECTORY fails on a link with ENOTDIR on
    Linux, ELOOP elsewhere)."""
    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
        try:
            info = os.stat(name, dir_fd=folder, follow_symlinks=False)
        except OSError:
            return "not a folder"
        return "a symbolic link" if stat.S_ISLNK(info.st_mode) else "not a folder"
    return f"unreadable ({exc.strerror})"
