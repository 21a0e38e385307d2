"""MessageQueue without Ray: the production grants, stale groups dropped and counted at take,
every started group accounted for, and a blocked take woken by a put or a close."""

from __future__ import annotations

import threading
import time

import pytest

from hybrid.buffer import BufferClosedError
from hybrid.buffer.message_queue import MessageQueue
from hybrid.data.sample import Sample, SampleStatus

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]


def group(uid: str, versions: list[int], size: int = 2) -> list[Sample]:
    """`size` finished samples of `uid` whose tokens came from `versions`."""
    return [
        Sample(
            uid=uid,
            index=index,
            prompt_ids=[1],
            response_ids=[2] * len(versions),
            rollout_log_probs=[-0.1] * len(versions),
            versions=list(versions),
            status=SampleStatus.COMPLETED,
        )
        for index in range(size)
    ]


def test_grants_follow_the_production_budget() -> None:
    queue = MessageQueue(group_size=2, budget=3, max_version_lag=1)
    assert queue.reserve(2, version=0) == 2
    assert queue.reserve(5, version=0) == 1  # 3 live groups: the budget of version 0
    assert queue.reserve(1, version=0) == 0
    with pytest.raises(KeyError, match="version 1 was never published"):
        queue.reserve(1, version=1)
    queue.put([group("a", [0]), group("b", [0])])
    assert queue.take(2, trainer_version=0, timeout_s=1) is not None
    queue.published(1)  # 2 groups trained: version 1 may be followed by 2 + 3 live groups
    assert queue.reserve(5, version=1) == 2
    assert queue.reserve(1, version=0) == 0  # the old version's grant stays spent
    admissions = queue.record()["admissions"]
    assert [(a["version"], a["granted"], a["started"]) for a in admissions] == [
        (0, 2, 2),
        (0, 1, 3),
        (1, 2, 5),
    ]


def test_a_stale_group_is_dropped_counted_and_gives_its_place_back() -> None:
    queue = MessageQueue(group_size=2, budget=2, max_version_lag=1)
    assert queue.reserve(2, version=0) == 2
    # "old" has a token of version 0 (a partial rollout continued under 2): lag 2 at 2.
    queue.put([group("old", [0, 2]), group("new", [1, 2])])
    queue.published(1)
    queue.published(2)
    taken = queue.take(1, trainer_version=2, timeout_s=1)
    assert taken is not None and {s.uid for s in taken} == {"new"}
    record = queue.record()
    assert record["dropped_lags"] == [2] and record["taken_lags"] == [1]
    assert queue.accounting() == {
        "started": 2,
        "trained": 1,
        "dropped": 1,
        "filtered": 0,
        "queued": 0,
        "in_flight": 0,
    }
    # trained_at(2) = 0 (published before the take), live = 2 - 1 dropped: one more allowed.
    assert queue.reserve(5, version=2) == 1


def test_the_boundary_lag_is_trained() -> None:
    queue = MessageQueue(group_size=2, budget=1, max_version_lag=1)
    queue.reserve(1, version=0)
    queue.put([group("a", [0])])
    queue.published(1)
    assert queue.take(1, trainer_version=1, timeout_s=1) is not None  # lag 1 == bound


def test_accounting_counts_groups_still_generating() -> None:
    queue = MessageQueue(group_size=2, budget=4, max_version_lag=1)
    queue.reserve(4, version=0)
    queue.put([group("a", [0])])
    assert queue.accounting() == {
        "started": 4,
        "trained": 0,
        "dropped": 0,
        "filtered": 0,
        "queued": 1,
        "in_flight": 3,
    }


def test_bad_groups_are_refused_by_name() -> None:
    queue = MessageQueue(group_size=2, budget=4, max_version_lag=1)
    with pytest.raises(ValueError, match="group 'a': needs group_size=2"):
        queue.put([group("a", [0], size=1)])
    pending = group("b", [0])
    pending[1].status = SampleStatus.PENDING
    with pytest.raises(ValueError, match="sample b#1: status pending"):
        queue.put([pending])
    with pytest.raises(RuntimeError, match="more than the production budget 4"):
        queue.put([group(uid, [0]) for uid in "cdefg"])


def test_a_blocked_take_wakes_on_put_and_on_close() -> None:
    queue = MessageQueue(group_size=2, budget=2, max_version_lag=0)
    got: list[object] = []
    taker = threading.Thread(target=lambda: got.append(queue.take(1, 0, timeout_s=10)))
    taker.start()
    time.sleep(0.2)
    assert taker.is_alive()
    queue.put([group("a", [0])])
    taker.join(timeout=5)
    assert got and got[0] is not None
    assert queue.take(1, 0, timeout_s=0.05) is None  # nothing arrived in time

    errors: list[BaseException] = []

    def take_until_closed() -> None:
        try:
            queue.take(1, 0, timeout_s=10)
        except BufferClosedError as error:
            errors.append(error)

    taker = threading.Thread(target=take_until_closed)
    taker.start()
    time.sleep(0.2)
    queue.close("explorer died")
    taker.join(timeout=5)
    assert len(errors) == 1 and "explorer died" in str(errors[0])


def test_a_take_with_min_groups_returns_what_is_there_up_to_the_number_asked() -> None:
    queue = MessageQueue(group_size=2, budget=4, max_version_lag=1)
    assert queue.reserve(4, version=0) == 4
    queue.put([group("a", [0])])
    assert queue.take(3, trainer_version=0, timeout_s=0.05) is None  # 3 not there yet
    first = queue.take(3, trainer_version=0, timeout_s=1, min_groups=1)
    assert first is not None and [s.uid for s in first] == ["a", "a"]
    queue.put([group("b", [0]), group("c", [0]), group("d", [0])])
    rest = queue.take(2, trainer_version=0, timeout_s=1, min_groups=1)  # never more than asked
    assert rest is not None and [s.uid for s in rest] == ["b", "b", "c", "c"]
    assert queue.accounting()["trained"] == 3 and queue.depth() == 1
    with pytest.raises(ValueError, match="min_groups"):
        queue.take(2, trainer_version=0, timeout_s=1, min_groups=3)


def test_filtered_groups_are_not_trained_and_give_their_place_back() -> None:
    queue = MessageQueue(group_size=2, budget=2, max_version_lag=1)
    assert queue.reserve(2, version=0) == 2
    queue.put([group("a", [0]), group("b", [0])])
    assert queue.take(2, trainer_version=0, timeout_s=1.0) is not None
    assert queue.reserve(1, version=0) == 0  # the budget of version 0 is spent
    queue.filtered(1)  # dynamic sampling left one of them out
    assert queue.accounting() == {
        "started": 2, "trained": 1, "dropped": 0, "filtered": 1, "queued": 0, "in_flight": 0
    }  # fmt: skip
    assert queue.reserve(5, version=0) == 1  # its place, handed back
    with pytest.raises(ValueError, match="filtered 2 groups of 1 taken"):
        queue.filtered(2)
