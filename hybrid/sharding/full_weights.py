"""The actor's full weights as an engine takes them: one stream for every sink (the colocated
engine's in-place load, a transport's publish).

Full tensors under Hugging Face names, gathered group by group (`sync.gather`). Without LoRA:
the model. With LoRA: the frozen base alone (an adapter sync sends the adapters apart,
hybrid.sharding.lora_sync) or the base with the adapters folded in (`merge_lora`: an engine
that holds plain full weights, such as the explorers').
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from hybrid.sharding.config import WeightPathConfig
from hybrid.sharding.gather import iter_full_parameters
from hybrid.sharding.lora_sync import GroupDone, LoraSync


def full_weights(
    actor: torch.nn.Module,
    lora: LoraSync | None,
    sync: WeightPathConfig,
    dtype: torch.dtype,
    merge_lora: bool,
    on_group_done: GroupDone | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """`dtype`: what the all-gathers cast to (LoRA streams cast to the engine's dtype
    themselves); `on_group_done` hears about each gathered group (the memory ledger)."""
    bucket = sync.bucket_mb << 20
    if lora is None:
        return iter_full_parameters(
            actor, sync.gather, dtype, bucket, on_group_done=on_group_done
        )
    if merge_lora:
        return lora.iter_merged(sync.layered_summon, on_group_done)
    return lora.iter_base(sync.gather, bucket, on_group_done)
