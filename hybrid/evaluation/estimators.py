"""The estimators of sampled evaluation: n samples per prompt, one score each (and the answer
parsed from it), reduced per prompt, then averaged over prompts with a confidence interval.

Per prompt, over its n samples:
- mean@n: the mean score.
- pass@k: the probability that at least one of k samples drawn without replacement from the n
  is correct, by the unbiased estimator of Chen et al. 2021 (the Codex paper):
  1 - C(n-c, k) / C(n, k) with c correct samples, computed as a product (no large binomials).
- best@k: the expected highest score of k samples drawn without replacement, exact by order
  statistics: sorted ascending, the i-th smallest score is the highest of C(i-1, k-1) of the
  C(n, k) subsets (summed in exact rationals, rounded once).
- maj@k: the expected score of the majority answer of k samples drawn without replacement.
  A sample whose answer could not be parsed (None) never wins a vote unless every drawn sample
  is None; tied answers share the win (the mean of their scores). A voted answer's score is the
  mean score of the samples giving that answer; over all n or over the k drawn is the same in
  expectation (given how many of each answer were drawn, which ones is uniform), and all n
  has the smaller variance. Exact when k is 1 or n, or when C(n, k) <= MAJ_MAX_SUBSETS (every
  subset enumerated); otherwise a Monte Carlo mean over MAJ_DRAWS random subsets from a fixed
  seed, so the same samples always give the same value.

`summarize` averages each of them over the prompts of every data source and over all prompts,
with a 95% normal-approximation interval over prompts.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

MAJ_MAX_SUBSETS = 2000
"""maj@k enumerates every k-subset up to this many; past it, it samples MAJ_DRAWS of them."""
MAJ_DRAWS = 2000
"""Random k-subsets of maj@k's Monte Carlo estimate (its standard error is at most about
0.5 / sqrt(MAJ_DRAWS) = 0.011 for scores in [0, 1])."""
Z_95 = 1.96
"""The normal quantile of a two-sided 95% interval."""
OVERALL = "all"
"""The data source name `summarize` gives the metrics over every prompt."""


def _check_k(k: int, n: int, metric: str) -> None:
    if k < 1:
        raise ValueError(f"{metric} needs k >= 1, got k={k}")
    if k > n:
        raise ValueError(
            f"{metric} needs k <= n samples per prompt, got k={k} and n={n}: sample at least "
            f"k per prompt or drop k={k}"
        )


def mean(scores: Sequence[float]) -> float:
    """mean@n: the mean score of a prompt's samples."""
    if not scores:
        raise ValueError("mean@n needs at least one sample")
    return float(sum(scores)) / len(scores)


def pass_at_k(n: int, c: int, k: int) -> float:
    """pass@k of a prompt with `c` correct samples out of `n`: 1 - C(n-c, k) / C(n, k)."""
    _check_k(k, n, "pass@k")
    if not 0 <= c <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n correct samples, got c={c} and n={n}")
    if n - c < k:
        return 1.0  # every k-subset holds a correct sample
    # C(n-c, k) / C(n, k) = prod over i in (n-c, n] of (1 - k / i).
    miss = 1.0
    for i in range(n - c + 1, n + 1):
        miss *= 1.0 - k / i
    return 1.0 - miss


def best_at_k(scores: Sequence[float], k: int) -> float:
    """best@k: the expected highest score of k of the samples drawn without replacement."""
    ascending = sorted(float(s) for s in scores)
    n = len(ascending)
    _check_k(k, n, "best@k")
    # The i-th smallest (1-based) weighs C(i-1, k-1) / C(n, k), zero below the k-th. Summed
    # in exact rationals (scores as the binary fractions they are), rounded once.
    total = sum(
        math.comb(i - 1, k - 1) * Fraction(score) for i, score in enumerate(ascending, 1) if i >= k
    )
    return float(total / math.comb(n, k))


def maj_at_k(
    scores: Sequence[float],
    answers: Sequence[str | None],
    k: int,
    *,
    max_subsets: int = MAJ_MAX_SUBSETS,
    draws: int = MAJ_DRAWS,
    seed: int = 0,
) -> float:
    """maj@k: the expected score of the majority answer of k samples drawn without
    replacement (the module docstring has the rules: None answers, ties, exact or sampled)."""
    n = len(scores)
    if len(answers) != n:
        raise ValueError(f"maj@k needs one answer per score, got {len(answers)} and {n}")
    _check_k(k, n, "maj@k")
    names = sorted({a for a in answers if a is not None})
    if not names or k == 1:
        return mean(scores)  # each sample's own answer wins (all None: None wins every vote)
    index = {name: i for i, name in enumerate(names)}
    group = np.array([len(names) if a is None else index[a] for a in answers])  # None: last
    values = np.asarray(scores, dtype=np.float64)
    sizes = np.bincount(group, minlength=len(names) + 1)
    means = np.bincount(group, weights=values, minlength=len(names) + 1) / np.maximum(sizes, 1)
    if k == n:
        subsets = np.arange(n)[None, :]
    elif math.comb(n, k) <= max_subsets:
        subsets = np.array(list(itertools.combinations(range(n), k)))
    else:
        keys = np.random.default_rng(seed).random((draws, n))
        subsets = np.argsort(keys, axis=1)[:, :k]  # uniform k-subsets
    return float(_majority_scores(group[subsets], means).mean())


def _majority_scores(drawn: np.ndarray, means: np.ndarray) -> np.ndarray:
    """The voted score of each subset: `drawn` (subsets, k) holds answer groups (the last
    group is None), `means` (groups,) each group's mean score."""
    num_groups = len(means)
    offsets = np.arange(len(drawn))[:, None] * num_groups
    counts = np.bincount((drawn + offsets).ravel(), minlength=len(drawn) * num_groups)
    votes = counts.reshape(len(drawn), num_groups)[:, :-1]  # (subsets, answers): None never votes
    top = votes.max(axis=1, keepdims=True)
    tied = (votes == top) & (top > 0)
    shared = (tied * means[:-1]).sum(axis=1) / np.maximum(tied.sum(axis=1), 1)
    return np.where(top[:, 0] > 0, shared, means[-1])


def default_ks(n: int) -> list[int]:
    """The k reported for n samples per prompt: the powers of two up to n, and n."""
    if n < 1:
        raise ValueError(f"default_ks needs n >= 1 samples per prompt, got {n}")
    ks = [2**i for i in range(n.bit_length()) if 2**i <= n]
    return ks if ks[-1] == n else [*ks, n]


@dataclass(frozen=True)
class PromptSamples:
    """One prompt's samples: their scores and the answers parsed from them (None: none)."""

    data_source: str
    scores: tuple[float, ...]
    answers: tuple[str | None, ...]

    def __post_init__(self) -> None:
        if not self.scores or len(self.scores) != len(self.answers):
            raise ValueError(
                f"a prompt of data_source {self.data_source!r} needs one answer per score and "
                f"at least one sample, got {len(self.scores)} scores and "
                f"{len(self.answers)} answers"
            )


@dataclass(frozen=True)
class Estimate:
    """A metric's mean over prompts and its 95% confidence interval over prompts."""

    value: float
    ci_low: float
    ci_high: float
    prompts: int


def estimate(values: Sequence[float]) -> Estimate:
    """The mean of per-prompt `values` and its 95% interval, mean +- 1.96 s / sqrt(P) with the
    sample standard deviation s over the P prompts (normal approximation: fine for a few dozen
    prompts, optimistic for fewer), kept inside the range the per-prompt values span (a
    metric near 0 or 1 gets no bound past what any prompt scored). One prompt has no spread to
    measure: its interval is its value."""
    count = len(values)
    if count == 0:
        raise ValueError("an estimate needs at least one prompt")
    center = float(np.mean(values))
    half = Z_95 * float(np.std(values, ddof=1)) / math.sqrt(count) if count > 1 else 0.0
    low, high = float(np.min(values)), float(np.max(values))
    return Estimate(center, max(center - half, low), min(center + half, high), count)


def prompt_metrics(
    prompt: PromptSamples, ks: Sequence[int], correct_threshold: float = 1.0
) -> dict[str, float]:
    """One prompt's mean@n, then pass@k, best@k and maj@k for every k in `ks`."""
    n = len(prompt.scores)
    correct = sum(score >= correct_threshold for score in prompt.scores)
    out = {f"mean@{n}": mean(prompt.scores)}
    for k in ks:
        out[f"pass@{k}"] = pass_at_k(n, correct, k)
        out[f"best@{k}"] = best_at_k(prompt.scores, k)
        out[f"maj@{k}"] = maj_at_k(prompt.scores, prompt.answers, k)
    return out


def summarize(
    prompts: Sequence[PromptSamples], ks: Sequence[int], correct_threshold: float = 1.0
) -> dict[str, Estimate]:
    """Every metric of `prompt_metrics` averaged over the prompts of each data source (keys
    "<data_source>/<metric>", in order of first appearance) and over all prompts
    ("all/<metric>"), each with its 95% interval over prompts (see `estimate`; a data source
    of one prompt gets the interval of its value alone). A sample is correct (pass@k) when its
    score is >= `correct_threshold`. Every prompt needs the same number of samples n, and every
    k must be <= n."""
    if not prompts:
        raise ValueError("summarize needs at least one prompt")
    n = len(prompts[0].scores)
    for prompt in prompts:
        if len(prompt.scores) != n:
            raise ValueError(
                f"every prompt needs the same number of samples: data_source "
                f"{prompt.data_source!r} has a prompt with {len(prompt.scores)}, the first "
                f"prompt ({prompts[0].data_source!r}) has {n}"
            )
        if prompt.data_source == OVERALL:
            raise ValueError(f"data_source {OVERALL!r} is the name of the overall metrics")
    chosen = sorted(set(ks))
    for k in chosen:
        _check_k(k, n, "pass@k")
    per_prompt = [prompt_metrics(p, chosen, correct_threshold) for p in prompts]
    by_source: dict[str, list[dict[str, float]]] = {}
    for prompt, metrics in zip(prompts, per_prompt, strict=True):
        by_source.setdefault(prompt.data_source, []).append(metrics)
    by_source[OVERALL] = per_prompt
    return {
        f"{source}/{name}": estimate([m[name] for m in rows])
        for source, rows in by_source.items()
        for name in rows[0]
    }
