"""Which prompt groups carry a group-relative signal (DAPO's dynamic sampling).

A group whose samples all scored the same gets a zero advantage on every token under a group
baseline (GRPO, RLOO): it costs a forward and a backward and teaches nothing, and it dilutes
the token-mean of the groups that do. These functions only look at scores and group ids; the
over-sampling around them is the sources' (hybrid/trainer/sources/group_filter.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

EQUAL_ATOL = 1e-6
"""Scores closer than this count as equal (float rewards of one group, e.g. 1.0 and 0.9999999)."""


def group_rows(uids: Sequence[str]) -> dict[str, list[int]]:
    """Each group id's rows, in first-seen order."""
    rows: dict[str, list[int]] = {}
    for row, uid in enumerate(uids):
        rows.setdefault(str(uid), []).append(row)
    return rows


def informative_groups(uids: Sequence[str], scores: torch.Tensor) -> dict[str, bool]:
    """Per group id (first-seen order): whether its scores differ (max - min > EQUAL_ATOL).
    A group of one sample is never informative."""
    if len(uids) != scores.numel():
        raise ValueError(f"{len(uids)} group ids for {scores.numel()} scores")
    flat = scores.reshape(-1).float()
    return {
        uid: bool(flat[rows].max() - flat[rows].min() > EQUAL_ATOL)
        for uid, rows in group_rows(uids).items()
    }


def all_equal_fraction(uids: Sequence[str], scores: torch.Tensor) -> float:
    """The fraction of groups whose scores are all equal (0.0 for no rows)."""
    verdicts = informative_groups(uids, scores)
    if not verdicts:
        return 0.0
    return sum(not informative for informative in verdicts.values()) / len(verdicts)
