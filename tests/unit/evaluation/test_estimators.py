"""Unit tests for `hybrid.evaluation.estimators`: pass@k against hand-worked values, best@k and
maj@k against brute force over every k-subset (ties and unparsed answers included), and the
summary's keys and intervals on a hand case."""

from __future__ import annotations

import itertools
import math
import random
from collections import Counter
from collections.abc import Sequence

import numpy as np
import pytest

from hybrid.evaluation.estimators import (
    Estimate,
    PromptSamples,
    best_at_k,
    default_ks,
    estimate,
    maj_at_k,
    mean,
    pass_at_k,
    summarize,
)

pytestmark = pytest.mark.unit


def subsets(n: int, k: int) -> list[tuple[int, ...]]:
    return list(itertools.combinations(range(n), k))


def brute_best(scores: Sequence[float], k: int) -> float:
    maxima = [max(scores[i] for i in s) for s in subsets(len(scores), k)]
    return sum(maxima) / len(maxima)


def brute_maj(scores: Sequence[float], answers: Sequence[str | None], k: int) -> float:
    """The definition, subset by subset: the most frequent parsed answer wins (tied answers
    share), None only when nothing else was drawn; a voted answer scores the mean of its drawn
    samples."""
    values = []
    for chosen in subsets(len(scores), k):
        votes = Counter(answers[i] for i in chosen if answers[i] is not None)
        if not votes:
            values.append(sum(scores[i] for i in chosen) / k)
            continue
        top = max(votes.values())
        winners = [a for a, count in votes.items() if count == top]
        per_answer = [sum(scores[i] for i in chosen if answers[i] == a) / votes[a] for a in winners]
        values.append(sum(per_answer) / len(per_answer))
    return sum(values) / len(values)


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (5, 2, 1, 0.4),
        (5, 2, 2, 1 - math.comb(3, 2) / math.comb(5, 2)),  # 0.7
        (4, 0, 1, 0.0),
        (4, 0, 4, 0.0),
        (4, 4, 1, 1.0),
        (4, 4, 3, 1.0),
        (10, 3, 5, 1 - 21 / 252),  # C(7, 5) / C(10, 5) = 1/12
        (10, 3, 8, 1.0),  # only 7 wrong samples: every 8 hold a correct one
    ],
)
def test_pass_at_k_hand_worked(n: int, c: int, k: int, expected: float) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_is_the_fraction_of_subsets_with_a_correct_sample() -> None:
    correct = [True, False, False, True, False, False, False]
    for k in range(1, len(correct) + 1):
        hits = [any(correct[i] for i in s) for s in subsets(len(correct), k)]
        assert pass_at_k(len(correct), 2, k) == pytest.approx(sum(hits) / len(hits))


def test_pass_at_k_is_non_decreasing_in_k_and_stable_for_large_n() -> None:
    for c in (0, 1, 5, 63, 64):
        values = [pass_at_k(64, c, k) for k in range(1, 65)]
        assert values == sorted(values)
    # Binomials of 1000 choose 500 are not formed: the product stays in floating point.
    assert pass_at_k(1000, 1, 500) == pytest.approx(0.5)


def test_k_above_n_or_below_one_is_refused_naming_both() -> None:
    with pytest.raises(ValueError, match=r"pass@k needs k <= n samples per prompt.*k=5 and n=4"):
        pass_at_k(4, 1, 5)
    with pytest.raises(ValueError, match="k >= 1"):
        pass_at_k(4, 1, 0)
    with pytest.raises(ValueError, match="k=3 and n=2"):
        best_at_k([1.0, 0.0], 3)
    with pytest.raises(ValueError, match="k=3 and n=2"):
        maj_at_k([1.0, 0.0], ["a", "b"], 3)


@pytest.mark.parametrize(
    "scores",
    [
        [0.0, 1.0, 0.5, 0.25, 1.0],
        [3.0, -1.0, 2.0, 2.0, 0.0, 7.5],
        [1.0],
        [0.2] * 4,
    ],
)
def test_best_at_k_is_the_mean_max_over_every_subset(scores: list[float]) -> None:
    for k in range(1, len(scores) + 1):
        assert best_at_k(scores, k) == pytest.approx(brute_best(scores, k))
    assert best_at_k(scores, 1) == pytest.approx(mean(scores))
    assert best_at_k(scores, len(scores)) == max(scores)


MAJ_CASES = [
    # A clear majority answer, a wrong minority.
    ([1.0, 1.0, 1.0, 0.0, 0.0], ["7", "7", "7", "3", "5"]),
    # Ties between answers of different scores, and unparsed samples.
    ([1.0, 0.0, 1.0, 0.0, 0.0, 1.0], ["a", "b", None, "b", None, "a"]),
    # Mostly unparsed: None never wins while a parsed answer is drawn.
    ([0.0, 0.0, 0.0, 1.0, 0.5], [None, None, None, "x", "y"]),
    # Samples of one answer with different scores (a partial-credit reward).
    ([0.25, 0.75, 1.0, 0.0, 0.5, 0.5, 0.0], ["p", "p", "q", "r", "q", "r", None]),
    # Every answer distinct: always a tie among what was drawn.
    ([0.1, 0.2, 0.3, 0.4], ["a", "b", "c", "d"]),
]


@pytest.mark.parametrize(("scores", "answers"), MAJ_CASES)
def test_maj_at_k_is_exact_against_every_subset(
    scores: list[float], answers: list[str | None]
) -> None:
    for k in range(1, len(scores) + 1):
        assert maj_at_k(scores, answers, k) == pytest.approx(brute_maj(scores, answers, k))


def test_maj_at_k_hand_cases() -> None:
    # k == n: the vote of all samples; a tie between "a" (scores 1, 1) and "b" (0, 0).
    assert maj_at_k([1.0, 0.0, 1.0, 0.0], ["a", "b", "a", "b"], 4) == 0.5
    assert maj_at_k([1.0, 0.0, 0.0], ["a", "b", "b"], 3) == 0.0
    # Nothing parsed: None wins every vote, with every sample's score.
    assert maj_at_k([1.0, 0.0, 0.0, 0.0], [None] * 4, 2) == 0.25
    # One parsed answer beats three unparsed ones.
    assert maj_at_k([0.0, 0.0, 0.0, 1.0], [None, None, None, "x"], 4) == 1.0
    assert maj_at_k([1.0, 0.0], ["a", "b"], 1) == 0.5  # maj@1 is the mean


def test_maj_at_k_samples_past_the_bound_deterministically() -> None:
    rng = random.Random(3)
    answers = [rng.choice(["1", "2", "3", None]) for _ in range(14)]
    scores = [1.0 if a == "1" else 0.0 for a in answers]
    k = 7  # C(14, 7) = 3432 subsets: past the bound, sampled
    exact = brute_maj(scores, answers, k)
    sampled = maj_at_k(scores, answers, k, max_subsets=1000)
    assert sampled == maj_at_k(scores, answers, k, max_subsets=1000)  # a fixed seed
    assert sampled == pytest.approx(exact, abs=0.04)
    assert maj_at_k(scores, answers, k, max_subsets=4000) == pytest.approx(exact)


def test_default_ks() -> None:
    assert default_ks(1) == [1]
    assert default_ks(4) == [1, 2, 4]
    assert default_ks(6) == [1, 2, 4, 6]
    assert default_ks(16) == [1, 2, 4, 8, 16]
    with pytest.raises(ValueError, match="n >= 1"):
        default_ks(0)


def test_summarize_keys_values_and_intervals() -> None:
    prompts = [
        PromptSamples("gsm8k", (1.0, 0.0), ("4", "5")),
        PromptSamples("gsm8k", (0.0, 0.0), ("1", None)),
        PromptSamples("math", (1.0, 1.0), ("x", "x")),
    ]
    out = summarize(prompts, [1, 2])
    metrics = ["mean@2", "pass@1", "best@1", "maj@1", "pass@2", "best@2", "maj@2"]
    assert list(out) == [f"{s}/{m}" for s in ("gsm8k", "math", "all") for m in metrics]
    # gsm8k's per-prompt pass@2: 1 and 0, so 0.5 +- 1.96 * std(1, 0) / sqrt(2) = 0.5 +- 0.98,
    # kept inside [0, 1], the range the prompts span.
    half = 1.96 * math.sqrt(0.5) / math.sqrt(2)
    assert half == pytest.approx(0.98)
    assert out["gsm8k/pass@2"] == Estimate(0.5, 0.0, 1.0, 2)
    # mean@2 of (0.5, 0.0): 0.25 +- 0.49, inside [0.0, 0.5].
    assert (out["gsm8k/mean@2"].ci_low, out["gsm8k/mean@2"].ci_high) == (0.0, 0.5)
    assert out["gsm8k/mean@2"].value == 0.25
    # One prompt: the interval is the value itself.
    assert out["math/maj@2"] == Estimate(1.0, 1.0, 1.0, 1)
    # Over all three prompts; maj@2 of the first is the tie of "4" (1) and "5" (0).
    assert out["all/maj@2"].value == pytest.approx((0.5 + 0.0 + 1.0) / 3)
    assert out["all/pass@1"].value == pytest.approx((0.5 + 0.0 + 1.0) / 3)
    assert out["all/best@2"].prompts == 3


def test_summarize_threshold_and_refusals() -> None:
    partial = [PromptSamples("code", (0.5, 0.9), (None, None))]
    assert summarize(partial, [1])["code/pass@1"].value == 0.0
    assert summarize(partial, [1], correct_threshold=0.5)["code/pass@1"].value == 1.0
    uneven = [PromptSamples("a", (1.0, 0.0), ("1", "2")), PromptSamples("b", (1.0,), ("1",))]
    with pytest.raises(ValueError, match="data_source 'b' has a prompt with 1"):
        summarize(uneven, [1])
    with pytest.raises(ValueError, match="k=4 and n=2"):
        summarize(partial, [1, 4])
    with pytest.raises(ValueError, match="one answer per score"):
        PromptSamples("a", (1.0, 0.0), ("1",))


def test_an_interval_is_the_normal_one_when_it_fits_the_range() -> None:
    values = [0.0, 1.0] * 50  # 100 prompts: 0.5 +- 1.96 * 0.5025 / 10
    est = estimate(values)
    half = 1.96 * float(np.std(values, ddof=1)) / 10
    assert (est.ci_low, est.ci_high) == pytest.approx((0.5 - half, 0.5 + half))
