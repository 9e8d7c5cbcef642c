"""What ``git.diff`` and ``git.status`` show a run, and ``git.commit`` takes for it: only the files it may read
(for a commit, write).

Hostile review s35: the git tools were granted by their id alone, and Kiwi's own git ran outside the kernel's
wall, so ``git.diff`` printed a file the run explicitly denied (``secrets/prod.env``, changed since its last
commit), the harness in ``.ai/config`` and a tool's ``.env``; a run with ``write **`` could first put the
untracked ``.env`` in the index (``git add -N .``) and then diff it. Each path git names is now checked as
``filesystem.read`` checks it: its grants, its denials (which win), the protected places (reached only by a
grant naming them); and a tool's hidden files (its ``.env``), which no grant shows, as the wall withholds them.
"""

from __future__ import annotations

import os
import stat

from activities.confinement import TOOL_FOLDERS
from activities.filesystem import covered
from kiwi.protected import fold, protected_root


def hidden_tool_file(rel: str) -> bool:
    """A hidden file or folder (its name starts with a dot) below a tool folder (``.ai/tools/x/.env``, a nested
    project's ``services/api/.ai/tools/x/.env`` too), or inside one: a tool's secrets."""
    parts = rel.split("/")
    for index in range(len(parts) - 2):
        if "/".join(fold(p) for p in parts[index : index + 2]) in TOOL_FOLDERS:
            return any(part.startswith(".") for part in parts[index + 2 :])
    return False


# Kiwi's settings, records and state, a project's or a nested one's: never committed, whatever a grant names.
_SECRET_FOLDERS = (".ai/config", ".ai/logs", ".ai/.cache")

# The same places as git pathspecs, which a checkpoint's tree leaves out (``git rm --cached``): secret_place's
# folders (the project's, and a nested project's: review s35, a checkpoint took
# `services/api/.ai/tools/t/.env` into its ref), ``.kiwi``, and the tools' hidden files.
SECRET_PATHSPECS = (
    *_SECRET_FOLDERS,
    ".kiwi",
    *(f":(glob){folder}/**/.*" for folder in TOOL_FOLDERS),
    *(f":(glob){folder}/**/.*/**" for folder in TOOL_FOLDERS),
    *(f":(glob,icase)**/{folder}/**" for folder in _SECRET_FOLDERS),
    *(f":(glob,icase)**/{folder}/**/.*" for folder in TOOL_FOLDERS),
    *(f":(glob,icase)**/{folder}/**/.*/**" for folder in TOOL_FOLDERS),
)


def secret_place(rel: str) -> bool:
    """Kiwi's settings, records or state (``.ai/config``, ``.ai/logs``, ``.ai/.cache``, ``.kiwi``; a nested
    project's ``.ai`` ones too) or a tool's hidden file: what neither a checkpoint nor git.commit takes."""
    parts = [fold(p) for p in rel.rstrip("/").split("/")]
    if parts[0] == ".kiwi" or hidden_tool_file(rel):
        return True
    return any("/".join(parts[i : i + 2]) in _SECRET_FOLDERS for i in range(len(parts) - 1))


class GitSight:
    """Which paths (project-relative, as git names them) a run may see through the git tools (``read``: the read
    grants; a commit gives its write grants).

    ``read`` None: a request made by a run before session 35, which sent no grants: it sees everything but the
    protected places and the tools' hidden files."""

    def __init__(self, root: str, read: list[str] | None, denied: list[str]) -> None:
        self.root = root
        self.read = read
        self.denied = denied

    def sees(self, rel: str) -> bool:
        rel = rel.rstrip("/") or "."
        if hidden_tool_file(rel):
            return False
        if self.read is None:
            return protected_root(rel) is None
        if not covered(self.read, self.denied, rel):
            return False
        return not (self.denied and self._linked(rel))

    def _linked(self, rel: str) -> bool:
        """A file with other names (hard links): one of them may be a denied one (as filesystem.read says)."""
        try:
            info = os.lstat(os.path.join(self.root, rel))
        except OSError:
            return False
        return stat.S_ISREG(info.st_mode) and info.st_nlink > 1


def split_z(out: str) -> list[str]:
    """The names of git's ``-z`` output."""
    return [name for name in out.split("\0") if name]


def quoted(path: str) -> str:
    """A path as a line of git's output shows it: quoted when it holds a quote, a backslash, a control
    character or a character outside ASCII."""
    if any(c in '"\\' or ord(c) < 0x20 or ord(c) > 0x7E for c in path):
        return '"' + path.encode("unicode_escape").decode("ascii").replace('"', '\\"') + '"'
    return path


def chunks(names: list[str], size: int = 500) -> list[list[str]]:
    """``names`` in groups a command line holds."""
    return [names[i : i + size] for i in range(0, len(names), size)]
