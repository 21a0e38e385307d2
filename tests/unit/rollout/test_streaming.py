"""InFlight without an engine: interrupted samples continue from their tokens, each token keeps
the version that produced it, groups leave whole and only when every sample finished."""

from __future__ import annotations

import pytest

from hybrid.data.sample import SampleStatus
from hybrid.rollout.base import GeneratedSample
from hybrid.rollout.streaming import InFlight

pytestmark = pytest.mark.unit


def out(tokens: list[int], stopped: bool = False) -> GeneratedSample:
    return GeneratedSample(
        token_ids=tokens, log_probs=[-0.1 * t for t in tokens], text="", stopped=stopped
    )


def decode(ids: list[int]) -> str:
    return ",".join(map(str, ids))


def test_an_interrupted_sample_continues_under_the_new_version() -> None:
    flight = InFlight(group_size=2, response_length=5)
    flight.add("p", [7, 8], metadata={"ground_truth": "4"})
    (first, r0), (second, r1) = flight.to_submit()
    assert r0.token_ids == r1.token_ids == [7, 8] and r0.max_tokens == r1.max_tokens == 5
    assert r0.seed is None and first != second
    assert flight.to_submit() == []  # both are in the engine
    # Sample 0 stops on its own; sample 1 has two tokens when the weights change.
    assert flight.record(first, out([1], stopped=True), True, 0, decode) is None
    assert flight.record(second, out([2, 3]), False, 0, decode) is None
    assert flight.interrupt() == [second] and flight.groups == 1
    # Submitted again: prompt + partial response, 3 tokens left, a new request id.
    ((again, request),) = flight.to_submit()
    assert again not in (first, second)
    assert request.token_ids == [7, 8, 2, 3] and request.max_tokens == 3
    done = flight.record(again, out([4, 5, 6]), True, 1, decode)
    assert done is not None and flight.groups == 0 and flight.pending == []
    assert [s.index for s in done] == [0, 1]
    stopped, cut = done
    assert stopped.status is SampleStatus.COMPLETED and stopped.versions == [0]
    assert cut.status is SampleStatus.TRUNCATED
    assert cut.response_ids == [2, 3, 4, 5, 6] and cut.versions == [0, 0, 1, 1, 1]
    assert cut.rollout_log_probs == pytest.approx([-0.2, -0.3, -0.4, -0.5, -0.6])
    assert cut.text == "2,3,4,5,6" and cut.metadata == {"ground_truth": "4"}
    cut.check()


def test_groups_leave_in_the_order_they_finish() -> None:
    flight = InFlight(group_size=1, response_length=4)
    flight.add("a", [1], metadata={})
    flight.add("b", [2], metadata={})
    (ra, _), (rb, _) = flight.to_submit()
    assert flight.record(ra, out([5, 6]), False, 0, decode) is None
    done = flight.record(rb, out([7], stopped=True), True, 0, decode)
    assert done is not None and [s.uid for s in done] == ["b"]
    done = flight.record(ra, out([8], stopped=True), True, 1, decode)
    assert done is not None and [s.uid for s in done] == ["a"]


def test_a_row_budget_is_the_request_limit() -> None:
    flight = InFlight(group_size=1, response_length=8)
    flight.add("short", [1], metadata={}, budget=3)
    ((request_id, request),) = flight.to_submit()
    assert request.max_tokens == 3
    done = flight.record(request_id, out([4, 5, 6]), True, 0, decode)
    assert done is not None and done[0].status is SampleStatus.TRUNCATED
    with pytest.raises(ValueError, match=r"budget 9 outside 1 \.\. 8"):
        flight.add("long", [1], metadata={}, budget=9)


def test_refuses_a_uid_in_flight() -> None:
    flight = InFlight(group_size=2, response_length=4)
    flight.add("a", [1], metadata={})
    with pytest.raises(ValueError, match="uid 'a' is already in flight"):
        flight.add("a", [1], metadata={})
