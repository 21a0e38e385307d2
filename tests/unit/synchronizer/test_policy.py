"""The sync schedules as tables: which version the explorer needs at each step, when each side
syncs, the lag bound each schedule guarantees, and the field-naming validation."""

from __future__ import annotations

import pytest

from hybrid.synchronizer.policy import SyncPolicy

pytestmark = pytest.mark.unit

STEPS = range(1, 9)


def test_fixed_1_0_is_on_policy() -> None:
    policy = SyncPolicy("fixed", interval=1, offset=0, max_staleness=0)
    assert [policy.required_version(k) for k in STEPS] == [k - 1 for k in STEPS]
    assert all(policy.trainer_publishes_after(t) for t in STEPS)
    assert policy.lag_bound() == 0
    assert policy.buffer_batches() == 1


def test_fixed_1_1_is_one_step_off() -> None:
    policy = SyncPolicy("fixed", interval=1, offset=1)
    assert [policy.required_version(k) for k in STEPS] == [0, 0, 1, 2, 3, 4, 5, 6]
    assert policy.lag_bound() == 1
    assert policy.buffer_batches() == 2


def test_fixed_interval_2_publishes_every_second_step() -> None:
    policy = SyncPolicy("fixed", interval=2, offset=0)
    assert [policy.required_version(k) for k in STEPS] == [0, 0, 2, 2, 4, 4, 6, 6]
    assert [policy.trainer_publishes_after(t) for t in STEPS] == [False, True] * 4
    assert policy.lag_bound() == 1


def test_fixed_interval_2_offset_1() -> None:
    policy = SyncPolicy("fixed", interval=2, offset=1, max_staleness=2)
    assert [policy.required_version(k) for k in STEPS] == [0, 0, 0, 2, 2, 4, 4, 6]
    assert policy.lag_bound() == 2


@pytest.mark.parametrize(("interval", "offset"), [(1, 0), (1, 1), (2, 0), (2, 1), (3, 2), (4, 0)])
def test_fixed_lag_never_exceeds_the_bound(interval: int, offset: int) -> None:
    policy = SyncPolicy(
        "fixed", interval=interval, offset=offset, max_staleness=interval + offset - 1
    )
    for k in range(1, 40):
        version = policy.required_version(k)
        # the trainer has published `version` by the time the explorer may need it
        assert version <= max(0, k - 1 - offset)
        assert version % interval == 0
        assert 0 <= (k - 1) - version <= policy.lag_bound()


def test_dynamic_requires_at_most_max_staleness() -> None:
    policy = SyncPolicy("dynamic_by_explorer", explorer_steps=3, max_staleness=2)
    assert [policy.required_version(k) for k in STEPS] == [0, 0, 0, 1, 2, 3, 4, 5]
    assert not any(policy.trainer_publishes_after(t) for t in STEPS)
    assert policy.lag_bound() == 2
    assert policy.buffer_batches() == 3


def test_dynamic_requests_every_explorer_steps_or_when_too_old() -> None:
    policy = SyncPolicy("dynamic_by_explorer", explorer_steps=3, max_staleness=5)
    # holding fresh enough weights: asks before steps 4, 7, ... only
    assert [policy.explorer_requests(k, version_held=k) for k in STEPS] == [
        k in (4, 7) for k in STEPS
    ]
    # holding version 0 at step 7 (required 1): asks although it is not due
    assert policy.explorer_requests(8, version_held=0)
    assert not policy.explorer_requests(6, version_held=0)


def test_fixed_explorer_never_requests() -> None:
    policy = SyncPolicy("fixed")
    assert not any(policy.explorer_requests(k, version_held=-1) for k in STEPS)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"style": "eager"}, "sync.style"),
        ({"style": "fixed", "interval": 0}, "sync.interval"),
        ({"style": "fixed", "offset": -1}, "sync.offset"),
        ({"style": "dynamic_by_explorer", "explorer_steps": 0}, "sync.explorer_steps"),
        ({"style": "dynamic_by_explorer", "max_staleness": -1}, "sync.max_staleness"),
        ({"style": "fixed", "offset": 1, "interval": 2, "max_staleness": 1}, "sync.max_staleness"),
    ],
)
def test_invalid_values_name_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        SyncPolicy(**kwargs)


def test_the_schedule_bound_error_says_why() -> None:
    with pytest.raises(ValueError, match=r"sync.offset \+ sync.interval - 1 = 2"):
        SyncPolicy("fixed", interval=2, offset=1, max_staleness=1)


def test_steps_are_one_based() -> None:
    with pytest.raises(ValueError, match="1-based"):
        SyncPolicy("fixed").required_version(0)
