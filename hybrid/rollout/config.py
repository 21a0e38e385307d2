"""RolloutConfig: the rollout engine (vLLM, or the toy engine of the driver tests) and its
sampling settings."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from hybrid.dtypes import DTYPE_CHOICES, DtypeChoice
from hybrid.rollout.agent.config import AgentConfig
from hybrid.validation import check_choice, check_positive, check_range

ENGINES = ("vllm", "toy")


@dataclass(frozen=True)
class RolloutConfig:
    engine: Literal["vllm", "toy"] = "vllm"
    """Which engine generates. vllm: the in-process vLLM engine (hybrid.rollout.vllm_engine).
    toy: a deterministic engine over the Hugging Face model itself (hybrid.rollout.toy_engine),
    for tests of the driver logic that need no vLLM; the vLLM-only settings below
    (memory, eager mode, load format) do not apply to it."""
    tensor_parallel_size: int = 1
    """vLLM tensor parallelism; the rollout mesh is (world / tp) x tp."""
    dtype: DtypeChoice = "auto"
    """The engine's weights and compute; auto: bfloat16 where the device computes it natively,
    float16 on older GPUs, float32 on CPUs without bf16 (hybrid/dtypes.py). The sync casts the
    actor's weights to it."""
    max_model_len: int = 512
    """Longest prompt + response the engine schedules."""
    prompt_length: int = 64
    """Width prompts are left-padded to in the returned tensors."""
    response_length: int = 32
    """Max new tokens; responses are right-padded to this width."""
    n: int = 1
    """Samples per prompt: generate_sequences returns n adjacent rows per input row."""
    temperature: float = 1.0
    """Sampling temperature (0 = greedy)."""
    top_p: float = 1.0
    """Nucleus sampling mass."""
    top_k: int = -1
    """Top-k sampling (-1 = off)."""
    ignore_eos: bool = False
    """Generate every response to its budget, past end-of-sequence (benchmarks of length)."""
    seed: int = 0
    """Base sampling seed: the engine of data-parallel rank d is seeded with seed + d, and
    with seed_requests each row samples with its own `seed` column."""
    seed_requests: bool | None = None
    """Give every request its row's seed (reproducible per row whatever the batch; vLLM then
    draws for seeded rows one by one) or seed only the engine. Unset: per request on CPU,
    per engine on CUDA (hybrid.rollout.engine_args)."""
    gpu_memory_utilization: float = 0.5
    """Fraction of GPU memory vLLM may take (weights + KV cache) on CUDA."""
    kv_cache_memory_bytes: int | None = None
    """Explicit KV-cache size per engine. Unset: 64 MiB on CPU (vLLM would take ~12 GiB of
    RAM), sized by gpu_memory_utilization on CUDA; a GPU value too small for 32 sequences of
    max_model_len is refused."""
    load_format: Literal["auto", "dummy"] = "dummy"
    """dummy: random weights at start, the first sync fills them (nothing read from disk)."""
    enforce_eager: bool | None = None
    """Run without CUDA graphs. Unset: eager on CPU, graphs on CUDA (faster decoding; they
    keep ~1 GiB resident across sleep/wake)."""
    free_cache_engine: bool = True
    """Release the KV cache in trainer mode (vLLM sleep mode on CUDA)."""
    return_routed_experts: bool = False
    """A mixture of experts: the engine returns the experts it chose for every token it ran
    (vLLM's enable_return_routed_experts: its V2 model runner, CUDA only in vLLM 0.32; the toy
    engine from the module's routers). actor.router_replay=rollout turns it on."""
    max_images: int = 4
    """A vision-language model: the most images one prompt may hold (vLLM sizes its encoder
    cache for them; a prompt row with more is refused at load, naming it)."""
    agent: AgentConfig = field(default_factory=AgentConfig)
    """Multi-turn rollouts with tools and environments (hybrid/rollout/agent/, docs/agents.md):
    off unless agent.enabled."""

    def __post_init__(self) -> None:
        check_choice("rollout", "engine", self.engine, ENGINES)
        check_positive(
            "rollout",
            tensor_parallel_size=self.tensor_parallel_size,
            n=self.n,
            max_model_len=self.max_model_len,
            prompt_length=self.prompt_length,
            response_length=self.response_length,
            max_images=self.max_images,
        )
        if self.prompt_length + self.response_length > self.max_model_len:
            raise ValueError(
                f"rollout.prompt_length ({self.prompt_length}) + rollout.response_length "
                f"({self.response_length}) exceeds rollout.max_model_len ({self.max_model_len})"
            )
        check_choice("rollout", "dtype", self.dtype, DTYPE_CHOICES)
        check_choice("rollout", "load_format", self.load_format, ("auto", "dummy"))
        check_range("rollout", "gpu_memory_utilization", self.gpu_memory_utilization, 0.0, 1.0)
        if self.kv_cache_memory_bytes is not None:
            check_positive("rollout", kv_cache_memory_bytes=self.kv_cache_memory_bytes)
        if self.top_k != -1 and self.top_k < 1:
            raise ValueError(f"rollout.top_k must be -1 (off) or >= 1, got {self.top_k}")
        if self.temperature < 0:
            raise ValueError(f"rollout.temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"rollout.top_p must be in (0, 1], got {self.top_p}")
