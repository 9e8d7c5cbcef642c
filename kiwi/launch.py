"""The launcher: the first program of every process Kiwi starts on Linux, which readies it and becomes it.

Kiwi's worker is threaded (the Temporal SDK's threads call into Python): code run between ``fork`` and
``exec`` in such a process (a ``preexec_fn``) can wait forever on a lock another thread held when the
process forked (CPython 3.11's runtime lock, gh-112275; seen in Kiwi's CI: a child stuck before its
program, the worker's event loop stuck waiting for it). So no Python runs there: the worker starts this
script without a ``preexec_fn``, and the script, a fresh single-threaded process, makes the calls before
executing the program:

1. the parent-death signal (SIGKILL when the worker's thread that started it ends: a worker killed with
   ``kill -9`` takes the process with it), and a check that the worker still runs;
2. for a confined shell command (``kiwi/landlock.py``): namespaces of its own (``_isolate``: a mount
   namespace holding the protected places read-only, a PID namespace the kernel empties when the program
   ends), where the launcher stays outside as the supervisor (``_supervise``) of a small init (``_init``),
   the namespace's first process, whose child the program is; and, for init and program, a root worker's
   capabilities dropped, no new privileges, the seccomp filter, the Landlock ruleset the worker made;
3. SIGPIPE and SIGXFSZ back to their defaults (Python ignores both), then ``execve`` of the program, with
   the environment and arguments the worker gave.

Run as ``python -I -S -c CODE SPEC_FD STATUS_FD`` by :class:`kiwi.lifetime.Launch`: ``CODE`` is this file's
text, read once when the worker starts, and ``python`` the base interpreter of the worker's, not a virtual
environment's (whose ``pyvenv.cfg`` names the standard library to load): a project that holds Kiwi's own
files or virtual environment cannot change what the next command's launcher runs before it is confined.
The specification is a ``marshal``-ed dict in a memory file the worker wrote (``SPEC_FD``); a failure is
written to the status pipe (``STATUS_FD``) as ``stage, errno`` and the launcher exits. Just before ``execve``
it writes ``ready``; the pipe then closes on a successful ``execve``, which is how the worker knows the
program runs (nothing at all: the launcher ended before, killed). No import of Kiwi's and no site
packages: it starts in a few milliseconds and reads nothing of the folder it runs in.
"""

import _signal
import ctypes
import marshal
import os
import struct
import sys

_PR_SET_PDEATHSIG, _PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 1, 38, 22, 2
_PR_SET_DUMPABLE = 4
_PR_CAPBSET_DROP, _PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 24, 47, 4
_CAPABILITY_VERSION_3 = 0x20080522
_RESTRICT_SELF = 446
# Mount namespaces (linux/sched.h, linux/mount.h, linux/openat2.h); the calls' numbers are the same on every
# architecture that has them.
_CLONE_NEWNS, _CLONE_NEWUSER, _CLONE_NEWPID = 0x00020000, 0x10000000, 0x20000000
_MS_REC, _MS_PRIVATE = 0x4000, 1 << 18
_OPENAT2, _OPEN_TREE, _MOVE_MOUNT, _MOUNT_SETATTR = 437, 428, 429, 442
_RESOLVE_NO_SYMLINKS, _RESOLVE_BENEATH = 0x04, 0x08
_OPEN_TREE_CLONE, _OPEN_TREE_CLOEXEC, _AT_EMPTY_PATH, _AT_RECURSIVE = 1, 0o2000000, 0x1000, 0x8000
_MOVE_MOUNT_F_EMPTY_PATH, _MOVE_MOUNT_T_EMPTY_PATH = 0x4, 0x40
_MOUNT_ATTR_RDONLY = 0x1
_SIGKILL, _SIGSTOP = _signal.SIGKILL, _signal.SIGSTOP
_READY = b"ready\0"


class _Failed(Exception):
    def __init__(self, stage: str, errno: int) -> None:
        super().__init__(stage, errno)
        self.stage, self.errno = stage, errno


def _ulongs(*values: int) -> list[ctypes.c_ulong]:
    return [ctypes.c_ulong(v) for v in values]


class _NoNamespace(Exception):
    """The kernel gives this process no namespace of its own (a container's or distribution's policy)."""


def _isolate(libc: ctypes.CDLL, spec: dict) -> None:
    """A confined command's namespaces: a mount namespace, where the protected places a write rule reaches
    are held read-only (``_hold``), and a PID namespace, whose every process the kernel kills when its first
    one (the program) ends or is killed: nothing the command starts outlives it, however fast it forks (a
    scan of its session could be outrun, review s27). A user namespace first for a worker that is not root
    (its own user, mapped to itself). Raises _NoNamespace where the kernel refuses them."""
    uid, gid = os.getuid(), os.getgid()
    flags = _CLONE_NEWNS | _CLONE_NEWPID | (_CLONE_NEWUSER if uid != 0 else 0)
    if libc.unshare(ctypes.c_int(flags)) != 0:
        raise _NoNamespace(ctypes.get_errno())
    if uid != 0:
        for name, line in (
            ("setgroups", "deny"),
            ("uid_map", f"{uid} {uid} 1"),
            ("gid_map", f"{gid} {gid} 1"),
        ):
            fd = os.open(f"/proc/self/{name}", os.O_WRONLY)
            try:
                os.write(fd, line.encode())
            finally:
                os.close(fd)
    # (Nothing mounted here reaches the worker's namespace.)
    if libc.mount(None, b"/", None, ctypes.c_ulong(_MS_REC | _MS_PRIVATE), None) != 0:
        raise _Failed("a mount namespace for the protected places", ctypes.get_errno())
    if spec["held"]:
        _hold(libc, spec)


def _hold(libc: ctypes.CDLL, spec: dict) -> None:
    """The protected places a write rule reaches (``spec["held"]``, relative to ``spec["held_root"]``), held
    read-only in the command's mount namespace: Landlock's rule holds for all below its folder, and cannot
    leave them out. Each place is opened from the project's folder without following a link, in the new
    namespace, and a read-only copy of it is mounted on it. A place that is there and cannot be held (a
    link put in its place) refuses the command, whatever KIWI_CONFINE says: holding the others and not it
    would leave it writable unseen (review s27)."""
    syscall = libc.syscall
    syscall.restype = ctypes.c_long
    root = os.open(spec["held_root"], os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    how = ctypes.create_string_buffer(
        struct.pack("=QQQ", os.O_PATH | os.O_CLOEXEC, 0, _RESOLVE_BENEATH | _RESOLVE_NO_SYMLINKS), 24
    )
    attr = ctypes.create_string_buffer(struct.pack("=QQQQ", _MOUNT_ATTR_RDONLY, 0, 0, 0), 32)
    for rel in spec["held"]:
        stage = f"holding {os.fsdecode(rel)} read-only"
        place = syscall(ctypes.c_long(_OPENAT2), ctypes.c_int(root), rel, how, ctypes.c_size_t(24))
        if place < 0:
            if ctypes.get_errno() == 2:  # (gone since the worker looked: nothing to hold)
                continue
            raise _Failed(stage, ctypes.get_errno())
        tree = syscall(
            ctypes.c_long(_OPEN_TREE), ctypes.c_int(place), b"",
            ctypes.c_uint(_OPEN_TREE_CLONE | _OPEN_TREE_CLOEXEC | _AT_EMPTY_PATH | _AT_RECURSIVE),
        )  # fmt: skip
        if tree < 0:
            raise _Failed(stage, ctypes.get_errno())
        if syscall(
            ctypes.c_long(_MOUNT_SETATTR), ctypes.c_int(tree), b"",
            ctypes.c_uint(_AT_EMPTY_PATH | _AT_RECURSIVE), attr, ctypes.c_size_t(32),
        ) != 0 or syscall(
            ctypes.c_long(_MOVE_MOUNT), ctypes.c_int(tree), b"", ctypes.c_int(place), b"",
            ctypes.c_uint(_MOVE_MOUNT_F_EMPTY_PATH | _MOVE_MOUNT_T_EMPTY_PATH),
        ) != 0:  # fmt: skip
            raise _Failed(stage, ctypes.get_errno())
        os.close(tree)
        os.close(place)
    os.close(root)


def _confine(libc: ctypes.CDLL, spec: dict) -> None:
    prctl, syscall = libc.prctl, libc.syscall
    syscall.restype = ctypes.c_long
    if spec["root"]:
        for cap in range(spec["cap_last"] + 1):
            prctl(ctypes.c_int(_PR_CAPBSET_DROP), *_ulongs(cap, 0, 0, 0))  # (past the kernel's last: nothing)
        prctl(ctypes.c_int(_PR_CAP_AMBIENT), *_ulongs(_PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0))
        header = ctypes.create_string_buffer(struct.pack("=Ii", _CAPABILITY_VERSION_3, 0), 8)
        data = ctypes.create_string_buffer(bytes(24), 24)
        if spec["capset"] is None:  # (an architecture whose capset number Kiwi does not know)
            raise _Failed("dropping capabilities", 38)  # ENOSYS
        if syscall(ctypes.c_long(spec["capset"]), header, data) != 0:
            raise _Failed("dropping capabilities", ctypes.get_errno())
    if prctl(ctypes.c_int(_PR_SET_NO_NEW_PRIVS), *_ulongs(1, 0, 0, 0)) != 0:
        raise _Failed("no_new_privs", ctypes.get_errno())
    if spec.get("umask_kept"):
        os.umask(os.umask(0) | spec["umask_kept"])
    program = spec["seccomp"]
    if program is not None:
        code = ctypes.create_string_buffer(program, len(program))
        fprog = ctypes.create_string_buffer(
            struct.pack("=H6xQ", len(program) // 8, ctypes.addressof(code)), 16
        )
        if prctl(ctypes.c_int(_PR_SET_SECCOMP), ctypes.c_ulong(_SECCOMP_MODE_FILTER), fprog, *_ulongs(0, 0)):
            raise _Failed("seccomp filter", ctypes.get_errno())
    if syscall(ctypes.c_long(_RESTRICT_SELF), ctypes.c_int(spec["ruleset"]), ctypes.c_uint32(0)) != 0:
        raise _Failed("Landlock restriction", ctypes.get_errno())
    os.close(spec["ruleset"])


def _supervise(child: int, report: int, status: int, spec: dict) -> None:
    """The launcher outside the command's PID namespace: it waits for the namespace's first process
    (``_init``), and ends as the program ended (``report``: its wait status, as _init saw it), so the worker
    sees the program's exit code or signal. Killed (the call's timeout or cancellation kills the command's
    process group, which holds them all; the worker's death, by the parent-death signal), it takes the
    namespace with it."""
    _deaf()  # (a program on an older Landlock, without signal scoping, can signal its process group)
    _signal.pthread_sigmask(_signal.SIG_SETMASK, [])  # (what was held back is ignored now)
    os.close(status)  # (the program's copy says ready, and closes at its execve)
    if spec["ruleset"] >= 0:
        os.close(spec["ruleset"])
    quiet = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):  # (the command's output ends with the program's namespace, not with this)
        os.dup2(quiet, fd)
    while True:
        try:
            _, how = os.waitpid(child, 0)
            break
        except InterruptedError:
            continue
    said = os.read(report, 4)
    if len(said) == 4 and os.WIFEXITED(how) and os.WEXITSTATUS(how) == 0:  # (init said it, and ended well)
        reported = int.from_bytes(said, "little")
        if os.WIFEXITED(reported) or (os.WIFSIGNALED(reported) and 0 < os.WTERMSIG(reported) < _signal.NSIG):
            how = reported
        else:
            how = 127 << 8  # (no end a program has: not the init's 0, which would read as the program's)
    try:
        if os.WIFSIGNALED(how):
            sig = os.WTERMSIG(how)
            import resource

            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # (no core of this process in the project)
            if sig not in (_SIGKILL, _SIGSTOP):
                _signal.signal(sig, _signal.SIG_DFL)
            os.kill(os.getpid(), sig)
            os._exit(128 + sig)
        os._exit(os.WEXITSTATUS(how) if os.WIFEXITED(how) else 127)
    except BaseException:  # noqa: BLE001 - never back into main's handlers: their status pipe is closed
        os._exit(128 + os.WTERMSIG(how) if os.WIFSIGNALED(how) else 127)


def _init(libc: ctypes.CDLL, program: int, report: int, status: int) -> None:
    """The first process of the command's PID namespace: it reaps what ends in it and, when the program (its
    child) ends, tells the supervisor how and exits, and the kernel ends the rest of the namespace. The
    program is not the namespace's first process, which the kernel shields from the signals it sends itself
    (`kill $$` did nothing, abort() ended as a segfault: review s27). Not dumpable, so no process of the
    command can trace it or take its report pipe (a forged exit status), and deaf to every signal the
    command can send it (a SIGINT to the group ended it as a KeyboardInterrupt)."""
    told = False
    try:
        libc.prctl(ctypes.c_int(_PR_SET_DUMPABLE), *_ulongs(0, 0, 0, 0))
        _deaf()
        _signal.pthread_sigmask(_signal.SIG_SETMASK, [])  # (what was held back is ignored now)
        os.close(status)
        quiet = os.open("/dev/null", os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(quiet, fd)
        while True:
            try:
                pid, how = os.waitpid(-1, 0)
            except InterruptedError:
                continue
            if pid == program and os.WIFSTOPPED(how):
                # (Stopped while traced by this process: it asked to be, PTRACE_TRACEME, and this process is
                # no debugger. Reported as it was, a stop read as an exit 0 (review s28); ended instead.)
                os.kill(program, _SIGKILL)
                continue
            if pid == program:
                told = os.write(report, how.to_bytes(4, "little")) == 4
                break
    finally:
        os._exit(0 if told else 127)  # (never back into main: its status pipe is closed here)


# The signals a process can catch (held back across the forks until each process is deaf: see main).
_CATCHABLE = sorted(_signal.valid_signals() - {_SIGKILL, _SIGSTOP, _signal.SIGCHLD})


def _deaf() -> None:
    """Every signal this process could catch ignored (SIGCHLD left as it is: waitpid needs it)."""
    for sig in range(1, _signal.NSIG):
        if sig not in (_SIGKILL, _SIGSTOP, _signal.SIGCHLD):
            try:
                _signal.signal(sig, _signal.SIG_IGN)
            except (OSError, ValueError):
                continue


def main() -> None:
    _signal.pthread_sigmask(_signal.SIG_SETMASK, [])  # (no signal blocked, whatever the worker's thread had)
    status = int(sys.argv[2])
    os.set_inheritable(status, False)  # (closed by a successful execve: the worker's sign)
    stage = "launcher"
    try:
        spec_fd = int(sys.argv[1])
        spec = marshal.loads(os.pread(spec_fd, os.fstat(spec_fd).st_size, 0))
        os.close(spec_fd)
        stage = "parent-death signal"
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(ctypes.c_int(_PR_SET_PDEATHSIG), *_ulongs(_SIGKILL, 0, 0, 0)) != 0:
            raise _Failed(stage, ctypes.get_errno())
        if os.getppid() != spec["parent"]:  # (the worker ended before the request took effect)
            os.kill(os.getpid(), _SIGKILL)
        if spec["ruleset"] >= 0:
            isolated = False
            try:
                stage = "namespaces for the command"
                _isolate(libc, spec)
                isolated = True
            except _NoNamespace as refused:
                if spec["held_required"]:
                    raise _Failed(
                        "namespaces for the command (KIWI_CONFINE=required)", refused.args[0]
                    ) from None
                # (No namespace here, as in a container that refuses them: the rest of the wall holds, and
                # `kiwi doctor` says the protected places are not held.)
            if isolated:
                # (This process is single-threaded: a fork is safe here.) Outside: the supervisor; inside,
                # the namespace's first process (_init), then the program, its child.
                report, reported = os.pipe()
                # (Every signal held back until the process that takes it is deaf: the program's `kill -INT 0`
                # reached the init before it was, and the command failed as the launcher's KeyboardInterrupt.)
                _signal.pthread_sigmask(_signal.SIG_BLOCK, _CATCHABLE)
                child = os.fork()
                if child:
                    os.close(reported)
                    _supervise(child, report, status, spec)
                os.close(report)
                stage = "parent-death signal"
                if libc.prctl(ctypes.c_int(_PR_SET_PDEATHSIG), *_ulongs(_SIGKILL, 0, 0, 0)) != 0:
                    raise _Failed(stage, ctypes.get_errno())
            _confine(libc, spec)
            if isolated:
                program = os.fork()
                if program:
                    _init(libc, program, reported, status)
                _signal.pthread_sigmask(_signal.SIG_SETMASK, [])  # (the program's own, nothing held back)
                if libc.prctl(ctypes.c_int(_PR_SET_PDEATHSIG), *_ulongs(_SIGKILL, 0, 0, 0)) != 0:
                    raise _Failed(stage, ctypes.get_errno())
                os.close(reported)
        # Python ignores SIGPIPE and SIGXFSZ; an ignored signal stays ignored across execve. A program
        # expects them as the system leaves them (`yes | head -1`, a loop of `echo` into a closed pipe).
        _signal.signal(_signal.SIGPIPE, _signal.SIG_DFL)
        _signal.signal(_signal.SIGXFSZ, _signal.SIG_DFL)
        stage = "exec"
        # (Then the pipe closes at execve; a launcher killed before this said nothing.)
        os.write(status, _READY)
        if spec["search"]:
            os.execvpe(spec["program"], spec["argv"], spec["env"])
        os.execve(spec["program"], spec["argv"], spec["env"])
    except _Failed as exc:
        os.write(status, f"{exc.stage}\0{exc.errno}".encode())
    except OSError as exc:
        os.write(status, f"{stage}\0{exc.errno or 0}".encode())
    except BaseException as exc:  # noqa: BLE001 - whatever it is, the program does not run
        os.write(status, f"launcher\0{0}\0{type(exc).__name__}: {exc}".encode())
    os._exit(127)


if __name__ == "__main__":
    main()
