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
from kiwi.contracts import CheckpointResult, CommitFile, CommitPlan, GitRequest
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


async def _git_ok(
    root: str, *args: str, env: dict[str, str] | None = None, looks: bool = False, stdin: str = ""
) -> str:
    code, out, err = await _git(root, *args, env=env, looks=looks, stdin=stdin)
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
        # (README trial s39: the message alone, with no word of the fix.)
        raise GitUnavailable.error(
            "not a git repository: git tools are unavailable here",
            {"hint": "a human makes the project a repository (`git init` in its folder, and a first commit)"},
        )
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


async def _to_commit(req: GitRequest) -> tuple[str, list[tuple[str, str | None]], list[tuple[str, str]]]:
    """The project's folder in its repository, the changes below ``req.paths`` (git status's code and the path
    from the project, None outside it), and those git.commit takes: what the run may write, no secret place."""
    root = req.project_root
    prefix = await _require_repo(root)
    _refuse_denied(req)
    for path in req.paths or ["."]:
        confine(root, path, ["**"], [])
    # (A request from before session 35 carries no write grants: its run's reads decide, as they did.)
    sight = GitSight(root, req.write_grants if req.write_grants is not None else req.read_grants, req.deny_fs)
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
        (code, rel) for code, rel in changes if rel is not None and sight.sees(rel) and not secret_place(rel)
    ]
    return prefix, changes, taken


async def _plan(req: GitRequest) -> CommitPlan:
    """What git.commit would commit now (see GitActivities.git_commit_plan): the files as the tree it would make
    differs from the branch's, each with its content, so the approver is shown exactly what changes."""
    root = req.project_root
    prefix, changes, taken = await _to_commit(req)
    left_out = len(changes) - len(taken)
    if not taken:
        return CommitPlan(
            reason="nothing to commit" + (" that this run may write" if changes else ""), left_out=left_out
        )
    code, head, _ = await _git(root, "rev-parse", "--verify", "-q", "HEAD^{commit}")
    base = head.strip() if code == 0 else ""
    branch = (await _git(root, "symbolic-ref", "-q", "HEAD"))[1].strip()
    names = [rel for _, rel in taken]
    with _ScratchIndex() as env:
        if base:
            await _git_ok(root, "read-tree", base, env=env)
        for chunk in chunks(names):
            # (-A: a removed file's removal is staged too.)
            await _git_ok(root, "add", "-A", "--", *chunk, env={**env, **_LITERAL}, looks=True)
        tree = (await _git_ok(root, "write-tree", env=env)).strip()
    # (Written, so the approver's `git diff` finds it: a first commit is compared with the empty tree. Review s38.)
    empty = "" if base else (await _git_ok(root, "mktree", stdin="")).strip()
    changed = await _changed(root, base or empty, tree)
    wanted = {prefix + rel for rel in names}
    if extra := sorted(set(changed) - wanted):
        # (A file replaced by a folder, or the reverse: `git add -A FILE` took what lies below it. Review s38.)
        raise GitFailed.error(
            f"committing {', '.join(sorted(wanted)[:5])} would also change {', '.join(extra[:10])}",
            {"hint": "name each path it commits in 'paths'"},
        )
    files = [
        CommitFile(path=path, shown=path[len(prefix) :], change=kind, mode=mode, blob=blob)
        for path, (kind, mode, blob) in sorted(changed.items())
    ]
    return CommitPlan(base=base, tree=tree, empty_tree=empty, branch=branch, files=files, left_out=left_out)


async def _changed(root: str, old: str, new: str) -> dict[str, tuple[str, str, str]]:
    """What differs from tree (or commit) ``old`` to ``new``, path by path (from the repository's top): its change
    (A, M, D, T), and its mode and blob in ``new`` ('' for a removal)."""
    out = split_z(await _git_ok(root, "diff-tree", "-r", "-z", "--no-renames", "--raw", old, new))
    found: dict[str, tuple[str, str, str]] = {}
    for info, path in zip(out[::2], out[1::2], strict=False):
        _, mode, _, blob, kind = info.lstrip(":").split()
        removed = kind == "D"
        found[path] = (kind, "" if removed else mode, "" if removed else blob)
    return found


async def _commit_approved(req: GitRequest, plan: CommitPlan) -> dict[str, Any]:
    """Commit what the approval showed: the files' content fixed when it was asked (``plan``), on the branch as it
    is now, whatever the files hold since. Refused if the commit would change anything else (review s38: a file a
    human committed meanwhile where the approved one's folder goes was dropped from the branch), or if the branch
    has moved since and changed one of those files (the approver saw a change from the commit it was then). The
    branch moves by compare-and-swap, and the human's index takes the committed files, as `git commit --only`
    leaves it."""
    root = req.project_root
    await _require_repo(root)
    branch = (await _git(root, "symbolic-ref", "-q", "HEAD"))[1].strip()
    if plan.branch and branch != plan.branch:
        # (The approval named the branch: HEAD switched meanwhile would take the commit elsewhere.)
        raise GitFailed.error(
            f"HEAD is on {branch.removeprefix('refs/heads/') or 'no branch (detached)'} now; the approval was for a "
            f"commit to {plan.branch.removeprefix('refs/heads/')}",
            {"hint": "switch back, or call git.commit again for a new approval"},
        )
    code, head, _ = await _git(root, "rev-parse", "--verify", "-q", "HEAD^{commit}")
    head = head.strip() if code == 0 else ""
    index_info = "".join(
        f"{f.mode} {f.blob}\t{f.path}\0" if f.blob else f"0 {'0' * 40}\t{f.path}\0" for f in plan.files
    )
    tree = plan.tree
    if head != plan.base:
        with _ScratchIndex() as env:
            if head:
                await _git_ok(root, "read-tree", head, env=env)
            await _git_ok(root, "update-index", "-z", "--index-info", env=env, stdin=index_info)
            tree = (await _git_ok(root, "write-tree", env=env)).strip()
    names = [f.path for f in plan.files]
    if extra := sorted(set(await _changed(root, head or plan.empty_tree, tree)) - set(names)):
        raise GitFailed.error(
            f"the approved commit would also change {', '.join(extra[:10])}, which the approval did not show (the "
            "branch changed there since it was asked)",
            {"hint": "call git.commit again: a new approval shows the change on the branch as it is now"},
        )
    head_tree = (await _git_ok(root, "rev-parse", f"{head}^{{tree}}")).strip() if head else ""
    if tree == head_tree:
        # (A retried attempt finds its own commit made: the branch's tip, on the base, with that tree.)
        parent = (await _git(root, "rev-parse", "--verify", "-q", f"{head}^"))[1].strip()
        if head != plan.base and parent == plan.base:
            return {"committed": True, "sha": head, "files": len(plan.files)}
        return {"committed": False, "reason": "nothing to commit: the branch holds what was approved"}
    if head != plan.base:
        moved = split_z(
            await _git_ok(
                root,
                "diff",
                "--name-only",
                "-z",
                "--no-renames",
                plan.base or plan.empty_tree,
                head,
                "--",
                *names,
                env=_LITERAL,
            )
        )
        if moved:
            raise GitFailed.error(
                f"the branch moved since the approval was asked (from {plan.base[:12] or 'no commit'} to "
                f"{head[:12]}) and changed {', '.join(moved[:10])}: the approved change was made on what those "
                "files were then",
                {"hint": "call git.commit again: a new approval shows the change on the branch as it is now"},
            )
    parents = ["-p", head] if head else []
    commit = (
        await _git_ok(
            root,
            "commit-tree",
            tree,
            *parents,
            "-m",
            req.message or "kiwi commit",
            env=await git_identity(root),
        )
    ).strip()
    # (Compare-and-swap: a commit the human made meanwhile is never overwritten. '' : the branch has none yet.)
    code, _, err = await _git(root, "update-ref", "-m", "kiwi: git.commit (approved)", "HEAD", commit, head)
    if code != 0:
        raise GitFailed.error(
            f"the branch moved while committing: {err.strip()}", {"hint": "call git.commit again"}
        )
    code, _, err = await _git(root, "update-index", "-z", "--index-info", stdin=index_info)
    left = {"left_out": plan.left_out} if plan.left_out else {}
    if code != 0:
        left["index"] = (
            f"committed, but git's index was not brought in line ({err.strip()}): `git reset -q -- "
            f"{' '.join(f.shown for f in plan.files[:5])}` does it"
        )
    # What is still to commit below those paths changed after the approval was asked: named, left as it is.
    _, _, later = await _to_commit(req)
    after = (
        {
            "not_committed": [rel for _, rel in later],
            "note": "changed after the approval was asked, so not approved: left uncommitted",
        }
        if later
        else {}
    )
    return {"committed": True, "sha": commit, "files": len(plan.files), **left, **after}


class GitActivities:
    @activity.defn(name="git_status")
    async def git_status(self, req: GitRequest) -> dict[str, Any]:
        """The changes the run may read, below ``paths`` when given (they were taken and left unused, session 38)."""
        prefix = await _require_repo(req.project_root)
        _refuse_denied(req)
        for path in req.paths:
            confine(req.project_root, path, ["**"], [])
        sight = GitSight(req.project_root, req.read_grants, req.deny_fs)
        out = await _git_ok(
            req.project_root,
            "status",
            "--porcelain=v1",
            "--branch",
            "-z",
            "--ignore-submodules=all",
            "--",
            *req.paths,
            env=_LITERAL,
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
        committed what the run may not write (a human's work in progress) and, before, what it may not read.
        An approved commit commits what its approval showed (``req.approved``: see _commit_approved)."""
        if req.approved is not None:
            return await _commit_approved(req, req.approved)
        root = req.project_root
        _, changes, taken = await _to_commit(req)
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

    @activity.defn(name="git_commit_plan")
    async def git_commit_plan(self, req: GitRequest) -> CommitPlan:
        """What git.commit would commit now, its files' content stored and fixed (``CommitPlan``): asked when the
        commit needs approval, so the approver is shown it and the approved commit takes exactly that."""
        return await _plan(req)

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
