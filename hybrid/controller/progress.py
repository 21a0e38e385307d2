"""What each worker was last seen doing: one small file per rank that the driver can read
while the worker is stuck (stopped, deadlocked in a collective, spinning in a kernel), when
asking the worker itself would block too.

The WorkerDict writes `<progress_dir>/rank_<r>.json` when a call starts and ends, and at every
memory-ledger boundary inside it (engine wake, each gathered chunk of a sync, generate, each
update phase: hybrid/memory/ledger.py names them), so the record says which call and which
boundary inside it came last, and when. Each write replaces the file whole (write, rename):
a reader never sees half a record.

The calls themselves only update the record in memory; a writer thread puts it on disk at
most every FLUSH_S seconds. A small step passes dozens of boundaries, and a synchronous write
of each cost about 0.2 ms of the step (4 ms a step on the demo); a record at most FLUSH_S
old is as good for telling where a worker stalls (the stall deadlines are seconds or more).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

FLUSH_S = 0.2
"""The writer thread writes a changed record at most this often (0: every change at once)."""


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
    """The worker side: one per WorkerDict process. `flush_s`: how stale the file may be
    (FLUSH_S; 0 writes every change before returning)."""

    def __init__(self, progress_dir: str | Path, rank: int, flush_s: float = FLUSH_S) -> None:
        self.path = progress_path(progress_dir, rank)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._tmp = self.path.with_name(self.path.name + ".tmp")
        self._record = Progress(rank, os.getpid(), "start", time.time(), "", time.time(), True)
        self._flush_s = flush_s
        self._changed = threading.Event()
        self._write()
        if flush_s > 0:
            threading.Thread(target=self._flush_changes, name="progress", daemon=True).start()

    def call_started(self, call: str) -> None:
        now = time.time()
        self._set(Progress(self._record.rank, self._record.pid, call, now, "", now, True))

    def boundary(self, name: str) -> None:
        r = self._record
        self._set(Progress(r.rank, r.pid, r.call, r.call_started, name, time.time(), True))

    def call_finished(self) -> None:
        r = self._record
        self._set(Progress(r.rank, r.pid, r.call, r.call_started, r.boundary, time.time(), False))

    def _set(self, record: Progress) -> None:
        self._record = record  # one reference swap: the writer thread reads whole records
        if self._flush_s > 0:
            self._changed.set()
        else:
            self._write()

    def _flush_changes(self) -> None:
        """Write the newest record after each change, then let changes gather for flush_s."""
        while True:
            self._changed.wait()
            self._changed.clear()
            # A vanished directory (the run is being torn down): try again on the next change.
            with contextlib.suppress(OSError):
                self._write()
            time.sleep(self._flush_s)

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
