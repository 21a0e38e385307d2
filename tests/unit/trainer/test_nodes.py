"""Several nodes, the pure parts: the node fields of the config and their rules, ranks numbered
node by node, the HSDP mesh shape, the shared-directory check and an unreachable address."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from hybrid.controller.cluster import check_reachable
from hybrid.controller.resource_pool import Placement, ranks_by_node
from hybrid.trainer.checkpoints import shared_dir_error
from hybrid.trainer.config import TrainerRunConfig
from hybrid.trainer.schema import from_dict
from hybrid.workers.parallel import fsdp_mesh_shape

pytestmark = pytest.mark.unit


def build(trainer: dict, **groups: dict) -> TrainerRunConfig:
    config = {"model": {"path": "m"}, "rollout": {"n": 4}, "trainer": trainer, **groups}
    return from_dict(TrainerRunConfig, config)


def test_two_nodes_of_one_worker_make_one_placement_group_each() -> None:
    config = build({"num_workers": 2, "nnodes": 2, "n_gpus_per_node": 1})
    assert config.trainer.process_on_nodes == [1, 1]
    # n_gpus_per_node left out: num_workers / nnodes.
    assert build({"num_workers": 16, "nnodes": 2}).trainer.process_on_nodes == [8, 8]
    assert build({"num_workers": 8}).trainer.process_on_nodes == [8]


@pytest.mark.parametrize(
    ("trainer", "message"),
    [
        ({"num_workers": 3, "nnodes": 2}, r"trainer.num_workers \(3\) must be divisible by "),
        (
            {"num_workers": 3, "nnodes": 2, "n_gpus_per_node": 1},
            r"trainer.num_workers \(3\) must equal trainer.nnodes x trainer.n_gpus_per_node "
            r"\(2 x 1 = 2\)",
        ),
        ({"num_workers": 2, "n_gpus_per_node": 0}, "trainer.n_gpus_per_node must be >= 1"),
        ({"num_workers": 2, "nnodes": 0}, "trainer.nnodes must be > 0"),
    ],
)
def test_node_counts_that_disagree_are_refused_by_name(trainer: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build(trainer)


def test_a_tensor_parallel_group_never_crosses_a_node() -> None:
    with pytest.raises(ValueError, match=r"rollout.tensor_parallel_size \(2\) must divide the "):
        build({"num_workers": 2, "nnodes": 2}, rollout={"n": 4, "tensor_parallel_size": 2})
    build({"num_workers": 4, "nnodes": 2}, rollout={"n": 4, "tensor_parallel_size": 2})


def test_hsdp_replicas_must_divide_the_workers() -> None:
    with pytest.raises(ValueError, match=r"actor.hsdp_replicas \(3\) must divide"):
        build({"num_workers": 2}, actor={"hsdp_replicas": 3})
    with pytest.raises(ValueError, match=r"actor\.hsdp_replicas must be >= 0 \(0: auto\)"):
        build({"num_workers": 2}, actor={"hsdp_replicas": -1})
    build({"num_workers": 2}, actor={"hsdp_replicas": 0})  # auto: 1 or every worker
    assert fsdp_mesh_shape(4, 1) == ((4,), ("fsdp",))
    assert fsdp_mesh_shape(16, 2) == ((2, 8), ("replicate", "shard"))


def test_ranks_go_node_by_node_wherever_the_bundles_landed() -> None:
    # Two placement groups of two that Ray put on the same node, then one on another.
    assert ranks_by_node(["a", "a", "b", "b"]) == [
        Placement(0, 0, 2),
        Placement(1, 1, 2),
        Placement(2, 0, 2),
        Placement(3, 1, 2),
    ]
    # Interleaved (several entries, two nodes): ranks follow the node, not the bundle list.
    assert ranks_by_node(["a", "b", "a", "b"]) == [
        Placement(0, 0, 2),
        Placement(2, 0, 2),
        Placement(1, 1, 2),
        Placement(3, 1, 2),
    ]
    assert ranks_by_node(["x"]) == [Placement(0, 0, 1)]


def test_the_shared_directory_check_names_the_ranks_and_nodes_that_miss_it(
    tmp_path: Path,
) -> None:
    nodes = ["10.0.0.1 (id aaaa)", "10.0.0.2 (id bbbb)", "10.0.0.2 (id bbbb)"]
    seen: list[Path] = []

    def everyone_sees(marker: Path) -> list[int]:
        seen.append(marker)
        assert marker.is_file()  # written before the workers are asked
        return []

    assert shared_dir_error(tmp_path / "out", everyone_sees, nodes) is None
    assert not seen[0].exists()  # the marker is removed again

    error = shared_dir_error(tmp_path / "out", lambda marker: [1, 2], nodes)
    assert error is not None
    assert "trainer.output_dir" in error and str(tmp_path / "out") in error
    assert "ranks [1, 2]" in error and "10.0.0.2 (id bbbb)" in error
    assert "10.0.0.1" not in error


def test_an_address_nobody_answers_at_fails_within_seconds() -> None:
    with socket.socket() as sock:  # a loopback port that was free: nothing listens there
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    started = time.monotonic()
    with pytest.raises(ConnectionError, match=f"no Ray cluster answers at 127.0.0.1:{port}"):
        check_reachable(f"127.0.0.1:{port}")
    assert time.monotonic() - started < 6
    check_reachable("auto")  # left to Ray
