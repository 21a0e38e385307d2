"""Unit tests for `hybrid.algorithms.policy_loss.aggregate_loss`: every mode on a hand
example, and the micro-batch contract: with global normalisers the micro-batch losses sum to
the full-batch loss (and gradient) whatever the split, which a per-micro-batch mean does not."""

from typing import get_args

import pytest
import torch

from hybrid.algorithms.policy_loss import LOSS_AGG_MODES, aggregate_loss, policy_loss

pytestmark = pytest.mark.unit

# row 0: tokens 1, 2, 3 (len 3); row 1: token 4 (len 1); 9s are padding and must not count
PER_TOKEN = torch.tensor([[1.0, 2.0, 3.0, 9.0], [4.0, 9.0, 9.0, 9.0]])
MASK = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", 2.5),  # (1 + 2 + 3 + 4) / 4 tokens
        ("seq-mean-token-sum", 5.0),  # (6 + 4) / 2 rows
        ("seq-mean-token-mean", 3.0),  # (6 / 3 + 4 / 1) / 2 = (2 + 4) / 2
        ("seq-mean-token-sum-norm", 1.25),  # (6 / 4 + 4 / 4) / 2 = (1.5 + 1) / 2, T = 4
    ],
)
def test_modes_by_hand(mode: str, expected: float) -> None:
    assert aggregate_loss(PER_TOKEN, MASK, mode).item() == pytest.approx(expected)


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", 10 / 8),  # global_tokens = 8
        ("seq-mean-token-sum", 10 / 4),  # global_seqs = 4
        ("seq-mean-token-mean", 6 / 4),  # (2 + 4) / 4
        ("seq-mean-token-sum-norm", 2.5 / 4),  # (1.5 + 1) / 4
    ],
)
def test_global_normalisers(mode: str, expected: float) -> None:
    loss = aggregate_loss(PER_TOKEN, MASK, mode, global_tokens=8, global_seqs=4)
    assert loss.item() == pytest.approx(expected)


def test_padding_with_inf_and_nan_does_not_leak() -> None:
    per_token = PER_TOKEN.clone()
    per_token[0, 3], per_token[1, 1] = float("inf"), float("nan")
    for mode, expected in [("token-mean", 2.5), ("seq-mean-token-mean", 3.0)]:
        assert aggregate_loss(per_token, MASK, mode).item() == pytest.approx(expected)


def test_empty_rows_and_empty_mask() -> None:
    # row 1 has no tokens: token-mean 3 / 2 = 1.5; seq-mean-token-mean 1.5 / 1 row, the empty
    # row counts for nothing (verl's rule; tests/unit/algorithms/test_verl_compat.py)
    per_token, mask = torch.tensor([[1.0, 2.0], [5.0, 5.0]]), torch.tensor([[1, 1], [0, 0]])
    assert aggregate_loss(per_token, mask, "token-mean").item() == pytest.approx(1.5)
    assert aggregate_loss(per_token, mask, "seq-mean-token-mean").item() == pytest.approx(1.5)
    for mode in LOSS_AGG_MODES:
        assert aggregate_loss(per_token, torch.zeros(2, 2), mode).item() == 0.0


# 4 rows, unequal response lengths 1, 3, 2, 4 (10 tokens), padded to T = 4.
# Row i holds the value i + 1 on its tokens: sums 1, 6, 6, 16 = 29.
LENGTHS = [1, 3, 2, 4]
SPLIT_MASK = (torch.arange(4).unsqueeze(0) < torch.tensor(LENGTHS).unsqueeze(1)).long()
SPLIT_VALUES = torch.arange(1.0, 5.0, dtype=torch.float64).unsqueeze(1).expand(4, 4)
TOTAL_TOKENS = 10


def micro_losses(mode: str, rows: int, **normalisers: float) -> list[float]:
    return [
        aggregate_loss(
            SPLIT_VALUES[i : i + rows], SPLIT_MASK[i : i + rows], mode, **normalisers
        ).item()
        for i in range(0, 4, rows)
    ]


def test_token_mean_split_by_hand() -> None:
    assert aggregate_loss(SPLIT_VALUES, SPLIT_MASK, "token-mean").item() == pytest.approx(2.9)
    # micro-batches of 2 with global_tokens = 10: 7 / 10 + 22 / 10 = 2.9
    assert micro_losses("token-mean", 2, global_tokens=10) == pytest.approx([0.7, 2.2])
    # the naive per-micro-batch mean, averaged: (7 / 4 + 22 / 6) / 2 = 2.7083 != 2.9
    naive = micro_losses("token-mean", 2)
    assert sum(naive) / 2 == pytest.approx((7 / 4 + 22 / 6) / 2)
    assert sum(naive) / 2 != pytest.approx(2.9)
    # micro-batches of 1: naive (1 + 2 + 3 + 4) / 4 = 2.5 != 2.9
    assert sum(micro_losses("token-mean", 1)) / 4 == pytest.approx(2.5)


def random_policy_inputs() -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(0)
    old = -torch.rand(4, 4, generator=generator, dtype=torch.float64) * 3
    log_prob = old + torch.randn(4, 4, generator=generator, dtype=torch.float64) * 0.3
    advantages = torch.randn(4, generator=generator, dtype=torch.float64)
    return log_prob, old, advantages


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("rows", [1, 2, 4])
def test_micro_batch_losses_and_gradients_sum_to_the_full_batch(mode: str, rows: int) -> None:
    log_prob, old, advantages = random_policy_inputs()
    full_lp = log_prob.clone().requires_grad_(True)
    norms = {"global_tokens": float(TOTAL_TOKENS), "global_seqs": 4.0}
    full, _ = policy_loss(full_lp, old, advantages, SPLIT_MASK, loss_agg_mode=mode)
    full.backward()

    split_lp = log_prob.clone().requires_grad_(True)
    total = torch.zeros((), dtype=torch.float64)
    for rs in (slice(i, i + rows) for i in range(0, 4, rows)):
        micro, _ = policy_loss(
            split_lp[rs], old[rs], advantages[rs], SPLIT_MASK[rs], loss_agg_mode=mode, **norms
        )
        micro.backward()  # gradient accumulation
        total = total + micro.detach()
    assert abs(total.item() - full.item()) < 1e-6
    assert split_lp.grad is not None and full_lp.grad is not None
    torch.testing.assert_close(split_lp.grad, full_lp.grad, atol=1e-6, rtol=0)

    if mode == "token-mean" and rows < 4:
        # the naive alternative: each micro-batch normalised by its own tokens, then averaged
        naive = [
            policy_loss(log_prob[rs], old[rs], advantages[rs], SPLIT_MASK[rs])[0].item()
            for rs in (slice(i, i + rows) for i in range(0, 4, rows))
        ]
        assert abs(sum(naive) / len(naive) - full.item()) > 1e-3


def test_ranks_times_world_size_average_to_the_full_loss() -> None:
    # 2 ranks with 2 rows each, global_tokens = 10 over both: FSDP averages gradients over
    # ranks, so each rank scales by world size 2: (2 * 0.7 + 2 * 2.2) / 2 = 2.9
    rank_losses = micro_losses("token-mean", 2, global_tokens=TOTAL_TOKENS)
    assert sum(2 * loss for loss in rank_losses) / 2 == pytest.approx(2.9)


def test_unknown_mode_and_bad_arguments_raise() -> None:
    with pytest.raises(ValueError, match="loss_agg_mode") as info:
        aggregate_loss(PER_TOKEN, MASK, "seq-sum")
    for mode in LOSS_AGG_MODES:
        assert mode in str(info.value)
    with pytest.raises(ValueError, match="global_tokens"):
        aggregate_loss(PER_TOKEN, MASK, "token-mean", global_tokens=0)
    with pytest.raises(ValueError, match="global_seqs"):
        aggregate_loss(PER_TOKEN, MASK, "seq-mean-token-sum", global_seqs=-1)
    with pytest.raises(ValueError, match="mask"):
        aggregate_loss(PER_TOKEN, MASK[:, :2], "token-mean")


def test_modes_match_the_actor_config() -> None:
    from hybrid.workers.config import LossAggMode

    assert set(get_args(LossAggMode)) == set(LOSS_AGG_MODES)
