"""Peak resident memory of a block of code, sampled in a thread (benchmarks).

The ledger's boundaries see memory between phases; a transient inside one (the logits of a
log-prob pass, a sync's gather buffers) needs sampling while it runs.
"""

from __future__ import annotations

import threading
import time

import psutil


class PeakRss:
    """Samples this process's RSS every `interval_s` inside the block; `peak - start` is the
    extra memory the block needed."""

    def __init__(self, interval_s: float = 0.002) -> None:
        self.interval_s = interval_s
        self.process = psutil.Process()

    def __enter__(self) -> PeakRss:
        self.start = self.peak = self.process.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.process.memory_info().rss)
            time.sleep(self.interval_s)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.process.memory_info().rss)

    @property
    def extra_bytes(self) -> int:
        return self.peak - self.start
