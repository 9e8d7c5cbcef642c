"""What a check answers: a verdict, and the paths an argv names."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class ShellVerdict:
    """The answer for one argv (``PermissionSet.check_shell`` turns it into a ``Decision``)."""

    allowed: bool
    reason: str = ""
    hint: str = ""
    checked_against: tuple[str, ...] = ()


@dataclass(frozen=True)
class PathArgument:
    """An argument that names a path: as given, project-relative, and what the program does to it."""

    raw: str
    rel: str
    mode: str  # "read" | "write"
    tree: bool = False  # the program works on everything below it (rm -r, tar -x into it)
    # A path in a git object's name (REV:PATH): read from the repository, named from its root, not the cwd.
    in_repository: bool = False
    # FOLDER/NAME that cp, mv or ln would write into a folder (the worker's, path_arguments with probes).
    probe: bool = False
    # A path git rewrites in the working tree, a file or everything below a folder (the worker's, as above).
    pathspec: bool = False


def _no(reason: str, hint: str = "", against: Iterable[str] = ()) -> ShellVerdict:
    return ShellVerdict(False, reason, hint, tuple(against))


_LOCAL_HINT = (
    'use a local tool (.ai/tools, granted with <execute resource="tool"/>) or a Kiwi built-in '
    "(filesystem.*, git.*) instead"
)


def xml_attr(value: str) -> str:
    """``value`` as it may stand between the double quotes of an attribute in a hint's XML, which an author copies
    into a directive (README trial s38: a program's name holding `"` made a hint that is no XML)."""
    return value.replace("&", "&amp;").replace('"', "&quot;").replace("<", "&lt;")
