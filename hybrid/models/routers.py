"""A mixture-of-experts model's routers, found on the module: the trainer's router replay
(hybrid.workers.routing) and the toy engine's routing record (hybrid.rollout.toy_engine) read
them.

transformers 5 gives each sparse MoE block a `gate` router module that carries `num_experts`,
`top_k` and `norm_topk_prob` and returns (logits, scores, experts) for the (tokens, hidden)
states it reads; the block computes its experts from the last two.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch
from torch import nn

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


@dataclass(frozen=True)
class Router:
    layer: int
    """The decoder layer's index in the model."""
    module: nn.Module
    num_experts: int
    top_k: int
    normalise: bool
    """The family's norm_topk_prob: scores renormalised over the chosen experts."""


_ROUTER_FIELDS = ("num_experts", "top_k", "norm_topk_prob")


def find_routers(model: nn.Module) -> list[Router]:
    """The model's MoE routers in layer order ([] for a dense model): every sparse block's
    `gate` that carries `top_k` and `num_experts` (transformers 5's TopKRouter of Qwen3-MoE and
    Qwen2-MoE)."""
    routers = []
    for name, module in model.named_modules():
        gate = getattr(module, "gate", None)
        if not isinstance(gate, nn.Module) or not hasattr(module, "experts"):
            continue
        if not all(hasattr(gate, f) for f in _ROUTER_FIELDS):
            continue
        found = _LAYER.search(name + ".")
        if found is None:
            raise ValueError(f"the MoE router {name}.gate sits in no model.layers.N")
        experts, top_k, normalise = (getattr(gate, f) for f in _ROUTER_FIELDS)
        routers.append(Router(int(found.group(1)), gate, int(experts), int(top_k), bool(normalise)))
    return sorted(routers, key=lambda r: r.layer)


def experts_dtype(num_experts: int) -> torch.dtype:
    """The smallest integer dtype that holds every expert index (records of routing)."""
    return torch.uint8 if num_experts <= 256 else torch.int16
