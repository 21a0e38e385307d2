"""Bad input a new user meets first, named before any worker starts: a model directory without
the files a run loads, and a reward section out of range."""

from __future__ import annotations

from pathlib import Path

import pytest

from hybrid.rewards.config import RewardConfig
from hybrid.trainer.config_files import check_model_dir

pytestmark = pytest.mark.unit


def test_an_empty_model_directory_is_named(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    with pytest.raises(
        ValueError, match=r"model\.path: .*model has no config\.json.*holds nothing"
    ):
        check_model_dir("model.path", str(model))
    (model / "config.json").write_text("{}")
    with pytest.raises(ValueError, match=r"model\.path: .* has no tokenizer files"):
        check_model_dir("model.path", str(model))
    (model / "tokenizer.json").write_text("{}")
    check_model_dir("model.path", str(model))


def test_a_mixture_of_experts_without_an_adapter_is_named_before_any_worker(
    tmp_path: Path,
) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "tokenizer.json").write_text("{}")
    (model / "config.json").write_text('{"model_type": "mixtral", "num_local_experts": 8}')
    with pytest.raises(
        ValueError,
        match=r"model\.path \(.*config\.json\): model type 'mixtral' is a mixture of experts.*"
        r"qwen3_moe, qwen2_moe",
    ):
        check_model_dir("model.path", str(model))
    (model / "config.json").write_text('{"model_type": "qwen3_moe", "num_experts": 8}')
    check_model_dir("model.path", str(model))
    (model / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"model\.path: .*config\.json is not valid JSON"):
        check_model_dir("model.path", str(model))


def test_a_missing_local_path_is_named_and_a_hub_id_is_left_alone(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"critic\.model\.path: .*/nope does not exist"):
        check_model_dir("critic.model.path", str(tmp_path / "nope"))
    with pytest.raises(ValueError, match=r"model\.path: \./nope does not exist"):
        check_model_dir("model.path", "./nope")
    check_model_dir("model.path", "Qwen/Qwen2.5-0.5B-Instruct")  # transformers resolves it


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"timeout_s": 0}, r"reward\.timeout_s must be a positive number"),
        ({"timeout_s": float("nan")}, r"reward\.timeout_s must be a positive number"),
        ({"timeout_s": -5.0}, r"reward\.timeout_s must be a positive number"),
        ({"on_error": "ignore"}, r"reward\.on_error must be one of \['fail', 'score'\]"),
        ({"num_workers": -1}, r"reward\.num_workers must be >= 0"),
    ],
)
def test_reward_settings_out_of_range_name_the_field(fields: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RewardConfig(**fields)


@pytest.mark.parametrize(
    ("section", "field", "value"),
    [
        ("trainer", "stall_timeout_s", 0),
        ("trainer", "stall_timeout_s", -1.0),
        ("trainer", "stall_timeout_s", float("inf")),
        ("sync", "timeout_s", float("nan")),
    ],
)
def test_a_deadline_that_is_not_a_positive_number_is_named(
    section: str, field: str, value: float
) -> None:
    """Through the composed config, as `python -m hybrid.main <section>.<field>=...` reads it."""
    from hybrid.trainer.compose import compose, to_run_config

    cfg = compose("config", [f"{section}.{field}={value}"])
    with pytest.raises(ValueError, match=rf"{section}\.{field} must be a positive number"):
        to_run_config(cfg)
