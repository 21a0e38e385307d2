"""TRL's GRPOTrainer on our tiny GRPO step's work: the reference point for bench_step.py.

Runs Hugging Face TRL's `GRPOTrainer`, set up as a new user would, on the same work as our step
at the demo's size (profiling/bench_floor.py's DEMO_SIZE): the tiny Qwen2 with the arithmetic
vocabulary that `python -m hybrid.models --preset tiny --vocab arithmetic` builds (seed 0), the
arithmetic task's train prompts (hybrid/data/arithmetic_task.py, seed 0, the rows
examples/data/arithmetic.py writes), its rule reward (hybrid/rewards/arithmetic.py), 8 prompts x
4 samples x up to 16 new tokens per step, one on-policy optimizer step over the 32 completions
(num_iterations=1, gradient_accumulation_steps=1, per_device_train_batch_size=32), beta=0 (no
reference model), AdamW lr 1e-4 constant, gradient clipping 1.0, fp32 throughout (bf16=False, the
policy loaded in float32, vLLM's dtype forced to float32: TRL passes no dtype to vLLM, which would
take the checkpoint's bfloat16, and our config's 32 MiB KV cache). Generation: vLLM colocated
in the trainer's process (use_vllm=True, vllm_mode="colocate", weights pushed into the engine
every step), or with `--no-vllm` transformers' `generate`.

Two departures from TRL as shipped, both needed on this CPU:
  * TRL 1.16 pushes the weights by calling the vLLM model's `load_weights` one parameter at a
    time, which fails on vLLM 0.32's CPU backend ("'Parameter' object has no attribute
    'weight_loader'"; TRL says it supports vLLM 0.22-0.31); by default the push goes through
    vLLM's `reload_weights` instead, as our engine's `reload` strategy does
    (`--vllm-sync trl` keeps TRL's own, to see the failure);
  * vLLM's dtype and KV-cache size, above.
TRL's default vllm_importance_sampling_correction=True adds a no-grad log-prob pass over the 32
sequences every step, which our config skips (algorithm.skip_old_log_prob=true);
`--no-is-correction` turns it off for the same work as ours.

The time of a step is the wall time from the trainer's on_step_begin to its on_step_end callback
(the weight push to vLLM, generation, reward, the log-prob passes, the loss's forward/backward,
clipping, the optimizer step), split into gen (vLLM's or transformers' generate), sync (the
weight push), reward and the rest; the period is on_step_end to the next on_step_end (that plus
the trainer's logging and the data loader). Medians over the steps after `--warmup`.

TRL is not a project dependency; install it in a separate virtualenv that reuses the project's
torch/vLLM/transformers through a .pth file (the project's .venv is left untouched), and run:

    python3.11 -m venv /work/trl-venv
    echo /work/main/.venv/lib/python3.11/site-packages \\
        > /work/trl-venv/lib/python3.11/site-packages/zz_main_venv.pth
    /work/trl-venv/bin/pip install --no-deps trl && /work/trl-venv/bin/pip install datasets
    /work/trl-venv/bin/python profiling/bench_trl.py [--steps 16] [--warmup 2] [--no-vllm]

Only hybrid.models, hybrid.data.arithmetic_task and hybrid.rewards.arithmetic are imported from
the project (torch, transformers, safetensors, numpy, pyarrow: no Ray). Last line: a JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: hybrid

from hybrid.data.arithmetic_task import make_rows
from hybrid.models import TinyModelConfig, build_tiny_model
from hybrid.rewards.arithmetic import compute_score

try:
    import trl
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer
except ImportError as error:  # pragma: no cover - depends on the environment
    sys.exit(
        f"bench_trl.py needs TRL and datasets, which are not importable here ({error}).\n"
        "TRL is not a project dependency: install it into a separate virtualenv, e.g.\n"
        "  python -m venv /work/trl-venv && echo /work/main/.venv/lib/python3.11/site-packages"
        " > /work/trl-venv/lib/python3.11/site-packages/zz_main_venv.pth\n"
        "  /work/trl-venv/bin/pip install --no-deps trl && /work/trl-venv/bin/pip install datasets\n"
        "and run it with /work/trl-venv/bin/python profiling/bench_trl.py"
    )

PHASES: dict[str, float] = {"gen": 0.0, "sync": 0.0, "reward": 0.0}
"""Seconds spent in each phase since the current step began (reset by StepTimer)."""

PROMPTS = 8  # data.train_batch_size of the demo size
SAMPLES = 4  # rollout.n
NEW_TOKENS = 16  # rollout.response_length
MAX_MODEL_LEN = 64  # rollout.max_model_len of configs/config.yaml
KV_CACHE_BYTES = 32 * 1024 * 1024  # rollout.kv_cache_memory_bytes of configs/config.yaml


def arithmetic_reward(completions: list[Any], ground_truth: list[str], **_: Any) -> list[float]:
    """Our arithmetic rule reward on each completion (conversational: the assistant's text)."""
    started = time.perf_counter()
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    scores = [compute_score(text, gold) for text, gold in zip(texts, ground_truth, strict=True)]
    PHASES["reward"] += time.perf_counter() - started
    return scores


def timed(cls: Any, method: str, phase: str) -> None:
    """Add the wall time of `cls.method` to PHASES[phase]."""
    original = getattr(cls, method)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            PHASES[phase] += time.perf_counter() - started

    setattr(cls, method, wrapper)


def dataset(num_rows: int = 1000) -> Dataset:
    """The arithmetic task's train rows (examples/data/arithmetic.py's defaults: seed 0,
    operands in [0, 5)), in TRL's conversational prompt layout."""
    rows = make_rows(num_rows, 5, "train", np.random.default_rng(0))
    return Dataset.from_list(
        [{"prompt": r["prompt"], "ground_truth": r["reward_model"]["ground_truth"]} for r in rows]
    )


class StepTimer(TrainerCallback):
    """Wall time of every optimizer step (on_step_begin -> on_step_end), of every period
    (on_step_end -> on_step_end), and the logged completion lengths."""

    def __init__(self) -> None:
        self.began = 0.0
        self.last_end: float | None = None
        self.steps: list[float] = []
        self.periods: list[float] = []
        self.lengths: list[float] = []
        self.rewards: list[float] = []
        self.phases: list[dict[str, float]] = []

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        PHASES.update(dict.fromkeys(PHASES, 0.0))
        self.began = time.perf_counter()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        now = time.perf_counter()
        self.steps.append(now - self.began)
        rest = self.steps[-1] - sum(PHASES.values())
        self.phases.append({**PHASES, "rest": rest})
        if self.last_end is not None:
            self.periods.append(now - self.last_end)
        self.last_end = now
        split = " ".join(f"{k} {v:.4f}" for k, v in self.phases[-1].items())
        print(f"step {len(self.steps)}: {self.steps[-1]:.4f} s ({split})", flush=True)

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
        if logs and "completions/mean_length" in logs:
            self.lengths.append(float(logs["completions/mean_length"]))
            self.rewards.append(float(logs.get("reward", float("nan"))))


def force_vllm_fp32() -> None:
    """TRL builds its colocated `vllm.LLM` without a dtype (so the checkpoint's bfloat16) and,
    on CPU, without a KV-cache size: give it float32 and our config's 32 MiB KV cache."""
    from trl.generation import vllm_generation

    base = vllm_generation.LLM

    def llm(*args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("dtype", "float32")
        kwargs.setdefault("kv_cache_memory_bytes", KV_CACHE_BYTES)
        return base(*args, **kwargs)

    vllm_generation.LLM = llm


def sync_by_reload() -> None:
    """TRL 1.16's colocated weight push calls the vLLM model's `load_weights` one parameter at a
    time, which fails on vLLM 0.32's CPU backend ("'Parameter' object has no attribute
    'weight_loader'": the CPU linear layers are repacked after loading). Push them through vLLM's
    `reload_weights` instead (what our engine's `reload` strategy calls), then reset the prefix
    cache as TRL does."""
    from trl.generation.vllm_generation import VLLMGeneration

    original = VLLMGeneration.sync_weights

    def sync_weights(self: Any) -> None:
        if self.mode != "colocate" or self.enable_sleep_mode:
            return original(self)
        weights = iter([(name, p.detach()) for name, p in self._iter_named_params()])
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
        self.llm.reset_prefix_cache()
        return None

    VLLMGeneration.sync_weights = sync_weights


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=16, help="measured steps")
    parser.add_argument("--warmup", type=int, default=2, help="steps before the measured ones")
    parser.add_argument("--no-vllm", action="store_true", help="transformers generate instead")
    parser.add_argument(
        "--vllm-sync",
        default="reload",
        choices=["reload", "trl"],
        help="weight push: vLLM's reload_weights (default) or TRL's own (fails on vLLM 0.32 CPU)",
    )
    parser.add_argument(
        "--no-is-correction",
        action="store_true",
        help="vllm_importance_sampling_correction=False: no extra no-grad log-prob pass (as ours)",
    )
    parser.add_argument("--ignore-eos", action="store_true", help="always 16 new tokens")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: all)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    use_vllm = not args.no_vllm
    if use_vllm:
        # One process, no torchrun: vLLM in this process, no engine-core subprocess.
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        force_vllm_fp32()
        if args.vllm_sync == "reload":
            sync_by_reload()
        from trl.generation.vllm_generation import VLLMGeneration

        timed(VLLMGeneration, "sync_weights", "sync")
        timed(VLLMGeneration, "generate", "gen")
    else:
        timed(GRPOTrainer, "_generate_single_turn", "gen")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model = build_tiny_model(
            root / "model", TinyModelConfig.preset("tiny", vocab="arithmetic"), seed=0
        )
        config = GRPOConfig(
            output_dir=str(root / "out"),
            max_steps=args.warmup + args.steps,
            per_device_train_batch_size=PROMPTS * SAMPLES,
            gradient_accumulation_steps=1,
            num_generations=SAMPLES,
            max_completion_length=NEW_TOKENS,
            num_iterations=1,
            beta=0.0,
            learning_rate=1e-4,
            lr_scheduler_type="constant",
            weight_decay=0.0,
            max_grad_norm=1.0,
            temperature=1.0,
            bf16=False,
            fp16=False,
            use_cpu=True,
            model_init_kwargs={"dtype": torch.float32},
            use_vllm=use_vllm,
            vllm_mode="colocate",
            vllm_max_model_length=MAX_MODEL_LEN,
            vllm_importance_sampling_correction=not args.no_is_correction,
            generation_kwargs={"ignore_eos": True} if args.ignore_eos and use_vllm else None,
            logging_steps=1,
            report_to="none",
            save_strategy="no",
            disable_tqdm=True,
            seed=0,
        )
        timer = StepTimer()
        trainer = GRPOTrainer(
            model=str(model),
            reward_funcs=arithmetic_reward,
            args=config,
            train_dataset=dataset(),
            callbacks=[timer],
        )
        if args.ignore_eos and not use_vllm:
            trainer.generation_config.min_new_tokens = NEW_TOKENS
        engine_dtype = None
        if use_vllm:
            engine_dtype = str(trainer.vllm_generation.llm.llm_engine.model_config.dtype)
        policy_dtype = str(next(trainer.model.parameters()).dtype)
        trainer.train()
    measured = timer.steps[args.warmup :]
    periods = timer.periods[max(args.warmup - 1, 0) :]
    result = {
        "trl": trl.__version__,
        "generation": f"vllm-colocate (sync: {args.vllm_sync})" if use_vllm else "transformers",
        "is_correction_pass": use_vllm and not args.no_is_correction,
        "policy_dtype": policy_dtype,
        "engine_dtype": engine_dtype,
        "torch_threads": torch.get_num_threads(),
        "steps_measured": len(measured),
        "step_s": round(statistics.median(measured), 4),
        "period_s": round(statistics.median(periods), 4) if periods else None,
        **{
            f"{phase}_s": round(statistics.median(p[phase] for p in timer.phases[args.warmup :]), 4)
            for phase in ("gen", "sync", "reward", "rest")
        },
        "step_s_all": [round(s, 4) for s in timer.steps],
        "completion_length_mean": (
            round(statistics.median(timer.lengths[args.warmup :]), 1) if timer.lengths else None
        ),
        "reward_mean": (
            round(statistics.mean(timer.rewards[args.warmup :]), 3) if timer.rewards else None
        ),
    }
    print(f"median step {result['step_s']:.4f} s over {len(measured)} steps", flush=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
