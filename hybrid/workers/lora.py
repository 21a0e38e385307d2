"""LoRA on the actor: peft adapters on a meta-device model, and their checks.

The actor is a `peft.PeftModel` around the Hugging Face model, wrapped before FSDP2 shards
it. The tensor names and the adapter files it shares with the sync are in
hybrid/sharding/lora_files.py.

Adapters start as peft initialises them: A ~ kaiming-uniform (bound 1/sqrt(in_features)), B = 0,
so the adapted model equals the base model at step 0. The values are drawn on rank 0 from a
seeded generator, so every run starts from the same adapter.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from hybrid.sharding.lora_files import ADAPTER_NAME, AdapterSpec, ExpertAdapter, is_lora_name
from hybrid.workers.config import ALL_LINEAR, LoraConfig

LORA_ADAPTER_DIR = "lora_adapter"
"""Where checkpoints and the final output keep the adapter (peft format)."""


def linear_module_names(model: nn.Module) -> list[str]:
    """Distinct short names of the linear layers inside the decoder layers."""
    names = {
        name.rsplit(".", 1)[-1]
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear) and ".layers." in f".{name}"
    }
    return sorted(names)


def expert_aliases(model: nn.Module, names: Iterable[str]) -> set[str]:
    """The names among `names` that peft moves from linear modules to a mixture of experts'
    stacked parameters (its conversion for transformers 5: on Qwen3-MoE `down_proj` means the
    experts' `down_proj` [E, H, I], and the dense layers' `down_proj` gets no adapter); empty
    for a dense model."""
    from peft import LoraConfig as PeftLoraConfig
    from peft.utils.transformers_weight_conversion import convert_peft_config_for_transformers

    wanted = set(names)
    probe = PeftLoraConfig(r=1, target_modules=sorted(wanted))
    convert_peft_config_for_transformers(probe, model, None)
    return wanted - set(probe.target_modules or ())


def target_modules(model: nn.Module, lora: LoraConfig) -> list[str]:
    """The module names that get adapters; an entry that matches nothing raises, listing the
    linear modules that exist. On a mixture of experts "all-linear" means the attention (and
    the dense layers' linears): it leaves out the names peft moves onto the stacked experts.
    Naming them (`gate_proj` and `up_proj` together: the experts fuse them; `down_proj`) puts
    adapters on every expert (peft's ParamWrapper), synced merged."""
    existing = linear_module_names(model)
    on_experts = expert_aliases(model, existing)
    if lora.target_modules == ALL_LINEAR:
        return [name for name in existing if name not in on_experts]
    unknown = [name for name in lora.target_modules if name not in existing]
    if unknown:
        raise ValueError(
            f"model.lora.target_modules: {unknown} match no linear module of "
            f"{type(model).__name__}; its decoder layers have {existing}"
        )
    if any(name in on_experts for name in lora.target_modules):
        try:  # peft's own rules for the experts (gate and up fused: both or neither)
            expert_aliases(model, lora.target_modules)
        except ValueError as error:
            raise ValueError(f"model.lora.target_modules: {error}") from None
    return list(lora.target_modules)


def adapts_experts(model: nn.Module, lora: LoraConfig) -> bool:
    """Whether `lora` puts adapters on a mixture of experts' stacked experts."""
    if not lora.enabled or lora.target_modules == ALL_LINEAR:
        return False
    return bool(expert_aliases(model, lora.target_modules))


def check_lora_setup(
    model_path: str, lora: LoraConfig, lora_mode: str, engine: str = "vllm", ep_size: int = 1
) -> None:
    """Fail before any worker starts: target modules the model lacks, or adapter syncs to an
    engine that cannot serve LoRA for this architecture."""
    if not lora.enabled:
        return
    from transformers import AutoConfig

    from hybrid.models.classes import auto_model_class
    from hybrid.rollout.engines import engine_class

    config = AutoConfig.from_pretrained(model_path)
    with torch.device("meta"):
        model = auto_model_class(config).from_config(config)
    target_modules(model, lora)
    if adapts_experts(model, lora):
        if lora_mode == "adapter":
            raise ValueError(
                f"sync.lora_mode=adapter: model.lora.target_modules {list(lora.target_modules)} "
                "put adapters on the stacked experts, which no engine here serves as an "
                "adapter; use sync.lora_mode=merge, which sends merged full weights"
            )
        if ep_size > 1:
            raise ValueError(
                f"actor.ep_size ({ep_size}) with adapters on the experts "
                f"(model.lora.target_modules {list(lora.target_modules)}): expert parallelism "
                "holds the base experts only; adapt the attention (all-linear) or set ep_size=1"
            )
        return
    architectures = getattr(config, "architectures", None) or [type(model).__name__]
    if lora_mode == "adapter" and not engine_class(engine).supports_lora(architectures[0]):
        raise ValueError(
            f"sync.lora_mode=adapter: rollout.engine={engine} has no LoRA support for "
            f"{architectures[0]} "
            f"({model_path}); use sync.lora_mode=merge, which sends merged full weights"
        )


def adapted_modules(peft_model: nn.Module) -> list[str]:
    """The module names that carry adapters in a peft model ("all-linear" resolved)."""
    peft: Any = peft_model
    return sorted(peft.peft_config[ADAPTER_NAME].target_modules)


@contextmanager
def adapters_disabled(peft_model: nn.Module) -> Iterator[None]:
    """The base model inside: a context in which the adapters add nothing.

    peft also clears the adapters' requires_grad while they are disabled. FSDP2 decides once,
    at its lazy init (the first forward, possibly this one), which parameters are trainable
    and casts their reduced gradients accordingly, so the flags are put back at once."""
    peft: Any = peft_model
    with peft.disable_adapter():
        for name, param in peft_model.named_parameters():
            if is_lora_name(name):
                param.requires_grad_(True)
        yield


def add_adapters(
    model: nn.Module, lora: LoraConfig, base_dtype: torch.dtype, adapter_dtype: torch.dtype
) -> nn.Module:
    """Wrap `model` (on the meta device) in a PeftModel: base frozen in `base_dtype`, the
    adapters trainable in `adapter_dtype`."""
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    config = PeftLoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=target_modules(model, lora),
        bias="none",
        task_type="CAUSAL_LM",
    )
    peft_model = get_peft_model(model, config)
    for name, param in peft_model.named_parameters():
        lora_param = is_lora_name(name)
        param.requires_grad_(lora_param)
        param.data = param.data.to(adapter_dtype if lora_param else base_dtype)
    return peft_model


def initial_adapter(
    shapes: Iterable[tuple[str, torch.Size]], dtype: torch.dtype, seed: int = 0
) -> dict[str, torch.Tensor]:
    """peft's default initialisation of every lora_A / lora_B, reproducibly."""
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, shape in sorted(shapes):
        if ".lora_B." in name:
            tensors[name] = torch.zeros(shape, dtype=dtype)
        else:  # kaiming_uniform_(a=sqrt(5)) on (rank, in_features): bound 1 / sqrt(in)
            bound = 1.0 / math.sqrt(shape[1])
            tensors[name] = (torch.rand(shape, generator=generator) * 2 - 1) * bound
            tensors[name] = tensors[name].to(dtype)
    return tensors


def adapter_spec(peft_model: nn.Module, lora: LoraConfig, base_model_path: str) -> AdapterSpec:
    """The adapter's description for its files and the sync ("all-linear" resolved)."""
    peft: Any = peft_model
    config = peft.peft_config[ADAPTER_NAME]
    return AdapterSpec(
        rank=lora.rank,
        alpha=lora.alpha,
        dropout=lora.dropout,
        target_modules=tuple(adapted_modules(peft_model)),
        base_model_path=base_model_path,
        target_parameters=tuple(sorted(config.target_parameters or ())),
        rank_pattern=tuple(sorted((config.rank_pattern or {}).items())),
        alpha_pattern=tuple(sorted((config.alpha_pattern or {}).items())),
    )


def expert_adapters(peft_model: nn.Module) -> dict[str, ExpertAdapter]:
    """The adapters on stacked expert tensors (peft's ParamWrapper), by the peft name of the
    base tensor each one adapts (for the merge)."""
    from peft.tuners.lora.layer import ParamWrapper

    names = {id(p): name for name, p in peft_model.named_parameters()}
    adapters = {}
    for path, module in peft_model.named_modules():
        if not isinstance(module, ParamWrapper):
            continue
        if not module._did_swap_in_out_features:
            raise ValueError(
                f"{path}: adapters on experts stored transposed (GPT-OSS's layout) are not "
                "merged here"
            )
        adapters[names[id(module.get_param())]] = ExpertAdapter(
            lora_a=f"{path}.lora_A.{ADAPTER_NAME}.weight",
            lora_b=f"{path}.lora_B.{ADAPTER_NAME}.weight",
            num_experts=int(module.num_experts),
            scaling=float(module.scaling[ADAPTER_NAME]),
        )
    return adapters
