"""The prompts a run trains on, drawn in order, each row with its sampling seed.

Sampling is a function of (trainer.seed, draw, round, row), so a resumed run draws what the
uninterrupted one drew. The colocated and split sources draw one batch per step; the
fully-async Rollouter asks for any number of rows (`rows`), cut from whole batches.
"""

from __future__ import annotations

import threading

import torch

from hybrid.data import Batch, PromptLoader

ROUND_SEED_STRIDE = 1 << 40
"""Seed offset of each further generation round of a step (dynamic sampling)."""


class PromptFeed:
    def __init__(self, loader: PromptLoader, seed: int) -> None:
        self.loader = loader
        self.seed = seed
        self._spare: list[Batch] = []
        self._draws = 0
        self._lock = threading.Lock()
        """The Rollouter draws on its own thread while a checkpoint reads the position."""
        self.last: Batch | None = None
        """The last batch `batch` drew (profiling/bench_floor.py replays its requests)."""

    def batch(self, draw: int, round: int = 0) -> Batch:
        """The loader's next batch, seeded as draw number `draw` (the step, colocated and split);
        `round`: dynamic sampling's further generation rounds of that step."""
        with self._lock:
            self.last = self._seeded(draw, round)
            return self.last

    def _seeded(self, draw: int, round: int = 0) -> Batch:
        # A step's further rounds draw other prompts, with seeds far from every first round's.
        base = (self.seed * 1_000_003 + draw) * 10_007 + round * ROUND_SEED_STRIDE
        prompts = self.loader.next_batch()
        return prompts.union(Batch.from_dict({"seed": torch.arange(len(prompts)) + base}))

    def start_rows(self, draws_done: int) -> None:
        """Row draws continue after `draws_done` batches (distinct seeds after a resume)."""
        self._draws = draws_done

    def rows(self, count: int) -> Batch:
        """The next `count` prompt rows (cut from whole batches; the rest is kept)."""
        with self._lock:
            held = sum(len(b) for b in self._spare)
            while held < count:
                self._draws += 1
                batch = self._seeded(self._draws)
                self._spare.append(batch)
                held += len(batch)
            spare = Batch.concat(self._spare)
            self._spare = [spare[count:]] if count < len(spare) else []
            return spare[:count]

    def position(self) -> tuple[dict[str, int], int]:
        """The loader's position now and how many drawn rows are not handed out yet."""
        with self._lock:
            return self.loader.state_dict(), sum(len(b) for b in self._spare)
