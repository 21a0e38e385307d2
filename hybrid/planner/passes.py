"""What the actor's and the critic's passes share in the planner's byte model: the largest
micro-batch of a pass, FSDP2's unsharded parameters and gradients, and a phase's peak as its
largest moment. Pure arithmetic on the config and the model's shape; the derivation is in
docs/memory-model.md ("Micro-batches", "FSDP2's unsharded parameters and gradients")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from hybrid.dtypes import dtype_bytes
from hybrid.memory.model_shape import ModelShape

if TYPE_CHECKING:
    from hybrid.trainer.config import TrainerRunConfig

__all__ = [
    "Bytes",
    "MicroBatch",
    "PassName",
    "largest_moment",
    "micro_batch_of",
    "reduce_bytes",
    "unsharded_bytes",
]

Bytes = dict[str, int]
"""Bytes by component or transient name."""
PassName = Literal["ref", "old_log_prob", "update"]


@dataclass(frozen=True)
class MicroBatch:
    """The largest micro-batch of one pass (docs/memory-model.md, "Micro-batches")."""

    tokens: int
    """T: tokens the model runs on (padded: rows x S)."""
    scored: int
    """n: response tokens scored (what the LM head sees in the chunked path)."""
    split: bool
    """Whether the pass's rows may take more than one micro-batch (the update accumulates)."""


def micro_batch_of(
    config: TrainerRunConfig, update: bool, dynamic: bool, budget: int, micro: int
) -> MicroBatch:
    """The largest micro-batch of a pass over the rows one worker holds for it (an update:
    its share of a mini-batch), by rows (`micro`) or by the token `budget` when `dynamic`."""
    c = config
    seq, r = c.rollout.prompt_length + c.rollout.response_length, c.rollout.response_length
    rows = c.mini_batch_rows_per_worker if update else -(-c.rows_per_step // c.trainer.num_workers)
    if not dynamic:
        b = min(micro, rows)
        return MicroBatch(tokens=b * seq, scored=b * r, split=b < rows)
    valid = min(budget, rows * seq)
    # Padded, the budget bounds the valid tokens only: a row may hold a single one.
    tokens = valid if c.model.use_remove_padding else min(budget, rows) * seq
    return MicroBatch(tokens=tokens, scored=min(valid, rows * r), split=valid < rows * seq)


def reduce_bytes(compute: str, reduce_dtype: str) -> int:
    """Per element of a layer's unsharded gradient: the compute dtype's, + a copy in the
    reduce dtype for the reduce-scatter when the two differ."""
    return dtype_bytes(compute) + (dtype_bytes(reduce_dtype) if reduce_dtype != compute else 0)


def unsharded_bytes(shape: ModelShape, dtype_bytes: int, adapter_layer: int = 0) -> int:
    """The root + the current layer + the prefetched layer, all-gathered by FSDP2."""
    return (shape.root_params + 2 * (shape.largest_layer + adapter_layer)) * dtype_bytes


def largest_moment(*moments: Bytes) -> Bytes:
    """The moment with the most bytes (a phase's peak is its largest moment, not their sum)."""
    return max(moments, key=lambda moment: sum(moment.values()))
