"""`SyncExchange`, the one state the decoupled sync's two sides share across the driver's
threads, hammered from two threads at once the way a split run uses it: the explorer side pops
probes and adds its figures, the trainer side puts and prunes probes and drains the figures.
Nothing raises, and every figure added is drained exactly once."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
import torch

from hybrid.data import Batch
from hybrid.trainer.sync_exchange import SyncExchange, SyncFigures

pytestmark = pytest.mark.unit

STEPS = 20_000
LAG = 256
"""Versions the explorer trails the trainer by: the probes put and not yet popped."""
KEPT = 2 * LAG
"""Probes older than this many versions are pruned (the explorer skipped them)."""


@contextmanager
def thread_switches_often() -> Iterator[None]:
    """Switch threads every microsecond, so that a race the GIL usually hides shows."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


def run_both(explorer: Callable[[], None], trainer: Callable[[], None]) -> list[BaseException]:
    """Run the two sides on two threads at once; the errors they raised."""
    errors: list[BaseException] = []
    start = threading.Barrier(2)

    def side(work: Callable[[], None]) -> None:
        start.wait()
        try:
            work()
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=side, args=(w,), daemon=True) for w in (explorer, trainer)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads), "a side hung"
    return errors


def total(figures: list[SyncFigures]) -> tuple[float, float, float, int, int]:
    return (
        sum(f.publish_s for f in figures),
        sum(f.load_s for f in figures),
        sum(f.explorer_wait_s for f in figures),
        sum(f.syncs for f in figures),
        sum(len(f.probe_diffs) for f in figures),
    )


def test_two_threads_lose_no_figure_and_never_see_the_probes_change_mid_iteration() -> None:
    exchange = SyncExchange()
    rows = Batch.from_dict({"old_log_probs": torch.zeros(2, 3)})
    drained: list[SyncFigures] = []
    newest = [-1]
    """The newest version the trainer has trained (and put the probe of)."""
    trainer_done = threading.Event()
    loads = probes_scored = 0

    def explorer() -> None:  # SyncFollower: score the probe of the version it leaves, load
        nonlocal loads, probes_scored
        version = 0
        while version < STEPS - LAG:
            if newest[0] < version + LAG:  # trail the trainer by LAG versions
                if trainer_done.is_set():
                    return
                time.sleep(0)
                continue
            if exchange.pop_probe(version) is not None:
                exchange.add_probe_diff(0.5)
                probes_scored += 1
            exchange.add_load(version, 1.0, digest=None)
            exchange.add_explorer_wait(1.0)
            loads += 1
            version += 1

    def trainer() -> None:  # TransportPublisher: publish, take the step's probe, drain
        try:
            for version in range(STEPS):
                exchange.add_publish(1.0)
                exchange.put_probe(version, rows, oldest_kept=version - KEPT)
                newest[0] = version
                if version % 3 == 0:
                    drained.append(exchange.drain())
        finally:
            trainer_done.set()

    with thread_switches_often():
        errors = run_both(explorer, trainer)
    assert not errors, errors
    drained.append(exchange.drain())
    assert loads == STEPS - LAG and probes_scored > 0
    assert total(drained) == (STEPS, loads, loads, loads, probes_scored)


def test_probes_of_versions_the_explorer_skipped_go_and_digests_are_kept() -> None:
    exchange = SyncExchange()
    rows = Batch.from_dict({"old_log_probs": torch.zeros(1, 1)})
    for version in range(5):
        exchange.put_probe(version, rows, oldest_kept=version - 1)
    exchange.put_probe(5, None, oldest_kept=4)  # no probe this step; the pruning still runs
    assert [exchange.pop_probe(v) is not None for v in range(6)] == [False] * 4 + [True, False]
    exchange.add_load(3, 0.25, digest="abc")
    assert exchange.digests() == {3: "abc"}
    figures = exchange.drain()
    assert (figures.load_s, figures.syncs) == (0.25, 1)
    assert figures.metrics()["sync/explorer_syncs"] == 1.0
