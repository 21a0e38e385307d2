"""Padded prompt rows back to token lists (position ids: see hybrid.data.sample).

(Samples to the padded rollout tensors is `hybrid.data.sample.samples_to_batch`.)
"""

from __future__ import annotations

import torch

from hybrid.data.sample import position_ids_from_mask

__all__ = ["position_ids_from_mask", "unpad_prompts"]


def unpad_prompts(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> list[list[int]]:
    """The real tokens of each left-padded prompt row."""
    return [row[mask.bool()].tolist() for row, mask in zip(input_ids, attention_mask, strict=True)]
