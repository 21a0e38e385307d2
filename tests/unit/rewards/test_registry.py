"""Unit tests for `hybrid.rewards.registry`: dispatch by data_source and custom file loading."""

from pathlib import Path

import pytest

from hybrid.rewards import BUILTIN_REWARDS, compute_score, load_reward_function

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("data_source", "response", "ground_truth"),
    [
        ("openai/gsm8k", "so #### 1,600", "1600"),
        ("gsm8k", "#### 18", "18"),
        ("math", "\\boxed{\\frac{1}{2}}", "0.5"),
        ("lighteval/MATH", "\\boxed{2}", "2"),
        ("DigitalLearningGmbH/MATH-lighteval", "\\boxed{2}", "2"),
        ("countdown", "<answer>(1 + 2) * 3</answer>", {"target": 9, "numbers": [3, 1, 2]}),
        ("arithmetic", "7<|im_end|>", "7"),
    ],
)
def test_dispatch_by_data_source(data_source: str, response: str, ground_truth: object) -> None:
    assert compute_score(data_source, response, ground_truth) == 1.0
    assert compute_score(data_source, "nothing useful", ground_truth, {"split": "test"}) == 0.0


def test_unknown_data_source_names_it_and_the_known_ones() -> None:
    with pytest.raises(ValueError, match="my/dataset") as info:
        compute_score("my/dataset", "#### 1", "1")
    message = str(info.value)
    assert all(name in message for name in BUILTIN_REWARDS)
    assert "custom reward function" in message


def test_load_reward_function_from_file(tmp_path: Path) -> None:
    path = tmp_path / "my_reward.py"
    path.write_text(
        "from dataclasses import dataclass\n"
        "@dataclass\n"
        "class Weights:\n"
        "    bonus: float = 0.5\n"
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return {'score': float(solution_str == ground_truth), 'bonus': Weights().bonus}\n"
        "def other(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return 2.0\n"
        "NOT_A_FUNCTION = 3\n"
    )
    fn = load_reward_function(str(path))
    assert fn("x", "a", "a", None) == {"score": 1.0, "bonus": 0.5}
    assert load_reward_function(str(path), name="other")("x", "a", "b", None) == 2.0
    with pytest.raises(AttributeError, match="'missing'"):
        load_reward_function(str(path), name="missing")
    with pytest.raises(TypeError, match="not callable"):
        load_reward_function(str(path), name="NOT_A_FUNCTION")


def test_load_reward_function_errors_name_the_function_and_file(tmp_path: Path) -> None:
    path = tmp_path / "empty_reward.py"
    path.write_text("x = 1\n")
    with pytest.raises(AttributeError) as info:
        load_reward_function(str(path), name="score_it")
    assert "score_it" in str(info.value) and str(path) in str(info.value)
    missing = tmp_path / "nope.py"
    with pytest.raises(FileNotFoundError) as not_found:
        load_reward_function(str(missing))
    assert str(missing) in str(not_found.value)
