"""Unit tests for `hybrid.algorithms.off_policy` against hand-computed values: version lags,
the group admission bound (lag == bound admitted, bound + 1 refused), the stale-token mask,
decoupled PPO weights and their cap (None, equal, above, a clamped log-ratio), and the
version statistics (a fully masked row, a one-token response, padding that would lie); the
IcePop and sequence-level masked IS weights, and the mismatch statistics (k3, ratio quantiles,
tokens beyond a cap) exact on one rank and merged over ranks."""

import math

import pytest
import torch

from hybrid.algorithms.off_policy import (
    decoupled_weights,
    icepop_weights,
    mask_stale_tokens,
    merge_ratio_summaries,
    mismatch_stats,
    ratio_summary,
    seq_mask_is_weights,
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


# --- presets and mismatch statistics ---------------------------------------------------------


def test_icepop_keeps_the_band_on_both_sides() -> None:
    # log-ratios ln 3 (above cap 2), ln 2 (on the cap: kept), 0, -ln 2 (on 1/cap: kept),
    # -ln 3 (below 1/2): the weights are the raw ratios, only the band's tokens are kept
    behaviour = torch.zeros(1, 5)
    proximal = torch.tensor([[math.log(3), math.log(2), 0.0, -math.log(2), -math.log(3)]])
    weights, keep = icepop_weights(proximal, behaviour, 2.0)
    torch.testing.assert_close(weights, torch.tensor([[3.0, 2.0, 1.0, 0.5, 1 / 3]]))
    assert keep.tolist() == [[False, True, True, True, False]]
    with pytest.raises(ValueError, match=r"icepop cap must be > 1, got 1\.0"):
        icepop_weights(proximal, behaviour, 1.0)


def test_seq_mask_is_weighs_rows_by_their_geometric_mean_ratio() -> None:
    # row 0: log-ratios 0.2, 0.4 (padding 9 ignored) -> g = exp(0.3), inside [1/2, 2]
    # row 1: log-ratios 1.0, 1.0 -> g = e > 2, masked whole
    # row 2: one token of log-ratio -1.0 -> g = 1/e < 1/2, masked (a length-1 response)
    # row 3: no response token -> g = 1, kept (it adds nothing to any loss anyway)
    proximal = torch.tensor([[0.2, 0.4, 9.0], [1.0, 1.0, 0.0], [-1.0, 0.0, 0.0], [5.0, 5.0, 5.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0], [1, 0, 0], [0, 0, 0]])
    weights, keep = seq_mask_is_weights(proximal, torch.zeros(4, 3), mask, 2.0)
    expected = torch.tensor([math.exp(0.3), math.e, math.exp(-1.0), 1.0])[:, None].expand(4, 3)
    torch.testing.assert_close(weights, expected)
    assert keep[:, 0].tolist() == [True, False, False, True]
    assert keep.tolist() == [[row] * 3 for row in [True, False, False, True]]
    with pytest.raises(ValueError, match="seq_mask_is cap must be > 1"):
        seq_mask_is_weights(proximal, torch.zeros(4, 3), mask, 0.5)
    with pytest.raises(ValueError, match="response_mask"):
        seq_mask_is_weights(proximal, torch.zeros(4, 3), mask[:, :2], 2.0)


def test_mismatch_stats_by_hand() -> None:
    # Ratios r on the four masked tokens: 1, 2, 0.5, 4 (the fifth token is padding).
    # k3 = (r - 1) - ln r: 0, 1 - ln 2, -0.5 + ln 2, 3 - ln 4 -> mean (3.5 - 2 ln 2) / 4.
    # sorted r = 0.5, 1, 2, 4: p50 = 1.5; p01 at position 0.03 = 0.5 + 0.03 * 0.5;
    # p99 at position 2.97 = 2 + 0.97 * 2. Cap 1.5: above 2 and 4, below (1/1.5) 0.5.
    rollout = torch.tensor([[0.0, 0.0, 0.0, 0.0, 0.0]])
    trainer = torch.tensor([[0.0, math.log(2), -math.log(2), math.log(4), 7.0]])
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    stats = mismatch_stats(trainer, rollout, mask, {"cap": 1.5, "tight": 1.01})
    expected = {
        "rollout/mismatch_k3": (3.5 - 2 * math.log(2)) / 4,
        "rollout/ratio_p01": 0.515,
        "rollout/ratio_p50": 1.5,
        "rollout/ratio_p99": 3.94,
        "rollout/ratio_min": 0.5,
        "rollout/ratio_max": 4.0,
        "rollout/ratio_above_cap": 0.5,
        "rollout/ratio_below_cap": 0.25,
        "rollout/ratio_above_tight": 0.5,
        "rollout/ratio_below_tight": 0.25,
    }
    assert stats == pytest.approx(expected)
    # one token equal on both sides: no mismatch at all
    same = mismatch_stats(rollout[:, :1], rollout[:, :1], mask[:, :1], {"cap": 2.0})
    assert same["rollout/mismatch_k3"] == 0.0 and same["rollout/ratio_p99"] == 1.0


def test_mismatch_stats_of_an_empty_mask_are_zeros() -> None:
    stats = mismatch_stats(torch.ones(2, 3), torch.zeros(2, 3), torch.zeros(2, 3), {"cap": 2.0})
    assert set(stats.values()) == {0.0} and "rollout/ratio_below_cap" in stats
    with pytest.raises(ValueError, match="mismatch cap 'cap' must be > 0, got 0"):
        mismatch_stats(torch.ones(2, 3), torch.zeros(2, 3), torch.ones(2, 3), {"cap": 0})


def test_merged_rank_summaries_match_the_pooled_stats() -> None:
    g = torch.Generator().manual_seed(0)
    log_ratio = torch.randn(20_000, generator=g, dtype=torch.float64) * 0.2
    caps = {"cap": 1.2}
    pooled = mismatch_stats(log_ratio[None], torch.zeros(1, 20_000), torch.ones(1, 20_000), caps)
    # one rank: the reported quantiles lie on the sketch's grid, so they are exact (up to the
    # rounding of the grid's levels, which moves a position by ~1e-12 of a token)
    alone = merge_ratio_summaries(ratio_summary(log_ratio, caps)[None], caps)
    assert alone == pytest.approx(pooled, rel=1e-6)
    # three unequal ranks and an empty one: sums and extremes exact, quantiles close
    parts = [log_ratio[:3_000], log_ratio[3_000:15_000], log_ratio[15_000:], log_ratio[:0]]
    merged = merge_ratio_summaries(torch.stack([ratio_summary(p, caps) for p in parts]), caps)
    for key in ("mismatch_k3", "ratio_min", "ratio_max", "ratio_above_cap", "ratio_below_cap"):
        assert merged[f"rollout/{key}"] == pytest.approx(pooled[f"rollout/{key}"], rel=1e-9)
    for key in ("ratio_p01", "ratio_p50", "ratio_p99"):
        assert merged[f"rollout/{key}"] == pytest.approx(pooled[f"rollout/{key}"], rel=2e-3)
    empty = merge_ratio_summaries(ratio_summary(log_ratio[:0], caps)[None], caps)
    assert set(empty.values()) == {0.0}


def test_the_quantiles_never_fall_below_the_smallest_ratio() -> None:
    # Equal ratios an ulp from 1 (the fresh tokens of a bf16 engine): a quantile interpolated as
    # a (1 - f) + b f came out an ulp below them, under ratio_min.
    log_ratio = torch.full((37,), math.log(0.9999997615814493))
    log_ratio[-3:] = 0.01
    summaries = torch.stack([ratio_summary(log_ratio, {}), ratio_summary(log_ratio[:20], {})])
    stats = merge_ratio_summaries(summaries, {})
    assert stats["rollout/ratio_min"] <= stats["rollout/ratio_p01"] <= stats["rollout/ratio_p50"]
    assert stats["rollout/ratio_p50"] <= stats["rollout/ratio_p99"] <= stats["rollout/ratio_max"]
    assert stats["rollout/ratio_p01"] == stats["rollout/ratio_min"]
