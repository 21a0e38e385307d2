"""What the passes of the actor, the critic and the distillation teacher share in the
planner's byte model: the largest micro-batch of a pass (a rank's slice of it under sequence
parallelism), FSDP2's unsharded parameters and gradients, the LM head's logits (full or
chunked), a no-grad scoring forward, Ulysses' all-to-all, and a phase's peak as its largest
moment. Pure arithmetic on the config and a model's shape; the derivation is in
docs/memory-model.md ("Micro-batches", "Sequence parallelism", "FSDP2's unsharded parameters
and gradients", "Logits, chunked", "Logits, full")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from hybrid.dtypes import dtype_bytes
from hybrid.memory.model_shape import ModelShape

if TYPE_CHECKING:
    from hybrid.trainer.config import TrainerRunConfig

__all__ = [
    "ALL_TO_ALL_TENSORS",
    "CHUNK_FORWARD_FP32",
    "Bytes",
    "MicroBatch",
    "PassName",
    "all_to_all_bytes",
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
ALL_TO_ALL_TENSORS = 4
"""Tensors Ulysses' all-to-all holds per layer in flight: q, k, v and the attention's output."""


@dataclass(frozen=True)
class MicroBatch:
    """The largest micro-batch of one pass on one rank (docs/memory-model.md, "Micro-batches",
    "Sequence parallelism")."""

    tokens: int
    """T: tokens the rank runs (padded: rows x S); under sequence parallelism its slice of the
    sp group's packed row, ceil(T / sp)."""
    scored: int
    """n: response tokens the rank scores (what the LM head sees in the chunked path); under
    sequence parallelism those of its slice, at most all of them."""
    split: bool
    """Whether the pass's rows may take more than one micro-batch (the update accumulates)."""
    sp: int = 1
    """actor.sp_size: the ranks that split the micro-batch's row (1: none)."""


def micro_batch_of(
    config: TrainerRunConfig, update: bool, dynamic: bool, budget: int, micro: int, sp: int = 1
) -> MicroBatch:
    """The largest micro-batch of a pass over the rows one data-parallel slot holds for it (an
    update: its share of a mini-batch), by rows (`micro`) or by the token `budget` when
    `dynamic`, on one of the `sp` ranks that split it (actor.sp_size: every member's passes,
    the actor's, the reference's, the critic's and the teacher's)."""
    c = config
    seq, r = c.rollout.prompt_length + c.rollout.response_length, c.rollout.response_length
    slots = c.trainer.num_workers // sp  # sp ranks share a slot's rows
    rows = c.mini_batch_rows_per_worker if update else -(-c.rows_per_step // slots)
    if not dynamic:
        b = min(micro, rows)
        return _per_rank(b * seq, b * r, b < rows, sp)
    budget *= sp  # the sp group's budget (hybrid.workers.forward.pass_config)
    valid = min(budget, rows * seq)
    # Padded, the budget bounds the valid tokens only: a row may hold a single one.
    tokens = valid if c.model.use_remove_padding else min(budget, rows) * seq
    return _per_rank(tokens, min(valid, rows * r), valid < rows * seq, sp)


def _per_rank(tokens: int, scored: int, split: bool, sp: int) -> MicroBatch:
    """One rank's share of a micro-batch of `tokens`, `scored` of them scored: the whole of it
    without sequence parallelism; under it, the rank's slice of the row (padded to a multiple
    of sp) and the response positions in it, which may be all of its tokens (a long response
    fills the later slices)."""
    if sp == 1:
        return MicroBatch(tokens=tokens, scored=scored, split=split)
    local = -(-tokens // sp)
    return MicroBatch(tokens=local, scored=min(local, scored), split=split, sp=sp)


def all_to_all_bytes(shape: ModelShape, mb: MicroBatch, cb: int) -> int:
    """Ulysses' exchange around a layer's attention (docs/memory-model.md, "Sequence
    parallelism"): q, k, v and the output for the whole row and H/sp heads, about the bytes
    of the rank's slice each, beside the slice's own. A bound: k and v are narrower (kv < h)
    unless few kv heads are repeated. 0 without sequence parallelism."""
    if mb.sp == 1:
        return 0
    return ALL_TO_ALL_TENSORS * mb.tokens * shape.hidden_size * cb


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
    layer = {
        "unsharded_params": unsharded,
        "activations": mb.tokens * shape.nograd_layer(cb),
        "all_to_all": all_to_all_bytes(shape, mb, cb),
    }
    return largest_moment(layer, {"unsharded_params": unsharded, **head})
