"""The memory planner's host side: what each node's host RAM holds for the run, from the
same config and shape as the device plan (docs/memory-model.md's notation: W workers,
N = trainer.workers_per_node of them per node, P parameters).

Every node, steady state (N x one worker's, CUDA only: on CPU nothing moves or sleeps):
  actor_params            actor.offload.param_offload: the worker's shard in master dtype
                          (LoRA: the frozen base in param dtype + the adapters in master dtype)
  optimizer_state         actor.offload.optimizer_offload: AdamW's two moments of the
                          trainable shard
  ref_params              ref.offload.param_offload, when a KL builds the reference (none with LoRA)
  teacher_params          distill.offload.param_offload: the distillation teacher's shard in
                          its dtype (distill.precision.param_dtype), of its own shape
  critic_params           critic.offload.param_offload (PPO's critic)
  critic_optimizer_state  critic.offload.optimizer_offload
  rollout_weights         vLLM's sleep backup: level 1 copies the engine's weights (and LoRA
                          slots) to pinned host memory; level 2 discards them. The engine
                          sleeps at level 1 only in LoRA adapter mode (model.lora with
                          sync.lora_mode=adapter: the base is sent once), so only there.
  pinned_rounding         the offload staging's overhead: `.to("cpu", non_blocking=True)` and
                          vLLM's backup allocate pinned memory from torch's CachingHostAllocator,
                          which rounds every block up to a power of two and keeps freed blocks
                          cached: each offloaded tensor holds its rounded block for the whole
                          run, on the host or not (a 272 MB embedding shard takes 512 MiB).
                          torch >= 2.13 can cap the rounding with PYTORCH_ALLOC_CONF=
                          pinned_max_round_threshold_mb:N (unverified here).
                          vLLM's fused qkv / gate_up tensors are rounded as fused, its LoRA
                          slots not at all; its allocator's 2 MiB segments are not modelled.
Rank 0's node, on top of the steady state (the export's moment holds it all; startup comes
before most offloads, so steady + startup is an upper bound):
  startup  hybrid.workers.fsdp loads the full state dict on rank 0 in the model's dtype and
           broadcasts it: P x bytes(master) for the actor (LoRA: P x bytes(param) + the
           adapters in master), P x bytes(ref) for the reference, the value model in the
           critic's master dtype, the teacher's P_t x bytes(its dtype); one after the other,
           so the largest.
  export   trainer.export_hf: rank 0 gathers the full state dict in master dtype to the host
           (get_model_state_dict(cpu_offload=True)) and writes a bf16 copy of it (none when
           master is bf16): P x (bytes(master) + 2); LoRA: the merged weights in bf16, P x 2.
           The critic's export comes after the actor's: the larger of the two.
Training checkpoints are sharded (hybrid.workers.checkpoint: torch.distributed.checkpoint):
each rank stages its own shards to the host one tensor at a time; no rank gathers the full
state, so nothing is planned for them.

Not counted: the processes themselves (interpreter, torch, vLLM and CUDA libraries: a few
GiB each), Ray's object store (up to 30% of RAM by default, filled on demand) and the page
cache of the safetensors files.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hybrid.dtypes import dtype_bytes
from hybrid.memory.model_shape import ModelShape, ParamShape
from hybrid.memory.records import GIB
from hybrid.planner.adapters import lora_targets
from hybrid.planner.sizes import WorkerSizes

if TYPE_CHECKING:
    from hybrid.planner.critic_sizes import CriticSizes
    from hybrid.planner.teacher_sizes import TeacherSizes

__all__ = ["HOST_PARTS", "HostMemory", "host_memory", "pinned_block"]

HOST_PARTS = (
    "actor_params",
    "optimizer_state",
    "ref_params",
    "teacher_params",
    "critic_params",
    "critic_optimizer_state",
    "rollout_weights",
    "pinned_rounding",
)
_FUSED = {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj"}
_FUSED |= {"gate_proj": "gate_up_proj", "up_proj": "gate_up_proj"}


@dataclass(frozen=True)
class HostMemory:
    """Host RAM of one node (GiB): the steady state of every node, rank 0's extra moments."""

    parts_gib: dict[str, float]
    """Steady state per node, by HOST_PARTS name (zeros left out)."""
    steady_gib: float
    startup_gib: float
    """Rank 0's full state dict at startup (on rank 0's node, beside the steady state)."""
    export_gib: float
    """Rank 0's gathered state dict and its bf16 copy at the final export (0 without)."""
    peak_gib: float
    """Rank 0's node at its fullest: steady + the larger of startup and export."""


def pinned_block(nbytes: int) -> int:
    """A block of torch's pinned host allocator: `nbytes` rounded up to a power of two."""
    return 1 << (nbytes - 1).bit_length() if nbytes > 0 else 0


def _shards(params: Iterable[ParamShape], world: int) -> list[int]:
    """Elements of rank 0's FSDP2 shard of each parameter (ceil(rows / world) rows)."""
    return [
        -(-dims[0] // world) * (math.prod(dims) // dims[0]) if dims else 1 for _, dims in params
    ]


def _engine_tensors(shape: ModelShape, tp: int) -> list[int]:
    """Elements of one TP rank's engine tensors: q/k/v and gate/up fused as vLLM loads them,
    split by tp (norms replicated)."""
    fused: dict[str, int] = {}
    for name, dims in shape.params:
        parts = name.split(".")
        key = ".".join(_FUSED.get(part, part) for part in parts)
        fused[key] = fused.get(key, 0) + math.prod(dims)
    return [n if "norm" in key else -(-n // tp) for key, n in fused.items()]


def _pinned(sizes: Iterable[int]) -> tuple[int, int]:
    """(bytes, pinned bytes) of tensors of these byte sizes moved to the host."""
    sizes = list(sizes)
    return sum(sizes), sum(pinned_block(n) for n in sizes)


def _offloaded(
    w: WorkerSizes, critic: CriticSizes | None, teacher: TeacherSizes | None
) -> dict[str, tuple[int, int]]:
    """(bytes, pinned bytes) one worker keeps on the host, by part."""
    c, shape = w.config, w.shape
    if not w.on_gpu:
        return {}
    base = _shards(shape.params, w.shard_world)
    if w.lora_rank:
        targets = lora_targets(c)
        adapters = [p for p in shape.lora_params(w.lora_rank) if p[0].split(".")[-3] in targets]
        trainable = [n * w.master for n in _shards(adapters, w.shard_world)]
        params = [n * w.cb for n in base] + trainable
    else:
        trainable = params = [n * w.master for n in base]
    held: dict[str, tuple[int, int]] = {}
    if c.actor.offload.param_offload:
        held["actor_params"] = _pinned(params)
    if c.actor.offload.optimizer_offload:
        held["optimizer_state"] = _pinned(trainable * 2)
    if c.ref.offload.param_offload and w.ref_params():
        held["ref_params"] = _pinned(n * dtype_bytes(w.dtypes.ref) for n in base)
    if teacher is not None and c.distill.offload.param_offload:
        shards = _shards(teacher.shape.params, teacher.shard_world)
        held["teacher_params"] = _pinned(n * teacher.cb for n in shards)
    if critic is not None:
        value = [n * critic.master for n in _shards(critic.shape.params, critic.shard_world)]
        if c.critic.offload.param_offload:
            held["critic_params"] = _pinned(value)
        if c.critic.offload.optimizer_offload:
            held["critic_optimizer_state"] = _pinned(value * 2)
    if w.adapter_sync and c.rollout.free_cache_engine:  # level-1 sleep: a pinned backup
        weights, pinned = _pinned(n * w.engine_bytes for n in _engine_tensors(shape, w.tp))
        slots = w.rollout_weights() - weights  # many small tensors: left unrounded
        held["rollout_weights"] = (weights + slots, pinned + slots)
    return held


def _startup(w: WorkerSizes, critic: CriticSizes | None, teacher: TeacherSizes | None) -> int:
    """Rank 0's largest full state dict while the models are built."""
    p, lora = w.shape.num_params, w.lora
    actor = p * w.cb + lora.elements * w.master if w.lora_rank else p * w.master
    ref = p * dtype_bytes(w.dtypes.ref) if w.ref_params() else 0
    value = critic.shape.num_params * critic.master if critic is not None else 0
    frozen_teacher = teacher.shape.num_params * teacher.cb if teacher is not None else 0
    return max(actor, ref, value, frozen_teacher)


def _export(w: WorkerSizes, critic: CriticSizes | None) -> int:
    """Rank 0's gathered state dict + its bf16 copy at the final export."""
    c = w.config
    if not c.trainer.export_hf:
        return 0

    def gathered(params: int, master: str) -> int:
        return params * (dtype_bytes(master) + (2 if master != "bfloat16" else 0))

    p = w.shape.num_params
    actor = p * 2 if w.lora_rank else gathered(p, c.actor.precision.master_dtype)
    value = 0
    if critic is not None:
        value = gathered(critic.shape.num_params, c.critic.precision.master_dtype)
    return max(actor, value)


def host_memory(
    w: WorkerSizes, critic: CriticSizes | None, teacher: TeacherSizes | None = None
) -> HostMemory:
    """Host RAM per node for the run of `w` (see the module docstring)."""
    per_node = w.config.trainer.workers_per_node
    held = _offloaded(w, critic, teacher)
    parts = {name: per_node * nbytes for name, (nbytes, _) in held.items()}
    parts["pinned_rounding"] = per_node * sum(pinned - nbytes for nbytes, pinned in held.values())
    parts_gib = {name: parts[name] / GIB for name in HOST_PARTS if parts.get(name)}
    steady = sum(parts_gib.values())
    startup, export = _startup(w, critic, teacher) / GIB, _export(w, critic) / GIB
    return HostMemory(parts_gib, steady, startup, export, steady + max(startup, export))
