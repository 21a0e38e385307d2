"""The buffer as a threaded Ray actor: a blocked take does not block the put that feeds it,
Samples come back equal after the trip through the object store, and the buffer's errors reach
the caller as themselves."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import ray

from hybrid.buffer import BufferClosedError, ExperienceBufferActor
from hybrid.data.sample import Sample, SampleStatus

pytestmark = [
    pytest.mark.integration,
    pytest.mark.usefixtures("ray_cluster"),
    pytest.mark.timeout(240),
]


def group(uid: str, size: int = 2) -> list[Sample]:
    return [
        Sample(
            uid=uid,
            index=index,
            prompt_ids=[5, 6, 7],
            response_ids=[8, 9],
            rollout_log_probs=[-0.125, -1.5],
            versions=[3, 4],
            status=SampleStatus.TRUNCATED if index else SampleStatus.COMPLETED,
            reward=0.5 * index,
            text="ab",
            metadata={"data_source": "toy", "ground_truth": "12", "seed": index},
        )
        for index in range(size)
    ]


ACTOR_START_S = 120
"""An actor's start (a worker process and its imports): seconds on a quiet machine, much
longer on two busy cores; the tests' own deadlines start once it answers."""


def started(actor: Any) -> Any:
    ray.get(actor.depth.remote(), timeout=ACTOR_START_S)
    return actor


@pytest.fixture(scope="module")
def shared_buffer(ray_cluster: None) -> Iterator[Any]:
    """One actor for the tests that leave it empty and open (an actor start costs seconds)."""
    actor = started(ExperienceBufferActor.remote(group_size=2, capacity_groups=4))
    yield actor
    ray.kill(actor)


@pytest.fixture
def buffer(shared_buffer: Any) -> Any:
    depth = ray.get(shared_buffer.depth.remote(), timeout=30)
    assert (depth.samples, depth.partial_groups) == (0, 0), "a previous test left samples behind"
    return shared_buffer


@pytest.fixture
def own_buffer(ray_cluster: None) -> Iterator[Any]:
    actor = started(ExperienceBufferActor.remote(group_size=2, capacity_groups=4))
    yield actor
    ray.kill(actor)


@ray.remote(num_cpus=0)
def put_from_another_process(buffer: Any, samples: list[Sample]) -> None:
    ray.get(buffer.put.remote(samples, timeout_s=10))


def test_a_blocked_take_returns_the_group_another_caller_puts(buffer: Any) -> None:
    taken = buffer.take.remote(1, timeout_s=30)
    ready, _ = ray.wait([taken], timeout=0.5)
    assert not ready  # the take is waiting inside the actor ...
    ray.get(
        put_from_another_process.remote(buffer, group("a")), timeout=ACTOR_START_S
    )  # ... and the put still runs
    assert [(s.uid, s.index) for s in ray.get(taken, timeout=10)] == [("a", 0), ("a", 1)]


def test_samples_survive_the_round_trip(buffer: Any) -> None:
    sent = group("a")
    ray.get(buffer.put.remote(list(reversed(sent))), timeout=10)
    assert ray.get(buffer.take.remote(1, timeout_s=10), timeout=10) == sent


def test_close_wakes_a_remote_take_with_the_buffers_error(own_buffer: Any) -> None:
    buffer = own_buffer
    taken = buffer.take.remote(1, timeout_s=30)
    ready, _ = ray.wait([taken], timeout=0.5)
    assert not ready
    ray.get(buffer.close.remote("explorer died"), timeout=10)
    with pytest.raises(BufferClosedError, match="explorer died"):
        ray.get(taken, timeout=10)
    depth = ray.get(buffer.depth.remote(), timeout=10)
    assert (depth.groups, depth.taken_groups) == (0, 0)
