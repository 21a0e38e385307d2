"""How a reward model's score joins the rule reward: per data source, sum or replace."""

from __future__ import annotations

import math

import pytest
import torch

from hybrid.rewards.model_score import (
    combine_modes,
    combine_scores,
    combined_metrics,
    rule_rows,
    scatter_rule_scores,
)

pytestmark = pytest.mark.unit

NAN = float("nan")


def test_each_source_takes_its_override_else_the_default() -> None:
    sources = ["gsm8k", "chat", "math", "chat"]
    modes = combine_modes(sources, "sum", {"chat": "replace", "unused": "replace"})
    assert modes == ["sum", "replace", "sum", "replace"]
    assert combine_modes(sources, "replace", {}) == ["replace"] * 4


def test_sum_adds_the_scaled_model_score_and_replace_drops_the_rule() -> None:
    rule = torch.tensor([1.0, 0.0, NAN, 0.5])
    model = torch.tensor([0.5, -2.0, 3.0, 1.0])
    combined = combine_scores(rule, model, ["sum", "sum", "replace", "replace"], coef=2.0)
    assert combined.tolist() == [2.0, -4.0, 6.0, 2.0]
    assert combined.dtype == torch.float32


def test_a_sum_row_without_a_rule_score_is_refused() -> None:
    with pytest.raises(ValueError, match=r"rows \[1\] combine by sum but have no rule score"):
        combine_scores(torch.tensor([1.0, NAN]), torch.zeros(2), ["sum", "sum"], 1.0)


def test_shapes_and_modes_are_checked() -> None:
    with pytest.raises(ValueError, match="one entry per row"):
        combine_scores(torch.zeros(2), torch.zeros(3), ["sum", "sum"], 1.0)
    with pytest.raises(ValueError, match=r"combine modes must be in .*'max'"):
        combine_scores(torch.zeros(1), torch.zeros(1), ["max"], 1.0)  # type: ignore[list-item]


def test_replace_rows_are_rule_scored_only_where_a_rule_exists() -> None:
    sources = ["gsm8k", "chat", "gsm8k", "chat"]
    modes = combine_modes(sources, "replace", {"gsm8k": "sum"})
    assert rule_rows(sources, modes, lambda source: source == "gsm8k") == [0, 2]
    # Without any rule reward a sum row is still listed: combine_scores then names it.
    assert rule_rows(sources, ["sum"] * 4, lambda source: False) == [0, 1, 2, 3]
    full = scatter_rule_scores(4, [0, 2], torch.tensor([1.0, 0.0]))
    assert full[0] == 1.0 and full[2] == 0.0 and full[1].isnan() and full[3].isnan()
    assert scatter_rule_scores(2, [], torch.zeros(0)).isnan().all()


def test_metrics_describe_the_combined_reward_and_its_parts() -> None:
    rule = torch.tensor([1.0, NAN, 0.0])
    model = torch.tensor([0.5, 1.5, -0.5])
    combined = combine_scores(rule, model, ["sum", "replace", "sum"], 1.0)
    metrics = combined_metrics(rule, model, combined, torch.tensor([0.0, 1.0, 1.0]))
    assert metrics["reward/mean"] == pytest.approx(float(combined.mean()))
    assert metrics["reward/max"] == 1.5 and metrics["reward/min"] == -0.5
    assert metrics["reward/model_mean"] == pytest.approx(0.5)
    assert metrics["reward/rule_mean"] == pytest.approx(0.5)  # the two rows that have one
    assert metrics["reward/model_truncated"] == 2.0
    no_rule = combined_metrics(torch.tensor([NAN]), model[:1], model[:1], torch.zeros(1))
    assert "reward/rule_mean" not in no_rule and not math.isnan(no_rule["reward/mean"])
