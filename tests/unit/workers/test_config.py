"""Unit tests for `hybrid.workers.config`: ModelConfig / ActorConfig / RefConfig validation
(errors name the field as the user writes it)."""

import dataclasses

import pytest

from hybrid.rollout.config import RolloutConfig
from hybrid.sharding.config import SyncConfig
from hybrid.workers.config import (
    ActorConfig,
    HybridWorkerConfig,
    ModelConfig,
    RefConfig,
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
    assert (config.lr, config.clip_ratio_low, config.micro_batch_size) == (1e-6, 0.2, 4)


@pytest.mark.parametrize(
    ("field", "value"),
    [("lr", 0.0), ("lr", -1e-5), ("max_grad_norm", 0.0), ("micro_batch_size", 0)],
)
def test_actor_config_non_positive_values_name_the_field(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=rf"actor\.{field} must be > 0, got {value}"):
        ActorConfig(**{field: value})


# STYLE.md: choices are Literal[...] and invalid user input raises ValueError in __post_init__
# naming the field. Without the check a bad dtype name only fails later, inside a worker.
@pytest.mark.parametrize(
    ("config", "field"),
    [
        (ActorConfig, "actor.param_dtype"),
        (ActorConfig, "actor.reduce_dtype"),
        (ActorConfig, "actor.master_dtype"),
        (RefConfig, "ref.param_dtype"),
    ],
)
def test_unknown_dtype_names_the_field(config: type, field: str) -> None:
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        config(**{field.split(".")[1]: "fp16"})


def test_ref_micro_batch_size_must_be_positive() -> None:
    # ActorConfig checks its micro_batch_size; RefConfig has no check, so 0 only fails in the
    # reference worker as range()'s "arg 3 must not be zero".
    with pytest.raises(ValueError, match=r"ref\.micro_batch_size must be > 0"):
        RefConfig(micro_batch_size=0)


def test_negative_clip_ratio_names_the_field() -> None:
    # clamp(r, 1.2, 0.8) would silently replace every ratio by 0.8
    with pytest.raises(ValueError, match=r"actor\.clip_ratio_low"):
        ActorConfig(clip_ratio_low=-0.2)


@pytest.mark.parametrize("cap", [0.0, -1.0])
def test_decoupled_cap_must_be_positive(cap: float) -> None:
    assert ActorConfig().decoupled_cap is None
    assert ActorConfig(decoupled_cap=2.0).decoupled_cap == 2.0
    with pytest.raises(ValueError, match=rf"actor\.decoupled_cap must be > 0, got {cap}"):
        ActorConfig(decoupled_cap=cap)


def test_decoupled_cap_and_tis_cap_exclude_each_other() -> None:
    with pytest.raises(ValueError, match=r"actor\.tis_cap .*actor\.decoupled_cap"):
        ActorConfig(tis_cap=2.0, decoupled_cap=2.0)


def test_compute_dtypes_default_to_auto() -> None:
    assert (ActorConfig().param_dtype, RefConfig().param_dtype) == ("auto", "auto")
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


def test_configs_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        ActorConfig().lr = 1.0  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        ModelConfig(path="m").path = "n"  # type: ignore[misc]
