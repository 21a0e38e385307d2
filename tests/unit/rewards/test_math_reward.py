"""Unit tests for `hybrid.rewards.math_reward`: math-verify on the last boxed answer."""

import threading

import pytest

from hybrid.rewards.math_reward import compute_score, last_boxed

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("response", "gold", "expected"),
    [
        ("\\boxed{\\frac{1}{2}}", "0.5", 1.0),
        ("so the answer is \\boxed{0.5}", "\\frac{1}{2}", 1.0),
        ("first \\boxed{3}, no wait: \\boxed{\\frac{1}{2}}", "\\frac12", 1.0),
        ("\\boxed{1+x}", "x+1", 1.0),
        ("\\boxed{3}", "0.5", 0.0),
        ("\\boxed{\\frac{1}{2}} then \\boxed{3}", "0.5", 0.0),
        ("The answer is $\\frac{1}{2}$.", "0.5", 1.0),
        ("garbage @@@ }{ \\boxed{", "0.5", 0.0),
        ("", "0.5", 0.0),
        ("\\boxed{1}", "@@@ {{", 0.0),
    ],
)
def test_math_scores(response: str, gold: str, expected: float) -> None:
    assert compute_score(response, gold) == expected


def test_last_boxed_balances_braces() -> None:
    assert last_boxed("\\boxed{1} and \\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert last_boxed("\\boxed{\\frac{1}{2}") is None
    assert last_boxed("no box") is None


def test_scores_off_the_main_thread() -> None:
    # math-verify's signal-based timeout fails off the main thread; we must still score.
    results: list[float] = []
    thread = threading.Thread(target=lambda: results.append(compute_score("\\boxed{2}", "2")))
    thread.start()
    thread.join()
    assert results == [1.0]
