"""``git.status``, ``git.diff``, ``git.commit`` and Kiwi's checkpoints: git run by the worker in the
project's repository, filtered by the run's grants, never touching what the human keeps private."""

from __future__ import annotations

import asyncio
import os
import posixpath
import shutil
import tempfile
from pathlib import Path
from typing import Any

from temporalio import activity

from activities import confinement, gitnamed, setaside
from activities.diskchecks import _denied, _stamp
from activities.filesystem import confine, relative, settings_named
from activities.gitsight import SECRET_PATHSPECS, GitSight, chunks, quoted, secret_place, split_z
from activities.placewatch import _made_and_aside, _Watch
from activities.process import kiwi_git, run_process
from activities.repochecks import git_identity, git_repository_settings
from kiwi.contracts import CheckpointResult, GitRequest
from kiwi.errors import CheckpointNotFound, GitFailed, GitUnavailable, PermissionDenied
from kiwi.globs import first_match
from kiwi.protected import protected_root
from kiwi.toolargs import CHECKPOINT_REFS, checkpoint_label

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
    code, out, _ = await _git(root, "rev-parse", "--show-toplevel", "--show-prefix", "--git-common-dir")
    lines = out.splitlines()
    if code != 0 or len(lines) < 3:
        return None
    top, prefix, common = lines[0], lines[1], lines[2]
    if confinement.available() and os.path.realpath(top) != os.path.realpath(root):
        return (
            f"the project is inside the git repository {top}, which begins above it: Kiwi's git tools and "
            "checkpoints, like every command Kiwi runs, reach only the project's own folder: they work on a "
            "repository whose top is the project (`git init` in it)"
        )
    common = os.path.realpath(os.path.join(root, common))
    if not _below(common, os.path.realpath(root)):
        # (Hostile review s37: a project that is a worktree of another's repository shares its refs; git.rollback,
        # whose git ran outside the wall, restored the other project's checkpoint, its denied .env too.)
        return (
            f"the project's git folder {common} is outside it (a worktree of another repository, or a git "
            "folder kept elsewhere): its refs and objects are shared with what lies outside the project, so Kiwi's "
            "git tools and checkpoints work only on a repository whose git folder is inside the project"
        )
    return top, prefix


def _below(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


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
            if req.deny_fs:
                # Nor what the run may not read (review s37: a denied .env was in the checkpoint's ref).
                listed = split_z(await _git_ok(root, "ls-files", "-z", "--cached", env=env))
                denied = [p for p in listed if first_match(req.deny_fs, p) is not None]
                for chunk in chunks(denied):
                    await _git_ok(root, "rm", "-q", "--cached", "--", *chunk, env={**env, **_LITERAL})
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
        where = await _repository(root)
        if where is None:
            return {
                "available": False,
                "reason": "checkpoints unavailable: the project is not a git repository",
            }
        if isinstance(where, str):
            # (Hostile review s37: it looked only for a work tree, and reached a worktree's shared refs.)
            raise GitUnavailable.error(f"checkpoints unavailable: {where}")
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
        left: list[str] = []
        changed = set(split_z(await _git_ok(root, "diff", "--name-only", "-z", commit, "--", ".")))
        if req.write_grants is not None:
            # Only what the run may write is restored or removed (hostile review s36: a run granted notes/**
            # overwrote a human's edit under src/ and deleted their new file). What else differs from the
            # checkpoint is left as it is, and named.
            sight = GitSight(root, req.write_grants, req.deny_fs)
            outside = {p for p in kept | now if not sight.sees(p)}
            left = sorted(p for p in outside if p in changed or (p in now) != (p in kept))
            kept -= outside
            now -= outside
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
        # What the checkout changed: a file that differed from the checkpoint or was not there (every file of the
        # checkpoint is written; "restored" counted them all, unchanged ones too: review s36).
        restored = sorted(p for p in kept if p in changed or p not in now)
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
        if moved := setaside.set_aside(real, made, _stamp()) if made else []:
            raise _denied(
                f"the checkpoint's files made {_made_and_aside(moved)}; the rest of the checkpoint is restored"
            )
        return {
            "available": True,
            "checkpoint": req.checkpoint,
            "commit": commit,
            "restored": len(restored),
            "restored_files": restored[:100],
            "removed": removed,
            **({"left_outside_grants": left[:100], "left_count": len(left)} if left else {}),
        }
