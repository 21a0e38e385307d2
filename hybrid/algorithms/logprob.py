"""Log-probabilities and entropy from logits.

Shapes: logits (batch, len, vocab); labels, log-probs and entropy (batch, len). Computed in
float32 whatever the logits' dtype: bf16 log-softmax loses the precision the sync check needs.
"""

from __future__ import annotations

import torch


def log_probs_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """log p(label) under softmax(logits); (b, t, v), (b, t) -> (b, t)."""
    logits = logits.float()
    picked = torch.gather(logits, -1, labels.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits); (b, t, v) -> (b, t)."""
    logits = logits.float()
    log_z = torch.logsumexp(logits, dim=-1)
    probs = torch.softmax(logits, dim=-1)
    return log_z - (probs * logits).sum(-1)


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over the positions where mask is 1 (0 if there are none)."""
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1)
