"""SFT then GRPO in one config, in-process (`Driver(config).fit()` on the session's Ray
cluster) with real Ray and FSDP2 workers: the SFT stage lifts the validation before the first RL
step, the RL stage starts from the SFT weights with a fresh optimizer, and a run resumes across
the stage boundary (docs/sft.md, "Resume").

By default the boundary's resume runs on the deterministic toy engine (rollout.engine=toy, whose
generation uses the synced weights); a resume inside the SFT stage, the real engine's run
(vLLM), the split placement's run and LoRA are in the full tier.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from hybrid.data.arithmetic_task import write_arithmetic_sft
from hybrid.sharding.lora_files import ADAPTER_WEIGHTS
from hybrid.trainer.checkpoints import checkpoint_dir
from hybrid.trainer.loop import Driver
from hybrid.trainer.sft_stage import sft_dir
from hybrid.workers.lora import LORA_ADAPTER_DIR
from tests.integration.trainer.helpers import (
    ONE_WORKER,
    UNREPEATABLE,
    read_metrics,
    small_config,
    write_assets,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

SFT_STEPS = 20


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = write_assets(tmp_path_factory.mktemp("sft"))
    write_arithmetic_sft(root, num_rows=200)
    return root


def sft_overrides(assets: Path, *extra: str) -> tuple[str, ...]:
    """SFT on the arithmetic rows, validation on the test prompts before RL."""
    return (
        f"sft.train_files=[{assets / 'sft.parquet'}]",
        f"sft.total_steps={SFT_STEPS}",
        "sft.batch_size=32",
        "sft.max_length=16",
        "sft.lr=1e-3",
        "actor.optim.lr_warmup_steps=2",  # RL's warm-up starts after SFT: lr / 2, then lr
        f"data.val_files=[{assets / 'test.jsonl'}]",
        "trainer.val_before_train=true",
        *extra,
    )


def read_sft_metrics(out: Path) -> list[dict[str, Any]]:
    lines = (sft_dir(out) / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def repeatable(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if not k.startswith(UNREPEATABLE)}


def hf_weights(out: Path) -> dict[str, torch.Tensor]:
    return load_file(str(out / "hf_model" / "model.safetensors"))


def test_rl_starts_from_the_sft_weights_and_resumes_across_the_boundary(
    ray_cluster: None, assets: Path, tmp_path: Path
) -> None:
    toy = ("rollout.engine=toy", *ONE_WORKER)
    # One run: SFT, then one RL step.
    whole = tmp_path / "whole"
    Driver(small_config(assets, whole, *toy, "trainer.total_steps=1", *sft_overrides(assets))).fit()
    sft_rows = read_sft_metrics(whole)
    assert [row["step"] for row in sft_rows] == list(range(1, SFT_STEPS + 1))
    assert sft_rows[-1]["sft/loss"] < sft_rows[0]["sft/loss"]
    assert all(row["sft/lr"] == 1e-3 and row["sft/tokens"] == 64 for row in sft_rows)
    assert (checkpoint_dir(sft_dir(whole), SFT_STEPS) / "manifest.json").is_file()
    rl_rows = read_metrics(whole)
    assert [row["step"] for row in rl_rows] == [0, 1]
    # The validation before RL sees the SFT weights: the base model answers none of the 8
    # prompts (0.0, test_sft_lifts_the_first_validation_on_vllm), the SFT model 3 or more. How
    # many more depends on the CPU's dtype (3 in float32 on an AVX2-only CPU, 4-5 in bf16).
    assert rl_rows[0]["val/reward_mean"] >= 0.25
    # The small config's actor.optim.lr back after SFT, its warm-up from the start: step 1 of 2.
    assert rl_rows[1]["actor/lr"] == 5e-4
    # The reference became the SFT model: the first update's KL (before its optimizer step, on
    # the same weights) is nil, where the model before SFT would be far from it.
    assert (sft_dir(whole) / "hf_model" / "config.json").is_file()
    assert rl_rows[1]["actor/kl_loss"] < 1e-3, rl_rows[1]["actor/kl_loss"]

    # Killed after the SFT stage: an SFT-only run, then the RL run in the same directory.
    staged = tmp_path / "staged"
    only = (*toy, "trainer.total_steps=0", "trainer.export_hf=true")
    Driver(small_config(assets, staged, *only, *sft_overrides(assets))).fit()
    assert not (staged / "metrics.jsonl").exists()
    sft_weights = hf_weights(staged)
    base = load_file(str(assets / "model" / "model.safetensors"))
    assert any(not torch.equal(sft_weights[k], base[k].to(sft_weights[k].dtype)) for k in base)
    Driver(
        small_config(assets, staged, *toy, "trainer.total_steps=1", *sft_overrides(assets))
    ).fit()
    assert [repeatable(r) for r in read_sft_metrics(staged)] == [repeatable(r) for r in sft_rows]
    # RL from the loaded SFT weights with a fresh optimizer is the one-run RL step, bit for bit.
    assert [repeatable(r) for r in read_metrics(staged)] == [repeatable(r) for r in rl_rows]


@pytest.mark.full  # the default tier's budget: the boundary above is the one RL depends on
def test_rl_checkpoints_make_a_later_run_skip_the_stage(
    ray_cluster: None, assets: Path, tmp_path: Path
) -> None:
    toy = ("rollout.engine=toy",)
    steps = lambda n: (*toy, f"trainer.total_steps={n}", *sft_overrides(assets))  # noqa: E731
    Driver(small_config(assets, tmp_path / "straight", *steps(2))).fit()
    resumed = tmp_path / "resumed"
    Driver(small_config(assets, resumed, *steps(1))).fit()
    sft_rows = read_sft_metrics(resumed)
    # More RL steps in the same directory: RL checkpoints exist, so SFT is skipped, and the
    # reference reloads the SFT model from output_dir/sft/hf_model.
    Driver(small_config(assets, resumed, *steps(2))).fit()
    assert read_sft_metrics(resumed) == sft_rows
    rows = read_metrics(resumed)
    assert [row["step"] for row in rows] == [0, 1, 2]
    # Step 2 as the uninterrupted run took it, its KL to the reference included (a reference
    # left at the model before SFT would give another KL).
    straight = read_metrics(tmp_path / "straight")
    assert repeatable(rows[2]) == repeatable(straight[2])


@pytest.mark.full  # the default tier's budget: the boundary above is the one RL depends on
def test_a_partial_sft_stage_continues_where_it_stopped(
    ray_cluster: None, assets: Path, tmp_path: Path
) -> None:
    toy = ("rollout.engine=toy", "trainer.total_steps=0")
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    Driver(small_config(assets, whole, *toy, *sft_overrides(assets))).fit()
    # The first half (its last step saved), then the whole stage asked for in the same directory.
    half = (*toy, *sft_overrides(assets), f"sft.total_steps={SFT_STEPS // 2}")
    Driver(small_config(assets, parts, *half)).fit()
    Driver(small_config(assets, parts, *toy, *sft_overrides(assets))).fit()
    resumed = [repeatable(r) for r in read_sft_metrics(parts)]
    assert resumed == [repeatable(r) for r in read_sft_metrics(whole)]


@pytest.mark.full
def test_sft_lifts_the_first_validation_on_vllm(
    ray_cluster: None, assets: Path, tmp_path: Path
) -> None:
    """The acceptance on the real engine: the validation before RL, after SFT, beats the base
    model's (the same config without SFT)."""
    base_out, sft_out = tmp_path / "base", tmp_path / "sft"
    plain = sft_overrides(assets, "trainer.total_steps=1", "sft.train_files=[]")
    Driver(small_config(assets, base_out, *plain)).fit()
    with_sft = sft_overrides(assets, "trainer.total_steps=1", "sft.total_steps=30")
    Driver(small_config(assets, sft_out, *with_sft)).fit()
    base, tuned = read_metrics(base_out)[0], read_metrics(sft_out)[0]
    assert base["step"] == tuned["step"] == 0
    assert tuned["val/reward_mean"] >= base["val/reward_mean"] + 0.5, (base, tuned)


@pytest.mark.full
def test_split_explorers_start_from_the_sft_weights(
    ray_cluster: None, assets: Path, tmp_path: Path
) -> None:
    split = (
        "trainer.mode=split",
        "trainer.num_explorer_workers=1",
        "trainer.num_trainer_workers=1",
    )
    out = tmp_path / "split"
    config = small_config(
        assets, out, "rollout.engine=toy", "trainer.total_steps=2", *split, *sft_overrides(assets)
    )
    Driver(config).fit()
    assert len(read_sft_metrics(out)) == SFT_STEPS
    rows = read_metrics(out)
    # The starting version the explorer validates with is the SFT stage's (the base: 0.0; the
    # SFT model 3 of the 8 prompts or more, 3 in float32, the dtype the CPU picks for it).
    assert rows[0]["step"] == 0 and rows[0]["val/reward_mean"] >= 0.25
    assert [row["step"] for row in rows] == [0, 1, 2]


@pytest.mark.full
def test_lora_sft_trains_only_the_adapters(ray_cluster: None, assets: Path, tmp_path: Path) -> None:
    out = tmp_path / "lora"
    lora = ("model.lora.rank=8", "trainer.total_steps=0", "trainer.export_hf=true")
    config = small_config(assets, out, "rollout.engine=toy", *lora, *sft_overrides(assets))
    Driver(config).fit()
    rows = read_sft_metrics(out)
    assert rows[-1]["sft/loss"] < rows[0]["sft/loss"]
    adapter = load_file(str(out / LORA_ADAPTER_DIR / ADAPTER_WEIGHTS))
    # lora_B starts at zero: SFT moved it. The merged export is the base plus the adapters.
    assert any(bool(t.abs().sum() > 0) for name, t in adapter.items() if "lora_B" in name)
    merged, base = hf_weights(out), load_file(str(assets / "model" / "model.safetensors"))
    assert set(merged) == set(base)
    changed = {k for k in base if not torch.equal(merged[k], base[k].to(merged[k].dtype))}
    # Only the adapted linears (the *_proj layers) moved: embeddings and norms are frozen.
    assert changed and all(k.endswith("_proj.weight") for k in changed), changed
