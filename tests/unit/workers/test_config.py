"""Unit tests for `hybrid.workers.config`: ModelConfig / ActorConfig / RefConfig / CriticConfig
validation (errors name the field as the user writes it, a group's field with its owner's
dotted name) and the trainer's derived WorkerSpec."""

import dataclasses
from typing import Any

import pytest

from hybrid.model_groups import ForwardPrecisionConfig, PrecisionConfig
from hybrid.rollout.config import RolloutConfig
from hybrid.sharding.config import SyncConfig
from hybrid.workers.config import (
    ActorConfig,
    CriticConfig,
    CriticOptimConfig,
    HybridWorkerConfig,
    ModelConfig,
    OptimConfig,
    RefConfig,
    WorkerSpec,
)

pytestmark = pytest.mark.unit


def test_model_config_defaults_and_allowed_attention() -> None:
    assert ModelConfig(path="m").attn_implementation == "auto"
    for impl in ("auto", "sdpa", "eager", "flash_attention_2"):
        assert ModelConfig(path="m", attn_implementation=impl).attn_implementation == impl


def test_model_config_rejects_unknown_attention_naming_the_field() -> None:
    with pytest.raises(ValueError, match=r"model\.attn_implementation must be .*got 'flash'"):
        ModelConfig(path="m", attn_implementation="flash")  # type: ignore[arg-type]


def test_actor_config_defaults_are_valid() -> None:
    config = ActorConfig()
    assert (config.optim.lr, config.clip_ratio_low, config.micro_batch_size) == (1e-6, 0.2, 4)
    assert (CriticConfig().optim.lr, CriticConfig().optim.lr_warmup_steps) == (1e-5, 0)


@pytest.mark.parametrize("owner", ["actor", "critic"])
@pytest.mark.parametrize(
    ("field", "value"), [("lr", 0.0), ("lr", -1e-5), ("eps", 0.0), ("max_grad_norm", 0.0)]
)
def test_an_optimizer_value_names_its_owner_and_group(owner: str, field: str, value: float) -> None:
    optim = {"actor": OptimConfig, "critic": CriticOptimConfig}[owner](**{field: value})
    config = {"actor": ActorConfig, "critic": CriticConfig}[owner]
    with pytest.raises(ValueError, match=rf"^{owner}\.optim\.{field} must be > 0, got {value}"):
        config(optim=optim)


@pytest.mark.parametrize("owner", ["actor", "critic"])
@pytest.mark.parametrize(
    ("optim", "message"),
    [
        ({"weight_decay": -0.1}, r"optim\.weight_decay must be >= 0"),
        ({"betas": (0.9, 1.0)}, r"optim\.betas\[1\] must be in \[0, 1\)"),
        ({"betas": (0.9, 0.99, 0.5)}, r"optim\.betas must be two numbers"),
    ],
)
def test_the_optimizer_checks_are_shared(owner: str, optim: dict[str, Any], message: str) -> None:
    config = {"actor": ActorConfig, "critic": CriticConfig}[owner]
    group = {"actor": OptimConfig, "critic": CriticOptimConfig}[owner]
    with pytest.raises(ValueError, match=rf"^{owner}\.{message}"):
        config(optim=group(**optim))


def test_the_critic_warm_up_is_an_optimizer_field() -> None:
    with pytest.raises(ValueError, match=r"critic\.optim\.lr_warmup_steps must be >= 0"):
        CriticConfig(optim=CriticOptimConfig(lr_warmup_steps=-1))


@pytest.mark.parametrize("config", [ActorConfig, RefConfig, CriticConfig])
def test_micro_batch_fields_are_flat_and_checked_once(config: type) -> None:
    owner = {ActorConfig: "actor", RefConfig: "ref", CriticConfig: "critic"}[config]
    with pytest.raises(ValueError, match=rf"^{owner}\.micro_batch_size must be > 0"):
        config(micro_batch_size=0)
    assert config.TOKEN_BUDGETS, "each role has token budgets"
    for budget in config.TOKEN_BUDGETS:
        with pytest.raises(ValueError, match=rf"^{owner}\.{budget} must be > 0, got 0"):
            config(**{budget: 0})
        assert config(use_dynamic_bsz=True, **{budget: 4096}).use_dynamic_bsz


def test_verl_micro_batch_names_stay_where_verl_users_type_them() -> None:
    actor_names = {f.name for f in dataclasses.fields(ActorConfig)}
    verl = {"use_dynamic_bsz", "ppo_max_token_len_per_gpu", "log_prob_max_token_len_per_gpu"}
    assert verl <= actor_names
    assert "forward_max_token_len_per_gpu" in {f.name for f in dataclasses.fields(CriticConfig)}
    assert RefConfig().micro_batch_size == 8  # the reference's own default (no backward)


# STYLE.md: choices are Literal[...] and invalid user input raises ValueError in __post_init__
# naming the field. Without the check a bad dtype name only fails later, inside a worker.
@pytest.mark.parametrize(
    ("config", "field"),
    [
        (ActorConfig, "actor.precision.param_dtype"),
        (ActorConfig, "actor.precision.reduce_dtype"),
        (ActorConfig, "actor.precision.master_dtype"),
        (CriticConfig, "critic.precision.master_dtype"),
        (RefConfig, "ref.precision.param_dtype"),
    ],
)
def test_unknown_dtype_names_the_field(config: type, field: str) -> None:
    group = ForwardPrecisionConfig if config is RefConfig else PrecisionConfig
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        config(precision=group(**{field.split(".")[2]: "fp16"}))


def test_negative_clip_ratio_names_the_field() -> None:
    # clamp(r, 1.2, 0.8) would silently replace every ratio by 0.8
    with pytest.raises(ValueError, match=r"actor\.clip_ratio_low"):
        ActorConfig(clip_ratio_low=-0.2)


def test_derived_values_are_no_user_fields() -> None:
    for config in (ActorConfig, CriticConfig):
        names = {f.name for f in dataclasses.fields(config)}
        assert not names & {"mini_batch_size", "decoupled_cap"}, config
    assert "derived" not in {f.name for f in dataclasses.fields(ActorConfig)}


@pytest.mark.parametrize("cap", [0.0, -1.0])
def test_the_spec_refuses_a_cap_that_is_not_positive(cap: float) -> None:
    assert WorkerSpec().decoupled_cap is None and not WorkerSpec().corrected
    assert WorkerSpec(decoupled_cap=2.0).corrected
    with pytest.raises(ValueError, match=rf"decoupled_cap must be > 0, got {cap}"):
        WorkerSpec(decoupled_cap=cap)
    with pytest.raises(ValueError, match=rf"mini_batch_rows must be > 0, got {int(cap)}"):
        WorkerSpec(mini_batch_rows=int(cap))


def test_the_spec_takes_at_most_one_correction() -> None:
    with pytest.raises(ValueError, match=r"tis_cap .*decoupled_cap .*at most one"):
        WorkerSpec(tis_cap=2.0, decoupled_cap=2.0)
    with pytest.raises(ValueError, match=r"icepop_cap \(2\.0\) and seq_mask_cap \(3\.0\)"):
        WorkerSpec(icepop_cap=2.0, seq_mask_cap=3.0)
    assert WorkerSpec(icepop_cap=2.0).corrected and WorkerSpec(seq_mask_cap=2.0).corrected
    with pytest.raises(ValueError, match=r"mismatch_cap must be > 0, got 0"):
        WorkerSpec(mismatch_cap=0)


def test_compute_dtypes_default_to_auto() -> None:
    assert (ActorConfig().precision.param_dtype, RefConfig().precision.param_dtype) == (
        "auto",
        "auto",
    )
    assert RolloutConfig().dtype == "auto"


def test_unknown_rollout_dtype_lists_the_allowed_values() -> None:
    with pytest.raises(
        ValueError,
        match=r"rollout\.dtype must be one of .*auto.*bfloat16.*float16.*float32.*float8",
    ):
        RolloutConfig(dtype="float8")  # type: ignore[arg-type]


def test_hybrid_worker_config_builds_default_members() -> None:
    config = HybridWorkerConfig(model=ModelConfig(path="m"))
    assert config.actor == ActorConfig()
    assert config.ref == RefConfig()
    assert config.rollout == RolloutConfig()
    assert config.sync == SyncConfig()
    assert config.derived == WorkerSpec()  # by hand: the whole local batch, no correction


def test_configs_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        ActorConfig().optim.lr = 1.0  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        ModelConfig(path="m").path = "n"  # type: ignore[misc]
