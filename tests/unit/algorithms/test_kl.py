"""Unit tests for `hybrid.algorithms.kl.kl_penalty`: each estimator on a hand-computed
example, the aliases, the k3 clamps on huge log-ratio differences, and unknown kinds."""

import math
from typing import get_args

import pytest
import torch

from hybrid.algorithms.kl import KL_KINDS, kl_penalty

pytestmark = pytest.mark.unit

# d = log_prob - ref = (-1.0 - -1.5, -2.0 - -1.0, -0.3 - -0.3) = (0.5, -1.0, 0.0)
LOG_PROB = torch.tensor([[-1.0, -2.0, -0.3]], dtype=torch.float64)
REF = torch.tensor([[-1.5, -1.0, -0.3]], dtype=torch.float64)

EXPECTED = {
    "k1": [0.5, -1.0, 0.0],
    "abs": [0.5, 1.0, 0.0],
    # 0.5 * d^2 = 0.5 * (0.25, 1.0, 0.0)
    "k2": [0.125, 0.5, 0.0],
    # r = ref - log_prob = (-0.5, 1.0, 0.0); exp(r) - r - 1:
    #   exp(-0.5) + 0.5 - 1 = 0.6065307 - 0.5 = 0.1065307
    #   exp(1) - 1 - 1 = 2.7182818 - 2 = 0.7182818
    #   exp(0) - 0 - 1 = 0
    "k3": [math.exp(-0.5) - 0.5, math.e - 2, 0.0],
}


@pytest.mark.parametrize("kind", sorted(EXPECTED))
def test_hand_computed(kind: str) -> None:
    kl = kl_penalty(LOG_PROB, REF, kind)
    assert kl.shape == LOG_PROB.shape
    torch.testing.assert_close(kl, torch.tensor([EXPECTED[kind]], dtype=torch.float64))


def test_k3_values_by_hand() -> None:
    kl = kl_penalty(LOG_PROB, REF, "k3")
    assert kl[0, 0].item() == pytest.approx(0.1065307, abs=1e-7)
    assert kl[0, 1].item() == pytest.approx(0.7182818, abs=1e-7)


@pytest.mark.parametrize(("alias", "kind"), [("mse", "k2"), ("low_var_kl", "k3")])
def test_aliases(alias: str, kind: str) -> None:
    torch.testing.assert_close(kl_penalty(LOG_PROB, REF, alias), kl_penalty(LOG_PROB, REF, kind))


def test_k3_clamps_huge_differences() -> None:
    # r = ref - log_prob = (1000, 30, -30, -12, 5)
    #   1000 -> clamp 20: exp(20) - 21 ~ 4.85e8 -> clamp 10
    #   30   -> clamp 20: same -> 10
    #   -30  -> clamp -20: exp(-20) + 20 - 1 ~ 19 -> 10
    #   -12: exp(-12) + 12 - 1 = 11.000006 -> 10 (only the outer clamp)
    #   5:   exp(5) - 5 - 1 = 148.41316 - 6 = 142.41 -> 10
    ref = torch.tensor([[0.0, 0.0, 0.0, 0.0, 0.0]], dtype=torch.float32)
    log_prob = torch.tensor([[-1000.0, -30.0, 30.0, 12.0, -5.0]], requires_grad=True)
    kl = kl_penalty(log_prob, ref, "k3")
    assert kl.tolist() == [[10.0] * 5]
    kl.sum().backward()
    # clamped everywhere: zero gradient, and not NaN (exp(1000) would be inf, 0 * inf = NaN)
    assert log_prob.grad is not None
    assert log_prob.grad.tolist() == [[0.0] * 5]


def test_k3_is_non_negative_and_gradient_finite() -> None:
    generator = torch.Generator().manual_seed(0)
    log_prob = (torch.randn(4, 16, generator=generator) * 3).requires_grad_(True)
    ref = torch.randn(4, 16, generator=generator) * 3
    kl = kl_penalty(log_prob, ref, "low_var_kl")
    assert (kl >= 0).all()
    kl.sum().backward()
    assert log_prob.grad is not None and torch.isfinite(log_prob.grad).all()


def test_unknown_kind_lists_the_kinds() -> None:
    with pytest.raises(ValueError, match="low_var_kl") as info:
        kl_penalty(LOG_PROB, REF, "k4")
    for kind in KL_KINDS:
        assert kind in str(info.value)


def test_kinds_match_the_actor_config() -> None:
    from hybrid.workers.config import KlKind

    assert set(get_args(KlKind)) == set(KL_KINDS)
