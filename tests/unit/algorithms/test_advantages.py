"""Unit tests for `hybrid.algorithms.advantages.compute_grpo_advantages` against hand-computed
values: GRPO with the unbiased std, Dr.GRPO, groups of one, equal scores, non-contiguous
groups and the accepted uid containers."""

import math

import numpy as np
import pytest
import torch

from hybrid.algorithms.advantages import compute_grpo_advantages

pytestmark = pytest.mark.unit

EPS = 1e-6
# group "a": scores 1, 2, 3 -> mean 2, deviations -1, 0, 1,
#   unbiased var (1 + 0 + 1) / (3 - 1) = 1, std 1 -> A = -1, 0, 1 (over 1 + eps)
# group "b": scores 1, 5 -> mean 3, deviations -2, 2,
#   unbiased var (4 + 4) / (2 - 1) = 8, std 2*sqrt(2) = 2.828427 -> A = -/+ 0.7071068
#   (the biased std would be 2, giving -/+ 1)
SCORES = torch.tensor([1.0, 2.0, 3.0, 1.0, 5.0])
UIDS = ["a", "a", "a", "b", "b"]
STD_B = 2 * math.sqrt(2)
EXPECTED_GRPO = [-1 / (1 + EPS), 0.0, 1 / (1 + EPS), -2 / (STD_B + EPS), 2 / (STD_B + EPS)]


def test_two_groups_use_the_unbiased_std() -> None:
    advantages = compute_grpo_advantages(SCORES, UIDS)
    assert advantages.dtype == torch.float32
    assert advantages.shape == (5,)
    torch.testing.assert_close(advantages, torch.tensor(EXPECTED_GRPO))
    assert advantages[4].item() == pytest.approx(0.7071068, abs=1e-6)
    assert advantages[4].item() != pytest.approx(1.0)  # not the biased std


def test_matches_torch_std_per_group() -> None:
    generator = torch.Generator().manual_seed(0)
    scores = torch.rand(12, generator=generator, dtype=torch.float64)
    uids = [i % 3 for i in range(12)]
    advantages = compute_grpo_advantages(scores, uids)
    for uid in range(3):
        rows = [i for i in range(12) if uids[i] == uid]
        group = scores[rows]
        expected = (group - group.mean()) / (group.std() + EPS)
        torch.testing.assert_close(advantages[rows], expected.float())


def test_group_of_one_gets_zero_not_nan() -> None:
    # "c" alone: mean 7, deviation 0, unbiased std 0/0 = NaN without the special case
    scores = torch.cat([SCORES, torch.tensor([7.0])])
    advantages = compute_grpo_advantages(scores, [*UIDS, "c"])
    assert advantages[5].item() == 0.0
    assert torch.isfinite(advantages).all()
    torch.testing.assert_close(advantages[:5], torch.tensor(EXPECTED_GRPO))
    for epsilon in (0.0, EPS):
        single = compute_grpo_advantages(torch.tensor([3.0]), ["x"], epsilon=epsilon)
        assert single.tolist() == [0.0]


def test_equal_scores_give_zero() -> None:
    # std 0: deviations are all 0, so 0 / (0 + eps) = 0
    advantages = compute_grpo_advantages(torch.tensor([1.0, 1.0, 1.0]), [0, 0, 0])
    assert advantages.tolist() == [0.0, 0.0, 0.0]


def test_dr_grpo_only_centres() -> None:
    # a: 1, 2, 3 - 2 = -1, 0, 1; b: 1, 5 - 3 = -2, 2; singleton "c": 0
    scores = torch.cat([SCORES, torch.tensor([7.0])])
    advantages = compute_grpo_advantages(scores, [*UIDS, "c"], norm_by_std=False)
    assert advantages.tolist() == [-1.0, 0.0, 1.0, -2.0, 2.0, 0.0]


def test_non_contiguous_groups() -> None:
    # the same rows as SCORES/UIDS, interleaved: a b a b a
    scores = torch.tensor([1.0, 1.0, 2.0, 5.0, 3.0])
    uids = ["a", "b", "a", "b", "a"]
    advantages = compute_grpo_advantages(scores, uids)
    e = EXPECTED_GRPO
    torch.testing.assert_close(advantages, torch.tensor([e[0], e[3], e[1], e[4], e[2]]))


@pytest.mark.parametrize(
    "uids",
    [
        ["3f2a-uid", "3f2a-uid", "3f2a-uid", "9c1b-uid", "9c1b-uid"],  # string uids
        np.array(["p0", "p0", "p0", "p1", "p1"], dtype=object),
        np.array([10, 10, 10, 20, 20]),
        torch.tensor([4, 4, 4, 8, 8]),
        (("q", 0), ("q", 0), ("q", 0), ("q", 1), ("q", 1)),  # any hashable
    ],
)
def test_uid_containers(uids: object) -> None:
    advantages = compute_grpo_advantages(SCORES, uids)  # type: ignore[arg-type]
    torch.testing.assert_close(advantages, torch.tensor(EXPECTED_GRPO))


def test_float64_scores_give_float32_without_grad() -> None:
    scores = SCORES.double().requires_grad_(True)
    advantages = compute_grpo_advantages(scores, UIDS)
    assert advantages.dtype == torch.float32
    assert not advantages.requires_grad


def test_empty_batch() -> None:
    assert compute_grpo_advantages(torch.zeros(0), []).shape == (0,)


def test_bad_inputs_raise() -> None:
    with pytest.raises(ValueError, match="group_ids"):
        compute_grpo_advantages(SCORES, UIDS[:4])
    with pytest.raises(ValueError, match="1-D"):
        compute_grpo_advantages(SCORES.unsqueeze(0), UIDS)
