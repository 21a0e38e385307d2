"""Putting gathered full tensors into the rollout engine, in place.

Two strategies, one adapter:
  reload: vLLM's `reload_weights` with a streaming iterator. Works everywhere; on CPU it is the
          only path, since the CPU backend repacks every linear weight for oneDNN and leaves
          an empty `.weight`, so only a reload (which repacks again) can update linears.
  direct: copy each tensor into the engine parameter's storage through the parameter's own
          vLLM weight loader, q/k/v and gate/up into their slices of the fused parameter: one
          copy, no temporary layer. Applies where the engine keeps plain weights (CUDA).
`auto` picks direct where it applies and falls back to reload.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

import torch

from hybrid.rollout.vllm_engine import VllmEngine

Strategy = Literal["reload", "direct"]

# HF projection name -> (fused vLLM parameter, shard id its weight loader takes).
_FUSED: dict[str, tuple[str, str | int]] = {
    "q_proj": ("qkv_proj", "q"),
    "k_proj": ("qkv_proj", "k"),
    "v_proj": ("qkv_proj", "v"),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}


def engine_name(hf_name: str) -> tuple[str, str | int | None]:
    """Map a Hugging Face parameter name to the engine's (name, shard id)."""
    parts = hf_name.split(".")
    for i, part in enumerate(parts):
        if part in _FUSED:
            fused, shard = _FUSED[part]
            return ".".join([*parts[:i], fused, *parts[i + 1 :]]), shard
    return hf_name, None


def direct_applies(engine_model: torch.nn.Module) -> bool:
    """True when every engine parameter holds real storage (nothing repacked away)."""
    return all(p.numel() > 0 for p in engine_model.parameters())


def choose_strategy(
    requested: Literal["auto", "reload", "direct"], engine_model: torch.nn.Module
) -> Strategy:
    if requested == "reload":
        return "reload"
    applies = direct_applies(engine_model)
    if requested == "direct" and not applies:
        raise ValueError(
            "sync.strategy=direct needs an engine that keeps plain weights; this one repacks "
            "its linear weights (vLLM's CPU backend does): use sync.strategy=reload or auto"
        )
    return "direct" if applies else "reload"


def load_direct(engine_model: torch.nn.Module, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Copy each tensor into its engine parameter (or its slice of a fused one) in place."""
    from vllm.model_executor.model_loader.weight_utils import default_weight_loader

    params = dict(engine_model.named_parameters())
    for hf_name, tensor in weights:
        name, shard = engine_name(hf_name)
        param = params.get(name)
        if param is None:
            if hf_name == "lm_head.weight" and "lm_head.weight" not in params:
                continue  # tied: the embedding already carries it
            raise KeyError(f"engine has no parameter for {hf_name!r} (looked for {name!r})")
        loader = getattr(param, "weight_loader", default_weight_loader)
        args = (param, tensor) if shard is None else (param, tensor, shard)
        loader(*args)


class WeightLoader:
    """Streams full tensors into a VllmEngine with the chosen strategy."""

    def __init__(self, engine: VllmEngine, requested: Literal["auto", "reload", "direct"]) -> None:
        self.engine = engine
        self.strategy = choose_strategy(requested, engine.model)

    def load(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        if self.strategy == "reload":
            self.engine.load_weights(weights)
            return
        load_direct(self.engine.model, weights)
        self.engine.after_load()
