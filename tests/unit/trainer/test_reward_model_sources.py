"""A data source without a rule reward is fine when the reward model alone scores it
(combine=replace for it), and still named before any worker starts otherwise."""

from __future__ import annotations

from pathlib import Path

import pytest

from hybrid.data import PromptDataset, write_rows
from hybrid.models import build_tokenizer
from hybrid.rewards.config import RewardModelConfig
from hybrid.trainer.loop import check_data_sources

pytestmark = pytest.mark.unit


@pytest.fixture
def chat_rows(tmp_path: Path) -> PromptDataset:
    rows = [
        {
            "prompt": [{"role": "user", "content": "1+2="}],
            "data_source": source,
            "reward_model": {"ground_truth": "3"},
        }
        for source in ("arithmetic", "chat")
    ]
    path = write_rows(rows, tmp_path / "rows.jsonl")
    return PromptDataset([path], build_tokenizer("arithmetic"), max_prompt_length=16)


def test_a_source_without_a_rule_needs_the_reward_model_alone(chat_rows: PromptDataset) -> None:
    with pytest.raises(ValueError, match=r"rows\.jsonl:1: data_source 'chat' has no built-in"):
        check_data_sources(chat_rows)
    summed = RewardModelConfig(path="/rm", combine="sum")
    with pytest.raises(ValueError, match=r"combine_by_source=\{chat: replace\}"):
        check_data_sources(chat_rows, scorers=[summed])
    check_data_sources(chat_rows, scorers=[RewardModelConfig(path="/rm", combine="replace")])
    by_source = RewardModelConfig(path="/rm", combine_by_source={"chat": "replace"})
    check_data_sources(chat_rows, None, scorers=[by_source])
