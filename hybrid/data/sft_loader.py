"""`SftLoader`: an `SftDataset` to an endless, resumable stream of SFT `Batch`es, in the
rollout batch layout so that the actor's forward runs on them unchanged.

Epoch `e` visits the rows in the order `numpy.random.default_rng([seed, e]).permutation(n)`,
as `PromptLoader` does (hybrid/data/loader.py); a step takes the next `batch_size` rows of that
order, and an epoch's remainder smaller than a batch is skipped. The position is two integers
(epoch, offset) that `state_dict` / `load_state_dict` save and restore.

Batch (b = batch_size, P = the longest prompt of the batch, R = the longest response), the
layout of `samples_to_batch` (hybrid/data/sample.py):
  input_ids / attention_mask / position_ids (b, P + R): the prompt left-padded, then the
    response right-padded;
  responses / response_mask (b, R): the tokens after the prompt and their loss mask;
  non-tensor `source` ("file:row") and `truncated` (bool).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from hybrid.data.batch import Batch
from hybrid.data.loader import checked_position, position_state
from hybrid.data.sample import NO_VERSION, Sample, SampleStatus, samples_to_batch
from hybrid.data.sft import SftDataset, SftRow

SFT_KEYS = ("input_ids", "attention_mask", "position_ids", "responses", "response_mask")
"""The tensors an SFT update reads."""


def sft_batch(rows: Sequence[SftRow], pad_token_id: int) -> Batch:
    """The padded batch of `rows`, in their order (the rollout layout: prompts left-padded,
    responses right-padded, response_mask the loss mask)."""
    samples = [
        Sample(
            uid=row.source,
            index=0,
            prompt_ids=row.prompt_ids,
            response_ids=row.response_ids,
            rollout_log_probs=[0.0] * len(row.response_ids),
            versions=[NO_VERSION] * len(row.response_ids),
            status=SampleStatus.COMPLETED,
            loss_mask=row.loss_mask,
        )
        for row in rows
    ]
    width = max(len(row.response_ids) for row in rows)
    batch = samples_to_batch(samples, width, pad_token_id)
    return Batch.from_dict(
        {key: batch.tensors[key] for key in SFT_KEYS},
        {"source": [row.source for row in rows], "truncated": [row.truncated for row in rows]},
    )


class SftLoader:
    """Shuffled batches of `batch_size` SFT rows per step, across epochs without end."""

    def __init__(self, dataset: SftDataset, batch_size: int, seed: int = 0) -> None:
        if batch_size < 1:
            raise ValueError(f"sft.batch_size must be >= 1, got {batch_size}")
        if batch_size > len(dataset):
            raise ValueError(
                f"sft.batch_size={batch_size} is larger than the SFT data ({len(dataset)} rows "
                "in sft.train_files), so no step would ever be full"
            )
        self.dataset = dataset
        self.batch_size = batch_size
        self.seed = seed
        self.epoch = 0
        self.offset = 0
        """Position of the next row in this epoch's order."""

    def _epoch_order(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.dataset))

    def next_batch(self) -> Batch:
        """The next `batch_size` rows; moves to the next epoch when this one has too few."""
        if len(self.dataset) - self.offset < self.batch_size:
            self.epoch += 1
            self.offset = 0
        order = self._epoch_order(self.epoch)
        indices = order[self.offset : self.offset + self.batch_size].tolist()
        self.offset += len(indices)
        return sft_batch([self.dataset[i] for i in indices], self.dataset.pad_token_id)

    def state_dict(self) -> dict[str, int]:
        """The position: epoch, offset within it, the seed and the dataset size it was taken on."""
        return position_state(self.epoch, self.offset, self.seed, len(self.dataset))

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from a `state_dict()`; sft.seed and the SFT data's size must match."""
        self.epoch, self.offset = checked_position(
            state,
            self.seed,
            len(self.dataset),
            "the SFT loader state",
            ("sft.seed", "SFT rows"),
            "did sft.train_files change?",
        )
