"""Helpers for the sandbox tests that follow a program's processes from the outside."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HOST_PID = "int(os.readlink('/proc/self'))"
"""A Python expression, for a sandboxed program, of its pid as this test sees it: inside a PID
namespace os.getpid() counts from 1, but /proc (the host's mount) names the host's pid."""

_PID_NAMESPACE_PROBE = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
if libc.unshare(0x10000000 | 0x20000000) != 0:  # CLONE_NEWUSER | CLONE_NEWPID
    print(os.strerror(ctypes.get_errno()))
"""


def running(pid: int) -> bool:
    """The process exists and has not ended (a zombie waiting to be reaped counts as ended)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def pid_namespace_error() -> str | None:
    """Why this kernel refuses an unprivileged PID namespace, or None when it grants one; found
    by a probe of our own, not by the sandbox, so a sandbox that forgets to make one fails."""
    probe = subprocess.run(
        [sys.executable, "-I", "-S", "-c", _PID_NAMESPACE_PROBE],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return probe.stdout.strip() or None
