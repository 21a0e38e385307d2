"""Unit tests for `hybrid.algorithms.gae` against hand-computed values: the outcome score on
the last valid token and the in-reward KL term, masked whitening (unbiased variance), GAE for
several gamma/lam, one-token and fully masked rows, masks with holes, padding that must not
leak, and the gamma/lam validation."""

import math

import pytest
import torch

from hybrid.algorithms.gae import compute_gae_advantages, masked_whiten, token_level_rewards

pytestmark = pytest.mark.unit

NAN = float("nan")
# row 0: three valid tokens; row 1: a one-token response; row 2: fully masked
MASK = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]])
# outcome 1 on row 0's last valid token (t = 2), 2 on row 1's only token; 5 and 3 are padding
REWARDS = torch.tensor([[0.0, 0.0, 1.0, 5.0], [2.0, 0.0, 0.0, 0.0], [3.0, 3.0, 3.0, 3.0]])
# the critic's values; 9 and NaN are padding and must not leak into valid tokens
VALUES = torch.tensor([[0.5, 0.6, 0.7, 9.0], [0.5, NAN, 9.0, 9.0], [9.0, NAN, 9.0, 9.0]])


def test_score_goes_on_the_last_valid_token() -> None:
    scores = torch.tensor([1.0, 0.5, 2.0])
    rewards = token_level_rewards(scores, MASK)
    assert rewards.dtype == torch.float32
    # row 0: last valid index 3 - 1 = 2; row 1: index 0; row 2: no valid token, no score
    expected = [[0.0, 0.0, 1.0, 0.0], [0.5, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]
    assert rewards.tolist() == expected


def test_score_on_the_last_one_of_a_mask_with_a_hole() -> None:
    # mask 1 1 0 1: the last valid token is t = 3, not mask.sum() - 1 = 2
    rewards = token_level_rewards(torch.tensor([4.0]), torch.tensor([[1, 1, 0, 1]]))
    assert rewards.tolist() == [[0.0, 0.0, 0.0, 4.0]]


def test_kl_penalty_on_valid_tokens_only() -> None:
    scores = torch.tensor([1.0, 0.5, 2.0])
    kl = torch.tensor([[0.1, 0.2, 0.3, NAN], [0.4, 9.0, 9.0, 9.0], [9.0, 9.0, 9.0, 9.0]])
    rewards = token_level_rewards(scores, MASK, kl=kl, kl_coef=0.5)
    # row 0: -0.5 * (0.1, 0.2, 0.3) + (0, 0, 1) = -0.05, -0.1, 0.85; padding 0, not NaN
    # row 1: 0.5 - 0.5 * 0.4 = 0.3; row 2: fully masked, no penalty either
    expected = torch.tensor([[-0.05, -0.1, 0.85, 0.0], [0.3, 0.0, 0.0, 0.0], [0.0] * 4])
    torch.testing.assert_close(rewards, expected)
    # kl_coef 0 leaves the outcome rewards alone
    assert (
        token_level_rewards(scores, MASK, kl, 0.0).tolist()
        == token_level_rewards(scores, MASK).tolist()
    )


def test_masked_whiten_uses_the_unbiased_variance() -> None:
    values = torch.tensor([[1.0, 2.0, 3.0, 100.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    # mean (1 + 2 + 3) / 3 = 2; unbiased var (1 + 0 + 1) / (3 - 1) = 1 (biased: 2/3)
    scale = 1 / math.sqrt(1 + 1e-8)
    torch.testing.assert_close(
        masked_whiten(values, mask), torch.tensor([[-scale, 0.0, scale, 0.0]])
    )
    # shift_mean=False adds the mean back: -1 + 2, 0 + 2, 1 + 2; padding still 0
    torch.testing.assert_close(
        masked_whiten(values, mask, shift_mean=False),
        torch.tensor([[2 - scale, 2.0, 2 + scale, 0.0]]),
    )


def test_masked_whiten_of_one_and_of_no_element() -> None:
    # n = 1: variance 0 by definition, (x - mean) = 0 -> 0; n = 0: all zeros, no NaN
    one = masked_whiten(torch.tensor([[5.0, 7.0]]), torch.tensor([[1, 0]]))
    none = masked_whiten(torch.tensor([[5.0, 7.0]]), torch.tensor([[0, 0]]))
    assert one.tolist() == [[0.0, 0.0]]
    assert none.tolist() == [[0.0, 0.0]]


# Raw GAE advantages of the valid tokens, and returns = raw A + V (V: 0.5, 0.6, 0.7 | 0.5).
# Row 1 (one token, r = 2, V = 0.5, V after the end 0): A = 2 + 0 - 0.5 = 1.5 for any
# gamma and lam; return 2.0. Row 2 is fully masked: zeros.
CASES = [
    # gamma = 1, lam = 1: Monte Carlo return minus V.
    #   t=2: 1 + 0 - 0.7 = 0.3; t=1: (0 + 0.7 - 0.6) + 0.3 = 0.4; t=0: (0.6 - 0.5) + 0.4 = 0.5
    (1.0, 1.0, [0.5, 0.4, 0.3], [1.0, 1.0, 1.0]),
    # gamma = 1, lam = 0: one-step TD errors 0.6 - 0.5, 0.7 - 0.6, 1 - 0.7
    (1.0, 0.0, [0.1, 0.1, 0.3], [0.6, 0.7, 1.0]),
    # gamma = 0.9, lam = 0.8 (gamma * lam = 0.72):
    #   t=2: delta 1 - 0.7 = 0.3, A 0.3
    #   t=1: delta 0.9 * 0.7 - 0.6 = 0.03, A 0.03 + 0.72 * 0.3 = 0.246
    #   t=0: delta 0.9 * 0.6 - 0.5 = 0.04, A 0.04 + 0.72 * 0.246 = 0.21712
    (0.9, 0.8, [0.21712, 0.246, 0.3], [0.71712, 0.846, 1.0]),
]


@pytest.mark.parametrize(("gamma", "lam", "raw_row0", "returns_row0"), CASES)
def test_gae_by_hand(
    gamma: float, lam: float, raw_row0: list[float], returns_row0: list[float]
) -> None:
    advantages, returns = compute_gae_advantages(REWARDS, VALUES, MASK, gamma, lam)
    assert advantages.dtype == returns.dtype == torch.float32
    expected_returns = torch.tensor([[*returns_row0, 0.0], [2.0, 0, 0, 0], [0.0] * 4])
    torch.testing.assert_close(returns, expected_returns)
    raw = torch.tensor([[*raw_row0, 0.0], [1.5, 0, 0, 0], [0.0] * 4])
    torch.testing.assert_close(advantages, masked_whiten(raw, MASK))
    assert torch.isfinite(advantages).all() and torch.isfinite(returns).all()


def test_gae_whitening_by_hand() -> None:
    # gamma = lam = 1: raw valid A = 0.5, 0.4, 0.3 | 1.5; n = 4, mean 2.7 / 4 = 0.675
    # deviations -0.175, -0.275, -0.375, 0.825; squares sum 0.030625 + 0.075625 + 0.140625
    # + 0.680625 = 0.9275; unbiased var 0.9275 / 3 = 0.3091667, std 0.5560276
    advantages, _ = compute_gae_advantages(REWARDS, VALUES, MASK, 1.0, 1.0)
    row0 = [-0.3147326, -0.4945798, -0.6744270, 0.0]  # -0.175 / 0.5560276, ...
    expected = torch.tensor([row0, [1.4837393, 0, 0, 0], [0.0] * 4])  # 0.825 / 0.5560276
    torch.testing.assert_close(advantages, expected)
    # the biased var 0.9275 / 4 would give 0.825 / 0.4815340 = 1.7133
    assert advantages[1, 0].item() != pytest.approx(1.7133, abs=1e-3)


def test_mask_with_a_hole_is_skipped() -> None:
    # mask 1 0 1 0, gamma 0.9, lam 0.8; t=1 is an observation token (r 7, V 9 ignored)
    #   t=2: delta 1 + 0.9 * 0 - 0.7 = 0.3, A 0.3
    #   t=0: next valid is t=2: delta 0.9 * 0.7 - 0.5 = 0.13, A 0.13 + 0.72 * 0.3 = 0.346
    rewards = torch.tensor([[0.0, 7.0, 1.0, 0.0]])
    values = torch.tensor([[0.5, 9.0, 0.7, 0.0]])
    mask = torch.tensor([[1, 0, 1, 0]])
    _, returns = compute_gae_advantages(rewards, values, mask, 0.9, 0.8)
    torch.testing.assert_close(returns, torch.tensor([[0.846, 0.0, 1.0, 0.0]]))  # A + V


def test_padding_does_not_leak() -> None:
    rewards, values = REWARDS.clone(), VALUES.clone()
    rewards[~MASK.bool()] = float("inf")
    values[~MASK.bool()] = -123.0
    for gamma, lam in [(1.0, 1.0), (0.9, 0.8)]:
        clean = compute_gae_advantages(REWARDS, VALUES, MASK, gamma, lam)
        dirty = compute_gae_advantages(rewards, values, MASK, gamma, lam)
        torch.testing.assert_close(dirty, clean)


def test_one_token_batch_and_fully_masked_batch() -> None:
    # a lone one-token response: A = 2 - 0.5 = 1.5, return 2; whitening n = 1 gives 0
    advantages, returns = compute_gae_advantages(
        torch.tensor([[2.0, 0.0]]), torch.tensor([[0.5, 0.0]]), torch.tensor([[1, 0]]), 1, 1
    )
    assert returns.tolist() == [[2.0, 0.0]]
    assert advantages.tolist() == [[0.0, 0.0]]
    advantages, returns = compute_gae_advantages(REWARDS[2:], VALUES[2:], MASK[2:], 0.9, 0.8)
    assert advantages.tolist() == returns.tolist() == [[0.0] * 4]


def test_no_gradient() -> None:
    values = VALUES.clone().requires_grad_(True)
    advantages, returns = compute_gae_advantages(REWARDS, values, MASK, 1.0, 0.95)
    assert not advantages.requires_grad and not returns.requires_grad


@pytest.mark.parametrize(
    ("gamma", "lam", "match"),
    [
        (0.0, 0.95, r"algorithm\.gamma .*got 0\.0"),
        (1.5, 0.95, r"algorithm\.gamma .*got 1\.5"),
        (-0.1, 0.95, r"algorithm\.gamma .*got -0\.1"),
        (1.0, -0.1, r"algorithm\.lam .*got -0\.1"),
        (1.0, 1.01, r"algorithm\.lam .*got 1\.01"),
    ],
)
def test_bad_gamma_and_lam_raise(gamma: float, lam: float, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        compute_gae_advantages(REWARDS, VALUES, MASK, gamma, lam)


def test_bad_shapes_raise() -> None:
    with pytest.raises(ValueError, match="scores"):
        token_level_rewards(torch.tensor([1.0, 2.0]), MASK)
    with pytest.raises(ValueError, match="kl"):
        token_level_rewards(torch.ones(3), MASK, kl=torch.zeros(3, 2), kl_coef=0.1)
    with pytest.raises(ValueError, match="one \\(B, T\\) shape"):
        compute_gae_advantages(REWARDS, VALUES[:, :3], MASK, 1.0, 1.0)
