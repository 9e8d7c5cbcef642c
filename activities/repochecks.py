"""What git obeys in the repository a shell ``git`` command runs in: settings that run programs
(refused), the identity Kiwi commits as, and the repository the command may touch (the project's own)."""

from __future__ import annotations

import os
import re

from activities import confinement
from activities.diskchecks import _denied, _real_relative
from activities.process import run_process
from kiwi.contracts import CommandRequest
from kiwi.protected import protected_root
from kiwi.shellpolicy import protected_inside

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
