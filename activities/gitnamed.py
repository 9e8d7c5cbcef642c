"""Places of the project that git's settings name, outside any git folder: a config file a setting includes
(`include.path`, `includeIf.*.path`: a team's `.gitconfig` in the project, there or not yet), a config file git
reads in the project (a git folder kept elsewhere, `gitdir: .bare`), the hooks folder (`core.hooksPath`:
husky's `.husky/_`; a hook that is a link: the script it leads to), and the files of a program a setting has
git run, its value read as a shell reads it (`core.fsmonitor = cd scripts && sh watch`). Read for the
repository the project is in, its worktrees in the project and its submodules.

git run in the project obeys them, a human's `git status` too, before the human has looked at anything: they
are settings as `.git/config` is, and a write grant reaches them only where its literal part names them
(`write .gitconfig`, `write .husky/_/**`), never by `**` (review s31 round 3, F2/F6: `.git/config` including
`../.gitconfig`, which the agent wrote a `core.pager` into under `write **`). Read with git itself, as the
human's git reads them (the system's and the user's settings too: `core.hooksPath = .githooks` set for every
repository names a folder of this one); an include a condition leaves out now (`onbranch:`) is followed all
the same. What git cannot read is no setting Kiwi can check: every write is refused until a human fixes it.
Kiwi's git, reading, runs nothing they name (its hardening on its command line) and is none of the
project's (process.kiwi_git). Review s32 proved, in six rounds, the cases each part of this answers."""

from __future__ import annotations

import dataclasses
import fnmatch
import glob
import os
import posixpath
import pwd
import re
import shlex
import subprocess

from temporalio.exceptions import ApplicationError

from activities.process import GIT_FORCED_CONFIG, INHERITED_ENV, kiwi_git
from kiwi.protected import fold_path, names, protected_root
from kiwi.searchpath import search_path

# Settings whose value is a program git runs (itself, or through a shell), by key as `git config --list`
# prints it (lower-case section and name, subsection as written).
_PROGRAM_KEYS = (
    "core.fsmonitor", "core.pager", "core.editor", "core.sshcommand", "core.askpass", "core.gitproxy",
    "core.alternaterefscommand", "sequence.editor", "diff.external", "interactive.difffilter",
    "gpg.program", "gpg.ssh.defaultkeycommand", "uploadpack.packobjectshook", "credential.helper",
    "sendemail.smtpserver", "sendemail.sendmailcmd", "sendemail.tocmd", "sendemail.cccmd",
    "sendemail.headercmd", "imap.tunnel", "instaweb.httpd", "web.browser",
)  # fmt: skip
# (section, name) of a setting with a subsection whose value is such a program: `diff.NAME.textconv`.
_PROGRAM_SUBKEYS = {
    "diff": ("command", "textconv"),
    "difftool": ("cmd", "path"),
    "mergetool": ("cmd", "path"),
    "merge": ("driver",),
    "filter": ("clean", "smudge", "process"),
    "gpg": ("program",),
    "trailer": ("cmd", "command"),
    "credential": ("helper",),
    "browser": ("cmd", "path"),
    "man": ("cmd", "path"),
    "hook": ("command",),  # (config-based hooks, git 2.54)
    "remote": ("uploadpack", "receivepack"),
    "guitool": ("cmd",),
    "submodule": ("update",),  # (`!command`)
    "lfs": ("path", "clean", "smudge"),  # (lfs.customtransfer.NAME.path, lfs.extension.NAME.clean)
}
# git's hook names: a hooks folder that is the work tree's top protects only these there.
_HOOKS = (
    "applypatch-msg", "pre-applypatch", "post-applypatch", "pre-commit", "pre-merge-commit",
    "prepare-commit-msg", "commit-msg", "post-commit", "pre-rebase", "post-checkout", "post-merge",
    "pre-push", "pre-receive", "update", "proc-receive", "post-receive", "post-update", "reference-transaction",
    "push-to-checkout", "pre-auto-gc", "post-rewrite", "sendemail-validate", "fsmonitor-watchman",
    "p4-changelist", "p4-prepare-changelist", "p4-post-changelist", "p4-pre-submit", "post-index-change",
)  # fmt: skip
# The one hook a `git status` runs (when it refreshes the index, as an editor's does every few seconds).
_STATUS_HOOK = "post-index-change"
# Programs that run the file their first argument names (`sh scripts/watch.sh`), whatever its name.
_INTERPRETERS = re.compile(
    r"(ba|da|z|k)?sh|python[0-9.]*|node|nodejs|ruby|perl|php|deno|bun|tclsh|lua|\.|source"
)
_SHELLS = ("sh", "bash", "dash", "zsh", "ksh")
# How many config files an include chain is followed through (git's own depth limit is 10), and how many
# repositories (submodules, worktrees) of the project are read.
_FILES_LIMIT = 50
_REPOSITORIES_LIMIT = 200
# A command substitution (`$(...)`, backquotes) and a variable (`$X`, `${X}`, `${X:-default}`).
_DEFAULTED = re.compile(r"\$\{\w+:?[-=+]([^{}]*)\}")
_VARIABLE = re.compile(r"\$\{\w+\}|\$\w+")
_COMPUTED, _VALUE_OF = "\x01", "\x00"


@dataclasses.dataclass(frozen=True)
class Named:
    """A place of the project a setting names: ``place`` project-relative, ``why`` the setting and the file
    it is in, ``folder``: all below it too (a hooks folder). ``later``: one git obeys at a commit, a checkout,
    or when the human types an alias, not at a `git status`: not there, it may be made by a command and set
    aside after it (commands._settings_in_reach)."""

    place: str
    why: str
    folder: bool = False
    later: bool = False


class Unreadable(Exception):
    """What git's settings name cannot be told (a config file git cannot parse, no git where the worker runs, a
    program a setting computes): what stands in the way."""


@dataclasses.dataclass(frozen=True)
class _Git:
    """The git that reads the settings (process.kiwi_git's), and the project none of whose programs it runs."""

    path: str
    project: str


@dataclasses.dataclass(frozen=True)
class _Entry:
    origin: str  # the config file, absolute
    key: str
    value: str
    top: str  # the work tree's top of the repository it is read for (where hooks and programs run)


@dataclasses.dataclass(frozen=True)
class _Word:
    """A file a program's setting names: ``path`` as given (relative to the work tree's top, or absolute, or
    `~`), ``later``: not the program git runs nor a file it runs (an argument that has a `/`, an alias's)."""

    path: str
    later: bool = False
    folder: bool = False
    there: str = ""  # ("path": a file only when there, else `later`; "any": named only when there)


def named_places(root: str) -> list[Named]:
    """The places of the project at ``root`` that git's settings name (see the module's text), but those in
    a protected place (kiwi.protected: `.git/config` is one already). Read for the repository the project is
    in, its worktrees in the project and its submodules (git status runs in each), and, with no repository,
    the user's and the system's settings taken from the project's folder (`git init` there makes one).
    Raises Unreadable."""
    real_root = os.path.realpath(root)
    home = os.path.expanduser("~")
    try:
        git = _Git(kiwi_git(real_root), real_root)
    except ApplicationError as exc:
        raise Unreadable(exc.message) from None
    if git.path == "git":
        if _in_a_repository(real_root):
            raise Unreadable(
                "git is not installed where Kiwi's worker runs, so it cannot read git's settings"
            )
        return []
    found: dict[str, Named] = {}

    def note(path: str, why: str, folder: bool = False, later: bool = False) -> None:
        for rel in _inside(path, root, real_root):
            if rel == "." and folder:
                for name in _HOOKS:
                    found.setdefault(name, Named(name, why, later=name != _STATUS_HOOK))
                continue
            if rel == "." or protected_root(rel) is not None:
                continue
            known = found.get(rel)
            if known is None or (folder and not known.folder) or (known.later and not later):
                found[rel] = Named(rel, why, folder or (known is not None and known.folder), later)

    entries: list[_Entry] = []
    origins: list[str] = []
    repositories = _repositories(git, real_root)
    for index, (cwd, _) in enumerate(repositories):
        more, files = _settings(git, cwd, [], cwd, strict=index == 0)
        entries += more
        origins += files
    read: set[str] = {os.path.realpath(origin) for origin in origins}
    pending = list(entries)
    while pending:
        entry = pending.pop(0)
        key, value = entry.key, entry.value
        where = _shown(entry.origin, real_root)
        why = f"{key} in {where}"
        section, _, name = key.rpartition(".")
        lowered = section.lower()
        if name == "path" and (lowered == "include" or lowered.startswith("includeif.")):
            target = _expanded(value, os.path.dirname(entry.origin), home)
            if target is None:
                continue
            note(target, why)
            real = os.path.realpath(target)
            if real not in read and os.path.isfile(real) and len(read) < _FILES_LIMIT:
                # (Followed whatever its condition says now: a branch switched to later makes it count. One git
                # cannot parse is not read by the human's git now either, and stops it if it is later.)
                read.add(real)
                more, _ = _settings(git, real_root, ["--file", real], entry.top, strict=False)
                pending += more
        elif key.lower() == "core.hookspath":
            target = _expanded(value, entry.top, home)
            if target is not None:
                # (Not there, it is no place to hold: made by a command, a `git status` meanwhile would run its
                # post-index-change, review s32. There, nothing is made in it while it is held.)
                note(target, why, folder=True)
                if os.path.basename(target) == "_":
                    # husky (9): each hook of `.husky/_` runs the project's `.husky/NAME` (review s32), one a
                    # commit or a checkout runs (the folder `_`, held, has no post-index-change to run it).
                    for hook in _HOOKS:
                        note(os.path.join(os.path.dirname(target), hook), why, later=True)
        elif (words := _program_words(key, value)) is not None:
            if words is _CANNOT_TELL:
                raise Unreadable(
                    f"{key} in {where} computes the program git runs ({value.strip()[:80]!r}), so Kiwi cannot "
                    "tell which file of the project it is"
                )
            for word in words:
                target = _expanded(word.path, entry.top, home)
                if word.there == "bare":
                    # (Found on the PATH the human's git has, as the worker's is (it started from their shell):
                    # each of its folders that is in the project names NAME there, `.venv/bin/git-lfs`.)
                    for folder in os.environ.get("PATH", "").split(os.pathsep):
                        note(os.path.join(entry.top, folder or ".", word.path), why)
                    continue
                if target is None:
                    continue
                if word.later and (word.path.endswith("/") or os.path.isdir(target)):
                    # (A folder an alias names, `!black src/ tests/`: what is below it is no setting, review s32
                    # round 5; an alias runs when the human types it.)
                    continue
                if word.there and _GLOB.search(word.path):
                    # (A glob is a place when its folder is there, `hooks.d/*.sh`; `sed 's/^a=.*/b/'` is none.)
                    folder = os.path.dirname(_GLOB.split(target)[0])
                    note(target, why, later=word.later or not os.path.isdir(folder))
                    continue
                if word.there and not os.path.lexists(target):
                    # (An argument not there: `sed 's/^a=.*/a=x/'` or a URL names no file to make first, review
                    # s32 round 4; one with a `/` or an extension is set aside if a command makes it.)
                    if word.there == "path":
                        note(target, why, later=True)
                    continue
                note(target, why, folder=word.folder, later=word.later)
    # (After the settings: a place they name is shown by the setting.)
    for origin in origins:
        note(origin, f"a config file git reads ({_shown(origin, real_root)})")
    for _, hooks in repositories:
        if hooks is not None:
            note(hooks, "the folder git runs hooks from", folder=True)
            for name, target in _linked_hooks(hooks):
                # (A hook that is a link to a script of the project: `.git/hooks/pre-commit` -> scripts/..., review
                # s32: the script, written, ran at the human's commit.)
                note(target, f"the hook {name}, a link to it", later=name != _STATUS_HOOK)
    return sorted(found.values(), key=lambda n: n.place)


def in_the_way(named: list[Named], rel: str, grants: list[str], below: bool = False) -> Named | None:
    """The first of ``named`` that a change of ``rel`` (project-relative) changes and no write grant names:
    ``rel`` is it or below it; with ``below`` (a folder deleted, moved or moved into place), it below ``rel``
    too."""
    folded = fold_path(rel)
    for item in named:
        place = fold_path(item.place)
        hit = folded == place or folded.startswith(place + "/")
        if not hit and any(c in place for c in "*?["):
            # (A glob a program's setting runs, `scripts/watch*.sh`: what it matches, and what is below that.)
            parts = folded.split("/")
            hit = any(fnmatch.fnmatchcase("/".join(parts[:n]), place) for n in range(1, len(parts) + 1))
        if not hit and below:
            hit = folded == "." or place.startswith(folded + "/")
        if hit and not any(names(grant, item.place) for grant in grants):
            return item
    return None


def refusal(item: Named, raw: str) -> str:
    """What a refused change of ``raw`` says about ``item``, with the grant that would allow it."""
    grant = f"{item.place}/**" if item.folder else item.place
    return (
        f"'{raw}' would change '{item.place}', which git's settings name ({item.why}): git run in the project "
        "obeys it, a human's too, so Kiwi changes it only where a write grant names it "
        f'(<write resource="filesystem" path="{grant}"/>)'
    )


def _git_env(project: str) -> dict[str, str]:
    """What git reading the settings inherits from the worker: the allow-listed part of its environment (no
    secret, no GIT_*, which would point it elsewhere), with the user's settings (HOME, XDG_CONFIG_HOME)."""
    env = {k: v for k, v in os.environ.items() if k in (*INHERITED_ENV, "XDG_CONFIG_HOME")}
    env.update({"GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C"})
    if "PATH" in env:
        env["PATH"] = search_path(env["PATH"], project)  # (git's helpers: none of the project's)
    return env


# Kiwi's hardening, but what git is to read as the human's git reads it: the hooks folder (reading runs no
# hook), and a bare repository the project's `.git` file names (`gitdir: .bare`).
_READ_AS_IS = ("core.hooksPath", "safe.bareRepository")


def _git(git: _Git, cwd: str, args: list[str]) -> subprocess.CompletedProcess[bytes]:
    """git (``git``: kiwi_git's, found for the project), run to read: with Kiwi's hardening on its command line (review s32, third round: `git ls-files` ran
    the repository's `core.fsmonitor` in the worker at every write), and safe.directory open, so a repository
    another user owns (a container's bind mount) is read as its owner's git reads it (without it, git read no
    `.git/config` there and said nothing)."""
    forced = [
        arg for key, value in GIT_FORCED_CONFIG if key not in _READ_AS_IS for arg in ("-c", f"{key}={value}")
    ]
    return subprocess.run(
        [git.path, *forced, "-c", "safe.directory=*", *args],
        cwd=cwd,
        env=_git_env(git.project),
        capture_output=True,
        timeout=30,
        check=False,
    )


def _settings(git: _Git, cwd: str, how: list[str], top: str, strict: bool) -> tuple[list[_Entry], list[str]]:
    """Each setting ``git config --list`` prints run in ``cwd`` (``how``: `--file X`; none: the repository's
    there, includes followed), and the files it read, absolute. Raises Unreadable where git cannot, when
    ``strict``."""
    args = ["config", "--list", "--show-origin", "-z", *(how or ["--includes"])]
    try:
        done = _git(git, cwd, args)
    except subprocess.TimeoutExpired:
        if not strict:
            return [], []
        raise Unreadable("git config --list took more than 30 seconds") from None
    if done.returncode != 0:
        if not strict:
            return [], []
        raise Unreadable(_said(done, cwd))
    fields = done.stdout.split(b"\0")
    entries: list[_Entry] = []
    origins: list[str] = []
    for origin, item in zip(fields[0::2], fields[1::2], strict=False):
        text = os.fsdecode(origin)
        if not text.startswith("file:"):
            continue  # (the command line's, a blob's: no file)
        # (Relative to where git ran: the work tree's top, where it moves first, review s32.)
        path = os.path.normpath(os.path.join(cwd, text[len("file:") :]))
        key, _, value = os.fsdecode(item).partition("\n")
        entries.append(_Entry(path, key, value, top))
        if path not in origins:
            origins.append(path)
    return entries, origins


def _said(done: subprocess.CompletedProcess[bytes], cwd: str) -> str:
    """What git said when it failed, naming no path of the machine (the project's folder is '.', the home
    folder '~': the message goes to the agent)."""
    said = done.stderr.decode(errors="replace").strip() or f"git exited {done.returncode}"
    for path, shown in ((os.path.realpath(cwd), "."), (cwd, "."), (os.path.expanduser("~"), "~")):
        said = said.replace(path + os.sep, shown + "/").replace(path, shown)
    return said


def _repositories(git: _Git, real_root: str) -> list[tuple[str, str | None]]:
    """(work tree's top, hooks folder) of each repository whose settings name places of the project: the one
    the project is in (its top; with none, the project's folder), each of its worktrees in the project (a
    bare repository's too, `gitdir: .bare`), and each submodule of those, checked out (its top); past
    _REPOSITORIES_LIMIT, Unreadable."""
    git_dir, hooks, top = _repository(git, real_root)
    if git_dir is None:
        return [(real_root, None)]
    found: list[tuple[str, str | None]] = [(top or real_root, hooks)] if top else []
    tops = {top} if top else set()
    for tree in _worktrees(git, git_dir):
        real = os.path.realpath(tree)
        if real not in tops and (real == real_root or real.startswith(real_root + os.sep)):
            tops.add(real)
            found.append((real, _repository(git, real)[1]))
    if not found:
        found.append(
            (real_root, hooks)
        )  # (a bare repository with no worktree here: its settings all the same)
    pending = [t for t, _ in found]
    while pending:
        for sub in _submodule_trees(git, pending.pop()):
            if sub not in tops and os.path.lexists(os.path.join(sub, ".git")):
                if len(tops) >= _REPOSITORIES_LIMIT:
                    raise Unreadable(
                        f"the project holds more than {_REPOSITORIES_LIMIT} repositories to read"
                    )
                tops.add(sub)
                found.append((sub, _repository(git, sub)[1]))
                pending.append(sub)
    return found


def _repository(git: _Git, cwd: str) -> tuple[str | None, str | None, str | None]:
    """The git folder, the hooks folder (core.hooksPath's, or the git folder's `hooks`) and the work tree's top
    (None in a bare repository) of the repository git finds from ``cwd``; (None, None, None): none."""
    try:
        done = _git(git, cwd, ["rev-parse", "--absolute-git-dir", "--git-path", "hooks", "--show-toplevel"])
    except subprocess.TimeoutExpired:
        raise Unreadable("git rev-parse took more than 30 seconds") from None
    lines = [os.fsdecode(line) for line in done.stdout.splitlines()]
    if len(lines) < 2:
        if _in_a_repository(cwd):
            raise Unreadable(_said(done, cwd))
        return None, None, None
    # (A bare repository prints its git folder and hooks, then fails for the work tree: no top.)
    top = lines[2] if done.returncode == 0 and len(lines) > 2 else None
    return lines[0], os.path.normpath(os.path.join(cwd, lines[1])), top


def _worktrees(git: _Git, git_dir: str) -> list[str]:
    """The work trees of the repository at ``git_dir`` (`git worktree list`)."""
    if not any(os.path.lexists(os.path.join(git_dir, name)) for name in ("worktrees", "commondir")):
        return []  # (none but its own: a git start spared for every write)
    try:
        done = _git(git, git_dir, ["--git-dir", git_dir, "worktree", "list", "--porcelain", "-z"])
    except subprocess.TimeoutExpired:
        return []
    return [
        os.fsdecode(field[len(b"worktree ") :])
        for field in done.stdout.split(b"\0")
        if field.startswith(b"worktree ")
    ]


def _submodule_trees(git: _Git, top: str) -> list[str]:
    """The folders of the submodules the repository at ``top`` tracks (its gitlinks, from its index: not
    `.gitmodules`, which the agent may write), absolute."""
    try:
        done = _git(git, top, ["ls-files", "--stage", "-z"])
    except subprocess.TimeoutExpired:
        raise Unreadable("git ls-files took more than 30 seconds") from None
    return [
        os.path.join(top, os.fsdecode(entry.partition(b"\t")[2]))
        for entry in done.stdout.split(b"\0")
        if entry.startswith(b"160000 ")
    ]


def _linked_hooks(hooks: str) -> list[tuple[str, str]]:
    """(name, where it leads) of each hook in the folder ``hooks`` that is a symbolic link."""
    try:
        with os.scandir(hooks) as listing:
            return [(e.name, os.path.realpath(e.path)) for e in listing if e.is_symlink()]
    except OSError:
        return []


def _in_a_repository(real_root: str) -> bool:
    """Whether there is a `.git` in the project's folder or a folder above it."""
    folder = real_root
    while True:
        if os.path.lexists(os.path.join(folder, ".git")):
            return True
        parent = os.path.dirname(folder)
        if parent == folder:
            return False
        folder = parent


_CANNOT_TELL: list[_Word] = [_Word("(computed)")]
# Settings `git status` runs (the others run at a diff, a commit, a fetch, or when the human types an alias).
_STATUS_KEY = re.compile(r"core\.fsmonitor|filter\..+\.(clean|process)", re.IGNORECASE)
# A word that names a file by its name alone: one with an extension (`watch.sh`, `tool.py`).
_GLOB = re.compile(r"[*?\[]")
_FILE_NAME = re.compile(r"[^-./~][^/]*\.[A-Za-z0-9]{1,8}|\.\w[\w.-]*")  # (and `.envrc`)
_PYTHON_IMPORT = re.compile(r"\b(?:import|from)\s+([A-Za-z_][\w.]*)")


def _program_words(key: str, value: str) -> list[_Word] | None:
    """The files of a program's setting (None: the key names no program; _CANNOT_TELL when a substitution gives
    the program itself), read as a shell reads the value (review s32, three rounds):
    - every word with a `/` and every file name with an extension, wherever it is (an argument, a redirection,
      `VAR=x`, `--opt=x`, the text of `sh -c`, after `||`, inside `if ... fi`), from the work tree's top and
      from each folder a `cd`, `env -C` or `make -C` in the value goes to;
    - the file an interpreter runs (`sh watch`, `python3 tools/x`), the module `python -m NAME` or `python -c
      'import NAME'` loads from the folder it runs in (NAME.py, NAME.pyc, NAME/__init__.py), what `npx NAME`
      runs and the Makefile `make` reads;
    - `${V:-default}`'s default; a path after a substitution from the work tree's top (`"$(git rev-parse
      --show-toplevel)/scripts/watch.sh"`); a glob's folder.
    Each is one a missing one of refuses a program Kiwi does not model (not ``later``) for a setting `git status`
    runs (_STATUS_KEY), and for the program itself and the file an interpreter runs. An alias (`!scripts/x`)
    runs when the human types it: ``later``, and never _CANNOT_TELL."""
    section, _, name = key.lower().partition(".")
    alias = section == "alias"
    if "." in name:
        if name.rpartition(".")[2] not in _PROGRAM_SUBKEYS.get(section, ()):
            return None
    elif (
        key.lower() not in _PROGRAM_KEYS
        and section != "pager"
        and not (alias and value.lstrip().startswith("!"))
    ):
        return None
    status = bool(_STATUS_KEY.fullmatch(key))
    words = _shell_words(value.strip().removeprefix("!"))
    found = _CANNOT_TELL if words is None else _command_words(words, 0, status)
    if found is _CANNOT_TELL:
        # (A program computed by a setting `git status` does not run, `core.editor = $(command -v nvim)`, names
        # nothing: refusing every write for it was too much, review s32 round 4.)
        return _CANNOT_TELL if status and not alias else []
    if alias:
        return [dataclasses.replace(w, later=True) for w in found]
    return found


def _shell_words(text: str) -> list[str] | None:
    """``text`` as a shell splits it, substitutions marked (_COMPUTED, _VALUE_OF), a variable's default taken;
    None for a substitution that does not close."""
    text = text.replace("\\\n", "")  # (a backslash-newline joins the lines)
    if "$'" in text or re.search(r"\$\{?IFS\b", text):
        return None  # (`$'...'` quoting, `sh${IFS}w`: words a shell makes that shlex does not, round 6)
    marked = _marked(text)
    if marked is None:
        return None
    while (defaulted := _DEFAULTED.sub(lambda m: m.group(1), marked)) != marked:  # (`${W:-${X:-y}}`)
        marked = defaulted
    lexer = shlex.shlex(_VARIABLE.sub(_VALUE_OF, marked), posix=True, punctuation_chars=";&|<>(){}")
    lexer.whitespace_split = True
    lexer.commenters = ""  # (`#` inside a word is no comment; a comment's words are looked at: no harm)
    try:
        return list(lexer)
    except ValueError:  # (an unclosed quote)
        return marked.replace("'", " ").replace('"', " ").split()


def _marked(text: str) -> str | None:
    """``text`` with each command substitution (`$(...)`, backquotes) outside single quotes replaced by
    _COMPUTED and each arithmetic one (`$((...))`) by _VALUE_OF; None for one that does not close (review s32,
    third round: a backquote in `tr -d '`'` refused every write)."""
    out: list[str] = []
    index, single = 0, False
    while index < len(text):
        char = text[index]
        if single or char not in "\\'$`\n":
            single = single and char != "'"
            out.append(char)
            index += 1
        elif char == "\n":
            out.append(";")  # (a newline ends a command: `true<newline>sh watch`, review s32 round 4)
            index += 1
        elif char == "'":
            single = True
            out.append(char)
            index += 1
        elif char == "\\":
            out.append(text[index : index + 2])
            index += 2
        elif text.startswith("$((", index):
            end = text.find("))", index + 3)
            if end < 0:
                return None
            out.append(_VALUE_OF)
            index = end + 2
        elif char == "`":
            end = text.find("`", index + 1)
            if end < 0:
                return None
            out.append(_COMPUTED)
            index = end + 1
        elif text.startswith("$(", index):
            depth, end = 0, index + 1
            while end < len(text):
                depth += {"(": 1, ")": -1}.get(text[end], 0)
                if depth == 0:
                    break
                end += 1
            if end >= len(text):
                return None
            out.append(_COMPUTED)
            index = end + 1
        else:
            out.append(char)
            index += 1
    return "".join(out)


def _command_words(words: list[str], depth: int, status: bool) -> list[_Word]:
    """_program_words for ``words`` (a shell's words), ``depth`` shells deep; ``status``: a setting `git status`
    runs."""
    found: list[_Word] = []
    folders = [""]  # (the work tree's top, and each folder a `cd`, `env -C` or `make -C` goes to)
    command = True  # (the word in a command's place: after an operator, and past `VAR=x` words)
    program = ""  # (the program of the command these words are arguments of)
    into = first = waited = False
    redirect = ""  # ("file": the next word is a file; "text": a here-string's text, read as `sh -c`'s)
    skip = 0
    wrapper = ""  # (the wrapper program whose own words come before the program it runs: `timeout 5`)
    path_entries: list[str] = []  # (relative PATH entries a `PATH=` word gives the command)
    for index, word in enumerate(words):
        if skip:
            skip -= 1
            continue
        if word and set(word) <= set(";&|<>(){}"):
            if set(word) <= set("<>&") and ("<" in word or ">" in word):
                # (`< watch.sh`, `2> log`: the next word is a file, the command goes on; `bash <<< 'sh w'`: a
                # shell's text, round 6.)
                redirect = "text" if word == "<<<" and program in _SHELLS else "file"
                continue
            command, program, into = True, "", False
            continue
        if redirect == "text" and depth < 3:
            redirect = ""
            inner = _shell_words(word)
            more = _CANNOT_TELL if inner is None else _command_words(inner, depth + 1, status)
            if more is _CANNOT_TELL:
                return _CANNOT_TELL
            found += [w for m in more for w in _at(folders, m.path, m.later, m.folder, m.there)]
            continue
        if redirect:
            redirect = ""
            if not word.isdigit() and word != "-":  # (`2>&1`, `>&-`)
                found += _at(folders, word, later=not status, there="path")
            continue
        if word.isdigit() and index + 1 < len(words) and set(words[index + 1]) <= set("<>&"):
            continue  # (the `2` of `2>/dev/null`)
        if word in ("-C", "--chdir") and program in ("", "env", "make", "git"):
            into = True
            continue
        if word.startswith(("--chdir=", "--directory=")) or (
            word.startswith("-C") and len(word) > 2 and program in ("", "env", "make", "git")
        ):
            folders.append(posixpath.join(folders[-1], _unmarked(word.partition("=")[2] or word[2:])))
            continue
        if into:
            if word.startswith("-"):
                continue  # (`cd -P scripts`, `cd -- scripts`)
            folders.append(posixpath.join(folders[-1], _unmarked(word)))
            into = False
            if program == "make":
                found += _makefiles(folders[-1], status)
            continue
        if command and re.fullmatch(r"\w+=.*", word):
            name, _, value_of = word.partition("=")  # (`BASH_ENV=watch.sh bash -c true`)
            if name == "PATH":
                # (`PATH=bin:$PATH fsmon` runs bin/fsmon, review s32 round 5.)
                path_entries += [e for e in value_of.split(":") if e and not e.startswith(("/", _VALUE_OF))]
            elif "/" in value_of or _FILE_NAME.fullmatch(value_of):
                found += _at(folders, value_of, later=not status, there="path")
            continue
        if command and word in _RUNS_THE_NEXT:
            wrapper, waited = word, False  # (`env -S 'sh w'`, `exec -a n sh w`)
            continue
        if command and wrapper and word in _OPTION_VALUES.get(wrapper, ()):
            skip = 1  # (`nice -n 5 sh w`, `timeout -s KILL 5 sh w`, `sudo -u me sh w`, `exec -a n sh w`)
            continue
        if command and wrapper == "env" and word in ("-S", "--split-string") and depth < 3:
            inner = _shell_words(words[index + 1]) if index + 1 < len(words) else None
            more = [] if inner is None else _command_words(inner, depth + 1, status)
            if more is _CANNOT_TELL:
                return _CANNOT_TELL
            found += [w for m in more for w in _at(folders, m.path, m.later, m.folder, m.there)]
            break
        if command and (word.startswith("-") or word in _RUNS_THE_NEXT):
            continue  # (`env -i prog`, `exec prog`)
        if command and wrapper in ("timeout", "chrt") and not waited:
            waited = True  # (`timeout 5 sh w`: its duration)
            continue
        if command:
            command, first = False, True
            program = posixpath.basename(_unmarked(word)) if _COMPUTED not in word else ""
            if program in _WRAPPERS:
                command, wrapper, waited = True, program, False  # (they run the words after their own)
                continue
            wrapper = ""
            if "/" not in word and _COMPUTED not in word and _VALUE_OF not in word:
                found += [w for entry in path_entries for w in _at(folders, f"{entry}/{word}", not status)]
                if status:
                    # (A program by its name alone, `git-lfs filter-process`: the human's git finds it on their
                    # PATH, which may hold a folder of the project, round 7.)
                    found.append(_Word(word, there="bare"))
                    if word == "git" and index + 1 < len(words) and not words[index + 1].startswith("-"):
                        found.append(_Word(f"git-{words[index + 1]}", there="bare"))  # (`git lfs x`)
            if word in ("cd", "pushd"):
                into = True
                continue
            if _COMPUTED in word and (not _after_mark(word) or ".." in _after_mark(word).split("/")):
                return _CANNOT_TELL  # (`$(...)` alone, `$(git rev-parse --git-dir)/../x`: no place to tell)
            if _VALUE_OF in word and not _after_mark(word):
                program = "sh"  # (`"$SHELL" watch.sh`: a variable that is a program runs the next word)
            elif "/" in word:
                found += _at(folders, word, later=not status)
            if program == "eval" and depth < 3:
                # (`eval "sh watch"`: its words are a command's text, read as `sh -c`'s is, review s32 round 4.)
                inner = _shell_words(" ".join(words[index + 1 :]))
                more = [] if inner is None else _command_words(inner, depth + 1, status)
                if more is _CANNOT_TELL:
                    return _CANNOT_TELL
                found += [w for m in more for w in _at(folders, m.path, m.later, m.folder, m.there)]
                break
            if program == "make":
                found += _makefiles(folders[-1], status)
            continue
        if program in _SHELLS and word in ("-o", "+o", "-O", "+O"):
            skip = 1  # (`sh -o errexit watch`, `bash -O extglob w`: the option's value)
            continue
        if program in ("deno", "bun") and word == "run" and first:
            continue  # (`deno run w`: the file is the next word)
        if program in _SHELLS and re.fullmatch(r"-[a-z]*c[a-z]*", word) and depth < 3:
            # (`sh -c`, `bash -lc`, `sh -ec --`: the text is the next word but a `--`, review s32 round 4.)
            text = index + 1
            if text < len(words) and words[text] == "--":
                text += 1
            if text < len(words) and (inner := _shell_words(words[text])) is not None:
                more = _command_words(inner, depth + 1, status)
                if more is _CANNOT_TELL:
                    return _CANNOT_TELL
                found += [w for m in more for w in _at(folders, m.path, m.later, m.folder, m.there)]
                skip = text - index
            continue
        if program.startswith("python") and (word == "-m" or word.startswith("-m")) and first:
            module = word[2:] or (words[index + 1] if index + 1 < len(words) else "")
            found += _modules(folders[-1], [module], status)
            skip = 0 if word[2:] else 1
            first = False
            continue
        if program.startswith("python") and word == "-c" and index + 1 < len(words) and first:
            found += _modules(folders[-1], _PYTHON_IMPORT.findall(words[index + 1]), status)
            skip, first = 1, False
            continue
        if program in ("npx", "bunx") and first and not word.startswith("-"):
            found += _at(folders, f"node_modules/.bin/{word}", later=not status)
            found += _at(folders, f"node_modules/{word}", later=True, folder_too=True)
            first = False
            continue
        value_of = word.partition("=")[2] if word.startswith("-") else word  # (`--config=./x`)
        if not value_of or value_of.startswith("-"):
            continue
        if _INTERPRETERS.fullmatch(program) and first:
            found += _at(folders, value_of, later=not status)  # (the file it runs: `sh watch`)
            first = False
            continue
        first = False
        if "/" in value_of or _FILE_NAME.fullmatch(value_of):
            found += _at(folders, value_of, later=not status, there="path")
        elif status:
            # (Any other word of a setting `git status` runs that is a file of the project when it is there:
            # `watch` run by a program Kiwi does not know reads it, review s32 round 4.)
            found += _at(folders, value_of, there="any")
    return found


# Programs that run the word after them as a program (their own options skipped as options are).
_RUNS_THE_NEXT = ("env", "exec", "command", "nohup", "time", "xargs", "builtin", "then", "else", "do", "!")
# ... and those whose own arguments come first (`timeout 5 sh watch`), with their options that take a value.
_WRAPPERS = (*_RUNS_THE_NEXT, "timeout", "nice", "stdbuf", "setsid", "ionice", "chrt", "busybox", "sudo")
_OPTION_VALUES = {
    "nice": ("-n", "--adjustment"),
    "timeout": ("-s", "-k", "--signal", "--kill-after"),
    "sudo": ("-u", "-g", "-C", "-D", "-h", "-p", "-r", "-t", "-U"),
    "exec": ("-a",),
    "env": ("-u", "--unset", "-C", "--chdir"),
    "stdbuf": ("-i", "-o", "-e"),
    "ionice": ("-c", "-n", "-p"),
}


def _modules(folder: str, modules: list[str], status: bool) -> list[_Word]:
    """What Python loads for each of ``modules`` from the folder it runs in (first on its path): NAME.py, a
    sourceless NAME.pyc, a package's NAME/__init__.py(c) (review s32, third round). (A top-level module the
    agent writes that shadows one NAME imports, `argparse.py`, is not named: README, limits.)"""
    found: list[_Word] = []
    for dotted in dict.fromkeys(m for m in modules if m):
        parts = dotted.split(".")
        for depth in range(1, len(parts) + 1):  # (`-m a.b`: a/__init__.py, then a/b.py)
            module = "/".join(parts[:depth])
            for name in (f"{module}.py", f"{module}.pyc", f"{module}/__init__.py", f"{module}/__init__.pyc"):
                found += _at([folder], name, later=not status)
    return found


def _makefiles(folder: str, status: bool) -> list[_Word]:
    return [w for name in ("Makefile", "makefile", "GNUmakefile") for w in _at([folder], name, not status)]


def _after_mark(word: str) -> str:
    """What follows the last substitution in ``word``."""
    return re.split(f"[{_COMPUTED}{_VALUE_OF}]", word)[-1]


def _unmarked(word: str) -> str:
    return _after_mark(word).lstrip("/") if (_COMPUTED in word or _VALUE_OF in word) else word


def _at(
    folders: list[str], word: str, later: bool = False, folder_too: bool = False, there: str = ""
) -> list[_Word]:
    """The files ``word`` names, run from each of ``folders`` (the top, and where a `cd` in the value goes);
    after a substitution, from the work tree's top. A glob (`scripts/watch*.sh`) names what it matches
    (in_the_way)."""
    if _COMPUTED in word or _VALUE_OF in word:
        paths = [_after_mark(word).lstrip("/")]
        later = (
            later or _VALUE_OF in word
        )  # (`$HOME/bin/x`: from a variable, no place of the project as a rule)
    elif word.startswith(("/", "~")):
        paths = [word]
    else:
        paths = [posixpath.join(folder, word) if folder else word for folder in dict.fromkeys(folders)]
    return [_Word(path, later, folder_too, there) for path in paths if path]


def _expanded(value: str, base: str | None, home: str) -> str | None:
    """A path a setting gives, absolute: `~/` is the user's home, `~user/` that user's; a relative one is below
    ``base`` (None: no place to take it from)."""
    if not value:
        return None
    if value.startswith("~"):
        user, _, rest = value[1:].partition("/")
        try:
            folder = pwd.getpwnam(user).pw_dir if user else home
        except KeyError:
            return None  # (no such user: git reads nothing there)
        return os.path.normpath(os.path.join(folder, rest))
    if base is None and not os.path.isabs(value):
        return None
    return os.path.normpath(os.path.join(base or "/", value))


def _inside(path: str, root: str, real_root: str) -> list[str]:
    """``path`` relative to the project, as written and where it leads, for each that is in the project."""
    found = []
    for candidate in (os.path.normpath(path), os.path.realpath(path)):
        for top in (real_root, os.path.normpath(root)):
            if candidate == top or candidate.startswith(top + os.sep):
                rel = posixpath.normpath(os.path.relpath(candidate, top).replace(os.sep, "/"))
                if rel not in found:
                    found.append(rel)
                break
    return found


def _shown(path: str, real_root: str) -> str:
    """A config file as a message names it: project-relative inside the project, else its own name only (no
    path of the machine)."""
    real = os.path.realpath(path)
    if real.startswith(real_root + os.sep):
        return os.path.relpath(real, real_root).replace(os.sep, "/")
    return "the user's or the system's git settings"


# How many entries of a named folder (a hooks folder) its identity takes in; past them, the folder's own.
_FOLDER_ENTRIES = 1_000


def identity(root: str, item: Named) -> tuple[int, ...] | None:
    """What ``item`` is on disk, to tell a change by a command: None when it is not there; its inode, size and
    times (a file rewritten in place, or replaced, is another); for a folder, every entry's too."""

    def of(path: str) -> tuple[int, ...] | None:
        try:
            info = os.lstat(path)
        except OSError:
            return None
        return (info.st_dev, info.st_ino, info.st_mode, info.st_size, info.st_mtime_ns, info.st_ctime_ns)

    top = os.path.join(root, item.place)
    found = of(top)
    if found is None or not item.folder or os.path.islink(top) or not os.path.isdir(top):
        return found
    seen = 0
    for folder, subdirs, files in os.walk(top):
        subdirs.sort()
        for name in sorted([*subdirs, *files]):
            seen += 1
            if seen > _FOLDER_ENTRIES:
                return found
            found += of(os.path.join(folder, name)) or (-1,)
    return found


def with_matches(root: str, named: list[Named]) -> list[Named]:
    """``named``, and for each glob of them (`scripts/lint-*.sh`, a program's setting) what it matches on disk,
    as places of their own (held read-only, watched)."""
    found = list(named)
    for item in named:
        if any(c in item.place for c in "*?["):
            for path in sorted(glob.glob(os.path.join(glob.escape(root), item.place)))[:_FOLDER_ENTRIES]:
                rel = os.path.relpath(path, root).replace(os.sep, "/")
                if protected_root(rel) is None:
                    found.append(Named(rel, item.why, later=item.later))
    return list(dict.fromkeys(found))


def is_glob(item: Named) -> bool:
    return bool(_GLOB.search(item.place))


def there(root: str, item: Named) -> bool:
    """Whether ``item`` is on disk (a glob: whether it matches something)."""
    if any(c in item.place for c in "*?["):
        return bool(glob.glob(os.path.join(glob.escape(root), item.place)))
    return os.path.lexists(os.path.join(root, item.place))


def safe_made_empty(item: Named) -> bool:
    """Whether a human may make ``item`` empty to have it held: a config file an include names, or a hooks
    folder (an empty program file, or module, would run, or be loaded, in place of the real one)."""
    return item.folder or item.why.lower().startswith(("include.path", "includeif."))


def reached(item: Named, folders: list[str]) -> bool:
    """Whether ``item`` is in one of ``folders`` (project-relative; '' or '.': the project)."""
    place = fold_path(item.place)
    return any(
        f in ("", ".") or place == fold_path(f) or place.startswith(fold_path(f) + "/") for f in folders
    )
