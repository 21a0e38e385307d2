"""What one sandbox run gave, and the error for a sandbox that cannot run here.

Pure data, no processes (hybrid/sandbox/runner.py fills it in).
"""

from __future__ import annotations

import dataclasses


class SandboxUnavailable(RuntimeError):
    """The sandbox could not set itself up on this machine (for example the kernel refuses the
    namespaces that `network="deny"` needs). The program never ran."""


@dataclasses.dataclass(frozen=True)
class SandboxResult:
    """How a sandboxed program ended and what it wrote."""

    exit_code: int | None
    """The program's exit status; None when a signal ended it (see `killed_by_signal`)."""
    stdout: str
    """What it wrote to stdout (UTF-8, undecodable bytes replaced), up to the output limit."""
    stderr: str
    """What it wrote to stderr, likewise; a Python traceback lands here."""
    timed_out: bool
    """It still ran at the wall-time limit and was killed (then `killed_by_signal` is SIGKILL)."""
    truncated: bool
    """It wrote more than the output limit; the rest was dropped."""
    duration_s: float
    """Wall time from start to exit or kill."""
    killed_by_signal: int | None = None
    """The signal that ended it: SIGKILL at the wall-time limit, SIGXCPU past the CPU limit,
    or whatever the program raised on itself."""

    @property
    def ok(self) -> bool:
        """It ran to the end and exited 0."""
        return self.exit_code == 0 and not self.timed_out
