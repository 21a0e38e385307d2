"""liger-kernel's fused ops on the training and scoring models (`actor.fused_kernels`,
`ref.fused_kernels`, `critic.fused_kernels`, `distill.fused_kernels`; the `liger` extra).

What liger fuses here, per decoder layer: RMSNorm (one Triton kernel instead of the fp32
upcast, square, mean, rsqrt, scale and cast), the rotary embedding of q and k, and the SwiGLU
MLP's gate (silu(gate) * up in one kernel, recomputed in backward rather than stored); for a
mixture of experts the norms and the rotary embedding only (its experts are our stacked
grouped-GEMM layout, which liger's MLP patch does not know). The passes that want no entropy
(the reference's, the teacher's) take their log-probs from liger's fused linear cross-entropy
(`fused_log_probs`): the LM head's matmul and the log-softmax in chunks, never (tokens x vocab)
logits. liger's op returns no entropy, and the actor's passes (the update, the old log-probs)
report the entropy on every step, so they keep our chunked head
(hybrid.algorithms.chunked_logprob), which computes both and also never holds the full logits.

liger's kernels are Triton kernels for CUDA: on CPU `auto` leaves them off and `on` is refused.

liger patches a transformers family through its `apply_liger_kernel_to_<family>(model=...)`:
the model's norm and MLP modules get liger's forwards, and the family's module-level
`apply_rotary_pos_emb`, RMSNorm class and MLP class are replaced for the whole process: a
model of that family built afterwards (the reference, a critic, a reward model) runs liger's
modules too, whatever its own setting. Written against liger-kernel 0.8.5 (its
`MODEL_TYPE_TO_APPLY_LIGER_FN` names).
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

import torch
from torch import nn

from hybrid.workers.config import KernelChoice

DENSE_FAMILIES = ("qwen2", "qwen3", "llama", "mistral")
"""Model types whose norms, rotary embedding and SwiGLU MLP liger fuses here."""
EXPERT_FAMILIES = ("qwen3_moe",)
"""Mixture-of-experts model types whose norms and rotary embedding liger fuses here."""
FUSED_OPS: tuple[str, ...] = ("rms_norm", "rope", "swiglu", "log_prob_head")
MOE_FUSED_OPS: tuple[str, ...] = ("rms_norm", "rope", "log_prob_head")


def liger_installed() -> bool:
    return importlib.util.find_spec("liger_kernel") is not None


def fused_ops_for(
    choice: KernelChoice,
    owner: str,
    *,
    model_type: str | None,
    on_cuda: bool,
    installed: bool,
) -> tuple[str, ...]:
    """The ops `owner`'s model fuses (empty: none). `auto` fuses what it can and nothing
    elsewhere; `on` is refused, naming what is missing, where liger cannot run."""
    if choice == "off":
        return ()
    ops: tuple[str, ...]
    if model_type in DENSE_FAMILIES:
        ops = FUSED_OPS
    elif model_type in EXPERT_FAMILIES:
        ops = MOE_FUSED_OPS
    else:
        ops = ()
    missing = [
        reason
        for reason, absent in (
            ("liger-kernel is not installed (pip install -e '.[liger]')", not installed),
            ("its kernels run on CUDA and this model is on the CPU", not on_cuda),
            (
                f"model type {model_type!r} is not a family it covers here "
                f"({', '.join(DENSE_FAMILIES + EXPERT_FAMILIES)})",
                not ops,
            ),
        )
        if absent
    ]
    if not missing:
        return ops
    if choice == "on":
        raise ValueError(f"{owner}.fused_kernels=on, but {'; '.join(missing)}: use auto or off")
    return ()


def apply_fused_kernels(model: nn.Module, model_type: str, ops: tuple[str, ...]) -> None:
    """Patch `model` (the transformers model, not a peft wrapper) with liger's kernels for
    `ops` (from `fused_ops_for`); the log-prob head is the scoring pass's, not patched here."""
    monkey_patch: Any = importlib.import_module("liger_kernel.transformers.monkey_patch")
    apply = monkey_patch.MODEL_TYPE_TO_APPLY_LIGER_FN[model_type]
    apply(
        rope="rope" in ops,
        rms_norm="rms_norm" in ops,
        swiglu="swiglu" in ops,
        cross_entropy=False,
        fused_linear_cross_entropy=False,  # the scoring head, not HF's loss, uses it
        model=model,
    )


def fused_log_probs(
    hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor
) -> torch.Tensor:
    """log p(label) (n,) fp32 of softmax(hidden @ weight.T), hidden (n, H), weight (V, H):
    liger's fused linear cross-entropy per token (reduction none, fp32 accumulation), negated."""
    functional: Any = importlib.import_module("liger_kernel.transformers.functional")
    loss = functional.liger_fused_linear_cross_entropy(
        hidden, weight, labels, reduction="none", accum_dtype=torch.float32
    )
    return -loss.float()
