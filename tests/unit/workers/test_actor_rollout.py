"""The colocated rollout batch (`beside_prompts`): n adjacent rows per prompt that keep the
prompt row's own columns (its uid: the GRPO group) beside the generated ones."""

from __future__ import annotations

import pytest
import torch

from hybrid.data import Batch
from hybrid.workers.actor_rollout import beside_prompts

pytestmark = pytest.mark.unit


def test_prompt_columns_repeat_beside_the_generated_ones() -> None:
    prompts = Batch.from_dict(
        {
            "input_ids": torch.tensor([[0, 5], [6, 7]]),
            "attention_mask": torch.tensor([[0, 1], [1, 1]]),
            "seed": torch.tensor([10, 11]),
        },
        {"uid": ["a", "b"], "ground_truth": ["1", "2"]},
    )
    generated = Batch.from_dict(
        {
            "input_ids": torch.arange(12).view(4, 3),
            "attention_mask": torch.ones(4, 3, dtype=torch.long),
        }
    )
    out = beside_prompts(prompts, generated, n=2)
    assert list(out["uid"]) == ["a", "a", "b", "b"]
    assert out["seed"].tolist() == [10, 10, 11, 11]  # tensors stay tensors
    assert torch.equal(out["input_ids"], generated["input_ids"])
    bare = prompts.select(["input_ids", "attention_mask"])
    assert beside_prompts(bare, generated, n=2).keys() == generated.keys()
