"""The cross-field rules (hybrid.trainer.config_rules): every rule runs on every config, so one
error names every problem, whatever the mode; a rule whose input another rule found invalid
skips its check rather than divide by it."""

from __future__ import annotations

import re
from typing import Any

import pytest

from hybrid.rollout.config import RolloutConfig
from hybrid.sharding.config import SyncConfig
from hybrid.trainer import config_rules
from hybrid.trainer.config import AlgorithmConfig, DataConfig, TrainerConfig, TrainerRunConfig
from hybrid.workers.config import ActorConfig, ModelConfig

pytestmark = pytest.mark.unit

PROMPT_TOO_LONG = r"data\.max_prompt_length \(128\) exceeds rollout\.prompt_length \(64\)"
TWO_CORRECTIONS = r"algorithm\.off_policy_correction=tis .* and actor\.tis_cap \(2\.0\)"
NO_CHECKPOINT_DIR = r"sync\.checkpoint_dir must be set for sync\.method=checkpoint"


def run_config(**groups: Any) -> TrainerRunConfig:
    groups.setdefault("rollout", RolloutConfig(n=2))
    return TrainerRunConfig(model=ModelConfig(path="m"), **groups)


def test_the_default_run_breaks_no_rule() -> None:
    config = run_config()
    assert {rule.__name__: rule(config) for rule in config_rules.RULES} == {
        rule.__name__: [] for rule in config_rules.RULES
    }


def test_one_problem_is_the_rule_message_alone() -> None:
    with pytest.raises(ValueError) as raised:
        run_config(data=DataConfig(max_prompt_length=128))
    assert str(raised.value) == ("data.max_prompt_length (128) exceeds rollout.prompt_length (64)")


def test_two_unrelated_problems_are_named_in_one_error() -> None:
    with pytest.raises(ValueError) as raised:
        run_config(
            data=DataConfig(max_prompt_length=128),
            algorithm=AlgorithmConfig(off_policy_correction="tis"),
            actor=ActorConfig(tis_cap=2.0),
        )
    lines = str(raised.value).splitlines()
    assert lines[0] == "2 problems with the config:"
    assert len(lines) == 3
    assert any(re.search(PROMPT_TOO_LONG, line) for line in lines[1:])
    assert any(re.search(TWO_CORRECTIONS, line) for line in lines[1:])


def test_a_split_run_is_checked_by_the_rules_after_its_own() -> None:
    # The split rules once ended in a `return` that skipped every check after them: a rule
    # listed after them must still name its problem for a split run.
    assert config_rules.RULES.index(config_rules.one_correction) > config_rules.RULES.index(
        config_rules.checkpoint_sync_dir
    )
    with pytest.raises(ValueError) as raised:
        run_config(
            trainer=TrainerConfig(mode="split"),
            sync=SyncConfig(method="checkpoint"),
            algorithm=AlgorithmConfig(off_policy_correction="tis"),
            actor=ActorConfig(tis_cap=2.0),
            data=DataConfig(max_prompt_length=128),
        )
    message = str(raised.value)
    assert message.startswith("3 problems with the config:")
    for problem in (NO_CHECKPOINT_DIR, TWO_CORRECTIONS, PROMPT_TOO_LONG):
        assert re.search(problem, message), problem


def test_a_split_run_skips_the_colocated_placement() -> None:
    # Three workers per node do not hold a tensor-parallel group of 2: a colocated rule. Split,
    # the explorers hold the engine and their own rule applies (2 explorers: fine).
    split = run_config(
        trainer=TrainerConfig(
            mode="split", num_workers=3, num_explorer_workers=2, num_trainer_workers=1
        ),
        rollout=RolloutConfig(n=2, tensor_parallel_size=2),
    )
    assert config_rules.colocated_placement(split) == []
    with pytest.raises(ValueError, match=r"must divide the workers per node \(3 = "):
        run_config(
            trainer=TrainerConfig(num_workers=3),
            rollout=RolloutConfig(n=2, tensor_parallel_size=2),
            data=DataConfig(train_batch_size=24),
            algorithm=AlgorithmConfig(ppo_mini_batch_size=6),
        )


def test_a_size_another_rule_refuses_is_not_divided_by() -> None:
    # sp 4 over 2 workers: no whole data-parallel slot (2 // 4 == 0). The mini-batch, SFT and
    # micro-batch rules skip rather than divide by 0; the sp rule names the cause.
    with pytest.raises(ValueError) as raised:
        run_config(actor=ActorConfig(sp_size=4))
    message = str(raised.value)
    assert "actor.sp_size (4) must divide trainer.num_workers (2)" in message
    assert "ppo_mini_batch_size" not in message and "micro_batch_size" not in message
