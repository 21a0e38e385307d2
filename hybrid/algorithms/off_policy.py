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
