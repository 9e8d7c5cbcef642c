"""What a ``shell.run`` program may touch, enforced by the kernel (``kiwi/landlock.py``).

The shell policy (``kiwi/shellpolicy.py``) and the worker's checks on disk decide whether a command runs, on a
model of what the program will do, before it runs. The confinement is the wall behind them, set up by the
kernel for the program and everything it starts, and checked at each use:

- reads: below the literal part of each read grant (``src/**`` gives ``src``, ``*.md`` the project), inside
  the project, never through a link, and not in the protected places the grant does not name (the root's
  ``.git``, ``.ai/config``, ...); the project when the run names no grant;
- writes (create, change, remove, rename, link; not reading): below the literal part of each write grant,
  the same way; git reads its ``.git`` and, when the run may write at all, writes it;
- the system's programs and libraries, read only (``/usr``, ``/lib*``, ``/bin``, ``/sbin``, the few files of
  ``/etc`` programs read), ``/dev/null``, and a temporary folder of the command's own (``TMPDIR``);
- execute: the program itself and its ELF interpreter, nothing else (git: its own helpers; a script: its
  interpreter and the system's program folders), so an allowed program cannot start another;
- no TCP connections or listening sockets, no signals to processes outside the command, no abstract UNIX
  sockets outside it (as the kernel's Landlock ABI allows: TCP from ABI 4, the rest from ABI 6).

Nothing else: not the worker's home, ``/proc``, the other runs' projects, Kiwi's own files. What the wall
cannot say, the checks before it still do: denials and protected places inside a granted folder, globs
finer than a folder (``out/*.txt``), what a program prints of what it may read.

``KIWI_CONFINE``: ``auto`` (the default: confined where the kernel has Landlock), ``required`` (a worker
without it refuses shell commands), ``off``.
"""

from __future__ import annotations

import os
import struct
import sys

from kiwi import landlock
from kiwi.contracts import CommandRequest
from kiwi.protected import names, protected_root

_GLOB = set("*?[{")
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
_SYSTEM_PROGRAMS = ("/usr/bin", "/bin", "/usr/sbin", "/sbin", "/usr/lib", "/usr/libexec", "/usr/local/bin")


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
    for segment in pattern.strip("/").split("/"):
        if not segment or any(c in _GLOB for c in segment):
            break
        kept.append(segment)
    return "/".join(kept)


def shell_rules(req: CommandRequest, program: str, temp: str, into: str = "") -> landlock.Rules:
    """The rules for ``req``'s program (``program``: its absolute path) with ``temp`` as its own folder.
    ``into``: the one folder it writes, in place of the project (an archive unpacked into Kiwi's staging
    folder, which Kiwi then writes into the project itself)."""
    rules = landlock.Rules()
    root = os.path.realpath(req.project_root)
    grants = bool(req.read_grants or req.write_grants)
    for pattern in req.read_grants if grants else ["**"]:
        _read_below(rules, root, literal_part(pattern), pattern)
    writes = [] if into else [literal_part(p) for p in req.write_grants] if grants else [""]
    if into:
        rules.allow(into, landlock.READ | landlock.WRITE)
    for rel in writes:
        # A file not made yet is made in its folder: the nearest one that exists holds the rule.
        rules.allow_beneath(root, _existing(root, rel), landlock.WRITE)
    name = os.path.basename(program)
    if name == "git":  # (its repository: git's reading of protected places is its own, see README: Shell)
        rules.allow_beneath(root, ".git", landlock.READ | (landlock.WRITE if writes else 0))
    for path in _SYSTEM_READ + _ETC + _DEVICES_READ:
        rules.allow(path, landlock.READ)
    rules.allow("/dev/null", landlock.READ_FILE | landlock.WRITE_FILE | landlock.TRUNCATE)
    rules.allow(temp, landlock.READ | landlock.WRITE)
    rules.allow(os.path.dirname(program), landlock.READ)
    for executable in _executables(program):
        rules.allow(executable, landlock.EXECUTE | landlock.READ_FILE)
    if name == "git":
        for folder in ("/usr/lib/git-core", "/usr/libexec/git-core", "/usr/local/libexec/git-core"):
            rules.allow(folder, landlock.EXECUTE | landlock.READ)
    elif _script(program):
        # A script (egrep runs `grep -E`) may start the system's programs, none the agent wrote.
        for folder in _SYSTEM_PROGRAMS:
            rules.allow(folder, landlock.EXECUTE | landlock.READ)
    return rules


def _read_below(rules: landlock.Rules, root: str, rel: str, pattern: str) -> None:
    """Read below ``rel`` (the literal part of the read grant ``pattern``), but not the protected places there
    that the grant does not name (``.git``, ``.ai/config``, ``.ai/logs``, ``temporal-dev.yml``, ...: as
    kiwi/protected.py, for the project's root and its ``.ai``): the folder's names may be listed, and each
    entry but those read. ``grep -r KEY .`` then reads the project and not ``.git/config``."""
    if rel and _fold(rel) != ".ai":
        rules.allow_beneath(root, rel, landlock.READ)
        return
    rules.allow_beneath(root, rel, landlock.READ_DIR)
    try:
        entries = [entry.name for entry in os.scandir(os.path.join(root, rel))]
    except OSError:
        return
    for entry in entries:
        child = f"{rel}/{entry}" if rel else entry
        place = protected_root(child)
        if place is not None and not names(pattern, place):
            continue
        if _fold(child) == ".ai":
            _read_below(rules, root, child, pattern)
        else:
            rules.allow_beneath(root, child, landlock.READ)


def _fold(rel: str) -> str:
    return rel.casefold().rstrip(" .")


def _existing(root: str, rel: str) -> str:
    while rel and not os.path.isdir(os.path.join(root, rel)):
        rel = os.path.dirname(rel)
    return rel


def _executables(program: str, depth: int = 0) -> list[str]:
    """``program`` and what the kernel opens to execute it: its ELF interpreter, or its script's."""
    real = os.path.realpath(program)
    found = [program, real]
    if depth > 3:
        return found
    try:
        with open(real, "rb") as file:
            head = file.read(256)
            if head.startswith(b"#!"):
                interpreter = head[2:].split(b"\n")[0].strip().split(b" ")[0]
                if interpreter:
                    found += _executables(os.fsdecode(interpreter), depth + 1)
            elif head.startswith(b"\x7fELF") and (interp := _elf_interpreter(file, head)):
                found += _executables(interp, depth + 1)
    except OSError:
        pass
    return found


def _script(program: str) -> bool:
    try:
        with open(os.path.realpath(program), "rb") as file:
            return file.read(2) == b"#!"
    except OSError:
        return False


def _elf_interpreter(file, head: bytes) -> str:  # type: ignore[no-untyped-def]
    """The PT_INTERP of an ELF file ('' for a static one)."""
    wide, order = head[4] == 2, "<" if head[5] == 1 else ">"
    phoff = struct.unpack_from(order + ("Q" if wide else "I"), head, 32 if wide else 28)[0]
    phentsize, phnum = struct.unpack_from(order + "HH", head, 54 if wide else 42)
    for index in range(min(phnum, 64)):
        file.seek(phoff + index * phentsize)
        entry = file.read(phentsize)
        if len(entry) < phentsize or struct.unpack_from(order + "I", entry, 0)[0] != 3:  # PT_INTERP
            continue
        offset, size = (
            struct.unpack_from(order + "Q8x8xQ", entry, 8)
            if wide
            else struct.unpack_from(order + "I4x4xI", entry, 4)
        )
        file.seek(offset)
        return file.read(min(size, 4096)).rstrip(b"\0").decode("utf-8", "replace")
    return ""


def platform_note() -> str:
    """One line for ``kiwi doctor`` and the worker's start: whether shell commands are confined."""
    if not sys.platform.startswith("linux"):
        return "shell commands are not confined (Landlock is Linux's)"
    abi = available()
    if mode() == "off":
        return "shell commands are not confined (KIWI_CONFINE=off)"
    if abi == 0:
        return "shell commands are not confined: this kernel has no Landlock (Linux 5.13+, enabled at boot)"
    return f"shell commands are confined by Landlock (ABI {abi})"
