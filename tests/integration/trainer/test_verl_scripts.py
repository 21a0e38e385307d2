"""verl's own run scripts train here: three of them (GRPO, PPO with a critic, LoRA GRPO; their
overrides in tests/assets/verl_scripts/) run 3 steps on CPU with vLLM, in verl's names.

What the test swaps, by verl name and nothing else: the model and the data (the tiny model and
the arithmetic prompts), and the sizes of a 7B run on 8 GPUs for 2 CPU workers (batch, micro-
batch and length values, one engine per worker, 3 steps instead of 15 epochs). Every other
override is the script's, through the translation (hybrid/verl/).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from hybrid.main import build_config
from hybrid.trainer.compose import compose
from hybrid.trainer.loop import Driver
from hybrid.verl.resolve import apply
from hybrid.verl.translate import translate
from tests.integration.trainer.helpers import read_metrics, write_assets
from tests.unit.verl.test_translate import script_overrides

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

CPU_SIZES = {
    "data.train_batch_size": "4",
    "data.max_prompt_length": "16",
    "data.max_response_length": "4",
    "actor_rollout_ref.actor.ppo_mini_batch_size": "4",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": "2",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": "10",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": "10",
    "critic.ppo_micro_batch_size_per_gpu": "2",
    "actor_rollout_ref.rollout.tensor_model_parallel_size": "1",
    "actor_rollout_ref.actor.optim.lr": "1e-3",
    "trainer.n_gpus_per_node": "2",
    "trainer.test_freq": "3",
}
"""verl name -> the value for 2 CPU workers (the scripts' values size 8 GPUs)."""


def cpu_run(name: str, assets: Path, out: Path) -> list[str]:
    """The script's overrides, values swapped by name: the model, the data, the sizes."""
    swaps = {
        **CPU_SIZES,
        "actor_rollout_ref.model.path": str(assets / "model"),
        "critic.model.path": str(assets / "model"),
        "data.train_files": f"[{assets / 'train.jsonl'}]",
        "data.val_files": f"[{assets / 'test.jsonl'}]",
        "trainer.default_local_dir": str(out),
    }
    lines = []
    for line in script_overrides(name):
        key = line.split("=", 1)[0].lstrip("+")
        if key == "trainer.total_epochs":
            lines.append("trainer.total_training_steps=3")
        elif key in swaps:
            lines.append(f"{line.split('=', 1)[0]}={swaps.pop(key)}")
        else:
            lines.append(line)
    lines += [f"{key}={value}" for key, value in swaps.items() if key in CPU_SIZES]
    lines.append(f"trainer.default_local_dir={out}")
    return lines


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_assets(tmp_path_factory.mktemp("verl_scripts"))


def run_script(name: str, assets: Path, out: Path) -> list[dict]:
    translation = translate(cpu_run(name, assets, out))
    translation.check()
    cfg = compose("config", translation.overrides)
    apply(translation, cfg)
    config = build_config(cfg)
    assert config.trainer.total_steps == 3
    assert config.trainer.num_workers == 2 and not config.trainer.use_gpu
    Driver(config).fit()
    return read_metrics(out)


def check_trained(metrics: list[dict], keys: tuple[str, ...]) -> None:
    assert [m["step"] for m in metrics if m["step"] > 0] == [1, 2, 3]
    for m in metrics:
        if m["step"] == 0:
            continue
        for key in keys:
            assert math.isfinite(m[key]), (m["step"], key)
    assert any(key.startswith("val") for key in metrics[-1])  # test_freq=3: validated


def test_verl_grpo_script_trains(ray_cluster: None, assets: Path, tmp_path: Path) -> None:
    metrics = run_script("grpo_qwen2-7b", assets, tmp_path / "run")
    check_trained(metrics, ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm"))


@pytest.mark.full  # the default tier keeps the GRPO script; the unit tests translate all
def test_verl_ppo_critic_script_trains(ray_cluster: None, assets: Path, tmp_path: Path) -> None:
    metrics = run_script("ppo_gemma", assets, tmp_path / "run")
    check_trained(metrics, ("actor/pg_loss", "critic/vf_loss", "actor/grad_norm"))


@pytest.mark.full
def test_verl_lora_script_trains(ray_cluster: None, assets: Path, tmp_path: Path) -> None:
    metrics = run_script("grpo_lora_qwen2_5-3b", assets, tmp_path / "run")
    check_trained(metrics, ("actor/pg_loss", "actor/grad_norm"))
