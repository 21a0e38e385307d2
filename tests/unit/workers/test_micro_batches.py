"""Token-budget micro-batches: every row once, every part within the budget and non-empty,
near-equal token sums, and a clear error when one row alone exceeds the budget."""

from __future__ import annotations

import random

import pytest
import torch

from hybrid.workers.micro_batches import (
    balanced_partition,
    fixed_micro_batches,
    parts_needed,
    token_budget_micro_batches,
)

pytestmark = pytest.mark.unit


def test_fixed_micro_batches_cover_the_rows_in_order() -> None:
    assert fixed_micro_batches(5, 2) == [[0, 1], [2, 3], [4]]


@pytest.mark.parametrize("seed", range(5))
def test_token_budget_parts_fit_cover_every_row_and_balance(seed: int) -> None:
    rng = random.Random(seed)
    # GSM8K-like spread: prompts 60-250 tokens, responses 20-400.
    lengths = [rng.randint(60, 250) + rng.randint(20, 400) for _ in range(64)]
    budget = 2048
    parts = token_budget_micro_batches(lengths, budget, "f", torch.device("cpu"))
    assert sorted(i for part in parts for i in part) == list(range(len(lengths)))
    sums = [sum(lengths[i] for i in part) for part in parts]
    assert all(0 < s <= budget for s in sums)
    assert all(part == sorted(part) and part for part in parts)
    # Few parts: at most one more than the ideal count.
    assert len(parts) <= -(-sum(lengths) // budget) + 1
    # Near-equal loads: the spread is below one longest row.
    assert max(sums) - min(sums) <= max(lengths)


def test_every_part_gets_a_row_even_with_zero_lengths() -> None:
    assert sorted(map(len, balanced_partition([0, 0, 0], 3))) == [1, 1, 1]
    with pytest.raises(ValueError, match="cannot split 2 rows into 3 non-empty parts"):
        balanced_partition([1, 2], 3)


def test_parts_needed_grows_until_every_part_fits() -> None:
    # Sum 30 over budget 10 is 3 parts by count, but 9 + 9 + 9 + 3 cannot fit in 3 of 10.
    assert parts_needed([9, 9, 9, 3], 10, "f") == 4
    assert parts_needed([1, 1, 1], 100, "f") == 1


def test_a_row_longer_than_the_budget_is_named() -> None:
    with pytest.raises(
        ValueError, match=r"actor\.ppo_max_token_len_per_gpu=100 .*row 1, which has 150"
    ):
        parts_needed([50, 150, 20], 100, "actor.ppo_max_token_len_per_gpu")
