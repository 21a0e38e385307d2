"""PPO with a critic end to end on one CPU worker and the tiny model: the critic's warm-up, the
adaptive KL penalty in the reward, the critic's phases in the memory ledger, and an exact
resume of actor, critic and KL controller.

One 3-step run checkpoints after every step and exports both models; in test-full its last
checkpoint is then removed and the run resumed from step 2: step 3 must repeat exactly (every
metric but wall times and memory).
"""

from __future__ import annotations

import itertools
import shutil
from pathlib import Path

import pytest
import torch

from hybrid.memory.records import STEP_PHASES, read_records, step_phases
from hybrid.trainer.checkpoints import checkpoint_dir, critic_checkpoint_dir
from hybrid.trainer.loop import CRITIC_EXPORT_DIR, Driver
from profiling.memory_analysis import load_config, planner_prediction
from tests.integration.trainer.helpers import (
    ONE_WORKER,
    UNREPEATABLE,
    make_config,
    read_metrics,
    write_assets,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

PPO = (
    "algorithm.adv_estimator=gae",
    "algorithm.gamma=0.99",
    "algorithm.lam=0.95",
    "algorithm.use_kl_in_reward=true",
    "algorithm.kl_ctrl.type=adaptive",
    "algorithm.kl_ctrl.kl_coef=0.01",
    "algorithm.kl_ctrl.target_kl=0.0001",
    "algorithm.kl_ctrl.horizon=100",
    "actor.use_kl_loss=false",
    "critic.micro_batch_size=4",
    # fp32 on every machine: the KL of equal weights is then rounding-level (checked below)
    "actor.precision.param_dtype=float32",
    "ref.precision.param_dtype=float32",
    "critic.precision.param_dtype=float32",
    "trainer.critic_warmup=1",
    "trainer.save_freq=1",
)
CRITIC_METRICS = (
    "critic/vf_loss", "critic/vf_clipfrac", "critic/vf_explained_var", "critic/values/mean",
    "critic/returns/mean", "critic/kl", "critic/kl_coeff", "critic/grad_norm",
    "timing_s/values", "timing_s/update_critic",
)  # fmt: skip


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_assets(tmp_path_factory.mktemp("ppo"))


@pytest.fixture(scope="module")
def ppo_run(
    ray_cluster: None, assets: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, list[dict]]:
    """3 PPO steps, a checkpoint after each, the actor and the critic exported."""
    out = tmp_path_factory.mktemp("ppo_run") / "run"
    overrides = ("trainer.total_steps=3", "trainer.export_hf=true", *PPO, *ONE_WORKER)
    Driver(make_config(assets, out, *overrides)).fit()
    return out, read_metrics(out)


def test_ppo_warms_the_critic_up_and_exports_both_models(ppo_run: tuple[Path, list[dict]]) -> None:
    out, straight = ppo_run
    assert [m["step"] for m in straight] == [1, 2, 3]
    for m in straight:
        for key in CRITIC_METRICS:
            assert key in m, (m["step"], key)
    # Warm-up: step 1 trains only the critic; the actor from step 2 on.
    assert "actor/pg_loss" not in straight[0] and straight[0]["timing_s/update_actor"] < 0.05
    assert all("actor/pg_loss" in m for m in straight[1:])
    # The adaptive controller: each step's coefficient follows from the previous step's
    # measured KL (the error clipped to +-0.2, scaled by the 16 rows over the horizon 100).
    assert straight[0]["critic/kl_coeff"] == pytest.approx(0.01)
    for before, after in itertools.pairwise(straight):
        error = min(max(before["critic/kl"] / 0.0001 - 1, -0.2), 0.2)
        expected = before["critic/kl_coeff"] * (1 + error * 16 / 100)
        assert after["critic/kl_coeff"] == pytest.approx(expected, rel=1e-9)
    # Until the actor's first update (step 2) it is the reference; then the KL moves off 0.
    # (fp32 passes of equal weights, packed differently: rounding-level KL)
    assert abs(straight[0]["critic/kl"]) < 1e-5 and abs(straight[1]["critic/kl"]) < 1e-5
    assert abs(straight[2]["critic/kl"]) > 1e-3  # measured 6e-3
    # The ledger records every step phase, the critic's included, in the planner's order
    # (step 2, rank 0), and the planner predicts each of them for this run's config.
    records = list(read_records(out / "memory.jsonl"))
    assert "init/critic" in {r.phase for r in records}
    step_two = [r.phase for r in records if r.step == 2 and r.rank == 0]
    assert [p for p in dict.fromkeys(step_two) if p in STEP_PHASES] == list(step_phases(True))
    config = load_config(out)
    prediction = planner_prediction(config, config.model.path, 8.0)
    assert list(prediction.peak_gib) == list(step_phases(critic=True))

    # The export: the actor as a causal LM, the critic as a value model that transformers'
    # token-classification class loads whole, one value per token.
    from transformers import AutoModelForTokenClassification

    critic, info = AutoModelForTokenClassification.from_pretrained(
        out / CRITIC_EXPORT_DIR, output_loading_info=True
    )
    assert critic.config.num_labels == 1 and not info["missing_keys"], info
    assert not info["unexpected_keys"], info
    ids = torch.tensor([[1, 2, 3, 4]])
    values = critic(input_ids=ids).logits
    assert values.shape == (1, 4, 1) and torch.isfinite(values).all()
    assert (out / "hf_model" / "model.safetensors").is_file()


@pytest.mark.full  # by default a run resumes in test_sft.py (and test_fsdp.py bit for bit)
def test_a_ppo_run_resumes_exactly(
    assets: Path, ppo_run: tuple[Path, list[dict]], tmp_path: Path
) -> None:
    """Actor, critic and KL controller resume from step 2: step 3 repeats exactly."""
    first, straight = ppo_run
    out = tmp_path / "run"
    shutil.copytree(first, out)
    shutil.rmtree(checkpoint_dir(out, 3))
    shutil.rmtree(critic_checkpoint_dir(out, 3))
    overrides = ("trainer.total_steps=3", "trainer.export_hf=false", *PPO, *ONE_WORKER)
    Driver(make_config(assets, out, *overrides)).fit()
    resumed = read_metrics(out)
    # The first run's step 3 row left metrics.jsonl with its checkpoint: each step once.
    assert [m["step"] for m in resumed] == [1, 2, 3]
    expected, again = straight[2], resumed[2]
    repeatable = [key for key in expected if not key.startswith(UNREPEATABLE)]
    assert {"critic/vf_loss", "critic/kl_coeff", "actor/pg_loss"} <= set(repeatable)
    for key in repeatable:
        assert again[key] == expected[key], key
