"""Which attention kernel the training and reference models run: `model.attn_implementation`.

auto: flash_attention_2 where flash-attn is installed and the model runs on CUDA, otherwise
sdpa (PyTorch's scaled-dot-product attention; packed micro-batches go through our varlen
path, hybrid.workers.varlen_attention). flash-attn has no wheel on PyPI and is an optional
extra (`.[flash]`), so a preset that named it outright would stop on every machine without
it; `auto` is what the presets use. Under sequence parallelism (`actor.sp_size` > 1) `auto`
means sdpa on every device: the Ulysses all-to-alls wrap our varlen sdpa path.
"""

from __future__ import annotations

import importlib.util
from typing import Literal

AttnChoice = Literal["auto", "sdpa", "eager", "flash_attention_2"]
AttnImplementation = Literal["sdpa", "eager", "flash_attention_2"]
ATTN_CHOICES: tuple[AttnChoice, ...] = ("auto", "sdpa", "eager", "flash_attention_2")


def flash_attn_installed() -> bool:
    return importlib.util.find_spec("flash_attn") is not None


SEQUENCE_PARALLEL_CHOICES: tuple[AttnChoice, ...] = ("auto", "sdpa")
"""What Ulysses sequence parallelism wraps: our varlen sdpa (hybrid.workers.ulysses)."""


def check_sequence_parallel_attention(requested: AttnChoice, sp: int) -> None:
    """Sequence parallelism exchanges heads and tokens around the varlen sdpa path only: any
    other kernel would attend within a rank's slice, so it is refused, naming the ones that
    can."""
    if sp > 1 and requested not in SEQUENCE_PARALLEL_CHOICES:
        raise ValueError(
            f"model.attn_implementation={requested} cannot be wrapped for actor.sp_size "
            f"({sp}): Ulysses wraps {' or '.join(SEQUENCE_PARALLEL_CHOICES)} (our varlen sdpa, "
            "on CPU and GPU)"
        )


def resolve_attn_implementation(
    requested: AttnChoice, *, flash_installed: bool, on_cuda: bool, sp: int = 1
) -> AttnImplementation:
    """The kernel to build the model with; refuses a choice this machine cannot run, or one
    sequence parallelism (`sp` > 1) cannot wrap."""
    check_sequence_parallel_attention(requested, sp)
    if requested == "auto":
        return "flash_attention_2" if flash_installed and on_cuda and sp == 1 else "sdpa"
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
