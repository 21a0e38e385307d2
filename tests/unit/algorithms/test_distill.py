"""`hybrid.algorithms.distill` on values worked by hand: the reverse-KL advantage, its mix with
the task advantage ((B,) and (B, T)), empty rows, length-1 responses, masked tokens holding
garbage, and the metrics."""

from __future__ import annotations

import math

import pytest
import torch

from hybrid.algorithms.distill import distill_metrics, mix_with_task, reverse_kl_advantages

pytestmark = pytest.mark.unit

NAN, INF = math.nan, math.inf
# Row 0: three tokens; row 1: a length-1 response; row 2: empty. Padding holds garbage
# (NaN, inf) that must never reach an advantage or a metric.
STUDENT = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, NAN, 0.0], [INF, 0.0, NAN]])
TEACHER = torch.tensor([[-1.5, -1.0, -0.5], [-0.8, 5.0, -INF], [INF, NAN, 1.0]])
MASK = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]])
# student - teacher on the mask: row 0 (0.5, -1.0, 0.0), row 1 (0.5,)
GAP = torch.tensor([[0.5, -1.0, 0.0], [0.5, 0.0, 0.0], [0.0, 0.0, 0.0]])


def test_reverse_kl_advantage_by_hand() -> None:
    advantages = reverse_kl_advantages(STUDENT, TEACHER, MASK, coef=2.0)
    # -2 x gap: the token the teacher finds likelier (row 0, token 1) is pushed up.
    expected = torch.tensor([[-1.0, 2.0, 0.0], [-1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    torch.testing.assert_close(advantages, expected)
    assert advantages[0, 1] > 0 and advantages[0, 0] < 0


def test_coef_scales_and_zero_coef_gives_zero() -> None:
    one = reverse_kl_advantages(STUDENT, TEACHER, MASK, coef=1.0)
    torch.testing.assert_close(one, -GAP)
    torch.testing.assert_close(reverse_kl_advantages(STUDENT, TEACHER, MASK, 0.5), -0.5 * GAP)
    assert not reverse_kl_advantages(STUDENT, TEACHER, MASK, 0.0).any()


def test_equal_policies_give_zero_advantage() -> None:
    assert not reverse_kl_advantages(STUDENT, STUDENT, MASK, coef=3.0).any()


def test_row_task_advantages_count_on_every_token_of_their_row() -> None:
    distilled = reverse_kl_advantages(STUDENT, TEACHER, MASK, coef=1.0)
    task = torch.tensor([0.5, -1.0, 7.0])  # row 2 is empty: its 7 reaches no token
    mixed = mix_with_task(distilled, task, MASK, reward_coef=0.5)
    expected = torch.tensor([[-0.25, 1.25, 0.25], [-1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    torch.testing.assert_close(mixed, expected)


def test_token_task_advantages_add_per_token() -> None:
    distilled = reverse_kl_advantages(STUDENT, TEACHER, MASK, coef=1.0)
    task = torch.tensor([[1.0, 2.0, 3.0], [4.0, NAN, 6.0], [7.0, 8.0, 9.0]])
    mixed = mix_with_task(distilled, task, MASK, reward_coef=2.0)
    expected = torch.tensor([[1.5, 5.0, 6.0], [7.5, 0.0, 0.0], [0.0, 0.0, 0.0]])
    torch.testing.assert_close(mixed, expected)


def test_reward_coef_zero_is_distillation_alone_even_with_nan_task() -> None:
    distilled = reverse_kl_advantages(STUDENT, TEACHER, MASK, coef=1.0)
    task = torch.full((3,), NAN)
    torch.testing.assert_close(mix_with_task(distilled, task, MASK, reward_coef=0.0), -GAP)


def test_shapes_that_do_not_fit_are_refused() -> None:
    distilled = torch.zeros(3, 3)
    with pytest.raises(ValueError, match=r"task advantages \(3, 2\)"):
        mix_with_task(distilled, torch.zeros(3, 2), MASK, 1.0)
    with pytest.raises(ValueError, match=r"distillation advantages \(2, 3\)"):
        mix_with_task(torch.zeros(2, 3), torch.zeros(2), MASK, 1.0)
    with pytest.raises(ValueError, match=r"teacher log-probs \(3, 2\)"):
        reverse_kl_advantages(STUDENT, TEACHER[:, :2], MASK, 1.0)


def test_metrics_by_hand() -> None:
    distilled = reverse_kl_advantages(STUDENT, TEACHER, MASK, coef=2.0)
    metrics = distill_metrics(STUDENT, TEACHER, MASK, distilled)
    # Four tokens: gaps (0.5, -1.0, 0.0, 0.5); teacher (-1.5, -1.0, -0.5, -0.8).
    assert metrics["distill/reverse_kl"] == pytest.approx(0.0)
    assert metrics["distill/teacher_log_prob_mean"] == pytest.approx(-3.8 / 4)
    assert metrics["distill/advantage_mean"] == pytest.approx(0.0)
    assert metrics["distill/log_ratio_abs_max"] == pytest.approx(1.0)  # a zero mean hides it
    # Drop the token the teacher prefers: the estimate turns positive, the advantage negative.
    mask = MASK.clone()
    mask[0, 1] = 0
    metrics = distill_metrics(
        STUDENT, TEACHER, mask, reverse_kl_advantages(STUDENT, TEACHER, mask, 2.0)
    )
    assert metrics["distill/reverse_kl"] == pytest.approx(1.0 / 3)
    assert metrics["distill/advantage_mean"] == pytest.approx(-2.0 / 3)
    assert metrics["distill/log_ratio_abs_max"] == pytest.approx(0.5)


def test_metrics_of_an_empty_batch_are_zero() -> None:
    empty = torch.zeros_like(MASK)
    metrics = distill_metrics(STUDENT, TEACHER, empty, torch.zeros(3, 3))
    assert metrics == {
        "distill/reverse_kl": 0.0,
        "distill/teacher_log_prob_mean": 0.0,
        "distill/advantage_mean": 0.0,
        "distill/log_ratio_abs_max": 0.0,
    }
