"""The group verdicts of dynamic sampling, worked by hand."""

from __future__ import annotations

import pytest
import torch

from hybrid.algorithms.group_filter import all_equal_fraction, group_rows, informative_groups

pytestmark = pytest.mark.unit


def test_groups_keep_their_first_seen_order_and_rows() -> None:
    assert group_rows(["b", "a", "b", "a", "c"]) == {"b": [0, 2], "a": [1, 3], "c": [4]}


def test_a_group_is_informative_only_when_its_scores_differ() -> None:
    uids = ["all_right"] * 3 + ["all_wrong"] * 3 + ["mixed"] * 3 + ["alone"]
    scores = torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.7])
    verdicts = informative_groups(uids, scores)
    assert verdicts == {"all_right": False, "all_wrong": False, "mixed": True, "alone": False}
    # 3 of the 4 groups carry no group-relative signal.
    assert all_equal_fraction(uids, scores) == pytest.approx(3 / 4)


def test_float_noise_is_equal_but_a_real_difference_is_not() -> None:
    uids = ["g", "g", "h", "h"]
    scores = torch.tensor([1.0, 1.0 - 1e-8, 0.5, 0.5 - 1e-3])
    assert informative_groups(uids, scores) == {"g": False, "h": True}


def test_no_rows_and_mismatched_lengths() -> None:
    assert informative_groups([], torch.zeros(0)) == {}
    assert all_equal_fraction([], torch.zeros(0)) == 0.0
    with pytest.raises(ValueError, match="3 group ids for 2 scores"):
        informative_groups(["a", "a", "b"], torch.zeros(2))
