"""The LoRA adapters the planner counts: which rank and targets a plan uses, and how many
elements the adapters and the base weights they adapt hold, whole, per rank and per layer.
The derivation: docs/memory-model.md, "LoRA"."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hybrid.memory.model_shape import LORA_TARGETS, ModelShape, count, is_layer, layer_key

if TYPE_CHECKING:
    from hybrid.trainer.config import TrainerRunConfig

__all__ = [
    "Adapters",
    "adapters_of",
    "adapts_experts",
    "engine_lora_rank",
    "expert_adapters",
    "lora_rank_of",
    "lora_targets",
]


def lora_rank_of(config: TrainerRunConfig, lora_rank: int = 0) -> int:
    """The LoRA rank a plan uses: `lora_rank` when > 0 (an override), else model.lora.rank."""
    if lora_rank < 0:
        raise ValueError(f"lora_rank must be >= 0, got {lora_rank}")
    return lora_rank or config.model.lora.rank


def lora_targets(config: TrainerRunConfig) -> tuple[str, ...]:
    """The projections with adapters: model.lora.target_modules, all of them for all-linear."""
    targets = config.model.lora.target_modules
    return LORA_TARGETS if isinstance(targets, str) else tuple(targets)


@dataclass(frozen=True)
class Adapters:
    """Elements of the actor's adapters and of the base weights they adapt (0 without LoRA).
    Per-layer maxima are taken separately: exact for uniform decoder layers."""

    elements: int
    shard: int
    """Rank 0's FSDP2 shard of the adapters (ceil(rows / world) rows of each)."""
    largest_shard: int
    layer: int
    """The most adapter elements in one decoder layer."""
    adapted: int
    """Base weights that carry an adapter (what a merge rewrites)."""
    adapted_layer: int
    largest_adapted: int


def adapts_experts(config: TrainerRunConfig, shape: ModelShape) -> bool:
    """Named targets (not all-linear) that peft puts on a mixture of experts' stacked experts
    (hybrid.workers.lora.target_modules: gate_proj with up_proj, down_proj)."""
    targets = config.model.lora.target_modules
    named = not isinstance(targets, str)
    return named and bool(shape.num_experts) and bool(set(targets) & set(EXPERT_LORA_TARGETS))


EXPERT_LORA_TARGETS = ("gate_proj", "up_proj", "down_proj")


def expert_adapters(
    shape: ModelShape, rank: int, targets: tuple[str, ...]
) -> list[tuple[str, tuple[int, ...]]]:
    """peft's adapters on the stacked experts [E, d1, d2]: A (E * r, d2) and B (d1, r * E), the
    fused gate_up_proj at twice the rank (its gate and up halves)."""
    ranks = {
        "gate_up_proj": 2 * rank if {"gate_proj", "up_proj"} <= set(targets) else 0,
        "down_proj": rank if "down_proj" in targets else 0,
    }
    adapters: list[tuple[str, tuple[int, ...]]] = []
    for name, dims in shape.params:
        short = name.rsplit(".", 1)[-1]
        if ".mlp.experts." in name and len(dims) == 3 and ranks.get(short):
            experts, rows, cols = dims
            r = ranks[short]
            adapters.append((f"{name}.lora_A.weight", (experts * r, cols)))
            adapters.append((f"{name}.lora_B.weight", (rows, r * experts)))
    return adapters


@functools.cache
def adapters_of(
    shape: ModelShape, rank: int, targets: tuple[str, ...], world: int, experts: bool = False
) -> Adapters:
    """The rank-`rank` adapters on `targets`, sharded over `world` ranks; `experts`: on the
    stacked experts too (adapts_experts)."""
    # lora_params names: `model.layers.3.mlp.up_proj.lora_A.weight` (module short name at -3)
    adapters = [(n, d) for n, d in shape.lora_params(rank) if n.split(".")[-3] in targets]
    params = dict(shape.params)
    modules = dict.fromkeys(name.rsplit(".lora_", 1)[0] for name, _ in adapters)
    bases = [(f"{m}.weight", params[f"{m}.weight"]) for m in modules]
    if experts:
        on_experts = expert_adapters(shape, rank, targets)
        stacked = dict.fromkeys(name.rsplit(".lora_", 1)[0] for name, _ in on_experts)
        adapters += on_experts
        bases += [(m, params[m]) for m in stacked]
    shards = [-(-rows // world) * cols for _, (rows, cols) in adapters]

    def per_layer(items: list[tuple[str, tuple[int, ...]]]) -> int:
        groups: dict[str, int] = {}
        for name, dims in items:
            groups[layer_key(name)] = groups.get(layer_key(name), 0) + count(((name, dims),))
        return max((n for key, n in groups.items() if is_layer(key)), default=0)

    return Adapters(
        elements=count(tuple(adapters)),
        shard=sum(shards),
        largest_shard=max(shards, default=0),
        layer=per_layer(adapters),
        adapted=count(tuple(bases)),
        adapted_layer=per_layer(bases),
        largest_adapted=max((count((b,)) for b in bases), default=0),
    )


@functools.cache
def engine_lora_rank(rank: int) -> int:
    """vLLM's max_lora_rank for an adapter of `rank` (rounded up to a size vLLM accepts)."""
    # Imported on first use: only a LoRA plan needs the engine module.
    from hybrid.rollout.vllm_engine import vllm_lora_rank

    return vllm_lora_rank(rank)
