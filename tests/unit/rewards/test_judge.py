"""The generative judge without an engine: its template checks, reading a score from an answer,
its config, the driver's rendering and tokenizing, and how its scores join the rule rewards
(PendingRewards with a real inline RewardManager)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch

from hybrid.data import Batch
from hybrid.models import build_tokenizer
from hybrid.rewards.config import JudgeConfig, RewardConfig, RewardModelConfig
from hybrid.rewards.judge import (
    DEFAULT_PATTERN,
    check_template,
    combine_judged,
    compile_pattern,
    judged_metrics,
    keep_last,
    load_template,
    parse_score,
    render_prompt,
)
from hybrid.rewards.manager import RewardError, RewardManager
from hybrid.trainer.judge import Judge, Judged, make_judge
from hybrid.trainer.model_rewards import PendingRewards, submit_rewards
from tests.unit.trainer.test_config_reachable import compose_config, to_typed

pytestmark = pytest.mark.unit

NAN = float("nan")


# --- the template ----------------------------------------------------------------------------


def test_a_template_names_the_response_and_only_known_placeholders() -> None:
    good = "{prompt}{response}+{ground_truth}= {{literal}}"
    assert check_template(good, "t.txt") == good
    with pytest.raises(ValueError, match=r"t\.txt: the template has no \{response\}"):
        check_template("{prompt} {ground_truth}", "t.txt")
    with pytest.raises(ValueError, match=r"t\.txt: unknown placeholders \{answer\}, \{score\}"):
        check_template("{response} {score} {answer}", "t.txt")
    with pytest.raises(ValueError, match=r"t\.txt: unknown placeholders \{\}"):
        check_template("{response} {}", "t.txt")  # positional
    with pytest.raises(ValueError, match=r"t\.txt: not a valid template .*\{\{"):
        check_template("{response} {", "t.txt")


def test_load_template_names_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "none.txt"
    with pytest.raises(ValueError, match=rf"reward\.judge\.template_path: {missing} is not a file"):
        load_template(missing)
    bad = tmp_path / "bad.txt"
    bad.write_text("rate {prompt}")
    with pytest.raises(ValueError, match=rf"template_path {bad}: the template has no"):
        load_template(bad)
    good = tmp_path / "good.txt"
    good.write_text("Q: {prompt}\nA: {response}\n")
    assert load_template(good) == "Q: {prompt}\nA: {response}\n"


def test_rendering_inserts_values_verbatim() -> None:
    text = render_prompt("[{prompt}|{response}|{ground_truth}]", "1+2=", "{prompt} {0}", "3")
    assert text == "[1+2=|{prompt} {0}|3]"  # braces in a response are not placeholders


# --- reading the answer ----------------------------------------------------------------------


def test_the_pattern_is_checked_naming_the_field() -> None:
    assert compile_pattern(DEFAULT_PATTERN).groups == 1
    with pytest.raises(ValueError, match=r"reward\.judge\.pattern '\(' is not a valid regex"):
        compile_pattern("(")
    with pytest.raises(ValueError, match=r"reward\.judge\.pattern .* exactly one group.* has 0"):
        compile_pattern(r"\d+")
    with pytest.raises(ValueError, match=r"has 2; make other groups non-capturing"):
        compile_pattern(r"(\d)(\d)")


@pytest.mark.parametrize(
    ("answer", "score"),
    [
        ("7", 7.0),
        ("first 2, then -3.5", -3.5),  # the last match
        ("score: 10/10", 10.0),
        ("", None),
        ("no number here", None),
        ("+=", None),
    ],
)
def test_the_last_match_is_the_score(answer: str, score: float | None) -> None:
    assert parse_score(answer, compile_pattern(DEFAULT_PATTERN)) == score


def test_a_match_that_is_no_finite_number_is_unparsable() -> None:
    words = compile_pattern(r"verdict: (\S+)")
    assert parse_score("verdict: 4", words) == 4.0
    assert parse_score("verdict: inf", words) is None
    assert parse_score("verdict: nan", words) is None
    assert parse_score("verdict: good", words) is None
    optional = compile_pattern(r"x(\d)?")  # the group may not take part in the match
    assert parse_score("x", optional) is None


def test_keep_last_cuts_on_the_left() -> None:
    assert keep_last([1, 2, 3, 4], 2) == ([3, 4], True)
    assert keep_last([1, 2], 2) == ([1, 2], False)


# --- combining -------------------------------------------------------------------------------


def test_judge_scores_combine_per_row_and_unparsable_rows_score_the_error_score() -> None:
    rule = torch.tensor([1.0, 0.0, NAN, 1.0])
    judge = torch.tensor([2.0, NAN, 4.0, 6.0])
    modes = ["sum", "sum", "replace", "replace"]
    combined = combine_judged(rule, judge, modes, coef=0.5, error_score=-1.0)
    assert combined.tolist() == [2.0, -1.0, 2.0, 3.0]
    with pytest.raises(ValueError, match=r"rows \[0\] combine by sum but have no rule score"):
        combine_judged(torch.tensor([NAN]), torch.tensor([1.0]), ["sum"], 1.0, 0.0)


def test_judged_metrics() -> None:
    rule = torch.tensor([1.0, 0.0, NAN])
    judge = torch.tensor([2.0, NAN, 4.0])
    combined = torch.tensor([3.0, -1.0, 4.0])
    metrics = judged_metrics(rule, judge, combined, torch.tensor([True, False, False]))
    assert metrics == {
        "reward/mean": 2.0,
        "reward/max": 4.0,
        "reward/min": -1.0,
        "reward/rule_mean": 0.5,
        "reward/judge_mean": 3.0,
        "reward/judge_unparsable": 1.0,
        "reward/judge_truncated": 1.0,
    }
    none = judged_metrics(rule, torch.full((3,), NAN), combined, torch.zeros(3, dtype=torch.bool))
    assert math.isnan(none["reward/judge_mean"]) and none["reward/judge_unparsable"] == 3.0


# --- the config ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"template_path": " "}, r"reward\.judge\.template_path is empty"),
        ({"template_path": "t", "pattern": "(("}, r"reward\.judge\.pattern '\(\(' is not"),
        ({"template_path": "t", "max_tokens": 0}, r"reward\.judge\.max_tokens"),
        ({"template_path": "t", "max_prompt_length": -1}, r"reward\.judge\.max_prompt_length"),
        ({"template_path": "t", "combine": "mean"}, r"reward\.judge\.combine"),
        ({"template_path": "t", "combine_by_source": {"a": "x"}}, r"combine_by_source\.a"),
        ({"template_path": "t", "coef": 0.0}, r"reward\.judge\.coef must be a finite"),
        ({"combine": "replace"}, r"template_path is null \(no judge\) but reward\.judge\.combine"),
    ],
)
def test_bad_judge_settings_name_the_field(fields: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        JudgeConfig(**fields)


def test_judge_and_reward_model_are_one_or_the_other() -> None:
    assert not RewardConfig().judge.enabled
    with pytest.raises(ValueError, match=r"reward\.judge\.template_path and reward\.model\.path"):
        RewardConfig(judge=JudgeConfig(template_path="t"), model=RewardModelConfig(path="/rm"))


def test_the_judge_is_reachable_from_the_command_line(tmp_path: Path) -> None:
    template = tmp_path / "judge.txt"
    template.write_text("{prompt}{response}=")
    overrides = (
        f"reward.judge.template_path={template}",
        "reward.judge.max_tokens=4",
        "reward.judge.combine_by_source={chat:replace}",
    )
    config = to_typed(compose_config(overrides=overrides))
    assert config.reward.judge.template_path == str(template)
    assert config.reward.judge.combine_for("chat") == "replace"
    assert config.reward.judge.combine_for("arithmetic") == "sum"
    room = config.rollout.max_model_len - 4
    fits = to_typed(
        compose_config(overrides=(*overrides, f"reward.judge.max_prompt_length={room}"))
    )
    assert fits.reward.judge.max_prompt_length + 4 == fits.rollout.max_model_len
    long = to_typed(
        compose_config(overrides=(*overrides, f"reward.judge.max_prompt_length={room + 1}"))
    )
    limit = config.rollout.max_model_len
    with pytest.raises(
        ValueError, match=rf"= {limit + 1} exceeds rollout\.max_model_len \({limit}\)"
    ):
        make_judge(long, engines=None)  # type: ignore[arg-type]  # refused before any call


# --- the driver's side -----------------------------------------------------------------------


def rollout_rows(raw_prompt: bool = True) -> Batch:
    """Three rollout rows as the reward sees them (the columns the judge reads)."""
    columns: dict[str, list] = {
        "response_text": ["3", "9", "12"],
        "ground_truth": ["3", "8", "2"],
        "data_source": ["arithmetic", "arithmetic", "chat"],
        "uid": ["a", "b", "c"],
    }
    if raw_prompt:
        columns["raw_prompt"] = ["1+2=", "4+4=", "1+1+1+1+1+1+1+1="]
    return Batch.from_dict({}, columns)


def make_test_judge(tmp_path: Path, on_error: str = "fail", **fields: object) -> Judge:
    template = tmp_path / "judge.txt"
    template.write_text("{prompt}{response}+{ground_truth}=")
    config = JudgeConfig(template_path=str(template), **fields)  # type: ignore[arg-type]
    # The engines are only reached by `submit`: these tests stop before it.
    return Judge(config, build_tokenizer("arithmetic"), None, on_error, -1.0)  # type: ignore[arg-type]


def test_judge_prompts_are_user_messages_cut_on_the_left(tmp_path: Path) -> None:
    judge = make_test_judge(tmp_path, max_prompt_length=20)
    texts = judge.texts(rollout_rows())
    assert texts == ["1+2=3+3=", "4+4=9+8=", "1+1+1+1+1+1+1+1=12+2="]
    prompts, cut = judge.encode(texts)
    tokenizer = judge.tokenizer
    ids, mask = prompts.tensors["input_ids"], prompts.tensors["attention_mask"]
    first = tokenizer.decode(ids[0][mask[0].bool()].tolist())
    assert first == "<|im_start|>1+2=3+3=<|im_end|><|im_start|>"  # chat template, generation cue
    assert cut.tolist() == [False, False, True]
    assert int(mask[2].sum()) == 20 and mask[0, 0] == 0  # left-padded to the longest
    last = tokenizer.decode(ids[2].tolist())
    assert last.endswith("=12+2=<|im_end|><|im_start|>")  # the start is what was lost


def test_without_raw_prompt_the_prompt_tokens_are_decoded(tmp_path: Path) -> None:
    judge = make_test_judge(tmp_path)
    tokenizer = judge.tokenizer
    prompt = [1, *tokenizer.encode("1+2="), 2, 1]  # <|im_start|>1+2=<|im_end|><|im_start|>
    response = tokenizer.encode("3")
    rows = Batch.from_dict(
        {
            "input_ids": torch.tensor([prompt + response]),
            "attention_mask": torch.ones(1, len(prompt) + len(response), dtype=torch.long),
            "responses": torch.tensor([response]),
        },
        {"response_text": ["3"], "ground_truth": ["3"], "data_source": ["arithmetic"]},
    )
    assert judge.texts(rows) == ["1+2=3+3="]


def test_unparsable_answers_fail_naming_the_row_and_the_answer(tmp_path: Path) -> None:
    judge = make_test_judge(tmp_path)
    long = "+" * 300
    with pytest.raises(RewardError) as caught:
        judge.check_unparsable(rollout_rows(), ["1", long, "="], [1.0, None, None])
    message = str(caught.value)
    assert "row 1, uid b (data_source 'arithmetic')" in message
    assert "unparsable" in message and "2 of 3 rows unparsable" in message
    assert repr("+" * 200) + "..." in message and "+" * 201 not in message
    assert "reward.on_error=score" in message


def test_with_on_error_score_only_a_batch_of_nothing_but_failures_stops(tmp_path: Path) -> None:
    judge = make_test_judge(tmp_path, on_error="score")
    judge.check_unparsable(rollout_rows(), ["1", "+", "2"], [1.0, None, 2.0])  # logged only
    with pytest.raises(RewardError, match="every answer of the batch is unparsable"):
        judge.check_unparsable(rollout_rows(), ["+", "+", "="], [None, None, None])


def test_the_judge_joins_the_rule_rewards_per_data_source(tmp_path: Path) -> None:
    """The arithmetic rows sum with their rule reward; the chat row (no rule reward) is the
    judge's alone; the unparsable row scores error_score and counts among reward/errors."""
    template = tmp_path / "judge.txt"
    template.write_text("{response}")
    reward = RewardConfig(
        on_error="score",
        error_score=-1.0,
        judge=JudgeConfig(
            template_path=str(template), coef=0.5, combine_by_source={"chat": "replace"}
        ),
    )
    rules = RewardManager(num_workers=0, on_error="score")
    rows = rollout_rows()
    with pytest.raises(RuntimeError, match=r"reward\.judge\.template_path is set but no judge"):
        submit_rewards(reward, rules, None, rows)
    verdict = Judged(torch.tensor([4.0, NAN, 6.0]), torch.tensor([False, True, False]), 0.25, [])
    pending = PendingRewards(
        3,
        rules.submit(rows[[0, 1]]),
        [0, 1],
        None,
        reward.model,
        ["sum", "sum", "replace"],
        0.0,
        judged=lambda: verdict,
        reward=reward,
    )
    scores, metrics = pending.result()
    rules.close()
    assert scores.tolist() == [1.0 + 2.0, -1.0, 3.0]
    assert pending.rule_scores is not None
    assert pending.rule_scores[:2].tolist() == [1.0, 0.0] and pending.rule_scores[2].isnan()
    assert metrics["reward/judge_mean"] == 5.0
    assert metrics["reward/judge_unparsable"] == 1.0
    assert metrics["reward/judge_truncated"] == 1.0
    assert metrics["reward/errors"] == 1.0 and metrics["reward/errors/unparsable"] == 1.0
    assert metrics["reward/mean"] == pytest.approx(5.0 / 3)
    assert metrics["reward/rule_mean"] == 0.5
    assert metrics["timing_s/judge"] == 0.25
    assert re.fullmatch(DEFAULT_PATTERN, "-1.5")
