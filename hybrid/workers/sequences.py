"""Turning prompts + sampled responses into the padded tensors every later stage reads.

Shapes: P = prompt width (left-padded), R = response width (right-padded), b = rows.
  prompts (b, P)   responses (b, R)   response_mask (b, R)   rollout_log_probs (b, R)
  input_ids / attention_mask / position_ids (b, P + R)
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hybrid.rollout.base import GeneratedSample


def unpad_prompts(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> list[list[int]]:
    """The real tokens of each left-padded prompt row."""
    return [row[mask.bool()].tolist() for row, mask in zip(input_ids, attention_mask, strict=True)]


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """0, 1, 2, ... over the real tokens; left padding gets 0, right padding repeats the last
    position (both are masked out)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def pack_rollout(
    prompts: torch.Tensor,
    prompt_mask: torch.Tensor,
    samples: Sequence[GeneratedSample],
    response_length: int,
    pad_token_id: int,
) -> dict[str, torch.Tensor]:
    rows = len(samples)
    responses = torch.full((rows, response_length), pad_token_id, dtype=torch.long)
    response_mask = torch.zeros((rows, response_length), dtype=torch.long)
    log_probs = torch.zeros((rows, response_length), dtype=torch.float32)
    for i, sample in enumerate(samples):
        n = len(sample.token_ids)
        if n > response_length:
            raise ValueError(
                f"row {i}: the engine returned {n} tokens, more than response_length={response_length}"
            )
        responses[i, :n] = torch.tensor(sample.token_ids, dtype=torch.long)
        response_mask[i, :n] = 1
        log_probs[i, :n] = torch.tensor(sample.log_probs, dtype=torch.float32)
    attention_mask = torch.cat([prompt_mask.long(), response_mask], dim=1)
    return {
        "prompts": prompts,
        "responses": responses,
        "response_mask": response_mask,
        "rollout_log_probs": log_probs,
        "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention_mask,
        "position_ids": position_ids_from_mask(attention_mask),
    }
