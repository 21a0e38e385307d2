"""Ulysses' pure rules: which head counts split over sp ranks, the padded row length, and that
repeating kv heads for sp hands each rank the kv head its query heads use under GQA."""

from __future__ import annotations

import pytest
import torch

from hybrid.workers.ulysses import check_head_rule, padded_length, repeat_kv_for_sp

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("q_heads", "kv_heads", "sp"),
    [(4, 4, 2), (4, 2, 2), (4, 1, 2), (4, 1, 4), (4, 2, 4), (8, 8, 4), (2, 2, 2), (4, 4, 1)],
)
def test_head_rule_accepts(q_heads: int, kv_heads: int, sp: int) -> None:
    check_head_rule(q_heads, kv_heads, sp)


@pytest.mark.parametrize(
    ("q_heads", "kv_heads", "sp", "words"),
    [
        (6, 2, 4, "sp to divide the query heads"),
        (2, 1, 4, "sp to divide the query heads"),
        (12, 3, 2, "divide the kv heads"),
        (12, 6, 4, "divide the kv heads"),
    ],
)
def test_head_rule_refuses_naming_the_numbers(
    q_heads: int, kv_heads: int, sp: int, words: str
) -> None:
    with pytest.raises(ValueError, match=words) as error:
        check_head_rule(q_heads, kv_heads, sp)
    message = str(error.value)
    assert f"q_heads={q_heads}" in message and f"sp={sp}" in message
    if "kv" in words:
        assert f"kv_heads={kv_heads}" in message


@pytest.mark.parametrize(
    ("tokens", "sp", "padded"), [(45, 2, 46), (45, 4, 48), (48, 4, 48), (1, 4, 4), (0, 2, 0)]
)
def test_padded_length(tokens: int, sp: int, padded: int) -> None:
    assert padded_length(tokens, sp) == padded


@pytest.mark.parametrize(
    ("q_heads", "kv_heads", "sp"), [(4, 1, 4), (4, 2, 4), (8, 2, 4), (4, 1, 2)]
)
def test_repeat_kv_gives_each_rank_its_query_heads_kv_head(
    q_heads: int, kv_heads: int, sp: int
) -> None:
    kv = torch.arange(kv_heads, dtype=torch.float32).reshape(1, kv_heads, 1, 1).expand(-1, -1, 3, 2)
    repeated = repeat_kv_for_sp(kv, sp)
    assert repeated.shape == (1, sp, 3, 2)
    group = q_heads // kv_heads  # GQA: query head h reads kv head h // group
    per_rank = q_heads // sp
    for rank in range(sp):
        assert torch.all(repeated[0, rank] == rank * per_rank // group)
        # every query head on this rank reads that same kv head
        assert {h // group for h in range(rank * per_rank, (rank + 1) * per_rank)} == {
            rank * per_rank // group
        }


def test_repeat_kv_leaves_divisible_heads_alone() -> None:
    kv = torch.randn(1, 4, 3, 2)
    assert repeat_kv_for_sp(kv, 2) is kv
    assert repeat_kv_for_sp(kv, 4) is kv
    with pytest.raises(ValueError, match="kv_heads=3"):
        repeat_kv_for_sp(torch.randn(1, 3, 3, 2), 2)
