"""Off-policy corrections of the decoupled modes: version lags, masks, weights.

In the fully-async mode a response may be sampled by weights several versions older than the
trainer's, and a partial rollout resumed under newer weights mixes versions within one row
(every response token carries the version that produced it). This module owns the arithmetic
on those versions and the per-token corrections built from them:
  - Version lag: trainer_version - token's version, per response token.
  (The queue's group admission by the oldest token's lag is hybrid/buffer/staleness.py.)
  - Stale-token mask (AReaL-style): tokens that lag more than a bound leave the loss.
  - Decoupled PPO (AReaL, Fu et al. 2025): the PPO ratio is taken against a proximal policy
    (the trainer's old log-probs) and the gap between the proximal and the behaviour policy
    (the rollout's log-probs) is corrected by per-token weights pi_proximal / pi_behaviour;
    tokens whose weight exceeds the cap leave the loss.
  - Version statistics for the metrics (lags, and how many rows mix versions).

Shape legend:
  B  batch (rows)    T  response_len (padded)
  versions, response_mask, proximal_log_prob, behaviour_log_prob, lags, weights, keep: (B, T)
Versions are integers (padding holds hybrid.data.sample.NO_VERSION; only response tokens are
read). Metrics are python floats.
"""

from __future__ import annotations

import torch

from hybrid.algorithms.policy_loss import LOG_RATIO_CLAMP


def version_lag(
    versions: torch.Tensor, response_mask: torch.Tensor, trainer_version: int
) -> torch.Tensor:
    """(B, T) long: trainer_version - versions on response tokens, 0 elsewhere."""
    if versions.shape != response_mask.shape:
        raise ValueError(
            f"versions {tuple(versions.shape)} and response_mask {tuple(response_mask.shape)} differ"
        )
    lag = trainer_version - versions.long()
    return torch.where(response_mask.bool(), lag, torch.zeros_like(lag))


def mask_stale_tokens(
    response_mask: torch.Tensor, versions: torch.Tensor, trainer_version: int, max_lag: int
) -> torch.Tensor:
    """response_mask (same dtype) with 0 where a token lags more than `max_lag` versions."""
    if max_lag < 0:
        raise ValueError(f"max_lag must be >= 0, got {max_lag}")
    fresh = version_lag(versions, response_mask, trainer_version) <= max_lag  # (B, T)
    return response_mask * fresh.to(response_mask.dtype)


def decoupled_weights(
    proximal_log_prob: torch.Tensor, behaviour_log_prob: torch.Tensor, cap: float | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Decoupled PPO (AReaL): per-token weights w = pi_proximal / pi_behaviour and the tokens
    that stay in the loss.

    Returns (weights, keep), both (B, T): weights = exp(proximal - behaviour), detached (the
    log-ratio clamped to +-LOG_RATIO_CLAMP, so a far-off token gives a large finite weight,
    never inf); keep = weights <= cap (all True when cap is None).

    Unlike TIS (truncated_importance_weights), which truncates a weight above the cap to the
    cap and keeps the token, decoupled PPO drops a token above the cap from the loss: the
    caller multiplies the advantages by the weights and the loss mask by keep.
    """
    if proximal_log_prob.shape != behaviour_log_prob.shape:
        raise ValueError(
            f"proximal_log_prob {tuple(proximal_log_prob.shape)} and behaviour_log_prob "
            f"{tuple(behaviour_log_prob.shape)} differ"
        )
    if cap is not None and cap <= 0:
        raise ValueError(f"decoupled cap must be > 0, got {cap}")
    log_ratio = (proximal_log_prob - behaviour_log_prob).detach()
    weights = torch.exp(log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    if cap is None:
        return weights, torch.ones_like(weights, dtype=torch.bool)
    return weights, weights <= cap


def version_stats(
    versions: torch.Tensor, response_mask: torch.Tensor, trainer_version: int
) -> dict[str, float]:
    """Lag and version-mixing statistics over response tokens (0s for an empty mask).

    Keys:
      sample/version_lag_mean    mean lag over response tokens
      sample/version_lag_max     largest lag of a response token
      partial/ratio              fraction of rows whose response mixes versions (span > 0)
      partial/version_span_max   largest span; a row's span = max - min version over its
                                 response tokens (0 for a row without response tokens)
    """
    keep = response_mask.bool()
    lag = version_lag(versions, response_mask, trainer_version)  # (B, T)
    tokens = int(keep.sum())
    versions = versions.long()
    rows = versions.shape[0]
    span = torch.zeros(rows, dtype=torch.long, device=versions.device)  # (B,)
    if tokens:
        # Padding takes the smallest (for the max) or largest (for the min) version of any
        # response token, so it moves no row's extremes; rows without tokens keep span 0.
        real = versions[keep]
        row_max = torch.where(keep, versions, real.min()).amax(-1)
        row_min = torch.where(keep, versions, real.max()).amin(-1)
        span = torch.where(keep.any(-1), row_max - row_min, span)
    return {
        "sample/version_lag_mean": float(lag.sum()) / tokens if tokens else 0.0,
        "sample/version_lag_max": float(lag[keep].max()) if tokens else 0.0,
        "partial/ratio": float((span > 0).sum()) / rows if rows else 0.0,
        "partial/version_span_max": float(span.max()) if rows else 0.0,
    }


# --- Rollout-vs-trainer mismatch presets --------------------------------------------------
# ratio r = pi_trainer / pi_rollout per token (the trainer's old log-probs, or the update's own
# first pass, against the engine's); `token_tis` is `tis` (truncated_importance_weights).


def icepop_weights(
    proximal_log_prob: torch.Tensor, behaviour_log_prob: torch.Tensor, cap: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """IcePop (Ring-1T, Ling Team 2025): per-token weights r = pi_proximal / pi_behaviour and
    keep = 1/cap <= r <= cap, both (B, T). A token whose ratio leaves the band, on either side,
    leaves the loss; inside it the token keeps its untruncated weight. Decoupled PPO is the
    one-sided case (only r > cap is dropped)."""
    if cap <= 1:
        # The band [1/cap, cap] is empty below 1 and keeps only r == 1 at 1.
        raise ValueError(f"icepop cap must be > 1, got {cap}")
    weights, _ = decoupled_weights(proximal_log_prob, behaviour_log_prob, None)
    return weights, (weights >= 1.0 / cap) & (weights <= cap)


def seq_mask_is_weights(
    proximal_log_prob: torch.Tensor,
    behaviour_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    cap: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequence-level masked importance sampling (verl's geometric rollout rejection with a
    sequence weight): each row's ratio is the geometric mean of its tokens' ratios,
    g_i = exp(mean_t log r_it) over its response tokens (length-normalised, so a long row is
    not rejected for its length alone); a row with g_i outside [1/cap, cap] leaves the loss
    whole, the others weigh every token by g_i. Returns (weights, keep), both (B, T), the row
    values broadcast; a row without response tokens has g = 1."""
    if not proximal_log_prob.shape == behaviour_log_prob.shape == response_mask.shape:
        raise ValueError(
            f"proximal_log_prob {tuple(proximal_log_prob.shape)}, behaviour_log_prob "
            f"{tuple(behaviour_log_prob.shape)} and response_mask "
            f"{tuple(response_mask.shape)} differ"
        )
    if cap <= 1:
        raise ValueError(f"seq_mask_is cap must be > 1, got {cap}")
    keep_token = response_mask.bool()
    log_ratio = (proximal_log_prob - behaviour_log_prob).detach()
    # Padding may hold anything (even inf): zero it before the sum, never multiply it by 0.
    summed = torch.where(keep_token, log_ratio, 0.0).sum(-1)  # (B,)
    mean_log = summed / keep_token.sum(-1).clamp(min=1)
    row_ratio = torch.exp(mean_log.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))  # (B,)
    keep_row = (row_ratio >= 1.0 / cap) & (row_ratio <= cap)
    weights = row_ratio[:, None].expand_as(log_ratio)
    return weights, keep_row[:, None].expand_as(log_ratio)


# --- Mismatch statistics ------------------------------------------------------------------
# Over the compared tokens (the caller's mask: the fresh model tokens), with r as above:
#   rollout/mismatch_k3      k3 estimate of KL(rollout || trainer): mean of (r - 1) - log r
#                            (Schulman's unbiased, non-negative estimator on tokens sampled by
#                            the rollout policy)
#   rollout/ratio_p01|p50|p99|min|max   quantiles and extremes of r
#   rollout/ratio_above_<name>, rollout/ratio_below_<name>   fraction of tokens with r > cap
#                            and with r < 1 / cap, for each cap named in `caps`
# All zeros for an empty mask.

RATIO_QUANTILES = {"rollout/ratio_p01": 0.01, "rollout/ratio_p50": 0.5, "rollout/ratio_p99": 0.99}
SKETCH_POINTS = 1001
"""Points of a rank's ratio sketch: r at quantile levels 0, 0.001, ..., 1 of its tokens. The
merged quantiles are exact on one rank (the reported levels lie on the grid; up to float
rounding of the levels) and, across
ranks, interpolate each rank's distribution within 1/1000 of a level."""


def mismatch_stats(
    trainer_lp: torch.Tensor, rollout_lp: torch.Tensor, mask: torch.Tensor, caps: dict[str, float]
) -> dict[str, float]:
    """The rollout-vs-trainer mismatch over `mask` (keys above), exact, from (B, T) log-probs."""
    if trainer_lp.shape != rollout_lp.shape:
        raise ValueError(
            f"trainer_lp {tuple(trainer_lp.shape)} and rollout_lp {tuple(rollout_lp.shape)} differ"
        )
    log_ratio = (trainer_lp - rollout_lp).detach()[mask.bool()]
    stats = _ratio_counts(log_ratio, caps)
    ratio = torch.exp(log_ratio.double().clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)).sort().values
    levels = torch.tensor(list(RATIO_QUANTILES.values()), dtype=torch.float64)
    quantiles = _quantiles(ratio, levels.to(ratio.device)).tolist() if ratio.numel() else []
    return _finish(stats, ratio, dict(zip(RATIO_QUANTILES, quantiles, strict=False)))


def ratio_summary(log_ratio: torch.Tensor, caps: dict[str, float]) -> torch.Tensor:
    """One rank's fixed-size float64 summary of its compared tokens' log-ratios (1-D), for an
    all_gather: [tokens, k3 sum, min, max, above and below counts per cap, SKETCH_POINTS
    sketch points]; `merge_ratio_summaries` turns the stacked summaries into the stats."""
    counts = _ratio_counts(log_ratio.detach(), caps)
    ratio = torch.exp(log_ratio.detach().double().clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    ratio = ratio.sort().values
    levels = torch.linspace(0, 1, SKETCH_POINTS, dtype=torch.float64, device=ratio.device)
    sketch = _quantiles(ratio, levels) if ratio.numel() else torch.zeros_like(levels)
    extremes = [float(ratio[0]), float(ratio[-1])] if ratio.numel() else [0.0, 0.0]
    head = [counts["tokens"], counts["k3_sum"], *extremes]
    head += [counts[f"{side}_{name}"] for name in caps for side in ("above", "below")]
    return torch.cat([torch.tensor(head, dtype=torch.float64, device=ratio.device), sketch])


def merge_ratio_summaries(summaries: torch.Tensor, caps: dict[str, float]) -> dict[str, float]:
    """The mismatch stats of every rank's tokens from their stacked `ratio_summary`s,
    (ranks, size): sums and extremes exact, quantiles from the sketches (SKETCH_POINTS)."""
    rows = summaries.detach().double().cpu()
    present = rows[rows[:, 0] > 0]
    tokens = float(present[:, 0].sum())
    stats = {"tokens": tokens, "k3_sum": float(present[:, 1].sum())}
    for index, name in enumerate(caps):
        stats[f"above_{name}"] = float(present[:, 4 + 2 * index].sum())
        stats[f"below_{name}"] = float(present[:, 5 + 2 * index].sum())
    if not tokens:
        return _finish(stats, torch.zeros(0, dtype=torch.float64), {})
    sketches = present[:, 4 + 2 * len(caps) :]  # (ranks with tokens, SKETCH_POINTS)
    levels = torch.linspace(0, 1, SKETCH_POINTS, dtype=torch.float64)
    # The merged CDF at every sketch point: each rank's piecewise-linear CDF, token-weighted.
    points = sketches.flatten().sort().values
    cdf = torch.zeros_like(points)
    for counts, sketch in zip(present[:, 0], sketches, strict=True):
        cdf += counts / tokens * _interp(points, sketch, levels)
    quantiles = {k: float(_interp(torch.tensor([q]).double(), cdf, points)[0])
                 for k, q in RATIO_QUANTILES.items()}  # fmt: skip
    extremes = torch.stack([present[:, 2].min(), present[:, 3].max()])
    return _finish(stats, extremes, quantiles)


def _ratio_counts(log_ratio: torch.Tensor, caps: dict[str, float]) -> dict[str, float]:
    """Token count, k3 sum and the tokens beyond each cap, from 1-D log-ratios."""
    for name, cap in caps.items():
        if not cap > 0:
            raise ValueError(f"mismatch cap {name!r} must be > 0, got {cap}")
    log_ratio = log_ratio.double().clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    counts = {"tokens": float(ratio.numel()), "k3_sum": float(((ratio - 1) - log_ratio).sum())}
    for name, cap in caps.items():
        counts[f"above_{name}"] = float((ratio > cap).sum())
        counts[f"below_{name}"] = float((ratio < 1.0 / cap).sum())
    return counts


def _finish(
    counts: dict[str, float], sorted_or_extremes: torch.Tensor, quantiles: dict[str, float]
) -> dict[str, float]:
    """The named metrics from the counts, the ratios' first and last values, the quantiles."""
    tokens = counts["tokens"]
    stats = {"rollout/mismatch_k3": counts["k3_sum"] / tokens if tokens else 0.0}
    stats.update({key: quantiles.get(key, 0.0) for key in RATIO_QUANTILES})
    has = sorted_or_extremes.numel() > 0
    stats["rollout/ratio_min"] = float(sorted_or_extremes[0]) if has else 0.0
    stats["rollout/ratio_max"] = float(sorted_or_extremes[-1]) if has else 0.0
    for key, value in counts.items():
        if key.startswith(("above_", "below_")):
            side, name = key.split("_", 1)
            stats[f"rollout/ratio_{side}_{name}"] = value / tokens if tokens else 0.0
    return stats


def _quantiles(sorted_values: torch.Tensor, levels: torch.Tensor) -> torch.Tensor:
    """The quantiles at `levels` of sorted, non-empty 1-D values, linear between order
    statistics (torch.quantile's default) without torch.quantile's input-size limit."""
    last = sorted_values.numel() - 1
    position = levels * last
    low = position.floor().long().clamp(0, last)
    high = (low + 1).clamp(max=last)
    fraction = position - low
    # a + (b - a) f, not a (1 - f) + b f: between equal neighbours it is exactly their value,
    # never an ulp below the smallest (a quantile under the minimum would break their order).
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * fraction


def _interp(x: torch.Tensor, xp: torch.Tensor, fp: torch.Tensor) -> torch.Tensor:
    """Piecewise-linear f(x) through the points (xp, fp), xp non-decreasing; fp[0] below xp[0]
    and fp[-1] above xp[-1] (numpy.interp's rule)."""
    right = torch.searchsorted(xp, x, right=True).clamp(1, xp.numel() - 1)
    left = right - 1
    span = xp[right] - xp[left]
    fraction = torch.where(span > 0, (x - xp[left]) / torch.where(span > 0, span, 1.0), 1.0)
    value = fp[left] + fraction.clamp(0, 1) * (fp[right] - fp[left])
    value = torch.where(x < xp[0], fp[0], value)
    return torch.where(x >= xp[-1], fp[-1], value)
