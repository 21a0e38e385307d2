"""State-dict adapters: how one model family names and lays out its tensors in memory (the
module) and on disk (the Hub checkpoint).

transformers 5 holds a mixture-of-experts layer's experts as two stacked 3-D parameters,
`mlp.experts.gate_up_proj` [E, 2I, H] (each expert's gate rows, then its up rows) and
`mlp.experts.down_proj` [E, H, I], while Hub checkpoints keep one key per expert and projection
(`mlp.experts.3.gate_proj.weight` [I, H], `.up_proj.weight`, `.down_proj.weight` [H, I]).
`from_pretrained` converts on load and `save_pretrained` back; we load and export ourselves
(FSDP2's rank-0 broadcast, our own export), so every crossing of that boundary asks the
family's adapter:
  - `plan(checkpoint_keys)`: which checkpoint tensors build each module tensor (the load's key
    check and its reads);
  - `combine(module_key, tensors)`: the module tensor from them;
  - `to_checkpoint(named_tensors)`: module tensors back in checkpoint layout (the HF export).
  - `experts_to_checkpoint(module_key, rows, experts)`: some experts of a stacked tensor under
    their checkpoint names (a sync with `sync.gather=bucket` gathers experts a bucket at a time).
Dense families are the identity. vLLM 0.32 takes the stacked expert tensors under their module
names, and per-expert ones under their checkpoint names (in any order), so the weight sync
streams the module's layout, or per-expert tensors when it gathers experts in byte buckets.

A checkpoint already in module layout (saved with `save_original_format=False`) plans as the
identity too: only per-expert keys are stacked.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from hybrid.model_families import STACKED_EXPERT_FAMILIES, check_family, model_type

NamedTensor = tuple[str, torch.Tensor]

_PER_EXPERT = re.compile(
    r"^(?P<experts>.+\.experts)\.(?P<expert>\d+)\.(?P<proj>gate_proj|up_proj|down_proj)\.weight$"
)
_GATE_UP, _DOWN = ".gate_up_proj", ".down_proj"


class StateDictAdapter:
    """The identity: module and checkpoint share names and shapes (the dense families)."""

    family = "dense"

    def plan(self, checkpoint_keys: Iterable[str]) -> dict[str, tuple[str, ...]]:
        """Module key -> the checkpoint keys it is built from, in the order `combine` takes."""
        return {key: (key,) for key in checkpoint_keys}

    def combine(self, module_key: str, tensors: list[torch.Tensor]) -> torch.Tensor:
        """The module tensor `module_key` from its planned checkpoint tensors."""
        (tensor,) = tensors
        return tensor

    def to_checkpoint(self, named: Iterable[NamedTensor]) -> Iterator[NamedTensor]:
        """Module tensors renamed and re-laid out as the checkpoint holds them (views where
        the layout allows: nothing is copied here)."""
        yield from named

    def stacks_experts(self, module_key: str) -> bool:
        """Whether the module tensor `module_key` holds a layer's experts stacked on dim 0."""
        return False

    def experts_to_checkpoint(
        self, module_key: str, rows: torch.Tensor, experts: Iterable[int]
    ) -> Iterator[NamedTensor]:
        """Some experts of a stacked module tensor (`rows[i]` is expert `experts[i]`) under
        their checkpoint names: what a sync that gathers experts in byte buckets sends."""
        raise ValueError(f"{module_key} holds no stacked experts ({self.family} family)")


class StackedExperts(StateDictAdapter):
    """Per-expert projections in the checkpoint, stacked per layer in the module."""

    family = "stacked experts"

    def plan(self, checkpoint_keys: Iterable[str]) -> dict[str, tuple[str, ...]]:
        plan: dict[str, tuple[str, ...]] = {}
        # experts prefix -> projection -> expert id -> checkpoint key
        found: dict[str, dict[str, dict[int, str]]] = defaultdict(lambda: defaultdict(dict))
        for key in checkpoint_keys:
            match = _PER_EXPERT.match(key)
            if match is None:
                plan[key] = (key,)
            else:
                found[match["experts"]][match["proj"]][int(match["expert"])] = key
        for prefix, projections in sorted(found.items()):
            count = _expert_count(prefix, projections)
            gate, up, down = (projections[p] for p in ("gate_proj", "up_proj", "down_proj"))
            plan[prefix + _GATE_UP] = tuple(k for e in range(count) for k in (gate[e], up[e]))
            plan[prefix + _DOWN] = tuple(down[e] for e in range(count))
        return plan

    def combine(self, module_key: str, tensors: list[torch.Tensor]) -> torch.Tensor:
        per_expert = all(t.dim() == 2 for t in tensors)  # else already stacked
        if module_key.endswith(".experts" + _GATE_UP) and per_expert:
            pairs = zip(tensors[0::2], tensors[1::2], strict=True)
            return torch.stack([torch.cat([gate, up], dim=0) for gate, up in pairs])
        if module_key.endswith(".experts" + _DOWN) and per_expert:
            return torch.stack(tensors)
        return super().combine(module_key, tensors)

    def to_checkpoint(self, named: Iterable[NamedTensor]) -> Iterator[NamedTensor]:
        for key, tensor in named:
            if self.stacks_experts(key) and tensor.dim() == 3:
                yield from self.experts_to_checkpoint(key, tensor, range(tensor.shape[0]))
            else:
                yield key, tensor

    def stacks_experts(self, module_key: str) -> bool:
        return module_key.endswith((".experts" + _GATE_UP, ".experts" + _DOWN))

    def experts_to_checkpoint(
        self, module_key: str, rows: torch.Tensor, experts: Iterable[int]
    ) -> Iterator[NamedTensor]:
        if module_key.endswith(_GATE_UP):
            prefix = module_key.removesuffix(_GATE_UP)
            gate, up = rows.chunk(2, dim=1)
            for index, expert in enumerate(experts):
                yield f"{prefix}.{expert}.gate_proj.weight", gate[index]
                yield f"{prefix}.{expert}.up_proj.weight", up[index]
        else:
            prefix = module_key.removesuffix(_DOWN)
            for index, expert in enumerate(experts):
                yield f"{prefix}.{expert}.down_proj.weight", rows[index]


def _expert_count(prefix: str, projections: dict[str, dict[int, str]]) -> int:
    """E, when every projection has experts 0..E-1; else a ValueError naming what is missing."""
    ids = {proj: set(projections.get(proj, {})) for proj in ("gate_proj", "up_proj", "down_proj")}
    count = max(max(found, default=-1) for found in ids.values()) + 1
    for proj, found in ids.items():
        missing = sorted(set(range(count)) - found)
        if missing:
            raise ValueError(
                f"checkpoint has experts 0..{count - 1} under {prefix!r} but no {proj} for "
                f"expert(s) {missing[:8]}"
            )
    return count


def adapter_for(config: Any) -> StateDictAdapter:
    """The adapter of the family `config` (a transformers config) belongs to. A dense model of a
    family not listed here is taken as the identity (the load's key check still guards it); a
    mixture of experts without an adapter is refused, naming its model type."""
    check_family(config, "model")
    if model_type(config) in STACKED_EXPERT_FAMILIES:
        return StackedExperts()
    return StateDictAdapter()
