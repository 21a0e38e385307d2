"""What the passes of the actor, the critic and the distillation teacher share in the
planner's byte model: the largest micro-batch of a pass, FSDP2's unsharded parameters and
gradients, the LM head's logits (full or chunked), a no-grad scoring forward, and a phase's
peak as its largest moment. Pure arithmetic on the config and a model's shape; the derivation
is in docs/memory-model.md ("Micro-batches", "FSDP2's unsharded parameters and gradients",
"Logits, chunked", "Logits, full")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from hybrid.dtypes import dtype_bytes
from hybrid.memory.model_shape import ModelShape

if TYPE_CHECKING:
    from hybrid.trainer.config import TrainerRunConfig

__all__ = [
    "CHUNK_FORWARD_FP32",
    "Bytes",
    "MicroBatch",
    "PassName",
    "head_chunk_bytes",
    "largest_moment",
    "logits_bytes",
    "micro_batch_of",
    "reduce_bytes",
    "scoring_bytes",
    "unsharded_bytes",
]

Bytes = dict[str, int]
"""Bytes by component or transient name."""
PassName = Literal["ref", "old_log_prob", "update"]
CHUNK_FORWARD_FP32 = 3
"""(c, V) fp32 buffers of the scoring head's forward: logits, exp / probabilities, a temporary."""


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


def unsharded_bytes(
    shape: ModelShape, dtype_bytes: int, adapter_layer: int = 0, ep_size: int = 1
) -> int:
    """The root + the current layer + the prefetched layer, all-gathered by FSDP2 (with
    expert parallelism a layer's experts are only the rank's own)."""
    layer = shape.largest_pass_layer(ep_size) + adapter_layer
    return (shape.root_params + 2 * layer) * dtype_bytes


def largest_moment(*moments: Bytes) -> Bytes:
    """The moment with the most bytes (a phase's peak is its largest moment, not their sum)."""
    return max(moments, key=lambda moment: sum(moment.values()))


def logits_bytes(shape: ModelShape, mb: MicroBatch, cb: int, full: int, fp32_copies: int) -> int:
    """Full-logits path (docs/memory-model.md, "Logits, full"): `full` (T, V) tensors in
    the compute dtype (`cb` bytes) + `fp32_copies` (n, V) in fp32."""
    v = shape.vocab_size
    return full * mb.tokens * v * cb + fp32_copies * mb.scored * v * 4


def head_chunk_bytes(
    shape: ModelShape, mb: MicroBatch, cb: int, chunk_tokens: int, backward: bool
) -> int:
    """The chunked scoring head's (c, V) buffers (docs/memory-model.md, "Logits, chunked"):
    3 fp32 in forward, fp32 + probabilities + the cb cast of dlogits in backward."""
    rows = min(chunk_tokens, mb.scored)
    per_logit = 2 * 4 + cb if backward else CHUNK_FORWARD_FP32 * 4
    return rows * shape.vocab_size * per_logit


def scoring_bytes(
    shape: ModelShape, mb: MicroBatch, cb: int, unsharded: int, chunk_tokens: int, fp32_copies: int
) -> Bytes:
    """A no-grad forward that scores the response tokens (reference, old log-probs, the
    teacher): the larger of a layer's working set and the LM head's (beside the final hidden
    states), with `unsharded` bytes of FSDP2's gathered parameters. `cb`: bytes of the
    activations' dtype; `chunk_tokens`: model.log_prob_chunk_tokens (0: full logits, with
    `fp32_copies` (n, V) upcasts)."""
    hidden = mb.tokens * shape.hidden_size * cb
    if chunk_tokens > 0:  # + the gathered hidden states of the scored tokens
        head = {
            "activations": hidden + mb.scored * shape.hidden_size * cb,
            "logits": head_chunk_bytes(shape, mb, cb, chunk_tokens, backward=False),
        }
    else:
        head = {"activations": hidden, "logits": logits_bytes(shape, mb, cb, 1, fp32_copies)}
    return largest_moment(
        {"unsharded_params": unsharded, "activations": mb.tokens * shape.nograd_layer(cb)},
        {"unsharded_params": unsharded, **head},
    )
