"""SyncConfig: how the actor's weights reach the rollout engine."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from hybrid.validation import check_choice, check_positive


@dataclass(frozen=True)
class SyncConfig:
    gather: Literal["full", "tensor", "layer", "bucket"] = "layer"
    """Gather granularity: the whole model, one parameter, one decoder layer (layered summon)
    or a byte bucket."""
    bucket_mb: int = 64
    """Bucket size for gather="bucket"."""
    strategy: Literal["auto", "reload", "direct"] = "auto"
    """How tensors enter the engine: vLLM reload_weights, or a direct copy into its storage."""
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
