"""Unit tests for `hybrid.algorithms.policy_loss.policy_loss` and its helpers against
hand-computed per-token losses: ratios inside and outside the clip range for both advantage
signs, clip-higher asymmetry, dual clip, masking, advantage broadcast, gradients, metrics,
truncated importance weights and the composed actor loss."""

import math

import pytest
import torch

from hybrid.algorithms.policy_loss import (
    compose_actor_loss,
    policy_loss,
    truncated_importance_weights,
)

pytestmark = pytest.mark.unit


def inputs(ratios: list[list[float]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(log_prob, old_log_prob), float64, with exp(log_prob - old_log_prob) == ratios."""
    r = torch.tensor(ratios, dtype=torch.float64)
    old = torch.linspace(-2.0, -0.5, r.numel(), dtype=torch.float64).reshape(r.shape)
    return old + r.log(), old


def one_token(ratio: float, advantage: float, **kwargs: float) -> tuple[float, dict[str, float]]:
    log_prob, old = inputs([[ratio]])
    adv = torch.tensor([[advantage]], dtype=torch.float64)
    loss, metrics = policy_loss(log_prob, old, adv, torch.ones(1, 1), **kwargs)  # type: ignore[arg-type]
    return loss.item(), metrics


# ratio, advantage, per-token loss, clipfrac, clipfrac_lower; low = high = 0.2, c = 3.
# l = max(-A r, -A clip(r, 0.8, 1.2)), then min(l, -3 A) where A < 0.
CASES = [
    (1.1, 2.0, -2.2, 0.0, 0.0),  # inside: -2 * 1.1
    (1.5, 2.0, -2.4, 1.0, 0.0),  # A > 0 above 1.2: max(-3.0, -2 * 1.2 = -2.4)
    (0.5, 2.0, -1.0, 0.0, 0.0),  # A > 0 below 0.8: max(-1.0, -1.6) = -1.0, pessimistic
    (0.5, -1.0, 0.8, 1.0, 0.0),  # A < 0 below 0.8: max(0.5, 0.8) = 0.8
    (0.9, -1.0, 0.9, 0.0, 0.0),  # inside: 0.9
    (2.0, -1.0, 2.0, 0.0, 0.0),  # A < 0 above 1.2: max(2.0, 1.2) = 2.0 < cap 3
    (10.0, -1.0, 3.0, 0.0, 1.0),  # dual clip: max(10, 1.2) = 10, min(10, 3) = 3
    (10.0, 1.0, -1.2, 1.0, 0.0),  # no dual clip for A > 0: max(-10, -1.2)
]


@pytest.mark.parametrize(("ratio", "advantage", "expected", "clipfrac", "lower"), CASES)
def test_each_case(
    ratio: float, advantage: float, expected: float, clipfrac: float, lower: float
) -> None:
    loss, metrics = one_token(ratio, advantage)
    assert loss == pytest.approx(expected)
    assert metrics["actor/pg_clipfrac"] == clipfrac
    assert metrics["actor/pg_clipfrac_lower"] == lower
    assert metrics["actor/ppo_kl"] == pytest.approx(-math.log(ratio))


def test_all_cases_together_and_metrics() -> None:
    log_prob, old = inputs([[c[0] for c in CASES]])
    adv = torch.tensor([[c[1] for c in CASES]], dtype=torch.float64)
    loss, metrics = policy_loss(log_prob, old, adv, torch.ones(1, len(CASES)))
    # -2.2 - 2.4 - 1.0 + 0.8 + 0.9 + 2.0 + 3.0 - 1.2 = -0.1, over 8 tokens
    assert loss.item() == pytest.approx(-0.1 / 8)
    assert set(metrics) == {"actor/pg_clipfrac", "actor/pg_clipfrac_lower", "actor/ppo_kl"}
    assert metrics["actor/pg_clipfrac"] == pytest.approx(3 / 8)
    assert metrics["actor/pg_clipfrac_lower"] == pytest.approx(1 / 8)
    assert metrics["actor/ppo_kl"] == pytest.approx(-sum(math.log(c[0]) for c in CASES) / 8)
    assert all(isinstance(v, float) for v in metrics.values())


# low = 0.2, high = 0.28: r is clipped to [0.8, 1.28]
@pytest.mark.parametrize(
    ("ratio", "advantage", "asymmetric", "symmetric"),
    [
        (1.25, 1.0, -1.25, -1.2),  # inside 1.28 but above 1.2: only clip-higher lets it through
        (1.4, 1.0, -1.28, -1.2),  # above both: clipped to the respective upper bound
        (0.75, -1.0, 0.8, 0.8),  # the lower bound is unchanged: max(0.75, 0.8)
        (0.75, 1.0, -0.75, -0.75),  # A > 0 below 0.8: pessimistic -A r either way
    ],
)
def test_clip_higher_asymmetry(
    ratio: float, advantage: float, asymmetric: float, symmetric: float
) -> None:
    loss, _ = one_token(ratio, advantage, clip_ratio_low=0.2, clip_ratio_high=0.28)
    assert loss == pytest.approx(asymmetric)
    loss, _ = one_token(ratio, advantage, clip_ratio_low=0.2, clip_ratio_high=0.2)
    assert loss == pytest.approx(symmetric)


def test_dual_clip_caps_a_huge_ratio_with_zero_gradient() -> None:
    # log r = 50 (r = 5e21; the loss clamps log r at 20), A = -2, c = 3: cap -A c = 6
    old = torch.tensor([[-60.0]], dtype=torch.float64)
    log_prob = torch.tensor([[-10.0]], dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([-2.0], dtype=torch.float64)
    loss, metrics = policy_loss(log_prob, old, adv, torch.ones(1, 1), clip_ratio_c=3.0)
    assert loss.item() == pytest.approx(6.0)
    assert metrics["actor/pg_clipfrac_lower"] == 1.0
    loss.backward()
    assert log_prob.grad is not None and log_prob.grad.item() == 0.0
    # a different c moves the cap: -A c = 2 * 5 = 10
    loss, _ = policy_loss(log_prob, old, adv, torch.ones(1, 1), clip_ratio_c=5.0)
    assert loss.item() == pytest.approx(10.0)


def test_gradient_only_through_unclipped_tokens() -> None:
    log_prob, old = inputs([[c[0] for c in CASES]])
    log_prob.requires_grad_(True)
    adv = torch.tensor([[c[1] for c in CASES]], dtype=torch.float64)
    policy_loss(log_prob, old, adv, torch.ones(1, len(CASES)))[0].backward()
    # d(-A r)/d log_prob = -A r on unclipped tokens, over 8 tokens; clipped / capped get 0
    expected = [-2.2, 0.0, -1.0, 0.0, 0.9, 2.0, 0.0, 0.0]
    assert log_prob.grad is not None
    torch.testing.assert_close(log_prob.grad, torch.tensor([expected], dtype=torch.float64) / 8)


def test_masked_tokens_are_ignored() -> None:
    log_prob, old = inputs([[c[0] for c in CASES]])
    adv = torch.tensor([[c[1] for c in CASES]], dtype=torch.float64)
    # two padding tokens with absurd values: ratio e^100 and e^-100, advantages +/-1e6
    wide_lp = torch.cat([log_prob, torch.tensor([[50.0, -50.0]], dtype=torch.float64)], 1)
    wide_old = torch.cat([old, torch.tensor([[-50.0, 50.0]], dtype=torch.float64)], 1)
    wide_adv = torch.cat([adv, torch.tensor([[1e6, -1e6]], dtype=torch.float64)], 1)
    mask = torch.tensor([[1] * len(CASES) + [0, 0]])
    wide_lp.requires_grad_(True)
    loss, metrics = policy_loss(wide_lp, wide_old, wide_adv, mask)
    expected_loss, expected_metrics = policy_loss(log_prob, old, adv, torch.ones(1, len(CASES)))
    assert loss.item() == pytest.approx(expected_loss.item())
    assert metrics == pytest.approx(expected_metrics)
    loss.backward()
    assert wide_lp.grad is not None
    assert wide_lp.grad[0, -2:].tolist() == [0.0, 0.0]


def test_sequence_advantages_broadcast_over_tokens() -> None:
    # row 0: A = 2 on r = 1.1, 1.5 -> -2.2, -2.4; row 1: A = -1 on r = 0.5, 10 -> 0.8, 3.0
    log_prob, old = inputs([[1.1, 1.5], [0.5, 10.0]])
    per_seq = torch.tensor([2.0, -1.0], dtype=torch.float64)
    loss, metrics = policy_loss(log_prob, old, per_seq, torch.ones(2, 2))
    assert loss.item() == pytest.approx((-2.2 - 2.4 + 0.8 + 3.0) / 4)
    expanded = per_seq.unsqueeze(-1).expand(2, 2)
    loss_2d, metrics_2d = policy_loss(log_prob, old, expanded, torch.ones(2, 2))
    assert loss.item() == loss_2d.item()
    assert metrics == metrics_2d


def test_seq_mean_mode_passes_through() -> None:
    # row 0 tokens -2.2, -2.4 (2 tokens), row 1 token 0.8 (1 token, the second is masked)
    log_prob, old = inputs([[1.1, 1.5], [0.5, 10.0]])
    adv = torch.tensor([2.0, -1.0], dtype=torch.float64)
    mask = torch.tensor([[1, 1], [1, 0]])
    loss, _ = policy_loss(log_prob, old, adv, mask, loss_agg_mode="seq-mean-token-mean")
    assert loss.item() == pytest.approx(((-2.2 - 2.4) / 2 + 0.8 / 1) / 2)  # -0.75


def test_invalid_arguments_raise() -> None:
    log_prob, old = inputs([[1.0]])
    adv, mask = torch.ones(1, 1, dtype=torch.float64), torch.ones(1, 1)
    for c in (1.0, 0.5):
        with pytest.raises(ValueError, match="clip_ratio_c"):
            policy_loss(log_prob, old, adv, mask, clip_ratio_c=c)
    with pytest.raises(ValueError, match="loss_agg_mode"):
        policy_loss(log_prob, old, adv, mask, loss_agg_mode="sum")
    with pytest.raises(ValueError, match="advantages"):
        policy_loss(log_prob, old, torch.ones(1, 3, dtype=torch.float64), mask)
    with pytest.raises(ValueError, match="one shape"):
        policy_loss(log_prob, old, adv, torch.ones(1, 2))


def test_truncated_importance_weights() -> None:
    # old - rollout = log 0.5, log 4, 0 -> exp: 0.5, 4 -> cap 2, 1
    rollout = torch.tensor([[-1.0, -2.0, -3.0]], dtype=torch.float64)
    old = rollout + torch.tensor([[math.log(0.5), math.log(4.0), 0.0]], dtype=torch.float64)
    old.requires_grad_(True)
    weights = truncated_importance_weights(old, rollout, cap=2.0)
    torch.testing.assert_close(weights, torch.tensor([[0.5, 2.0, 1.0]], dtype=torch.float64))
    assert not weights.requires_grad
    # a wild mismatch (exp(1000) = inf in float64) still gives the cap
    assert (
        truncated_importance_weights(torch.tensor([0.0]), torch.tensor([-1000.0]), 2.0).item()
        == 2.0
    )
    with pytest.raises(ValueError, match="cap"):
        truncated_importance_weights(old, rollout, cap=0.0)


def test_tis_weights_on_advantages_scale_the_per_token_loss() -> None:
    # the worker multiplies A by w > 0; every branch is linear in A, so l -> w l:
    # r = 1.1, A = 2, w = 0.5: -2.2 * 0.5 = -1.1; r = 1.5, A = 2, w = 2: -2.4 * 2 = -4.8
    # r = 10, A = -1, w = 2: dual-capped 3 * 2 = 6 -> (-1.1 - 4.8 + 6) / 3 = 0.1 / 3
    log_prob, old = inputs([[1.1, 1.5, 10.0]])
    weights = torch.tensor([[0.5, 2.0, 2.0]], dtype=torch.float64)
    adv = torch.tensor([2.0, 2.0, -1.0], dtype=torch.float64).unsqueeze(0)
    loss, _ = policy_loss(log_prob, old, adv * weights, torch.ones(1, 3))
    assert loss.item() == pytest.approx(0.1 / 3)


def test_compose_actor_loss_signs() -> None:
    pg = torch.tensor(1.0, requires_grad=True)
    entropy = torch.tensor(2.0, requires_grad=True)
    kl = torch.tensor(0.5, requires_grad=True)
    # 1.0 - 0.01 * 2.0 + 0.1 * 0.5 = 1.0 - 0.02 + 0.05 = 1.03
    loss = compose_actor_loss(pg, entropy, kl, entropy_coeff=0.01, kl_loss_coef=0.1)
    assert loss.item() == pytest.approx(1.03)
    loss.backward()
    # minimising the loss raises entropy (negative gradient) and lowers KL (positive)
    assert (pg.grad, entropy.grad, kl.grad) == (
        pytest.approx(1.0),
        pytest.approx(-0.01),
        pytest.approx(0.1),
    )
    # terms switched off
    assert compose_actor_loss(pg, 0.0, 0.0, 0.0, 0.0).item() == 1.0
