"""``shell.run``, local tools and ``git.*``: child processes, never a shell."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import posixpath
import re
import secrets
import shutil
import stat
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities import confinement, gitnamed
from activities.filesystem import (
    confine,
    layout_named,
    refuse_layout_on_the_way,
    refuse_named,
    relative,
    settings_named,
)
from activities.gitsight import GitSight, chunks, quoted, secret_place, split_z
from activities.process import child_env, kiwi_git, run_process
from activities.staging import (
    UNPACK_MAX_BYTES,
    UNPACK_MAX_ENTRIES,
    Staged,
    disk_usage,
    remove_tree,
    too_big,
    unpack_back,
)
from activities.toolenv import lib_folder, tool_python
from kiwi.contracts import CheckpointResult, CommandRequest, GitRequest, LocalToolRequest, LocalToolSpec
from kiwi.errors import (
    CheckpointNotFound,
    CommandNotFound,
    GitFailed,
    GitUnavailable,
    InputInvalid,
    PermissionDenied,
    SecretMissing,
    ToolFailed,
    ToolNotFound,
    ToolTypeUnsupported,
)
from kiwi.globs import first_match
from kiwi.protected import granted as protected_granted
from kiwi.protected import names, protected_root
from kiwi.shellpolicy import (
    FIND_GRANTABLE,
    LinkMoves,
    PathArgument,
    ShellVerdict,
    Unpacking,
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
    unpacking,
)
from kiwi.toolargs import CHECKPOINT_REFS, checkpoint_label, coerce_value, shape_problem, unfit_parameters
from kiwi.upstream.pool import remember_secrets, scrub, scrub_text
from kiwi.upstream.registry import first_own, lookup_secret

# Runs a Python tool: main(**params) when the entrypoint defines main, else the file as a
# script with the parameters as JSON on stdin. The result is one JSON document on stdout.
_PYTHON_RUNNER = r"""
import importlib.util, io, json, runpy, sys
path = sys.argv[1]
params = json.loads(sys.stdin.read() or "{}")
spec = importlib.util.spec_from_file_location("kiwi_tool", path)
module = importlib.util.module_from_spec(spec)
sys.path.insert(0, __import__("os").path.dirname(path))
spec.loader.exec_module(module)
if callable(getattr(module, "main", None)):
    result = module.main(**params)
    sys.stdout.write("\n__KIWI_RESULT__" + json.dumps(result, default=str))
else:
    sys.stdin = io.StringIO(json.dumps(params))
    runpy.run_path(path, run_name="__main__")
"""


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


# Repository settings that run a program and have no value that turns them off from the command line
# ("diff.x.command=" makes every diff fail instead): shell.run refuses git in such a repository. Filter
# drivers can be turned off ("filter.x.clean=" and required=false), so Kiwi does that for every git call.
# (Keys whose command git runs through a shell, which confined git may not start since review s28, are
# listed too: a worker without Landlock has only this check.)
_UNSAFE_GIT_KEY = re.compile(
    r"^(diff\.external|diff\..+\.(command|textconv)|merge\..+\.driver|"
    r"includeif\..*onbranch:.*\.path|core\.worktree|trailer\..+\.(cmd|command)|"
    r"gpg\.ssh\.defaultkeycommand|core\.alternaterefscommand|interactive\.difffilter)$",
    re.IGNORECASE,
)
_FILTER_KEY = re.compile(r"^filter\.(.+)\.(clean|smudge|process|required)$", re.IGNORECASE)


async def git_repository_settings(
    root: str, cwd: str | None = None, *, own_worktree: tuple[str, str] | None = None
) -> tuple[list[tuple[str, str]], list[str]]:
    """What the repository's own configuration (includes too) asks git to run: the overrides that turn
    its filter drivers off, and the keys that cannot be turned off. ``own_worktree``: (git folder, work tree)
    of a submodule of the project's repository, whose ``core.worktree`` git sets to its own work tree (the
    relative path back from ``.git/modules/NAME``): that one value is no setting to refuse."""
    result = await run_process(
        ["git", "config", "--list", "--includes", "-z"],
        cwd=cwd or root,
        project=root,
        timeout=30,
        max_output=2_000_000,
        env={"GIT_CEILING_DIRECTORIES": os.path.dirname(os.path.realpath(root))} if cwd else None,
        direct=True,
    )
    if result.exit_code != 0:
        return [], []
    overrides: list[tuple[str, str]] = []
    unsafe: list[str] = []
    for entry in result.stdout.split("\0"):
        key = entry.partition("\n")[0]
        if not key:
            continue
        found = _FILTER_KEY.match(key)
        if found:
            name = found.group(1)
            for var, value in (("clean", ""), ("smudge", ""), ("process", ""), ("required", "false")):
                pair = (f"filter.{name}.{var}", value)
                if pair not in overrides:
                    overrides.append(pair)
        elif _UNSAFE_GIT_KEY.match(key) and key not in unsafe:
            if own_worktree is not None and key.lower() == "core.worktree":
                value = entry.partition("\n")[2]
                git_dir, top = own_worktree
                # (Lexically, links unresolved: `moved` made a link to src/ once git had written
                # `../../../moved` there led git's work tree to src/, review s29.)
                if os.path.normpath(os.path.join(git_dir, value)) == top:
                    continue
            unsafe.append(key)
    return overrides, unsafe


async def git_identity(root: str, project: str | None = None) -> dict[str, str]:
    """The user's name and email from their own git config files, as environment variables, when the
    repository sets none: children read no global config (GIT_CONFIG_GLOBAL=/dev/null), but a commit
    should still carry the user's identity. Reading a value runs nothing."""

    async def get(key: str, *where: str) -> str:
        result = await run_process(
            ["git", "config", *where, "--get", key],
            cwd=root,
            timeout=30,
            max_output=10_000,
            direct=True,
            project=project,
        )
        return result.stdout.strip() if result.exit_code == 0 else ""

    if await get("user.name") and await get("user.email"):
        return {}
    home = os.path.expanduser("~")
    xdg = os.environ.get("XDG_CONFIG_HOME") or os.path.join(home, ".config")
    for path in (os.path.join(home, ".gitconfig"), os.path.join(xdg, "git", "config")):
        if os.path.isfile(path):
            name, email = await get("user.name", "--file", path), await get("user.email", "--file", path)
            if name and email:
                return {
                    "GIT_AUTHOR_NAME": name,
                    "GIT_COMMITTER_NAME": name,
                    "GIT_AUTHOR_EMAIL": email,
                    "GIT_COMMITTER_EMAIL": email,
                }
    return {}


async def _check_git_repository(req: CommandRequest, cwd: str, env: dict[str, str]) -> list[tuple[str, str]]:
    """shell.run's git stays in the project's own repository and runs nothing the repository configures."""
    result = await run_process(
        ["git", "rev-parse", "--absolute-git-dir", "--show-toplevel"],
        cwd=cwd,
        project=req.project_root,
        timeout=30,
        max_output=100_000,
        env=env,
        direct=True,
    )
    if result.exit_code == 0:
        for line in result.stdout.splitlines():
            if _real_relative(req.project_root, line) is None:
                raise _denied(
                    f"git here uses '{line}', outside the project (a .git file or core.worktree points there)"
                )
    submodule = _the_projects_repository(req, result.stdout.splitlines() if result.exit_code == 0 else [])
    if submodule is not None and not _the_submodules_own_tree(*submodule, cwd):
        submodule = None  # (its core.worktree is then refused below with the other settings)
    overrides, unsafe = await git_repository_settings(req.project_root, cwd, own_worktree=submodule)
    if unsafe:
        raise _denied(
            f"the repository's configuration sets {', '.join(unsafe)}, which makes git run a program; "
            "Kiwi runs no shell git command in it until a human removes it from .git/config"
        )
    if result.exit_code == 0 and result.stdout.splitlines()[1:]:
        await _no_tracked_path_beyond_a_link(result.stdout.splitlines()[1], cwd, env, req.project_root)
    return overrides


def _the_projects_repository(req: CommandRequest, found: list[str]) -> tuple[str, str] | None:
    """shell.run's git works in the project's own repository (its git folder, the project's root its work
    tree), a submodule's or a worktree's of it; nowhere else (review s28): a repository the agent made (a
    `.git` file in sub/ pointing at a folder it wrote) has settings of the agent's, and with none found git
    compares files as `git diff --no-index` does, reading `.git/config` as git's rules let it. ``found``:
    `git rev-parse --absolute-git-dir --show-toplevel` in the command's folder ([] when it found none); `git
    init` and `git --version` need none. Answers (git folder, work tree) when it is a submodule's (in the
    project's ``.git/modules``, its work tree a real folder of the project and no protected place), else None."""
    words = [w for w in req.argv[1:] if not w.startswith("-")]
    if not found:
        if words[:1] in ([], ["init"], ["version"]):
            return None
        raise _denied(
            "git finds no repository here: shell git runs in the project's own repository (`git init` makes one)"
        )
    root = os.path.realpath(req.project_root)
    git_dir = os.path.realpath(found[0])
    top = os.path.realpath(found[1]) if len(found) > 1 and found[1] else ""
    own = [os.path.realpath(os.path.join(root, rel)) for rel in confinement.git_folders(root)]
    if git_dir in own and top == root:
        return None
    inside = _real_relative(req.project_root, top)
    if inside is not None:
        for folder in own:
            if git_dir.startswith(folder + os.sep + "worktrees" + os.sep):
                return None
            if git_dir.startswith(folder + os.sep + "modules" + os.sep):
                # (Its core.worktree is git's own, back to this work tree; one naming the project's root, a
                # protected place or a folder holding one, is refused with the rest of the repository's settings.)
                own_tree = inside not in ("", ".") and protected_root(inside) is None
                return (git_dir, top) if own_tree and protected_inside(inside, ()) is None else None
    shown = _real_relative(req.project_root, git_dir) or git_dir
    raise _denied(
        f"git here uses the repository '{shown}' (its work tree '{_real_relative(req.project_root, top) or top}'), "
        "not the project's: shell git runs in the project's own repository, its submodules and worktrees"
    )


def _the_submodules_own_tree(git_dir: str, top: str, cwd: str) -> bool:
    """Whether ``top`` (real) is the submodule's own work tree as git made it: it holds the `.git` file that
    points back at ``git_dir`` (real), and the command runs in it (review s29: a submodule's folder moved with
    `git mv` and `mv`, and a link left where git's `core.worktree` said, led git from one folder to another's
    files, outside the command's write grant)."""
    real_cwd = os.path.realpath(cwd)
    if real_cwd != top and not real_cwd.startswith(top + os.sep):
        return False
    return confinement.gitdir_file(top) == git_dir


async def _no_tracked_path_beyond_a_link(top: str, cwd: str, env: dict[str, str], project: str) -> None:
    """git opens and unlinks the files it tracks by their names, so a folder on a tracked path that is now a
    link leads git through it (`git rm -r -f out` with out/c made a link to ../.ai deleted the audit trail, and
    through a link to a folder outside the project, files outside it; `git grep` printed them): refused."""
    listed = await run_process(
        ["git", "ls-files", "-z", "--full-name", "--", ":/"],
        cwd=cwd,
        project=project,
        timeout=60,
        max_output=200_000_000,
        env=env,
        direct=True,
    )
    if listed.exit_code != 0 or listed.truncated:
        raise _denied(
            "Kiwi could not list what the repository tracks to check that no folder on it is a symbolic link "
            f"(git ls-files: {listed.stderr.strip()[:200] or 'its list was cut short'})"
        )
    real_top = os.path.realpath(top)
    prefixes = {
        "/".join(parts[:depth])
        for folder in {os.path.dirname(p) for p in listed.stdout.split("\0") if p}
        if folder
        for parts in [folder.split("/")]
        for depth in range(1, len(parts) + 1)
    }
    for shown in sorted(prefixes):
        if os.path.islink(os.path.join(real_top, shown)):
            raise _denied(
                f"the repository tracks files below '{shown}', which is now a symbolic link: git would "
                f"open and remove them through it; put the folder back (git checkout -- {shown}) or "
                "remove the link first"
            )


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


async def _unpack(req: CommandRequest, unpack: Unpacking, cwd: Path, env: dict[str, str]) -> dict[str, Any]:
    """``tar -x`` or ``unzip`` run into a folder of the worker's own, then what it unpacked copied into the
    project by the worker (see :class:`kiwi.shellpolicy.Unpacking`): every path checked against the run's
    write grants first (nothing is kept if one is not covered), files written through descriptors that never
    follow a link, links left out (and named)."""
    folder = tempfile.mkdtemp(prefix="kiwi-unpack-")
    staged = Staged(rel=unpack.target, path=os.path.join(folder, "into"), is_dir=True)
    try:
        os.mkdir(staged.path, 0o700)
        what = f"{unpack.program} (unpacking into '{unpack.target}')"
        running = asyncio.ensure_future(
            run_process(
                unpack.argv(staged.path),
                cwd=str(cwd),
                project=req.project_root,
                timeout=req.timeout_seconds,
                max_output=req.max_output_bytes,
                stdin=req.stdin,
                env=env,
                confine=_confinement(req, into=staged.path),
            )
        )
        result = await _within_limits(running, staged.path, what)
        _, problems, left_out = await asyncio.to_thread(
            unpack_back, req.project_root, staged, req.write_grants, req.deny_fs, what, keep=unpack.keep
        )
    finally:
        remove_tree(folder)
    # (The worker's own folder is no place of the project: its name is not shown, cut short or whole.)
    stdout, stderr = (_unnamed(text, staged.path, unpack.target) for text in (result.stdout, result.stderr))
    if left_out:
        more = " ..." if len(left_out) > 10 else ""
        shown = ", ".join(f"{unpack.target}/{p}" for p in left_out[:10]) + more
        stderr += (
            f"kiwi: {len(left_out)} link(s) or special file(s) in the archive were not unpacked (Kiwi writes "
            f"no links into the project): {shown}\n"
        )
    for problem in problems[:20]:
        stderr += f"kiwi: {problem}\n"
    # (As tar does with a member it cannot write: the others are unpacked, and the command fails.)
    exit_code = result.exit_code or (2 if problems else 0)
    return {"exit_code": exit_code, "stdout": stdout, "stderr": stderr, "truncated": result.truncated}


async def _within_limits(running: asyncio.Future[Any], folder: str, what: str) -> Any:
    """The unpacking's result, once it ends; stopped (its process group killed) as soon as what it wrote
    passes the limits, so that a small archive cannot fill the worker's disk before they are checked."""
    try:
        while True:
            done, _ = await asyncio.wait({running}, timeout=UNPACK_WATCH_SECONDS)
            if done:
                return running.result()
            used, entries = await asyncio.to_thread(disk_usage, folder)
            if used > UNPACK_MAX_BYTES or entries > UNPACK_MAX_ENTRIES:
                raise too_big(what)
    finally:
        if not running.done():
            running.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await running


# How often an unpacking's folder is measured while the program runs.
UNPACK_WATCH_SECONDS = 0.5


def _unnamed(text: str, path: str, shown: str) -> str:
    """``text`` with ``path`` written as ``shown``, and a start of ``path`` that ends it (output cut at the
    limit) dropped."""
    text = text.replace(path, shown)
    for length in range(len(path) - 1, 4, -1):
        if text.endswith(path[:length]):
            return text[:-length]
    return text


@dataclasses.dataclass
class _Watch:
    """What Kiwi looks at before and after a shell command for places whose settings a human's tools obey
    (confinement.nested_places: a `.git`, a repository by its layout, a `.ai` or `temporal-dev.yml` below the
    root), to hold those there read-only for it and set aside those it made.
    - A program Kiwi does not model (``whole``): the folders the wall lets it write whole.
    - A program Kiwi models that writes: the folders of the write grants, whole (a link swapped between the
      check of its words and its run sent `tee l/HEAD` into another folder, review s31 F5), and the folders
      above what it writes (layouts_around); followed by identity (`mv vendor/lib moved` makes nothing)."""

    root: str
    grants: list[str]
    folders: list[str]
    written: list[str]
    whole: bool
    git: bool

    @classmethod
    def of(cls, req: CommandRequest, paths: list[PathArgument], modeled: bool, root: str) -> _Watch:
        written = [place for place, _ in _written(req, paths, modeled)]
        folders = (
            []
            if modeled and not written
            else confinement.whole_write_folders(req)
            if not modeled
            else confinement.write_folders(req)
        )
        git = modeled and program_name(req.argv[0]) == "git"
        return cls(root, req.write_grants, folders, written, not modeled, git)

    def look(self, limit: int | None) -> dict[str, tuple[int, ...]] | None:
        found = confinement.nested_places(self.root, self.folders, self.grants, limit) if self.folders else {}
        if found is not None and self.written:
            found.update(confinement.layouts_around(self.root, self.written, self.grants))
        return found

    def held(self, before: dict[str, tuple[int, ...]]) -> list[str]:
        """What is held read-only for the command: all it found, but a repository by its layout a write grant
        names, and, for git, any repository by its layout (what git writes there is mostly the repository's
        own content: `git restore` of a test fixture's bare repository it tracks, review s31 F8; its settings
        are watched all the same, see made)."""
        return sorted(
            place
            for place in before
            if place != "."
            and not self._allowed(place, made=False)
            # (A link cannot be held, and the command is refused where one is to be: for a program Kiwi models,
            # whose words are checked against `.git` wherever a link leads, a `.git` link, as `repo` makes them,
            # would refuse every command that writes.)
            and (self.whole or not os.path.islink(os.path.join(self.root, place)))
        )

    def _allowed(self, place: str, made: bool) -> bool:
        """Whether the grants let the command write ``place`` (``made``: make it). A repository by its layout as
        layout_named says (git writes in any there, not make one); anything else where a grant names it (`write
        sub/.git/**` for `git init sub`)."""
        if confinement.is_layout(self.root, place):
            return (self.git and not made) or layout_named(self.grants, place, made=made)
        return any(names(g, place) for g in self.grants)

    def made(self, before: dict[str, tuple[int, ...]], after: dict[str, tuple[int, ...]]) -> list[str]:
        """What to set aside: each place there after and not before, but what the grants let it make.
        - A repository by its layout by path and identity, its settings with it (confinement.place_identity):
          one moved (`mv fixtures/bare.git out/x`) or made in the inode of one removed (`git checkout B`),
          and one whose config, commondir or hooks changed (git restoring the agent's config into the human's
          fixture, review s31), is made; allowed only where a grant names its HEAD (one that was there: its
          folder).
        - Anything else by identity for a program Kiwi models (`mv vendor/lib moved` makes nothing), by path
          and identity for one it does not (a folder renamed above a `.git` and one made in its old place);
          allowed where a grant names it (`write sub/.git/**` for `git init sub`)."""
        known = set(before.values())
        found = []
        for place, identity in after.items():
            layout = confinement.is_layout(self.root, place)
            if before.get(place) == identity or not (layout or self.whole) and identity in known:
                continue
            # (git may write in a repository there, not change its settings: `made` unless it is a new one.)
            if layout and layout_named(self.grants, place, made=place not in before):
                continue
            if not layout and self._allowed(place, made=True):
                continue
            found += confinement.set_aside_pieces(self.root, place)
        return sorted(found)


def _settings_in_reach(
    req: CommandRequest, watch: _Watch, named: list[gitnamed.Named] | None
) -> list[gitnamed.Named]:
    """The places git's settings name (activities.gitnamed; ``named``, when _checked_cwd read them a moment
    before) that the command may write (the folders its watch looks at) and no write grant names: held
    read-only for it (_holdable), and set aside after it when it changed or made one. A file of them with
    another name (a hard link) refuses the command: written by that name, it changes; so does one not there
    that a program Kiwi does not model could make."""
    if not watch.folders:
        return []
    if named is None:
        named = settings_named(req.project_root)
    found = [
        item
        for item in gitnamed.with_matches(watch.root, named)
        if gitnamed.reached(item, watch.folders) and not any(names(g, item.place) for g in req.write_grants)
    ]
    # (A glob `git status` runs, `hooks.d/*.sh`: a new match cannot be held whatever matches now, round 5.)
    missing = [
        item
        for item in found
        if not item.later and (gitnamed.is_glob(item) or not gitnamed.there(watch.root, item))
    ]
    if watch.whole and missing:
        # (Made by it, one would be there for a human's git to obey until the command ends: only one that is
        # there can be held. Review s32: `dd of=.gitconfig` read by a `git status` run meanwhile. One git obeys
        # later, at a commit, a checkout or an alias, not a status, is set aside after it.)
        item = missing[0]
        raise _denied(
            f"'{os.path.basename(req.argv[0])}' is a program Kiwi does not model, which may write "
            f"{', '.join(repr(f or '.') for f in watch.folders)} whole, where it could make '{item.place}', "
            f"which git's settings name ({item.why}) and which is not there to hold read-only for it: "
            # (Never "make it" for a program's file: an empty `nbstripout.py` breaks the filter that loads it.)
            + ("make it (empty) first, " if gitnamed.safe_made_empty(item) else "")
            + "grant narrower folders, or use a program Kiwi models"
        )
    for item in found:
        with contextlib.suppress(OSError):
            info = os.lstat(os.path.join(watch.root, item.place))
            if stat.S_ISREG(info.st_mode) and info.st_nlink > 1:
                raise _denied(
                    f"'{item.place}', which git's settings name ({item.why}), has other names (hard links): written "
                    "by one of them, it changes, so Kiwi runs no command that writes there until a human removes "
                    "the other names"
                )
    return found


def _holdable(root: str, item: gitnamed.Named, whole: bool) -> bool:
    """Whether ``item`` is held read-only for a command: when it is there, and, for a program Kiwi models, no
    link (a link cannot be held, and the command is refused where one is to be held; the checks of its words
    keep such a program from writing it, and its watch sets aside what changed it)."""
    path = os.path.join(root, item.place)
    return os.path.lexists(path) and (whole or not os.path.islink(path))


def _written_now(req: CommandRequest, paths: list[PathArgument], modeled: bool) -> list[str]:
    """Where the paths a program Kiwi models writes are now: a link on the way may have been changed while it
    ran (review s31 F5)."""
    try:
        return [place for place, _ in _written(req, paths, modeled)]
    except OSError:
        return []


def _made_and_aside(moved: list[tuple[str, str]]) -> str:
    """What a command (or a rollback) made, and where each is set aside (confinement.set_aside's answer)."""
    return (
        ", ".join(_made(place) for place, _ in moved)
        + ", set aside for a human to look at: "
        + ", ".join(f"'{aside}'" if aside else f"'{place}' (could not be moved)" for place, aside in moved)
    )


def _made(place: str) -> str:
    """``place``, a place a command made, as its failure names it: a HEAD set aside made its folder a
    repository by its layout (confinement.set_aside_pieces)."""
    if posixpath.basename(place).casefold() == "head":
        folder = posixpath.dirname(place) or "."
        return (
            f"'{folder}' a git repository by its layout (its '{posixpath.basename(place)}'; one is made only "
            f'where a grant names its HEAD, <write resource="filesystem" path="{folder}/HEAD"/>)'
        )
    return f"'{place}'"


class CommandActivities:
    @activity.defn(name="run_command")
    async def run_command(self, req: CommandRequest) -> dict[str, Any]:
        # On a thread: a command of many paths (16,000 at the 64 KiB limit) takes a quarter of a second to
        # check on disk, which on the event loop every run of the worker waited for.
        cwd, paths, modeled, named = await asyncio.to_thread(_checked_cwd, req)
        # git looks for a repository no higher than the project's own folder.
        env = {**req.env, "GIT_CEILING_DIRECTORIES": os.path.dirname(os.path.realpath(req.project_root))}
        if program_name(req.argv[0]) == "tar":
            # A -T list is names only: GNU tar also reads options there (-C /elsewhere), which Kiwi never saw.
            # An archive named HOST:PATH is a file here, not a remote one reached by running rsh or ssh.
            env["TAR_OPTIONS"] = "--verbatim-files-from --force-local"
        argv = req.argv
        if program_name(argv[0]) == "rg" and not confinement.available():
            # rg reads the ignore files of every folder above the one it searches, out of the project too, and
            # prints a line it cannot parse in its error (review s30: `outer/.ignore` above the project; rg 13
            # reads them with --no-ignore-parent too): where no wall keeps it in, it reads no ignore file. First
            # (a `--` may be an option's value: `rg -e -- x`); Kiwi refuses the options that undo it.
            argv = [argv[0], "--no-ignore", *argv[1:]]
        git_config: list[tuple[str, str]] = []
        if program_name(req.argv[0]) == "git":
            git_config = await _check_git_repository(req, str(cwd), env)
            await _deleted_folders(req, paths, str(cwd), env)
            env = {**await git_identity(str(cwd), req.project_root), **env}
        unpack = unpacking(req.argv, req.cwd or ".")
        if isinstance(unpack, ShellVerdict):
            raise _denied(f"{unpack.reason} ({unpack.hint})" if unpack.hint else unpack.reason)
        if unpack is not None:
            return await _unpack(req, unpack, cwd, env)
        root = os.path.realpath(req.project_root)
        missing = confinement.not_made(root, req.write_grants)
        watch = _Watch.of(req, paths, modeled, root)
        settings = await asyncio.to_thread(_settings_in_reach, req, watch, named)
        settings_before = {item: gitnamed.identity(root, item) for item in settings}
        before = await asyncio.to_thread(watch.look, confinement.NESTED_WALK_LIMIT)
        held = watch.held(before or {})
        if watch.whole and before is None:
            raise _denied(
                f"'{os.path.basename(req.argv[0])}' is a program Kiwi does not model, which may write "
                f"{', '.join(repr(f or '.') for f in watch.folders)} whole, and Kiwi looks there after it for a "
                f"repository or Kiwi project it made; past {confinement.NESTED_WALK_LIMIT:,} entries it does "
                "not (grant the folders it writes, narrower, or use a program Kiwi models)"
            )
        if before is None:
            # (A program Kiwi models, in a project past the limit: what it writes and the folders above are
            # looked at, not the rest of what the wall lets it write; README: Repositories by their layout.)
            watch.folders = []
            before = await asyncio.to_thread(watch.look, None)
            held = watch.held(before)
        held = sorted({*held, *(item.place for item in settings if _holdable(root, item, watch.whole))})
        holdable = confinement.available() and not confinement.namespaces_refused()
        if watch.whole and held and not holdable and confinement.available():
            raise _denied(
                f"'{os.path.basename(req.argv[0])}' is a program Kiwi does not model, which may write "
                f"{', '.join(repr(f or '.') for f in watch.folders)} whole, where "
                f"{', '.join(held[:5])} {'is' if len(held) == 1 else 'are'}, whose settings a human's git or kiwi "
                "obeys; they are held read-only for it in a namespace of the command's own, which this kernel "
                f"does not give ({confinement.namespaces_refused()}): grant narrower folders, or use a program "
                "Kiwi models"
            )
        # (A program Kiwi models, where nothing can be held: the checks of its words keep it out of a
        # repository by its layout, and one whose settings it changed all the same, `cp -r stage/. fixtures/`,
        # is found after it by its settings and loses its HEAD.)
        try:
            result = await run_process(
                argv,
                cwd=str(cwd),
                project=req.project_root,
                timeout=req.timeout_seconds,
                max_output=req.max_output_bytes,
                stdin=req.stdin,
                env=env,
                git_config=git_config,
                confine=_confinement(req, nested=held),
            )
        finally:
            # (All of what it made, however many: past a limit, a `.git` it made stayed, review s30.)
            watch.written += _written_now(req, paths, modeled)
            after = await asyncio.to_thread(watch.look, None)
            missing += watch.made(before, after or {})
            changed = [
                item for item, found in settings_before.items() if gitnamed.identity(root, item) != found
            ]
            # (What a glob a setting runs matches now and did not before: `scripts/lint-*.sh` made, round 4.)
            changed += [m for m in gitnamed.with_matches(root, settings) if m not in settings_before]
            missing += [item.place for item in changed]
            moved = confinement.set_aside(root, missing, _stamp()) if missing else []
        if changed:
            aside = dict(moved)
            activity.logger.warning("a shell command changed files git's settings name, set aside: %s", moved)
            raise _denied(
                "the command changed "
                + ", ".join(
                    f"'{item.place}', which git's settings name ({item.why}), set aside for a human to look at: "
                    + (
                        f"'{aside[item.place]}'"
                        if aside.get(item.place)
                        else "(removed, or could not be moved)"
                    )
                    for item in changed
                )
                + "; Kiwi changes such a file only where a write grant names it"
            )
        if moved:
            activity.logger.warning("a shell command made protected places, set aside: %s", moved)
            raise _denied(
                f"the command made {_made_and_aside(moved)}; only a grant naming a protected place reaches it (one "
                "that was not there, so the kernel could not hold it)"
            )
        return {
            "exit_code": result.exit_code,
            "stdout": result.stdout,
            "stderr": result.stderr,
            "truncated": result.truncated,
        }

    @activity.defn(name="run_local_tool")
    async def run_local_tool(self, req: LocalToolRequest) -> Any:
        tool = req.tool
        entry = Path(tool.entrypoint)
        if not entry.is_file():
            raise ToolNotFound.error(f"tool '{tool.tool_id}': entrypoint {entry.name} is missing")
        _check_parameters(tool, req.params)
        req = req.model_copy(update={"params": typed_parameters(tool, req.params)})
        passed = _check_requirements(tool)
        if tool.tool_type == "python":
            # -P: nothing from the working folder (the project, which agents may write) is imported: with
            # -c, Python put it first on the import path, and a json.py there ran in place of the runner's.
            argv = [await tool_python(tool), "-P", "-c", _PYTHON_RUNNER, str(entry)]
            env = dict(passed)
            lib = lib_folder(tool.entrypoint)
            if lib:
                env["PYTHONPATH"] = lib
        elif tool.tool_type == "bash":
            argv = ["bash", str(entry), *[str(v) for v in req.params.values()]]
            env = {
                **passed,
                **{
                    f"KIWI_PARAM_{k.upper()}": v if isinstance(v, str) else json.dumps(v)
                    for k, v in req.params.items()
                },
            }
        else:
            raise ToolTypeUnsupported.error(
                f"tool '{tool.tool_id}' has type {tool.tool_type}, which this worker cannot run yet"
            )
        # Any Python the tool starts (a bash tool's `python3 -m json.tool`) puts nothing of its working folder,
        # the project, on its import path either (second s18 review).
        env.setdefault("PYTHONSAFEPATH", "1")
        result = await run_process(
            argv,
            cwd=req.project_root,
            project=req.project_root,
            timeout=tool.timeout_seconds,
            max_output=req.max_output_bytes,
            stdin=json.dumps(req.params),
            env=env,
        )
        # (What was cut is never shown: a secret the cut split would be no longer whole where it is scrubbed.)
        if result.exit_code != 0:
            shown = result.stderr or result.stdout
            lines = shown.strip().splitlines()
            cut = result.truncated and len(shown.encode()) >= req.max_output_bytes  # (this stream was cut)
            tail = lines[:-1][-5:] if cut else lines[-5:]
            raise ToolFailed.error(
                scrub_text(
                    scrub(
                        f"tool '{tool.tool_id}' exited with {result.exit_code}: " + " | ".join(tail), passed
                    )
                )
            )
        if result.truncated:
            raise ToolFailed.error(f"tool '{tool.tool_id}' printed more than {req.max_output_bytes:,} bytes")
        try:
            return scrub(_parse_output(result.stdout), passed)
        except json.JSONDecodeError as exc:
            raise ToolFailed.error(f"tool '{tool.tool_id}' printed invalid JSON: {exc}") from None


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


def _check_parameters(tool: LocalToolSpec, params: dict[str, Any]) -> None:
    """The call's arguments against the manifest's parameters, before the tool runs: a name the tool does not
    take, or a required one missing, ended in the tool's own traceback (a TypeError from its main())."""
    schema = tool.input_schema or {}
    declared = schema.get("properties")
    if not isinstance(declared, dict) or not declared:
        return  # (no parameters declared: the tool takes what it is given)
    # (null for a required one is none: `{"text": null}` reached main(), whose traceback was the answer.)
    unknown, missing = unfit_parameters(schema, params)
    shapes = [
        f"'{n}' {problem}"
        for n, value in sorted(params.items())
        if n in declared and (problem := shape_problem(value, declared[n]))
    ]
    if unknown or missing or shapes:
        takes = ", ".join(sorted(declared))
        problems = [f"'{n}' is not a parameter of tool '{tool.tool_id}'" for n in unknown]
        problems += [f"'{n}' is required" for n in missing]
        problems += shapes
        named = [n for n in schema.get("required") or [] if n in declared] or sorted(declared)[:3]
        shape = ", ".join(f'"{n}": ...' for n in named)
        raise InputInvalid.error(
            "; ".join(problems) + f" (it takes: {takes})",
            {
                "hint": f"send {{{shape}}}; load(item_type='tool', item_id='{tool.tool_id}') shows its parameters "
                "and their types"
            },
        )


def typed_parameters(tool: LocalToolSpec, params: dict[str, Any]) -> dict[str, Any]:
    """The call's arguments as the manifest types them, where a number, true/false and text stand in for one
    another (shape_problem lets them): a number or true/false for a `string` parameter as its JSON text (`5` as
    "5"), text for a number, integer or boolean parameter as that value when it reads as one ("3" as 3). README
    trial s34: `{"text": 5}` reached word_count's main() as an int, and its traceback was the answer."""
    declared = (tool.input_schema or {}).get("properties")
    if not isinstance(declared, dict):
        return params
    typed = dict(params)
    for name, value in params.items():
        spec = declared.get(name)
        kinds = spec.get("type") if isinstance(spec, dict) else None
        kinds = [kinds] if isinstance(kinds, str) else list(kinds or [])
        if not kinds or value is None or isinstance(value, dict | list):
            continue
        problem = ""
        if isinstance(value, bool | int | float) and kinds == ["string"]:
            typed[name] = json.dumps(value)
        elif isinstance(value, str) and "string" not in kinds:
            try:
                typed[name] = coerce_value(value, spec)
            except ValueError as exc:
                problem = str(exc)  # (trial s34 (2): "many" for an integer reached main() as text)
        elif kinds == ["integer"] and isinstance(value, float):
            if value.is_integer():
                typed[name] = int(value)
            else:
                problem = f"must be an integer, got the number {value!r}"
        elif kinds == ["boolean"] and not isinstance(value, bool):
            if value in (0, 1):
                typed[name] = bool(value)
            else:
                problem = f"must be true or false, got the number {value!r}"
        if problem:
            raise InputInvalid.error(
                f"'{name}' {problem} (tool '{tool.tool_id}')",
                {
                    "hint": f"load(item_type='tool', item_id='{tool.tool_id}') shows its parameters and their types"
                },
            )
    return typed


def _check_requirements(tool: LocalToolSpec) -> dict[str, str]:
    """Check a tool's ``requires`` before it runs; the declared environment variables, to pass to it.

    A missing program or variable is an error naming each one, instead of the tool failing halfway.
    The values are remembered as secrets, so they are scrubbed from what the tool returns.
    """
    if tool.required_python:
        from packaging.specifiers import SpecifierSet

        running = ".".join(map(str, sys.version_info[:3]))
        if running not in SpecifierSet(tool.required_python):
            raise ToolFailed.error(
                f"tool '{tool.tool_id}' requires Python {tool.required_python}; the worker runs {running}",
                {"hint": "run a worker on a Python that fits, or change requires.python"},
            )
    path = child_env().get("PATH", os.defpath)
    missing = [c for c in tool.required_commands if shutil.which(c, path=path) is None]
    if missing:
        raise CommandNotFound.error(
            f"tool '{tool.tool_id}' requires {', '.join(missing)}, not found on the worker's PATH",
            {
                "hint": "install "
                + " and ".join(missing)
                + " where the worker runs, or change requires.commands"
            },
        )
    values = {name: lookup_secret(name) for name in tool.required_environment}
    unset = [name for name, value in values.items() if value is None]
    if refused := first_own(unset):
        raise SecretMissing.error(
            f"tool '{tool.tool_id}' requires a variable it may not have", {"hint": refused}
        )
    if unset:
        raise SecretMissing.error(
            f"tool '{tool.tool_id}' requires the environment variable{'s' if len(unset) > 1 else ''} "
            f"{', '.join(unset)}, not set in the worker's environment",
            {"hint": "export " + " ".join(f"{n}=..." for n in unset) + " where the worker runs"},
        )
    passed = {name: value for name, value in values.items() if value is not None}
    remember_secrets(passed)
    return passed


# (Kiwi's own git looks at no submodule's files: see _git.)
_NO_SUBMODULES = [
    ("submodule.recurse", "false"),
    ("diff.ignoreSubmodules", "all"),
    ("status.submoduleSummary", "false"),
]


async def _git(
    root: str,
    *args: str,
    timeout: float = 60.0,
    env: dict[str, str] | None = None,
    looks: bool = False,
    stdin: str = "",
) -> tuple[int, str, str]:
    """Kiwi's own git: hardened like every child (``run_process``), and the repository's filter drivers
    off, so a planted ``.git/config`` or ``.gitattributes`` runs nothing during a checkpoint; and never into
    a nested repository (a submodule or a repository the agent made and added): git status, diff and commit
    ran `git status` inside it to see whether it changed, with its own settings, whose filter drivers Kiwi
    does not turn off (review s27: a clean filter in `vendor/.git/config` ran from `git.status`, unconfined).
    ``looks``: a command that looks at the project's files (status, diff, add, commit), which git add does in
    a nested repository whatever the settings say: it runs confined (``confinement.own_git_rules``), where
    such a repository's filter runs nothing."""
    overrides, _ = await git_repository_settings(root)
    confine = None
    if looks and (abi := confinement.available()):
        index = (env or {}).get("GIT_INDEX_FILE")
        writes = (os.path.dirname(index),) if index else ()
        confine = (abi, lambda program, temp: confinement.own_git_rules(root, program, temp, writes))
    result = await run_process(
        [kiwi_git(root), *args],
        cwd=root,
        project=root,
        timeout=timeout,
        stdin=stdin,
        max_output=10_000_000,
        env=env,
        git_config=[*overrides, *_NO_SUBMODULES],
        confine=confine,
        direct=confine is None,
    )
    return result.exit_code, result.stdout, result.stderr


async def _git_ok(root: str, *args: str, env: dict[str, str] | None = None, looks: bool = False) -> str:
    code, out, err = await _git(root, *args, env=env, looks=looks)
    if code != 0:
        raise GitFailed.error(f"git {args[0]} failed: {err.strip() or out.strip()}")
    return out


# Kiwi's own records stay out of checkpoints, and a rollback never rewrites the audit trail.
KIWI_PRIVATE = (".ai/logs/", ".ai/.cache/")
# What neither a checkpoint nor git.commit takes, tracked or not (git pathspecs): Kiwi's settings, records and
# state, and the hidden files below the tool folders (a tool's `.env`), which the kernel's wall keeps from
# folder reads. Hostile review s34: a checkpoint's `git add -A` put a tool's `.env` and `.ai/config` into
# refs/kiwi/checkpoints/RUN/N, where `git grep SECRET REF` printed them, and git.commit with no paths committed
# them to the human's branch. (Rollbacks never touch protected places: see _rolled_back.)
SECRET_PATHSPECS = (
    ".ai/config",
    ".ai/logs",
    ".ai/.cache",
    ".kiwi",
    *(f":(glob){folder}/**/.*" for folder in confinement.TOOL_FOLDERS),
    *(f":(glob){folder}/**/.*/**" for folder in confinement.TOOL_FOLDERS),
    # A nested project's too (review s35: a checkpoint took `services/api/.ai/tools/t/.env` into its ref).
    *(f":(glob,icase)**/.ai/{place}/**" for place in ("config", "logs", ".cache")),
    *(f":(glob,icase)**/{folder}/**/.*" for folder in confinement.TOOL_FOLDERS),
    *(f":(glob,icase)**/{folder}/**/.*/**" for folder in confinement.TOOL_FOLDERS),
)


def _own(path: str) -> bool:
    return not path.startswith(KIWI_PRIVATE)


def _rolled_back(path: str) -> bool:
    """Whether a rollback writes or removes ``path``: not in Kiwi's protected places (kiwi.protected), which
    a human changes (review s28: a checkpoint taken while `.gitignore` named `.ai/config/`, then rolled back
    with it emptied, removed the harness and trusted keys as files made since; an older harness, registry or
    signed directive written back had what a human had taken out since)."""
    return _own(path) and protected_root(path) is None


# Checkpoint commits are Kiwi's, so they work without a configured git identity.
KIWI_IDENTITY = {
    "GIT_AUTHOR_NAME": "Kiwi",
    "GIT_AUTHOR_EMAIL": "kiwi@localhost",
    "GIT_COMMITTER_NAME": "Kiwi",
    "GIT_COMMITTER_EMAIL": "kiwi@localhost",
}


class _ScratchIndex:
    """A throwaway git index, so checkpoints never touch the user's index."""

    def __enter__(self) -> dict[str, str]:
        # (In a folder of its own: the only place outside the project a confined git add writes.)
        self.folder = tempfile.mkdtemp(prefix="kiwi-index-")
        self.path = os.path.join(self.folder, "index")
        return {"GIT_INDEX_FILE": self.path, **KIWI_IDENTITY}

    def __exit__(self, *exc: object) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


# Pathspecs taken as names, not patterns.
_LITERAL = {"GIT_LITERAL_PATHSPECS": "1"}


def _refuse_denied(req: GitRequest) -> None:
    """A path the run explicitly denies, named to git.diff or git.commit: refused as filesystem.read refuses it."""
    for path in req.paths:
        hit = first_match(req.deny_fs, relative(path))
        if hit is not None:
            raise PermissionDenied.error(f"'{path}' is explicitly denied by '{hit}'")


async def _require_repo(root: str) -> str:
    """The project's folder in its repository (``sub/``; '' at the top: porcelain output names paths from the
    repository's top), or GitUnavailable saying why git tools cannot work here."""
    where = await _repository(root)
    if where is None:
        raise GitUnavailable.error("not a git repository: git tools are unavailable here")
    if isinstance(where, str):
        raise GitUnavailable.error(where)
    return where[1]


async def _repository(root: str) -> tuple[str, str] | str | None:
    """The project's repository's top and the project's folder in it, one `git rev-parse`; None with no
    repository; or why Kiwi's git cannot work in the one there is: it begins above the project, and the git that
    looks at the project's files runs confined to the project, where that repository's folder is out of reach
    (third review s35: git.status answered a clean tree, git.diff 'not a git repository')."""
    code, out, _ = await _git(root, "rev-parse", "--show-toplevel", "--show-prefix")
    lines = out.splitlines()
    if code != 0 or not lines:
        return None
    top, prefix = lines[0], (lines[1] if len(lines) > 1 else "")
    if confinement.available() and os.path.realpath(top) != os.path.realpath(root):
        return (
            f"the project is inside the git repository {top}, which begins above it: Kiwi's git tools and "
            "checkpoints, like every command Kiwi runs, reach only the project's own folder: they work on a "
            "repository whose top is the project (`git init` in it)"
        )
    return top, prefix


def _in_project(name: str, prefix: str) -> str | None:
    """A name git gives from the repository's top, relative to the project; None outside it."""
    return name[len(prefix) :] if name.startswith(prefix) else None


def _withheld(count: int) -> dict[str, Any]:
    if not count:
        return {}
    return {
        "withheld": count,
        "note": f"{count} changed path(s) left out: the grants this call is checked against do not let it read them "
        "(denied, a protected place no grant names, or a tool's hidden file)",
    }


class GitActivities:
    @activity.defn(name="git_status")
    async def git_status(self, req: GitRequest) -> dict[str, Any]:
        prefix = await _require_repo(req.project_root)
        sight = GitSight(req.project_root, req.read_grants, req.deny_fs)
        out = await _git_ok(
            req.project_root,
            "status",
            "--porcelain=v1",
            "--branch",
            "-z",
            "--ignore-submodules=all",
            looks=True,
        )
        entries = split_z(out)
        branch = entries[0][3:] if entries and entries[0].startswith("## ") else ""
        # (A repository with no commit yet: git's header says so, and the branch is its last word.)
        branch = branch.removeprefix("No commits yet on ").removeprefix("Initial commit on ")
        changes: list[str] = []
        withheld = 0
        listed = iter(entries[1:] if entries and entries[0].startswith("## ") else entries)
        for entry in listed:
            code, path = entry[:2], entry[3:]
            # (-z gives a rename's or copy's source after it: `R  NEW\0OLD`.)
            old = next(listed, None) if "R" in code or "C" in code else None
            rels = [_in_project(name, prefix) for name in (path, *([old] if old is not None else []))]
            if any(rel is None or not sight.sees(rel) for rel in rels):
                withheld += 1
                continue
            shown = [quoted(rel) for rel in rels if rel is not None]
            changes.append(f"{code} {shown[1]} -> {shown[0]}" if len(shown) > 1 else f"{code} {shown[0]}")
        return {"branch": branch, "changes": changes, **_withheld(withheld)}

    @activity.defn(name="git_diff")
    async def git_diff(self, req: GitRequest) -> dict[str, Any]:
        await _require_repo(req.project_root)
        _refuse_denied(req)
        sight = GitSight(req.project_root, req.read_grants, req.deny_fs)
        quiet = ("--no-ext-diff", "--no-textconv", "--ignore-submodules=all", "--relative")
        names = split_z(
            await _git_ok(
                req.project_root,
                "diff",
                "--name-only",
                "-z",
                "--no-renames",
                *quiet,
                "--",
                *req.paths,
                looks=True,
            )
        )
        seen = [name for name in names if sight.sees(name)]
        diff = []
        for chunk in chunks(seen):
            # (Each name as a name: a file called `*` is no pattern of every file.)
            diff.append(
                await _git_ok(req.project_root, "diff", *quiet, "--", *chunk, env=_LITERAL, looks=True)
            )
        return {"diff": "".join(diff), **_withheld(len(names) - len(seen))}

    @activity.defn(name="git_commit")
    async def git_commit(self, req: GitRequest) -> dict[str, Any]:
        """Commit the changes (tracked or not, not ignored) below ``paths`` that the run may write, and only those:
        what else the index holds (a human's staged work) stays staged, uncommitted. Review s35: git.commit
        committed what the run may not write (a human's work in progress) and, before, what it may not read."""
        root = req.project_root
        prefix = await _require_repo(root)
        _refuse_denied(req)
        for path in req.paths or ["."]:
            confine(root, path, ["**"], [])
        # (A request from before session 35 carries no write grants: its run's reads decide, as they did.)
        sight = GitSight(
            root, req.write_grants if req.write_grants is not None else req.read_grants, req.deny_fs
        )
        listed = split_z(
            await _git_ok(
                root,
                "status",
                "--porcelain=v1",
                "-z",
                "--untracked-files=all",
                "--no-renames",
                "--ignore-submodules=all",
                "--",
                *(req.paths or ["."]),
                looks=True,
            )
        )
        changes = [(entry[:2], _in_project(entry[3:], prefix)) for entry in listed]
        taken = [
            (code, rel)
            for code, rel in changes
            if rel is not None and sight.sees(rel) and not secret_place(rel)
        ]
        left = {"left_out": len(changes) - len(taken)} if len(taken) < len(changes) else {}
        if not taken:
            why = "nothing to commit" + (" that this run may write" if changes else "")
            return {"committed": False, "reason": why, **left}
        new = [rel for code, rel in taken if code == "??"]
        for chunk in chunks(new):
            code, _, err = await _git(root, "add", "--", *chunk, env=_LITERAL, looks=True)
            if code != 0:
                raise GitFailed.error(f"git add failed: {err.strip()}")
        code, out, err = await _git(
            root,
            "commit",
            "--only",
            "-m",
            req.message or "kiwi commit",
            "--pathspec-from-file=-",
            "--pathspec-file-nul",
            env={**await git_identity(root), **_LITERAL},
            looks=True,
            stdin="\0".join(rel.rstrip("/") for _, rel in taken),
        )
        if code != 0 and "nothing to commit" in (out + err):
            return {"committed": False, "reason": "nothing to commit", **left}
        if code != 0:
            raise GitFailed.error(f"git commit failed: {err.strip() or out.strip()}")
        _, sha, _ = await _git(root, "rev-parse", "HEAD")
        return {"committed": True, "sha": sha.strip(), "files": len(taken), **left}

    @activity.defn(name="git_checkpoint")
    async def git_checkpoint(self, req: GitRequest) -> CheckpointResult:
        """Snapshot the project's files (tracked and untracked, not ignored) into a Kiwi ref.

        The user's branch, index and files are left as they are.
        """
        root = req.project_root
        where = await _repository(root)
        if where is None:
            return CheckpointResult(
                available=False,
                reason="checkpoints unavailable: the project is not a git repository",
                hint="run `git init` in the project to enable checkpoints",
            )
        if isinstance(where, str):
            return CheckpointResult(available=False, reason=f"checkpoints unavailable: {where}")
        code, head, _ = await _git(root, "rev-parse", "--verify", "-q", "HEAD^{commit}")
        with _ScratchIndex() as env:
            if code == 0:
                await _git_ok(root, "read-tree", head.strip(), env=env)
            # (No exclusions here: one naming a place .gitignore names fails `git add`. Taken out below.)
            await _git_ok(root, "add", "-A", "--", ".", env=env, looks=True)
            # (Tracked in HEAD, read into the index above: not the checkpoint's business either.)
            await _git(
                root, "rm", "-r", "-q", "--cached", "--ignore-unmatch", "--", *SECRET_PATHSPECS, env=env
            )
            tree = (await _git_ok(root, "write-tree", env=env)).strip()
            parents = ["-p", head.strip()] if code == 0 else []
            message = req.message or f"kiwi checkpoint {req.checkpoint} of {req.run_id}"
            commit = (await _git_ok(root, "commit-tree", tree, *parents, "-m", message, env=env)).strip()
        ref = f"{CHECKPOINT_REFS}/{req.checkpoint}"
        await _git_ok(root, "update-ref", ref, commit)
        files = [
            p
            for p in (await _git_ok(root, "ls-tree", "-r", "--name-only", commit, "--", ".")).splitlines()
            if _own(p)
        ]
        return CheckpointResult(
            available=True, checkpoint=req.checkpoint, ref=ref, commit=commit, files=len(files)
        )

    @activity.defn(name="git_rollback")
    async def git_rollback(self, req: GitRequest) -> dict[str, Any]:
        """Make the project's files what they were at a checkpoint; files created since are removed."""
        root = req.project_root
        code, _, _ = await _git(root, "rev-parse", "--is-inside-work-tree")
        if code != 0:
            return {
                "available": False,
                "reason": "checkpoints unavailable: the project is not a git repository",
            }
        label = checkpoint_label(req.checkpoint)
        if label is None:
            # (Any ref was taken: `refs/heads/B` made the files any commit's, protected ones too.)
            raise CheckpointNotFound.error(
                f"'{req.checkpoint}' is not a Kiwi checkpoint",
                {"hint": f"name one the run's status lists (RUN/N, or {CHECKPOINT_REFS}/RUN/N)"},
            )
        # (The exact ref: rev-parse also tries refs/heads/NAME and refs/tags/NAME, where `git branch
        # refs/kiwi/checkpoints/X` puts one.)
        code, found, _ = await _git(root, "show-ref", "--verify", "--hash", f"{CHECKPOINT_REFS}/{label}")
        if code == 0:
            code, commit, _ = await _git(root, "rev-parse", "--verify", "-q", f"{found.strip()}^{{commit}}")
        if code != 0:
            raise CheckpointNotFound.error(
                f"no checkpoint '{req.checkpoint}'", {"hint": "the run's status lists its checkpoints"}
            )
        commit = commit.strip()
        # (Nor the files git's settings name, nor a link above one: a checkpoint's `.gitconfig` may be one an
        # agent wrote before the human's include named it, or under a grant naming it another run had; its
        # `scripts` a link to the agent's folder, where the human has a `scripts/watch.sh` now, review s32.)
        named = await asyncio.to_thread(settings_named, root)
        kept = {
            p
            for p in (await _git_ok(root, "ls-tree", "-r", "--name-only", commit, "--", ".")).splitlines()
            if _rolled_back(p) and gitnamed.in_the_way(named, p, [], below=True) is None
        }
        now = {
            p
            for p in (
                await _git_ok(root, "ls-files", "-c", "-o", "--exclude-standard", "--", ".")
            ).splitlines()
            if _rolled_back(p) and gitnamed.in_the_way(named, p, [], below=True) is None
        }
        # (A checkpoint's files can make a repository by its layout, or give one the agent's config: the same
        # watch as for a shell command, review s31.)
        real = os.path.realpath(root)
        watch = _Watch(real, [], [""], [], whole=True, git=False)  # (no grant names a repository for it)
        before = await asyncio.to_thread(watch.look, None)
        with _ScratchIndex() as env:
            await _git_ok(root, "read-tree", commit, env=env)
            overrides, _ = await git_repository_settings(root)
            result = await run_process(
                ["git", "checkout-index", "-f", "--stdin"],
                cwd=root,
                project=root,
                timeout=120,
                max_output=1_000_000,
                stdin="\n".join(sorted(kept)) + "\n",
                env=env,
                git_config=overrides,
                direct=True,
            )
            if result.exit_code != 0:
                raise GitFailed.error(f"git checkout-index failed: {result.stderr.strip()}")
        removed = []
        for path in sorted(now - kept):
            confine(root, str(Path(path).parent), ["**"], [])
            if confinement.in_layout(real, posixpath.dirname(path) or ".", []):
                # (Review s31, fourth round: the human's fixture left out of a checkpoint by .gitignore lost its
                # HEAD and config to the rollback, which then let the agent write its config. A rollback
                # removes nothing in a repository by its layout.)
                continue
            target = Path(root) / path
            if target.is_file() or target.is_symlink():
                target.unlink()
                removed.append(path)
        made = watch.made(before or {}, await asyncio.to_thread(watch.look, None) or {})
        if moved := confinement.set_aside(real, made, _stamp()) if made else []:
            raise _denied(
                f"the checkpoint's files made {_made_and_aside(moved)}; the rest of the checkpoint is restored"
            )
        return {
            "available": True,
            "checkpoint": req.checkpoint,
            "commit": commit,
            "restored": len(kept),
            "removed": removed,
        }
