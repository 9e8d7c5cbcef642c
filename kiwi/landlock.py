"""Landlock: the kernel confines a program to the folders it is given, whatever the program does.

Kiwi's shell policy reads a command before it runs and checks every path it names on disk; the program then
runs on a file system that can change between the check and the use (a link put in place, a folder swapped),
and may open files no argument names. Landlock (Linux 5.13 and newer, no privilege needed) closes that gap
by construction: once a process has restricted itself, every open, create, rename, link, delete and execute
it (and every program it starts) makes is checked by the kernel against a set of rules, each rule a file or
a folder below which some rights hold. Links are followed to where they lead before the check.

What Landlock has no rule for (sockets other than TCP, IPC, other processes' limits and priorities, a memory
file's execution, set-ID bits) a seccomp filter refuses, and a worker running as root hands its command no
capability (``Ruleset.confinement``).

This module is the mechanism: :class:`Rules` collects rules for a child process and makes the ruleset the
launcher (``kiwi/launch.py``) applies, with the rest of the child's confinement, before it executes the
program. What a shell command gets is
decided in ``activities/confinement.py``. Constants and layouts are those of ``linux/landlock.h``,
``linux/seccomp.h`` and ``linux/capability.h``.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import os
import platform
import stat
import struct
import sys
from dataclasses import dataclass, field
from typing import Any

# System call numbers: the same on every architecture that has Landlock (the generic table's).
# (landlock_restrict_self, 446, is the launcher's: kiwi/launch.py.)
_CREATE_RULESET, _ADD_RULE = 444, 445
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1

# Rights on files and folders (linux/landlock.h), with the ABI version that introduced each.
EXECUTE = 1 << 0
WRITE_FILE = 1 << 1
READ_FILE = 1 << 2
READ_DIR = 1 << 3
REMOVE_DIR = 1 << 4
REMOVE_FILE = 1 << 5
MAKE_CHAR = 1 << 6
MAKE_DIR = 1 << 7
MAKE_REG = 1 << 8
MAKE_SOCK = 1 << 9
MAKE_FIFO = 1 << 10
MAKE_BLOCK = 1 << 11
MAKE_SYM = 1 << 12
REFER = 1 << 13  # ABI 2: link or rename a file into another folder
TRUNCATE = 1 << 14  # ABI 3
IOCTL_DEV = 1 << 15  # ABI 5
_FS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1, 5: (1 << 16) - 1}
# Rights a rule on a file (not a folder) may carry.
FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV

# Network (ABI 4): TCP bind and connect; handled with no rule, neither is allowed.
_NET_TCP = (1 << 0) | (1 << 1)
# Scopes (ABI 6): no connecting to abstract UNIX sockets, no signals, outside the confined processes.
_SCOPES = (1 << 0) | (1 << 1)

READ = READ_FILE | READ_DIR
# Writing needs no reading: what a program reads is what the read rules give (as Kiwi's checks read a
# command). Listing names (READ_DIR) is kept: mkdir -p and rm -r walk the folders they change.
WRITE = (
    READ_DIR
    | WRITE_FILE
    | REMOVE_DIR
    | REMOVE_FILE
    | MAKE_DIR
    | MAKE_REG
    | MAKE_SYM
    | MAKE_FIFO
    | REFER
    | TRUNCATE
)


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


_LIBC = _libc()


def abi_version() -> int:
    """The Landlock ABI this kernel answers (0: none, not Linux, or switched off at boot)."""
    if _LIBC is None or platform.machine() not in ("x86_64", "aarch64", "riscv64", "arm64"):
        return 0
    _LIBC.syscall.restype = ctypes.c_long
    version = _LIBC.syscall(
        ctypes.c_long(_CREATE_RULESET), None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION)
    )
    return max(int(version), 0)


class LandlockError(OSError):
    """A rule the kernel did not take (a path that vanished, a right a file cannot have)."""


_OPENAT2 = 437
_RESOLVE_NO_MAGICLINKS, _RESOLVE_NO_SYMLINKS, _RESOLVE_BENEATH = 0x02, 0x04, 0x08


@dataclass
class Rules:
    """The rules of one child process: each path with the rights that hold at and below it.

    Rights add up: a path named twice holds both. A path that does not exist is left out (nothing can
    be opened there, and Landlock denies what no rule allows). A path given with a folder to stay in
    (:meth:`allow_beneath`) is opened from that folder by the kernel without following a link on the way
    (``openat2`` with ``RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS``): a path that is or goes through a link gets
    no rule, whatever the link was when Kiwi last looked (what the link leads to is covered, or not, by
    where it is)."""

    paths: dict[tuple[str, str, bool], int] = field(default_factory=dict)
    # Places below ``held_root`` held read-only (see kiwi/launch.py ``_hold``); ``held_required``: where the
    # kernel gives the command no namespace of its own, it does not run (KIWI_CONFINE=required).
    held_root: str = ""
    held: list[str] = field(default_factory=list)
    held_required: bool = False
    # Bits of a mode the program may not give a file by chmod, beyond the set-ID bits no program may (the seccomp
    # filter), and that its umask keeps; with them, no extended attribute (an ACL) is set or removed: a program
    # Kiwi does not model may make no file group- or world-writable (0o022).
    chmod_refused: int = 0

    def allow(self, path: str, rights: int, *, file: bool = False) -> None:
        """``rights`` at and below ``path``. ``file``: only if it is a regular file, not a link (the rule is
        left out otherwise): for EXECUTE, which on a folder would hold for everything below it."""
        self._add((("", path, file)), rights)

    def allow_beneath(self, root: str, rel: str, rights: int, *, file: bool = False) -> None:
        self._add((root, rel, file), rights)

    def _add(self, key: tuple[str, str, bool], rights: int) -> None:
        self.paths[key] = self.paths.get(key, 0) | rights

    def ruleset(self, abi: int) -> Ruleset:
        """Make the ruleset now, in this process, for the launcher to apply to the child."""
        assert _LIBC is not None and abi > 0
        handled = _FS_BY_ABI.get(abi, _FS_BY_ABI[5])
        attr = struct.pack("=QQQ", handled, _NET_TCP if abi >= 4 else 0, _SCOPES if abi >= 6 else 0)
        size = 8 if abi < 4 else 16 if abi < 6 else 24
        buffer = ctypes.create_string_buffer(attr, len(attr))
        fd = _LIBC.syscall(ctypes.c_long(_CREATE_RULESET), buffer, ctypes.c_size_t(size), ctypes.c_uint32(0))
        if fd < 0:
            raise LandlockError(ctypes.get_errno(), "landlock_create_ruleset failed")
        roots: dict[str, int] = {}
        try:
            for (root, path, file), rights in self.paths.items():
                if root and root not in roots:
                    roots[root] = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
                target = _open_beneath(roots[root], path) if root else _open(path, file)
                if target is None:
                    continue
                try:
                    if not file or stat.S_ISREG(os.fstat(target).st_mode):
                        _add(fd, target, rights & handled, path)
                finally:
                    os.close(target)
        except BaseException:
            os.close(fd)
            raise
        finally:
            for opened in roots.values():
                os.close(opened)
        return Ruleset(fd, self.held_root, self.held, self.held_required, self.chmod_refused)


def _open(path: str, file: bool = False) -> int | None:
    try:
        return os.open(path, os.O_PATH | os.O_CLOEXEC | (os.O_NOFOLLOW if file else 0))
    except (FileNotFoundError, NotADirectoryError):
        return None


def _open_beneath(root: int, rel: str) -> int | None:
    """``rel`` opened from the folder ``root`` without leaving it or following a link (None: it does not
    exist, or is or goes through a link)."""
    assert _LIBC is not None
    if "\0" in rel:  # (the kernel would read the name up to it: another, wider place)
        raise LandlockError(22, f"a path with a NUL: {rel!r}")
    how = ctypes.create_string_buffer(
        struct.pack("=QQQ", os.O_PATH | os.O_CLOEXEC, 0, _RESOLVE_BENEATH | _RESOLVE_NO_SYMLINKS), 24
    )
    fd = _LIBC.syscall(
        ctypes.c_long(_OPENAT2), ctypes.c_int(root), os.fsencode(rel or "."), how, ctypes.c_size_t(24)
    )
    if fd < 0:
        errno = ctypes.get_errno()
        if errno in (2, 18, 20, 40):  # ENOENT, EXDEV (leads out), ENOTDIR, ELOOP
            return None
        raise LandlockError(errno, f"openat2 failed for {rel}")
    return int(fd)


def _add(ruleset: int, target: int, rights: int, shown: str) -> None:
    if not stat.S_ISDIR(os.fstat(target).st_mode):
        rights &= FILE_RIGHTS
    if not rights:
        return
    rule = ctypes.create_string_buffer(struct.pack("=Qi", rights, target), 12)
    assert _LIBC is not None
    if (
        _LIBC.syscall(
            ctypes.c_long(_ADD_RULE),
            ctypes.c_int(ruleset),
            ctypes.c_int(_RULE_PATH_BENEATH),
            rule,
            ctypes.c_uint32(0),
        )
        != 0
    ):
        raise LandlockError(ctypes.get_errno(), f"landlock_add_rule failed for {shown}")


# Capabilities (linux/capability.h): a worker running as root hands its command none (the launcher drops
# each capability up to the last, then the rest with capset, whose number depends on the architecture).
_CAP_LAST = 63
_CAPSET = {"x86_64": 126, "aarch64": 91, "arm64": 91, "riscv64": 91}

# seccomp (linux/seccomp.h, linux/filter.h): what Landlock does not cover. No socket at all (socket and
# socketpair: UDP, raw and packet sockets, UNIX sockets by path such as a container engine's or syslog's,
# netlink), no io_uring (which opens sockets without the socket call), no System V or POSIX IPC (another
# process's shared memory), no keyrings, no perf events, no memfd to execute (Landlock does not check a
# private file's execution), no execveat, no fanotify; no resource limit or scheduling of another process
# (prlimit reaches every process of the same user: a signal scope does not cover it), no priority of any
# (setpriority and ioprio_set take a whole user's processes); no leaving the command's session (setsid:
# what is left running in it is killed when the call ends, and by the keeper; a process group of its own,
# which `timeout` and ninja make, stays in it) and no child made the
# worker's (clone with CLONE_PARENT: nothing reaps it; clone3, whose flags are in memory, answers ENOSYS and
# callers fall back to clone); no namespace and no mount (the places held read-only stay so); no set-user-ID or set-group-ID bit in a mode (chmod,
# open, mknod: a worker running as root owns the system's files); openat2 answered ENOSYS (its mode is in a
# struct; callers fall back to openat); and no system call of another architecture's table.
_RET_ALLOW, _RET_ERRNO = 0x7FFF0000, 0x00050000
_EPERM, _EACCES, _ENOSYS = 1, 13, 38
_SET_ID_BITS = 0o6000


@dataclass(frozen=True)
class _Table:
    arch: int  # AUDIT_ARCH_*
    refused: tuple[int, ...]
    modes: tuple[tuple[int, int], ...]  # (call, index of its mode argument)
    own: tuple[int, ...]  # calls whose first argument, a process, must be 0 (the caller itself)
    denied: tuple[int, ...]  # answered EPERM, as the kernel answers it when it refuses (setsid)
    clone: int  # refused with CLONE_PARENT in its flags (the first argument)
    second_table: int = 0  # the first number of another table in the same architecture (x32), or 0
    chmods: tuple[int, ...] = ()  # the calls of ``modes`` that change a mode (chmod), not make a file
    umask: int = -1  # umask: its mask must keep the bits chmod may not give (a file made 0666 under umask 0)
    xattrs: tuple[int, ...] = ()  # set and remove extended attributes (an ACL is one: setfacl o+w)


# openat2 (_OPENAT2) and clone3 have the same number in every table: answered ENOSYS, callers fall back.
_CLONE3 = 435
# clone's flags refused: CLONE_PARENT, and a new namespace of any kind (mount, cgroup, UTS, IPC, user, PID,
# network): a command's own namespaces could not undo the places held read-only (they are locked there), and
# are no need of a shell program.
_CLONE_REFUSED = 0x8000 | 0x7E020000
_GENERIC = _Table(
    0,
    # socket, socketpair, io_uring_setup/enter/register, msgget..shmdt, mq_open, add_key, request_key, keyctl,
    # perf_event_open, memfd_create, execveat, fanotify_init, setpriority, ioprio_set, unshare, setns, mount,
    # umount2, pivot_root, chroot, open_tree, move_mount, fsopen, fsconfig, fsmount, fspick, mount_setattr
    (198, 199, 425, 426, 427, *range(186, 198), 180, 217, 218, 219, 241, 279, 281, 262, 140, 30)
    + (97, 268, 40, 39, 41, 51, *range(428, 434), 442),
    ((52, 1), (53, 2), (452, 2), (56, 3), (33, 2)),  # fchmod, fchmodat, fchmodat2, openat, mknodat
    (
        261,
        122,
        118,
        119,
        274,
    ),  # prlimit64, sched_setaffinity, sched_setparam, sched_setscheduler, sched_setattr
    (157,),  # setsid
    220,
    chmods=(52, 53, 452),  # fchmod, fchmodat, fchmodat2
    umask=166,
    # setxattr, lsetxattr, fsetxattr, removexattr, lremovexattr, fremovexattr, setxattrat, removexattrat
    xattrs=(5, 6, 7, 14, 15, 16, 463, 466),
)
_SECCOMP_ARCH = {
    "x86_64": _Table(
        0xC000003E,
        (41, 53, 425, 426, 427, 29, 30, 31, 64, 65, 66, 67, 68, 69, 70, 71, 220, 240, 248, 249, 250, 298)
        # memfd_create, execveat, fanotify_init, setpriority, ioprio_set, unshare, setns, mount, umount2,
        # pivot_root, chroot, open_tree, move_mount, fsopen, fsconfig, fsmount, fspick, mount_setattr
        + (319, 322, 300, 141, 251, 272, 308, 165, 166, 155, 161, *range(428, 434), 442),
        # chmod, fchmod, fchmodat, fchmodat2, open, openat, creat, mknod, mknodat
        ((90, 1), (91, 1), (268, 2), (452, 2), (2, 2), (257, 3), (85, 1), (133, 1), (259, 2)),
        (
            302,
            203,
            142,
            144,
            314,
        ),  # prlimit64, sched_setaffinity, sched_setparam, sched_setscheduler, sched_setattr
        (112,),  # setsid
        56,
        0x40000000,
        (90, 91, 268, 452),  # chmod, fchmod, fchmodat, fchmodat2
        95,  # umask
        (188, 189, 190, 197, 198, 199, 463, 466),  # the xattr calls, as _GENERIC's
    ),
    "aarch64": dataclasses.replace(_GENERIC, arch=0xC00000B7),
    "arm64": dataclasses.replace(_GENERIC, arch=0xC00000B7),
    "riscv64": dataclasses.replace(_GENERIC, arch=0xC00000F3),
}


def seccomp_filtered() -> bool:
    """Whether a confined command also gets the seccomp filter (an architecture whose numbers Kiwi knows)."""
    return platform.machine() in _SECCOMP_ARCH


@functools.cache
def _seccomp_filter(chmod_refused: int = 0) -> bytes | None:
    """The filter as ``struct sock_filter[]`` (classic BPF over ``struct seccomp_data``: the call's number at
    0, the architecture at 4, argument i's low word at 16 + 8i on these little-endian machines).
    ``chmod_refused``: the bits of a mode chmod may not give, beyond the set-ID bits, and that a umask must keep;
    with them, no extended attribute is set or removed (Rules.chmod_refused)."""
    table = _SECCOMP_ARCH.get(platform.machine())
    if table is None:
        return None
    ld, jeq, jge, jset, ret, and_ = 0x20, 0x15, 0x35, 0x45, 0x06, 0x54
    code: list[tuple[int, int | str, int | str, int]] = [
        (ld, 0, 0, 4),
        (jeq, 0, "enosys", table.arch),
        (ld, 0, 0, 0),
    ]
    if table.second_table:
        code.append((jge, "eacces", 0, table.second_table))
    code += [(jeq, "enosys", 0, _OPENAT2), (jeq, "enosys", 0, _CLONE3)]
    code += [(jeq, "eacces", 0, number) for number in table.refused]
    code += [(jeq, "eperm", 0, number) for number in table.denied]
    code.append((jeq, "clone", 0, table.clone))
    code += [
        (jeq, f"{'chmod' if chmod_refused and number in table.chmods else 'mode'}{index}", 0, number)
        for number, index in table.modes
    ]
    code += [(jeq, "own", 0, number) for number in table.own]
    if chmod_refused:
        code += [(jeq, "umask", 0, table.umask)] if table.umask >= 0 else []
        code += [(jeq, "eperm", 0, number) for number in table.xattrs]
    code.append((ret, 0, 0, _RET_ALLOW))
    labels: dict[str, int] = {"own": len(code)}
    code += [(ld, 0, 0, 16), (jeq, "allow", "eperm", 0)]
    labels["clone"] = len(code)
    code += [(ld, 0, 0, 16), (jset, "eperm", "allow", _CLONE_REFUSED)]
    for index in sorted({index for _, index in table.modes}):
        labels[f"mode{index}"] = len(code)
        code += [(ld, 0, 0, 16 + 8 * index), (jset, "eperm", "allow", _SET_ID_BITS)]
        if chmod_refused:
            labels[f"chmod{index}"] = len(code)
            code += [(ld, 0, 0, 16 + 8 * index), (jset, "eperm", "allow", _SET_ID_BITS | chmod_refused)]
    if chmod_refused:
        labels["umask"] = len(code)
        code += [(ld, 0, 0, 16), (and_, 0, 0, chmod_refused), (jeq, "allow", "eperm", chmod_refused)]
    for name, answer in (
        ("allow", _RET_ALLOW),
        ("eacces", _RET_ERRNO | _EACCES),
        ("eperm", _RET_ERRNO | _EPERM),
        ("enosys", _RET_ERRNO | _ENOSYS),
    ):
        labels[name] = len(code)
        code.append((ret, 0, 0, answer))

    def offset(at: int, target: int | str) -> int:  # (a jump counts the instructions it skips)
        return target if isinstance(target, int) else labels[target] - at - 1

    return b"".join(
        struct.pack("=HBBI", op, offset(at, jt), offset(at, jf), k) for at, (op, jt, jf, k) in enumerate(code)
    )


class Ruleset:
    """A Landlock ruleset made in this process, for one child: the launcher (``kiwi/launch.py``) applies it
    with the rest of :meth:`confinement`. Close it (``.close()``) once the child has started."""

    def __init__(
        self,
        fd: int,
        held_root: str = "",
        held: list[str] | None = None,
        required: bool = False,
        chmod_refused: int = 0,
    ) -> None:
        self.fd = fd
        self.held_root, self.held, self.required = held_root, held or [], required
        self.chmod_refused = chmod_refused

    def confinement(self) -> dict[str, Any]:
        """What the launcher does before it executes the program, in this order: a worker running as root
        drops its capabilities (bounding, ambient, then its own sets), no new privileges (required to
        restrict oneself unprivileged; a set-uid or file-capability program gains nothing), the seccomp
        filter, then this ruleset. A failure stops the launcher before the program runs: it never runs
        unconfined. Before them, the places ``held`` are held read-only (a mount namespace)."""
        return {
            "held_root": os.fsencode(self.held_root),
            "held": [os.fsencode(rel) for rel in self.held],
            "held_required": self.required,
            "ruleset": self.fd,
            "root": os.geteuid() == 0 or os.getuid() == 0,
            "capset": _CAPSET.get(platform.machine()),
            "cap_last": _CAP_LAST,
            "seccomp": _seccomp_filter(self.chmod_refused),
            # (The umask it starts with keeps those bits too: one inherited as 000 made files 0666, review s31.)
            "umask_kept": self.chmod_refused,
        }

    def close(self) -> None:
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = -1

    def __del__(self) -> None:
        self.close()
