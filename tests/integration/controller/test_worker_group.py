"""The single controller on real Ray: colocation, views, dispatch modes, errors, death."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import ray
import torch

from hybrid.controller import (
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    WorkerCallError,
    WorkerDiedError,
    create_colocated_worker_cls,
)
from hybrid.data.batch import Batch
from tests.integration.controller.workers import Collective, Echo

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def colocated(ray_cluster: None) -> Iterator[RayWorkerGroup]:
    worker_dict_cls = create_colocated_worker_cls(
        {
            "actor_rollout": RayClassWithInitArgs(Echo, tag="actor"),
            "ref": RayClassWithInitArgs(Collective),
        }
    )
    group = RayWorkerGroup(RayResourcePool([2]), worker_dict_cls)
    yield group
    group.shutdown()


def test_spawn_views_share_the_same_actors(colocated: RayWorkerGroup) -> None:
    views = colocated.spawn(prefix_set={"actor_rollout", "ref"})
    assert set(views) == {"actor_rollout", "ref"}
    described = views["actor_rollout"].describe()
    assert [d["tag"] for d in described] == ["actor", "actor"]
    # Both members live in the same two processes.
    pids = ray.get([a.pid.remote() for a in colocated.actors])
    assert [d["pid"] for d in described] == pids
    assert views["ref"].ping() == [0, 1]
    # The group also answers the prefixed names.
    assert colocated.ref_ping() == [0, 1]


def test_rank_environment_is_set_before_member_init(colocated: RayWorkerGroup) -> None:
    described = colocated.spawn({"actor_rollout"})["actor_rollout"].describe()
    addresses = {
        (d["env_at_init"]["MASTER_ADDR"], d["env_at_init"]["MASTER_PORT"]) for d in described
    }
    assert len(addresses) == 1 and None not in next(iter(addresses))
    for rank, d in enumerate(described):
        assert (d["rank"], d["world_size"]) == (rank, 2)
        assert d["env_at_init"]["RANK"] == str(rank)
        assert d["env_at_init"]["WORLD_SIZE"] == "2"
        assert d["env_at_init"]["LOCAL_RANK"] == str(rank)


def test_gloo_all_reduce_across_the_two_actors(colocated: RayWorkerGroup) -> None:
    ref = colocated.spawn({"ref"})["ref"]
    # rank r contributes 1.5 * (r + 1): 1.5 + 3.0
    assert ref.all_reduce_sum(1.5) == [4.5, 4.5]


@pytest.mark.parametrize("size", [4, 5, 1])
def test_dp_compute_splits_and_reassembles_in_order(colocated: RayWorkerGroup, size: int) -> None:
    actor = colocated.spawn({"actor_rollout"})["actor_rollout"]
    batch = Batch.from_dict(
        {"x": torch.arange(size)}, non_tensors={"text": [f"s{i}" for i in range(size)]}
    )
    out = actor.double(batch, offset=1)
    assert len(out) == size
    assert out["y"].tolist() == [2 * i + 1 for i in range(size)]
    assert list(out["text"]) == [f"s{i}!" for i in range(size)]
    # The first ceil(size/2) rows went to rank 0, the rest to rank 1 (padding dropped).
    half = -(-size // 2)
    assert out["served_by"].tolist() == [0] * half + [1] * (size - half)


def test_all_to_all_rank_zero_and_non_blocking(colocated: RayWorkerGroup) -> None:
    actor = colocated.spawn({"actor_rollout"})["actor_rollout"]
    assert actor.add_rank([10, 20]) == [10, 21]
    with pytest.raises(ValueError, match="one entry per worker"):
        actor.add_rank([10])
    assert actor.rank_plus_one() == 1
    future = actor.slow_square(7)
    assert future.get() == [49, 49]
    with pytest.raises(AttributeError, match="not_registered"):
        actor.not_registered()


def test_worker_exception_names_member_method_and_rank(colocated: RayWorkerGroup) -> None:
    actor = colocated.spawn({"actor_rollout"})["actor_rollout"]
    with pytest.raises(WorkerCallError) as info:
        actor.fail_on(1)
    err = info.value
    assert (err.member, err.method, err.rank) == ("actor_rollout", "fail_on", 1)
    assert "actor_rollout.fail_on failed on rank 1" in str(err)
    assert "deliberate failure on rank 1" in str(err)
    assert "Traceback" in str(err) and "workers.py" in str(err)
    # The group is still usable afterwards.
    assert actor.fail_on(5) == [0, 1]


def test_a_dead_worker_makes_calls_raise_quickly(colocated: RayWorkerGroup) -> None:
    """Last in this file: it kills the module's group (a group of its own would cost two more
    worker processes)."""
    ref = colocated.spawn({"ref"})["ref"]
    assert ref.all_reduce_sum(1.0) == [3.0, 3.0]
    start = time.monotonic()
    # Rank 1 exits hard while rank 0 waits for it in a barrier.
    with pytest.raises(WorkerDiedError) as info:
        ref.die_on(1)
    assert info.value.rank == 1 and info.value.method == "die_on"
    assert time.monotonic() - start < 60
    # A worker killed from outside: the next call raises too, and fast.
    ray.kill(colocated.actors[0], no_restart=True)
    start = time.monotonic()
    with pytest.raises(WorkerDiedError):
        ref.ping()
    assert time.monotonic() - start < 60
