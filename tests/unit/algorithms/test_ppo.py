"""Unit tests for `hybrid.algorithms.ppo.ppo_clip_loss` against hand-computed per-token losses:
ratios inside and outside the clip range for both advantage signs, masking, advantage
broadcast, the `num_tokens` denominator across micro-batches, gradients and metrics."""

import math

import pytest
import torch

from hybrid.algorithms.ppo import ppo_clip_loss

pytestmark = pytest.mark.unit

EPS = 0.2
# ratio, advantage, per-token loss -max(-A r, -A clip(r)) worked out by hand, clipped?
CASES = [
    (1.1, 2.0, -2.2, False),  # inside the range: -A r
    (1.5, 2.0, -2.4, True),  # A > 0, r above 1 + eps: -A (1 + eps)
    (0.5, 2.0, -1.0, False),  # A > 0, r below 1 - eps: the pessimistic -A r wins
    (0.5, -1.0, 0.8, True),  # A < 0, r below 1 - eps: -A (1 - eps)
    (1.5, -1.0, 1.5, False),  # A < 0, r above 1 + eps: the pessimistic -A r wins
    (0.9, -1.0, 0.9, False),  # inside the range
]
RATIOS = torch.tensor([[c[0] for c in CASES]], dtype=torch.float64)  # (1, 6)
ADVANTAGES = torch.tensor([[c[1] for c in CASES]], dtype=torch.float64)
PER_TOKEN = [c[2] for c in CASES]
CLIPPED = [c[3] for c in CASES]


def inputs(ratios: torch.Tensor = RATIOS) -> tuple[torch.Tensor, torch.Tensor]:
    """(log_prob, old_log_prob) with exp(log_prob - old_log_prob) == ratios."""
    old = torch.linspace(-2.0, -0.5, ratios.numel(), dtype=torch.float64).reshape(ratios.shape)
    return old + ratios.log(), old


def test_hand_computed_loss_and_metrics() -> None:
    log_prob, old = inputs()
    loss, metrics = ppo_clip_loss(log_prob, old, ADVANTAGES, torch.ones(1, 6), EPS)
    assert sum(PER_TOKEN) == pytest.approx(-2.4)
    assert loss.item() == pytest.approx(-2.4 / 6)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(2 / 6)
    expected_kl = -sum(math.log(c[0]) for c in CASES) / 6  # 0.0975691
    assert metrics["actor/ppo_kl"] == pytest.approx(expected_kl)
    assert set(metrics) == {"actor/pg_clipfrac", "actor/ppo_kl"}


@pytest.mark.parametrize("i", range(len(CASES)))
def test_each_case_alone(i: int) -> None:
    ratio, advantage, per_token, clipped = CASES[i]
    log_prob, old = inputs(torch.tensor([[ratio]], dtype=torch.float64))
    loss, metrics = ppo_clip_loss(
        log_prob, old, torch.tensor([[advantage]], dtype=torch.float64), torch.ones(1, 1), EPS
    )
    assert loss.item() == pytest.approx(per_token)
    assert metrics["actor/pg_clipfrac"] == (1.0 if clipped else 0.0)


def test_gradient_flows_only_through_unclipped_unmasked_tokens() -> None:
    log_prob, old = inputs()
    log_prob.requires_grad_(True)
    mask = torch.tensor([[1, 1, 1, 1, 1, 0]])
    loss, _ = ppo_clip_loss(log_prob, old, ADVANTAGES, mask, EPS)
    loss.backward()
    # d(-A r)/d log_prob = -A r, over 5 tokens; clipped tokens and the masked one get 0
    expected = torch.tensor([[-2.2 / 5, 0.0, -1.0 / 5, 0.0, 1.5 / 5, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(log_prob.grad, expected)


def test_masked_tokens_are_ignored() -> None:
    log_prob, old = inputs()
    # two extra tokens with absurd values, masked out
    wide_log_prob = torch.cat([log_prob, torch.tensor([[5.0, -5.0]], dtype=torch.float64)], 1)
    wide_old = torch.cat([old, torch.zeros(1, 2, dtype=torch.float64)], 1)
    wide_adv = torch.cat([ADVANTAGES, torch.tensor([[1e3, -1e3]], dtype=torch.float64)], 1)
    mask = torch.tensor([[1] * 6 + [0, 0]])
    loss, metrics = ppo_clip_loss(wide_log_prob, wide_old, wide_adv, mask, EPS)
    assert loss.item() == pytest.approx(-2.4 / 6)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(2 / 6)
    assert metrics["actor/ppo_kl"] == pytest.approx(-sum(math.log(c[0]) for c in CASES) / 6)


def test_per_row_advantages_broadcast_over_tokens() -> None:
    ratios = torch.tensor([[1.1, 1.5, 0.5], [0.5, 1.5, 0.9]], dtype=torch.float64)
    log_prob, old = inputs(ratios)
    mask = torch.ones(2, 3)
    row_adv = torch.tensor([2.0, -1.0], dtype=torch.float64)
    loss, metrics = ppo_clip_loss(log_prob, old, row_adv, mask, EPS)
    full_loss, full_metrics = ppo_clip_loss(
        log_prob, old, row_adv.unsqueeze(-1).expand(2, 3), mask, EPS
    )
    # same six cases as CASES, laid out as two rows
    assert loss.item() == pytest.approx(-2.4 / 6)
    assert loss.item() == pytest.approx(full_loss.item())
    assert metrics == pytest.approx(full_metrics)


def test_num_tokens_micro_batches_add_up_to_the_full_batch() -> None:
    ratios = torch.tensor(
        [[1.1, 1.5, 0.5, 0.9], [0.5, 1.5, 0.9, 1.3], [1.05, 0.7, 1.25, 0.6]],
        dtype=torch.float64,
    )
    log_prob, old = inputs(ratios)
    adv = torch.tensor([2.0, -1.0, 0.5], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 1, 0]])
    total = int(mask.sum())  # 8
    full, _ = ppo_clip_loss(log_prob, old, adv, mask, EPS)
    first, _ = ppo_clip_loss(log_prob[:1], old[:1], adv[:1], mask[:1], EPS, num_tokens=total)
    second, _ = ppo_clip_loss(log_prob[1:], old[1:], adv[1:], mask[1:], EPS, num_tokens=total)
    assert (first + second).item() == pytest.approx(full.item())
    # each micro-batch's own token mean divides by 4, not 8: those would not add up
    own_first, _ = ppo_clip_loss(log_prob[:1], old[:1], adv[:1], mask[:1], EPS)
    own_second, _ = ppo_clip_loss(log_prob[1:], old[1:], adv[1:], mask[1:], EPS)
    assert (own_first + own_second).item() != pytest.approx(full.item())


def test_num_tokens_is_the_denominator() -> None:
    log_prob, old = inputs()
    loss, _ = ppo_clip_loss(log_prob, old, ADVANTAGES, torch.ones(1, 6), EPS, num_tokens=12)
    assert loss.item() == pytest.approx(-2.4 / 12)


def test_all_masked_gives_zero_loss_and_metrics() -> None:
    log_prob, old = inputs()
    loss, metrics = ppo_clip_loss(log_prob, old, ADVANTAGES, torch.zeros(1, 6), EPS)
    assert loss.item() == 0.0
    assert metrics == {"actor/pg_clipfrac": 0.0, "actor/ppo_kl": 0.0}
