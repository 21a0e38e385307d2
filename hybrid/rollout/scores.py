"""An engine's per-sequence scores as the (b, R) response tensor the trainer compares with."""

from __future__ import annotations

import torch


def response_scores(scores: list[list[float]], response_mask: torch.Tensor) -> torch.Tensor:
    """(b, R) log-probs of the response tokens from per-sequence scores: the last n values of
    a sequence's scores belong to its n response tokens; padding stays 0."""
    out = torch.zeros(response_mask.shape, dtype=torch.float32)
    for i, (seq_scores, mask) in enumerate(zip(scores, response_mask, strict=True)):
        n = int(mask.sum())
        if n:
            out[i, :n] = torch.tensor(seq_scores[-n:])
    return out
