"""SyncConfig: how the actor's weights reach the rollout engine."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from hybrid.validation import check_positive


@dataclass(frozen=True)
class SyncConfig:
    gather: Literal["tensor", "layer", "bucket"] = "layer"
    """Gather granularity: one parameter, one decoder layer (layered summon) or a byte bucket."""
    bucket_mb: int = 64
    """Bucket size for gather="bucket"."""
    strategy: Literal["auto", "reload", "direct"] = "auto"
    """How tensors enter the engine: vLLM reload_weights, or a direct copy into its storage."""
    verify_checksum: bool = False
    """After each sync, compare a checksum of every readable engine tensor with the source."""

    def __post_init__(self) -> None:
        if self.gather not in ("tensor", "layer", "bucket"):
            raise ValueError(f"sync.gather must be tensor, layer or bucket, got {self.gather!r}")
        if self.strategy not in ("auto", "reload", "direct"):
            raise ValueError(f"sync.strategy must be auto, reload or direct, got {self.strategy!r}")
        check_positive("sync", bucket_mb=self.bucket_mb)
