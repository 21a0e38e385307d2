"""The driver's start-up checks of an agent run (hybrid/trainer/agent_setup.py): each bad input
is one error naming its field, file or row, before any worker starts; a thinking template is
named and either followed (keep_sampled) or refused (error)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from hybrid.data import PromptDataset, write_rows
from hybrid.models.tokenizer import build_tokenizer
from hybrid.rollout.agent.config import AgentConfig
from hybrid.rollout.config import RolloutConfig
from hybrid.trainer.agent_setup import check_agent_rows, prepare_agent

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[3]
ADD_TOOL = """
TOOLS = [{"type": "function", "function": {"name": "add", "description": "a + b",
          "parameters": {"type": "object", "properties": {"a": {"type": "integer"},
          "b": {"type": "integer"}}, "required": ["a", "b"]}}}]

def add(a, b):
    return a + b
"""
QWEN3 = ROOT / "tests" / "assets" / "chat_templates" / "qwen3_0_6b.jinja"


def rollout(response_length: int = 64, **agent: object) -> RolloutConfig:
    settings = {"enabled": True, "builtin_tools": ["calculator"], **agent}
    return RolloutConfig(
        max_model_len=256,
        prompt_length=64,
        response_length=response_length,
        agent=AgentConfig(**settings),  # type: ignore[arg-type]
    )


def test_an_agent_run_is_ready_with_an_exact_template() -> None:
    setup = prepare_agent(rollout(), build_tokenizer("text"))
    assert setup is not None
    assert setup.metrics == {"agent/template_exact": 1.0}
    assert [s["function"]["name"] for s in setup.schemas] == ["calculator"]
    assert prepare_agent(RolloutConfig(), build_tokenizer("text")) is None


def test_budgets_that_cannot_hold_a_reply_and_a_turn_are_named() -> None:
    with pytest.raises(ValueError, match=r"rollout.response_length=8 cannot hold a turn"):
        prepare_agent(rollout(response_length=8), build_tokenizer("text"))


def test_a_thinking_template_is_named_and_the_rule_followed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    tokenizer = build_tokenizer("text", model_max_length=100_000)
    tokenizer.chat_template = QWEN3.read_text(encoding="utf-8")
    with caplog.at_level(logging.WARNING):
        setup = prepare_agent(rollout(), tokenizer)
    assert setup is not None and setup.metrics == {"agent/template_exact": 0.0}
    assert "a thinking template renders" in caplog.text and "keep_sampled" in caplog.text
    with pytest.raises(ValueError, match=r"template_mismatch=error refuses to start"):
        prepare_agent(rollout(template_mismatch="error"), tokenizer)


def test_a_row_with_an_unknown_tool_or_environment_is_named(tmp_path: Path) -> None:
    tokenizer = build_tokenizer("text")
    tools = tmp_path / "tools.py"
    tools.write_text(ADD_TOOL)
    setup = prepare_agent(rollout(tools_file=str(tools)), tokenizer)
    assert setup is not None
    rows = [
        {"prompt": [{"role": "user", "content": "hi"}], "data_source": "x",
         "reward_model": {"ground_truth": "1"}, "extra_info": extra}
        for extra in ({}, {"tools_kwargs": {"weather": {"city": "Oslo"}}})
    ]  # fmt: skip
    path = write_rows(rows, tmp_path / "train.jsonl")
    data = PromptDataset([path], tokenizer, 64, tools=setup.schemas)
    with pytest.raises(ValueError, match=r"train.jsonl:1.*weather"):
        check_agent_rows(setup, data)
    rows[1]["extra_info"] = {"agent_name": "shop"}
    data = PromptDataset([write_rows(rows, tmp_path / "train.jsonl")], tokenizer, 64)
    with pytest.raises(ValueError, match=r"train.jsonl:1: extra_info.agent_name 'shop'"):
        check_agent_rows(setup, data)


def test_a_tool_file_without_schemas_is_named(tmp_path: Path) -> None:
    empty = tmp_path / "tools.py"
    empty.write_text("def f():\n    return 1\n")
    with pytest.raises(ValueError, match=rf"{empty}.*TOOLS"):
        prepare_agent(rollout(tools_file=str(empty)), build_tokenizer("text"))
