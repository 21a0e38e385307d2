"""The `RolloutSource` protocol: where a train step's rollouts come from.

Three implementations, one per trainer.mode: `ColocatedSource` (the hybrid engine generates
on the training workers, between updates), `BufferSource` (explorer workers generate into the
experience buffer on a thread of the driver, the Synchronizer's styles keeping them within
their lag) and `QueueSource` (the Rollouter generates continuously into the message queue,
paced by the staleness rule, with partial rollouts). The loop (hybrid/trainer/loop.py) does
not know which one it holds.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

from hybrid.data import Batch
from hybrid.rewards.manager import Scores
from hybrid.rollout.base import Sampling

SOURCE_KEYS = frozenset({"timing_s/gen", "timing_s/trainer_wait"})
"""Keys every source adds to a step's metrics."""


@dataclass(frozen=True)
class Rollout:
    """One update's rollouts, as a source hands them to the train step."""

    batch: Batch
    rewards: Scores | None = None
    """Their rule rewards, already being scored (fully_async starts each group's as it leaves
    the queue) or scored (dynamic sampling needed them to choose the groups); None: the train
    step starts them."""


class RolloutSource(Protocol):
    lag_bound: int
    """The most weight versions a trained token may lag (0: always on-policy)."""
    probe_rows: int
    """The first rows of each batch that `probes_scored` wants with the trainer's log-probs
    under the version it trains on (split's sync probes); 0: none."""

    def start(self, step: int) -> None:
        """Begin producing for the steps after `step` (after the initial weight sync)."""
        ...

    def batches(self, step: int) -> Iterator[Rollout]:
        """The rollouts train step `step` updates on, one update each, in order (several
        when fully_async takes trigger_parameter_sync_step updates per step)."""
        ...

    def probes_scored(self, probes: Batch, trained_on: int) -> None:
        """A batch's first `probe_rows` rows, with `old_log_probs` under `trained_on`: scored,
        its update about to start."""
        ...

    def metrics(self, worker: dict[str, float], step_s: float) -> dict[str, float]:
        """This step's figures of the rollout side (`worker`: the trainer workers' own)."""
        ...

    def resume_position(self, step: int) -> dict[str, int]:
        """The prompt loader's position a run resumed from step `step`'s checkpoint starts at."""
        ...

    def generate_for_validation(self, prompts: Batch, sampling: Sampling) -> Batch:
        """`sampling.n` responses per prompt, adjacent in prompt order (validation), on the
        engines this mode samples with."""
        ...

    def finish(self) -> None:
        """The last step is done: let the generating side end cleanly."""
        ...

    def fail(self, error: BaseException) -> BaseException:
        """The run failed with `error`: stop generating, wake every waiter, and return the
        error to report (a generating side's death rather than what it caused downstream)."""
        ...
