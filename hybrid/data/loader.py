"""`PromptLoader`: a `PromptDataset` to an endless, resumable stream of prompt `Batch`es.

Epoch `e` visits the rows in the order `numpy.random.default_rng([seed, e]).permutation(n)`,
so the order depends only on (seed, epoch, number of rows), never on what ran before. The
position is two integers (epoch, offset of the next row in that epoch's order); restoring them
with `load_state_dict` continues exactly where the saved loader was.

Output Batch (b = batch_size, p = dataset.max_prompt_length):
  tensors: input_ids (b, p) left-padded with the pad id, attention_mask (b, p);
  non-tensors: uid ("epoch-index", unique per row and epoch), data_source, ground_truth (str),
  extra_info (dict), raw_prompt (the user message text); and, only when some row of the dataset
  has images, images (an `ImageSet` per row, empty for a text-only row).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from hybrid.data.batch import Batch
from hybrid.data.dataset import PromptDataset
from hybrid.data.images import IMAGES_COLUMN, ImageSet
from hybrid.data.prompts import left_pad


class PromptLoader:
    """Shuffled batches of `batch_size` prompts per step, across epochs without end."""

    def __init__(
        self,
        dataset: PromptDataset,
        batch_size: int,
        seed: int = 0,
        shuffle: bool = True,
        drop_last: bool = True,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if drop_last and batch_size > len(dataset):
            raise ValueError(
                f"batch_size={batch_size} is larger than the dataset ({len(dataset)} prompts) "
                "and drop_last=True, so no batch would ever be produced"
            )
        self.dataset = dataset
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.epoch = 0
        self.offset = 0
        """Position of the next row in this epoch's order."""
        self._order_epoch = -1
        self._order = np.zeros(0, dtype=np.int64)

    @property
    def steps_per_epoch(self) -> int:
        """Batches per epoch (a last, smaller one counts when drop_last is False)."""
        full, rest = divmod(len(self.dataset), self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    def _epoch_order(self, epoch: int) -> np.ndarray:
        if self._order_epoch != epoch:
            n = len(self.dataset)
            rng = np.random.default_rng([self.seed, epoch])
            self._order = rng.permutation(n) if self.shuffle else np.arange(n)
            self._order_epoch = epoch
        return self._order

    def next_batch(self) -> Batch:
        """The next `batch_size` prompts; moves to the next epoch when this one is used up."""
        remaining = len(self.dataset) - self.offset
        if remaining == 0 or (self.drop_last and remaining < self.batch_size):
            self.epoch += 1
            self.offset = 0
        order = self._epoch_order(self.epoch)
        indices = order[self.offset : self.offset + self.batch_size].tolist()
        self.offset += len(indices)
        return self._make_batch(indices, [f"{self.epoch}-{i}" for i in indices])

    def __iter__(self) -> Iterator[Batch]:
        while True:
            yield self.next_batch()

    def validation_batches(self, batch_size: int) -> Iterator[Batch]:
        """All rows in dataset order, `batch_size` at a time, the last batch possibly smaller.

        Does not touch the training position; uids are "val-index".
        """
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        for start in range(0, len(self.dataset), batch_size):
            indices = list(range(start, min(start + batch_size, len(self.dataset))))
            yield self._make_batch(indices, [f"val-{i}" for i in indices])

    def _make_batch(self, indices: Sequence[int], uids: list[str]) -> Batch:
        rows = [self.dataset[i] for i in indices]
        padded = left_pad(
            [row.token_ids for row in rows],
            self.dataset.max_prompt_length,
            self.dataset.pad_token_id,
        )
        non_tensors: dict[str, list[Any]] = {
            "uid": uids,
            "data_source": [row.data_source for row in rows],
            "ground_truth": [row.ground_truth for row in rows],
            "extra_info": [dict(row.extra_info) for row in rows],
            "raw_prompt": [row.raw_prompt for row in rows],
        }
        if self.dataset.has_images:
            non_tensors[IMAGES_COLUMN] = [row.images or ImageSet(()) for row in rows]
        return Batch.from_dict(padded.tensors, non_tensors)

    def state_dict(self) -> dict[str, int]:
        """The position: epoch, offset within it, the seed and the dataset size it was taken on."""
        return position_state(self.epoch, self.offset, self.seed, len(self.dataset))

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from a `state_dict()`; the seed and the dataset size must match this loader's."""
        self.epoch, self.offset = checked_position(
            state,
            self.seed,
            len(self.dataset),
            "loader state",
            ("seed", "prompts"),
            "did the data or max_prompt_length change?",
        )


def position_state(epoch: int, offset: int, seed: int, num_rows: int) -> dict[str, int]:
    """A shuffled loader's position (epoch, offset in its order) and what it was taken on."""
    return {"epoch": epoch, "offset": offset, "seed": seed, "num_rows": num_rows}


def checked_position(
    state: Mapping[str, Any],
    seed: int,
    num_rows: int,
    what: str,
    names: tuple[str, str] = ("seed", "rows"),
    changed_hint: str = "did the data change?",
) -> tuple[int, int]:
    """(epoch, offset) of a `position_state` taken with this `seed` on `num_rows` rows; any
    other state is refused, naming `what` it is, the seed's field and the rows (`names`), and
    why the size may differ (`changed_hint`)."""
    seed_name, rows_name = names
    missing = sorted({"epoch", "offset", "seed", "num_rows"} - set(state))
    if missing:
        raise ValueError(f"{what} is missing {missing}")
    if state["seed"] != seed:
        raise ValueError(
            f"{what} was saved with {seed_name}={state['seed']}, this run has {seed_name}={seed}; "
            "the shuffle order would differ"
        )
    if state["num_rows"] != num_rows:
        raise ValueError(
            f"{what} was saved on {state['num_rows']} {rows_name}, this data has {num_rows} "
            f"({changed_hint})"
        )
    if state["epoch"] < 0 or not 0 <= state["offset"] <= num_rows:
        raise ValueError(
            f"{what} has epoch={state['epoch']} offset={state['offset']}; expected epoch >= 0 "
            f"and 0 <= offset <= {num_rows}"
        )
    return int(state["epoch"]), int(state["offset"])
