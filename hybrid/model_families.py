"""Which model families `hybrid` trains, read from a transformers config or its config.json.

A top-level module without torch or transformers (hybrid.models imports both): the driver checks
a model directory with it before any worker starts (hybrid.trainer.config_files), and the state-dict
adapters (hybrid.models.state_dict) pick their layout from it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

DENSE_FAMILIES = ("qwen2", "llama", "mistral", "qwen3")
"""Model types whose module and checkpoint layouts are the same (tested here)."""
STACKED_EXPERT_FAMILIES = ("qwen3_moe", "qwen2_moe")
"""Mixture-of-experts model types whose experts the module stacks (transformers' qwen2_moe
conversion rule); Qwen2-MoE adds a shared expert, a plain MLP under its own names."""

_EXPERT_COUNT_FIELDS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")


def _field(config: Any, name: str) -> Any:
    return config.get(name) if isinstance(config, Mapping) else getattr(config, name, None)


def num_experts(config: Any) -> int:
    """Routed experts per MoE layer of a transformers config or config.json mapping (0: a
    dense model)."""
    for name in _EXPERT_COUNT_FIELDS:
        value = _field(config, name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return 0


VISION_FAMILIES = ("qwen2_vl",)
"""Vision-language model types trained here (a vision tower before the decoder, mRoPE)."""


def is_vision(config: Any) -> bool:
    """A vision-language model: its config (or config.json) has a vision tower."""
    return _field(config, "vision_config") is not None


def hidden_size(config: Any) -> int | None:
    """The decoder's width (a vision-language model's language model's), None if unstated."""
    text = _field(config, "text_config")
    value = _field(text if text is not None else config, "hidden_size")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def read_model_config(directory: str | Path) -> dict[str, Any]:
    """A Hugging Face model directory's config.json."""
    with open(Path(directory) / "config.json") as f:
        config: dict[str, Any] = json.load(f)
    return config


def model_hidden_size(directory: str) -> int | None:
    """The hidden size of the model directory's config.json (None without one: a Hub id)."""
    if not (Path(directory) / "config.json").is_file():
        return None
    return hidden_size(read_model_config(directory))


def model_type(config: Any) -> str | None:
    value = _field(config, "model_type")
    return value if isinstance(value, str) else None


def check_family(config: Any, where: str) -> None:
    """A mixture of experts whose expert layout has no state-dict adapter here is refused,
    naming `where` (the field or file), its model type and the families supported."""
    kind = model_type(config)
    if num_experts(config) and kind not in STACKED_EXPERT_FAMILIES:
        raise ValueError(
            f"{where}: model type {kind!r} is a mixture of experts, and hybrid has no "
            f"state-dict adapter for its expert layout; supported mixture-of-experts families: "
            f"{', '.join(STACKED_EXPERT_FAMILIES)}"
        )


def check_expert_count(experts: int, ep_size: int, where: str) -> None:
    """Expert parallelism gives every ep rank the same number of whole experts."""
    if experts % ep_size:
        raise ValueError(
            f"actor.ep_size ({ep_size}) must divide the number of experts of {where} "
            f"({experts}): each expert-parallel rank owns num_experts / ep_size whole experts"
        )
