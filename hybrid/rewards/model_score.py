"""How a reward model's score joins the rule reward, per data source (pure: no model here).

Each row's data source picks `sum` (rule + coef x model score) or `replace` (coef x model score
alone) from reward.model.combine_by_source, else reward.model.combine. A `sum` row must have a
rule score; a `replace` row is rule-scored only where a rule reward exists for it, and then
only for the report (`reward/rule_mean`: what the model's scores are worth against the rule).

Shapes: rule, model, combined (b,) float32; rule is NaN where a row has no rule score.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Literal, get_args

import torch

Combine = Literal["sum", "replace"]
COMBINE_CHOICES: tuple[Combine, ...] = get_args(Combine)


def combine_modes(
    data_sources: Sequence[str], default: Combine, by_source: Mapping[str, Combine]
) -> list[Combine]:
    """Each row's mode: its data source's entry in `by_source`, else `default`."""
    return [by_source.get(str(source), default) for source in data_sources]


def rule_rows(
    data_sources: Sequence[str], modes: Sequence[Combine], has_rule: Callable[[str], bool]
) -> list[int]:
    """The rows the rule reward scores: every `sum` row, and each `replace` row whose data
    source has a rule reward (`has_rule`)."""
    return [
        row
        for row, (source, mode) in enumerate(zip(data_sources, modes, strict=True))
        if mode == "sum" or has_rule(str(source))
    ]


def scatter_rule_scores(num_rows: int, rows: Sequence[int], scores: torch.Tensor) -> torch.Tensor:
    """(num_rows,) with `scores` at `rows` and NaN elsewhere (no rule score)."""
    full = torch.full((num_rows,), float("nan"), dtype=torch.float32)
    if rows:
        full[torch.tensor(list(rows), dtype=torch.long)] = scores.float()
    return full


def combine_scores(
    rule: torch.Tensor, model: torch.Tensor, modes: Sequence[Combine], coef: float
) -> torch.Tensor:
    """(b,) rewards: rule + coef * model on `sum` rows, coef * model on `replace` rows."""
    if not (rule.shape == model.shape == (len(modes),)):
        raise ValueError(
            f"combine_scores: rule {tuple(rule.shape)}, model {tuple(model.shape)} and "
            f"{len(modes)} modes must all have one entry per row"
        )
    unknown = sorted({mode for mode in modes} - set(COMBINE_CHOICES))
    if unknown:
        raise ValueError(f"combine modes must be in {list(COMBINE_CHOICES)}, got {unknown}")
    summed = torch.tensor([mode == "sum" for mode in modes], dtype=torch.bool)
    missing = (summed & rule.isnan()).nonzero().flatten().tolist()
    if missing:
        raise ValueError(f"rows {missing} combine by sum but have no rule score")
    scaled = coef * model.float()
    return torch.where(summed, rule.float() + scaled, scaled)


def combined_metrics(
    rule: torch.Tensor, model: torch.Tensor, combined: torch.Tensor, truncated: torch.Tensor
) -> dict[str, float]:
    """reward/mean, max, min of the combined rewards; the model's raw mean (before coef);
    the rule mean over the rows that have one; how many rows the model saw truncated."""
    metrics = {
        "reward/mean": float(combined.mean()),
        "reward/max": float(combined.max()),
        "reward/min": float(combined.min()),
        "reward/model_mean": float(model.float().mean()),
        "reward/model_truncated": float(truncated.sum()),
    }
    scored = rule[~rule.isnan()]
    if scored.numel():
        metrics["reward/rule_mean"] = float(scored.mean())
    return metrics
