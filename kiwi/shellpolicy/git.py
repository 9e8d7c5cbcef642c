"""git: subcommands, options and the paths each reads or writes."""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence

from kiwi.globs import glob_covered
from kiwi.protected import rule_in_force
from kiwi.shellpolicy.options import _is_number
from kiwi.shellpolicy.paths import _Grants, _path_like
from kiwi.shellpolicy.results import ShellVerdict, _no
from kiwi.shellpolicy.rules import GIT_ADD_TREES, GIT_COMMIT_INDEX, SHELL_REVIEW_S28

GIT_SUBCOMMANDS = frozenset(
    [
        "status",
        "diff",
        "log",
        "show",
        "add",
        "commit",
        "rm",
        "mv",
        "restore",
        "checkout",
        "switch",
        "branch",
        "tag",
        "stash",
        "reset",
        "rev-parse",
        "ls-files",
        "ls-tree",
        "blame",
        "annotate",
        "grep",
        "init",
        "merge",
        "shortlog",
        "describe",
        "cat-file",
        "rev-list",
        "show-ref",
        "for-each-ref",
        "merge-base",
        "name-rev",
        "diff-tree",
        "diff-files",
        "diff-index",
        "cherry-pick",
        "revert",
        "whatchanged",
        "count-objects",
        "check-ignore",
        "check-attr",
        "cherry",
        "range-diff",
        "reflog",
        "version",
    ]
)
GIT_REFUSED_SUBCOMMANDS = {
    **{
        c: "runs programs from configuration or the command line"
        for c in (
            "config",
            "filter-branch",
            "submodule",
            "bisect",
            "difftool",
            "mergetool",
            "rebase",
            "am",
            "help",
            "instaweb",
            "web--browse",
            "send-email",
            "daemon",
            "worktree",
            "maintenance",
            "gc",
            "repack",
            "credential",
            "fsmonitor--daemon",
            "var",
            "apply",
            "format-patch",
            "notes",
            "clean",
            "sparse-checkout",
        )
    },
    **{
        c: "talks to other repositories over the network"
        for c in (
            "fetch",
            "pull",
            "push",
            "clone",
            "remote",
            "archive",
            "ls-remote",
            "bundle",
            "request-pull",
            "upload-pack",
            "receive-pack",
            "upload-archive",
            "http-backend",
            "shell",
        )
    },
    **{
        c: "writes git's object store or refs directly"
        for c in (
            "hash-object",
            "update-index",
            "update-ref",
            "commit-tree",
            "read-tree",
            "checkout-index",
            "write-tree",
            "symbolic-ref",
            "mktree",
            "mktag",
            "fast-import",
            "replace",
            "prune",
            "fsck",
            "unpack-objects",
            "index-pack",
            "pack-objects",
            "merge-file",
            "merge-index",
            "merge-tree",
        )
    },
}
# Options refused before the subcommand (they point git somewhere else or make it run something).
_GIT_GLOBAL_REFUSED = {
    "-c": "sets configuration, which can make git run any program (alias.x=!cmd, core.fsmonitor)",
    "--config-env": "sets configuration, which can make git run any program",
    "--exec-path": "changes where git finds the programs it runs",
    "-C": "runs git in another folder",
    "--git-dir": "points git at another repository",
    "--work-tree": "points git at another folder",
    "--namespace": "changes the refs git sees",
    "-p": "starts a pager",
    "--paginate": "starts a pager",
    "--bare": "treats the folder as a bare repository",
    "--super-prefix": "is internal to git",
    "--list-cmds": "is internal to git",
    "--html-path": "is not needed",
    "--man-path": "is not needed",
    "--info-path": "is not needed",
    "--help": "starts a manual viewer",
    "-h": "starts a manual viewer",
}
_GIT_GLOBAL_OK = {
    "--no-pager",
    "-P",
    "--no-replace-objects",
    "--literal-pathspecs",
    "--glob-pathspecs",
    "--noglob-pathspecs",
    "--icase-pathspecs",
    "--no-optional-locks",
    "--version",
}
# Refused anywhere before "--", whatever the subcommand.
GIT_REFUSED_OPTIONS = {
    "--upload-pack": "runs the program it names",
    "--receive-pack": "runs the program it names",
    "--exec": "runs the program it names",
    "-x": "runs a command (rebase) or is not needed here",
    "--ext-diff": "runs the external diff program from configuration",
    "-O": "opens files in a pager (git grep) or reads an order file",
    "--open-files-in-pager": "starts a pager",
    "--template": "copies hooks from the folder it names",
    "--config-env": "sets configuration",
    "--exec-path": "changes where git finds the programs it runs",
    "--git-dir": "points git at another repository",
    "--work-tree": "points git at another folder",
    "--namespace": "changes the refs git sees",
    "--paginate": "starts a pager",
    "--help": "starts a manual viewer",
    "--separate-git-dir": "puts the repository somewhere else",
    "--interactive": "starts an editor",
    "--edit": "starts an editor",
    "--patch": "starts an interactive session that runs diff filters",
    "--upload-archive": "runs the program it names",
    "--remote": "talks to another repository",
}
# Per subcommand: options whose value follows as the next argument, and what the value is.
_GIT_VALUES: dict[str, dict[str, str]] = {
    "*": {
        "--output": "write",
        "--pathspec-from-file": "read",
        "-n": "value",
        "--max-count": "value",
        "--author": "value",
        "--committer": "value",
        "--grep": "value",
        "--since": "value",
        "--until": "value",
        "--after": "value",
        "--before": "value",
        "-S": "value",
        "-G": "value",
        "-L": "value",
        "--format": "value",
        "--pretty": "value",
        "--date": "value",
        "--skip": "value",
        "--diff-filter": "value",
        "--src-prefix": "value",
        "--dst-prefix": "value",
        "--line-prefix": "value",
        "--encoding": "value",
    },
    "commit": {
        "-m": "value",
        "--message": "value",
        "-F": "read",
        "--file": "read",
        "-C": "value",
        "-c": "value",
        "--reuse-message": "value",
        "--reedit-message": "value",
        "-t": "read",
        "--fixup": "value",
        "--squash": "value",
        "--trailer": "value",
        "--cleanup": "value",
        "-u": "value",
        "--untracked-files": "value",
        "--author": "value",
        "--date": "value",
    },
    "tag": {
        "-m": "value",
        "--message": "value",
        "-F": "read",
        "--file": "read",
        "-u": "value",
        "--local-user": "value",
        "--contains": "value",
        "--points-at": "value",
        "--sort": "value",
        "--format": "value",
        "--merged": "value",
        "--no-merged": "value",
        "--cleanup": "value",
    },
    "branch": {
        "--contains": "value",
        "--merged": "value",
        "--no-merged": "value",
        "--sort": "value",
        "--format": "value",
        "--set-upstream-to": "value",
        "-u": "value",
        "--points-at": "value",
    },
    "blame": {
        "-L": "value",
        "-S": "read",
        "--contents": "read",
        "--ignore-revs-file": "read",
        "--ignore-rev": "value",
    },
    "grep": {
        "-e": "value",
        "-f": "read",
        "-m": "value",
        "--max-count": "value",
        "-A": "value",
        "-B": "value",
        "-C": "value",
        "--after-context": "value",
        "--before-context": "value",
        "--context": "value",
        "--max-depth": "value",
        "--threads": "value",
    },
    "stash": {"-m": "value", "--message": "value"},
    "merge": {
        "-m": "value",
        "-F": "read",
        "--file": "read",
        "-s": "value",
        "--strategy": "value",
        "-X": "value",
        "--strategy-option": "value",
    },
    "restore": {"-s": "value", "--source": "value"},
    "checkout": {"-b": "value", "-B": "value", "--orphan": "value", "--conflict": "value"},
    "switch": {
        "-c": "value",
        "-C": "value",
        "--create": "value",
        "--force-create": "value",
        "--orphan": "value",
        "--conflict": "value",
    },
    "cherry-pick": {
        "-m": "value",
        "--mainline": "value",
        "-s": "value",
        "--strategy": "value",
        "-X": "value",
        "--strategy-option": "value",
    },
    "revert": {"-m": "value", "--mainline": "value", "-s": "value", "--strategy": "value"},
    "init": {"-b": "value", "--initial-branch": "value", "--shared": "value", "--object-format": "value"},
    "cat-file": {},
    "rev-parse": {},
    "ls-files": {
        "--exclude": "value",
        "-X": "read",
        "--exclude-from": "read",
        "--exclude-per-directory": "value",
    },
    "shortlog": {"-w": "value", "--group": "value"},
    "describe": {
        "--match": "value",
        "--exclude": "value",
        "--candidates": "value",
        "--dirty": "value",
        "--broken": "value",
        "--abbrev": "value",
    },
}
# Subcommands whose paths (operands) are written; those that rewrite the work tree need write on ".".
_GIT_WRITE_PATHS = {"add", "rm", "mv", "restore", "checkout", "init"}
_GIT_TREE_WRITERS = {"switch", "stash", "merge", "cherry-pick", "revert"}
# Subcommands that rewrite the working tree at the paths they name (git add only stages them).
_GIT_TREE_PATHS = {"rm", "mv", "restore", "checkout"}
_GIT_REVISION_FIRST = {
    "log",
    "show",
    "diff",
    "blame",
    "grep",
    "shortlog",
    "describe",
    "cat-file",
    "rev-parse",
    "rev-list",
    "ls-tree",
    "diff-tree",
    "diff-index",
    "merge-base",
    "name-rev",
    "branch",
    "tag",
    "reset",
    "checkout",
    "switch",
    "merge",
    "cherry-pick",
    "revert",
    "reflog",
    "whatchanged",
    "cherry",
    "range-diff",
    "restore",
    "stash",
    "show-ref",
    "for-each-ref",
    "annotate",
    "diff-files",
    "status",
    "ls-files",
    "check-ignore",
    "check-attr",
    "count-objects",
    "version",
    "commit",
}


def _git_option(token: str, values: Mapping[str, str]) -> tuple[str, str]:
    """A long git option as git reads it (unique abbreviations too: ``--ext`` is ``--ext-diff``), and its value."""
    name, _, value = token.partition("=")
    if name in GIT_REFUSED_OPTIONS or name in values or len(name) <= 2:
        return name, value
    refused = sorted(k for k in GIT_REFUSED_OPTIONS if k.startswith(name))
    if refused:
        return refused[0], value
    known = [k for k in values if k.startswith("--") and k.startswith(name)]
    return (known[0] if len(known) == 1 else name), value


# git subcommands whose -S, -G, -L, -n take a value (pickaxe, line ranges, counts); elsewhere they are flags
# (`git restore -S PATH` is --staged: PATH was taken for a value and never checked). Since SHELL_OPTIONS.
_GIT_LOG_FAMILY = frozenset({"log", "show", "whatchanged", "shortlog", "diff", "blame", "annotate"})
# git subcommands where -p is --patch (interactive hunks).
_GIT_PATCHING = frozenset({"restore", "checkout", "reset", "stash", "commit", "switch"})
# Options with which `git checkout -b NAME` / `git switch -c NAME` only make a branch where HEAD is.
_GIT_NEW_BRANCH_ONLY = frozenset(
    {"-b", "-B", "-c", "-C", "--create", "--force-create", "-q", "--quiet", "-t", "--track", "--no-track",
     "--guess", "--no-guess"}
)  # fmt: skip
# Long options git takes by a unique start that make a subcommand rewrite the working tree.
_GIT_REWRITING = {"reset": ("--hard", "--merge", "--keep")}


# The merge strategies git has built in: any other NAME runs the program git-merge-NAME found on PATH.
_GIT_STRATEGIES = frozenset({"ort", "recursive", "resolve", "octopus", "ours", "subtree"})
_GIT_MERGE_SHORT_VALUES = "mFsX"


def _git_strategy(sub: str, rest: Sequence[str]) -> ShellVerdict | None:
    """Why ``git merge -s NAME`` (or merge's, cherry-pick's, revert's --strategy) may not run, or None."""
    i = 0
    while i < len(rest):
        token = rest[i]
        i += 1
        if token == "--":
            break
        value: str | None = None
        if token == "--strategy":
            value = rest[i] if i < len(rest) else ""
            i += 1
        elif token.startswith("--strategy="):
            value = token.partition("=")[2]
        elif token.startswith("--") and token in (*_GIT_VALUES.get(sub, {}), "--message"):
            i += 1  # (its value: `--message -sfoo` names no strategy)
        elif sub == "merge" and token.startswith("-") and not token.startswith("--"):
            for index, char in enumerate(token[1:], start=2):
                if char == "S":
                    break  # (-S[KEYID]: the rest of the word is a key id)
                if char in _GIT_MERGE_SHORT_VALUES:
                    taken = token[index:] or (rest[i] if i < len(rest) else "")
                    i += 0 if token[index:] else 1
                    value = taken if char == "s" else None
                    break
        if value is not None and value not in _GIT_STRATEGIES:
            return _no(
                f"git merge strategy '{value}' is refused: git runs a program named git-merge-{value} for it",
                f"use one of git's own: {', '.join(sorted(_GIT_STRATEGIES))}",
            )
    return None


def _git(
    args: Sequence[str], options: bool = True, known: bool = False
) -> list[tuple[str, str, bool]] | ShellVerdict:
    i = 0
    while i < len(args) and args[i].startswith("-"):
        token = args[i]
        name = token.partition("=")[0]
        if (
            name in _GIT_GLOBAL_REFUSED
            or name.startswith("-c")
            and not name.startswith("--")
            or (name.startswith("-C") and not name.startswith("--"))
        ):
            key = name if name in _GIT_GLOBAL_REFUSED else name[:2]
            return _no(
                f"git option '{key}' is refused: it {_GIT_GLOBAL_REFUSED[key]}",
                "run git without it; the repository is the project's own, in the command's cwd",
            )
        if name not in _GIT_GLOBAL_OK:
            return _no(
                f"git option '{name}' before the subcommand is not one Kiwi allows",
                f"allowed there: {', '.join(sorted(_GIT_GLOBAL_OK))}",
            )
        if known and name in ("--icase-pathspecs", "--glob-pathspecs"):
            # (`git --icase-pathspecs rm -r out` deleted OUT/: since KNOWN_OPTIONS.)
            return _no(
                f"git option '{name}' is refused: it makes every path a pattern, and Kiwi checks names",
                "name each path as it is",
            )
        i += 1
    if i >= len(args):
        return []
    sub = args[i]
    if sub in GIT_REFUSED_SUBCOMMANDS:
        return _no(
            f"'git {sub}' is refused: it {GIT_REFUSED_SUBCOMMANDS[sub]}",
            "use the git.status/diff/commit/checkpoint/rollback tools or an allowed subcommand: "
            + ", ".join(sorted(GIT_SUBCOMMANDS)),
        )
    if sub not in GIT_SUBCOMMANDS:
        return _no(
            f"'git {sub}' is not a subcommand Kiwi allows (aliases and other programs are refused)",
            "allowed: " + ", ".join(sorted(GIT_SUBCOMMANDS)),
        )
    rest = list(args[i + 1 :])
    if known and sub in ("merge", "cherry-pick", "revert") and (problem := _git_strategy(sub, rest)):
        return problem  # (since KNOWN_OPTIONS)
    if known and sub == "reflog" and rest[:1] and rest[0] in ("expire", "delete", "drop"):
        return _no(
            f"'git reflog {rest[0]}' is refused: it rewrites the repository's records of where refs were",
            "read them with git reflog [show]",
        )
    values = {**_GIT_VALUES["*"], **_GIT_VALUES.get(sub, {})}
    if options:
        if sub == "annotate":
            values = {
                **values,
                **_GIT_VALUES["blame"],
            }  # (annotate is blame's older name: -S FILE, --contents)
        if sub not in _GIT_LOG_FAMILY:
            values = {k: v for k, v in values.items() if k not in ("-S", "-G", "-L", "-n")}
        if sub == "init":
            values.pop("--shared", None)  # (--shared[=PERMS]: the next word is the folder)
    if options and known:
        # (Since KNOWN_OPTIONS: `git blame -n FILE` is --show-number and `git show --pretty REV:PATH` takes
        # no value from the next word; each swallowed the path it then read unchecked.)
        if sub not in ("log", "show", "whatchanged"):
            values.pop("-n", None)
        values.pop("--pretty", None)
    found: list[tuple[str, str, bool]] = []
    before: list[str] = []
    after: list[str] | None = None
    opts: list[str] = []
    j = 0
    while j < len(rest):
        token = rest[j]
        j += 1
        if token == "--":
            after = rest[j:]
            break
        if token.startswith("--"):
            name, value = _git_option(token, values)
            if options and name not in values:
                name = next(
                    (o for o in _GIT_REWRITING.get(sub, ()) if len(name) > 3 and o.startswith(name)), name
                )
            if name in GIT_REFUSED_OPTIONS:
                return _no(
                    f"git option '{name}' is refused: it {GIT_REFUSED_OPTIONS[name]}", "run git without it"
                )
            opts.append(name)
            kind = values.get(name)
            if kind and "=" not in token:
                if j >= len(rest):
                    return _no(f"git option '{name}' needs a value")
                value = rest[j]
                j += 1
            if kind in ("read", "write"):
                found.append((value, kind, False))
                if options:
                    # (Some git commands open these from the repository's root, not the cwd: blame
                    # --contents, grep -f, ls-files -X: `../outside/f` from out/ left the project.)
                    found.append((value, kind + "@root", False))
            elif value and _path_like(value):
                found.append((value, "read", False))
            continue
        if token.startswith("-") and token != "-" and not _is_number(token):
            for index, char in enumerate(token[1:], start=1):
                opt = f"-{char}"
                if opt in GIT_REFUSED_OPTIONS:
                    return _no(
                        f"git option '{opt}' is refused: it {GIT_REFUSED_OPTIONS[opt]}", "run git without it"
                    )
                if sub == "add" and opt in ("-p", "-i", "-e"):
                    return _no(
                        f"'git add {opt}' is refused: it starts an interactive session or an editor",
                        "stage paths with git add PATH",
                    )
                if options and opt == "-p" and sub in _GIT_PATCHING:
                    # (-p is --patch here: it asks hunk by hunk, and `git restore -p` with no path names
                    # none for Kiwi to check while it may write anywhere in the tree.)
                    return _no(
                        f"'git {sub} -p' is refused: it picks hunks interactively, anywhere in the tree",
                        f"name the paths: git {sub} PATH",
                    )
                opts.append(opt)
                kind = values.get(opt)
                if kind:
                    value = token[index + 1 :]
                    if not value:
                        if j >= len(rest):
                            return _no(f"git option '{opt}' needs a value")
                        value = rest[j]
                        j += 1
                    if kind in ("read", "write"):
                        found.append((value, kind, False))
                        if options:
                            found.append((value, kind + "@root", False))
                    break
            continue
        before.append(token)
    no_index = "--no-index" in opts
    if no_index and sub == "diff" and rule_in_force(SHELL_REVIEW_S28):
        # (It reads folders whole, and git's rules let git read the repositories' settings, which other
        # programs may not: `git diff --no-index empty .` printed .git/config's credentials, review s28.)
        return _no(
            "'git diff --no-index' is refused: it compares files outside git, reading git's own settings too",
            "compare files with diff -u A B (diff -r for folders)",
        )
    writes = sub in _GIT_WRITE_PATHS
    tree_writer = (
        sub in _GIT_TREE_WRITERS
        or (sub == "reset" and any(o in opts for o in ("--hard", "--merge", "--keep")))
        or (sub == "checkout" and (after is None or (options and not after)))
        or (sub == "add" and not before and not after)
    )
    new_branch_here = (
        sub in ("checkout", "switch")
        and any(o in opts for o in ("-b", "-B", "-c", "-C", "--create", "--force-create"))
        and not before
        and after is None
        # (Since SHELL_OPTIONS, only with options that leave the tree as it is: `git checkout -f -b x`
        # reset every tracked file to HEAD, which the agent can point anywhere.)
        and (not options or all(o in _GIT_NEW_BRANCH_ONLY for o in opts))
    )
    if tree_writer and not new_branch_here:
        # (A new branch where HEAD is leaves the working tree as it is: `git checkout -b other`.) The whole
        # repository's working tree, wherever the cwd is (since SHELL_OPTIONS: `git reset --hard` run in out/
        # was checked as a write of out/, and rewrote src/).
        found.append((".", "root*" if options else "write*", False))
    mode = "write" if writes else "read"
    if sub in _GIT_TREE_PATHS:
        # Paths it rewrites in the working tree: each a whole tree (`git restore --source=REV -- .ai` wrote the
        # protected places inside .ai), and no pathspec magic or glob (`:(icase).AI/CONFIG`, `temporal-dev.ym?`)
        # the literal check would read as a name.
        mode = "write*"
        if "--pathspec-from-file" in opts:
            found.append(("--pathspec-from-file", "magic", False))
    elif (
        sub in ("add", "commit")
        and (_git_stages(sub, opts) or before or after)
        and rule_in_force(GIT_ADD_TREES)
    ):
        # What it stages is each path's whole tree, as `git add -A` stages the repository's (review s35: `git add
        # -N .` put a tool's untracked .env in the index, reading nothing the wall withholds, and git.diff printed
        # it; a human's `git commit -a` would commit it). `git commit PATH`, `-a` and a file of paths stage too
        # (third review s35: `git commit -a` under `write src/**` committed a denied file and Kiwi's records).
        mode = "write*"
        if "--pathspec-from-file" in opts:
            found.append(("--pathspec-from-file", "magic", False))
        if sub == "commit" and any(o in opts for o in ("-a", "--all")):
            found.append((".", "write*", False))
    elif sub == "commit" and not before and not after and rule_in_force(GIT_COMMIT_INDEX):
        # With no path it commits whatever the index holds, a human's staged work included (session 37's note):
        # refused (check.py, "index"); `git commit -m MSG -- PATH` commits those paths, each checked as a write.
        found.append(("", "index", False))
    if after is not None:
        found += [_git_path(p, mode) for p in after]
        if sub in ("add", "rm", "mv", "restore", "init") or (sub == "commit" and mode == "write*"):
            found += [_git_path(p, mode) for p in before]
        else:
            found += [(p, "read", False) for p in before if _path_like(p)]
        if sub == "init" and known and rule_in_force(SHELL_REVIEW_S28):
            # (`git init -- sub` makes sub/.git as `git init sub` does: review s28.)
            found += [(posixpath.join(p, ".git"), "write", False) for p in ((after or before)[-1:] or ["."])]
    elif no_index or sub == "diff" and any(_path_like(p) for p in before):
        # Outside a repository "git diff a b" compares files on disk: they are paths.
        found += [(p, "read", False) for p in before]
    elif writes and sub != "checkout":
        found += [_git_path(p, mode) for p in before]
        if sub == "init" and not before:
            found.append((".", "write", False))
        if sub == "init" and known:
            # (It makes FOLDER/.git, a protected place: `git init` in out/ made out/.git; KNOWN_OPTIONS.)
            found += [(posixpath.join(p, ".git"), "write", False) for p in (before[-1:] or ["."])]
    elif known and sub in ("blame", "annotate"):
        # (Its file is read as it is in the working tree, a name without '/' too: `git blame temporal-dev.yml`.
        # Since KNOWN_OPTIONS.)
        found += [(p, "read", False) for p in before]
    elif mode == "write*":
        found += [_git_path(p, mode) for p in before]  # (git commit PATH...: every operand a path it stages)
    else:
        found += [(p, mode, False) for p in before if _path_like(p)]
    # An object named REV:PATH (`git show HEAD:.ai/config/x`, `:PATH` in the index, `:N:PATH`) reads the file
    # PATH as it was: PATH is checked as a read, from the project's root (from the cwd when it starts ./ or
    # ../), as filesystem.read would check it.
    found += [(path, "object", False) for token in before if (path := _object_path(token))]
    return found


def _git_stages(sub: str, opts: Sequence[str]) -> bool:
    """Whether git add or git commit, with these options, stages paths of its own choosing (a file of paths;
    commit's `-a`)."""
    return "--pathspec-from-file" in opts or (sub == "commit" and any(o in opts for o in ("-a", "--all")))


def _object_path(token: str) -> str:
    """The path in a git object name ``REV:PATH`` ('' when ``token`` names none)."""
    if ":" not in token or token.startswith(":(") or "://" in token:
        return ""
    rest = token.partition(":")[2]
    if token.startswith(":") and rest[:1].isdigit() and rest[1:2] == ":":
        rest = rest[2:]  # (:N:PATH, a stage of the index)
    return rest


def _git_path(path: str, mode: str) -> tuple[str, str, bool]:
    """A path git writes: ``magic`` when git would read it as a pattern (see path_arguments)."""
    if mode == "write*" and (path.startswith(":") or any(c in path for c in "*?[")):
        return (path, "magic", False)
    return (path, mode, False)


def git_reads_everything(g: _Grants) -> ShellVerdict | None:
    """git can print any file of the repository (``git show HEAD:secret``), so it needs read on all of it."""
    if not any(glob_covered("**", p) for p in g.read):
        return _no(
            "git reads every file of the repository (git show, log -p, grep), and this run may not read "
            "all of the project",
            'add <read resource="filesystem" path="**"/>, or use the git.* tools',
            g.read,
        )
    if g.deny:
        return _no(
            f"git reads every file of the repository, and this run denies '{g.deny[0]}'",
            "use the git.* tools, or drop the denial",
            g.deny,
        )
    return None
