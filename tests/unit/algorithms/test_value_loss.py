"""Unit tests for `hybrid.algorithms.value_loss` against hand-computed values: the clipped
value loss and its gradient, the clip fraction, aggregation modes and global normalisers,
padding, and the explained variance with its constant-returns case."""

import pytest
import torch

from hybrid.algorithms.value_loss import clipped_value_loss, explained_variance

pytestmark = pytest.mark.unit

NAN = float("nan")
CLIP = 0.2
# token (V, V_old, R) -> V_clip = V_old + clamp(V - V_old, -0.2, 0.2); l = 0.5 * max(u, c)
#  row 0 t=0: (1.5, 1.0, 2.0): V_clip 1.2; u = 0.5^2 = 0.25, c = 0.8^2 = 0.64 -> clipped, 0.32
#  row 0 t=1: (0.9, 1.0, 0.0): inside the clip, V_clip 0.9; u = c = 0.81 -> tie, 0.405
#  row 0 t=2: (0.5, 0.0, 1.0): V_clip 0.2; u = 0.25, c = 0.64 -> clipped, 0.32
#  row 1 t=0: (0.5, 0.0, -1.0): V_clip 0.2; u = 1.5^2 = 2.25, c = 1.2^2 = 1.44 -> u, 1.125
VALUES = torch.tensor([[1.5, 0.9, 0.5, NAN], [0.5, 7.0, 7.0, 7.0]])
OLD_VALUES = torch.tensor([[1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
RETURNS = torch.tensor([[2.0, 0.0, 1.0, 0.0], [-1.0, 0.0, 0.0, 0.0]])
MASK = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])


def test_clipped_value_loss_by_hand() -> None:
    values = VALUES.clone().requires_grad_(True)
    loss, clipfrac = clipped_value_loss(values, OLD_VALUES, RETURNS, MASK, CLIP)
    # token-mean: (0.32 + 0.405 + 0.32 + 1.125) / 4 = 2.17 / 4 = 0.5425
    assert loss.item() == pytest.approx(0.5425)
    # clipped branch strictly larger on 2 of 4 valid tokens (the tie does not count)
    assert clipfrac.item() == pytest.approx(0.5)
    assert clipfrac.dtype == torch.float32 and not clipfrac.requires_grad
    loss.backward()
    assert values.grad is not None
    # dl/dV / 4 tokens: clipped branches are constant in V -> 0; the tie 0.5 * 2 * (0.9 - 0)
    # = 0.9 -> 0.225; the unclipped 0.5 * 2 * (0.5 + 1) = 1.5 -> 0.375; padding 0
    expected_grad = torch.tensor([[0.0, 0.225, 0.0, 0.0], [0.375, 0.0, 0.0, 0.0]])
    torch.testing.assert_close(values.grad, expected_grad)


def test_aggregation_modes_and_global_normalisers() -> None:
    # seq-mean-token-mean: ((0.32 + 0.405 + 0.32) / 3 + 1.125) / 2 = (0.3483333 + 1.125) / 2
    loss, _ = clipped_value_loss(VALUES, OLD_VALUES, RETURNS, MASK, CLIP, "seq-mean-token-mean")
    assert loss.item() == pytest.approx((1.045 / 3 + 1.125) / 2)
    # token-mean over a mini-batch of 8 tokens: 2.17 / 8 = 0.27125
    loss, _ = clipped_value_loss(VALUES, OLD_VALUES, RETURNS, MASK, CLIP, global_tokens=8)
    assert loss.item() == pytest.approx(0.27125)
    # seq-mean-token-sum over 4 sequences: (1.045 + 1.125) / 4 = 0.5425
    loss, _ = clipped_value_loss(
        VALUES, OLD_VALUES, RETURNS, MASK, CLIP, "seq-mean-token-sum", global_seqs=4
    )
    assert loss.item() == pytest.approx(0.5425)


def test_wide_clip_is_plain_mse() -> None:
    # cliprange 10: V_clip = V, l = 0.5 * (V - R)^2: 0.125, 0.405, 0.125 | 1.125; clipfrac 0
    loss, clipfrac = clipped_value_loss(VALUES, OLD_VALUES, RETURNS, MASK, 10.0)
    assert loss.item() == pytest.approx((0.125 + 0.405 + 0.125 + 1.125) / 4)
    assert clipfrac.item() == 0.0


def test_value_loss_bad_inputs_raise() -> None:
    with pytest.raises(ValueError, match="cliprange_value"):
        clipped_value_loss(VALUES, OLD_VALUES, RETURNS, MASK, 0.0)
    with pytest.raises(ValueError, match="one shape"):
        clipped_value_loss(VALUES[:, :3], OLD_VALUES, RETURNS, MASK, CLIP)


# valid returns 1, 2 | 3, 4 (mean 2.5); 99 and NaN are padding
EV_RETURNS = torch.tensor([[1.0, 2.0, 99.0], [3.0, 4.0, NAN]])
EV_MASK = torch.tensor([[1, 1, 0], [1, 1, 0]])


def test_explained_variance_by_hand() -> None:
    # Var[R] = (1.5^2 + 0.5^2 + 0.5^2 + 1.5^2) / 4 = 5 / 4 = 1.25
    # V = 0.5, 2, 3.5, 4: R - V = 0.5, 0, -0.5, 0, mean 0, Var = 0.5 / 4 = 0.125
    # -> 1 - 0.125 / 1.25 = 0.9
    values = torch.tensor([[0.5, 2.0, NAN], [3.5, 4.0, 0.0]])
    assert explained_variance(EV_RETURNS, values, EV_MASK) == pytest.approx(0.9)
    # a perfect critic, or one off by a constant (R - V = -1 everywhere, Var 0): 1.0
    assert explained_variance(EV_RETURNS, EV_RETURNS, EV_MASK) == pytest.approx(1.0)
    assert explained_variance(EV_RETURNS, EV_RETURNS + 1, EV_MASK) == pytest.approx(1.0)
    # V = 2.5 (the mean): R - V has the variance of R -> 0; V = 0: R - V = R, Var 1.25 -> 0
    assert explained_variance(EV_RETURNS, torch.full((2, 3), 2.5), EV_MASK) == pytest.approx(0)
    # V = -R: R - V = 2R, Var 4 * 1.25 = 5 -> 1 - 5 / 1.25 = -3
    assert explained_variance(EV_RETURNS, -EV_RETURNS, EV_MASK) == pytest.approx(-3.0)


def test_explained_variance_without_return_variance_is_zero() -> None:
    constant = torch.full((2, 3), 0.7)
    assert explained_variance(constant, torch.zeros(2, 3), EV_MASK) == 0.0
    one = torch.tensor([[1, 0, 0], [0, 0, 0]])
    assert explained_variance(EV_RETURNS, torch.zeros(2, 3), one) == 0.0
    assert explained_variance(EV_RETURNS, torch.zeros(2, 3), torch.zeros(2, 3)) == 0.0
