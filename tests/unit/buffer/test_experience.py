"""ExperienceBuffer without Ray: groups form only when whole, leave FIFO by completion in index
order, bad samples are refused by name, and the bounds block and wake the right side."""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable

import pytest

from hybrid.buffer import BufferClosedError, BufferDepth, BufferTimeoutError, ExperienceBuffer
from hybrid.data.sample import Sample, SampleStatus

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]

BLOCKED_S = 0.2
"""How long a thread must stay blocked for the test to call it blocked."""


def sample(uid: str, index: int, status: SampleStatus = SampleStatus.COMPLETED) -> Sample:
    return Sample(
        uid=uid,
        index=index,
        prompt_ids=[1, 2],
        response_ids=[3, 4],
        rollout_log_probs=[-0.5, -0.25],
        versions=[0, 1],
        status=status,
    )


def group(uid: str, size: int = 2) -> list[Sample]:
    return [sample(uid, index) for index in range(size)]


def keys(samples: list[Sample] | None) -> list[str]:
    assert samples is not None
    return [f"{s.uid}#{s.index}" for s in samples]


class Background:
    """Runs `call` in a thread and keeps its result or error."""

    def __init__(self, call: Callable[[], object]) -> None:
        self.result: object = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(call,), daemon=True)
        self.thread.start()

    def _run(self, call: Callable[[], object]) -> None:
        try:
            self.result = call()
        except BaseException as error:
            self.error = error

    def join(self) -> None:
        self.thread.join(timeout=5)
        assert not self.thread.is_alive(), "the background call did not return"


def test_a_group_is_available_only_when_all_its_samples_arrived() -> None:
    buffer = ExperienceBuffer(group_size=3, capacity_groups=4)
    buffer.put([sample("a", 0), sample("a", 2)])
    assert buffer.take(1, timeout_s=0.01) is None
    buffer.put([sample("a", 1)])
    assert keys(buffer.take(1, timeout_s=0.01)) == ["a#0", "a#1", "a#2"]


def test_groups_leave_in_completion_order_each_in_index_order() -> None:
    buffer = ExperienceBuffer(group_size=2, capacity_groups=4)
    buffer.put([sample("first-started", 1), sample("second", 1)])
    buffer.put([sample("second", 0)])  # completes before "first-started"
    buffer.put([sample("third", 1), sample("first-started", 0), sample("third", 0)])
    assert keys(buffer.take(2, timeout_s=0.01)) == [
        "second#0",
        "second#1",
        "first-started#0",
        "first-started#1",
    ]
    assert keys(buffer.take(1, timeout_s=0.01)) == ["third#0", "third#1"]


def test_take_waits_for_as_many_groups_as_asked() -> None:
    buffer = ExperienceBuffer(group_size=2, capacity_groups=4)
    buffer.put(group("a"))
    assert buffer.take(2, timeout_s=0.05) is None
    assert buffer.depth().groups == 1  # a timed-out take leaves the buffer as it was


def test_a_blocked_take_returns_when_a_put_completes_the_group() -> None:
    buffer = ExperienceBuffer(group_size=2, capacity_groups=4)
    taker = Background(lambda: buffer.take(1, timeout_s=5))
    time.sleep(BLOCKED_S)
    assert taker.thread.is_alive()
    buffer.put(group("a"))
    taker.join()
    assert taker.error is None
    assert keys(taker.result) == ["a#0", "a#1"]  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("held", "bad", "message"),
    [
        ([], sample("a", 2), r"a#2: index 2 outside 0 \.\. 1"),
        ([], sample("a", -1), r"a#-1: index -1 outside"),
        ([], sample("a", 0, SampleStatus.PENDING), r"a#0: status pending"),
        ([], sample("a", 0, SampleStatus.ABORTED), r"a#0: status aborted"),
        ([sample("a", 1)], sample("a", 1), r"a#1: already in the buffer"),
        (group("a"), sample("a", 0), r"a#0: more than group_size=2 samples for uid 'a'"),
    ],
)
def test_refused_samples_are_named(held: list[Sample], bad: Sample, message: str) -> None:
    buffer = ExperienceBuffer(group_size=2, capacity_groups=4)
    buffer.put(held)
    before = buffer.depth()
    with pytest.raises(ValueError, match=message):
        buffer.put([sample("other", 0), bad])
    assert buffer.depth() == before  # a refused put lands nothing, not even its good samples


def test_a_duplicate_within_one_put_is_named() -> None:
    buffer = ExperienceBuffer(group_size=2, capacity_groups=4)
    with pytest.raises(ValueError, match=r"a#1: appears more than once"):
        buffer.put([sample("a", 1), sample("a", 1)])


def test_a_sample_with_misaligned_token_lists_is_named() -> None:
    bad = sample("a", 0)
    bad.versions = [0]
    with pytest.raises(ValueError, match=r"a#0: per-token lists differ"):
        ExperienceBuffer(group_size=2, capacity_groups=4).put([bad])


def test_truncated_samples_are_accepted() -> None:
    buffer = ExperienceBuffer(group_size=1, capacity_groups=1)
    buffer.put([sample("a", 0, SampleStatus.TRUNCATED)])
    assert keys(buffer.take(1, timeout_s=0.01)) == ["a#0"]


def test_sizes_beyond_the_capacity_fail_at_once() -> None:
    buffer = ExperienceBuffer(group_size=1, capacity_groups=2)
    with pytest.raises(ValueError, match="a put of 3 groups can never fit"):
        buffer.put([sample(uid, 0) for uid in "abc"], timeout_s=None)
    with pytest.raises(ValueError, match=r"num_groups must be in 1 \.\. capacity_groups=2, got 3"):
        buffer.take(3, timeout_s=0.01)
    with pytest.raises(ValueError, match="capacity_groups must be at least 1"):
        ExperienceBuffer(group_size=1, capacity_groups=0)


def test_a_put_waits_for_room_and_lands_when_a_take_frees_it() -> None:
    buffer = ExperienceBuffer(group_size=2, capacity_groups=2)
    buffer.put(group("a"))
    buffer.put([sample("b", 0)])  # a partial group takes room too
    putter = Background(lambda: buffer.put(group("c"), timeout_s=5))
    time.sleep(BLOCKED_S)
    assert putter.thread.is_alive()
    assert buffer.depth().samples == 3
    buffer.put([sample("b", 1)])  # completing a held group needs no room, so it does not wait
    assert keys(buffer.take(1, timeout_s=0.01)) == ["a#0", "a#1"]
    putter.join()
    assert putter.error is None
    assert keys(buffer.take(2, timeout_s=0.01)) == ["b#0", "b#1", "c#0", "c#1"]


def test_a_put_that_finds_no_room_in_time_names_the_capacity_and_depth() -> None:
    buffer = ExperienceBuffer(group_size=2, capacity_groups=1)
    buffer.put(group("a"))
    with pytest.raises(
        BufferTimeoutError, match=r"capacity_groups=1, holding 1 complete \+ 0 partial"
    ):
        buffer.put(group("b"), timeout_s=0.05)
    assert buffer.depth().samples == 2


@pytest.mark.parametrize("side", ["take", "put"])
def test_close_wakes_a_blocked_caller_with_the_reason(side: str) -> None:
    buffer = ExperienceBuffer(group_size=2, capacity_groups=1)
    if side == "put":
        buffer.put(group("a"))
        waiter = Background(lambda: buffer.put(group("b"), timeout_s=5))
    else:
        waiter = Background(lambda: buffer.take(1, timeout_s=5))
    time.sleep(BLOCKED_S)
    assert waiter.thread.is_alive()
    buffer.close("trainer finished")
    waiter.join()
    assert isinstance(waiter.error, BufferClosedError)
    assert str(waiter.error) == "experience buffer closed: trainer finished"


def test_after_close_every_put_and_take_raises_and_close_is_idempotent() -> None:
    buffer = ExperienceBuffer(group_size=1, capacity_groups=2)
    buffer.put([sample("a", 0)])
    buffer.close("first")
    buffer.close("second")
    with pytest.raises(BufferClosedError, match="first"):
        buffer.put([sample("b", 0)])
    with pytest.raises(BufferClosedError, match="first"):
        buffer.take(1, timeout_s=0.01)
    assert buffer.depth().groups == 1  # depth still answers


def test_depth_counts_what_is_held_and_what_passed() -> None:
    buffer = ExperienceBuffer(group_size=2, capacity_groups=4)
    assert buffer.depth() == BufferDepth(
        groups=0, partial_groups=0, samples=0, put_groups=0, taken_groups=0
    )
    buffer.put([*group("a"), *group("b"), sample("c", 1)])
    assert buffer.depth() == BufferDepth(
        groups=2, partial_groups=1, samples=5, put_groups=2, taken_groups=0
    )
    buffer.take(1, timeout_s=0.01)
    assert buffer.depth() == BufferDepth(
        groups=1, partial_groups=1, samples=3, put_groups=2, taken_groups=1
    )


def test_concurrent_putters_and_a_taker_lose_nothing() -> None:
    num_putters, groups_each = 4, 25
    buffer = ExperienceBuffer(group_size=2, capacity_groups=3)

    def put_all(putter: int) -> None:
        for g in range(groups_each):
            # one sample at a time, interleaved with the other putters
            for index in (1, 0):
                buffer.put([sample(f"p{putter}-g{g}", index)], timeout_s=5)

    putters = [Background(functools.partial(put_all, p)) for p in range(num_putters)]
    taken: list[str] = []
    while len(taken) < num_putters * groups_each * 2:
        batch = buffer.take(1, timeout_s=5)
        assert batch is not None, buffer.depth()
        taken += keys(batch)
    for putter in putters:
        putter.join()
        assert putter.error is None
    assert len(set(taken)) == len(taken)
    assert buffer.depth() == BufferDepth(
        groups=0, partial_groups=0, samples=0, put_groups=100, taken_groups=100
    )
