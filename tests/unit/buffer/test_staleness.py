"""The fully-async mode's staleness rules at their boundaries (hybrid/buffer/staleness.py)."""

from __future__ import annotations

import pytest

from hybrid.buffer.staleness import groups_to_start, production_budget, within_lag

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("oldest", "trainer", "bound", "admitted"),
    [
        (4, 5, 1, True),  # lag 1 == bound: trained
        (3, 5, 1, False),  # lag 2 == bound + 1: dropped
        (5, 5, 0, True),  # on-policy
        (4, 5, 0, False),
        (3, 5, 2, True),
        (2, 5, 2, False),
    ],
)
def test_within_lag_at_the_bound(oldest: int, trainer: int, bound: int, admitted: bool) -> None:
    assert within_lag(oldest, trainer, bound) is admitted


def test_within_lag_rejects_a_negative_bound() -> None:
    with pytest.raises(ValueError, match="max_version_lag must be >= 0, got -1"):
        within_lag(5, 5, -1)


@pytest.mark.parametrize(
    ("threshold", "per_version", "budget"),
    [
        (0.0, 4, 4),
        (0.1, 4, 4),  # 4.4 floors to 4: synchronous pacing
        (0.1, 10, 11),  # 1.1 x 10 = 11.000000000000002
        (0.15, 20, 23),  # 1.15 x 20 = 22.999999999999996
        (0.5, 4, 6),
        (1.0, 4, 8),
    ],
)
def test_production_budget(threshold: float, per_version: int, budget: int) -> None:
    assert production_budget(threshold, per_version) == budget


def test_production_budget_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="staleness_threshold must be >= 0"):
        production_budget(-0.1, 4)
    with pytest.raises(ValueError, match="groups_per_version must be >= 1"):
        production_budget(0.1, 0)


def test_groups_to_start() -> None:
    # Holding version 2, trained_at(2) = 8, budget 6: 14 live groups at most.
    assert groups_to_start(started=10, dropped=0, trained_at_version=8, budget=6) == 4
    assert groups_to_start(started=14, dropped=0, trained_at_version=8, budget=6) == 0
    # A dropped group hands its place back.
    assert groups_to_start(started=14, dropped=1, trained_at_version=8, budget=6) == 1
    # Never negative (an older version held while the counts moved on).
    assert groups_to_start(started=20, dropped=0, trained_at_version=8, budget=6) == 0
    with pytest.raises(ValueError, match="dropped <= started"):
        groups_to_start(started=1, dropped=2, trained_at_version=0, budget=4)
