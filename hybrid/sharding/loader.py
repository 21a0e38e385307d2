"""Putting gathered full tensors into the rollout engine, in place.

Two strategies, one adapter:
  direct: each tensor goes through the engine parameter's own vLLM weight loader, q/k/v and
          gate/up into their slices of the fused parameter. Plain layout (CUDA, AVX2-only
          CPUs, fp16 on CPU): one copy into the engine's storage. Packed layout (vLLM's CPU
          backend on AVX-512, where oneDNN repacks every linear weight and leaves an empty
          `.weight`): into a staging weight per layer, packed as soon as the layer is complete
          (hybrid.rollout.vllm_compat.Repacker), and the readable layers that keep a packed
          copy (the lm_head) are repacked after their write.
  reload: vLLM's `reload_weights` with a streaming iterator: its generic layer-wise reload,
          which also handles layers the direct path does not (quantized linears).
`auto` takes direct wherever the engine's layout allows it and every weight keeps its Hugging
Face layout (no quantized or fused-expert layers: hybrid.sharding.direct_fit), else reload. An
engine whose module is no vLLM model (the toy engine's plain Hugging Face module) always
reloads: direct knows only vLLM's weight loaders.

Names: the actor speaks Hugging Face names; the engine fuses projections (`packed_modules_mapping`
on its model: qkv_proj <- q/k/v_proj, gate_up_proj <- gate/up_proj) and, with LoRA enabled,
wraps each linear so its weight sits under `.base_layer.`. `EngineNames` is built from the
engine model itself, so every family vLLM implements this way maps without a table of ours.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from hybrid.rollout.base import RolloutEngine, WeightLayout
from hybrid.rollout.vllm_compat import Repacker, can_repack
from hybrid.sharding.direct_fit import direct_blockers, engine_layers, summarize

logger = logging.getLogger(__name__)

Strategy = Literal["reload", "direct"]
ShardId = str | int | None

_LORA_WRAPPER = ".base_layer."
_QKV_SHARDS = ("q", "k", "v")


def canonical_name(engine_name: str) -> str:
    """An engine parameter's name without vLLM's LoRA wrapper level."""
    return engine_name.replace(_LORA_WRAPPER, ".")


def fused_shards(
    packed_modules: Mapping[str, list[str]], qkv_modules: set[str]
) -> dict[str, tuple[str, ShardId]]:
    """HF projection -> (fused engine module, shard id its weight loader takes). vLLM's QKV
    loader (modules in `qkv_modules`) takes "q" / "k" / "v"; the merged column loader
    (gate_up) takes the part's index."""
    shards: dict[str, tuple[str, ShardId]] = {}
    for fused, parts in packed_modules.items():
        for index, part in enumerate(parts):
            shards[part] = (fused, _QKV_SHARDS[index] if fused in qkv_modules else index)
    return shards


def qkv_module_names(engine_model: torch.nn.Module) -> set[str]:
    """Short names of the engine's fused QKV modules (LoRA wrappers looked through)."""
    from vllm.model_executor.layers.linear import QKVParallelLinear

    return {
        name.rsplit(".", 1)[-1]
        for name, module in engine_model.named_modules()
        if isinstance(getattr(module, "base_layer", module), QKVParallelLinear)
    }


@dataclass(frozen=True)
class Target:
    """Where one Hugging Face tensor goes in the engine."""

    name: str
    """The engine parameter's full name (with `.base_layer.` under LoRA)."""
    shard: ShardId
    """The slice of a fused parameter (None: the whole parameter)."""


class EngineNames:
    """Maps Hugging Face parameter names onto one engine model's parameters."""

    def __init__(
        self,
        engine_params: Iterable[str],
        packed_modules: Mapping[str, list[str]],
        qkv_modules: set[str],
    ) -> None:
        self.by_canonical = {canonical_name(name): name for name in engine_params}
        self.fused = fused_shards(packed_modules, qkv_modules)
        self.num_parts = {fused: len(parts) for fused, parts in packed_modules.items()}

    @classmethod
    def of(cls, engine_model: torch.nn.Module) -> EngineNames:
        names = [name for name, _ in engine_model.named_parameters()]
        packed = getattr(engine_model, "packed_modules_mapping", {})
        return cls(names, packed, qkv_module_names(engine_model))

    def locate(self, hf_name: str) -> Target | None:
        """The engine parameter for `hf_name`; None for a tied lm_head the engine does not
        hold apart (its embedding carries it). Raises KeyError naming both names otherwise."""
        parts = hf_name.split(".")
        shard: ShardId = None
        for i, part in enumerate(parts):
            if part in self.fused:
                fused, shard = self.fused[part]
                parts = [*parts[:i], fused, *parts[i + 1 :]]
                break
        canonical = ".".join(parts)
        name = self.by_canonical.get(canonical)
        if name is None:
            if hf_name == "lm_head.weight":
                return None  # tied: the embedding already carries it
            raise KeyError(f"engine has no parameter for {hf_name!r} (looked for {canonical!r})")
        return Target(name, shard)

    def parts_of(self, target: Target) -> int:
        """How many Hugging Face tensors fill the target's parameter (a q/k/v slice: 3)."""
        if target.shard is None:
            return 1
        module = canonical_name(target.name).rsplit(".", 2)[-2]
        return self.num_parts[module]

    def engine_name(self, hf_name: str) -> str:
        target = self.locate(hf_name)
        return hf_name if target is None else target.name


def choose_strategy(
    requested: Literal["auto", "reload", "direct"],
    layout: WeightLayout,
    repackable: bool,
    blockers: Sequence[str] = (),
) -> Strategy:
    """`repackable`: every packed weight of the engine is one the direct path can repack.
    `blockers`: why a direct copy would not be exact (hybrid.sharding.direct_fit)."""
    direct_fits = (layout == "plain" or repackable) and not blockers
    if requested == "reload":
        return "reload"
    if requested == "direct" and not direct_fits:
        reason = (
            summarize(list(blockers))
            if blockers
            else "its packed weights are not all unquantized linear layers, the only ones it "
            "can repack directly"
        )
        raise ValueError(
            f"sync.strategy=direct cannot refresh this engine exactly: {reason}; use "
            "sync.strategy=reload or auto"
        )
    return "direct" if direct_fits else "reload"


@torch.no_grad()
def load_direct(
    engine_model: torch.nn.Module,
    names: EngineNames,
    weights: Iterable[tuple[str, torch.Tensor]],
) -> None:
    """Each tensor through its engine parameter's loader: in place into a plain parameter (or
    its slice of a fused one), into a staging weight for a packed one."""
    from vllm.model_executor.model_loader.weight_utils import default_weight_loader

    params = dict(engine_model.named_parameters())
    repacker = Repacker(engine_model)
    for hf_name, tensor in weights:
        target = names.locate(hf_name)
        if target is None:
            continue
        packed = repacker.holds(target.name)
        param = repacker.staging(target.name) if packed else params[target.name]
        loader = getattr(param, "weight_loader", default_weight_loader)
        args = (param, tensor) if target.shard is None else (param, tensor, target.shard)
        loader(*args)
        if packed:
            repacker.loaded(target.name, target.shard, names.parts_of(target))
        else:
            repacker.written(target.name)
    repacker.finish()


def is_vllm_module(model: torch.nn.Module) -> bool:
    """The engine's module is one of vLLM's model classes (read without importing vLLM)."""
    return type(model).__module__.startswith("vllm.")


class WeightLoader:
    """Streams full tensors into a rollout engine with the chosen strategy."""

    def __init__(
        self, engine: RolloutEngine, requested: Literal["auto", "reload", "direct"]
    ) -> None:
        self.engine = engine
        self.names: EngineNames | None = None
        if not is_vllm_module(engine.model):
            # Direct is built on vLLM's per-layer loaders; asking whether it fits would
            # import vLLM into a process that runs the toy engine for nothing.
            self.blockers = ["the engine's module is not a vLLM model"]
            self.strategy = choose_strategy(requested, engine.weight_layout, False, self.blockers)
            return
        self.blockers = direct_blockers(engine_layers(engine.model), engine.quantization)
        self.strategy = choose_strategy(
            requested, engine.weight_layout, can_repack(engine.model), self.blockers
        )
        if requested == "auto" and self.blockers:
            logger.warning("sync.strategy=auto: reload, not direct: %s", summarize(self.blockers))
        self.names = EngineNames.of(engine.model)

    def engine_name(self, hf_name: str) -> str:
        """The engine's name of a Hugging Face tensor (a non-vLLM module uses HF names)."""
        return hf_name if self.names is None else self.names.engine_name(hf_name)

    def load(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        if self.strategy == "reload":
            self.engine.load_weights(weights)
            return
        assert self.names is not None  # direct is chosen only for a vLLM model
        load_direct(self.engine.model, self.names, weights)
        self.engine.after_load()
