"""The first program of a sandboxed process: move into new namespaces, apply the limits, then
exec the user's program in a fresh interpreter.

Run by hybrid/sandbox/runner.py as
    python -I -S bootstrap.py STATUS_FD NETWORK MEMORY_BYTES CPU_S FILE_BYTES PARENT_PID PROGRAM
Standard library only: under -I -S it cannot import `hybrid` (nor anything from site-packages).

Why a script and not a `preexec_fn`: code between fork and exec in a multi-threaded parent (the
driver holds Ray's threads) can deadlock on a lock some other thread held at the fork. A new
interpreter is single-threaded, which `unshare(CLONE_NEWUSER)` also requires.

Where the kernel grants a PID namespace (network="deny" asks for user, network and PID
namespaces; "allow" for user and PID ones, and goes on without them if refused) the tree is

    bootstrap (the runner's child) -> init (pid 1 of the namespace) -> program (pid 2)

When a namespace's init exits, the kernel kills everything left in it, whatever session or
process group it made for itself: the program cannot leave a process behind. The program is not
the init because an init ignores the signals it has no handler for, and a program that signals
itself must die of it. Each level ends as the level below did: same exit code, or death by the
same signal. Without a PID namespace the bootstrap execs the program itself.

A failed step is written to STATUS_FD as "step<TAB>message" before exiting; a successful exec
closes STATUS_FD (made non-inheritable first), so the runner reads either an error or nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import signal
import sys

# Every sandbox run starts this script, and `typing` alone takes milliseconds to import.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import NoReturn

CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
PR_SET_PDEATHSIG = 1
SETUP_FAILED = 125


def _libc_call(libc: ctypes.CDLL, name: str, *args: int) -> None:
    if getattr(libc, name)(*args) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))


def _enter_namespaces(libc: ctypes.CDLL, network: str) -> bool:
    """Unshare what `network` needs, plus a PID namespace where the kernel grants one. Returns
    whether the next child forked starts a PID namespace (as its pid 1)."""
    # A new user namespace lets an unprivileged process own the other new ones. A new network
    # namespace's only interface is a loopback that stays down: connect() fails with
    # ENETUNREACH, DNS too. unshare is all or nothing: a refused PID namespace changes none.
    network_flags = CLONE_NEWUSER | CLONE_NEWNET if network == "deny" else 0
    try:
        _libc_call(libc, "unshare", network_flags | CLONE_NEWUSER | CLONE_NEWPID)
    except OSError:
        if network_flags:
            _libc_call(libc, "unshare", network_flags)  # its error is the one to report
        return False
    return True


def _die_with_parent(libc: ctypes.CDLL, parent_alive: Callable[[], bool]) -> None:
    # A level killed (the bootstrap, at the runner's deadline) must take the levels below it
    # along. Set after unshare: a change of credentials clears the parent-death signal.
    _libc_call(libc, "prctl", PR_SET_PDEATHSIG, signal.SIGKILL)
    if not parent_alive():  # the parent died before prctl took effect
        os._exit(SETUP_FAILED)


def _writer_open(read_fd: int) -> bool:
    """The other end of a pipe nobody writes to is still open (end of file: it closed)."""
    os.set_blocking(read_fd, False)
    try:
        return os.read(read_fd, 1) != b""
    except BlockingIOError:
        return True


def _set_limits(memory_bytes: int, cpu_s: int, file_bytes: int) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    # SIGXCPU at the soft limit; the hard limit one second on is SIGKILL for a program that
    # catches SIGXCPU.
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
    # No core files in the scratch directory; no runaway file filling the disk.
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_bytes, file_bytes))


def _end_as(wait_status: int) -> NoReturn:
    """End this process the way the one with `wait_status` ended: same code, or same signal."""
    if os.WIFSIGNALED(wait_status):
        number = os.WTERMSIG(wait_status)
        # Python ignores SIGPIPE and SIGXFSZ; SIGKILL and SIGSTOP cannot be changed.
        with contextlib.suppress(OSError, ValueError):
            signal.signal(number, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [number])
        os.kill(os.getpid(), number)
        os._exit(128 + number)  # a signal whose default is not to end a process
    os._exit(os.waitstatus_to_exitcode(wait_status))


def _run_init(libc: ctypes.CDLL, start_program: Callable[[], NoReturn]) -> NoReturn:
    """In the bootstrap: fork the namespace's init, which forks the program, then end as the
    program did."""
    bootstrap_alive, bootstrap_alive_writer = os.pipe()
    program_status, program_status_writer = os.pipe()
    init = os.fork()
    if init == 0:
        os.close(bootstrap_alive_writer)
        os.close(program_status)
        # getppid() is 0 for an init (its parent is outside the namespace): ask the pipe.
        _die_with_parent(libc, lambda: _writer_open(bootstrap_alive))
        # Signals from inside the namespace reach its init only where it has a handler, and
        # Python has one for SIGINT: the program must not end its init.
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        program = os.fork()
        if program == 0:
            _die_with_parent(libc, lambda: os.getppid() == 1)
            start_program()
        while True:  # as init, reap the orphans that the namespace hands it too
            reaped, status = os.wait()
            if reaped == program:
                break
        os.write(program_status_writer, str(status).encode())
        os._exit(0)
    os.close(bootstrap_alive)
    os.close(program_status_writer)
    _, init_status = os.waitpid(init, 0)
    with os.fdopen(program_status, "rb") as reported:
        relayed = reported.read()
    # Nothing relayed: the init itself failed (its setup error is on STATUS_FD) or was killed.
    _end_as(int(relayed) if relayed else init_status)


def main(argv: list[str]) -> None:
    status_fd = int(argv[1])
    network, program = argv[2], argv[7]
    memory_bytes, cpu_s, file_bytes, parent_pid = (int(value) for value in argv[3:7])

    def start_program() -> NoReturn:
        _set_limits(memory_bytes, cpu_s, file_bytes)
        os.set_inheritable(status_fd, False)
        os.execv(sys.executable, [sys.executable, "-I", "-S", program])

    step = "setup"
    try:
        # The levels above the program relay its signals by raising them on themselves: none
        # may leave a core file either.
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        libc = ctypes.CDLL(None, use_errno=True)
        step = "network"
        in_pid_namespace = _enter_namespaces(libc, network)
        step = "setup"
        _die_with_parent(libc, lambda: os.getppid() == parent_pid)
        if in_pid_namespace:
            _run_init(libc, start_program)
        start_program()
    except Exception as error:
        os.write(status_fd, f"{step}\t{type(error).__name__}: {error}".encode())
        os._exit(SETUP_FAILED)


if __name__ == "__main__":
    main(sys.argv)
