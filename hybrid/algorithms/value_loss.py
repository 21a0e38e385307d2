"""The critic's loss: PPO clipped value loss, and the explained-variance metric.

Clipped value loss (PPO2 / verl), with V the critic's current values, V_old its values at
rollout time (the ones GAE used) and R the returns (gae.compute_gae_advantages), per token:

    V_clip = V_old + clamp(V - V_old, -cliprange_value, cliprange_value)
    l      = 0.5 * max((V - R)^2, (V_clip - R)^2)

aggregated with policy_loss.aggregate_loss (same modes and global normalisers as the actor).
The max makes the loss pessimistic: where V moved more than cliprange_value away from V_old
and that move brought it closer to R, the clipped branch (constant in V) is the larger one and
gives no gradient. Clip fraction: the fraction of valid tokens where the clipped branch is
strictly larger.

Explained variance 1 - Var[R - V] / Var[R] over the valid tokens: 1 is a perfect critic, 0
one no better than the constant mean return, negative a worse one.

Shapes: values, old_values, returns and response_mask (B, T); losses 0-d tensors.
"""

from __future__ import annotations

import torch

from hybrid.algorithms.policy_loss import aggregate_loss


def clipped_value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange_value: float,
    loss_agg_mode: str = "token-mean",
    global_tokens: float | None = None,
    global_seqs: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, clipfrac): the clipped value loss (0-d, gradient through `values` only) and the
    clip fraction (0-d float32, detached, mean over this call's valid tokens).

    global_tokens / global_seqs: the mini-batch normalisers of policy_loss.aggregate_loss.
    """
    if cliprange_value <= 0:
        raise ValueError(f"cliprange_value must be > 0, got {cliprange_value}")
    if not values.shape == old_values.shape == returns.shape == response_mask.shape:
        raise ValueError(
            f"values {tuple(values.shape)}, old_values {tuple(old_values.shape)}, returns "
            f"{tuple(returns.shape)} and response_mask {tuple(response_mask.shape)} must "
            "have one shape"
        )
    keep = response_mask.bool()
    # Zero the padding first: a NaN there would otherwise turn its zero gradient into NaN.
    values = torch.where(keep, values, 0.0)
    old_values = torch.where(keep, old_values.detach(), 0.0)
    returns = torch.where(keep, returns.detach(), 0.0)
    clipped = old_values + (values - old_values).clamp(-cliprange_value, cliprange_value)
    unclipped_loss = (values - returns).square()  # (B, T)
    clipped_loss = (clipped - returns).square()
    per_token = 0.5 * torch.maximum(unclipped_loss, clipped_loss)
    loss = aggregate_loss(per_token, response_mask, loss_agg_mode, global_tokens, global_seqs)
    with torch.no_grad():
        took_clip = (clipped_loss > unclipped_loss) & keep
        clipfrac = took_clip.sum().float() / keep.sum().clamp(min=1)
    return loss, clipfrac


def explained_variance(returns: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> float:
    """1 - Var[returns - values] / Var[returns] over the elements where mask is 1.

    Population (biased) variances in float64; the ratio is the same with unbiased ones for
    n >= 2. Where Var[returns] is 0 (constant returns, or fewer than two valid elements) there
    is nothing to explain and the result is defined as 0.0, so a metric sink never gets NaN.
    """
    if not returns.shape == values.shape == mask.shape:
        raise ValueError(
            f"returns {tuple(returns.shape)}, values {tuple(values.shape)} and mask "
            f"{tuple(mask.shape)} must have one shape"
        )
    keep = mask.bool()
    target = returns.detach()[keep].to(torch.float64)
    residual = target - values.detach()[keep].to(torch.float64)
    if target.numel() == 0:
        return 0.0
    var_returns = target.var(correction=0).item()
    if var_returns == 0:
        return 0.0
    return 1.0 - residual.var(correction=0).item() / var_returns
