"""find: its tests and actions, which name files, which write, which run programs."""

from __future__ import annotations

import re
from collections.abc import Sequence

from kiwi.shellpolicy.results import ShellVerdict, _no
from kiwi.shellpolicy.specs import _FOLLOW

# find: tests and actions taking one argument; which of them name files.
_FIND_ARG = {
    "-name",
    "-iname",
    "-path",
    "-ipath",
    "-wholename",
    "-iwholename",
    "-regex",
    "-iregex",
    "-lname",
    "-ilname",
    "-type",
    "-xtype",
    "-size",
    "-perm",
    "-user",
    "-group",
    "-uid",
    "-gid",
    "-mtime",
    "-atime",
    "-ctime",
    "-mmin",
    "-amin",
    "-cmin",
    "-maxdepth",
    "-mindepth",
    "-links",
    "-inum",
    "-printf",
    "-fstype",
    "-used",
    "-context",
    "-regextype",
    "-D",
    "-newermm",
}
_FIND_FILE = {"-newer", "-anewer", "-cnewer", "-samefile", "-files0-from"}
_FIND_RUN = {"-exec", "-execdir", "-ok", "-okdir"}
_FIND_WRITE = {"-fprint": 1, "-fprint0": 1, "-fls": 1, "-fprintf": 2}
FIND_GRANTABLE = ("-delete", *_FIND_WRITE)


def _find(
    args: Sequence[str], allow: set[str], options: bool = True
) -> list[tuple[str, str, bool]] | ShellVerdict:
    """find's start points and what its expression reads and writes. ``options``: as findutils reads the
    leading words since SHELL_OPTIONS (`--` ends them, -O takes any number, a lone `-` is a start point:
    `find -- ../outside` listed a folder Kiwi never saw)."""
    i = 0
    found: list[tuple[str, str, bool]] = []
    level = r"-O\d+" if options else r"-O\d"
    while (
        i < len(args)
        and args[i] in ("-H", "-P", "-L", "-D")
        or (i < len(args) and re.fullmatch(level, args[i]))
    ):
        if args[i] in ("-L",):
            return _no(f"option '-L' is refused: it {_FOLLOW}", "run find without -L")
        i += 2 if args[i] == "-D" else 1
    if options and i < len(args) and args[i] == "--":
        i += 1
    starts = []
    while i < len(args) and not (
        (args[i].startswith("-") and not (options and args[i] == "-")) or args[i] in ("(", ")", "!", ",")
    ):
        starts.append(args[i])
        i += 1
    starts = starts or ["."]
    deleting = False
    while i < len(args):
        token = args[i]
        i += 1
        if token in _FIND_RUN:
            return _no(
                f"find's '{token}' is refused: it runs a program on every file it finds",
                "list the files with find, then act on them with Kiwi's filesystem tools",
            )
        if token == "-follow":
            return _no(f"find's '-follow' is refused: it {_FOLLOW}", "run find without -follow")
        if token == "-delete" or token in _FIND_WRITE:
            if token not in allow:
                return _no(
                    f"find's '{token}' is refused unless the shell grant names it",
                    f'add options="{token}" to the <execute resource="shell" commands="find"/> grant '
                    "(a human signs that directive)",
                )
            if token == "-delete":
                deleting = True
            else:
                if i >= len(args):
                    return _no(f"find's '{token}' needs a file")
                found.append((args[i], "write", False))
                i += _FIND_WRITE[token]
        elif token in _FIND_FILE or re.fullmatch(r"-newer[amctB][amctB]", token):
            if i < len(args):
                if not (token.startswith("-newer") and token[-1] == "t"):
                    found.append((args[i], "read", False))
                i += 1
        elif token in _FIND_ARG:
            i += 1
    return found + [(s, "write" if deleting else "read", deleting) for s in starts]
