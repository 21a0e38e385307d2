"""The Synchronizer as a real threaded Ray actor: blocked waits wake on a publish or a state
change from another caller, time out with None, fail with PeerStoppedError when a side stops;
memory payloads stay ObjectRefs kept alive by the actor; the timeline file replays."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import ray
import torch

from hybrid.synchronizer import (
    PeerStoppedError,
    SynchronizerActor,
    SyncPolicy,
    SyncState,
    Transition,
    TransitionError,
    check_timeline,
)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.usefixtures("ray_cluster"),
    pytest.mark.timeout(60),
]

S = SyncState
WAIT_S = 20.0  # a deadline for the driver's own ray.get, far above what any step takes


@pytest.fixture
def make_sync() -> Iterator[Callable[..., Any]]:
    started: list[Any] = []

    def make(method: str = "memory", timeline_path: str | None = None, keep: int = 2) -> Any:
        handle = SynchronizerActor.remote(method, timeline_path, keep)
        started.append(handle)
        return handle

    yield make
    for handle in started:
        ray.kill(handle)


def still_blocked(ref: ray.ObjectRef, for_s: float = 0.3) -> bool:
    ready, _ = ray.wait([ref], timeout=for_s)
    return not ready


def test_a_blocked_waiter_wakes_when_another_caller_publishes(make_sync: Callable) -> None:
    sync = make_sync()
    ray.get(sync.publish.remote(0))
    waiting = sync.wait_for_version.remote(1, WAIT_S, "explorer")
    assert still_blocked(waiting)
    ray.get(sync.publish.remote(1, "v1"))
    assert ray.get(waiting, timeout=WAIT_S) == 1
    # an already published version returns at once
    assert ray.get(sync.wait_for_version.remote(0, 0.0, "explorer"), timeout=WAIT_S) == 1


def test_a_wait_times_out_with_none(make_sync: Callable) -> None:
    sync = make_sync()
    ray.get(sync.publish.remote(0))
    start = time.monotonic()
    assert ray.get(sync.wait_for_version.remote(3, 0.3, "explorer"), timeout=WAIT_S) is None
    assert time.monotonic() - start >= 0.3
    assert ray.get(sync.wait_for_state.remote("trainer", [S.RUNNING], 0.2, "explorer")) is None


def test_a_waiter_wakes_on_the_state_it_awaits(make_sync: Callable) -> None:
    sync = make_sync("nccl")
    ray.get(sync.set_state.remote("trainer", S.RUNNING, 0))
    waiting = sync.wait_for_state.remote("trainer", [S.WAITING_SYNC], WAIT_S, "explorer")
    assert still_blocked(waiting)
    ray.get(sync.set_state.remote("trainer", S.WAITING_SYNC))
    assert ray.get(waiting, timeout=WAIT_S) is S.WAITING_SYNC
    assert ray.get(sync.states.remote()) == {"trainer": "waiting_sync", "explorer": "stopped"}


def test_a_finished_offer_does_not_answer_a_wait_for_a_newer_one(make_sync: Callable) -> None:
    """The trainer is still WAITING_SYNC at version 7 after the explorer received 7: an
    explorer that asks for the next offer (>= 8) keeps waiting until 8 is offered."""
    sync = make_sync("nccl")
    ray.get(sync.set_state.remote("trainer", S.RUNNING, 6))
    ray.get(sync.set_state.remote("trainer", S.WAITING_SYNC, 7))
    assert ray.get(sync.wait_for_state.remote("trainer", [S.WAITING_SYNC], 0.2, "explorer", 8)) is (
        None
    )
    waiting = sync.wait_for_state.remote("trainer", [S.WAITING_SYNC], WAIT_S, "explorer", 8)
    assert still_blocked(waiting)
    ray.get(sync.set_state.remote("trainer", S.RUNNING, 7))
    assert still_blocked(waiting)
    ray.get(sync.set_state.remote("trainer", S.WAITING_SYNC, 8))
    assert ray.get(waiting, timeout=WAIT_S) is S.WAITING_SYNC
    assert ray.get(sync.wait_for_state.remote("trainer", [S.WAITING_SYNC], 0.0, "explorer", 8)) is (
        S.WAITING_SYNC
    )


def test_stop_makes_blocked_waiters_raise_naming_side_and_reason(make_sync: Callable) -> None:
    sync = make_sync()
    ray.get(sync.publish.remote(0))
    ray.get(sync.set_state.remote("trainer", S.RUNNING))
    version_wait = sync.wait_for_version.remote(1, WAIT_S, "explorer")
    state_wait = sync.wait_for_state.remote("trainer", [S.WAITING_SYNC], WAIT_S, "explorer")
    assert still_blocked(version_wait)
    ray.get(sync.stop.remote("trainer", "loss is nan"))
    for ref in (version_wait, state_wait):
        with pytest.raises(PeerStoppedError, match=r"trainer stopped \(loss is nan\)"):
            ray.get(ref, timeout=WAIT_S)
    # idempotent: the first reason stays, nothing more is logged
    ray.get(sync.stop.remote("trainer", "again"))
    assert [m["note"] for m in ray.get(sync.timeline.remote())] == ["", "loss is nan"]
    with pytest.raises(PeerStoppedError, match="loss is nan"):
        ray.get(sync.wait_for_version.remote(1, WAIT_S, "explorer"), timeout=WAIT_S)
    # STOPPED awaited: the stop is the answer, not an error
    assert ray.get(sync.wait_for_state.remote("trainer", [S.STOPPED], 1.0, "explorer")) is (
        S.STOPPED
    )


def test_a_side_that_never_started_can_be_waited_on_until_stopped(make_sync: Callable) -> None:
    sync = make_sync()
    waiting = sync.wait_for_version.remote(0, WAIT_S, "explorer")
    assert still_blocked(waiting)  # the trainer is STOPPED but has not started yet
    ray.get(sync.stop.remote("trainer", "init failed"))
    with pytest.raises(PeerStoppedError, match=r"trainer stopped \(init failed\)"):
        ray.get(waiting, timeout=WAIT_S)
    assert ray.get(sync.timeline.remote()) == []


def test_memory_payload_refs_stay_refs_and_stay_alive(make_sync: Callable) -> None:
    sync = make_sync()
    ref = ray.put(torch.arange(4))
    ray.get(sync.publish.remote(1, [ref]))
    del ref  # the actor's reference alone keeps the object
    version, payload = ray.get(sync.newest.remote())
    assert version == 1
    assert isinstance(payload[0], ray.ObjectRef)
    assert torch.equal(ray.get(payload[0], timeout=WAIT_S), torch.arange(4))
    assert ray.get(sync.version.remote("trainer")) == 1


def test_keep_versions_drops_old_payloads(make_sync: Callable) -> None:
    sync = make_sync(keep=2)
    assert ray.get(sync.newest.remote()) == (-1, None)
    for version in range(3):
        ray.get(sync.publish.remote(version, [ray.put(torch.full((2,), version))]))
    with pytest.raises(KeyError, match=r"version 0 is not kept; kept: \[1, 2\]"):
        ray.get(sync.payload.remote(0))
    assert torch.equal(ray.get(ray.get(sync.payload.remote(1))[0]), torch.full((2,), 1))
    with pytest.raises(ValueError, match=r"version 2 is not newer than .* 2"):
        ray.get(sync.publish.remote(2))


def test_the_timeline_file_has_one_line_per_move_and_replays(
    make_sync: Callable, tmp_path: Path
) -> None:
    path = tmp_path / "run" / "sync_timeline.jsonl"
    sync = make_sync("nccl", str(path))
    cycle = [
        ("trainer", S.RUNNING, 0),
        ("explorer", S.RUNNING, 0),
        ("explorer", S.REQUIRE_SYNC, None),
        ("trainer", S.WAITING_SYNC, 1),
        ("explorer", S.WAITING_SYNC, None),
        ("trainer", S.RUNNING, None),
        ("explorer", S.RUNNING, 1),
    ]
    for side, state, version in cycle:
        ray.get(sync.set_state.remote(side, state, version))
    with pytest.raises(TransitionError, match="nccl trainer may not move running -> require_sync"):
        ray.get(sync.set_state.remote("trainer", S.REQUIRE_SYNC))
    ray.get(sync.stop.remote("explorer", "done"))

    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines == ray.get(sync.timeline.remote())
    assert len(lines) == len(cycle) + 1
    moves = [Transition.from_json(line) for line in lines]
    check_timeline("nccl", moves)
    assert [m.version for m in moves if m.side == "explorer"] == [0, 0, 0, 1, 1]
    assert moves[-1].note == "done"
    with pytest.raises(TransitionError):
        check_timeline("memory", moves)


def test_a_one_step_off_run_keeps_its_lag_bound(make_sync: Callable) -> None:
    """A trainer thread and an explorer thread drive the actor as the split loop will: the
    explorer generates step k with the newest version >= required_version(k)."""
    policy = SyncPolicy("fixed", interval=1, offset=1)
    sync = make_sync()
    ray.get(sync.publish.remote(0))
    steps = 6
    generated: dict[int, int] = {}
    batches = threading.Semaphore(0)  # batch k is ready to train on

    def explorer() -> None:
        ray.get(sync.set_state.remote("explorer", S.RUNNING, 0))
        for k in range(1, steps + 1):
            version = ray.get(
                sync.wait_for_version.remote(policy.required_version(k), WAIT_S, "explorer")
            )
            generated[k] = version
            batches.release()
        ray.get(sync.stop.remote("explorer", "finished"))

    def trainer() -> None:
        ray.get(sync.set_state.remote("trainer", S.RUNNING, 0))
        for t in range(1, steps + 1):
            assert batches.acquire(timeout=WAIT_S)
            if policy.trainer_publishes_after(t):
                ray.get(sync.publish.remote(t, f"v{t}"))
        ray.get(sync.stop.remote("trainer", "finished"))

    threads = [threading.Thread(target=explorer), threading.Thread(target=trainer)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=WAIT_S)
    assert sorted(generated) == list(range(1, steps + 1))
    assert all(0 <= (k - 1) - v <= policy.lag_bound() for k, v in generated.items())
    check_timeline("memory", [Transition.from_json(m) for m in ray.get(sync.timeline.remote())])
