"""The actor's loss: PPO-clip with DAPO clip-higher and dual clip, loss aggregation, TIS.

Variants implemented:
  - PPO clip with asymmetric bounds (DAPO "clip-higher"): r is clipped to
    [1 - clip_ratio_low, 1 + clip_ratio_high]; equal bounds give vanilla PPO.
  - Dual clip (Ye et al. 2020): for A < 0 the per-token loss is also capped at -A * c, so a
    token whose ratio exploded cannot dominate the batch.
  - Loss aggregation: token-mean (DAPO), token-sum (verl's, no normaliser), seq-mean-token-sum,
    seq-mean-token-mean (GRPO paper), seq-mean-token-sum-norm (Dr.GRPO's constant length
    normaliser); the seq-mean modes average over the rows with at least one valid token.
  - Truncated importance sampling (TIS) between the rollout engine's and the actor's
    log-probs of the same old policy: per-token weights min(pi_old / pi_rollout, cap).

Shape legend:
  B  batch (rows of this micro-batch)    T  response_len (padded)
  log_prob, old_log_prob, rollout_log_prob, response_mask, per-token losses: (B, T)
  advantages: (B, T), or (B,) broadcast over T
Losses are 0-d tensors; metrics are python floats, local to the call (means over its tokens).
"""

from __future__ import annotations

import torch

LOSS_AGG_MODES = (
    "token-mean",
    "token-sum",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)
"""Accepted values of `loss_agg_mode`."""

# exp(20) ~ 5e8: far beyond any clip bound, and small enough that backward through exp()
# never multiplies a zero gradient by inf (which would give NaN).
LOG_RATIO_CLAMP = 20.0


def aggregate_loss(
    per_token: torch.Tensor,
    mask: torch.Tensor,
    loss_agg_mode: str,
    global_tokens: float | None = None,
    global_seqs: float | None = None,
) -> torch.Tensor:
    """Reduce a (B, T) per-token loss to a scalar; positions where mask == 0 are ignored.

    Modes, with S the rows that have at least one valid token (sum over b in S):
      "token-mean":              sum(per_token * mask) / global_tokens
      "token-sum":               sum(per_token * mask)                 (no normaliser)
      "seq-mean-token-sum":      sum_b (sum_t per_token * mask) / global_seqs
      "seq-mean-token-mean":     sum_b (sum_t per_token * mask / len_b) / global_seqs
      "seq-mean-token-sum-norm": sum_b (sum_t per_token * mask / T) / global_seqs

    A fully masked row (stale-token masking can empty one) contributes nothing: no term to the
    sum and no count to the seq-mean normaliser, as in verl's agg_loss. The loss of a batch
    with such a row equals the loss of the batch without it.

    Contract for the normalisers: `global_tokens` is the response-token count and
    `global_seqs` the count of rows with at least one response token of the WHOLE mini-batch,
    summed over its micro-batches and over data-parallel ranks (policy.normalisers). Each
    micro-batch divides its own sum by these global counts, so the micro-batch losses of one
    rank add up to that rank's share of the mini-batch loss, independent of the micro-batch
    size. "token-sum" divides by nothing: each micro-batch's loss is its own masked sum, and
    those sums add up to the rank's sum. FSDP/DDP average gradients over ranks, so the caller
    multiplies each rank's loss by the world size to get the gradient of the global loss (for
    token-sum, of the sum over every rank's tokens, as verl's token-sum). Left as None, the
    normalisers default to this call's own token count and non-empty row count (the loss of
    this call alone).

    "seq-mean-token-sum-norm" divides by T = mask.shape[-1]; for Dr.GRPO's constant
    normaliser every micro-batch must be padded to the same (maximum) response length.
    """
    if loss_agg_mode not in LOSS_AGG_MODES:
        raise ValueError(
            f"unknown loss_agg_mode {loss_agg_mode!r}; expected one of {list(LOSS_AGG_MODES)}"
        )
    if per_token.shape != mask.shape:
        raise ValueError(f"per_token {tuple(per_token.shape)} and mask {tuple(mask.shape)} differ")
    for name, value in (("global_tokens", global_tokens), ("global_seqs", global_seqs)):
        if value is not None and value <= 0:
            raise ValueError(f"{name} must be > 0, got {value}")
    keep = mask.bool()
    # where(), not multiply: padding may hold inf/NaN, and NaN * 0 is NaN.
    values = torch.where(keep, per_token, 0.0)  # (B, T)
    if loss_agg_mode == "token-sum":
        return values.sum()
    if loss_agg_mode == "token-mean":
        if global_tokens is None:
            return values.sum() / keep.sum().clamp(min=1)
        return values.sum() / global_tokens

    lengths = keep.sum(-1)  # (B,)
    seq_sums = values.sum(-1)  # (B,), 0 for an empty row
    if loss_agg_mode == "seq-mean-token-sum":
        per_seq = seq_sums
    elif loss_agg_mode == "seq-mean-token-mean":
        per_seq = seq_sums / lengths.clamp(min=1)
    else:  # seq-mean-token-sum-norm
        per_seq = seq_sums / mask.shape[-1]
    if global_seqs is None:
        return per_seq.sum() / (lengths > 0).sum().clamp(min=1)
    return per_seq.sum() / global_seqs


def policy_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float = 3.0,
    loss_agg_mode: str = "token-mean",
    global_tokens: float | None = None,
    global_seqs: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO-clip policy-gradient loss with clip-higher and dual clip, aggregated.

    With r = exp(log_prob - old_log_prob) and A the advantage, per token:
        l = max(-A r, -A clip(r, 1 - clip_ratio_low, 1 + clip_ratio_high))
        l = min(l, -A clip_ratio_c)     only where A < 0 (dual clip)
    then aggregate_loss(l, response_mask, loss_agg_mode, global_tokens, global_seqs).

    TIS: multiplying the advantages by positive per-token weights w (truncated_importance_weights)
    is the same as multiplying l by w: every branch above is linear in A.

    Metrics (means over this call's unmasked tokens):
      actor/pg_clipfrac        fraction where the clipped branch was taken
      actor/pg_clipfrac_lower  fraction where the dual clip capped the loss (A < 0)
      actor/ppo_kl             mean of old_log_prob - log_prob (k1 estimate of KL(old || new))
    """
    if clip_ratio_c <= 1:
        raise ValueError(f"clip_ratio_c must be > 1, got {clip_ratio_c}")
    if not log_prob.shape == old_log_prob.shape == response_mask.shape:
        raise ValueError(
            f"log_prob {tuple(log_prob.shape)}, old_log_prob {tuple(old_log_prob.shape)} and "
            f"response_mask {tuple(response_mask.shape)} must have one shape"
        )
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1)  # (B, 1), broadcast over T
    batch, length = log_prob.shape
    if tuple(advantages.shape) not in ((batch, 1), (batch, length)):
        raise ValueError(
            f"advantages {tuple(advantages.shape)} do not fit log_prob {tuple(log_prob.shape)}"
        )

    log_ratio = log_prob - old_log_prob  # (B, T)
    ratio = torch.exp(log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1 - clip_ratio_low, 1 + clip_ratio_high)
    clip_loss = torch.maximum(unclipped, clipped)  # (B, T)
    dual_cap = -advantages * clip_ratio_c  # (B, T) or (B, 1)
    negative = advantages < 0
    per_token = torch.where(negative, torch.minimum(clip_loss, dual_cap), clip_loss)
    loss = aggregate_loss(per_token, response_mask, loss_agg_mode, global_tokens, global_seqs)

    with torch.no_grad():
        keep = response_mask.bool()
        clipfrac, clipfrac_lower, ppo_kl = torch.stack(
            [
                _masked_mean((clipped > unclipped).to(log_prob.dtype), keep),
                _masked_mean(((clip_loss > dual_cap) & negative).to(log_prob.dtype), keep),
                _masked_mean(-log_ratio, keep),
            ]
        ).tolist()  # one device sync for the three
    metrics = {
        "actor/pg_clipfrac": clipfrac,
        "actor/pg_clipfrac_lower": clipfrac_lower,
        "actor/ppo_kl": ppo_kl,
    }
    return loss, metrics


def truncated_importance_weights(
    old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, cap: float
) -> torch.Tensor:
    """TIS weights min(pi_old / pi_rollout, cap), (B, T), detached.

    old_log_prob is the trainer's recomputation of the sampled tokens' log-probs, and
    rollout_log_prob what the inference engine reported for the same weights; the two differ
    by kernel and precision mismatches. The weights correct the policy gradient for sampling
    from the engine's distribution; the cap bounds their variance. Off unless `tis_cap` is set.
    """
    if cap <= 0:
        raise ValueError(f"TIS cap must be > 0, got {cap}")
    return torch.exp(old_log_prob - rollout_log_prob).clamp(max=cap).detach()


def compose_actor_loss(
    pg_loss: torch.Tensor,
    entropy_loss: torch.Tensor | float,
    kl_loss: torch.Tensor | float,
    entropy_coeff: float,
    kl_loss_coef: float,
) -> torch.Tensor:
    """pg_loss - entropy_coeff * entropy_loss + kl_loss_coef * kl_loss.

    Signs: the loss is minimised, so the entropy term (aggregated entropy, a bonus that keeps
    exploration up) is subtracted, and the KL(actor || ref) term (a penalty) is added. Pass
    0.0 for a term that is switched off.
    """
    return pg_loss - entropy_coeff * entropy_loss + kl_loss_coef * kl_loss


def _masked_mean(values: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Mean of values where keep is True (0 if none); NaN/inf outside keep do not leak in."""
    return torch.where(keep, values, 0.0).sum() / keep.sum().clamp(min=1)
