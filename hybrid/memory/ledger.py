"""The memory ledger: what the process holds at every phase boundary of a step.

A boundary (`record`) measures the device, CUDA allocated / reserved and the peak allocated
since the previous boundary, or on CPU the process RSS and its peak since the previous
boundary, then resets the peak counter, so that every interval gets its own peak. It also
asks the registered component sources what they hold (actor shards, gradients, optimizer
state, reference shards, rollout weights, KV cache), from the objects themselves, split into
what is on the device and what was offloaded to the host.

What no object holds is accounted once, when it appears: the process before any model is
`runtime`, and the first time a boundary is reached, whatever the measured memory grew by
beyond the objects' growth is added to `runtime` (code loaded on first use, kernel and
allocator caches), or to `engine_overhead` for vLLM's phases. From then on such growth is
left unattributed: the gap between measured and attributed memory is the drift to watch.

There is one ledger per process (`process_ledger()`): the members of a WorkerDict share the
process, its memory and therefore its ledger. The driver drains it once per step: flat
metrics (`pop_metrics`) and the records for `memory.jsonl` (`pop_records`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Generic, TypeVar

import psutil
import torch

from hybrid.memory.components import ByDevice
from hybrid.memory.records import GIB, STEADY_PHASES, MemoryRecord

T = TypeVar("T")
ComponentSource = Callable[[], dict[str, ByDevice]]
"""Returns {component name: bytes per device type} for what one member holds right now."""

# Boundaries whose first-time growth belongs to the engine rather than the process at large.
_ENGINE_WARMUP = frozenset({"init/rollout", "rollout/wake_kv", "rollout/generate"})
_CLEAR_REFS = Path("/proc/self/clear_refs")
_STATUS = Path("/proc/self/status")


@dataclass(frozen=True)
class DeviceMemory:
    device: str
    current_gib: float
    """CUDA allocated, or the process RSS on CPU."""
    peak_gib: float
    """Peak of the same measure since the previous reset."""
    rss_gib: float
    reserved_gib: float | None


def _cuda_in_use() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_initialized()


def _rss_and_peak_gib() -> tuple[float, float]:
    """(current RSS, the kernel's peak-RSS mark VmHWM) from one read of /proc/self/status;
    psutil's RSS (and no separate peak) where /proc has none."""
    try:
        fields = dict(
            line.split(":", 1) for line in _STATUS.read_text().splitlines() if ":" in line
        )
        rss = float(fields["VmRSS"].split()[0]) * 1024 / GIB
        return rss, max(float(fields["VmHWM"].split()[0]) * 1024 / GIB, rss)
    except (OSError, KeyError, ValueError):
        rss = _process().memory_info().rss / GIB
        return rss, rss


def _process() -> psutil.Process:
    """This process's handle, made once per pid (building one reads /proc each time)."""
    global _PROCESS
    if _PROCESS is None or _PROCESS.pid != os.getpid():
        _PROCESS = psutil.Process()
    return _PROCESS


_PROCESS: psutil.Process | None = None


def measure_and_reset() -> DeviceMemory:
    """Measure now, then start a new peak interval."""
    if _cuda_in_use():
        sample = DeviceMemory(
            "cuda",
            torch.cuda.memory_allocated() / GIB,
            torch.cuda.max_memory_allocated() / GIB,
            _process().memory_info().rss / GIB,
            torch.cuda.memory_reserved() / GIB,
        )
        torch.cuda.reset_peak_memory_stats()
        return sample
    rss, peak = _rss_and_peak_gib()
    sample = DeviceMemory("cpu", rss, peak, rss, None)
    reset_rss_peak()
    return sample


def reset_rss_peak() -> None:
    # Linux: writing 5 to clear_refs resets VmHWM to the current RSS (since 4.0).
    with suppress(OSError):
        _CLEAR_REFS.write_text("5")


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
    def __init__(self, rank: int = 0, node: str = "") -> None:
        self.rank = rank
        self.node = node
        self.records: list[MemoryRecord] = []
        self.timings: dict[str, float] = {}
        self.counts: dict[str, float] = {}
        self._sources: dict[str, ComponentSource] = {}
        self.listeners: list[Callable[[str], None]] = []
        """Called with each boundary's phase name (the worker's progress file: a stuck
        worker's last boundary is what a stall error quotes)."""
        self._metrics_from = 0  # first record not yet summarised by pop_metrics
        self._started = time.monotonic()
        baseline = measure_and_reset()
        # What the process holds before any model: interpreter and libraries on CPU (the
        # CUDA context is not in `allocated`, so ~0 there).
        self._warmup: dict[str, float] = {"runtime": baseline.current_gib, "engine_overhead": 0.0}
        self._seen: set[str] = set()
        self._gap_gib = 0.0  # measured minus attributed at the previous boundary

    # --- components ------------------------------------------------------------------------

    def track(self, name: str, source: ComponentSource) -> None:
        """Register a member's component source (replaces one of the same name)."""
        self._sources[name] = source

    def components(self, device: str) -> tuple[dict[str, float], dict[str, float]]:
        """(on the device, offloaded to the host), in GiB, from every source."""
        on_device = dict(self._warmup)
        on_host: dict[str, float] = {}
        for source in self._sources.values():
            for component, by_device in source().items():
                for where, nbytes in by_device.items():
                    target = on_device if where == device else on_host
                    target[component] = target.get(component, 0.0) + nbytes / GIB
        return on_device, on_host

    # --- boundaries ------------------------------------------------------------------------

    def record(
        self,
        phase: str,
        chunk: int | None = None,
        transient: dict[str, int] | None = None,
        reuse_components: bool = False,
    ) -> MemoryRecord:
        """Close the interval that ends here; `transient` adds bytes alive during it that no
        object holds any more (e.g. the gather buffers of a sync chunk). `reuse_components`
        copies the previous record's breakdown instead of asking every source again, for
        boundaries where nothing a source counts can have changed since the previous one: the
        per-chunk boundaries of a sync (only the gather buffers change), a forward pass, a
        move that moved nothing (CPU). Walking every tensor costs a fraction of a millisecond
        per boundary, and a small step has dozens of boundaries."""
        sample = measure_and_reset()
        if reuse_components and self.records:
            last = self.records[-1]
            on_device, on_host = dict(last.components_gib), dict(last.host_gib)
            on_device.pop("gather_buffers", None)
        else:
            on_device, on_host = self.components(sample.device)
        self._account_first_use(phase, sample.current_gib, on_device)
        for component, nbytes in (transient or {}).items():
            on_device[component] = on_device.get(component, 0.0) + nbytes / GIB
        entry = MemoryRecord(
            step=-1,  # stamped by pop_records
            rank=self.rank,
            node=self.node,
            phase=phase,
            t_s=round(time.monotonic() - self._started, 6),
            device=sample.device,
            current_gib=sample.current_gib,
            peak_gib=sample.peak_gib,
            rss_gib=sample.rss_gib,
            reserved_gib=sample.reserved_gib,
            chunk=chunk,
            components_gib={k: round(v, 9) for k, v in on_device.items() if v},
            host_gib={k: round(v, 9) for k, v in on_host.items() if v},
        )
        self.records.append(entry)
        for listener in self.listeners:
            listener(phase)
        return entry

    def _account_first_use(
        self, phase: str, current_gib: float, on_device: dict[str, float]
    ) -> None:
        """Attribute what the first pass through `phase` left behind beyond its objects."""
        gap = current_gib - sum(on_device.values())
        if phase not in self._seen:
            self._seen.add(phase)
            growth = gap - self._gap_gib
            if growth > 0:
                component = "engine_overhead" if phase in _ENGINE_WARMUP else "runtime"
                self._warmup[component] += growth
                on_device[component] += growth
                gap -= growth
        self._gap_gib = gap

    @contextmanager
    def timed(self, name: str) -> Iterator[None]:
        """Add the block's duration to `timing_s/<name>` (also when it raises)."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add_time(name, time.perf_counter() - start)

    def add_time(self, name: str, seconds: float) -> None:
        self.timings[name] = self.timings.get(name, 0.0) + seconds

    def add_count(self, name: str, amount: float) -> None:
        """Add to the counter `name` (reported as is by pop_metrics, e.g. sync/bytes)."""
        self.counts[name] = self.counts.get(name, 0.0) + amount

    # --- draining --------------------------------------------------------------------------

    def pop_metrics(self) -> dict[str, float]:
        """This step's timings, counters and memory headline as flat metrics; timings and
        counters start over."""
        metrics: dict[str, float] = {f"timing_s/{k}": v for k, v in self.timings.items()}
        metrics.update(self.counts)
        recent = self.records[self._metrics_from :]
        if recent:
            metrics["memory/peak_gib"] = max(r.peak_gib for r in recent)
            metrics["memory/rss_gib"] = max(r.rss_gib for r in recent)
            for mode, phase in STEADY_PHASES.items():
                steady = [r.current_gib for r in recent if r.phase == phase]
                if steady:
                    metrics[f"memory/{mode}_gib"] = steady[-1]
        self._metrics_from = len(self.records)
        self.timings, self.counts = {}, {}
        return metrics

    def pop_records(self, step: int) -> list[MemoryRecord]:
        """The records since the last call, stamped with `step`; the ledger forgets them."""
        stamped = [replace(r, step=step) for r in self.records]
        self.records = []
        self._metrics_from = 0
        return stamped


_PROCESS_LEDGER: MemoryLedger | None = None


def process_ledger(rank: int = 0, node: str = "") -> MemoryLedger:
    """This process's ledger, created on first use."""
    global _PROCESS_LEDGER
    if _PROCESS_LEDGER is None:
        _PROCESS_LEDGER = MemoryLedger(rank, node)
    return _PROCESS_LEDGER
