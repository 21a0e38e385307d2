"""The per-step memory and time ledger: one entry per phase boundary.

Each boundary records wall time and memory: CUDA allocated / reserved / peak where a GPU is
in use, else the process RSS. The driver drains the ledger once per step and gets flat
metrics (`memory/<phase>/<what>_gib`, `timing_s/<phase>`); the memory report reads the
entries themselves.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Generic, TypeVar

import psutil
import torch

_GIB = float(1 << 30)
T = TypeVar("T")


@dataclass(frozen=True)
class LedgerEntry:
    phase: str
    """Boundary name, e.g. "rollout/after_sync"."""
    wall_s: float
    """time.monotonic() at the boundary."""
    rss_gib: float
    """Resident set size of this process."""
    cuda_allocated_gib: float | None
    cuda_reserved_gib: float | None
    cuda_peak_gib: float | None
    """Peak allocated since the previous boundary (the counter is reset at each one)."""


def measure(phase: str) -> LedgerEntry:
    rss = psutil.Process().memory_info().rss / _GIB
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return LedgerEntry(phase, time.monotonic(), rss, None, None, None)
    entry = LedgerEntry(
        phase,
        time.monotonic(),
        rss,
        torch.cuda.memory_allocated() / _GIB,
        torch.cuda.memory_reserved() / _GIB,
        torch.cuda.max_memory_allocated() / _GIB,
    )
    torch.cuda.reset_peak_memory_stats()
    return entry


class TimedIterator(Generic[T]):
    """Wraps an iterator and adds up the time spent producing its items, so a streamed
    pipeline can be split into producer time (e.g. the gather) and consumer time."""

    def __init__(self, inner: Iterable[T]) -> None:
        self._inner = iter(inner)
        self.produce_s = 0.0

    def __iter__(self) -> TimedIterator[T]:
        return self

    def __next__(self) -> T:
        start = time.perf_counter()
        try:
            return next(self._inner)
        finally:
            self.produce_s += time.perf_counter() - start


class MemoryLedger:
    def __init__(self) -> None:
        self.entries: list[LedgerEntry] = []
        self.timings: dict[str, float] = {}

    def record(self, phase: str) -> LedgerEntry:
        entry = measure(phase)
        self.entries.append(entry)
        return entry

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Record `<name>/start` and `<name>/end` and add the duration to `timing_s/<name>`."""
        start = self.record(f"{name}/start")
        try:
            yield
        finally:
            end = self.record(f"{name}/end")
            self.add_time(name, end.wall_s - start.wall_s)

    def add_time(self, name: str, seconds: float) -> None:
        self.timings[name] = self.timings.get(name, 0.0) + seconds

    def drain(self) -> dict[str, float]:
        """Flat metrics for this step, then start a new step."""
        metrics: dict[str, float] = {f"timing_s/{k}": v for k, v in self.timings.items()}
        for entry in self.entries:
            for key, value in asdict(entry).items():
                if key not in ("phase", "wall_s") and value is not None:
                    metrics[f"memory/{entry.phase}/{key}"] = value
        self.entries = []
        self.timings = {}
        return metrics
