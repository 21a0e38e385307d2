"""Telling a stalled phase apart from a slow one, and saying what each rank was doing.

`Watch` is what a worker group lends its calls: the run's deadlines, where its workers write
their progress, and their pids. When a call passes its deadline, `stall_error` builds the
error from what can be read without asking the stuck workers: their progress files and, for
workers on the driver's machine, the process state the kernel reports (a SIGSTOPped worker
reads `stopped`; one spinning in a kernel, `running`; one blocked in a collective, `sleeping`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hybrid.controller.deadlines import Deadlines
from hybrid.controller.errors import StallError
from hybrid.controller.progress import read_progress

PROCESS_STATES = {
    "R": "running",
    "S": "waiting",
    "D": "in uninterruptible I/O",
    "T": "stopped (SIGSTOP or a debugger)",
    "t": "stopped by a tracer",
    "Z": "exited",
    "X": "exited",
}
"""/proc/<pid>/stat state letters, in words."""


def process_state(pid: int, proc: Path = Path("/proc")) -> str | None:
    """The state of process `pid` on this machine in words; None if there is no such process."""
    try:
        stat = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: the state follows the last ')'.
    letter = stat[stat.rfind(")") + 2 : stat.rfind(")") + 3]
    return PROCESS_STATES.get(letter, f"state {letter}")


STOPPED = PROCESS_STATES["T"]


@dataclass(eq=False)
class Watch:
    deadlines: Deadlines
    progress_dir: Path | None = None
    local_pids: dict[int, int] = field(default_factory=dict)
    """rank -> pid, for the ranks on the driver's machine (only those can be looked up)."""
    stalled: bool = False
    """Set once a call of the group stalled (or one of its workers was found stopped): its
    workers cannot be asked to shut down."""

    def __post_init__(self) -> None:
        self.deadlines.watches.append(self)

    @property
    def name(self) -> str:
        """The group's name in an error: its progress directory's (workers, explorer, trainer)."""
        return self.progress_dir.name if self.progress_dir is not None else "group"

    def rank_line(self, rank: int, now: float) -> str:
        pid = self.local_pids.get(rank)
        state = None if pid is None else process_state(pid)
        who = f"rank {rank}" + (f" (pid {pid}, {state})" if state else "")
        seen = read_progress(self.progress_dir, rank)
        return f"{who}: {seen.describe(now) if seen else 'no progress record'}"

    def stopped_ranks(self) -> list[int]:
        """The ranks on this machine whose process is stopped (SIGSTOP, a debugger)."""
        return [r for r, pid in self.local_pids.items() if process_state(pid) == STOPPED]

    def stall_error(
        self, phase: str, pending: Sequence[int], waited_s: float, deadline_rule: str
    ) -> StallError:
        """The error of a call of this group past its deadline. A worker stopped in another
        group of the run (the other side of a weight sync, say) is often the cause: it is
        named too, and its group marked stalled like this one."""
        self.stalled = True
        now = time.time()
        lines = [self.rank_line(rank, now) for rank in pending]
        for watch in self.deadlines.watches:
            stopped = [r for r in watch.stopped_ranks() if watch is not self or r not in pending]
            if stopped:
                watch.stalled = True
            for rank in stopped:
                lines.append(f"stopped: {watch.name} {watch.rank_line(rank, now)}")
        detail = "; ".join([f"deadline: {deadline_rule}", *lines])
        return StallError(phase, list(pending), waited_s, detail)
