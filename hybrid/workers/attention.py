"""Which attention kernel the training and reference models run: `model.attn_implementation`.

auto: flash_attention_2 where flash-attn is installed and the model runs on CUDA, otherwise
sdpa (PyTorch's scaled-dot-product attention; packed micro-batches go through our varlen
path, hybrid.workers.varlen_attention). flash-attn has no wheel on PyPI and is an optional
extra (`.[flash]`), so a preset that named it outright would stop on every machine without
it; `auto` is what the presets use.
"""

from __future__ import annotations

import importlib.util
from typing import Literal

AttnChoice = Literal["auto", "sdpa", "eager", "flash_attention_2"]
AttnImplementation = Literal["sdpa", "eager", "flash_attention_2"]
ATTN_CHOICES: tuple[AttnChoice, ...] = ("auto", "sdpa", "eager", "flash_attention_2")


def flash_attn_installed() -> bool:
    return importlib.util.find_spec("flash_attn") is not None


def resolve_attn_implementation(
    requested: AttnChoice, *, flash_installed: bool, on_cuda: bool
) -> AttnImplementation:
    """The kernel to build the model with; refuses a choice this machine cannot run."""
    if requested == "auto":
        return "flash_attention_2" if flash_installed and on_cuda else "sdpa"
    if requested == "flash_attention_2":
        if not flash_installed:
            raise ValueError(
                "model.attn_implementation=flash_attention_2 needs flash-attn, which is not "
                "installed; install `.[flash]` (docs/install.md) or use sdpa (or auto)"
            )
        if not on_cuda:
            raise ValueError(
                "model.attn_implementation=flash_attention_2 runs on CUDA only and this model "
                "is on the CPU; use sdpa (or auto)"
            )
    return requested
