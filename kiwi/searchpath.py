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

import os


def search_path(value: str, project: str | None = None) -> str:
    """``value`` (a PATH) without its relative entries, those in ``project`` and those in a Kiwi project, as
    they are written or where they lead (a link in the project that leads out, and that the agent may point
    elsewhere later, is left out too); each entry kept as the folder it leads to. Never empty (an empty PATH is
    the current folder to a shell): "/nonexistent" when nothing is left, which finds no program."""
    real = os.path.realpath(project) if project else None
    homes = _homes()
    kept: list[str] = []
    for entry in value.split(os.pathsep):
        if not os.path.isabs(entry):
            continue
        places = (os.path.normpath(entry), os.path.realpath(entry))
        if any((real and within(place, real)) or in_a_project(place, homes) for place in places):
            continue
        if places[1] not in kept:
            kept.append(places[1])
    return os.pathsep.join(kept) or NOWHERE


# What an empty PATH becomes: a folder that is not there, so a name finds no program (and never the
# current folder, which is what an empty PATH is to sh, bash and execvp).
NOWHERE = "/nonexistent"


def _homes() -> set[str]:
    """The folders whose `.ai` is no project's: HOME (where `kiwi mcp` serves no project) and the folder of
    the user space (``AI_USER_SPACE``). (Not the account's home when HOME is another: a project may be there,
    review s32 round 7.)"""
    from kiwi.items.store import user_space

    return {
        os.path.realpath(os.path.expanduser("~")),
        os.path.realpath(os.path.dirname(os.path.realpath(user_space()))),
    }


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
