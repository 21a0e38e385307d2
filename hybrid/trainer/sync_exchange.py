"""What the two sides of a decoupled weight sync hand each other across the driver's threads.

The trainer side (`TransportPublisher`, on the main thread) and the explorer side
(`SyncFollower`, on the source's thread: split's explorer loop, fully-async's Rollouter) share
exactly this, and nothing else of their own:
- the probes: per weight version, a few trained rows with the trainer's log-probs under it,
  put by the trainer after its update and popped by the explorer before it leaves that version
  (the explorer's engine scores them: the sync check of every version);
- the sync figures since the last step's metrics (`SyncFigures`), added to by both sides and
  drained by the trainer;
- the digests of the weights each loaded version left in the engines (sync.verify_checksum).

One lock guards all of it: every method takes it once, and drains swap the figures out whole,
so no addition is lost between a read and a reset and no dict is iterated while another thread
changes it. Pure: no Ray, no tensors beyond the probe Batches it holds.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from hybrid.data import Batch


@dataclass
class SyncFigures:
    """Seconds and counts of both sides' syncs since the last drain (step metrics)."""

    publish_s: float = 0.0
    load_s: float = 0.0
    explorer_wait_s: float = 0.0
    syncs: int = 0
    probe_diffs: list[float] = field(default_factory=list)

    def metrics(self) -> dict[str, float]:
        return {
            "timing_s/publish": self.publish_s,
            "timing_s/explorer_load": self.load_s,
            "timing_s/explorer_wait": self.explorer_wait_s,
            "sync/explorer_syncs": float(self.syncs),
            "sync/probes": float(len(self.probe_diffs)),
            "sync/probe_logprob_diff_max": max(self.probe_diffs, default=0.0),
        }


class SyncExchange:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._probes: dict[int, Batch] = {}
        self._figures = SyncFigures()
        self._digests: dict[int, str] = {}

    # --- the trainer's side ---------------------------------------------------------------

    def put_probe(self, version: int, rows: Batch | None, oldest_kept: int) -> None:
        """Keep `rows` (None: none this time) as the probe of `version`, and forget the probes
        of versions before `oldest_kept` (the explorer skipped them)."""
        with self._lock:
            if rows is not None:
                self._probes[version] = rows
            for stale in [v for v in self._probes if v < oldest_kept]:
                del self._probes[stale]

    def add_publish(self, seconds: float) -> None:
        with self._lock:
            self._figures.publish_s += seconds

    def drain(self) -> SyncFigures:
        """The figures since the last drain; the next ones start from zero."""
        with self._lock:
            figures, self._figures = self._figures, SyncFigures()
            return figures

    def digests(self) -> dict[int, str]:
        """Per loaded version, its digest (a copy)."""
        with self._lock:
            return dict(self._digests)

    # --- the explorer's side --------------------------------------------------------------

    def pop_probe(self, version: int) -> Batch | None:
        with self._lock:
            return self._probes.pop(version, None)

    def add_probe_diff(self, diff: float) -> None:
        with self._lock:
            self._figures.probe_diffs.append(diff)

    def add_load(self, version: int, seconds: float, digest: str | None = None) -> None:
        """The engines loaded `version` in `seconds` (and hold weights of `digest`)."""
        with self._lock:
            self._figures.load_s += seconds
            self._figures.syncs += 1
            if digest is not None:
                self._digests[version] = digest

    def add_explorer_wait(self, seconds: float) -> None:
        with self._lock:
            self._figures.explorer_wait_s += seconds
