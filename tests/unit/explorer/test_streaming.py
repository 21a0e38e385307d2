"""InFlight without an engine: partial rollouts continue where they stopped, each token keeps
the version that produced it, groups leave whole and only when every sample finished."""

from __future__ import annotations

import pytest

from hybrid.data.sample import SampleStatus
from hybrid.explorer.streaming import InFlight
from hybrid.rollout.base import GeneratedSample

pytestmark = pytest.mark.unit


def out(tokens: list[int], stopped: bool = False) -> GeneratedSample:
    return GeneratedSample(
        token_ids=tokens, log_probs=[-0.1 * t for t in tokens], text="", stopped=stopped
    )


def decode(ids: list[int]) -> str:
    return ",".join(map(str, ids))


def test_a_sample_continues_under_the_new_version() -> None:
    flight = InFlight(group_size=2, response_length=5)
    flight.add("p", [7, 8], metadata={"ground_truth": "4"})
    first = flight.requests(max_tokens=2)
    assert [r.token_ids for r in first] == [[7, 8], [7, 8]]
    assert [r.max_tokens for r in first] == [2, 2]
    assert [r.seed for r in first] == [None, None]
    # Sample 0 stops on its own; sample 1 is cut by the chunk and waits.
    assert flight.advance([out([1], stopped=True), out([2, 3])], 0, decode) == []
    assert flight.groups == 1
    # A new version arrived: the continuation is prompt + partial response, 3 tokens left.
    (request,) = flight.requests(max_tokens=4)
    assert request.token_ids == [7, 8, 2, 3] and request.max_tokens == 3
    (done,) = flight.advance([out([4, 5, 6])], 1, decode)
    assert flight.groups == 0 and flight.pending == []
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
    done = flight.advance([out([5, 6]), out([7], stopped=True)], 0, decode)
    assert [[s.uid for s in g] for g in done] == [["b"]]
    done = flight.advance([out([8], stopped=True)], 1, decode)
    assert [[s.uid for s in g] for g in done] == [["a"]]


def test_refuses_a_uid_in_flight_and_a_mismatched_output() -> None:
    flight = InFlight(group_size=2, response_length=4)
    flight.add("a", [1], metadata={})
    with pytest.raises(ValueError, match="uid 'a' is already in flight"):
        flight.add("a", [1], metadata={})
    with pytest.raises(ValueError, match="1 generated for 2 pending samples"):
        flight.advance([out([1])], 0, decode)


def test_a_row_budget_ends_its_samples_early() -> None:
    flight = InFlight(group_size=1, response_length=8)
    flight.add("short", [1], metadata={}, budget=3)
    (request,) = flight.requests(max_tokens=2)
    assert request.max_tokens == 2
    assert flight.advance([out([4, 5])], 0, decode) == []
    (request,) = flight.requests(max_tokens=2)
    assert request.max_tokens == 1  # one token left of its budget
    ((done,),) = flight.advance([out([6])], 0, decode)
    assert done.status is SampleStatus.TRUNCATED and done.response_ids == [4, 5, 6]
    with pytest.raises(ValueError, match=r"budget 9 outside 1 \.\. 8"):
        flight.add("long", [1], metadata={}, budget=9)
