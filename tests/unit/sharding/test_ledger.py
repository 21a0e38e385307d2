"""Unit tests for `hybrid.sharding.ledger.MemoryLedger` on CPU: phase timings, per-boundary
memory metrics, draining, and the absence of CUDA fields without a GPU."""

import time

import pytest
import torch

from hybrid.sharding.ledger import MemoryLedger

pytestmark = pytest.mark.unit

SLEEP_S = 0.02


@pytest.fixture(autouse=True)
def no_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """Measure as on a CPU-only host, whatever this machine has."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def test_record_appends_an_entry_without_cuda_fields() -> None:
    ledger = MemoryLedger()
    entry = ledger.record("rollout/enter")
    assert ledger.entries == [entry]
    assert entry.phase == "rollout/enter"
    assert entry.rss_gib > 0
    assert entry.cuda_allocated_gib is None
    assert entry.cuda_reserved_gib is None
    assert entry.cuda_peak_gib is None


def test_phase_times_the_block_and_records_both_boundaries() -> None:
    ledger = MemoryLedger()
    with ledger.phase("gen"):
        time.sleep(SLEEP_S)
    assert [e.phase for e in ledger.entries] == ["gen/start", "gen/end"]
    metrics = ledger.drain()
    assert set(metrics) == {"timing_s/gen", "memory/gen/start/rss_gib", "memory/gen/end/rss_gib"}
    assert SLEEP_S <= metrics["timing_s/gen"] < 1.0
    assert metrics["memory/gen/start/rss_gib"] > 0
    assert metrics["memory/gen/end/rss_gib"] > 0
    assert not any("cuda" in key for key in metrics)


def test_repeated_phase_accumulates_time() -> None:
    ledger = MemoryLedger()
    for _ in range(2):
        with ledger.phase("update"):
            time.sleep(SLEEP_S)
    assert ledger.timings["update"] >= 2 * SLEEP_S
    assert len(ledger.entries) == 4


def test_phase_records_its_end_when_the_block_raises() -> None:
    ledger = MemoryLedger()
    with pytest.raises(RuntimeError, match="boom"), ledger.phase("sync"):
        raise RuntimeError("boom")
    assert [e.phase for e in ledger.entries] == ["sync/start", "sync/end"]
    assert "sync" in ledger.timings


def test_drain_empties_the_ledger() -> None:
    ledger = MemoryLedger()
    ledger.record("a")
    with ledger.phase("b"):
        pass
    assert len(ledger.drain()) == 4  # timing_s/b + three rss entries
    assert ledger.entries == []
    assert ledger.timings == {}
    assert ledger.drain() == {}
