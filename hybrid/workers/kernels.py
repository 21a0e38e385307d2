"""Which faster kernels a model member runs: the plan resolved from its `fused_kernels` and
`compile` settings (hybrid.workers.config.ModelKernels) for the model and the device at hand.

The plan is made once, before the model is built (hybrid.workers.fsdp applies it), and kept by
the member for the start-up summary; `auto` resolves to what this machine can run, `on` to an
error naming what is missing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from hybrid.model_families import is_vision, model_type, num_experts, read_model_config
from hybrid.workers.compiled_blocks import resolve_compile
from hybrid.workers.config import ModelKernels
from hybrid.workers.fused_kernels import fused_ops_for, liger_installed


@dataclass(frozen=True)
class KernelPlan:
    """What `owner`'s model runs besides eager PyTorch."""

    owner: str
    fused_ops: tuple[str, ...] = ()
    """liger-kernel's ops the model uses (hybrid.workers.fused_kernels.FUSED_OPS); () none."""
    compile: bool = False
    """Each decoder layer compiled (hybrid.workers.compiled_blocks)."""
    compile_required: bool = False
    """compile=on: a failing compile is an error rather than an eager layer."""

    @property
    def fused_head(self) -> bool:
        """Log-probs from liger's fused linear cross-entropy instead of our chunked head."""
        return "log_prob_head" in self.fused_ops

    def describe(self) -> str:
        fused = ", ".join(self.fused_ops) if self.fused_ops else "none"
        return f"{self.owner}: fused {fused}, compiled layers {'on' if self.compile else 'off'}"


def plan_kernels(
    owner: str, choices: ModelKernels, model_config: Any, device: torch.device
) -> KernelPlan:
    """Resolve `owner`'s choices for the model of `model_config` (a transformers config or a
    config.json mapping) on `device`."""
    on_cuda = device.type == "cuda"
    return KernelPlan(
        owner=owner,
        fused_ops=fused_ops_for(
            choices.fused_kernels,
            owner,
            model_type=model_type(model_config),
            on_cuda=on_cuda,
            installed=liger_installed(),
        ),
        compile=resolve_compile(
            choices.compile,
            owner,
            on_cuda=on_cuda,
            mixture_of_experts=num_experts(model_config) > 0,
            vision=is_vision(model_config),
        ),
        compile_required=choices.compile == "on",
    )


def plan_for_model(
    owner: str, choices: ModelKernels, model_path: str, device: torch.device
) -> KernelPlan:
    """`plan_kernels` for the model directory at `model_path` (its config.json)."""
    return plan_kernels(owner, choices, read_model_config(model_path), device)
