"""Unit tests for `hybrid.workers.sequences`: unpadding prompts, position ids from the attention
mask (packing Samples into the rollout tensors: tests/unit/data/test_sample.py)."""

import pytest
import torch

from hybrid.workers.sequences import position_ids_from_mask, unpad_prompts

pytestmark = pytest.mark.unit

PAD = 99
# two left-padded prompts of width 4
PROMPTS = torch.tensor([[PAD, PAD, 5, 6], [7, 8, 9, 10]])
PROMPT_MASK = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])


def test_unpad_prompts_keeps_the_real_tokens() -> None:
    assert unpad_prompts(PROMPTS, PROMPT_MASK) == [[5, 6], [7, 8, 9, 10]]
    assert unpad_prompts(PROMPTS, PROMPT_MASK.bool()) == [[5, 6], [7, 8, 9, 10]]


def test_position_ids_count_real_tokens_from_zero() -> None:
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 0, 0, 0, 1]])
    expected = torch.tensor([[0, 0, 0, 1, 2], [0, 1, 2, 3, 4], [0, 0, 0, 0, 0]])
    assert torch.equal(position_ids_from_mask(mask), expected)
    assert torch.equal(position_ids_from_mask(mask.bool()), expected)
