"""Unit tests for `hybrid.rewards.countdown`: TinyZero's scores, the number multiset rule and
the ast-only evaluation that never runs the response's code."""

import json
from unittest import mock

import pytest

from hybrid.rewards.countdown import compute_score, evaluate

pytestmark = pytest.mark.unit

TRUTH = {"target": 24, "numbers": [2, 3, 4, 1]}


@pytest.mark.parametrize(
    "equation",
    ["(2 + 3 + 1) * 4", "4 * (1 + 2 + 3)", "  (3+2+1)*4 ", "-(-4) * (3 * 2 * 1)", "2*3*4/1"],
)
def test_correct_equation_scores_full(equation: str) -> None:
    assert compute_score(f"Let me think. <answer>{equation}</answer>", TRUTH) == 1.0


@pytest.mark.parametrize(
    ("equation", "why"),
    [
        ("2 + 3 + 4 + 1", "each number once, but 10"),
        ("(2 + 3 + 1) * 4 * 1", "1 reused (value still 24)"),
        ("2 * 3 * 4", "1 missing (value still 24)"),
        ("2 * 3 * 4 * 1 + 0", "an extra number (value still 24)"),
        ("2 * 3 * 4 * 1 * 10", "an extra number"),
        ("4 / (3 - 2 - 1)", "division by zero"),
        ("2 ** 3 * 4 - 1", "power is not allowed"),
        ("2.0 * 3 * 4 * 1", "decimals are not allowed"),
        ("(2 + 3 + 1 * 4", "syntax error"),
        ("", "empty answer"),
    ],
)
def test_well_formed_but_wrong_scores_format(equation: str, why: str) -> None:
    assert compute_score(f"<answer>{equation}</answer>", TRUTH) == 0.1, why


@pytest.mark.parametrize(
    "response",
    ["(2 + 3 + 1) * 4", "<answer>(2 + 3 + 1) * 4", "answer: (2 + 3 + 1) * 4</answer>"],
)
def test_no_answer_tag_scores_zero(response: str) -> None:
    assert compute_score(response, TRUTH) == 0.0


def test_exact_fraction_arithmetic() -> None:
    assert (
        compute_score("<answer>8 / (3 - 8 / 3)</answer>", {"target": 24, "numbers": [8, 3, 8, 3]})
        == 1.0
    )
    assert (
        compute_score("<answer>6 / (5 / 4 - 1)</answer>", {"target": 24, "numbers": [4, 5, 6, 1]})
        == 1.0
    )
    assert evaluate("8 / (3 - 8 / 3)") == 24


def test_last_answer_tag_counts_and_ground_truth_may_be_json() -> None:
    response = "<answer>1 + 2</answer> hmm, rather <answer>(2 + 3 + 1) * 4</answer>"
    assert compute_score(response, json.dumps(TRUTH)) == 1.0
    assert compute_score(response, TRUTH, format_score=0.0, score=2.0) == 2.0
    wrong_last = "<answer>(2 + 3 + 1) * 4</answer> or <answer>1 + 2</answer>"
    assert compute_score(wrong_last, TRUTH, format_score=0.0) == 0.0


@pytest.mark.parametrize(
    "payload",
    [
        "__import__('os').system('touch /tmp/pwned')",
        "(2 + 3 + 1) * 4 + __import__('os').getpid() * 0",
        "(lambda: 24)()",
        "[2, 3, 4, 1][0] * 12",
        "(2 + 3 + 1) * 4; import os",
        "(2 + 3 + 1)(4)",
    ],
)
def test_malicious_input_is_never_executed(payload: str) -> None:
    with mock.patch("builtins.__import__", side_effect=AssertionError("code was executed")):
        score = compute_score(f"<answer>{payload}</answer>", TRUTH)
    assert score == 0.1


def test_evaluate_rejects_names_and_calls() -> None:
    with pytest.raises(ValueError, match="characters"):
        evaluate("__import__('os')")


def test_bad_ground_truth_raises() -> None:
    with pytest.raises(ValueError, match="target"):
        compute_score("<answer>1</answer>", {"numbers": [1]})
