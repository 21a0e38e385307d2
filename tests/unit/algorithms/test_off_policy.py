"""Unit tests for `hybrid.algorithms.off_policy` against hand-computed values: version lags,
the group admission bound (lag == bound admitted, bound + 1 refused), the stale-token mask,
decoupled PPO weights and their cap (None, equal, above, a clamped log-ratio), and the
version statistics (a fully masked row, a one-token response, padding that would lie)."""

import math

import pytest
import torch

from hybrid.algorithms.off_policy import (
    decoupled_weights,
    mask_stale_tokens,
    version_lag,
    version_stats,
)
from hybrid.algorithms.policy_loss import LOG_RATIO_CLAMP

pytestmark = pytest.mark.unit

# Four rows, response width 4, padding version -1 (NO_VERSION):
#   row 0: versions 3, 4, 5 (a partial rollout resumed twice), one padding token
#   row 1: versions 5, 5
#   row 2: no response token at all
#   row 3: a one-token response of version 4
VERSIONS = torch.tensor([[3, 4, 5, -1], [5, 5, -1, -1], [-1, -1, -1, -1], [4, -1, -1, -1]])
MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0], [1, 0, 0, 0]])


def test_version_lag_on_response_tokens_only() -> None:
    # trainer at 5: 5 - 3, 5 - 4, 5 - 5; padding (5 - -1 = 6) reads 0
    lag = version_lag(VERSIONS, MASK, 5)
    assert lag.dtype == torch.long
    assert lag.tolist() == [[2, 1, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0], [1, 0, 0, 0]]
    # a float mask gives the same long lags
    assert version_lag(VERSIONS, MASK.float(), 5).tolist() == lag.tolist()


def test_version_lag_rejects_mismatched_shapes() -> None:
    with pytest.raises(ValueError, match="versions"):
        version_lag(VERSIONS, MASK[:, :3], 5)


@pytest.mark.parametrize(
    ("max_lag", "expected"),
    [
        (0, [[0, 0, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]]),  # only version 5
        (1, [[0, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0], [1, 0, 0, 0]]),  # lag 1 == bound kept
        (2, MASK.tolist()),  # the largest lag is 2: nothing dropped
    ],
)
def test_mask_stale_tokens(max_lag: int, expected: list[list[int]]) -> None:
    got = mask_stale_tokens(MASK, VERSIONS, 5, max_lag)
    assert got.dtype == MASK.dtype
    assert got.tolist() == expected
    as_float = mask_stale_tokens(MASK.float(), VERSIONS, 5, max_lag)
    assert as_float.dtype == torch.float32
    assert as_float.tolist() == [[float(v) for v in row] for row in expected]


def test_mask_stale_tokens_rejects_a_negative_bound() -> None:
    with pytest.raises(ValueError, match="max_lag must be >= 0"):
        mask_stale_tokens(MASK, VERSIONS, 5, -1)


def _log_probs(ratios: list[list[float]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(proximal, behaviour), float64, with exp(proximal - behaviour) == ratios."""
    r = torch.tensor(ratios, dtype=torch.float64)
    behaviour = torch.linspace(-3.0, -0.5, r.numel(), dtype=torch.float64).reshape(r.shape)
    return behaviour + r.log(), behaviour


def test_decoupled_weights_and_the_cap() -> None:
    proximal, behaviour = _log_probs([[0.5, 1.0], [2.0, 3.0]])
    weights, keep = decoupled_weights(proximal, behaviour, 2.0)
    torch.testing.assert_close(weights, torch.tensor([[0.5, 1.0], [2.0, 3.0]], dtype=torch.float64))
    # 2.0 == cap stays, 3.0 > cap leaves (TIS would have kept it with weight 2.0)
    assert keep.dtype == torch.bool
    assert keep.tolist() == [[True, True], [True, False]]


def test_decoupled_weights_without_a_cap_keep_everything() -> None:
    proximal, behaviour = _log_probs([[0.5, 100.0]])
    weights, keep = decoupled_weights(proximal, behaviour, None)
    torch.testing.assert_close(weights, torch.tensor([[0.5, 100.0]], dtype=torch.float64))
    assert keep.tolist() == [[True, True]]


def test_decoupled_weights_of_a_one_token_response() -> None:
    proximal, behaviour = _log_probs([[1.5]])
    weights, keep = decoupled_weights(proximal, behaviour, 1.2)
    assert weights.item() == pytest.approx(1.5)
    assert keep.tolist() == [[False]]


def test_decoupled_weights_are_detached_and_finite() -> None:
    # log-ratios +100 and -100 are clamped to +-20: exp(20), exp(-20), never inf or 0 * inf
    proximal = torch.tensor([[50.0, -50.0]], dtype=torch.float64, requires_grad=True)
    behaviour = torch.tensor([[-50.0, 50.0]], dtype=torch.float64)
    weights, keep = decoupled_weights(proximal, behaviour, 2.0)
    assert not weights.requires_grad
    expected = [math.exp(LOG_RATIO_CLAMP), math.exp(-LOG_RATIO_CLAMP)]
    assert weights[0].tolist() == pytest.approx(expected)
    assert keep.tolist() == [[False, True]]


@pytest.mark.parametrize("cap", [0.0, -1.0])
def test_decoupled_weights_reject_a_non_positive_cap(cap: float) -> None:
    proximal, behaviour = _log_probs([[1.0]])
    with pytest.raises(ValueError, match="cap must be > 0"):
        decoupled_weights(proximal, behaviour, cap)


def test_version_stats() -> None:
    stats = version_stats(VERSIONS, MASK, 5)
    # lags over the 6 response tokens: 2, 1, 0 | 0, 0 | - | 1 -> sum 4, max 2
    # spans: row 0: 5 - 3 = 2; row 1: 0; row 2 (no token): 0; row 3 (one token): 0
    assert stats == pytest.approx(
        {
            "sample/version_lag_mean": 4 / 6,
            "sample/version_lag_max": 2.0,
            "partial/ratio": 1 / 4,
            "partial/version_span_max": 2.0,
        }
    )
    assert all(isinstance(v, float) for v in stats.values())


def test_version_stats_ignore_padding_versions() -> None:
    # padding above (99) and below (-1) every real version moves neither a lag nor a span
    versions = torch.tensor([[4, 4, 99], [2, 3, -1]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]])
    # trainer 4: lags 0, 0 | 2, 1 -> mean 3 / 4, max 2; spans 0 | 1
    assert version_stats(versions, mask, 4) == pytest.approx(
        {
            "sample/version_lag_mean": 0.75,
            "sample/version_lag_max": 2.0,
            "partial/ratio": 0.5,
            "partial/version_span_max": 1.0,
        }
    )


@pytest.mark.parametrize("shape", [(2, 3), (0, 3), (2, 0)], ids=["masked", "no rows", "no width"])
def test_version_stats_of_an_empty_mask_are_zero(shape: tuple[int, int]) -> None:
    versions = torch.full(shape, 7, dtype=torch.long)
    stats = version_stats(versions, torch.zeros(shape, dtype=torch.long), 9)
    assert stats == {
        "sample/version_lag_mean": 0.0,
        "sample/version_lag_max": 0.0,
        "partial/ratio": 0.0,
        "partial/version_span_max": 0.0,
    }
