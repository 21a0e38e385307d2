"""A batch's rewards: the rule rewards (in the reward processes) and, with reward.model.path
set, the reward model's scores (on the workers), combined per data source.

`submit_rewards` starts both and returns at once, so the train step overlaps them with the
workers' other passes; the reward model's pass is queued first on the workers, so the time to
its result is its own (`timing_s/reward_model`). Validation combines the same way. Without a
reward model this is the rule rewards alone, their metrics unchanged.

A generative judge (reward.judge, hybrid/trainer/judge.py) joins the same way in place of a
reward model (a run has at most one of the two): its pass is queued first on the engines, its
scores combine per data source by reward.judge.combine, and a row whose answer was unparsable
scores reward.error_score (reward/errors, reward/errors/unparsable) under on_error=score.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future

import torch

from hybrid.controller import WorkerGroupView
from hybrid.data import Batch
from hybrid.rewards.config import RewardConfig, RewardModelConfig
from hybrid.rewards.judge import UNPARSABLE, combine_judged, judged_metrics
from hybrid.rewards.manager import RewardManager
from hybrid.rewards.model_score import (
    Combine,
    combine_modes,
    combine_scores,
    combined_metrics,
    rule_rows,
    scatter_rule_scores,
)
from hybrid.rewards.registry import BUILTIN_REWARDS
from hybrid.trainer.judge import Judge, Judged

RuleResult = Future[tuple[torch.Tensor, dict[str, float]]]
RULE_SUMMARY = ("reward/mean", "reward/max", "reward/min")
"""The rule rewards' own summary: with a reward model these describe the combined reward."""


class PendingRewards:
    """The rewards of one batch, being computed; `result()` waits for them."""

    def __init__(
        self,
        rows: int,
        rule: RuleResult | None,
        rule_at: list[int],
        model: Callable[[], Batch] | None,
        config: RewardModelConfig,
        modes: list[Combine],
        started: float,
        judged: Callable[[], Judged] | None = None,
        reward: RewardConfig | None = None,
    ) -> None:
        self.rows, self.rule, self.rule_at, self.model = rows, rule, rule_at, model
        self.config, self.modes, self.started = config, modes, started
        self.judged, self.reward = judged, reward
        """The judge's verdict (instead of `model`) and the reward settings it combines by."""
        self.rule_scores: torch.Tensor | None = None
        """After `result()`: each row's rule score, NaN where it has none."""

    def result(self) -> tuple[torch.Tensor, dict[str, float]]:
        """(scores (b,) float32, reward/ metrics)."""
        if self.judged is not None:
            return self.judge_result(self.judged)
        if self.model is None:
            assert self.rule is not None
            scores, metrics = self.rule.result()
            self.rule_scores = scores
            return scores, metrics
        scored = self.model()
        model_seconds = time.perf_counter() - self.started
        rule_metrics: dict[str, float] = {}
        rule_scores = torch.zeros(0)
        if self.rule is not None:
            rule_scores, rule_metrics = self.rule.result()
        rule = self.rule_scores = scatter_rule_scores(self.rows, self.rule_at, rule_scores)
        model, truncated = scored.tensors["rm_scores"].float(), scored.tensors["rm_truncated"]
        combined = combine_scores(rule, model, self.modes, self.config.coef)
        metrics = {k: v for k, v in rule_metrics.items() if k not in RULE_SUMMARY}
        metrics.update(combined_metrics(rule, model, combined, truncated))
        metrics["timing_s/reward_model"] = model_seconds
        return combined, metrics

    def judge_result(self, judged: Callable[[], Judged]) -> tuple[torch.Tensor, dict[str, float]]:
        """The judge's scores combined with the rule rewards; an unparsable row scores
        reward.error_score and counts among reward/errors."""
        assert self.reward is not None
        verdict = judged()
        rule_metrics: dict[str, float] = {}
        rule_scores = torch.zeros(0)
        if self.rule is not None:
            rule_scores, rule_metrics = self.rule.result()
        rule = self.rule_scores = scatter_rule_scores(self.rows, self.rule_at, rule_scores)
        judge, coef = verdict.scores, self.reward.judge.coef
        combined = combine_judged(rule, judge, self.modes, coef, self.reward.error_score)
        metrics = {k: v for k, v in rule_metrics.items() if k not in RULE_SUMMARY}
        metrics.update(judged_metrics(rule, judge, combined, verdict.truncated))
        unparsable = metrics["reward/judge_unparsable"]
        metrics["reward/errors"] = metrics.get("reward/errors", 0.0) + unparsable
        metrics[f"reward/errors/{UNPARSABLE}"] = unparsable
        metrics["timing_s/judge"] = verdict.seconds
        return combined, metrics


def has_rule_reward(reward: RewardConfig, data_source: str) -> bool:
    """A rule reward exists for `data_source`: a custom function takes every row, else the
    built-in of that name."""
    return reward.custom_path is not None or data_source in BUILTIN_REWARDS


def submit_rewards(
    reward: RewardConfig,
    rules: RewardManager,
    reward_model: WorkerGroupView | None,
    batch: Batch,
    judge: Judge | None = None,
) -> PendingRewards:
    """Start the rewards of `batch`: the rule rewards of the rows that have one (for a
    `replace` row only reported), the reward model's (or the judge's) scores of every row."""
    started = time.perf_counter()
    config = reward.model
    if reward.judge.enabled:
        if judge is None:
            raise RuntimeError("reward.judge.template_path is set but no judge was started")
        sources = [str(s) for s in batch.non_tensors["data_source"]]
        by_source = reward.judge.combine_by_source or {}
        modes = combine_modes(sources, reward.judge.combine, by_source)
        judged = judge.submit(batch)  # queued on the engines before the rule rewards start
        at = rule_rows(sources, modes, lambda source: has_rule_reward(reward, source))
        rule = rules.submit(batch if len(at) == len(batch) else batch[at]) if at else None
        return PendingRewards(
            len(batch), rule, at, None, config, modes, started, judged=judged, reward=reward
        )
    if not config.enabled:
        return PendingRewards(len(batch), rules.submit(batch), [], None, config, [], started)
    if reward_model is None:
        raise RuntimeError("reward.model.path is set but no reward model member was started")
    sources = [str(s) for s in batch.non_tensors["data_source"]]
    modes = combine_modes(sources, config.combine, config.combine_by_source or {})
    scored = reward_model.compute_rm_score.submit(batch)
    at = rule_rows(sources, modes, lambda source: has_rule_reward(reward, source))
    rule = rules.submit(batch if len(at) == len(batch) else batch[at]) if at else None
    return PendingRewards(len(batch), rule, at, scored.get, config, modes, started)
