"""An engine's per-sequence scores as the (b, R) response tensor the trainer compares with."""

from __future__ import annotations

import torch


def response_scores(
    scores: list[list[float]], response_mask: torch.Tensor, real_response: torch.Tensor
) -> torch.Tensor:
    """(b, R) log-probs of the model's response tokens from per-sequence scores: the last n
    values of a sequence's scores belong to its n real response tokens (`real_response`, the
    response half of the attention mask); they are kept where `response_mask` is 1 (an agent
    trajectory's tool tokens and all padding stay 0)."""
    out = torch.zeros(response_mask.shape, dtype=torch.float32)
    for i, (seq_scores, real) in enumerate(zip(scores, real_response, strict=True)):
        n = int(real.sum())
        if n:
            out[i, :n] = torch.tensor(seq_scores[-n:])
    return torch.where(response_mask.bool(), out, 0.0)
