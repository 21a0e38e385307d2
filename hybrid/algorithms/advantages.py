"""Outcome-reward advantages: GRPO (group-normalised) and Dr.GRPO (group-centred only).

Each prompt is sampled `n` times; the rows sharing a prompt uid form a group. The advantage
of a row is its score relative to its own group:

    GRPO:     A_i = (s_i - mean_g) / (std_g + epsilon)    std_g unbiased (torch.std default)
    Dr.GRPO:  A_i =  s_i - mean_g                           (norm_by_std=False)

A group of one row has no baseline to compare with and gets advantage 0, never NaN. Groups
need not be contiguous: rows are matched by uid, not by position.

Shapes: scores and advantages (batch,); group_ids one hashable per row. The advantage is a
per-sequence scalar; policy_loss broadcasts it over the response tokens.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np
import torch


def compute_grpo_advantages(
    scores: torch.Tensor,
    group_ids: Sequence[Hashable] | np.ndarray | torch.Tensor,
    norm_by_std: bool = True,
    epsilon: float = 1e-6,
) -> torch.Tensor:
    """Group-relative advantages, (batch,) float scores -> (batch,) float32 advantages.

    `group_ids[i]` is row i's prompt uid (str, int, ...; a tensor or array of them works too).
    Statistics are taken in float64 so that large, nearly equal scores keep their differences.
    The result carries no gradient: advantages are constants of the policy-gradient loss.
    """
    if scores.dim() != 1:
        raise ValueError(f"scores must be 1-D (batch,), got shape {tuple(scores.shape)}")
    index = _group_index(group_ids, scores.device)
    if index.numel() != scores.numel():
        raise ValueError(f"got {index.numel()} group_ids for {scores.numel()} scores")
    num_groups = int(index.max().item()) + 1 if index.numel() else 0

    values = scores.detach().to(torch.float64)
    zeros = torch.zeros(num_groups, dtype=torch.float64, device=scores.device)
    counts = torch.bincount(index, minlength=num_groups).to(torch.float64)  # (groups,)
    mean = zeros.index_add(0, index, values) / counts.clamp(min=1)  # (groups,)
    centered = values - mean[index]  # (batch,)
    if norm_by_std:
        # Two-pass variance (sum of squared deviations from the mean): no cancellation.
        squares = zeros.index_add(0, index, centered.square())
        std = (squares / (counts - 1).clamp(min=1)).sqrt()  # (groups,), unbiased
        advantages = centered / (std[index] + epsilon)
    else:
        advantages = centered
    # Singleton groups: centered is already 0, but make it explicit and immune to epsilon=0.
    advantages = torch.where(counts[index] > 1, advantages, torch.zeros_like(advantages))
    return advantages.to(torch.float32)


def _group_index(
    group_ids: Sequence[Hashable] | np.ndarray | torch.Tensor, device: torch.device
) -> torch.Tensor:
    """Dense group index per row (first-seen order), (batch,) int64 on `device`."""
    ids = group_ids.tolist() if isinstance(group_ids, torch.Tensor | np.ndarray) else group_ids
    dense: dict[Hashable, int] = {}
    index = [dense.setdefault(uid, len(dense)) for uid in ids]
    return torch.tensor(index, dtype=torch.int64, device=device)
