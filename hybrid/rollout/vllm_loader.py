"""vLLM's side of the weight sync: putting gathered full tensors into the engine, in place.

Two strategies (VllmEngine picks one at `configure_loads`, hybrid.rollout.weights):
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
Face layout (no quantized or fused-expert layers: hybrid.rollout.direct_fit), else reload.

Names: the actor speaks Hugging Face names; the engine fuses projections (`packed_modules_mapping`
on its model: qkv_proj <- q/k/v_proj, gate_up_proj <- gate/up_proj) and, with LoRA enabled,
wraps each linear so its weight sits under `.base_layer.`. `EngineNames` is built from the
engine model itself, so every family vLLM implements this way maps without a table of ours.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from hybrid.rollout.vllm_compat import Repacker

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
        rename: Callable[[str], str] | None = None,
    ) -> None:
        """`rename`: the engine model's own Hugging Face -> engine prefix renaming, where it
        has one (vision-language models keep the decoder under `language_model.`)."""
        self.rename = rename or (lambda name: name)
        self.by_canonical = {canonical_name(name): name for name in engine_params}
        self.fused = fused_shards(packed_modules, qkv_modules)
        self.num_parts = {fused: len(parts) for fused, parts in packed_modules.items()}

    @classmethod
    def of(cls, engine_model: torch.nn.Module) -> EngineNames:
        names = [name for name, _ in engine_model.named_parameters()]
        # A vision-language model's decoder declares its fused projections on its own module.
        packed: dict[str, list[str]] = {}
        for module in engine_model.modules():
            packed.update(getattr(module, "packed_modules_mapping", None) or {})
        mapper = getattr(engine_model, "hf_to_vllm_mapper", None)
        rename = None
        if mapper is not None and mapper.orig_to_new_prefix:

            def rename(name: str) -> str:
                mapped = mapper.apply_list([name])
                return mapped[0] if mapped else name

        return cls(names, packed, qkv_module_names(engine_model), rename)

    def locate(self, hf_name: str) -> Target | None:
        """The engine parameter for `hf_name`; None for a tied lm_head the engine does not
        hold apart (its embedding carries it). Raises KeyError naming both names otherwise."""
        parts = self.rename(hf_name).split(".")
        shard: ShardId = None
        for i, part in enumerate(parts):
            if part in self.fused:
                fused, shard = self.fused[part]
                parts = [*parts[:i], fused, *parts[i + 1 :]]
                break
        canonical = ".".join(parts)
        name = self.by_canonical.get(canonical)
        if name is None:
            if hf_name == "lm_head.weight":  # tied: the embedding already carries it
                return None
            raise KeyError(f"engine has no parameter for {hf_name!r} (looked for {canonical!r})")
        return Target(name, shard)

    def parts_of(self, target: Target) -> int:
        """How many Hugging Face tensors fill the target's parameter (a q/k/v slice: 3)."""
        if target.shard is None:
            return 1
        module = canonical_name(target.name).rsplit(".", 2)[-2]
        return self.num_parts[module]

    def engine_name(self, hf_name: str) -> str | None:
        """The engine parameter's name (None: a tied lm_head the embedding carries)."""
        target = self.locate(hf_name)
        return None if target is None else target.name


def is_expert_tensor(hf_name: str) -> bool:
    """A routed expert's weights, stacked (`mlp.experts.gate_up_proj`) or per expert
    (`mlp.experts.3.down_proj.weight`); a shared expert is a plain MLP (`mlp.shared_expert.`)."""
    return ".mlp.experts." in hf_name


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
    load_model_weights: Any = getattr(engine_model, "load_weights", None)
    for hf_name, tensor in weights:
        if is_expert_tensor(hf_name):
            # The model's own loader knows its experts (stacked module tensors or per-expert
            # checkpoint ones, each with its expert id and TP slice); the CPU kernel's prepack
            # follows the whole stream (VllmEngine.load_weights).
            load_model_weights([(hf_name, tensor)])
            continue
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
