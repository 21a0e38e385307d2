"""Unit tests for `hybrid.rollout.config.RolloutConfig` validation: errors name the fields."""

import dataclasses

import pytest

from hybrid.rollout.config import RolloutConfig

pytestmark = pytest.mark.unit


def test_defaults_are_valid() -> None:
    config = RolloutConfig()
    assert config.prompt_length + config.response_length <= config.max_model_len


def test_prompt_plus_response_may_fill_max_model_len_exactly() -> None:
    RolloutConfig(max_model_len=96, prompt_length=64, response_length=32)


def test_prompt_plus_response_over_max_model_len_names_all_three_fields() -> None:
    with pytest.raises(ValueError) as info:
        RolloutConfig(max_model_len=96, prompt_length=64, response_length=33)
    message = str(info.value)
    for field, value in [("prompt_length", 64), ("response_length", 33), ("max_model_len", 96)]:
        assert f"rollout.{field} ({value})" in message


@pytest.mark.parametrize(
    "field", ["tensor_parallel_size", "max_model_len", "prompt_length", "response_length"]
)
def test_non_positive_sizes_name_the_field(field: str) -> None:
    with pytest.raises(ValueError, match=rf"rollout\.{field} must be > 0, got 0"):
        RolloutConfig(**{field: 0})


def test_temperature_zero_is_greedy_and_negative_is_rejected() -> None:
    assert RolloutConfig(temperature=0.0).temperature == 0.0
    with pytest.raises(ValueError, match=r"rollout\.temperature must be >= 0, got -0\.1"):
        RolloutConfig(temperature=-0.1)


@pytest.mark.parametrize("top_p", [1e-3, 0.5, 1.0])
def test_top_p_in_range_is_accepted(top_p: float) -> None:
    assert RolloutConfig(top_p=top_p).top_p == top_p


@pytest.mark.parametrize("top_p", [0.0, -0.5, 1.01])
def test_top_p_out_of_range_names_the_field(top_p: float) -> None:
    with pytest.raises(ValueError, match=r"rollout\.top_p must be in \(0, 1\]"):
        RolloutConfig(top_p=top_p)


def test_unknown_load_format_names_the_field() -> None:
    # STYLE.md: Literal choices are validated in __post_init__; "safetensors" would otherwise
    # reach vLLM and, unlike "dummy", read the checkpoint from disk.
    with pytest.raises(ValueError, match=r"rollout\.load_format"):
        RolloutConfig(load_format="safetensors")  # type: ignore[arg-type]


def test_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        RolloutConfig().temperature = 0.5  # type: ignore[misc]


def test_engine_choices_and_an_unknown_engine_is_named() -> None:
    assert RolloutConfig().engine == "vllm"
    assert RolloutConfig(engine="toy").engine == "toy"
    with pytest.raises(ValueError, match=r"rollout\.engine must be one of \['vllm', 'toy'\]"):
        RolloutConfig(engine="sglang")  # type: ignore[arg-type]
