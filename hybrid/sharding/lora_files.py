"""LoRA tensors as the sync sees them: their names, the merge, and peft adapter files.

Three name spaces meet here:
  peft (in the model):  base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight
                        base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight
  Hugging Face:         model.layers.0.self_attn.q_proj.weight  (checkpoints, vLLM's loader)
  peft files:           base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight
                        (adapter_model.safetensors: the adapter name dropped)
`hf_name` and `adapter_file_name` map the first to the other two. The sync (LoraSync) and the
workers (the peft actor, adapter export) both use these; nothing here knows a worker.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

ADAPTER_NAME = "default"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
_PEFT_PREFIX = "base_model.model."
_LORA_MARK = ".lora_"


def is_lora_name(name: str) -> bool:
    return _LORA_MARK in name


def hf_name(peft_name: str) -> str:
    """The Hugging Face name of a base parameter of the peft model (a stacked expert tensor
    with adapters on two of its module's parameters sits under two nested wrappers)."""
    name = peft_name.removeprefix(_PEFT_PREFIX)
    while ".base_layer." in name:
        name = name.replace(".base_layer.", ".")
    return name


def adapter_file_name(peft_name: str) -> str:
    """The name an adapter tensor has in a peft adapter file (and for vLLM's LoRA loader)."""
    return peft_name.replace(f".{ADAPTER_NAME}.", ".")


def merge_into_base(
    base: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, scaling: float
) -> torch.Tensor:
    """W + scaling * B @ A, computed in fp32, returned in the base's dtype."""
    merged = base.float() + scaling * (lora_b.float() @ lora_a.float())
    return merged.to(base.dtype)


@dataclass(frozen=True)
class ExpertAdapter:
    """The adapter peft's ParamWrapper puts on one stacked expert tensor [E, d1, d2]: lora_A
    [E * r, d2] and lora_B [d1, r * E] hold every expert's factors side by side."""

    lora_a: str
    lora_b: str
    """The adapter tensors' names in the peft model."""
    num_experts: int
    scaling: float
    """alpha / r of this wrapper (peft gives a fused gate_up_proj twice the rank and alpha)."""


def merge_experts_into_base(
    base: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, adapter: ExpertAdapter
) -> torch.Tensor:
    """Every expert's W_e + scaling * B_e @ A_e, in fp32, returned in the base's dtype.

    base (E, d1, d2); lora_a (E * r, d2): expert e's rows e*r .. e*r + r-1; lora_b (d1, r * E):
    rank j of expert e in column j * E + e (peft's layout for transformers' experts, whose
    weights are not stored transposed)."""
    experts = adapter.num_experts
    a = lora_a.float().reshape(experts, -1, lora_a.shape[-1])  # (E, r, d2)
    b = lora_b.float().reshape(lora_b.shape[0], -1, experts).permute(2, 0, 1)  # (E, d1, r)
    merged = base.float() + adapter.scaling * torch.bmm(b, a)
    return merged.to(base.dtype)


@dataclass(frozen=True)
class AdapterSpec:
    """What an adapter_config.json says: the adapter's shape and its base model."""

    rank: int
    alpha: int
    dropout: float
    target_modules: tuple[str, ...]
    """Module names that carry adapters ("all-linear" resolved)."""
    base_model_path: str
    target_parameters: tuple[str, ...] = ()
    """Stacked expert tensors that carry adapters (peft's ParamWrapper)."""
    rank_pattern: tuple[tuple[str, int], ...] = ()
    alpha_pattern: tuple[tuple[str, int], ...] = ()
    """peft's per-name rank and alpha where they differ (a fused gate_up_proj: twice each)."""

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank


def write_adapter(directory: Path, tensors: dict[str, torch.Tensor], spec: AdapterSpec) -> Path:
    """A peft adapter directory: safetensors with peft's file names + adapter_config.json.
    `tensors` are keyed by the model's peft names."""
    write_adapter_config(directory, spec)
    return write_adapter_weights(directory, tensors)


def write_adapter_config(directory: Path, spec: AdapterSpec) -> None:
    from peft import LoraConfig as PeftLoraConfig

    directory.mkdir(parents=True, exist_ok=True)
    PeftLoraConfig(
        r=spec.rank,
        lora_alpha=spec.alpha,
        lora_dropout=spec.dropout,
        target_modules=sorted(spec.target_modules),
        target_parameters=sorted(spec.target_parameters) or None,
        rank_pattern=dict(spec.rank_pattern),
        alpha_pattern=dict(spec.alpha_pattern),
        bias="none",
        task_type="CAUSAL_LM",
        base_model_name_or_path=spec.base_model_path,
        inference_mode=True,
    ).save_pretrained(str(directory))


def write_adapter_weights(directory: Path, tensors: dict[str, torch.Tensor]) -> Path:
    """(Re)write the adapter's safetensors file; a reader never sees a half-written file."""
    from safetensors.torch import save_file

    weights = {adapter_file_name(k): v.contiguous() for k, v in tensors.items()}
    partial = directory / f".{ADAPTER_WEIGHTS}.partial"
    save_file(weights, str(partial), metadata={"format": "pt"})
    os.replace(partial, directory / ADAPTER_WEIGHTS)
    return directory
