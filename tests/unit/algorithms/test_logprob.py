"""Unit tests for `hybrid.algorithms.logprob`: log-probs and entropy against hand-computed
values, float32 computation of bf16 logits, and the masked mean."""

import math

import pytest
import torch

from hybrid.algorithms.logprob import entropy_from_logits, log_probs_from_logits, masked_mean

pytestmark = pytest.mark.unit

# softmax([0, ln 2, ln 3]) = [1/6, 2/6, 3/6]
TINY_LOGITS = torch.tensor([[[0.0, math.log(2.0), math.log(3.0)]]])  # (1, 1, 3)


# ---- log_probs_from_logits -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("label", "expected"),
    [(0, -math.log(6.0)), (1, -math.log(3.0)), (2, -math.log(2.0))],
)
def test_log_prob_hand_computed(label: int, expected: float) -> None:
    got = log_probs_from_logits(TINY_LOGITS, torch.tensor([[label]]))
    assert got.shape == (1, 1)
    assert got.item() == pytest.approx(expected, abs=1e-6)


def test_log_probs_pick_each_position_and_shape() -> None:
    logits = torch.randn(2, 3, 5, generator=torch.Generator().manual_seed(0))
    labels = torch.tensor([[0, 4, 2], [1, 1, 3]])
    got = log_probs_from_logits(logits, labels)
    assert got.shape == (2, 3)
    reference = torch.log_softmax(logits.double(), dim=-1)
    for b in range(2):
        for t in range(3):
            assert got[b, t].item() == pytest.approx(reference[b, t, labels[b, t]].item(), abs=1e-6)
    # every label's probability adds up to one at each position
    all_labels = torch.stack(
        [log_probs_from_logits(logits, torch.full((2, 3), v)) for v in range(5)]
    )
    torch.testing.assert_close(all_labels.exp().sum(0), torch.ones(2, 3))


def test_bf16_logits_are_computed_in_float32() -> None:
    # 100 and 100.5 are exact in bf16. log p(1) = -ln(1 + e^-0.5) = -0.474077; a bf16
    # logsumexp rounds 100.974 to 101.0 and would return -0.5.
    logits = torch.tensor([[[100.0, 100.5]]], dtype=torch.bfloat16)
    got = log_probs_from_logits(logits, torch.tensor([[1]]))
    assert got.dtype == torch.float32
    assert got.item() == pytest.approx(-math.log1p(math.exp(-0.5)), abs=1e-5)


def test_bf16_and_float32_of_same_values_agree_exactly() -> None:
    logits = torch.randn(2, 4, 7, generator=torch.Generator().manual_seed(1)).bfloat16()
    labels = torch.randint(0, 7, (2, 4), generator=torch.Generator().manual_seed(2))
    assert torch.equal(
        log_probs_from_logits(logits, labels), log_probs_from_logits(logits.float(), labels)
    )


# ---- entropy_from_logits ---------------------------------------------------------------------


def test_entropy_hand_computed() -> None:
    p = [1 / 6, 2 / 6, 3 / 6]
    expected = -sum(x * math.log(x) for x in p)  # 1.011404
    got = entropy_from_logits(TINY_LOGITS)
    assert got.shape == (1, 1)
    assert got.item() == pytest.approx(expected, abs=1e-6)
    assert expected == pytest.approx(1.011404, abs=1e-6)


@pytest.mark.parametrize("vocab", [2, 10, 1000])
def test_entropy_of_uniform_is_log_vocab(vocab: int) -> None:
    logits = torch.full((2, 3, vocab), 7.25)  # any constant is uniform
    torch.testing.assert_close(entropy_from_logits(logits), torch.full((2, 3), math.log(vocab)))


def test_entropy_of_peaked_distribution_is_near_zero_and_bf16_gives_float32() -> None:
    logits = torch.tensor([[[60.0, 0.0, 0.0, 0.0]]], dtype=torch.bfloat16)
    got = entropy_from_logits(logits)
    assert got.dtype == torch.float32
    assert 0.0 <= got.item() < 1e-20


# ---- masked_mean -----------------------------------------------------------------------------


def test_masked_mean_hand_computed() -> None:
    values = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1, 0, 1], [0, 0, 1]])
    assert masked_mean(values, mask).item() == pytest.approx(10.0 / 3.0)
    assert masked_mean(values, mask.bool()).item() == pytest.approx(10.0 / 3.0)


def test_masked_mean_of_empty_mask_is_zero() -> None:
    values = torch.tensor([[1.0, 2.0]])
    got = masked_mean(values, torch.zeros(1, 2))
    assert got.item() == 0.0
