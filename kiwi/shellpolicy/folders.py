"""Folders a program reads or changes whole, checked against the run's denials; link moves and
names read from a list."""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from kiwi.globs import first_match, glob_covered, glob_reaches_below, glob_segments
from kiwi.protected import protected_root
from kiwi.shellpolicy.archives import _tar_old_style
from kiwi.shellpolicy.options import UnknownOption, _options_for, _parse, _Parsed
from kiwi.shellpolicy.paths import _READS_FOLDERS, _Grants, _path_operands, _reads_folders, tree_granted
from kiwi.shellpolicy.programs import modeled_program, program_name
from kiwi.shellpolicy.results import PathArgument, ShellVerdict, _no
from kiwi.shellpolicy.specs import SPECS


def _cwd_unread(
    argv: Sequence[str],
    cwd: PathArgument,
    g: _Grants,
    options_granted: Mapping[str, Iterable[str]] | Iterable[str] | None,
    known: bool,
) -> bool:
    """Whether the program leaves its cwd ``cwd`` unread (it reads and writes only the paths it is given,
    each checked on its own), and the cwd is neither denied nor a protected place."""
    if first_match(list(g.deny), cwd.rel) is not None or protected_root(cwd.rel) is not None:
        return False
    name = program_name(argv[0])
    if not modeled_program(argv[0]) or name == "git":  # (by its exact name: `HEAD` is no head, review s30)
        return False
    if name not in _READS_CWD:
        return True
    if name == "rg":  # (its cwd's ignore files, whatever it searches, and their lines printed in its errors)
        return False
    if name == "find":
        return bool(_find_starts(argv[1:]))
    parsed = _parse(
        list(argv[1:]), SPECS[name], _options_for(name, options_granted), program=name if known else ""
    )
    return isinstance(parsed, _Parsed) and bool(_path_operands(name, parsed))


def _find_starts(args: Sequence[str]) -> list[str]:
    """find's starting points: the words after its leading options (-H, -L, -P, -D X, -O3) and before its
    expression (a word that begins with '-', or '(', '!', ',')."""
    index = 0
    while (
        index < len(args)
        and args[index] in ("-H", "-L", "-P", "-D")
        or (index < len(args) and re.fullmatch(r"-O\d*", args[index]))
    ):
        index += 2 if args[index] == "-D" else 1
    starts = []
    for arg in args[index:]:
        if arg.startswith("-") or arg in ("(", "!", ","):
            break
        starts.append(arg)
    return starts


def ungranted_below(
    argv: Sequence[str],
    paths: Sequence[PathArgument],
    read_grants: Sequence[str],
    options_granted: Mapping[str, Iterable[str]] | Iterable[str] | None = None,
    uses: list[tuple[PathArgument, str, int | None]] | None = None,
    known: bool = True,
) -> ShellVerdict | None:
    """Why ``argv`` may not run when it reads every file below a folder (`grep -r`, `du`, the cwd of `rg`) that
    no read grant covers whole, though one names the folder (`.`, `src`, `*`); None when it may."""
    for p, verb, depth in folder_uses(argv, paths, options_granted, known) if uses is None else uses:
        if verb != "reads":
            continue
        inside = ("*" if p.rel in ("", ".") else f"{p.rel}/*") if depth == 1 else None
        if inside is not None and any(glob_covered(inside, g) for g in read_grants):
            continue
        if inside is None and tree_granted(p.rel, read_grants):
            continue
        where = "the cwd" if p is paths[0] else f"'{p.raw}'"
        return _no(
            f"{posixpath.basename(argv[0])} reads {'the files directly in' if depth == 1 else 'everything below'}"
            f" {where} ({p.rel}), and no read grant covers all of it",
            f'add <read resource="filesystem" path="{"**" if p.rel in ("", ".") else p.rel + "/**"}"/> to '
            "<permissions> if the directive may read all of it, or name the files",
            read_grants,
        )
    return None


# Names a grant may give these programs under (their paths are read as an unknown program's, path-like words
# as reads): `egrep -r KEY .` is grep's recursion; rgrep always recurses; dir and vdir are ls.
_SAME_AS = {"egrep": "grep", "fgrep": "grep", "rgrep": "grep", "dir": "ls", "vdir": "ls"}
# Programs that, given no path operand, read below the cwd (an option's file, grep -f PATTERNS or
# --exclude-from, is no path operand: `grep -r KEY --exclude-from=-` searched `.`).
_READS_CWD = frozenset({"rg", "du", "tree", "find", "grep", "ls"})


def folder_uses(
    argv: Sequence[str],
    paths: Sequence[PathArgument],
    options_granted: Mapping[str, Iterable[str]] | Iterable[str] | None = None,
    known: bool = True,
    find_cwd: bool = False,
) -> list[tuple[PathArgument, str, int | None]]:
    """The folders ``argv`` reads, moves, deletes or changes as a whole: each path argument (``paths``, from
    path_arguments, the cwd first) with what the program does below it and how deep (None: all the way).
    ``known``: the options read as path_arguments read them, by KNOWN_OPTIONS or not. ``find_cwd``: find's
    cwd counted though it is given starting points (as before FIND_STARTS)."""
    if not argv:
        return []
    given = program_name(argv[0])
    name = _SAME_AS.get(given, given)
    spec = SPECS.get(name)
    if spec is None or name not in (*_READS_FOLDERS, *_CHANGES_FOLDERS):
        return []
    if name == "find":
        # (find reads its starting points, the cwd only when it is given none.)
        parsed = _Parsed(operands=[] if find_cwd else _find_starts(argv[1:]))
    else:
        args = _tar_old_style(list(argv[1:])) if name == "tar" else list(argv[1:])
        found = _parse(args, spec, _options_for(name, options_granted), program=name if known else "")
        if isinstance(found, UnknownOption):
            # (egrep, rgrep, dir and vdir are read as programs Kiwi does not know, their options unchecked:
            # the folders they read are found as before, not lost with the option.)
            found = _parse(args, spec, _options_for(name, options_granted))
        if isinstance(found, ShellVerdict):
            return []  # (refused already by path_arguments)
        parsed = found
    uses: list[tuple[PathArgument, str, int | None]] = []
    if name in _READS_FOLDERS and (given == "rgrep" or _reads_folders(name, parsed)):
        reads = [p for p in paths[1:] if p.mode == "read"]
        if name in _READS_CWD and not _path_operands(name, parsed):
            reads.append(paths[0])
        uses += [(p, "reads", 1 if name == "diff" else None) for p in reads]
    if name in _CHANGES_FOLDERS and (name != "tar" or "--remove-files" in parsed.options):
        kept = _destination(name, parsed)
        uses += [
            (p, _CHANGES_FOLDERS[name], None)
            for p in paths[1:]
            if p.mode == "write" and p.tree and p.raw != kept
        ]
    return uses


def denied_inside(
    argv: Sequence[str],
    paths: Sequence[PathArgument],
    deny: Sequence[str],
    options_granted: Mapping[str, Iterable[str]] | Iterable[str] | None = None,
    uses: list[tuple[PathArgument, str, int | None]] | None = None,
    known: bool = True,
    find_cwd: bool = False,
) -> ShellVerdict | None:
    """Why ``argv`` may not run when it reads, moves, deletes or changes everything below a folder where a
    denial whose first segment names a place can match (None when it may). (`mv data out/` put
    data/secrets where no denial named it; `rm -r data` deleted it.) The worker checks the rest on disk."""
    placed = [d for d in deny if not any(c in glob_segments(d)[0] for c in "*?")]
    if not placed:
        return None
    if uses is None:
        uses = folder_uses(argv, paths, options_granted, known, find_cwd)
    for p, verb, depth in uses:
        for pattern in placed:
            if glob_reaches_below(pattern, p.rel, depth):
                return inside_refusal(argv, p, paths, verb, pattern, deny)
    return None


def inside_refusal(
    argv: Sequence[str],
    p: PathArgument,
    paths: Sequence[PathArgument],
    verb: str,
    pattern: str,
    deny: Sequence[str],
) -> ShellVerdict:
    where = "the cwd" if p is paths[0] else f"'{p.raw}'"
    below = (
        "the files directly in" if verb == "reads" and program_name(argv[0]) == "diff" else "everything below"
    )
    return _no(
        f"{posixpath.basename(argv[0])} {verb} {below} {where} ({p.rel}), which holds paths this run denies "
        f"('{pattern}')",
        "name folders or files that hold nothing the run denies"
        + (", or read files one at a time (filesystem.read)" if verb == "reads" else ""),
        deny,
    )


# Programs whose whole-folder writes act on what is already below the folder (what they delete, move away or
# change), and what they do to it; a destination they move or copy into is not one (_destination).
_CHANGES_FOLDERS = {"rm": "deletes", "mv": "moves", "chmod": "changes", "zip": "deletes", "tar": "deletes"}


@dataclass(frozen=True)
class LinkMoves:
    """Where ``cp``/``mv``/``ln`` put what they are given, as links stay links: each source lands at
    ``into``/NAME (``into``/SOURCE with ``parents``) when ``into`` is a folder and ``named`` is False (-T),
    else at ``into`` itself. ``top``: a source that is a symbolic link moves as one (mv, cp -r/-a/-d/-P, a
    hard ln); ``below``: so do the links below a source folder (mv, cp -r), and below the folder a source
    link leads to when cp follows it (``follows``: -H). ``made``: ln -s, whose sources are the new links'
    texts."""

    sources: tuple[str, ...]
    into: str
    folder: bool  # (given as the folder to write into: -t DIR)
    parents: bool
    top: bool
    below: bool
    follows: bool = False
    named: bool = False  # (-T, --no-target-directory; ln -n: `into` is the new name, even if a folder)
    made: bool = False
    relative: bool = False  # (ln -sr: each text is named from the cwd, and ln makes it relative)
    named_if_link: bool = False  # (ln -n: `into` is the new name when it is a link, to a folder or not)


def link_moves(argv: Sequence[str]) -> LinkMoves | None:
    """How ``argv`` moves, copies or makes links (see :class:`LinkMoves`), or None when it does none."""
    if not argv:
        return None
    name = program_name(argv[0])
    if name == "git":
        return _git_mv(argv[1:])
    if name not in ("cp", "mv", "ln"):
        return None
    parsed = _parse(list(argv[1:]), SPECS[name], set(), program=name)
    if isinstance(parsed, ShellVerdict):
        return None
    options = set(parsed.options)
    folders = [v for _, k, v in parsed.values if k == "write"]
    ops = list(parsed.operands)
    if name == "ln" and not folders and len(ops) == 1:
        ops.append(".")
    sources, into = (ops, folders[-1]) if folders else (ops[:-1], ops[-1] if ops else "")
    if not sources or not into:
        return None
    named = bool({"-T", "--no-target-directory"} & options)
    if_link = name == "ln" and bool({"-n", "--no-dereference"} & options)
    if name == "ln" and "-s" in options:
        relative = bool({"-r", "--relative"} & options)
        return LinkMoves(
            tuple(sources),
            into,
            bool(folders),
            False,
            False,
            False,
            named=named,
            made=True,
            relative=relative,
            named_if_link=if_link,
        )
    recursive = name == "mv" or (name == "cp" and _reads_folders("cp", parsed))
    as_links = name in ("mv", "ln") or recursive or bool({"-d", "-P", "--no-dereference"} & options)
    follows = _follows_last(name, parsed.options)
    return LinkMoves(
        tuple(sources),
        into,
        bool(folders),
        "--parents" in options,
        as_links and not follows,
        recursive and not (name == "cp" and "-L" in options),
        follows=name == "cp" and recursive and follows,
        named=named,
        named_if_link=if_link,
    )


def _follows_last(name: str, options: Sequence[str]) -> bool:
    """Whether cp (-H, -L) or ln (-L) follows a source link: the last of them and -P (-d, -a for cp) wins."""
    follow = {"cp": ("-H", "-L", "--dereference"), "ln": ("-L", "--logical")}.get(name, ())
    keep = {"cp": ("-P", "--no-dereference", "-d", "-a", "--archive"), "ln": ("-P", "--physical")}.get(
        name, ()
    )
    last = [o for o in options if o in (*follow, *keep)]
    return bool(last) and last[-1] in follow


def _git_mv(args: Sequence[str]) -> LinkMoves | None:
    """``git mv SOURCE... DEST`` moves links as mv does (see :class:`LinkMoves`), or None for any other git."""
    i = 0
    while i < len(args) and args[i].startswith("-"):
        i += 1
    if i >= len(args) or args[i] != "mv":
        return None
    ops: list[str] = []
    rest = list(args[i + 1 :])
    for index, word in enumerate(rest):
        if word == "--":
            ops += rest[index + 1 :]
            break
        if not word.startswith("-"):
            ops.append(word)
    if len(ops) < 2:
        return None
    return LinkMoves(tuple(ops[:-1]), ops[-1], False, False, True, True)


# Options that read the names of the files to work on from a list (a file, or standard input, which shell.run
# can give): the names in it are never checked, so `sort --files0-from=out/list` read /etc/passwd, and a
# checksum's -c read whatever its sums file named. Refused as tar -T is, behind this patch in workflow code
# (asked only where it changes the answer); always by the worker.
_NAMES_FROM_A_LIST: dict[str, tuple[str, ...]] = {
    "sort": ("--files0-from",),
    "wc": ("--files0-from",),
    "du": ("--files0-from",),
    "find": ("-files0-from",),
    "file": ("-f", "--files-from"),
    **{
        f"{algorithm}sum": ("-c", "--check")
        for algorithm in ("md5", "sha1", "sha224", "sha256", "sha384", "sha512", "b2", "ck")
    },
}


def names_from_a_list(argv: Sequence[str]) -> ShellVerdict | None:
    """Why ``argv`` may not run when it takes the names of the files it reads from a list (None when not)."""
    if not argv:
        return None
    name = program_name(argv[0])
    listed = _NAMES_FROM_A_LIST.get(name)
    if not listed:
        return None
    longs = [o for o in listed if o.startswith("--") or name == "find"]
    letters = {o[1] for o in listed if not o.startswith("--") and name != "find"}
    for arg in argv[1:]:
        if arg == "--":
            break
        option = arg.split("=", 1)[0]
        hit = next((o for o in longs if len(option) > 2 and o.startswith(option)), None)
        if hit is None and arg.startswith("-") and not arg.startswith("--") and letters & set(arg[1:]):
            hit = f"-{sorted(letters & set(arg[1:]))[0]}"
        if hit is not None:
            return _no(
                f"{posixpath.basename(argv[0])} {hit} reads the names of the files to work on from a list, whose "
                "names Kiwi does not check",
                "name the files on the command line",
            )
    return None


def _destination(name: str, parsed: _Parsed) -> str | None:
    """The folder ``mv`` moves into (its -t value, else its last operand): written into, not moved away."""
    if name != "mv":
        return None
    targets = [v for _, k, v in parsed.values if k == "write"]
    return targets[-1] if targets else (parsed.operands[-1] if parsed.operands else None)
