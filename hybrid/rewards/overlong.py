"""DAPO's overlong reward shaping (Yu et al. 2025, "soft overlong punishment"): a penalty that
grows linearly over a buffer of `len` tokens before a row's length limit, added to its reward.

With L_max a row's budget, L_cache the buffer and |y| the response's length:

    R_length = 0                                    |y| <= L_max - L_cache
             = ((L_max - L_cache) - |y|) / L_cache  L_max - L_cache < |y| <= L_max
             = -1                                   |y| > L_max

times `penalty_factor`. Differences from verl's DAPO reward manager, which has one global
L_max (data.max_response_length):
- L_max is the row's own budget: rollout.response_length, lowered by the row's
  extra_info.max_response_tokens (hybrid.rollout.base.response_budgets), since the engine stops
  the row there and a response cut at its budget must reach the full penalty.
- A budget shorter than the buffer makes the whole budget the buffer (L_cache = L_max): the
  ramp still runs from 0 at an empty response to -1 at the limit, rather than penalising rows
  that used none of their budget.
- |y| is every real response token (attention_mask's response half): for an agent trajectory
  the model's turns and the tool replies between them, since both fill the budget the engine
  enforces. The loss mask (response_mask) counts only the model's tokens and would never reach
  the limit of a trajectory the tools filled.

Shapes: lengths, budgets, penalties (b,).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from hybrid.data import Batch

if TYPE_CHECKING:
    from hybrid.rewards.config import OverlongBufferConfig


def length_ramp(lengths: torch.Tensor, budgets: torch.Tensor, buffer_len: int) -> torch.Tensor:
    """R_length per row, in [-1, 0], before the penalty factor: 0 up to `budget - buffer`,
    then down linearly to -1 at the budget, -1 past it. The buffer is at most the row's budget.
    lengths, budgets (b,) integers; returns (b,) float32."""
    if buffer_len < 1:
        raise ValueError(f"reward.overlong_buffer.len must be >= 1, got {buffer_len}")
    if lengths.shape != budgets.shape:
        raise ValueError(
            f"lengths {tuple(lengths.shape)} and budgets {tuple(budgets.shape)} differ"
        )
    if bool((budgets < 1).any()):
        raise ValueError(f"every row's budget must be >= 1 token, got {budgets.tolist()}")
    buffers = budgets.clamp(max=buffer_len).float()
    start = budgets.float() - buffers
    return ((start - lengths.float()) / buffers).clamp(min=-1.0, max=0.0)


def overlong_penalty(
    lengths: torch.Tensor, budgets: torch.Tensor, buffer_len: int, penalty_factor: float
) -> tuple[torch.Tensor, dict[str, float]]:
    """The penalties to add to the rewards (b,) float32, and reward/overlong_penalty_mean
    (over all rows) and reward/overlong_fraction (rows whose length entered the buffer, so a
    factor of 0 still shows how many would be penalised)."""
    ramp = length_ramp(lengths, budgets, buffer_len)
    penalties = ramp * penalty_factor
    rows = max(len(ramp), 1)
    metrics = {
        "reward/overlong_penalty_mean": float(penalties.sum()) / rows,
        "reward/overlong_fraction": float((ramp < 0).sum()) / rows,
    }
    return penalties, metrics


def response_lengths(batch: Batch) -> torch.Tensor:
    """Real response tokens per row (b,): attention_mask's response half, tool and environment
    replies of an agent trajectory included (the budget holds them too)."""
    width = batch.tensors["responses"].shape[1]
    return batch.tensors["attention_mask"][:, -width:].sum(dim=-1)


def shape_overlong(
    batch: Batch, budgets: Sequence[int], config: OverlongBufferConfig
) -> tuple[torch.Tensor, dict[str, float]]:
    """`overlong_penalty` of a rollout batch whose rows had `budgets` tokens each."""
    if len(budgets) != len(batch):
        raise ValueError(f"{len(budgets)} budgets for a batch of {len(batch)} rows")
    return overlong_penalty(
        response_lengths(batch),
        torch.tensor(list(budgets), dtype=torch.long),
        config.len,
        config.penalty_factor,
    )
