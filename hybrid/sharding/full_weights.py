"""The actor's full weights as an engine takes them: one stream for every sink (the colocated
engine's in-place load, a transport's publish).

Full tensors under Hugging Face names, gathered group by group (`sync.gather`). Without LoRA:
the model. With LoRA: the frozen base alone (an adapter sync sends the adapters apart,
hybrid.sharding.lora_sync) or the base with the adapters folded in (`merge_lora`: an engine
that holds plain full weights, such as the explorers').
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import torch

from hybrid.models.state_dict import StateDictAdapter, adapter_for
from hybrid.sharding.config import WeightPathConfig
from hybrid.sharding.gather import (
    gather_group,
    group_parameters,
    hand_over,
    iter_full_parameters,
    iter_row_slices,
)
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
        if sync.gather == "bucket":  # a mixture of experts' experts by bytes, not by layer
            adapter = adapter_for(getattr(actor, "config", None))
            named: list[tuple[str, torch.Tensor]] = list(actor.named_parameters())
            if any(adapter.stacks_experts(name) for name, _ in named):
                return expert_buckets(named, adapter, dtype, bucket, on_group_done)
        return iter_full_parameters(actor, sync.gather, dtype, bucket, on_group_done=on_group_done)
    if merge_lora:
        return lora.iter_merged(sync.layered_summon, on_group_done)
    return lora.iter_base(sync.gather, bucket, on_group_done)


def expert_buckets(
    named: list[tuple[str, torch.Tensor]],
    adapter: StateDictAdapter,
    dtype: torch.dtype,
    bucket_bytes: int,
    on_group_done: GroupDone | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """`sync.gather=bucket` for a mixture of experts: the stacked expert tensors gathered a
    bucket of experts at a time (hybrid.sharding.gather.iter_row_slices) and sent under their
    per-expert checkpoint names, which vLLM's loaders take in any order; every other tensor
    in byte buckets as for a dense model. The largest group alive is one bucket (or one
    expert of every rank), not a layer's experts."""
    groups = itertools.count()
    for experts_run, run in itertools.groupby(
        named, key=lambda item: adapter.stacks_experts(item[0])
    ):
        if not experts_run:
            for group in group_parameters(list(run), "bucket", bucket_bytes, dtype):
                yield from hand_over(gather_group(group, dtype), next(groups), on_group_done)
            continue
        for name, param in run:
            for experts, rows in iter_row_slices(param, dtype, bucket_bytes):
                pieces = list(adapter.experts_to_checkpoint(name, rows, experts))
                del rows
                yield from hand_over(pieces, next(groups), on_group_done)
