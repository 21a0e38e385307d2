"""PPO-clip policy-gradient loss (the placeholder until the full GRPO loss family lands).

Shapes: all (batch, response_len); advantages may be (batch,) and broadcast over tokens.
Per-token loss: -min(r * A, clip(r, 1 - eps, 1 + eps) * A), r = exp(log_prob - old_log_prob),
summed over response tokens and divided by `num_tokens` (the caller passes the token count of
the whole local batch, so micro-batches add up to the token mean).
"""

from __future__ import annotations

import torch


def ppo_clip_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_ratio: float,
    num_tokens: int | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1).expand_as(log_prob)
    mask = response_mask.to(log_prob.dtype)
    denominator = float(num_tokens) if num_tokens is not None else float(mask.sum().clamp(min=1))
    log_ratio = log_prob - old_log_prob
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1 - clip_ratio, 1 + clip_ratio)
    per_token = torch.maximum(unclipped, clipped)
    loss = (per_token * mask).sum() / denominator
    with torch.no_grad():
        tokens = mask.sum().clamp(min=1)
        metrics = {
            "actor/pg_clipfrac": float(
                ((clipped > unclipped).to(mask.dtype) * mask).sum() / tokens
            ),
            "actor/ppo_kl": float((-log_ratio * mask).sum() / tokens),
        }
    return loss, metrics
