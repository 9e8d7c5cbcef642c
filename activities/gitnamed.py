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
import shlex
import subprocess

from kiwi.protected import fold_path, names, protected_root

# Settings whose value is a program git runs (itself, or through a shell: its first word), by key as
# `git config --list` prints it (lower-case section and name, subsection as written).
_PROGRAM_KEYS = (
    "core.fsmonitor", "core.pager", "core.editor", "core.sshcommand", "core.askpass", "core.gitproxy",
    "core.alternaterefscommand", "sequence.editor", "diff.external", "interactive.difffilter",
    "gpg.program", "gpg.ssh.defaultkeycommand", "uploadpack.packobjectshook", "credential.helper",
    "sendemail.smtpserver", "web.browser",
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
}
# git's hook names: a hooks folder that is the work tree's top protects only these there.
_HOOKS = (
    "applypatch-msg", "pre-applypatch", "post-applypatch", "pre-commit", "pre-merge-commit",
    "prepare-commit-msg", "commit-msg", "post-commit", "pre-rebase", "post-checkout", "post-merge",
    "pre-push", "pre-receive", "update", "proc-receive", "post-receive", "post-update", "reference-transaction",
    "push-to-checkout", "pre-auto-gc", "post-rewrite", "sendemail-validate", "fsmonitor-watchman",
    "p4-changelist", "p4-prepare-changelist", "p4-post-changelist", "p4-pre-submit", "post-index-change",
)  # fmt: skip
# How many config files an include chain is followed through (git's own depth limit is 10).
_FILES_LIMIT = 50


@dataclasses.dataclass(frozen=True)
class Named:
    """A place of the project a setting names: ``place`` project-relative, ``why`` the setting and the file
    it is in, ``folder``: all below it too (a hooks folder)."""

    place: str
    why: str
    folder: bool = False


class Unreadable(Exception):
    """git could not read the settings (a config file it cannot parse): its words."""


def named_places(root: str) -> list[Named]:
    """The places of the project at ``root`` that git's settings name (see the module's text), but those in
    a protected place (kiwi.protected: `.git/config` is one already). Raises Unreadable."""
    real_root = os.path.realpath(root)
    home = os.path.expanduser("~")
    entries, origins = _settings(root, ["--includes"])
    found: dict[str, Named] = {}
    tops: list[str] = []

    def top() -> str:
        """Where git runs hooks and programs: the work tree's top (asked once, when a setting needs it)."""
        if not tops:
            tops.append(_work_tree_top(root) or real_root)
        return tops[0]

    def note(path: str, why: str, folder: bool = False) -> None:
        for rel in _inside(path, root, real_root):
            if rel == "." and folder:
                for hook in _HOOKS:
                    found.setdefault(hook, Named(hook, why))
                continue
            if rel != "." and protected_root(rel) is None:
                known = found.get(rel)
                if known is None or (folder and not known.folder):
                    found[rel] = Named(rel, why, folder)

    read: set[str] = {os.path.realpath(origin) for origin in origins}
    pending = list(entries)
    while pending:
        origin, key, value = pending.pop(0)
        where = _shown(origin, real_root)
        section, _, name = key.rpartition(".")
        lowered = section.lower()
        if name == "path" and (lowered == "include" or lowered.startswith("includeif.")):
            target = _expanded(value, os.path.dirname(origin), home)
            if target is None:
                continue
            note(target, f"{key} in {where}")
            real = os.path.realpath(target)
            if real not in read and os.path.isfile(real) and len(read) < _FILES_LIMIT:
                # (Followed whatever its condition says now: a branch switched to later makes it count.)
                read.add(real)
                more, _ = _settings(root, ["--file", real])
                pending += more
        elif key.lower() == "core.hookspath":
            target = _expanded(value, top(), home)
            if target is not None:
                note(target, f"{key} in {where}", folder=True)
        elif (program := _program(key, value)) is not None:
            target = _expanded(program, top(), home)
            if target is not None:
                note(target, f"{key} in {where}")
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


def _settings(root: str, how: list[str]) -> tuple[list[tuple[str, str, str]], list[str]]:
    """(origin file, key, value) of each setting ``git config --list`` prints with ``how``, and the files it
    read, absolute."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update({"GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C"})
    try:
        done = subprocess.run(
            ["git", "config", "--list", "--show-origin", "-z", *how],
            cwd=root,
            env=env,
            capture_output=True,
            timeout=30,
            check=False,
        )
    except FileNotFoundError:
        return [], []  # (no git: nothing runs what a setting says)
    except subprocess.TimeoutExpired:
        raise Unreadable("git config --list took more than 30 seconds") from None
    if done.returncode != 0:
        said = done.stderr.decode(errors="replace").strip() or f"git config exited {done.returncode}"
        # (No path of the machine in a message to the agent: the project's and the home folder's are named so.)
        for path, shown in ((os.path.realpath(root), "."), (root, "."), (os.path.expanduser("~"), "~")):
            said = said.replace(path + os.sep, shown + "/").replace(path, shown)
        raise Unreadable(said)
    fields = done.stdout.split(b"\0")
    entries: list[tuple[str, str, str]] = []
    origins: list[str] = []
    for origin, item in zip(fields[0::2], fields[1::2], strict=False):
        text = os.fsdecode(origin)
        if not text.startswith("file:"):
            continue  # (the command line's, a blob's: no file)
        path = os.path.join(root, text[len("file:") :])
        key, _, value = os.fsdecode(item).partition("\n")
        entries.append((path, key, value))
        if path not in origins:
            origins.append(path)
    return entries, origins


def _work_tree_top(root: str) -> str | None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    try:
        done = subprocess.run(
            ["git", "rev-parse", "--show-toplevel"],
            cwd=root,
            env=env,
            capture_output=True,
            timeout=30,
            check=False,
        )
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return None
    return os.fsdecode(done.stdout.strip()) if done.returncode == 0 and done.stdout.strip() else None


def _program(key: str, value: str) -> str | None:
    """The program a setting of a program runs, when its value names one by a path (a word with a `/`)."""
    section, _, name = key.lower().partition(".")
    if "." in name:
        subsection_name = name.rpartition(".")[2]
        if subsection_name not in _PROGRAM_SUBKEYS.get(section, ()):
            return None
    elif key.lower() not in _PROGRAM_KEYS and not (section == "alias" or section == "pager"):
        return None
    text = value.strip().removeprefix("!").strip()
    try:
        words = shlex.split(text)
    except ValueError:
        words = text.split()
    return words[0] if words and "/" in words[0] else None


def _expanded(value: str, base: str, home: str) -> str | None:
    """A path a setting gives, absolute: `~/` is the user's home, a relative one is below ``base``."""
    if not value:
        return None
    if value.startswith("~/") or value == "~":
        return os.path.normpath(os.path.join(home, value[2:]))
    if value.startswith("~"):
        return None  # (another user's home: no place of the project)
    return os.path.normpath(os.path.join(base, value))


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
