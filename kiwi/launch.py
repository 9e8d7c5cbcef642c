"""The launcher: the first program of every process Kiwi starts on Linux, which readies it and becomes it.

Kiwi's worker is threaded (the Temporal SDK's threads call into Python): code run between ``fork`` and
``exec`` in such a process (a ``preexec_fn``) can wait forever on a lock another thread held when the
process forked (CPython 3.11's runtime lock, gh-112275; seen in Kiwi's CI: a child stuck before its
program, the worker's event loop stuck waiting for it). So no Python runs there: the worker starts this
script without a ``preexec_fn``, and the script, a fresh single-threaded process, makes the calls before
executing the program:

1. the parent-death signal (SIGKILL when the worker's thread that started it ends: a worker killed with
   ``kill -9`` takes the process with it), and a check that the worker still runs;
2. for a confined shell command (``kiwi/landlock.py``): a root worker's capabilities dropped, no new
   privileges, the seccomp filter, the Landlock ruleset the worker made;
3. SIGPIPE and SIGXFSZ back to their defaults (Python ignores both), then ``execve`` of the program, with
   the environment and arguments the worker gave.

Run as ``python -I -S -c CODE SPEC_FD STATUS_FD`` by :class:`kiwi.lifetime.Launch`: ``CODE`` is this file's
text, read once when the worker starts, and ``python`` the base interpreter of the worker's, not a virtual
environment's (whose ``pyvenv.cfg`` names the standard library to load): a project that holds Kiwi's own
files or virtual environment cannot change what the next command's launcher runs before it is confined.
The specification is a ``marshal``-ed dict in a memory file the worker wrote (``SPEC_FD``); a failure is
written to the status pipe (``STATUS_FD``) as ``stage, errno`` and the launcher exits; the pipe closes on a
successful ``execve``, which is how the worker knows the program runs. No import of Kiwi's and no site
packages: it starts in a few milliseconds and reads nothing of the folder it runs in.
"""

import _signal
import ctypes
import marshal
import os
import struct
import sys

_PR_SET_PDEATHSIG, _PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 1, 38, 22, 2
_PR_CAPBSET_DROP, _PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 24, 47, 4
_CAPABILITY_VERSION_3 = 0x20080522
_RESTRICT_SELF = 446
_SIGKILL = 9


class _Failed(Exception):
    def __init__(self, stage: str, errno: int) -> None:
        super().__init__(stage, errno)
        self.stage, self.errno = stage, errno


def _ulongs(*values: int) -> list[ctypes.c_ulong]:
    return [ctypes.c_ulong(v) for v in values]


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


def main() -> None:
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
            _confine(libc, spec)
        # Python ignores SIGPIPE and SIGXFSZ; an ignored signal stays ignored across execve. A program
        # expects them as the system leaves them (`yes | head -1`, a loop of `echo` into a closed pipe).
        _signal.signal(_signal.SIGPIPE, _signal.SIG_DFL)
        _signal.signal(_signal.SIGXFSZ, _signal.SIG_DFL)
        stage = "exec"
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
