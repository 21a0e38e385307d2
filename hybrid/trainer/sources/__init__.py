"""Where a train step's rollouts come from, one source per trainer.mode (see base.py)."""

from hybrid.trainer.sources.base import SOURCE_KEYS, Rollout, RolloutSource
from hybrid.trainer.sources.buffer import BufferSource
from hybrid.trainer.sources.colocated import ColocatedSource
from hybrid.trainer.sources.queue import QueueSource

__all__ = [
    "SOURCE_KEYS",
    "BufferSource",
    "ColocatedSource",
    "QueueSource",
    "Rollout",
    "RolloutSource",
]
