"""Unit tests for `compute_rloo_advantages` and `compute_reinforce_plus_plus_advantages` in
`hybrid.algorithms.advantages` against hand-computed values: the leave-one-out baseline,
groups of one, non-contiguous groups; discounted returns-to-go, their whitening, padding and
a mask with a hole (skipped, not reset)."""

import math

import pytest
import torch

from hybrid.algorithms.advantages import (
    compute_reinforce_plus_plus_advantages,
    compute_rloo_advantages,
)

pytestmark = pytest.mark.unit

# group "a": 1, 2, 3; group "b": 1, 5; group "c": 7 alone
SCORES = torch.tensor([1.0, 2.0, 3.0, 1.0, 5.0, 7.0])
UIDS = ["a", "a", "a", "b", "b", "c"]
# a: 1 - (2 + 3) / 2 = -1.5; 2 - (1 + 3) / 2 = 0; 3 - (1 + 2) / 2 = 1.5
#    (= 3 / 2 * (s - 2): -1.5, 0, 1.5)
# b: 1 - 5 = -4; 5 - 1 = 4 (= 2 / 1 * (s - 3)); c: no other row, 0 (verl would keep 7)
EXPECTED_RLOO = [-1.5, 0.0, 1.5, -4.0, 4.0, 0.0]


def test_rloo_by_hand() -> None:
    advantages = compute_rloo_advantages(SCORES, UIDS)
    assert advantages.dtype == torch.float32
    assert advantages.tolist() == EXPECTED_RLOO


def test_rloo_non_contiguous_groups_and_tensor_uids() -> None:
    # the same rows interleaved: a b a c b a
    scores = torch.tensor([1.0, 1.0, 2.0, 7.0, 5.0, 3.0])
    uids = torch.tensor([0, 1, 0, 2, 1, 0])
    assert compute_rloo_advantages(scores, uids).tolist() == [-1.5, -4.0, 0.0, 0.0, 4.0, 1.5]


def test_rloo_is_not_grpo() -> None:
    # the Dr.GRPO advantage of group "b" would be 1 - 3 = -2, RLOO's is twice that
    advantages = compute_rloo_advantages(torch.tensor([1.0, 5.0], requires_grad=True), [0, 0])
    assert advantages.tolist() == [-4.0, 4.0]
    assert not advantages.requires_grad


def test_rloo_bad_inputs_raise() -> None:
    with pytest.raises(ValueError, match="group_ids"):
        compute_rloo_advantages(SCORES, UIDS[:5])
    with pytest.raises(ValueError, match="1-D"):
        compute_rloo_advantages(SCORES.unsqueeze(0), UIDS)
    assert compute_rloo_advantages(torch.zeros(0), []).shape == (0,)


# row 0: three valid tokens with a KL-like -0.1 on t=0 and the outcome 1 on t=2; 5 is padding
# row 1: two valid tokens, outcome 2 on t=1
REWARDS = torch.tensor([[-0.1, 0.0, 1.0, 5.0], [0.0, 2.0, 0.0, 0.0]])
MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])


def _whiten_by_hand(returns: list[float]) -> list[float]:
    mean = sum(returns) / len(returns)
    var = sum((g - mean) ** 2 for g in returns) / (len(returns) - 1)  # unbiased
    return [(g - mean) / math.sqrt(var + 1e-8) for g in returns]


def test_reinforce_plus_plus_by_hand() -> None:
    # gamma 0.5: row 0: G2 = 1, G1 = 0 + 0.5 * 1 = 0.5, G0 = -0.1 + 0.5 * 0.5 = 0.15
    #            row 1: G1 = 2, G0 = 0 + 0.5 * 2 = 1
    # valid G 0.15, 0.5, 1, 1, 2: mean 4.65 / 5 = 0.93; deviations -0.78, -0.43, 0.07,
    # 0.07, 1.07; squares sum 1.948; unbiased var 1.948 / 4 = 0.487, std 0.6978539
    advantages = compute_reinforce_plus_plus_advantages(REWARDS, MASK, gamma=0.5)
    assert advantages.dtype == torch.float32
    expected = torch.tensor(
        [[-1.1177125, -0.6161749, 0.1003075, 0.0], [0.1003075, 1.5332723, 0.0, 0.0]]
    )  # -0.78 / 0.6978539, -0.43 / 0.6978539, ...
    torch.testing.assert_close(advantages, expected)
    assert _whiten_by_hand([0.15, 0.5, 1.0, 1.0, 2.0])[4] == pytest.approx(1.5332723)


def test_reinforce_plus_plus_gamma_one() -> None:
    # gamma 1: row 0: G = 0.9, 1, 1; row 1: G = 2, 2
    advantages = compute_reinforce_plus_plus_advantages(REWARDS, MASK, gamma=1.0)
    a = _whiten_by_hand([0.9, 1.0, 1.0, 2.0, 2.0])
    expected = torch.tensor([[a[0], a[1], a[2], 0.0], [a[3], a[4], 0.0, 0.0]])
    torch.testing.assert_close(advantages, expected)


def test_reinforce_plus_plus_padding_does_not_leak() -> None:
    rewards = REWARDS.clone()
    rewards[~MASK.bool()] = float("nan")
    torch.testing.assert_close(
        compute_reinforce_plus_plus_advantages(rewards, MASK, 0.5),
        compute_reinforce_plus_plus_advantages(REWARDS, MASK, 0.5),
    )


def test_reinforce_plus_plus_skips_a_hole() -> None:
    # row 0 mask 1 0 1 (t=1 an observation token with r 3), gamma 0.5; row 1 one token r 2
    #   row 0: G2 = 1; t=1 skipped; G0 = 0 + 0.5 * G2 = 0.5   (verl resets: G0 = 0)
    # valid G 0.5, 1, 2: mean 7/6; deviations -2/3, -1/6, 5/6; squares sum 7/6;
    # unbiased var 7/12 = 0.5833333, std 0.7637626 -> -0.8728716, -0.2182179, 1.0910894
    # (verl's G 0, 1, 2 would whiten to -1, 0, 1)
    rewards = torch.tensor([[0.0, 3.0, 1.0], [2.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 0, 1], [1, 0, 0]])
    advantages = compute_reinforce_plus_plus_advantages(rewards, mask, gamma=0.5)
    expected = torch.tensor([[-0.8728716, 0.0, -0.2182179], [1.0910894, 0.0, 0.0]])
    torch.testing.assert_close(advantages, expected)


def test_reinforce_plus_plus_bad_inputs_raise() -> None:
    with pytest.raises(ValueError, match=r"algorithm\.gamma .*got 0"):
        compute_reinforce_plus_plus_advantages(REWARDS, MASK, gamma=0.0)
    with pytest.raises(ValueError, match="shape"):
        compute_reinforce_plus_plus_advantages(REWARDS, MASK[:, :3], gamma=1.0)
