"""SFT's cross-entropy by hand: a token mean over the masked tokens with the step's global
normaliser, rows without a target adding nothing, and micro-batches that add up to the step."""

from __future__ import annotations

import math

import pytest
import torch

from hybrid.algorithms.sft_loss import sft_loss

pytestmark = pytest.mark.unit


def test_the_loss_is_the_mean_negative_log_prob_of_the_masked_tokens() -> None:
    log_probs = torch.log(torch.tensor([[0.5, 0.25, 0.9], [0.125, 0.8, 0.7]]))
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    loss, metrics = sft_loss(log_probs, mask, global_tokens=3)
    expected = (math.log(2) + math.log(4) + math.log(8)) / 3  # 0.9, 0.8, 0.7 are masked
    assert float(loss) == pytest.approx(expected)
    assert metrics == {"sft/micro_tokens": 3.0}


def test_rows_without_a_target_and_an_empty_step_add_nothing() -> None:
    log_probs = torch.log(torch.tensor([[0.5, 0.5], [0.1, 0.1]]))
    with_empty_row = sft_loss(log_probs, torch.tensor([[1, 0], [0, 0]]), global_tokens=1)[0]
    assert float(with_empty_row) == pytest.approx(math.log(2))
    empty, metrics = sft_loss(log_probs, torch.zeros(2, 2, dtype=torch.long), global_tokens=0)
    assert float(empty) == 0.0 and metrics["sft/micro_tokens"] == 0.0


def test_a_single_token_row() -> None:
    loss, _ = sft_loss(torch.log(torch.tensor([[0.25]])), torch.tensor([[1]]), global_tokens=1)
    assert float(loss) == pytest.approx(math.log(4))


def test_micro_batches_with_the_global_normaliser_add_up_to_the_whole_step() -> None:
    g = torch.Generator().manual_seed(0)
    log_probs = -torch.rand(6, 5, generator=g, dtype=torch.float64).requires_grad_()
    mask = (torch.rand(6, 5, generator=g) > 0.4).long()
    tokens = float(mask.sum())
    whole, _ = sft_loss(log_probs, mask, tokens)
    parts = [sft_loss(log_probs[i : i + 2], mask[i : i + 2], tokens)[0] for i in (0, 2, 4)]
    assert float(sum(parts).detach()) == pytest.approx(float(whole.detach()))
    # Each token's gradient is -1 / (the step's tokens), wherever its micro-batch: a long row
    # does not weigh more than the tokens it holds.
    (grad,) = torch.autograd.grad(whole, log_probs)
    assert torch.allclose(grad, -mask.double() / tokens)
