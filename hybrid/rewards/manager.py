"""`RewardManager`: one scalar reward per row of a `Batch`, plus `reward/` metrics.

Reads the non-tensor columns `response_text`, `data_source`, `ground_truth` and, if present,
`extra_info`. A row whose reward function raises (or returns a non-finite or non-numeric
score) scores 0.0 and the run goes on; such rows are counted in `reward/errors`, and the first
traceback of each `score` call is logged once, naming the row and its data_source.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from numbers import Real
from typing import Any

import torch

from hybrid.data import Batch
from hybrid.rewards.registry import RewardFn, compute_score

logger = logging.getLogger(__name__)

REQUIRED_COLUMNS = ("response_text", "data_source", "ground_truth")


class RewardManager:
    """Scores batches with `reward_fn` (verl's compute_score signature; built-ins by default)."""

    def __init__(self, reward_fn: RewardFn | None = None) -> None:
        self.reward_fn: RewardFn = compute_score if reward_fn is None else reward_fn

    def score(self, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        """Returns (scores (batch,) float32, metrics with reward/mean, max, min, errors, ...)."""
        missing = [key for key in REQUIRED_COLUMNS if key not in batch.non_tensors]
        if missing:
            raise KeyError(
                f"reward needs non-tensor columns {missing}; "
                f"batch has tensors {list(batch.tensors)} and non-tensors {list(batch.non_tensors)}"
            )
        columns = batch.non_tensors
        extra_infos = columns.get("extra_info")
        values = [0.0] * len(batch)
        extras: defaultdict[str, list[float]] = defaultdict(list)
        num_errors = 0
        for row in range(len(batch)):
            data_source = str(columns["data_source"][row])
            try:
                result = self.reward_fn(
                    data_source,
                    str(columns["response_text"][row]),
                    columns["ground_truth"][row],
                    None if extra_infos is None else extra_infos[row],
                )
                values[row] = _scalar(result)
            except Exception:
                if num_errors == 0:
                    logger.error(
                        "reward function raised on row %d (data_source=%r); the row scores 0.0 "
                        "and the rest of the batch is still scored (see reward/errors)",
                        row,
                        data_source,
                        exc_info=True,
                    )
                num_errors += 1
                continue
            if isinstance(result, dict):
                for key, value in result.items():
                    if key != "score" and isinstance(value, Real):
                        extras[key].append(float(value))
        scores = torch.tensor(values, dtype=torch.float32)  # (batch,)
        metrics = {f"reward/{key}": sum(vs) / len(vs) for key, vs in extras.items()}
        metrics.update(_summary(scores, num_errors))  # a dict key "mean" cannot mask reward/mean
        return scores, metrics


def _scalar(result: float | dict[str, Any]) -> float:
    if isinstance(result, dict):
        if "score" not in result:
            raise KeyError(f"reward dict has no 'score' key; keys: {sorted(result)}")
        result = result["score"]
    if not isinstance(result, Real):
        raise TypeError(
            f"reward must be a number or a dict with 'score', got {type(result).__name__}"
        )
    value = float(result)
    if not math.isfinite(value):
        raise ValueError(f"reward is not finite: {value}")
    return value


def _summary(scores: torch.Tensor, num_errors: int) -> dict[str, float]:
    if scores.numel() == 0:
        stats = {"mean": math.nan, "max": math.nan, "min": math.nan}
    else:
        stats = {
            "mean": scores.mean().item(),
            "max": scores.max().item(),
            "min": scores.min().item(),
        }
    stats["errors"] = float(num_errors)
    return {f"reward/{key}": value for key, value in stats.items()}
