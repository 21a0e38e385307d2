"""Whether the trainer's ranks shard the model or each hold all of it (`actor.hsdp_replicas`).

FSDP2 shards every weight over the ranks. That buys memory, and costs collectives: each
layer's weights are all-gathered before its forward and again before its backward, and its
gradients reduce-scattered after it. For a model whose whole training state is small beside
the device, the memory saved is nothing and every collective is a point where the ranks wait
for each other; on a shared CPU host that wait is most of the cost (gloo's small all-reduce
takes 0.3-0.9 ms, its 90th percentile 4 ms, on a 2-core machine). One replica per rank (a
(world, 1) mesh) keeps the whole model on every rank: no all-gathers; where it computes in its
master dtype it is a plain module whose gradients are averaged in one all-reduce a step
(hybrid.workers.replicated), else FSDP2's HSDP with one all-reduce per unit.

`actor.hsdp_replicas=0` (auto, the default) is that full replication on a CPU where the
training state of every rank together (weights, gradients and AdamW's two moments in the
master dtype) takes at most `AUTO_REPLICATE_SHARE` of the host's memory, for a dense model
trained in full without sequence or expert parallelism; plain FSDP (1) otherwise, and always
on a GPU, as verl and TRL run. Measured on the tiny GRPO step (2 gloo ranks on a 2-core CPU,
16 rows a rank): the update as FSDP2's HSDP took 0.70-0.95x FSDP's time, as a plain module
less again (docs/benchmarks.md, profiling/bench_replication.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hybrid.dtypes import dtype_bytes

if TYPE_CHECKING:
    from hybrid.memory.model_shape import ModelShape
    from hybrid.workers.config import ActorConfig

AUTO_REPLICATE_SHARE = 0.01
"""auto replicates while every rank's training state together fits in this share of the host."""

STATE_COPIES = 4
"""Copies of the trainable weights a rank holds in the master dtype: the weights, their
gradients and AdamW's two moments."""


def training_state_bytes(params: int, master_bytes: int) -> int:
    """One rank's whole training state for a model of `params` parameters, unsharded."""
    return STATE_COPIES * master_bytes * params


def resolve_hsdp_replicas(
    asked: int,
    *,
    world: int,
    on_cpu: bool,
    state_bytes: int,
    device_bytes: int,
    dense_full: bool,
) -> int:
    """actor.hsdp_replicas with auto (0) resolved for a trainer of `world` ranks; `state_bytes`
    is one rank's unsharded training state (`training_state_bytes`), `device_bytes` the
    host's memory, `dense_full` whether the model is dense and trained in full without
    sequence parallelism (the layouts replication is run with)."""
    if asked > 0:
        return asked
    small = world * state_bytes <= AUTO_REPLICATE_SHARE * device_bytes
    return world if on_cpu and dense_full and small else 1


def trainer_replicas(
    actor: ActorConfig,
    shape: ModelShape,
    *,
    lora: bool,
    world: int,
    on_cpu: bool,
    device_bytes: int,
) -> int:
    """actor.hsdp_replicas for a trainer of `world` ranks training the model of `shape` (with
    LoRA adapters when `lora`) on a device of `device_bytes` (the host's for a CPU)."""
    master_bytes = dtype_bytes(actor.precision.master_dtype)
    return resolve_hsdp_replicas(
        actor.hsdp_replicas,
        world=world,
        on_cpu=on_cpu,
        state_bytes=training_state_bytes(shape.num_params, master_bytes),
        device_bytes=device_bytes,
        dense_full=not (shape.num_experts or lora or actor.sp_size > 1),
    )
