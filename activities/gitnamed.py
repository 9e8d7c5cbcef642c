"""Places of the project that git's settings name, outside any git folder: a config file a setting includes
(`include.path`, `includeIf.*.path`: a team's `.gitconfig` in the project, there or not yet), a config file git
reads in the project (a git folder kept elsewhere, `gitdir: .bare`), the hooks folder `core.hooksPath` names
(husky's `.husky/_`), and a program a setting has git run by its path (`core.fsmonitor = scripts/watch`).

git run in the project obeys them, a human's `git status` too, before the human has looked at anything: they
are settings as `.git/config` is, and a write grant reaches them only where its literal part names them
(`write .gitconfig`, `write .husky/_/**`), never by `**` (review s31 round 3, F2/F6: `.git/config` including
`../.gitconfig`, which the agent wrote a `core.pager` into under `write **`). Read with git itself, as the
human's git reads them (the system's and the user's settings too: `core.hooksPath = .githooks` set for every
repository names a folder of this one); an include a condition leaves out now (`onbranch:`) is followed all
the same. What git cannot read is no setting Kiwi can check: every write is refused until a human fixes it."""

from __future__ import annotations

import dataclasses
import os
import posixpath
import pwd
import re
import shlex
import shutil
import subprocess

from kiwi.protected import fold_path, names, protected_root

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
# How many config files an include chain is followed through (git's own depth limit is 10), and how many
# entries of a git folder's `modules/` are looked through for submodules' git folders.
_FILES_LIMIT = 50
_MODULES_LIMIT = 10_000
# A command substitution (`$(...)`, backquotes) and a variable (`$X`, `${X}`) in a program's value.
_COMMAND_SUBSTITUTION = re.compile(r"\$\([^()]*\)|`[^`]*`")
_VARIABLE = re.compile(r"\$\{\w+\}|\$\w+")
_COMPUTED, _VALUE_OF = "\x01", "\x00"


@dataclasses.dataclass(frozen=True)
class Named:
    """A place of the project a setting names: ``place`` project-relative, ``why`` the setting and the file
    it is in, ``folder``: all below it too (a hooks folder)."""

    place: str
    why: str
    folder: bool = False
    hook: bool = False  # (run by git commit, checkout, ... as a hook: not by `git status`)


class Unreadable(Exception):
    """What git's settings name cannot be told (a config file git cannot parse, no git where the worker runs, a
    program a setting computes): what stands in the way."""


@dataclasses.dataclass(frozen=True)
class _Entry:
    origin: str  # the config file, absolute
    key: str
    value: str
    top: str | None  # the work tree's top of the repository it is read for (where hooks and programs run)


def named_places(root: str) -> list[Named]:
    """The places of the project at ``root`` that git's settings name (see the module's text), but those in
    a protected place (kiwi.protected: `.git/config` is one already). Read for the repository the project is
    in and for each of its submodules (git status runs in each). Raises Unreadable."""
    real_root = os.path.realpath(root)
    home = os.path.expanduser("~")
    if shutil.which("git") is None:
        if _in_a_repository(real_root):
            raise Unreadable(
                "git is not installed where Kiwi's worker runs, so it cannot read git's settings"
            )
        return []
    found: dict[str, Named] = {}

    def note(path: str, why: str, folder: bool = False, hook: bool = False) -> None:
        for rel in _inside(path, root, real_root):
            if rel == "." and folder:
                for name in _HOOKS:
                    found.setdefault(name, Named(name, why, hook=True))
                continue
            if rel != "." and protected_root(rel) is None:
                known = found.get(rel)
                if known is None or (folder and not known.folder) or (known.hook and not hook):
                    found[rel] = Named(rel, why, folder, hook)

    git_dir, top = _repository(real_root)
    entries, origins = _settings(top or real_root, [], top, strict=True)
    for module, work_tree in _submodules(git_dir):
        more, files = _settings(real_root, ["--git-dir", module], work_tree, strict=False)
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
                more, _ = _settings(real_root, ["--file", real], entry.top, strict=False)
                pending += more
        elif key.lower() == "core.hookspath":
            target = _expanded(value, entry.top, home)
            if target is not None:
                note(target, why, folder=True, hook=True)
                if os.path.basename(target) == "_":
                    # husky (9): each hook of `.husky/_` runs the project's `.husky/NAME` (review s32).
                    for name in _HOOKS:
                        note(os.path.join(os.path.dirname(target), name), why, hook=True)
        elif (words := _program_words(key, value)) is not None:
            if words is _CANNOT_TELL:
                raise Unreadable(
                    f"{key} in {where} computes the program git runs ({value.strip()[:80]!r}), so Kiwi cannot "
                    "tell which file of the project it is"
                )
            for word in words:
                target = _expanded(word, entry.top, home)
                # (An argument with no `/` is a file only when there is one: `git-lfs smudge -- %f`, which every
                # user of git-lfs has, names no file `smudge`.)
                if target is not None and ("/" in word or os.path.lexists(target)):
                    note(target, why)
    for origin in origins:  # (after: a file an include names is shown by the include)
        note(origin, f"a config file git reads ({_shown(origin, real_root)})")
    return sorted(found.values(), key=lambda n: n.place)


def in_the_way(named: list[Named], rel: str, grants: list[str], below: bool = False) -> Named | None:
    """The first of ``named`` that a change of ``rel`` (project-relative) changes and no write grant names:
    ``rel`` is it or below it; with ``below`` (a folder deleted, moved or moved into place), it below ``rel``
    too."""
    folded = fold_path(rel)
    for item in named:
        place = fold_path(item.place)
        hit = folded == place or folded.startswith(place + "/")
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


def _git_env() -> dict[str, str]:
    """The worker's environment without git's own variables (GIT_DIR would point it elsewhere)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update({"GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C"})
    return env


def _git(cwd: str, args: list[str]) -> subprocess.CompletedProcess[bytes]:
    # safe.directory: a repository another user owns (a container's bind mount) is read as its owner's git
    # reads it; without it git read no `.git/config` there and said nothing (review s32).
    return subprocess.run(
        ["git", "-c", "safe.directory=*", *args],
        cwd=cwd,
        env=_git_env(),
        capture_output=True,
        timeout=30,
        check=False,
    )


def _settings(cwd: str, how: list[str], top: str | None, strict: bool) -> tuple[list[_Entry], list[str]]:
    """Each setting ``git config --list`` prints run in ``cwd`` with ``how`` (before `config`: `--git-dir X`;
    after: `--file X`), and the files it read, absolute. Raises Unreadable where git cannot, when ``strict``."""
    before, after = (how, []) if how[:1] == ["--git-dir"] else ([], how)
    args = [*before, "config", "--list", "--show-origin", "-z", *(after or ["--includes"])]
    try:
        done = _git(cwd, args)
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


def _repository(real_root: str) -> tuple[str | None, str | None]:
    """The git folder and the work tree's top of the repository the project is in (None, None: none)."""
    try:
        done = _git(real_root, ["rev-parse", "--absolute-git-dir", "--show-toplevel"])
    except subprocess.TimeoutExpired:
        raise Unreadable("git rev-parse took more than 30 seconds") from None
    lines = [os.fsdecode(line) for line in done.stdout.splitlines()]
    if done.returncode != 0 or not lines:
        if _in_a_repository(real_root):
            raise Unreadable(_said(done, real_root))
        return None, None
    return lines[0], (lines[1] if len(lines) > 1 else None)


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


def _submodules(git_dir: str | None) -> list[tuple[str, str | None]]:
    """(git folder, work tree) of each submodule below ``git_dir``'s `modules/` (nested ones too)."""
    if git_dir is None or not os.path.isdir(os.path.join(git_dir, "modules")):
        return []
    found: list[tuple[str, str | None]] = []
    seen = 0
    for folder, subdirs, files in os.walk(os.path.join(git_dir, "modules")):
        seen += len(subdirs) + len(files)
        if seen > _MODULES_LIMIT:
            raise Unreadable(
                f"the repository's modules/ has more than {_MODULES_LIMIT:,} entries to look through"
            )
        if "config" in files and "HEAD" in files:
            found.append((folder, _work_tree_of(folder)))
            subdirs[:] = [d for d in subdirs if d == "modules"]
    return found


def _work_tree_of(module: str) -> str | None:
    """A submodule's work tree, as its `core.worktree` says (relative to its git folder)."""
    try:
        done = _git(module, ["config", "--file", os.path.join(module, "config"), "--get", "core.worktree"])
    except subprocess.TimeoutExpired:
        return None
    value = os.fsdecode(done.stdout.strip())
    return os.path.normpath(os.path.join(module, value)) if done.returncode == 0 and value else None


_CANNOT_TELL: list[str] = []


def _program_words(key: str, value: str) -> list[str] | None:
    """The files of a program's setting (None: the key names no program): the program when given by a path,
    and each word after it with a `/` or naming a file (`sh scripts/watch.sh`, `FOO=1 tools/x`, `cd scripts
    && ./watch.sh`, `ssh -F ./ssh_config`: review s32); a path after a substitution is taken from the work
    tree's top (`"$(git rev-parse --show-toplevel)/scripts/watch.sh"`). _CANNOT_TELL when a substitution
    gives the program itself."""
    section, _, name = key.lower().partition(".")
    if "." in name:
        if name.rpartition(".")[2] not in _PROGRAM_SUBKEYS.get(section, ()):
            return None
    elif (
        key.lower() not in _PROGRAM_KEYS
        and section != "pager"
        and not (section == "alias" and value.lstrip().startswith("!"))
    ):
        return None
    text = _VARIABLE.sub(_VALUE_OF, _COMMAND_SUBSTITUTION.sub(_COMPUTED, value.strip().removeprefix("!")))
    if "$(" in text or "`" in text:
        return _CANNOT_TELL  # (nested or unclosed)
    lexer = shlex.shlex(text, posix=True, punctuation_chars=";&|<>()")
    lexer.whitespace_split = True
    try:
        words = list(lexer)
    except ValueError:
        words = text.split()
    found = []
    command = True  # (the word in a command's place: after an operator, and past `VAR=x` words)
    folder = ""  # (where a `cd` in the value went: `cd scripts && ./watch.sh` runs scripts/watch.sh)
    into = False
    for word in words:
        if word and set(word) <= set(";&|<>()"):
            command = True
            continue
        if command and re.fullmatch(r"\w+=.*", word):
            continue
        if command and word == "cd":
            command, into = False, True
            continue
        value_of = word.rpartition("=")[2] if word.startswith("-") else word  # (`--config=./x`)
        path = None
        if _COMPUTED in value_of or _VALUE_OF in value_of:
            rest = re.split(f"[{_COMPUTED}{_VALUE_OF}]", value_of)[-1]
            if command and _COMPUTED in value_of and not rest:
                return _CANNOT_TELL
            if rest.startswith("/"):
                path = "/" + rest.lstrip("/")  # (from the work tree's top: marked so below)
        elif "/" in value_of or not command and value_of and not value_of.startswith("-"):
            path = value_of
        command = False
        if path is None:
            continue
        if into:
            folder, into = posixpath.join(folder, path.lstrip("/")), False
            continue
        if path.startswith("/") and path is not value_of:
            found.append(path.lstrip("/"))
        else:
            found.append(posixpath.join(folder, path) if folder and not path.startswith(("/", "~")) else path)
    return found


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


def reached(item: Named, folders: list[str]) -> bool:
    """Whether ``item`` is in one of ``folders`` (project-relative; '' or '.': the project)."""
    place = fold_path(item.place)
    return any(
        f in ("", ".") or place == fold_path(f) or place.startswith(fold_path(f) + "/") for f in folders
    )
