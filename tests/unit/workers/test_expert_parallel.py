"""The index arithmetic of expert-parallel token dispatch (hybrid.workers.expert_parallel):
pure functions, checked against a loop that spells the layouts out."""

from __future__ import annotations

import pytest
import torch

from hybrid.model_families import check_expert_count
from hybrid.workers.expert_parallel import (
    expert_major_order,
    expert_mesh_shape,
    inverse_permutation,
    rank_splits,
)

pytestmark = pytest.mark.unit


def _expert_major_by_loop(received: torch.Tensor) -> list[int]:
    """Sender-major rows listed expert-major, the long way."""
    senders, experts = received.shape
    start, starts = 0, {}
    for s in range(senders):
        for e in range(experts):
            starts[s, e] = start
            start += int(received[s, e])
    return [
        starts[s, e] + i
        for e in range(experts)
        for s in range(senders)
        for i in range(int(received[s, e]))
    ]


@pytest.mark.parametrize(
    "received",
    [
        [[2, 1], [0, 3]],  # a sender with no row for an expert
        [[0, 0], [0, 0]],  # nothing arrives
        [[1, 0, 2], [0, 0, 0], [4, 1, 0]],  # a sender with nothing at all
        [[5]],  # one rank, one expert
    ],
)
def test_rows_regroup_from_sender_major_to_expert_major(received: list[list[int]]) -> None:
    counts = torch.tensor(received)
    order = expert_major_order(counts)
    assert order.tolist() == _expert_major_by_loop(counts)
    assert sorted(order.tolist()) == list(range(int(counts.sum())))  # a permutation


def test_inverse_permutation_undoes_it() -> None:
    order = torch.randperm(17, generator=torch.Generator().manual_seed(0))
    rows = torch.arange(17) * 10
    assert torch.equal(rows[order][inverse_permutation(order)], rows)


def test_rows_per_rank_sum_the_experts_each_rank_owns() -> None:
    counts = torch.tensor([3, 0, 1, 4, 2, 2])  # 6 experts over 3 ranks: 2 each
    assert rank_splits(counts, 3).tolist() == [3, 5, 4]
    assert rank_splits(counts, 1).tolist() == [12]


def test_bad_expert_parallel_sizes_are_named() -> None:
    assert expert_mesh_shape(8, 4) == (2, 4)
    assert expert_mesh_shape(2, 2) == (1, 2)
    with pytest.raises(
        ValueError, match=r"actor\.ep_size \(3\) must divide .* trainer workers \(8\)"
    ):
        expert_mesh_shape(8, 3)
    check_expert_count(128, 8, "model.path (m)")
    with pytest.raises(
        ValueError, match=r"actor\.ep_size \(3\) .* experts of model\.path \(m\) \(128\)"
    ):
        check_expert_count(128, 3, "model.path (m)")
