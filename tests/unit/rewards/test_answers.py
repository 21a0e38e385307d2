"""Unit tests for `hybrid.rewards.answers`: each built-in data source's answer is what its reward
compares, a custom file's `extract_answer` takes over, and the stripped response is the
fallback."""

from __future__ import annotations

from pathlib import Path

import pytest

from hybrid.rewards import BUILTIN_REWARDS, compute_score
from hybrid.rewards.answers import BUILTIN_ANSWERS, answer_function, extract_answer

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("data_source", "response", "answer"),
    [
        ("openai/gsm8k", "so 1200 + 400 #### 1,600", "1600"),
        ("gsm8k", "#### $18.", "18"),
        ("gsm8k", "the answer is 18", None),  # the reward's strict reading needs ####
        ("math", "first \\boxed{1} then \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("hiyouga/geometry3k", "\\boxed{ 30 }", "30"),
        ("lighteval/MATH", "no box here", None),
        ("arithmetic", "  7<|im_end|>", "7"),
        ("arithmetic", "7 because 3+4=7", "7"),
        ("arithmetic", "7.5", "7.5"),  # not 7, as the reward reads it
        ("arithmetic", "-3", "-3"),
        ("arithmetic", "seven", None),
        ("digits_vl", " 7+0<|im_end|>", "7+0"),  # its reward compares the whole response
        ("countdown", "<answer>(1 + 2) * 3</answer>", "(1+2)*3"),
        ("countdown", "no tag", None),
        ("code", "```python\nprint(1)\n```", None),
    ],
)
def test_builtin_answers(data_source: str, response: str, answer: str | None) -> None:
    assert extract_answer(data_source, response) == answer


def test_every_builtin_reward_has_an_answer_reader() -> None:
    assert set(BUILTIN_ANSWERS) == set(BUILTIN_REWARDS)


@pytest.mark.parametrize(
    ("data_source", "right", "wrong", "gold"),
    [
        ("gsm8k", "#### 1,600", "#### 1,500", "1600"),
        ("arithmetic", "7<|im_end|>", "77", "7"),
        ("math", "\\boxed{2}", "\\boxed{3}", "2"),
    ],
)
def test_the_same_answer_scores_the_same(
    data_source: str, right: str, wrong: str, gold: str
) -> None:
    """Responses the reader calls the same answer get the same reward, different ones not."""
    assert extract_answer(data_source, right) != extract_answer(data_source, wrong)
    assert compute_score(data_source, right, gold) == 1.0
    assert compute_score(data_source, wrong, gold) == 0.0


def test_unknown_data_sources_vote_on_the_stripped_response() -> None:
    assert extract_answer("my/dataset", "  Paris<|im_end|>\n") == "Paris"
    assert extract_answer("my/dataset", " <|endoftext|> ") is None


def test_a_custom_file_s_extract_answer_takes_over(tmp_path: Path) -> None:
    custom = tmp_path / "reward.py"
    custom.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return 0.0\n"
        "def extract_answer(data_source, solution_str):\n"
        "    return solution_str.split()[-1] if data_source == 'mine' else None\n"
    )
    fn = answer_function(str(custom))
    assert fn is not None
    assert extract_answer("mine", "it is 42", fn) == "42"
    assert extract_answer("gsm8k", "#### 42", fn) is None  # the file decides for every source


def test_a_custom_file_without_extract_answer_votes_on_the_stripped_response(
    tmp_path: Path,
) -> None:
    custom = tmp_path / "reward.py"
    custom.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return 1.0\n"
    )
    fn = answer_function(str(custom))
    assert fn is not None
    # Not the built-in gsm8k reading: the custom reward need not compare that.
    assert extract_answer("gsm8k", " so #### 1,600 ", fn) == "so #### 1,600"
    assert answer_function(None) is None


def test_a_custom_extract_answer_that_is_not_callable_is_named(tmp_path: Path) -> None:
    custom = tmp_path / "reward.py"
    custom.write_text("extract_answer = 3\n")
    with pytest.raises(TypeError, match=r"'extract_answer' in custom reward file .* is a int"):
        answer_function(str(custom))
