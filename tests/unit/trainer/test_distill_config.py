"""The `distill` group: off without a teacher, its weights checked and refused without one (each
error names the field), the teacher's directory checked with the run's paths, and the group
passed on to the workers."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from hybrid.models import TinyModelConfig, build_tiny_model
from hybrid.workers.config import DistillConfig
from tests.unit.trainer.test_config_reachable import compose_config, to_typed

pytestmark = pytest.mark.unit


def test_distillation_is_off_by_default() -> None:
    config = to_typed(compose_config())
    assert config.distill == DistillConfig()
    assert not config.distill.enabled
    assert not config.worker_config().distill.enabled


def test_the_group_reaches_the_workers() -> None:
    config = to_typed(
        compose_config(
            overrides=(
                "distill.teacher_path=some/teacher",
                "distill.coef=0.5",
                "distill.reward_coef=2.0",
                "distill.micro_batch_size=2",
            )
        )
    )
    distill = config.worker_config().distill
    assert distill.enabled and distill.teacher_path == "some/teacher"
    assert (distill.coef, distill.reward_coef, distill.micro_batch_size) == (0.5, 2.0, 2)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"teacher_path": "t", "coef": -1.0},
            r"distill\.coef must be a finite number >= 0, got -1",
        ),
        ({"teacher_path": "t", "coef": math.nan}, r"distill\.coef must be a finite number >= 0"),
        ({"teacher_path": "t", "reward_coef": -0.5}, r"distill\.reward_coef must be a finite"),
        ({"teacher_path": "t", "reward_coef": math.inf}, r"distill\.reward_coef must be a finite"),
        ({"teacher_path": "t", "coef": 0.0}, r"distill\.coef and distill\.reward_coef are both 0"),
        ({"teacher_path": " "}, r"distill\.teacher_path is empty"),
        ({"coef": 2.0}, r"distill\.teacher_path is null .* but distill\.coef is set"),
        ({"reward_coef": 1.0}, r"distill\.teacher_path is null .* but distill\.reward_coef is set"),
        ({"teacher_path": "t", "micro_batch_size": 0}, r"distill\.micro_batch_size must be > 0"),
        (
            {"teacher_path": "t", "log_prob_max_token_len_per_gpu": 0},
            r"distill\.log_prob_max_token_len_per_gpu must be > 0",
        ),
    ],
)
def test_bad_values_name_the_field(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DistillConfig(**fields)


def test_a_bad_dtype_names_the_whole_path() -> None:
    with pytest.raises(ValueError, match=r"distill\.precision\.param_dtype must be one of"):
        to_typed(compose_config(overrides=("distill.precision.param_dtype=fp8",)))


def test_coef_zero_with_the_task_reward_only_logs_the_distance() -> None:
    # Allowed: the teacher's reverse KL is reported, the advantage is the task's.
    assert DistillConfig(teacher_path="t", coef=0.0, reward_coef=1.0).enabled


def test_check_paths_names_a_missing_teacher(tmp_path: Path) -> None:
    model = build_tiny_model(tmp_path / "model", TinyModelConfig.preset("tiny"))
    missing = tmp_path / "no_teacher"
    base = (f"model.path={model}", "data.train_files=[]", "data.val_files=[]")
    config = to_typed(compose_config(overrides=(*base, f"distill.teacher_path={missing}")))
    with pytest.raises(ValueError, match=rf"distill\.teacher_path: {missing} does not exist"):
        config.check_paths()
    (tmp_path / "empty").mkdir()
    config = to_typed(
        compose_config(overrides=(*base, f"distill.teacher_path={tmp_path / 'empty'}"))
    )
    with pytest.raises(ValueError, match=r"distill\.teacher_path: .* has no config\.json"):
        config.check_paths()
    to_typed(compose_config(overrides=(*base, f"distill.teacher_path={model}"))).check_paths()
