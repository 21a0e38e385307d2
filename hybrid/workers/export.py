"""Exporting the trained actor (or PPO's critic) as a Hugging Face model directory
(transformers and vLLM load the actor's; transformers' token-classification class the critic's).

Every rank takes part in gathering the full state dict (offloaded to CPU); rank 0 writes
bf16 safetensors next to copies of the source model's config and tokenizer files, in the Hub's
layout (the family's state-dict adapter: a mixture of experts gets one key per expert again).
A LoRA actor exports its merged weights through `write_hf_model` (the gathering is the sync's).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import cast

import torch
import torch.distributed as dist
from safetensors.torch import save_file
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from transformers import AutoConfig, PretrainedConfig

from hybrid.models.state_dict import adapter_for

_COPIED = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "preprocessor_config.json",  # a vision-language model's image processor
    "chat_template.jinja",
)


def export_hf_model(
    model: torch.nn.Module,
    source_dir: str | Path,
    target_dir: str | Path,
    config: PretrainedConfig | None = None,
) -> Path:
    """The FSDP2 `model` gathered and written by rank 0 (see write_hf_model)."""
    state = get_model_state_dict(
        model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )
    tied = bool(getattr(getattr(model, "config", None), "tie_word_embeddings", False))
    tensors = {
        name: cast(torch.Tensor, tensor)
        for name, tensor in state.items()
        if not (tied and name == "lm_head.weight")  # a tied checkpoint stores it once
    }
    return write_hf_model(tensors, source_dir, target_dir, config)


def write_hf_model(
    tensors: dict[str, torch.Tensor],
    source_dir: str | Path,
    target_dir: str | Path,
    config: PretrainedConfig | None = None,
) -> Path:
    """Rank 0 writes `tensors` (the module's Hugging Face names and layout) as bf16
    safetensors in the checkpoint layout, beside the source's config and tokenizer files;
    every rank waits for it. `config` replaces the source's config.json (a critic: the
    decoder's config with its value-head class)."""
    target = Path(target_dir)
    if not dist.is_initialized() or dist.get_rank() == 0:
        target.mkdir(parents=True, exist_ok=True)
        adapter = adapter_for(config or AutoConfig.from_pretrained(source_dir))
        weights = {
            name: t.to(torch.bfloat16).contiguous().cpu()
            for name, t in adapter.to_checkpoint(tensors.items())
        }
        save_file(weights, str(target / "model.safetensors"), metadata={"format": "pt"})
        for name in _COPIED:
            if (Path(source_dir) / name).exists():
                shutil.copyfile(Path(source_dir) / name, target / name)
        if config is not None:
            config.to_json_file(str(target / "config.json"))
    if dist.is_initialized():
        dist.barrier()
    return target
