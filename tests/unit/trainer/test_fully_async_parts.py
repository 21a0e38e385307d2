"""The fully-async driver's pure parts: one train step's metrics from its updates."""

from __future__ import annotations

import pytest

from hybrid.trainer.step import merge_updates

pytestmark = pytest.mark.unit


def test_merge_updates_sums_counts_and_seconds_and_keeps_maxima() -> None:
    parts = [
        {
            "reward/mean": 0.25,
            "sample/version_lag_max": 1.0,
            "response_length/max": 8.0,
            "timing_s/update_actor": 0.5,
            "perf/tokens": 100.0,
            "rollout/fresh_tokens": 10.0,
        },
        {
            "reward/mean": 0.75,
            "sample/version_lag_max": 2.0,
            "response_length/max": 5.0,
            "timing_s/update_actor": 0.25,
            "perf/tokens": 60.0,
            "rollout/fresh_tokens": 0.0,
        },
    ]
    assert merge_updates(parts) == {
        "reward/mean": 0.5,
        "sample/version_lag_max": 2.0,
        "response_length/max": 8.0,
        "timing_s/update_actor": 0.75,
        "perf/tokens": 160.0,
        "rollout/fresh_tokens": 10.0,
    }


def test_a_key_only_some_updates_report_is_merged_over_those() -> None:
    """A worker records a publish only in the update after it: no KeyError, and the key's
    figure comes from the updates that have it."""
    parts = [
        {"timing_s/publish": 0.4, "memory/peak_gib": 1.0},
        {"memory/peak_gib": 3.0},
    ]
    assert merge_updates(parts) == {"timing_s/publish": 0.4, "memory/peak_gib": 2.0}


def test_the_log_prob_gap_is_averaged_over_fresh_tokens_only() -> None:
    """An update after the actor moved has no fresh tokens: its zero gap must not dilute the
    step's mean; the maximum is the largest over the updates."""
    parts = [
        {"rollout/fresh_tokens": 30.0, "rollout/logprob_diff_mean": 0.02, "rollout/logprob_diff_max": 0.04},
        {"rollout/fresh_tokens": 0.0, "rollout/logprob_diff_mean": 0.0, "rollout/logprob_diff_max": 0.0},
        {"rollout/fresh_tokens": 10.0, "rollout/logprob_diff_mean": 0.06, "rollout/logprob_diff_max": 0.09},
    ]  # fmt: skip
    merged = merge_updates(parts)
    assert merged["rollout/logprob_diff_mean"] == pytest.approx((30 * 0.02 + 10 * 0.06) / 40)
    assert merged["rollout/logprob_diff_max"] == 0.09
    assert merged["rollout/fresh_tokens"] == 40.0
    none_fresh = [dict(part, **{"rollout/fresh_tokens": 0.0}) for part in parts]
    assert merge_updates(none_fresh)["rollout/logprob_diff_mean"] == pytest.approx(0.08 / 3)
