"""What the two decoupled sources (split's buffer, fully-async's queue) share: the explorer
group they generate with, the Synchronizer's two sides, the prompts, and how Samples become a
train batch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hybrid.controller import RayWorkerGroup
from hybrid.data import Batch
from hybrid.data.sample import samples_to_batch
from hybrid.trainer.config import TrainerRunConfig
from hybrid.trainer.prompts import PromptFeed
from hybrid.trainer.weight_sync import SyncSides

POLL_S = 0.5
"""How often the trainer, waiting for data, looks at the generating side's health (and, in
split, at sync requests)."""


@dataclass
class ExplorerSide:
    config: TrainerRunConfig
    explorers: RayWorkerGroup
    sides: SyncSides
    feed: PromptFeed
    pad_token_id: int

    def to_batch(self, samples: list[Any]) -> Batch:
        c = self.config
        return samples_to_batch(
            samples, c.rollout.response_length, self.pad_token_id, c.data.max_prompt_length
        )

    def generate_greedy(self, prompts: Batch) -> Batch:
        """Validation runs on the explorers, with the weights they hold (never the dummy
        weights an engine starts with: the starting version is loaded before anything runs)."""
        out = self.explorers.generate_sequences(prompts, greedy=True)
        held = out.tensors["versions"][out.tensors["response_mask"].bool()]
        if held.numel() and int(held.min()) < 0:
            raise RuntimeError("validation ran on an explorer that holds no weight version yet")
        return out
