"""What each worker was last seen doing: one small file per rank that the driver can read
while the worker is stuck (stopped, deadlocked in a collective, spinning in a kernel), when
asking the worker itself would block too.

The WorkerDict writes `<progress_dir>/rank_<r>.json` when a call starts and ends, and at every
memory-ledger boundary inside it (engine wake, each gathered chunk of a sync, generate, each
update phase: hybrid/memory/ledger.py names them), so the record says which call and which
boundary inside it came last, and when. Each write replaces the file whole (write, rename):
a reader never sees half a record.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class Progress:
    rank: int
    pid: int
    call: str
    """The member method running (or last run), `member.method`."""
    call_started: float
    """time.time() when it started."""
    boundary: str
    """The last ledger boundary passed inside it ("" before the first)."""
    boundary_at: float
    running: bool
    """False once the call returned."""

    def describe(self, now: float) -> str:
        """`in actor_rollout.generate_sequences for 31.2s, last boundary 'sync/wake_weights'
        30.9s ago` (or what it last finished)."""
        if not self.running:
            return f"idle: {self.call} finished {now - self.boundary_at:.1f}s ago"
        inside = (
            f", last boundary {self.boundary!r} {now - self.boundary_at:.1f}s ago"
            if self.boundary
            else ", no boundary passed yet"
        )
        return f"in {self.call} for {now - self.call_started:.1f}s{inside}"


def progress_path(progress_dir: str | Path, rank: int) -> Path:
    return Path(progress_dir) / f"rank_{rank}.json"


class ProgressWriter:
    """The worker side: one per WorkerDict process."""

    def __init__(self, progress_dir: str | Path, rank: int) -> None:
        self.path = progress_path(progress_dir, rank)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._tmp = self.path.with_name(self.path.name + ".tmp")
        self._record = Progress(rank, os.getpid(), "start", time.time(), "", time.time(), True)
        self._write()

    def call_started(self, call: str) -> None:
        now = time.time()
        self._record = Progress(self._record.rank, self._record.pid, call, now, "", now, True)
        self._write()

    def boundary(self, name: str) -> None:
        r = self._record
        self._record = Progress(r.rank, r.pid, r.call, r.call_started, name, time.time(), True)
        self._write()

    def call_finished(self) -> None:
        r = self._record
        self._record = Progress(
            r.rank, r.pid, r.call, r.call_started, r.boundary, time.time(), False
        )
        self._write()

    def _write(self) -> None:
        self._tmp.write_text(json.dumps(asdict(self._record)))
        os.replace(self._tmp, self.path)


def read_progress(progress_dir: str | Path | None, rank: int) -> Progress | None:
    """The rank's last record, or None (no directory, another node's disk, not written yet)."""
    if progress_dir is None:
        return None
    try:
        return Progress(**json.loads(progress_path(progress_dir, rank).read_text()))
    except (OSError, ValueError, TypeError):
        return None
