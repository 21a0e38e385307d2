"""The first program of a sandboxed process: apply the limits to itself, then exec the user's
program in a fresh interpreter.

Run by hybrid/sandbox/runner.py as
    python -I -S bootstrap.py STATUS_FD NETWORK MEMORY_BYTES CPU_S FILE_BYTES PARENT_PID PROGRAM
Standard library only: under -I -S it cannot import `hybrid` (nor anything from site-packages).

Why a script and not a `preexec_fn`: code between fork and exec in a multi-threaded parent (the
driver holds Ray's threads) can deadlock on a lock some other thread held at the fork. A new
interpreter is single-threaded, which `unshare(CLONE_NEWUSER)` also requires.

A failed step is written to STATUS_FD as "step<TAB>message" before exiting; a successful exec
closes STATUS_FD (made non-inheritable first), so the runner reads either an error or nothing.
"""

import ctypes
import os
import resource
import signal
import sys

CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
PR_SET_PDEATHSIG = 1
SETUP_FAILED = 125


def _libc_call(libc: ctypes.CDLL, name: str, *args: int) -> None:
    if getattr(libc, name)(*args) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))


def _isolate_network(libc: ctypes.CDLL) -> None:
    # A new user namespace lets an unprivileged process own the new network namespace, whose
    # only interface is a loopback that stays down: connect() fails with ENETUNREACH, DNS too.
    _libc_call(libc, "unshare", CLONE_NEWUSER | CLONE_NEWNET)


def _die_with_parent(libc: ctypes.CDLL, parent_pid: int) -> None:
    # A reward process killed at its deadline must not leave the program running. Set after
    # unshare: a change of credentials clears the parent-death signal.
    _libc_call(libc, "prctl", PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(SETUP_FAILED)


def _set_limits(memory_bytes: int, cpu_s: int, file_bytes: int) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    # SIGXCPU at the soft limit; the hard limit one second on is SIGKILL for a program that
    # catches SIGXCPU.
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
    # No core files in the scratch directory; no runaway file filling the disk.
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_bytes, file_bytes))


def main(argv: list[str]) -> None:
    status_fd = int(argv[1])
    network, program = argv[2], argv[7]
    memory_bytes, cpu_s, file_bytes, parent_pid = (int(value) for value in argv[3:7])
    step = "setup"
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if network == "deny":
            step = "network"
            _isolate_network(libc)
        step = "setup"
        _die_with_parent(libc, parent_pid)
        _set_limits(memory_bytes, cpu_s, file_bytes)
        os.set_inheritable(status_fd, False)
        os.execv(sys.executable, [sys.executable, "-I", "-S", program])
    except Exception as error:
        os.write(status_fd, f"{step}\t{type(error).__name__}: {error}".encode())
        os._exit(SETUP_FAILED)


if __name__ == "__main__":
    main(sys.argv)
