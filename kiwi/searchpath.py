"""The PATH of a program Kiwi starts: absolute entries only, and none in a Kiwi project.

A program is found by its name on PATH. A relative entry (`bin`, `node_modules/.bin`, `.`, an empty one) is
searched from the folder the program starts in, the project; an absolute one may be a folder of the project
too (its `.venv/bin`, activated before `kiwi dev`; `node_modules/.bin` added by direnv). Either way a name
would find a file an agent may write, which Kiwi would then start in place of `git`, `bash`, `podman` or
`npx` (review s32, rounds 4 to 6: Kiwi's own git, a local tool's bash, the container engine and an MCP
server's command were found there). So every program Kiwi starts searches a PATH without them: the entries
in the project a call names, and those in any folder holding a `.ai` (a Kiwi project; the home folder's `.ai`
is the user's own).
"""

from __future__ import annotations

import contextlib
import os
import pwd


def search_path(value: str, project: str | None = None) -> str:
    """``value`` (a PATH) without its relative entries, those in ``project`` and those in a Kiwi project."""
    real = os.path.realpath(project) if project else None
    homes = _homes()
    return os.pathsep.join(
        entry
        for entry in value.split(os.pathsep)
        if os.path.isabs(entry)
        and not (real and within(os.path.realpath(entry), real))
        and not in_a_project(os.path.realpath(entry), homes)
    )


def _homes() -> set[str]:
    """The user's home folders (HOME's and the account's): their `.ai` is the user space, no project's."""
    homes = {os.path.realpath(os.path.expanduser("~"))}
    with contextlib.suppress(KeyError, OSError):
        homes.add(os.path.realpath(pwd.getpwuid(os.getuid()).pw_dir))
    return homes


def in_a_project(path: str, homes: set[str]) -> bool:
    """Whether ``path`` (real) is in a folder holding a `.ai` (a Kiwi project), the home folders aside."""
    folder = path
    while True:
        if folder not in homes and os.path.isdir(os.path.join(folder, ".ai")):
            return True
        parent = os.path.dirname(folder)
        if parent == folder:
            return False
        folder = parent


def within(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)
