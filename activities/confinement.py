"""What a ``shell.run`` program may touch, enforced by the kernel (``kiwi/landlock.py``).

The shell policy (``kiwi/shellpolicy/``) and the worker's checks on disk decide whether a command runs, on a
model of what the program will do, before it runs. The confinement is the wall behind them, set up by the
kernel for the program and everything it starts, and checked at each use:

- reads: below the literal part of each read and write grant (``src/**`` gives ``src``, ``*.md`` the
  project), inside the project, never through a link, and not the repository's settings or Kiwi's
  configuration (``.git/config``, its submodules' and worktrees' and a separate git folder's, ``.ai/config``:
  hidden_places) unless the grant names them; the project when the run names no grant;
- writes (create, change, remove, rename, link): below the literal part of each write grant, the same way,
  never wider (a grant for one file: that file; for a folder not made yet: folders made in its nearest one);
  git reads its ``.git`` and, when the run may write at all, writes it; Kiwi's protected places at the root
  that a write rule reaches and no grant names (``write **``: ``.ai``, ``.git``, ...) are held read-only in
  a mount namespace of the command's own (held_places, kiwi/launch.py), as Landlock cannot leave them out;
- the system's programs and libraries, read only (``/usr``, ``/lib*``, ``/bin``, ``/sbin``, the few files of
  ``/etc`` programs read), ``/dev/null``, and a temporary folder of the command's own (``TMPDIR``);
- execute: the program itself and the system's ELF interpreter, nothing else (git: its own helpers and
  /bin/sh; tar: /bin/sh and the compressors; a system script: its interpreter and the system's program
  folders), so an allowed program cannot start another; nothing read from a program of the project (its #!
  line, its interpreter, its name) decides a rule;
- no signals to processes outside the command, no abstract UNIX sockets outside it, no TCP (Landlock: TCP
  from ABI 4, the rest from ABI 6); no socket at all, io_uring, IPC, keyrings, memfd, set-ID bits, limits or
  priorities of other processes, no new session, process group or namespace, no mount (seccomp,
  kiwi/landlock.py); no capability (a root worker).

Nothing else: not the worker's home, ``/proc``, the other runs' projects, Kiwi's own files. What the wall
cannot say, the checks before it still do: denials and the other protected places inside a granted folder,
globs finer than a folder (``out/*.txt``), what a program prints of what it may read (README: Security).

``KIWI_CONFINE``: ``auto`` (the default: confined where the kernel has Landlock), ``required`` (a worker
without it, or that cannot hold the protected places, refuses shell commands), ``off``.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shutil
import stat
import struct
import subprocess
import sys
from collections.abc import Iterable

from activities.setaside import (
    _AS_FOLDER,
    _AS_LINK,
    _entry,
    _is_dir,
    _is_link,
    _layout_at,
    listed_layout,
    place_identity,
)
from activities.staging import walk_tree
from kiwi import landlock
from kiwi.contracts import CommandRequest
from kiwi.globs import glob_segments
from kiwi.protected import AI_PLACES, DEV_CONFIG, GIT_DIR, ROOT_PLACES, fold, fold_path, names, protected_root
from kiwi.protected import granted as protected_granted
from kiwi.searchpath import search_path
from kiwi.shellpolicy import modeled_program, program_name, tree_granted

_SYSTEM_READ = ("/usr", "/lib", "/lib32", "/lib64", "/libx32", "/bin", "/sbin")
_ETC = (
    "/etc/ld.so.cache",
    "/etc/ld.so.preload",
    "/etc/localtime",
    "/etc/timezone",
    "/etc/passwd",
    "/etc/group",
    "/etc/nsswitch.conf",
    "/etc/locale.alias",
    "/etc/magic",
    "/etc/magic.mime",
    "/etc/mime.types",
)
_DEVICES_READ = ("/dev/zero", "/dev/urandom", "/dev/random", "/dev/full")
_COMPRESSORS = (
    "gzip",
    "bzip2",
    "xz",
    "zstd",
    "lzip",
    "lzma",
    "lzop",
    "compress",
    "unxz",
    "gunzip",
    "bunzip2",
)
_SYSTEM_PROGRAMS = ("/usr/bin", "/bin", "/usr/sbin", "/sbin", "/usr/local/bin")


def mode() -> str:
    """``KIWI_CONFINE`` as the worker reads it: auto, required or off."""
    value = os.environ.get("KIWI_CONFINE", "auto").strip().lower() or "auto"
    if value not in ("auto", "required", "off"):
        raise ValueError(f"KIWI_CONFINE={value!r}: use auto, required or off")
    return value


def available() -> int:
    """The Landlock ABI shell commands are confined with (0: they are not)."""
    return 0 if mode() == "off" else landlock.abi_version()


def literal_part(pattern: str) -> str:
    """The folder or file a grant's pattern starts with, before its first wildcard ('' for the project)."""
    kept: list[str] = []
    for segment in glob_segments(pattern):
        if "*" in segment or "?" in segment or segment == "..":
            break
        kept.append(segment)
    return "/".join(kept)


def shell_rules(
    req: CommandRequest,
    program: str,
    temp: str,
    into: str = "",
    places: list[str] | None = None,
    nested: Iterable[str] = (),
) -> landlock.Rules:
    """The rules for ``req``'s program (``program``: its absolute path) with ``temp`` as its own folder.
    ``into``: the one folder it writes, in place of the project (an archive unpacked into Kiwi's staging
    folder, which Kiwi then writes into the project itself). ``places``: hidden_places, if already looked up.
    ``nested``: the places the command's watch found below what it may write (commands._Watch), held read-only
    for it."""
    rules = landlock.Rules()
    root = os.path.realpath(req.project_root)
    grants = bool(req.read_grants or req.write_grants)
    # (What a run may write it may read, as Kiwi's checks read a command.)
    places = hidden_places(root) if places is None else places
    for pattern in [*req.read_grants, *req.write_grants] if grants else ["**"]:
        _read_below(rules, root, literal_part(pattern), pattern, places)
    writes = [] if into else [literal_part(p) for p in req.write_grants] if grants else [""]
    if into:
        rules.allow(into, landlock.READ | landlock.WRITE)
    real = os.path.realpath(program)
    ours = _inside(real, root) or _inside(real, temp)
    # (A program of the project is none Kiwi models, whatever its name: `../bin/echo`, review s30.)
    modeled = modeled_program(program) and not ours
    for pattern, rel in zip(req.write_grants if grants else ["**"], writes, strict=False):
        if not modeled and not tree_granted(rel, [pattern]):
            # A program Kiwi does not model writes where no check of its words can say (`dd of=src/x.py`
            # under `write src/*.md`, review s29): the files the grant matches now, changed in place, no more.
            _write_matching(rules, root, rel, pattern)
        elif os.path.lexists(os.path.join(root, rel)):
            rules.allow_beneath(root, rel, landlock.WRITE)
        elif not modeled:
            # (No folder made where no watch looks: `src/.git` made under `write build/**`, then filled under
            # `write src/**`, where it was there before, review s30.)
            continue
        else:
            # Not made yet: its nearest folder may make folders (`mkdir -p build/x` for `build/**`), and the
            # next command writes in them; never files there, which would widen the grant to that folder.
            rules.allow_beneath(root, _existing(root, rel), landlock.MAKE_DIR | landlock.READ_DIR)
    # A program of the project (one the agent may have written) is no system program: nothing read from
    # it decides a rule (its #! line, its ELF interpreter, its name), and it runs with the system's loader.
    # (git by the name it runs under too: `git-receive-pack`, a link to git, is no git Kiwi checks: review s30.)
    git = not ours and os.path.basename(real) == "git" and program_name(program) == "git"
    rules.held_root, rules.held = root, held_places(root, req.write_grants if grants else ["**"], writes, git)
    # The repositories (and Kiwi projects) below what it may write, held read-only as the root's are (review
    # s30: a nested repository's settings written with an fsmonitor the human's next git there runs).
    rules.held += sorted(p for p in nested if p != ".")
    rules.held_required = mode() == "required"
    if not modeled:
        # (Landlock has no rule for a file's mode: `myinstall -m 777` made files it may not write, its user's,
        # anywhere, writable by every user of the machine, review s30. Kiwi's chmod checks its words.)
        rules.chmod_refused = 0o022
    if git:
        # Its repository (git's reading of protected places through history is its own, see README: Shell).
        for git in git_folders(root):
            rules.allow_beneath(root, git, landlock.READ | (landlock.WRITE if writes else 0))
        for folder in _GIT_CORE:
            rules.allow(folder, landlock.EXECUTE | landlock.READ)
        # No shell: what git runs through one is a command a repository's settings name (a trailer's
        # `cmd`, an alias, a merge driver), and a shell under git's rules writes the project's `.git`
        # (review s28: a nested repository's `trailer.t.cmd` wrote the root `.git/config` a `core.fsmonitor`
        # that the human's next `git status` ran). So git's script strategies (octopus, resolve) fail here.
    _every_program(rules, temp)
    run = landlock.EXECUTE | landlock.READ_FILE
    if ours:
        # (Placed from the project's folder without following a link, as the read rules are.)
        inside, rel = (
            (root, os.path.relpath(real, root))
            if _inside(real, root)
            else (temp, os.path.relpath(real, temp))
        )
        rules.allow_beneath(inside, rel, run, file=True)
        return rules
    rules.allow(real, run, file=True)
    folder = os.path.dirname(real)
    home = os.path.realpath(os.path.expanduser("~"))
    if not (_inside(home, folder) or _inside(root, folder)):  # (never "/", the home or the project around it)
        rules.allow(folder, landlock.READ)
    if os.path.basename(real) == "tar":
        # GNU tar runs the compressor of -z, -j, -J, --zstd, ... (`gzip -d` unpacking) as `/bin/sh -c gzip`:
        # the shell and those, which is all the shell may start in turn.
        for executable, _ in _started_by("/bin/sh", root):
            rules.allow(executable, run, file=True)
        for name in ("sh", *_COMPRESSORS):
            if found := shutil.which(name, path=search_path(os.environ.get("PATH", os.defpath))):
                rules.allow(os.path.realpath(found), run, file=True)
    script = False
    for executable, kind in _started_by(real, root):
        rules.allow(executable, run, file=True)
        script = script or kind == "script"
    if script:
        # A system script (egrep runs `grep -E`) may start the system's programs, none the agent wrote.
        for folder in _SYSTEM_PROGRAMS:
            rules.allow(folder, landlock.EXECUTE | landlock.READ)
    return rules


_GIT_CORE = ("/usr/lib/git-core", "/usr/libexec/git-core", "/usr/local/libexec/git-core")


def own_git_rules(root: str, program: str, temp: str, writes: tuple[str, ...] = ()) -> landlock.Rules:
    """The rules of Kiwi's own git where it looks at the project's files (git status, diff, add, commit): it
    reads the project, writes its git folders and ``writes`` (a scratch index's folder), and executes git
    and its helpers, no shell. git looks into a repository nested in the project with that repository's own
    settings, whose filter drivers (a program to run) Kiwi does not turn off: they run nothing here."""
    rules = landlock.Rules()
    root = os.path.realpath(root)
    rules.allow(root, landlock.READ)
    for git in git_folders(root):
        rules.allow_beneath(root, git, landlock.READ | landlock.WRITE)
    for folder in writes:
        rules.allow(folder, landlock.READ | landlock.WRITE)
    run = landlock.EXECUTE | landlock.READ_FILE
    real = os.path.realpath(program)
    rules.allow(real, run, file=True)
    for executable, _ in _started_by(real, root):
        rules.allow(executable, run, file=True)
    for folder in _GIT_CORE:
        rules.allow(folder, landlock.EXECUTE | landlock.READ)
    _every_program(rules, temp)
    return rules


# How many entries below a grant's folder are looked at for the files it matches (_write_matching): past them,
# a program Kiwi does not model may write none of the rest.
MATCHING_WALK_LIMIT = 100_000


def _write_matching(rules: landlock.Rules, root: str, rel: str, pattern: str) -> None:
    """Write (change and truncate, never make, remove or rename) each regular file below ``rel`` that the
    grant ``pattern`` covers, protected places only where it names them, never through a link, and none with
    another name (a hard link: Landlock's rule holds for the file, so for every name of it, review s30)."""
    seen = 0
    top = os.path.join(root, rel)
    if os.path.islink(top):
        return  # (the rule would not be made: it is opened without following a link)
    listing = (
        walk_tree(top) if os.path.isdir(top) else iter([(os.path.dirname(top), [], [os.path.basename(top)])])
    )
    for folder, subdirs, files in listing:
        seen += len(subdirs) + len(files)
        if seen > MATCHING_WALK_LIMIT:
            return
        # (Not in a repository by its layout no grant names: `write tests/**/config` reached the config of
        # tests/fixtures/repo.git, review s31.)
        held = in_layout(root, os.path.relpath(folder, root).replace(os.sep, "/"), [pattern])
        for name in [] if held else files:
            path = os.path.relpath(os.path.join(folder, name), root).replace(os.sep, "/")
            if protected_granted([pattern], path) is None:
                continue
            try:
                if os.lstat(os.path.join(root, path)).st_nlink > 1:
                    continue
            except OSError:
                continue
            rules.allow_beneath(root, path, landlock.WRITE_FILE | landlock.TRUNCATE, file=True)


def in_layout(root: str, rel: str, grants: list[str]) -> bool:
    """Whether the folder ``rel`` or one above it is a repository by its layout that no grant names."""
    parts = [] if rel == "." else rel.split("/")
    folders = ("/".join(parts[:depth]) or "." for depth in range(len(parts) + 1))
    return any(_layout_at(root, f) and not any(names(p, f) for p in grants) for f in folders)


def _every_program(rules: landlock.Rules, temp: str) -> None:
    """What every confined program gets: the system's files it reads, ``/dev/null``, its own temporary folder
    ``temp``, and the system's ELF loaders to run it."""
    for path in _SYSTEM_READ + _ETC + _DEVICES_READ:
        rules.allow(path, landlock.READ)
    rules.allow("/dev/null", landlock.READ_FILE | landlock.WRITE_FILE | landlock.TRUNCATE)
    rules.allow(temp, landlock.READ | landlock.WRITE)
    for loader in _system_loaders():
        rules.allow(loader, landlock.EXECUTE | landlock.READ_FILE, file=True)


# Protected places at the project's root (kiwi/protected.py) that a write rule reaches when a grant's literal
# part is above them (`write **`): Landlock's rule holds for all below its folder and cannot leave them out,
# so they are held read-only for the command (kiwi/launch.py, a mount namespace of its own). `.ai` as a
# whole, unless a write grant's literal part is in it (`write .ai/knowledge/**`): then its protected places
# one by one. Only what exists is held (a file cannot be mounted on a name that is not there).
_HELD, _HELD_IN_AI = ROOT_PLACES, AI_PLACES


def held_places(root: str, patterns: list[str], writes: list[str], git: bool) -> list[str]:
    """The places of _HELD (and of _HELD_IN_AI) that a write rule below ``writes`` (the literal parts of the
    write grants ``patterns``) reaches, no grant names, and that are there; ``.git`` is git's own when
    ``git``."""

    def reached(place: str) -> bool:
        return any(
            not rel or fold_path(place) == fold_path(rel) or fold_path(place).startswith(fold_path(rel) + "/")
            for rel in writes
        )

    def free(place: str) -> bool:
        return reached(place) and not any(names(p, place) for p in patterns)

    inside_ai = any(fold_path(rel) == ".ai" or fold_path(rel).startswith(".ai/") for rel in writes)
    places = [p for p in _HELD if not (p == ".ai" and inside_ai) and not (p == GIT_DIR and git)]
    if inside_ai:
        places += _HELD_IN_AI
    return [p for p in places if free(p) and os.path.lexists(os.path.join(root, p))]


# Protected places the kernel cannot hold where they are not made yet (a place is held by mounting on it):
# looked for after each shell command, and set aside when the command made one (review s28: routes the checks
# missed made `.kiwi`, `.ai/config` and `temporal-dev.yml`). Not the places Kiwi itself makes while a command
# may run (`.ai/logs`, `.ai/.cache`, a directive or a proposal an agent saves through Kiwi).
# And `.ai` made a link (`ln -s stage .ai` where there was no `.ai`: Kiwi then read the harness and trusted keys
# of a folder the agent writes, review s28): set aside as a link only, a folder `.ai` being the project's.
WATCHED = (GIT_DIR, ".kiwi", DEV_CONFIG, ".ai/config", ".ai/tools", ".ai/scripts")


def not_made(root: str, patterns: list[str]) -> list[str]:
    """The places of WATCHED that are not in ``root`` and that no write grant (``patterns``) names, and `.ai`
    when it is no link."""
    missing = []
    for place in (*WATCHED, *_AS_FOLDER):
        if any(names(p, place) for p in patterns):
            continue
        found = _entry(root, place)
        if found is None:
            missing.append(place)
        else:
            os.close(found[0])
    if not _is_link(root, _AS_LINK):
        missing.append(_AS_LINK)
    return missing


# How many entries below the folders a program Kiwi does not model may write whole are looked at for the
# repositories and Kiwi projects it could make there (nested_places); past them, such a program is refused in
# that project (and for a program Kiwi models, only what it writes and the folders above are looked at).
NESTED_WALK_LIMIT = 200_000


def whole_write_folders(req: CommandRequest) -> list[str]:
    """The folders the wall lets a program Kiwi does not model write whole (shell_rules): each write grant's
    literal part where the grant covers all below it ('' for the project)."""
    if not (req.read_grants or req.write_grants):
        return [""]
    return [rel for p in req.write_grants if tree_granted(rel := literal_part(p), [p])]


def write_folders(req: CommandRequest) -> list[str]:
    """The folders the wall lets a program Kiwi models write (shell_rules): each write grant's literal part
    that is a folder ('' for the project)."""
    if not (req.read_grants or req.write_grants):
        return [""]
    root = os.path.realpath(req.project_root)
    return list(
        dict.fromkeys(rel for p in req.write_grants if _is_dir(os.path.join(root, rel := literal_part(p))))
    )


def nested_places(
    root: str, folders: list[str], grants: list[str], limit: int | None = NESTED_WALK_LIMIT
) -> dict[str, tuple[int, ...]] | None:
    """The places below ``folders`` of the project whose settings a human's tools obey, each with its identity
    (device, inode), None past ``limit`` entries (None: no limit). A program Kiwi does not model, writing a
    folder whole, can make one where no word of its command shows it (`jar xf`, `iconv -co.git`: review s30):
    - every entry named `.git` (as a case-insensitive filesystem sees names), the project's own left out, and
      nothing below one looked at; the git folder a `.git` file points to in the project (`gitdir: ../gd`);
    - every folder that is a git repository by its layout (filesystem.repository_layout: HEAD, objects/,
      refs/), named by a write grant or not (filesystem.layout_named: review s30 F6, s31 F3);
    - a `.ai` folder or a `temporal-dev.yml` below the root: `kiwi` run there takes them for its project's
      (review s30: `sub/.ai/config` made by a program writing sub/ whole);
    - every folder that cannot be listed (git needs no listing to use a `.git` in it).
    A folder renamed above one and one made in its old place is another (review s30)."""
    found: dict[str, tuple[int, ...]] = {}
    seen = 0

    def note(rel: str, layout: bool = False) -> None:
        identity = place_identity(root, rel, layout)
        if identity is not None:
            found[rel] = identity

    for folder in dict.fromkeys(folders):
        top = os.path.join(root, folder)
        if os.path.islink(top) or not os.path.isdir(top):
            continue
        unlisted: list[str] = []
        for at, subdirs, files in walk_tree(top, unlisted):
            seen += len(subdirs) + len(files)
            if limit is not None and seen > limit:
                return None
            rel = os.path.relpath(at, root).replace(os.sep, "/")
            entries = {fold(name) for name in [*subdirs, *files]}
            headed = any(name.casefold() == "head" for name in files)
            if listed_layout(entries, headed):
                note(rel, layout=True)  # (named by a grant or not: the caller asks layout_named)
            for name in [*subdirs, *files]:
                path = name if rel == "." else f"{rel}/{name}"
                if fold(name) == GIT_DIR and not (rel == "." and name == GIT_DIR):
                    note(path)
                    pointed = None if name in subdirs else gitdir_file(at)
                    if pointed and _inside(pointed, root) and pointed != root:
                        note(os.path.relpath(pointed, root).replace(os.sep, "/"))
                elif (
                    rel != "."
                    and fold(name) in (".ai", DEV_CONFIG)
                    and not any(names(p, path) for p in grants)
                ):
                    note(path)
            subdirs[:] = [d for d in subdirs if fold(d) != GIT_DIR]  # (nothing below a .git is looked at)
        for folder in unlisted:
            note(os.path.relpath(folder, root).replace(os.sep, "/"))
    return found


def layouts_around(root: str, places: list[str], grants: list[str]) -> dict[str, tuple[int, ...]]:
    """What a program Kiwi models may have made writing ``places`` (project-relative, real): the folders above
    each that are repositories by their layout, and nested_places below each that is a folder (`cp -r stage
    sub`: the copy's HEAD, objects/ and refs/; `mkdir -p x/objects x/refs` then `touch x/HEAD`). Each with its
    identity, as nested_places gives them."""
    found: dict[str, tuple[int, ...]] = {}
    for place in dict.fromkeys(places):
        parts = [] if place == "." else place.split("/")
        for depth in range(len(parts)):
            folder = "/".join(parts[:depth]) or "."
            if (
                _layout_at(root, folder)
                and (identity := place_identity(root, folder, layout=True)) is not None
            ):
                found[folder] = identity
        found.update(nested_places(root, [place], grants, None) or {})
    return found


# What a folder read does not read unless its grant names the protected place (kiwi/protected.py): the
# repository's settings (a remote's credentials, an http.extraHeader; git writes config.lock, then renames it
# over config) and Kiwi's configuration; and the same files of each submodule's and worktree's git folder
# (actions/checkout writes a token's extraHeader in .git/modules/NAME/config). Their names may be listed;
# `grep -r KEY .` then says `Permission denied` for each of their files.
UNREAD = (".git/config", ".git/config.lock", ".git/config.worktree", ".ai/config")
_GIT_SETTINGS = ("config", "config.lock", "config.worktree", "config.worktree.lock")
_MODULES_WALK_LIMIT = 10_000
_LINK_WALK_LIMIT = 200_000
# The folders of local tools, whose hidden files (a tool's `.env`, a `.venv`) a folder read does not read either
# unless its grant names the place: `grep -r KEY .` and `git grep --untracked` printed a tool's
# `.env` (review s34), which filesystem.read refuses. Past _TOOLS_WALK_LIMIT entries to look through, the whole
# folder: never fewer than there are.
TOOL_FOLDERS = (".ai/tools", ".ai/scripts")
_TOOLS_WALK_LIMIT = 10_000


def hidden_places(root: str) -> list[str]:
    """UNREAD, and the settings of the git folders of submodules (``.git/modules/...``) and worktrees
    (``.git/worktrees/*``) as they are on disk; for a repository whose git folder is elsewhere in the project
    (`.git` a file saying `gitdir: .bare`), that folder's. Where a git folder holds too much to look through,
    all of its ``modules``: never fewer than there are."""
    found = list(UNREAD) + hidden_tool_files(root) + nested_projects(root)
    for git in git_folders(root):
        if git != ".git":
            found += [f"{git}/{name}" for name in _GIT_SETTINGS]
        looked = 0
        pending = [f"{git}/modules"]
        while pending:
            rel = pending.pop()
            if looked > _MODULES_WALK_LIMIT:
                found.append(f"{git}/modules")
                break
            try:
                entries = {
                    e.name: e.is_dir(follow_symlinks=False) for e in os.scandir(os.path.join(root, rel))
                }
            except OSError:
                continue
            looked += len(entries)
            if "HEAD" in entries:  # (a submodule's git folder, its config made or not yet; its own below)
                found += [f"{rel}/{name}" for name in _GIT_SETTINGS]
                pending += [f"{rel}/modules"] if entries.get("modules") else []
            else:  # (a folder on the way to one: a submodule's name may hold slashes)
                pending += [f"{rel}/{name}" for name, is_dir in entries.items() if is_dir]
        with contextlib.suppress(OSError):
            found += [
                f"{git}/worktrees/{e.name}/{name}"
                for e in os.scandir(os.path.join(root, git, "worktrees"))
                if e.is_dir(follow_symlinks=False)
                for name in _GIT_SETTINGS
            ]
    return found


# A `.ai` folder below the root is another project's (a monorepo's service): protected whole, as kiwi.protected
# says, its tools' `.env` too. Review s35: `git grep --untracked -e API_KEY` printed `services/api/.ai/tools/t/.env`,
# which filesystem.read refuses: the wall withheld only the root's. Found by looking through the project (not
# into git folders, links or the places found), up to _NESTED_WALK_LIMIT entries; past them, each folder not
# looked into is withheld whole (its files read as Permission denied): never fewer than there are.
_NESTED_WALK_LIMIT = 200_000


def nested_projects(root: str) -> list[str]:
    """The `.ai` folders below the project's root (``services/api/.ai``), and past _NESTED_WALK_LIMIT entries the
    folders not looked into. A folder whose modification time is what it was at the last look is not listed
    again (a name added, removed or renamed in a folder changes its time): a shell command's look at a large
    project is a stat per folder."""
    known = _FOLDERS[root] = _FOLDERS.pop(
        root, {}
    )  # (the latest last: the oldest project is forgotten first)
    if len(_FOLDERS) > 8:
        _FOLDERS.pop(next(iter(_FOLDERS)))
    found: list[str] = []
    pending = [""]
    looked = 0
    while pending:
        rel = pending.pop()
        if looked > _NESTED_WALK_LIMIT:
            found += [rel, *pending]
            break
        path = os.path.join(root, rel) if rel else root
        try:
            stamp = os.stat(path, follow_symlinks=False).st_mtime_ns
            entry = known.get(rel)
            if entry is None or entry[0] != stamp:
                with os.scandir(path) as listing:
                    entries = [(e.name, e.is_dir(follow_symlinks=False)) for e in listing]
                folders = tuple(name for name, is_dir in entries if is_dir)
                entry = known[rel] = (stamp, len(entries), folders)
        except OSError:
            known.pop(rel, None)
            continue
        looked += max(entry[1], 1)
        for name in entry[2]:
            if fold(name) == GIT_DIR or (not rel and fold(name) == ".ai"):
                continue
            child = f"{rel}/{name}" if rel else name
            if fold(name) == ".ai":
                found.append(child)
            else:
                pending.append(child)
    return found


# nested_projects' last look at each project's folders: {root: {folder: (mtime, entries, sub-folders)}}.
_FOLDERS: dict[str, dict[str, tuple[int, int, tuple[str, ...]]]] = {}


def hidden_tool_files(root: str) -> list[str]:
    """The hidden entries (a name starting with a dot) below the tool folders (TOOL_FOLDERS), not looked into;
    a tool folder whole when it holds more than _TOOLS_WALK_LIMIT entries to look through."""
    found: list[str] = []
    for place in TOOL_FOLDERS:
        looked = 0
        pending = [place]
        while pending:
            rel = pending.pop()
            try:
                entries = [
                    (e.name, e.is_dir(follow_symlinks=False)) for e in os.scandir(os.path.join(root, rel))
                ]
            except OSError:
                continue
            looked += len(entries)
            if looked > _TOOLS_WALK_LIMIT:
                found = [f for f in found if not f.startswith(place + "/")] + [place]
                break
            for name, is_dir in entries:
                if name.startswith("."):
                    found.append(f"{rel}/{name}")
                elif is_dir:
                    pending.append(f"{rel}/{name}")
    return found


def git_folders(root: str) -> list[str]:
    """The project's git folder: `.git`, or where a `.git` file points inside the project (review s26:
    `git init --separate-git-dir=.bare .` kept the repository's settings in `.bare/config`)."""
    target = gitdir_file(root)
    if target is None or not _inside(target, root) or target == root:
        return [".git"]
    return [".git", os.path.relpath(target, root).replace(os.sep, "/")]


def gitdir_file(folder: str) -> str | None:
    """Where the `.git` file of ``folder`` points (`gitdir: PATH`, real), or None when ``folder/.git`` is no such
    file. Read not blocking, not through a link, a file only (a FIFO named .git held the worker, review s26)."""
    try:
        fd = os.open(os.path.join(folder, ".git"), os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        line = os.read(fd, 4096).split(b"\n")[0] if stat.S_ISREG(os.fstat(fd).st_mode) else b""
    finally:
        os.close(fd)
    if not line.startswith(b"gitdir:") or b"\0" in line:
        return None
    return os.path.realpath(os.path.join(folder, os.fsdecode(line[7:].strip())))


def unread_elsewhere(project_root: str, places: list[str] | None = None) -> str:
    """A hidden file (hidden_places) that has another name (a hard link), '' if none: a rule is held by a
    file, not by a name, so the other name would read it (`ln .git/config notes`; review s26). Below a hidden
    folder, every file (git's settings by name in `.git/modules`); past _LINK_WALK_LIMIT entries, that folder
    is named as if it held one."""
    root = os.path.realpath(project_root)
    for place in hidden_places(root) if places is None else places:
        if protected_root(place) is None:
            continue  # (a folder nested_projects did not look into, withheld whole: no secret of its own)
        path = os.path.join(root, place)
        if place.startswith(tuple(f"{folder}/" for folder in TOOL_FOLDERS) + TOOL_FOLDERS) and os.path.isdir(
            path
        ):
            # (A hidden folder below the tools, a tool's clone's `.git` or its `.venv`, holds hard links made by
            # git clone, uv or pnpm from places outside the project: second review s34 found every shell command
            # refused for one. Its files are withheld whole; a hidden file there is checked as any.)
            continue
        if not os.path.isdir(path) or os.path.islink(path):
            with contextlib.suppress(OSError):
                if stat.S_ISREG((info := os.lstat(path)).st_mode) and info.st_nlink > 1:
                    return place
            continue
        looked = 0
        for folder, _, files in walk_tree(path):
            looked += len(files)
            if looked > _LINK_WALK_LIMIT:
                return place
            for name in files:
                if place.endswith("/modules") and name not in _GIT_SETTINGS:
                    continue
                with contextlib.suppress(OSError):
                    info = os.lstat(os.path.join(folder, name))
                    if stat.S_ISREG(info.st_mode) and info.st_nlink > 1:
                        return os.path.relpath(os.path.join(folder, name), root)
    return ""


def _read_below(rules: landlock.Rules, root: str, rel: str, pattern: str, places: list[str]) -> None:
    """Read below ``rel`` (the literal part of the grant ``pattern``) but not the places of UNREAD there that
    ``pattern`` does not name: the folders on the way to one are listed and each of their other entries read
    (as they are when the rules are made: an entry made later by the command is not read by it)."""
    hidden = [
        place
        for place in places
        if (not rel or fold_path(place).startswith(fold_path(rel) + "/"))
        and not names(pattern, protected_root(place) or place)
    ]
    if not hidden or not os.path.isdir(os.path.join(root, rel)):  # (a `.git` file: read as any)
        rules.allow_beneath(root, rel, landlock.READ)
        return
    rules.allow_beneath(root, rel, landlock.READ_DIR)
    try:
        entries = [entry.name for entry in os.scandir(os.path.join(root, rel))]
    except OSError:
        return
    for entry in entries:
        child = f"{rel}/{entry}" if rel else entry
        if any(fold_path(child) == fold_path(place) for place in hidden):
            continue
        if any(fold_path(place).startswith(fold_path(child) + "/") for place in hidden):
            _read_below(rules, root, child, pattern, hidden)
        else:
            rules.allow_beneath(root, child, landlock.READ)


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def _existing(root: str, rel: str) -> str:
    while rel and not os.path.isdir(os.path.join(root, rel)):
        rel = os.path.dirname(rel)
    return rel


def _started_by(program: str, root: str, depth: int = 0) -> list[tuple[str, str]]:
    """What the kernel opens to execute the system program ``program`` (resolved): its ELF interpreter, or
    its ``#!`` line's interpreter and that one's, read as the kernel reads them. Nothing in the project."""
    if depth > 3:
        return []
    try:
        fd = os.open(program, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # (a FIFO would hold the worker)
    except OSError:
        return []
    try:
        head = os.read(fd, 256) if stat.S_ISREG(os.fstat(fd).st_mode) else b""
        if head.startswith(b"#!"):
            # The kernel: blanks after "#!", then the name up to a blank, a tab or the end of the line.
            line = head[2:].split(b"\n")[0].lstrip(b" \t")
            name, kind = re.split(rb"[ \t\0]", line)[0], "script"
        elif head.startswith(b"\x7fELF"):
            name, kind = _elf_interpreter(fd, head), "elf"
        else:
            return []
    finally:
        os.close(fd)
    if not name.startswith(b"/"):
        return []
    interpreter = os.path.realpath(os.fsdecode(name))
    if _inside(interpreter, root):
        return []
    return [(interpreter, kind), *_started_by(interpreter, root, depth + 1)]


def _elf_interpreter(fd: int, head: bytes) -> bytes:
    """The PT_INTERP of the ELF file open at ``fd`` (b'' for a static one), as bytes."""
    if len(head) < 64:
        return b""
    wide, order = head[4] == 2, "<" if head[5] == 1 else ">"
    phoff = struct.unpack_from(order + ("Q" if wide else "I"), head, 32 if wide else 28)[0]
    phentsize, phnum = struct.unpack_from(order + "HH", head, 54 if wide else 42)
    for index in range(min(phnum, 64)):
        entry = os.pread(fd, phentsize, phoff + index * phentsize)
        if len(entry) < max(phentsize, 24) or struct.unpack_from(order + "I", entry, 0)[0] != 3:  # PT_INTERP
            continue
        offset, size = (
            struct.unpack_from(order + "Q8x8xQ", entry, 8)
            if wide
            else struct.unpack_from(order + "I4x4xI", entry, 4)
        )
        name = os.pread(fd, min(size, 4096), offset)
        return name[: name.index(b"\0")] if b"\0" in name else name
    return b""


@functools.cache
def _system_loaders() -> tuple[str, ...]:
    """The system's ELF interpreter, as /bin/sh names it: what runs a program of the project."""
    for program in ("/bin/sh", "/usr/bin/env", sys.executable):
        found = _started_by(os.path.realpath(program), "/nonexistent")
        if found:
            return tuple(path for path, kind in found if kind == "elf")[:1]
    return ()


def platform_note() -> str:
    """One line for ``kiwi doctor`` and the worker's start: whether shell commands are confined."""
    unmodeled = "; programs Kiwi does not model are refused"
    if not sys.platform.startswith("linux"):
        return "shell commands are not confined (Landlock is Linux's)" + unmodeled
    abi = available()
    if mode() == "off":
        return "shell commands are not confined (KIWI_CONFINE=off)" + unmodeled
    if abi == 0:
        return (
            "shell commands are not confined: this kernel has no Landlock (Linux 5.13+, enabled at boot)"
            + unmodeled
        )
    missing = [
        what
        for since, what in ((3, "truncation"), (4, "TCP"), (6, "signals, abstract sockets"))
        if abi < since
    ]
    lacks = f"; this ABI does not cover {', '.join(missing)} (README: Security)" if missing else ""
    filtered = (
        " and seccomp (no sockets)"
        if landlock.seccomp_filtered()
        else ", sockets not filtered on this machine"
    )
    refused = namespaces_refused()
    held = (
        "; each command in namespaces of its own (protected places held read-only, its processes ending "
        "with it)"
        if not refused
        else f"; no namespace here ({refused}): protected places under a write grant are held by the checks "
        "alone, and a command's leftovers looked for in /proc"
        + ("; shell commands are refused (KIWI_CONFINE=required)" if mode() == "required" else "")
    )
    return f"shell commands are confined by Landlock (ABI {abi}){filtered}{lacks}{held}"


_PROBE = (
    "import ctypes, os, sys\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "flags = 0x00020000 | 0x20000000 | (0x10000000 if os.getuid() else 0)\n"
    "sys.exit(0 if libc.unshare(ctypes.c_int(flags)) == 0 else ctypes.get_errno())\n"
)


@functools.cache
def namespaces_refused() -> str:
    """Why a command cannot have a mount namespace of its own here (a user namespace too, for a worker that
    is not root: some containers and distributions refuse them), or "" when it can. Asked once, of a
    process of its own (a threaded process cannot make a user namespace)."""
    from kiwi.lifetime import INTERPRETER

    try:
        done = subprocess.run(
            [INTERPRETER, "-I", "-S", "-c", _PROBE], capture_output=True, timeout=30, check=False, env={}
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return str(exc)
    if done.returncode == 0:
        return ""
    return os.strerror(done.returncode) if 0 < done.returncode < 200 else f"exit code {done.returncode}"
