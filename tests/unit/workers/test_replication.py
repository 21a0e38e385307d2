"""actor.hsdp_replicas=0 (auto): every rank holds the whole model on a CPU where the training
state of all ranks is at most 1% of the host, plain FSDP otherwise (hybrid.workers.replication);
the memory planner resolves it as the workers do. Which replicated models stay plain modules
(hybrid.workers.replicated)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from hybrid.memory.model_shape import model_shape
from hybrid.memory.records import GIB
from hybrid.planner.plan import plan_memory
from hybrid.workers.config import ActorConfig
from hybrid.workers.replicated import replicated_plainly
from hybrid.workers.replication import (
    AUTO_REPLICATE_SHARE,
    resolve_hsdp_replicas,
    trainer_replicas,
    training_state_bytes,
)
from profiling.plan import compose_config

pytestmark = pytest.mark.unit

HOST = 24 * GIB


def resolve(asked: int = 0, **kw: object) -> int:
    args: dict = {"world": 4, "on_cpu": True, "state_bytes": 1_000, "device_bytes": HOST}
    args["dense_full"] = True
    return resolve_hsdp_replicas(asked, **{**args, **kw})


def test_auto_replicates_only_a_small_dense_model_on_a_cpu() -> None:
    assert resolve() == 4
    limit = int(AUTO_REPLICATE_SHARE * HOST) // 4  # every rank's state together at the share
    assert resolve(state_bytes=limit) == 4
    assert resolve(state_bytes=limit + 1) == 1
    assert resolve(on_cpu=False) == 1  # GPUs: plain FSDP, as verl and TRL run
    assert resolve(dense_full=False) == 1
    assert resolve(world=1) == 1


def test_a_number_is_taken_as_asked() -> None:
    assert resolve(2) == 2
    assert resolve(1) == 1
    assert resolve(3, on_cpu=False, state_bytes=10 * HOST) == 3


def test_the_state_counts_weights_gradients_and_both_moments() -> None:
    assert training_state_bytes(1_000, 4) == 16_000
    assert training_state_bytes(1_000, 2) == 8_000


@pytest.mark.parametrize(
    ("preset", "lora", "sp", "replicas"),
    [
        ("tiny", False, 1, 2),
        ("bench-100m", False, 1, 1),  # 1.6 GB of fp32 state a rank: shard
        ("Qwen2.5-1.5B", False, 1, 1),
        ("tiny", True, 1, 1),  # LoRA, MoE and sequence parallelism keep plain FSDP
        ("tiny-moe", False, 1, 1),
        ("tiny", False, 2, 1),
    ],
)
def test_the_presets_on_a_24_gib_host(preset: str, lora: bool, sp: int, replicas: int) -> None:
    actor = ActorConfig(sp_size=sp)
    shape = model_shape(preset)
    found = trainer_replicas(actor, shape, lora=lora, world=2, on_cpu=True, device_bytes=HOST)
    assert found == replicas


def test_the_planner_plans_what_auto_picks() -> None:
    tiny = model_shape("tiny")
    auto = compose_config("config", ["trainer.num_workers=2"])
    assert auto.actor.hsdp_replicas == 0
    replicated = dataclasses.replace(auto, actor=dataclasses.replace(auto.actor, hsdp_replicas=2))
    sharded = dataclasses.replace(auto, actor=dataclasses.replace(auto.actor, hsdp_replicas=1))
    plans = {name: plan_memory(c, tiny, 8.0, host_memory_gib=24.0) for name, c in
             (("auto", auto), ("replicated", replicated), ("sharded", sharded))}  # fmt: skip
    assert plans["auto"].phases == plans["replicated"].phases
    assert plans["auto"].phases != plans["sharded"].phases


def test_only_a_whole_model_on_every_rank_in_its_master_dtype_stays_a_plain_module() -> None:
    fp32, bf16 = torch.float32, torch.bfloat16
    kw: dict = {"param_dtype": fp32, "master_dtype": fp32, "lora": False, "experts": False}
    assert replicated_plainly((2, 1), sp_size=1, **kw)
    assert replicated_plainly((8, 1), sp_size=1, **kw)
    assert not replicated_plainly((2,), sp_size=1, **kw)  # FSDP over the ranks
    assert not replicated_plainly((1, 2), sp_size=1, **kw)  # HSDP with shards
    assert not replicated_plainly((2, 2), sp_size=1, **kw)
    assert not replicated_plainly((1, 1), sp_size=1, **kw)  # one rank: FSDP2 as before
    assert not replicated_plainly((2, 1), sp_size=2, **kw)
    assert not replicated_plainly((2, 1), sp_size=1, **{**kw, "param_dtype": bf16})
    assert not replicated_plainly((2, 1), sp_size=1, **{**kw, "lora": True})
    assert not replicated_plainly((2, 1), sp_size=1, **{**kw, "experts": True})
