"""The worker's checks of a ``shell.run`` command on disk, before it runs: each path it names resolved
with links followed and checked against the run's grants again, folders read or changed whole, links and
hard links in the way, and the Landlock wall set for it."""

from __future__ import annotations

import dataclasses
import json
import os
import posixpath
import secrets
import shutil
import stat
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from temporalio.exceptions import ApplicationError

from activities import confinement, gitnamed
from activities.filesystem import confine, refuse_layout_on_the_way, refuse_named
from activities.process import child_env, run_process
from kiwi.contracts import CommandRequest
from kiwi.errors import PermissionDenied, ToolFailed
from kiwi.globs import first_match
from kiwi.protected import granted as protected_granted
from kiwi.protected import protected_root
from kiwi.shellpolicy import (
    FIND_GRANTABLE,
    LinkMoves,
    PathArgument,
    ShellVerdict,
    denied_inside,
    down_and_up,
    folder_uses,
    inside_refusal,
    link_moves,
    modeled_program,
    names_from_a_list,
    path_arguments,
    program_name,
    protected_inside,
    tree_granted,
    unchecked_names,
    ungranted_below,
)


def _parse_output(stdout: str) -> Any:
    marker = stdout.rfind("\n__KIWI_RESULT__")
    if marker >= 0:
        return json.loads(stdout[marker + len("\n__KIWI_RESULT__") :])
    text = stdout.strip()
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _stamp() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + secrets.token_hex(3)


def _denied(message: str) -> ApplicationError:
    return PermissionDenied.error(message)


def _real_relative(root: str, rel: str) -> str | None:
    """``rel`` with every symlink resolved, relative to the real project root; None if it leaves it.

    A path that does not exist yet is resolved through its nearest existing folder.
    """
    real_root = os.path.realpath(root)
    real = os.path.realpath(os.path.join(real_root, rel))
    if real != real_root and not real.startswith(real_root + os.sep):
        return None
    return os.path.relpath(real, real_root).replace(os.sep, "/")


def physical(req: CommandRequest, path: PathArgument) -> str | None:
    """Where ``path`` is on disk, as the program will open it, relative to the real project root (None: out
    of it). From the argument as given, against the command's cwd: the kernel takes `..` after a link from
    where the link leads (`X/X/../../outside` with X a link to `.` left the project though its text stays
    in it), and `\\` is part of a name here, not a separator (`a\\b/../../x`)."""
    if path.in_repository:
        return _real_relative(req.project_root, path.rel)
    real_root = os.path.realpath(req.project_root)
    cwd = os.path.normpath(req.cwd or ".")
    real = os.path.realpath(os.path.join(real_root, cwd, path.raw))
    if real != real_root and not real.startswith(real_root + os.sep):
        return None
    return os.path.relpath(real, real_root).replace(os.sep, "/")


def _is_folder(root: str, rel: str) -> bool:
    """Whether ``rel`` is a folder of the project on disk (no link at its end)."""
    try:
        return stat.S_ISDIR(os.lstat(os.path.join(os.path.realpath(root), rel)).st_mode)
    except OSError:
        return False


def _git_subcommand(argv: list[str]) -> str:
    """The subcommand of a git command (``''`` for another program): its first word that is no option, as the
    options git may have before it take no value (kiwi.shellpolicy.git's _GIT_GLOBAL_OK)."""
    if program_name(argv[0]) != "git":
        return ""
    return next((w for w in argv[1:] if w[:1] != "-"), "")


def _index_only(argv: list[str]) -> bool:
    """Whether ``argv`` is `git restore --staged` without `--worktree`, which writes git's index alone (review
    s29: unstaging a folder was refused as rewriting it). Every abbreviation of either option counts as it."""
    words = argv[1:]
    if _git_subcommand(argv) != "restore":
        return False
    staged = worktree = False
    for word in words[: words.index("--")] if "--" in words else words:
        if word.startswith("--"):
            key = word.partition("=")[0]
            staged |= len(key) > 2 and "--staged".startswith(key)
            worktree |= len(key) > 2 and "--worktree".startswith(key)
        elif word.startswith("-"):
            letters = word[1:].split("s", 1)[0]  # (after s, its revision)
            staged |= "S" in letters
            worktree |= "W" in letters
    return staged and not worktree


def _git_moves_into(req: CommandRequest, sources: list[PathArgument], target: PathArgument) -> None:
    """`git mv SOURCE... FOLDER` writes FOLDER/NAME for each source (a folder moved, all below it): each checked
    against the write grants, as cp's and mv's are (review s29)."""
    into = physical(req, target)
    if into is None or not _is_folder(req.project_root, into):
        return
    for source in sources:
        real = physical(req, source) or source.rel
        landed = posixpath.join(into, posixpath.basename(real))
        whole = _is_folder(req.project_root, real)
        if (whole and not tree_granted(landed, req.write_grants)) or protected_granted(
            req.write_grants, landed
        ) is None:
            raise _denied(f"'{source.raw}' would be moved to '{landed}', which this run may not write")


async def _deleted_folders(
    req: CommandRequest, paths: list[PathArgument], cwd: str, env: dict[str, str]
) -> None:
    """A path git rewrites that is no folder on disk (git may bring one back) is checked as the folder it is in
    git's index or in a commit the command names (HEAD, `--source`, `-sREV`, `checkout REV --`), which a grant
    must cover whole, and else as the file it is (review s29: `git restore src`, src deleted, under `write *`)."""
    if not req.write_grants:
        return
    # Every path that is no folder on disk: a file there may stand where git would bring a folder back (review
    # s29: `touch src`, then `git restore src` wrote all of src/ under `write *`).
    missing = [p for p in paths if p.pathspec and not _is_folder(req.project_root, physical(req, p) or p.rel)]
    if not missing or _index_only(req.argv):
        return
    before = req.argv[1 : req.argv.index("--")] if "--" in req.argv else req.argv[1:]
    revisions = ["HEAD"]
    for index, word in enumerate(before):
        following = before[index + 1] if index + 1 < len(before) else ""
        if word == "--source":
            revisions.append(following)
        elif word.startswith("--source="):
            revisions.append(word.partition("=")[2])
        elif word.startswith("-") and not word.startswith("--") and "s" in word:
            # (-s REV, -sREV, -WsREV: any cluster holding s, the rest of it or the next word its revision;
            # a word read so that is none costs a listing that finds nothing.)
            revisions.append(word[word.index("s") + 1 :] or following)
    if "--" in req.argv and _git_subcommand(req.argv) == "checkout":
        # Every word before `--` that is no option: the revision, or an option's value (`--conflict merge REV`
        # hid REV when only the first was taken: review s29), which costs a listing that finds nothing.
        revisions += [w for w in before[before.index("checkout") + 1 :] if w[:1] != "-"]
    for path in missing:
        spec = posixpath.normpath(path.raw).rstrip("/")
        listings = [["git", "ls-files", "-z", "--", spec]] + [
            ["git", "ls-tree", "-r", "-z", "--name-only", rev, "--", spec]
            for rev in dict.fromkeys(revisions)
            if rev and not rev.startswith("-")
        ]
        for argv in listings:
            listed = await run_process(
                argv,
                cwd=cwd,
                timeout=30,
                max_output=10_000_000,
                env=env,
                direct=True,
                project=req.project_root,
            )
            if any(name.startswith(spec + "/") for name in listed.stdout.split("\0")):
                if not tree_granted(physical(req, path) or path.rel, req.write_grants):
                    raise _denied(
                        f"'{path.raw}' is a folder git would write whole, and no write grant covers everything "
                        f"below '{path.rel}'"
                    )
                break


def _hard_linked(root: str, rel: str) -> bool:
    """Whether ``rel`` is a regular file with more than one name (`ln src/a.txt out/h` made out/h src/a.txt)."""
    try:
        info = os.lstat(os.path.join(os.path.realpath(root), rel))
    except OSError:
        return False
    return stat.S_ISREG(info.st_mode) and info.st_nlink > 1


def recheck_paths(req: CommandRequest, paths: list[PathArgument]) -> None:
    """The workflow checked the arguments lexically; here each is checked again where it is on disk
    (physical), so a link in the project pointing at /etc (or at a file the grant does not cover), or a `..`
    after one, is refused."""
    specs = [] if _index_only(req.argv) else [p for p in paths if p.pathspec]
    moving = _git_subcommand(req.argv) == "mv"
    if moving and len(specs) > 1:
        _git_moves_into(req, specs[:-1], specs[-1])

    def whole_pathspecs(path: PathArgument, real: str) -> bool:
        """Whether git rewrites everything below ``path``: a folder on disk (one git would bring back is found
        by _deleted_folders); for `git mv`, a folder it moves, and the place it moves one to."""
        if not specs:
            return False  # (`git restore --staged` alone: the index, no file of the working tree)
        if moving and path is specs[-1] and len(specs) > 1:
            return not _is_folder(req.project_root, real) and any(
                _is_folder(req.project_root, physical(req, p) or p.rel) for p in specs[:-1]
            )
        return _is_folder(req.project_root, real)

    for path in paths:
        real = physical(req, path)
        what = "the command's cwd" if path is paths[0] else f"'{path.raw}'"
        if (named := first_match(req.deny_fs, path.rel)) is not None:
            # (The run refused it already; checked here too, as every other path is.)
            raise _denied(f"{what} is '{path.rel}', which this run denies ('{named}')")
        if real is None:
            raise _denied(f"{what} resolves (through a symbolic link or `..`) to a place outside the project")
        if path.mode == "write" and _hard_linked(req.project_root, real):
            raise _denied(
                f"{what} is a file with other names (hard links): writing it writes them, where this run may "
                "not be allowed to write"
            )
        if path.mode == "read" and req.deny_fs and _hard_linked(req.project_root, real):
            raise _denied(
                f"{what} is a file with other names (hard links), and this run denies paths: one of its "
                "names may be one of them"
            )
        if not (req.read_grants or req.write_grants):
            continue
        grants = req.read_grants if path.mode == "read" else req.write_grants
        if (path.tree or (path.pathspec and whole_pathspecs(path, real))) and not tree_granted(real, grants):
            # (Whatever the run decided: review s29, `rm -r src` under `write src`, the folder alone.)
            raise _denied(
                f"{what} is a folder the command {path.mode}s whole, and no {path.mode} grant covers everything "
                f"below '{real}'"
            )
        if path.probe and _is_folder(req.project_root, posixpath.dirname(real) or "."):
            # FOLDER/NAME cp, mv or ln writes into a folder: the run checked the folder (review s29: `cp
            # notes/a .` under `write .`, the root folder alone, wrote ./a).
            if protected_root(real) is None and _backup_of_a_folder(req, paths, path):
                continue  # (`cp -b src/a out/`: a backup of out, out~, is made only where out is no folder)
            if protected_granted(grants, real) is None:
                raise _denied(f"{what} would be written as '{real}', which this run may not write")
            continue
        if real == path.rel:
            continue
        if path.mode == "write" and path.tree and (inside := protected_inside(real, req.write_grants)):
            # (`cp -r stage/. d`, d a link to the project's root, wrote the protected places there: review s28.)
            raise _denied(
                f"{what} resolves (through a symbolic link or `..`) to '{real}', which contains the protected "
                f"place '{inside}'"
            )
        denied = first_match(req.deny_fs, real)
        if denied is not None or protected_granted(grants, real) is None:
            raise _denied(
                f"{what} resolves (through a symbolic link or `..`) to '{real}', which this run may not "
                f"{path.mode}" + (f" (denied by '{denied}')" if denied else "")
            )


def _backup_of_a_folder(req: CommandRequest, paths: list[PathArgument], probe: PathArgument) -> bool:
    """Whether ``probe`` is the backup name of a destination that is a folder (DEST + a suffix, DEST written,
    no probe): cp, mv and ln write into a folder, and back up what they replace there (probed as DEST/NAME +
    the suffix), never the folder itself."""
    for path in paths[1:]:
        if path.mode == "write" and not path.probe and _is_folder(req.project_root, path.rel):
            head = path.raw.rstrip("/")
            if head and probe.raw.startswith(head) and "/" not in probe.raw[len(head) :]:
                return True
    return False


def _checked_cwd(
    req: CommandRequest,
) -> tuple[Path, list[PathArgument], bool, list[gitnamed.Named] | None]:
    """The command's working folder, the paths it names (once each is checked against its grants on disk),
    whether Kiwi models its program, and the places git's settings name when it read them. (The programs of every refused list, LATER_REFUSED's too, are refused by unchecked_names, whatever the run
    decided: the run's decision may predate the rule.)"""
    cwd = confine(req.project_root, req.cwd or ".", ["**"], [])
    if "/" in req.argv[0] or "\\" in req.argv[0]:
        # (The run refuses it too: a path runs the file it names, a program of the project's: review s30.)
        raise _denied(f"'{req.argv[0]}': give the command by name, not by path")
    if (unchecked := unchecked_names(req.argv, req.cwd or ".", req.write_grants)) is not None:
        raise _denied(f"{unchecked.reason} ({unchecked.hint})")
    modeled = _modeled(req)  # (a PATH lookup: once a command)
    _unmodeled_needs_the_wall(req, modeled)
    paths = path_arguments(req.argv, cwd=req.cwd or ".", options_granted={"*": FIND_GRANTABLE}, probes=True)
    if isinstance(paths, ShellVerdict):
        raise _denied(paths.reason)
    recheck_paths(req, paths)
    if (moves := link_moves(req.argv)) is not None:
        if moves.below and program_name(req.argv[0]) == "cp":  # (cp -r, -a: folders copied whole)
            _no_link_in_the_way(req, [p for p in paths[1:] if p.mode == "write"])
        _links_land_where_they_may(req, moves)
    if program_name(req.argv[0]) == "chmod":
        _no_hard_link_below(req, [p for p in paths[1:] if p.mode == "write" and p.tree])
    if program_name(req.argv[0]) == "rg":
        _no_ignore_file_elsewhere(req, [p for p, verb, _ in folder_uses(req.argv, paths) if verb == "reads"])
    if (listed := names_from_a_list(req.argv)) is not None:  # (whatever the run decided: LIST_FILES)
        raise _denied(listed.reason)
    _check_folders(req, paths)
    written = _written(req, paths, modeled)
    refuse_layout_on_the_way(req.project_root, written, req.write_grants)
    # (A folder written is written whole: `rm -r scripts`, `cp -r stage/. .`; but git's, which writes what it
    # tracks there, `git checkout B` of the whole project: one of them it writes is held read-only for it.)
    whole = program_name(req.argv[0]) != "git"
    named = refuse_named(req.project_root, [(rel, raw, whole) for rel, raw in written], req.write_grants)
    return cwd, paths, modeled, named


def _written(req: CommandRequest, paths: list[PathArgument], modeled: bool) -> list[tuple[str, str]]:
    """(where on disk, as given) for each path a program Kiwi models writes (none for one it does not model:
    its words are reads, and the wall and nested_places keep what it writes)."""
    if not modeled:
        return []
    return [(real, p.raw) for p in paths[1:] if p.mode.startswith("write") and (real := physical(req, p))]


def _modeled(req: CommandRequest) -> bool:
    """Whether the command's program is one Kiwi models: by its exact name, found outside the project (a PATH
    entry into the project finds a program the agent may have written: review s30)."""
    if not modeled_program(req.argv[0]):
        return False
    found = shutil.which(
        req.argv[0], path=child_env(req.env, project=req.project_root).get("PATH", os.defpath)
    )
    return found is None or _real_relative(req.project_root, found) is None


def _unmodeled_needs_the_wall(req: CommandRequest, modeled: bool) -> None:
    """Refuse a program Kiwi does not model (one a signed directive names: Kiwi reads its words as reads and
    knows no option of it that writes or starts a program) where the kernel confines no command: the checks
    cannot say what it does, and behind no wall it may start any program or write any file its user may
    (review s29: the long tail of programs that start others). The programs Kiwi models run as before."""
    if modeled or confinement.available():
        return
    off = confinement.mode() == "off"
    why = (
        "KIWI_CONFINE=off"
        if off
        else "Landlock is Linux's"
        if not sys.platform.startswith("linux")
        else ("this kernel has no Landlock")
    )
    fix = (
        "unset KIWI_CONFINE where the worker runs (auto confines where the kernel can)"
        if off
        else "run the worker on Linux 5.13 or newer with Landlock enabled"
    )
    raise _denied(
        f"'{os.path.basename(req.argv[0])}' is not a program Kiwi models, and this worker confines no command "
        f"({why}): a program whose options and writes Kiwi does not read runs only inside the kernel's wall "
        f"({fix}, `kiwi doctor` says which holds; or use a local tool, or a program Kiwi models)"
    )


# How many entries below a folder the worker looks at for a denied path before it refuses the command.
DENIED_WALK_LIMIT = 200_000


def _check_folders(req: CommandRequest, paths: list[PathArgument]) -> None:
    """Refuse a command that reads, moves, deletes or changes a whole folder below which a path the run denies
    is (shellpolicy.folder_uses), whatever the run decided: each folder as named and as it resolves (grep -r
    follows a link it is given), the denials whose first segment names a place by their patterns, every
    denial by what is on disk (`**/.env` refuses `grep -r KEY src` only where src holds a .env)."""
    uses = folder_uses(req.argv, paths, {"*": FIND_GRANTABLE})
    if not uses:
        return
    real = [dataclasses.replace(p, rel=physical(req, p) or p.rel) for p in paths]
    for checked in (paths, real):
        if checked is real:
            uses = folder_uses(req.argv, checked, {"*": FIND_GRANTABLE})
        # (Whatever the run decided: review s29, `grep -r KEY .` under `read .`, the root folder alone.)
        if (req.read_grants or req.write_grants) and (
            problem := ungranted_below(req.argv, checked, req.read_grants, uses=uses)
        ) is not None:
            raise _denied(problem.reason)
        if not req.deny_fs and not any(depth is not None for _, _, depth in uses):
            continue  # (only diff follows the links in a folder it reads: see _denied_below)
        if (problem := denied_inside(req.argv, checked, req.deny_fs, uses=uses)) is not None:
            raise _denied(problem.reason)
        for p, verb, depth in uses:
            if not req.deny_fs and depth is None:
                continue
            hit = _denied_below(req.project_root, p.rel, req.deny_fs, depth, req.read_grants, verb == "reads")
            if hit is _TOO_MANY:
                raise _denied(
                    f"{os.path.basename(req.argv[0])} {verb} everything below '{p.rel}', which has more than "
                    f"{DENIED_WALK_LIMIT:,} entries to look through for the paths this run denies; name a "
                    "smaller folder"
                )
            if hit is not None and hit.startswith("(the file"):
                raise _denied(
                    f"{os.path.basename(req.argv[0])} {verb} everything below '{p.rel}': {hit[1:-1]}"
                )
            if hit is not None and hit.startswith("(the link"):
                raise _denied(
                    f"{os.path.basename(req.argv[0])} {verb} the files directly in '{p.rel}' and follows their "
                    f"links: {hit[1:-1]}"
                )
            if hit is not None:
                raise _denied(inside_refusal(req.argv, p, checked, verb, hit, req.deny_fs).reason)


_TOO_MANY = "(too many entries)"


class _Walk:
    """Everything below some folders, links not followed, at most DENIED_WALK_LIMIT entries in all: past it
    the command is refused with ``too_many`` (a folder's name in its ``{}``)."""

    def __init__(self, too_many: str) -> None:
        self.too_many = too_many
        self.seen = 0

    def below(self, start: str, shown: str) -> Iterator[tuple[os.DirEntry[str], str]]:
        """Each entry below the folder ``start`` (absolute), with its path relative to ``start``."""
        pending = [(start, "")]
        while pending:
            folder, prefix = pending.pop()
            try:
                entries = list(os.scandir(folder))
            except OSError:
                continue
            for entry in entries:
                self.seen += 1
                if self.seen > DENIED_WALK_LIMIT:
                    raise _denied(self.too_many.format(shown))
                rel = f"{prefix}/{entry.name}" if prefix else entry.name
                yield entry, rel
                if entry.is_dir(follow_symlinks=False):
                    pending.append((entry.path, rel))


def _may_write(req: CommandRequest, real_root: str, target: str) -> tuple[str | None, bool]:
    """Where ``target`` (absolute, resolved) is in the project (None: outside it), and whether the run may
    write there (not denied, within its write grants)."""
    inside = target == real_root or target.startswith(real_root + os.sep)
    led = os.path.relpath(target, real_root).replace(os.sep, "/") if inside else None
    if led is None or first_match(req.deny_fs, led) is not None:
        return led, False
    return led, not (req.read_grants or req.write_grants) or protected_granted(
        req.write_grants, led
    ) is not None


def _several_names(entry: os.DirEntry[str]) -> bool:
    return entry.is_file(follow_symlinks=False) and entry.stat(follow_symlinks=False).st_nlink > 1


def _links_land_where_they_may(req: CommandRequest, moves: LinkMoves) -> None:
    """A link moved or copied as a link (mv, cp -r/-a/-d, a hard ln of a link) keeps its text, which is read
    from where it lands: each must lead, from there, to a place the run may write (a link ln -s makes: may
    read). (A link made in out/a/b with its text leading to out/x, moved to out/, led out of the project.)
    Every check is made before the program runs, and it takes its operands in order, so a later operand
    could go through a link an earlier one put in place (`cp -r A B out` wrote, read, and `mv`/`ln` moved or
    linked files outside the project or denied): with links among several sources, or a source that does
    not exist yet, the command is refused (one source at a time)."""
    real_root = os.path.realpath(req.project_root)
    cwd = os.path.join(real_root, os.path.normpath(req.cwd or "."))
    program = os.path.basename(req.argv[0])
    given = os.path.join(cwd, moves.into)
    into = os.path.realpath(given)
    named = moves.named or (moves.named_if_link and os.path.islink(given))
    folder = (moves.folder or os.path.isdir(into)) and not named
    walk = _Walk(
        f"'{{}}' has more than {DENIED_WALK_LIMIT:,} entries to look through for links it would move"
    )

    def check(landing: str, text: str, shown: str, may: str) -> None:
        if down_and_up(text):
            # (`L -> q/../x` with q a link moved along: where it leads once moved is not known before.)
            raise _denied(
                f"'{shown}' is a symbolic link whose text ('{text}') goes into a folder and back up: where it "
                f"leads once {program} has moved it is not known before; a link keeps its text wherever it goes"
            )
        target = os.path.realpath(os.path.join(os.path.dirname(landing), text))
        led, writable = _may_write(req, real_root, target)
        if may == "read":
            readable = not (req.read_grants or req.write_grants) or (
                led is not None and protected_granted(req.read_grants, led) is not None
            )
            allowed = led is not None and first_match(req.deny_fs, led) is None and readable
        else:
            allowed = writable
        if not allowed:
            where = os.path.relpath(landing, real_root).replace(os.sep, "/")
            raise _denied(
                f"'{shown}' is a symbolic link ('{text}'); at '{where}', where {program} puts it, it leads "
                + ("out of the project" if led is None else f"to '{led}', where this run may not {may}")
                + "; a link keeps its text wherever it goes"
            )

    def links_below(here: str, there: str, source: str) -> list[tuple[str, str, str]]:
        """(landing, text, shown) of each link below the folder ``here``, put at ``there``."""
        return [
            (
                os.path.join(there, rel),
                os.readlink(entry.path),
                os.path.relpath(entry.path, real_root).replace(os.sep, "/"),
            )
            for entry, rel in walk.below(here, source)
            if entry.is_symlink()
        ]

    def landing_of(source: str, named: str) -> str:
        if not folder:
            return os.path.join(os.path.realpath(os.path.dirname(given)), os.path.basename(given))
        if moves.parents:
            return os.path.join(into, os.path.normpath(source))
        return os.path.join(into, os.path.basename(named))

    if moves.made:
        for text in moves.sources:  # (ln -s TEXT...: the new link's text is the operand itself)
            landing = os.path.join(cwd, "-") if moves.relative else landing_of(text, text.rstrip("/") or text)
            check(landing, text, text, "read")
        return
    several = len(moves.sources) > 1
    for source in moves.sources:
        named = os.path.join(cwd, source.rstrip("/") or source)
        here = os.path.join(os.path.realpath(os.path.dirname(named)), os.path.basename(named))
        landing = landing_of(source, named)
        if several and not os.path.lexists(here):
            raise _denied(
                f"'{source}' does not exist before {program} runs (an earlier operand would make it); give "
                f"{program} one source at a time"
            )
        if os.path.islink(here):
            # (`cp -r L/ DEST`: the slash makes cp follow L, as -H does.)
            followed = moves.below and os.path.isdir(here) and (moves.follows or source.endswith("/"))
            links = [(landing, os.readlink(here), source)] if moves.top and not source.endswith("/") else []
            if followed:  # (the folder it leads to, copied whole)
                links += links_below(os.path.realpath(here), landing, source)
        elif moves.below and os.path.isdir(here):
            links = links_below(here, landing, source)
        else:
            links = []
        if links and several:
            raise _denied(
                f"'{links[0][2]}' is a symbolic link {program} would move or copy among several sources: a "
                "later one can go through it where it lands, and every check is made before the command "
                f"runs; give {program} one source at a time"
            )
        for landed, text, shown in links:
            check(landed, text, shown, "write")


def _no_link_in_the_way(req: CommandRequest, written: list[PathArgument]) -> None:
    """``cp -r`` into a folder that exists writes every file below it through any link already there: each
    link below each such folder must lead to a place the run may write (a link moved into out/src, its text
    leading out of the project, took `cp -r src out`'s write outside), and no file there may have other
    names (writing it writes them)."""
    real_root = os.path.realpath(req.project_root)
    walk = _Walk(f"cp copies folders into '{{}}', which has more than {DENIED_WALK_LIMIT:,} entries to look "
                 "through for links in the way; name a smaller folder")  # fmt: skip
    for path in written:
        start = physical(req, path)
        if start is None or not os.path.isdir(os.path.join(real_root, start)):
            continue
        for entry, _ in walk.below(os.path.join(real_root, start), path.raw):
            name = os.path.relpath(entry.path, real_root).replace(os.sep, "/")
            if entry.is_symlink():
                led, writable = _may_write(req, real_root, os.path.realpath(entry.path))
                if not writable:
                    raise _denied(
                        f"cp copies folders into '{path.raw}', which holds the link '{name}' leading "
                        + (
                            "out of the project"
                            if led is None
                            else f"to '{led}', where this run may not write"
                        )
                        + ": cp writes through a link in its way"
                    )
            elif _several_names(entry):
                raise _denied(
                    f"cp copies folders into '{path.raw}', which holds '{name}', a file with other names "
                    "(hard links): cp writes into it, and so into them"
                )


def _no_hard_link_below(req: CommandRequest, changed: list[PathArgument]) -> None:
    """chmod -R changes every file below a folder, and a file with other names (hard links) is one file:
    changing it changes them, wherever they are."""
    real_root = os.path.realpath(req.project_root)
    walk = _Walk(f"'{{}}' has more than {DENIED_WALK_LIMIT:,} entries to look through for files with other "
                 "names; name a smaller folder")  # fmt: skip
    for path in changed:
        start = physical(req, path)
        if start is None:
            continue
        for entry, _ in walk.below(os.path.join(real_root, start), path.raw):
            if _several_names(entry):
                name = os.path.relpath(entry.path, real_root).replace(os.sep, "/")
                raise _denied(
                    f"'{path.raw}' holds '{name}', a file with other names (hard links): changing it "
                    "changes them, where this run may not be allowed to"
                )


_IGNORE_FILES = (".ignore", ".rgignore", ".gitignore")


def _no_ignore_file_elsewhere(req: CommandRequest, folders: list[PathArgument]) -> None:
    """rg reads an ignore file in every folder it searches and in the folders above (its lines printed in
    its errors, and each one hides the names it matches): none of them may be a link or a file with other
    names (a link out/.ignore made to lead to config/prod.env printed the denied file's lines)."""
    real_root = os.path.realpath(req.project_root)
    walk = _Walk(f"rg searches '{{}}', which has more than {DENIED_WALK_LIMIT:,} entries to look through for "
                 "ignore files; name a smaller folder")  # fmt: skip

    def check(folder: str, name: str) -> None:
        try:
            info = os.lstat(os.path.join(folder, name))
        except OSError:
            return
        if stat.S_ISLNK(info.st_mode) or info.st_nlink > 1:
            shown = os.path.relpath(os.path.join(folder, name), real_root).replace(os.sep, "/")
            raise _denied(
                f"rg reads the ignore file '{shown}', which is a link or a file with other names: it may be "
                "a file this run may not read"
            )

    for path in folders:
        start = physical(req, path)
        if start is None:
            continue
        folder = os.path.join(real_root, start) if start != "." else real_root
        for name in _IGNORE_FILES:
            check(folder, name)
        here = folder
        while here != real_root:  # (the folders above it, up to the project's root)
            here = os.path.dirname(here)
            for name in _IGNORE_FILES:
                check(here, name)
        for entry, _ in walk.below(folder, path.raw):
            if entry.is_dir(follow_symlinks=False):
                for name in _IGNORE_FILES:
                    check(entry.path, name)


def _denied_below(
    root: str,
    rel: str,
    deny: list[str],
    depth: int | None,
    grants: list[str] | None = None,
    reads: bool = True,
) -> str | None:
    """The first denial that matches a path below the folder ``rel`` on disk (links not followed), or None;
    a folder with more than DENIED_WALK_LIMIT entries is refused whole. A read of the files directly in a
    folder (``depth`` given: diff, which follows the links there) also meets each link where it leads: out of
    the project, or to a place the run may not read (``grants``), it is a hit."""
    real_root = os.path.realpath(root)
    start = os.path.join(real_root, rel) if rel != "." else real_root
    if not os.path.isdir(start) or os.path.islink(start):
        return None
    seen = 0
    pending: list[tuple[str, str, int]] = [(start, "" if rel == "." else rel, 0)]
    while pending:
        folder, prefix, level = pending.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            seen += 1
            if seen > DENIED_WALK_LIMIT:
                return _TOO_MANY
            name = f"{prefix}/{entry.name}" if prefix else entry.name
            hit = first_match(deny, name)
            if hit is not None:
                return hit
            if reads and deny and _several_names(entry):
                return f"(the file {name}, which has other names (hard links): one may be a path this run denies)"
            if depth is not None and entry.is_symlink():
                target = os.path.realpath(entry.path)
                if target != real_root and not target.startswith(real_root + os.sep):
                    return f"(the link {name}, which leads out of the project)"
                led = os.path.relpath(target, real_root).replace(os.sep, "/")
                hit = first_match(deny, led)
                if hit is not None or (grants and protected_granted(grants, led) is None):
                    return hit or f"(the link {name}, which leads to '{led}', a place this run may not read)"
            if (depth is None or level + 1 < depth) and entry.is_dir(follow_symlinks=False):
                pending.append((entry.path, name, level + 1))
    return None


def _confinement(req: CommandRequest, into: str = "", nested: Iterable[str] = ()) -> tuple[int, Any] | None:
    """How the command's program is confined (``activities/confinement.py``); None where it cannot be.
    ``into``: the one folder it may write (an archive unpacked into Kiwi's staging folder); ``nested``: the
    places below what the program may write whole (nested_places) or writes (layouts_around), held read-only
    for it."""
    abi = confinement.available()
    if abi:
        places = confinement.hidden_places(os.path.realpath(req.project_root))  # (once: both below use them)
        if linked := confinement.unread_elsewhere(req.project_root, places):
            raise _denied(
                f"'{linked}' has another name in the project (a hard link), by which a command could read it; "
                "a human removes the other name (find . -samefile " + linked + ")"
            )
        return abi, lambda program, temp: confinement.shell_rules(req, program, temp, into, places, nested)
    if confinement.mode() == "required":
        raise ToolFailed.error(
            "shell commands must be confined (KIWI_CONFINE=required) and this worker's kernel has no Landlock",
            {"hint": "run the worker on Linux 5.13 or newer with Landlock enabled, or set KIWI_CONFINE=auto"},
        )
    return None
