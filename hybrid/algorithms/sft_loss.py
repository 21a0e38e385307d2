"""Supervised fine-tuning's loss: token-mean cross-entropy of the target tokens.

    loss = -sum_{i,t} mask[i,t] * log p(y[i,t] | y[i,<t]) / global_tokens

`global_tokens` is the number of target tokens of the whole optimizer step: summed over its
micro-batches and over the data-parallel ranks (hybrid.workers.sft sums them), so a step's loss
is the mean over every target token it holds, whatever the micro-batch size or the split across
ranks (the normaliser of hybrid.workers.policy). Rows without a target token add nothing.

Shapes: log_probs, mask (b, R): the log-prob of each response token under the model, and the
loss mask (1 on target tokens).
"""

from __future__ import annotations

import torch


def sft_loss(
    log_probs: torch.Tensor, mask: torch.Tensor, global_tokens: float
) -> tuple[torch.Tensor, dict[str, float]]:
    """This micro-batch's share of the step's token-mean cross-entropy (a scalar, differentiable)
    and its metrics: `sft/micro_tokens`, the target tokens it holds."""
    weights = mask.to(log_probs.dtype)
    tokens = float(weights.sum())
    # max(., 1): a step without a target token has loss 0, not 0/0.
    loss = -(log_probs * weights).sum() / max(global_tokens, 1.0)
    return loss, {"sft/micro_tokens": tokens}
