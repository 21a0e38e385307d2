"""Run a Python source string in a fresh, limited subprocess and collect what it wrote.

Each run gets its own scratch directory (its cwd, HOME and TMPDIR), removed afterwards even
after a kill. The program runs in a PID namespace of its own where the kernel grants one
(hybrid/sandbox/bootstrap.py): when the run ends, at the wall-time limit or as soon as the
program exits, everything it started dies with the namespace, even a process that made a
session of its own (setsid). The child is also a new session whose process group is SIGKILLed
then; without a PID namespace that is all, and a setsid'd grandchild escapes it. CPU time,
address space, core files and file size are rlimits the program gets; with network="deny" it
also runs in new user and network namespaces. The interpreter runs with -I -S: no user site, no
site-packages, no PYTHON* variables, so the program sees the standard library only.

This guards a training run against mistakes (an infinite loop, a memory hog, an output flood,
a test that calls out to the network), not against a determined attacker: the program still
runs as the caller's user on the caller's filesystem.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hybrid.sandbox.limits import SandboxLimits
from hybrid.sandbox.result import SandboxResult, SandboxUnavailable

BOOTSTRAP = Path(__file__).with_name("bootstrap.py")
FILE_BYTES = 64 << 20
"""Largest file the program may write (RLIMIT_FSIZE): a runaway writer gets EFBIG, not a full
disk."""
_READ_CHUNK = 1 << 16


def run(
    source: str, limits: SandboxLimits | None = None, stdin: str | None = None
) -> SandboxResult:
    """Run `source` as the main program of a new interpreter under `limits` (defaults:
    SandboxLimits()), with `stdin` as its standard input (None: empty).

    Raises SandboxUnavailable when the sandbox cannot be set up here; the program did not run.
    """
    limits = SandboxLimits() if limits is None else limits
    scratch = Path(tempfile.mkdtemp(prefix="hybrid-sandbox-"))
    try:
        program = scratch / "main.py"
        # A lone surrogate (a model's undecodable bytes) must not fail the caller's encoding.
        program.write_bytes(source.encode("utf-8", errors="replace"))
        return _run_program(program, limits, stdin or "")
    finally:
        _remove_tree(scratch)


def network_isolation_error() -> str | None:
    """Why network="deny" cannot work on this machine, or None when it can (runs a probe)."""
    try:
        run("pass", SandboxLimits(time_s=30.0))
    except SandboxUnavailable as error:
        return str(error)
    return None


def _run_program(program: Path, limits: SandboxLimits, stdin: str) -> SandboxResult:
    status_read, status_write = os.pipe()
    try:
        with tempfile.TemporaryFile() as stdin_file:
            # A file, not a pipe: a program that never reads its input cannot block the writer.
            stdin_file.write(stdin.encode("utf-8", errors="replace"))
            stdin_file.seek(0)
            started = time.monotonic()
            process = subprocess.Popen(
                _command(program, limits, status_write),
                stdin=stdin_file,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=program.parent,
                env=_environment(program.parent),
                pass_fds=(status_write,),
                start_new_session=True,
            )
        os.close(status_write)
        status_write = -1
        try:
            stdout, stderr, truncated, ended = _collect(
                process, started + limits.time_s, limits.output_bytes
            )
        finally:
            _kill_group(process.pid)  # before reaping: the group id stays ours until then
            process.wait()
            assert process.stdout is not None and process.stderr is not None
            process.stdout.close()
            process.stderr.close()
        # The namespace's init holds STATUS_FD too: reading to its end also waits for the init
        # to exit, after which the kernel kills what is left in the namespace.
        setup_error = _read_all(status_read)
    finally:
        os.close(status_read)
        if status_write != -1:
            os.close(status_write)
    if setup_error:
        raise _unavailable(setup_error, limits)
    code = process.returncode
    return SandboxResult(
        exit_code=code if code >= 0 else None,
        stdout=stdout.decode("utf-8", errors="replace"),
        stderr=stderr.decode("utf-8", errors="replace"),
        timed_out=ended is None,
        truncated=truncated,
        duration_s=(time.monotonic() if ended is None else ended) - started,
        killed_by_signal=-code if code < 0 else None,
    )


def _command(program: Path, limits: SandboxLimits, status_fd: int) -> list[str]:
    settings = (
        status_fd,
        limits.network,
        int(limits.memory_mb) << 20,
        limits.cpu_limit_s,
        FILE_BYTES,
        os.getpid(),
        program,
    )
    return [sys.executable, "-I", "-S", str(BOOTSTRAP), *(str(value) for value in settings)]


def _environment(scratch: Path) -> dict[str, str]:
    # Nothing of the caller's environment (tokens, proxies, CUDA settings) reaches the program.
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(scratch),
        "TMPDIR": str(scratch),
        "LANG": "C.UTF-8",
    }


def _collect(
    process: subprocess.Popen[bytes], deadline: float, budget: int
) -> tuple[bytes, bytes, bool, float | None]:
    """Read stdout and stderr until the program has exited and both pipes are closed, or the
    deadline passes. Returns (stdout, stderr, truncated, when it exited or None: it did not)."""
    assert process.stdout is not None and process.stderr is not None
    output = {process.stdout.fileno(): bytearray(), process.stderr.fileno(): bytearray()}
    truncated, ended = False, None
    # A pidfd turns readable when the program exits, without reaping it (the group id stays
    # valid for the kill below) and without a polling loop.
    pidfd = os.pidfd_open(process.pid)
    try:
        with selectors.DefaultSelector() as selector:
            for fd in (pidfd, *output):
                selector.register(fd, selectors.EVENT_READ)
            while selector.get_map():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                for key, _ in selector.select(remaining):
                    if key.fd == pidfd:
                        ended = time.monotonic()
                        selector.unregister(pidfd)
                        # Children it left behind would hold the pipes open until the deadline.
                        _kill_group(process.pid)
                        continue
                    data = os.read(key.fd, _READ_CHUNK)
                    if not data:
                        selector.unregister(key.fd)
                        continue
                    kept = data[:budget]
                    budget -= len(kept)
                    output[key.fd] += kept
                    truncated = truncated or len(kept) < len(data)
    finally:
        os.close(pidfd)
    return (
        bytes(output[process.stdout.fileno()]),
        bytes(output[process.stderr.fileno()]),
        truncated,
        ended,
    )


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):  # the group is already gone
        os.killpg(pgid, signal.SIGKILL)


def _read_all(fd: int) -> str:
    chunks = []
    while chunk := os.read(fd, _READ_CHUNK):
        chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", errors="replace")


def _unavailable(setup_error: str, limits: SandboxLimits) -> SandboxUnavailable:
    step, _, message = setup_error.partition("\t")
    if step == "network":
        return SandboxUnavailable(
            f"sandbox.network='deny' needs new user and network namespaces, and this machine "
            f"refuses them: unshare(CLONE_NEWUSER | CLONE_NEWNET) failed with {message}. "
            "Containers often forbid it (seccomp or AppArmor profiles, "
            "user.max_user_namespaces=0). To run programs with the host's network instead, "
            "opt in with sandbox network='allow' (SandboxLimits(network='allow'); for the "
            "code reward, extra_info['sandbox'] = {'network': 'allow'})."
        )
    return SandboxUnavailable(f"the sandbox could not set up the program's process: {message}")


def _remove_tree(path: Path) -> None:
    """Remove the scratch directory, even one the program made unreadable (chmod 000)."""

    def make_writable_and_retry(function: Callable[..., Any], name: str, _: Any) -> None:
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(name), stat.S_IRWXU)
            os.chmod(name, stat.S_IRWXU)
            function(name)

    shutil.rmtree(path, onerror=make_writable_and_retry)
