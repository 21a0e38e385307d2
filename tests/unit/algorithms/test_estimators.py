"""Unit tests for `hybrid.algorithms.estimators.compute_advantages`, the dispatch on
algorithm.adv_estimator: each estimator gives its own function's result on the same token
rewards (the outcome ones on the per-row sums, so an in-reward KL term counts), gae also
returns the critic's targets, gamma / lam / norm_adv_by_std reach the estimator, and bad
input names the field."""

import pytest
import torch

from hybrid.algorithms.advantages import (
    compute_grpo_advantages,
    compute_reinforce_plus_plus_advantages,
    compute_rloo_advantages,
)
from hybrid.algorithms.estimators import compute_advantages
from hybrid.algorithms.gae import compute_gae_advantages, token_level_rewards

pytestmark = pytest.mark.unit

MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 1]])
UIDS = ["a", "a", "a", "b"]  # rows 0-2 share a prompt; row 3 is alone
SCORES = torch.tensor([1.0, 0.0, 1.0, 1.0])
# KL 0.2 on every token (9 is padding), coefficient 0.5: -0.1 on each valid token
KL = torch.tensor([[0.2, 0.2, 0.2, 9.0], [0.2, 0.2, 9.0, 9.0], [0.2, 9, 9, 9], [0.2] * 4])
TOKEN_REWARDS = token_level_rewards(SCORES, MASK, kl=KL, kl_coef=0.5)
# row 0: -0.1, -0.1, 1 - 0.1 = 0.9 -> sum 0.7;   row 1: -0.1, -0.1 -> -0.2
# row 2: 0.9 -> 0.9;                             row 3: -0.1 x 3, 0.9 -> 0.6
ROW_SUMS = torch.tensor([0.7, -0.2, 0.9, 0.6])
# the critic's values: 0.5 on every valid token; 7 is padding and must not leak
VALUES = torch.where(MASK.bool(), 0.5, 7.0)


def test_the_token_rewards_are_what_the_hand_sums_say() -> None:
    torch.testing.assert_close(TOKEN_REWARDS.sum(-1), ROW_SUMS)


def test_grpo_is_group_normalised_row_sums_kl_included() -> None:
    got = compute_advantages("grpo", TOKEN_REWARDS, MASK, UIDS)
    assert got.returns is None
    torch.testing.assert_close(got.advantages, compute_grpo_advantages(ROW_SUMS, UIDS))
    # group a: 0.7, -0.2, 0.9, mean 1.4 / 3; deviations 0.2333, -0.6667, 0.4333; unbiased
    # std sqrt(0.686667 / 2) = 0.585947; row 3 alone: 0
    torch.testing.assert_close(
        got.advantages, torch.tensor([0.3982157, -1.1377583, 0.7395426, 0.0])
    )


def test_grpo_without_std_sees_the_kl_term() -> None:
    got = compute_advantages("grpo", TOKEN_REWARDS, MASK, UIDS, norm_adv_by_std=False)
    # Dr.GRPO: sums minus the group mean 1.4 / 3
    torch.testing.assert_close(
        got.advantages, torch.tensor([0.7 - 1.4 / 3, -0.2 - 1.4 / 3, 0.9 - 1.4 / 3, 0.0])
    )
    # the outcome scores alone (1, 0, 1; mean 2/3) would give 1/3, -2/3, 1/3
    outcome_only = token_level_rewards(SCORES, MASK)
    no_kl = compute_advantages("grpo", outcome_only, MASK, UIDS, norm_adv_by_std=False)
    torch.testing.assert_close(no_kl.advantages, torch.tensor([1 / 3, -2 / 3, 1 / 3, 0.0]))


def test_outcome_estimators_ignore_the_padding_of_the_token_rewards() -> None:
    padded = torch.where(MASK.bool(), TOKEN_REWARDS, 5.0)
    for estimator in ("grpo", "rloo"):
        torch.testing.assert_close(
            compute_advantages(estimator, padded, MASK, UIDS).advantages,
            compute_advantages(estimator, TOKEN_REWARDS, MASK, UIDS).advantages,
        )


def test_rloo_is_the_leave_one_out_of_the_row_sums() -> None:
    got = compute_advantages("rloo", TOKEN_REWARDS, MASK, UIDS)
    assert got.returns is None
    torch.testing.assert_close(got.advantages, compute_rloo_advantages(ROW_SUMS, UIDS))
    # 0.7 - (-0.2 + 0.9) / 2 = 0.35; -0.2 - (0.7 + 0.9) / 2 = -1.0; 0.9 - (0.7 - 0.2) / 2 = 0.65
    torch.testing.assert_close(got.advantages, torch.tensor([0.35, -1.0, 0.65, 0.0]))


def test_reinforce_plus_plus_is_its_function_with_gamma() -> None:
    got = compute_advantages("reinforce_plus_plus", TOKEN_REWARDS, MASK, UIDS, gamma=0.9)
    assert got.returns is None and got.advantages.shape == MASK.shape
    expected = compute_reinforce_plus_plus_advantages(TOKEN_REWARDS, MASK, 0.9)
    torch.testing.assert_close(got.advantages, expected)
    # gamma reaches the estimator: 1.0 gives another result
    undiscounted = compute_advantages("reinforce_plus_plus", TOKEN_REWARDS, MASK, UIDS)
    assert not torch.allclose(undiscounted.advantages, got.advantages)


@pytest.mark.parametrize(
    ("gamma", "lam", "returns"),
    [
        # lam = 1, gamma = 1: the Monte Carlo returns-to-go, whatever V is
        (
            1.0,
            1.0,
            [[0.7, 0.8, 0.9, 0], [-0.2, -0.1, 0, 0], [0.9, 0, 0, 0], [0.6, 0.7, 0.8, 0.9]],
        ),
        # lam = 0: r_t + gamma * V_{t+1} (V = 0.5; 0 after the last valid token)
        (
            1.0,
            0.0,
            [[0.4, 0.4, 0.9, 0], [0.4, -0.1, 0, 0], [0.9, 0, 0, 0], [0.4, 0.4, 0.4, 0.9]],
        ),
        # lam = 0, gamma = 0.5: r_t + 0.25 before the last token
        (
            0.5,
            0.0,
            [[0.15, 0.15, 0.9, 0], [0.15, -0.1, 0, 0], [0.9, 0, 0, 0], [0.15, 0.15, 0.15, 0.9]],
        ),
    ],
)
def test_gae_returns_the_critic_targets_and_per_token_advantages(
    gamma: float, lam: float, returns: list[list[float]]
) -> None:
    got = compute_advantages("gae", TOKEN_REWARDS, MASK, UIDS, values=VALUES, gamma=gamma, lam=lam)
    assert got.returns is not None
    torch.testing.assert_close(got.returns, torch.tensor(returns))
    advantages, expected_returns = compute_gae_advantages(TOKEN_REWARDS, VALUES, MASK, gamma, lam)
    torch.testing.assert_close(got.returns, expected_returns)
    torch.testing.assert_close(got.advantages, advantages)
    # per token, whitened over the valid ones: mean 0 there, 0 on padding
    assert got.advantages.shape == MASK.shape
    assert got.advantages[~MASK.bool()].abs().max() == 0
    assert got.advantages[MASK.bool()].sum().item() == pytest.approx(0.0, abs=1e-5)


def test_an_unknown_estimator_names_the_field() -> None:
    with pytest.raises(ValueError, match=r"algorithm\.adv_estimator must be one of .*'ppo'"):
        compute_advantages("ppo", TOKEN_REWARDS, MASK, UIDS)


@pytest.mark.parametrize("estimator", ["grpo", "rloo", "reinforce_plus_plus"])
def test_values_for_an_outcome_estimator_are_refused(estimator: str) -> None:
    with pytest.raises(ValueError, match=rf"adv_estimator={estimator}: values unused"):
        compute_advantages(estimator, TOKEN_REWARDS, MASK, UIDS, values=VALUES)


def test_gae_without_values_is_refused() -> None:
    with pytest.raises(ValueError, match=r"adv_estimator=gae: values needed"):
        compute_advantages("gae", TOKEN_REWARDS, MASK, UIDS)
