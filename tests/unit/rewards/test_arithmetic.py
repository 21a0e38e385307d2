"""Unit tests for `hybrid.rewards.arithmetic`: the exact-integer-prefix rule."""

import pytest

from hybrid.rewards.arithmetic import compute_score

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("response", "gold", "expected"),
    [
        ("7", "7", 1.0),
        ("7<|im_end|>", "7", 1.0),
        ("  7\n<|endoftext|>", "7", 1.0),
        ("7 because 3+4=7", "7", 1.0),
        ("7<|im_end|><|endoftext|>", 7, 1.0),
        ("-3", "-3", 1.0),
        ("77", "7", 0.0),
        ("17", "7", 0.0),
        ("07", "7", 0.0),
        ("7.5", "7", 0.0),
        ("-7", "7", 0.0),
        ("3", "-3", 0.0),
        ("", "7", 0.0),
        ("<|im_end|>", "7", 0.0),
        ("seven", "7", 0.0),
        ("12", "12", 1.0),
        ("1", "12", 0.0),
    ],
)
def test_arithmetic_scores(response: str, gold: str | int, expected: float) -> None:
    assert compute_score(response, gold) == expected


def test_non_integer_gold_raises() -> None:
    with pytest.raises(ValueError, match="integer"):
        compute_score("7", "seven")
