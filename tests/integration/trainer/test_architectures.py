"""One GRPO step on 2 CPU workers for every architecture family the tiny-model builder makes
(Llama, Qwen2 tied and untied, Qwen3, Mistral), with full fine-tuning and with LoRA: the step
finishes with a finite loss, and after the sync the engine's log-probs match the actor's.

The engine dtype is `auto` (bf16 on AVX-512 CPUs: vLLM packs linears in bf16, and the direct
sync stages and repacks them); the `fp16-direct` cases run the engine in float16 with
`sync.strategy=direct`, the copy into vLLM's plain storage, on one tied and one untied family. The engines start from dummy weights, so the
first sync must fill every tensor; the checkpoints get random biases and norm scales (the
builder's are 0 and 1, which a missed tensor's dummy values would come too close to).

Runtime: every case starts its own 2-worker group (Ray actors, FSDP2, vLLM), ~20-30 s each on
2 cores, so the whole file is `full` (`make test-full`). The default tier keeps each family's
layout covered without an end-to-end run: the tiny models of every family load in transformers
(tests/unit/models), vLLM's names for them are mapped from the engine model itself
(hybrid/rollout/vllm_loader.py), the default model's runs cover the sync and LoRA end to end
(test_grpo_e2e.py, test_lora_grpo.py), and the direct sync runs on both layouts in
test_direct_load.py.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from hybrid.models import Architecture, TinyModelConfig, build_tiny_model
from hybrid.models.tiny import WEIGHTS_NAME
from hybrid.trainer.loop import Driver
from tests.integration.trainer.helpers import make_config, read_metrics, write_assets

pytestmark = [pytest.mark.integration, pytest.mark.full, pytest.mark.timeout(600)]

# The e2e tests' bound: bf16 (or fp16) forwards on both sides, different kernels; these cases
# measured 0.0017-0.0043 on CPU.
LOGPROB_TOLERANCE = 0.05

# name -> (architecture, tied LM head)
MODELS: dict[str, tuple[Architecture, bool]] = {
    "llama": ("llama", False),
    "qwen2_tied": ("qwen2", True),
    "qwen2_untied": ("qwen2", False),
    "qwen3": ("qwen3", True),
    "mistral": ("mistral", False),
}
FINETUNING = {"full": (), "lora": ("model.lora.rank=8",)}
SYNC = {"auto": (), "fp16-direct": ("rollout.dtype=float16", "sync.strategy=direct")}
DIRECT_MODELS = ("qwen2_untied", "qwen3")
CASES = [
    pytest.param(model, finetuning, sync, id=f"{model}-{finetuning}-{sync}")
    for model in MODELS
    for sync in SYNC
    for finetuning in FINETUNING
    if sync == "auto" or model in DIRECT_MODELS
]


def _perturb_biases_and_norms(model_dir: Path, seed: int = 0) -> None:
    """Random q/k/v biases (std 0.2) and norm scales (1 +- 0.2) in the checkpoint."""
    generator = torch.Generator().manual_seed(seed)
    path = model_dir / WEIGHTS_NAME
    state = load_file(path)
    for name in sorted(state):
        tensor = state[name]
        if name.endswith((".bias", "norm.weight")):
            noise = torch.randn(tensor.shape, generator=generator) * 0.2
            base = 1.0 if name.endswith("norm.weight") else 0.0
            state[name] = (base + noise).to(tensor.dtype)
    save_file(state, path, metadata={"format": "pt"})


@pytest.fixture(scope="module")
def prompts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The arithmetic prompts (and the default tiny Qwen2, replaced per model below)."""
    return write_assets(tmp_path_factory.mktemp("architectures"))


@pytest.fixture(scope="module")
def model_assets(prompts: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Per model name: an assets directory with that model and links to the prompt files."""
    assets = {}
    for name, (architecture, tied) in MODELS.items():
        root = tmp_path_factory.mktemp(name)
        config = TinyModelConfig.preset(
            "tiny", architecture=architecture, tie_word_embeddings=tied, vocab="arithmetic"
        )
        _perturb_biases_and_norms(build_tiny_model(root / "model", config, seed=0))
        for split in ("train.jsonl", "test.jsonl"):
            (root / split).symlink_to(prompts / split)
        assets[name] = root
    return assets


@pytest.mark.parametrize(("model", "finetuning", "sync"), CASES)
def test_one_grpo_step(
    ray_cluster: None,
    model_assets: dict[str, Path],
    tmp_path: Path,
    model: str,
    finetuning: str,
    sync: str,
) -> None:
    out = tmp_path / "run"
    config = make_config(
        model_assets[model],
        out,
        "trainer.total_steps=1",
        "trainer.export_hf=false",
        # One worker: a family's risk is its names, tying and layout; cross-rank behaviour
        # is the main end-to-end run's (test_grpo_e2e.py), so one engine start suffices.
        "trainer.num_workers=1",
        "data.train_batch_size=2",
        "algorithm.ppo_mini_batch_size=2",
        "rollout.n=2",
        "rollout.response_length=4",
        *FINETUNING[finetuning],
        *SYNC[sync],
    )
    start = time.perf_counter()
    trainer = Driver(config)
    trainer.fit()
    elapsed = time.perf_counter() - start
    facts = trainer.worker_facts
    if sync == "fp16-direct":
        assert (facts["rollout_dtype"], facts["sync_strategy"]) == ("float16", "direct"), facts
    metrics = read_metrics(out)
    assert [m["step"] for m in metrics] == [1]
    row = metrics[0]
    for key in ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/grad_norm"):
        assert math.isfinite(row[key]), (key, row[key])
    diff = row["rollout/logprob_diff_max"]
    print(
        f"{model} {finetuning} {sync} ({facts['rollout_dtype']}, {facts['sync_strategy']}): "
        f"rollout/logprob_diff_max {diff:.5f} ({elapsed:.1f}s)"
    )
    assert 0.0 <= diff < LOGPROB_TOLERANCE
