"""One train step, the same in every mode: score a batch, then update the critic and the actor.

Scoring: the rewards on the driver while the workers compute the reference log-probs, the old
log-probs (unless the update is on-policy: its own first pass gives them) and the critic's
values; then token rewards (with the in-reward KL penalty when it is on) and the advantages of
algorithm.adv_estimator. Update: the critic, then the mini-batched actor update (after
trainer.critic_warmup steps), on rows balanced across the training workers.

Every token carries the weight version that sampled it; `trained_on` is the version the actor
last published. Colocated samples all lag 0; split and fully-async samples may lag up to the
source's bound, and a lag beyond it means the schedule broke. Tokens of version `trained_on` are
*fresh* (the actor must give them the engine's log-probs: the sync check) only while the actor
still holds exactly those weights: in the first update after a publish, not in the later ones of
a step that trains several batches under one version (fully_async's
trigger_parameter_sync_step > 1). The metrics dict has the same keys in
every mode (STEP_KEYS, tested), so a dashboard reads every run alike.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from hybrid.algorithms.distill import distill_metrics, mix_with_task, reverse_kl_advantages
from hybrid.algorithms.estimators import compute_advantages
from hybrid.algorithms.gae import token_level_rewards
from hybrid.algorithms.group_filter import all_equal_fraction
from hybrid.algorithms.kl_control import KLController, kl_in_reward
from hybrid.algorithms.logprob import masked_mean
from hybrid.algorithms.off_policy import (
    mask_stale_tokens,
    mismatch_stats,
    version_lag,
    version_stats,
)
from hybrid.algorithms.value_loss import explained_variance
from hybrid.controller import WorkerGroupView
from hybrid.data import Batch
from hybrid.rewards.manager import RewardManager, Scores
from hybrid.rewards.overlong import shape_overlong
from hybrid.rollout.agent.stats import COUNTED, agent_metrics
from hybrid.rollout.base import response_budgets
from hybrid.trainer.balance import balanced_order
from hybrid.trainer.config import TrainerRunConfig
from hybrid.trainer.judge import Judge
from hybrid.trainer.metrics import reduce_over_ranks
from hybrid.trainer.model_rewards import submit_rewards

STEP_KEYS = frozenset(
    {
        "reward/mean",
        "critic/advantages/mean",
        "actor/kl_loss",
        "rollout/logprob_diff_mean",
        "rollout/logprob_diff_max",
        "rollout/fresh_tokens",
        "sample/version_lag_mean",
        "sample/version_lag_max",
        "sync/version",
        "sync/version_lag_mean",
        "sync/version_lag_max",
        "response_length/mean",
        "response_length/max",
        "perf/tokens",
        "timing_s/ref",
        "timing_s/old_log_prob",
        "timing_s/reward",
        "timing_s/scoring",
        "timing_s/update_actor",
    }
)
"""Keys every step reports whatever the mode (a test runs each mode and compares)."""

WORKER_PASS_TIMES = ("timing_s/ref", "timing_s/old_log_prob", "timing_s/values")
"""The trainer-side workers' pass times, as their ledgers recorded them."""


def masked_abs_stats(values: torch.Tensor, mask: torch.Tensor) -> tuple[float, float]:
    """(mean, max) of |values| over mask; (0, 0) for an empty mask."""
    picked = values.abs()[mask.bool()]
    return (float(picked.mean()), float(picked.max())) if picked.numel() else (0.0, 0.0)


@dataclass
class Members:
    """The worker-group views a step talks to (which groups they live in is the mode's
    business: hybrid/trainer/placement.py)."""

    actor: WorkerGroupView
    """The FSDP actor: old log-probs, the update, the workers' metrics."""
    reference: WorkerGroupView
    """Reference log-probs: the reference member, or with LoRA the actor's own base."""
    critic: WorkerGroupView | None
    training_workers: int
    """Ranks the actor's batch is split over (for balancing and throughput)."""
    reward_model: WorkerGroupView | None = None
    """The reward model's scores (reward.model.path set), else None."""
    judge: Judge | None = None
    """The generative judge on the rollout engines (reward.judge.template_path set), else None."""
    teacher: WorkerGroupView | None = None
    """The distillation teacher's log-probs (distill.teacher_path set), else None."""


@dataclass
class StepResult:
    batch: Batch
    """The scored batch (before any stale-token masking): probes are cut from it."""
    metrics: dict[str, float]
    worker: dict[str, float]
    """What the actor-side workers recorded since the last step (their timings and memory),
    for the rollout source and the weight publisher to pick their figures from."""


class TrainStep:
    def __init__(
        self,
        config: TrainerRunConfig,
        members: Members,
        rewards: RewardManager,
        kl_ctrl: KLController | None,
    ) -> None:
        self.config = config
        self.members = members
        self.rewards = rewards
        self.kl_ctrl = kl_ctrl

    def __call__(
        self,
        rollout: Batch,
        step: int,
        trained_on: int,
        lag_bound: int,
        actor_moved: bool = False,
        rewards: Scores | None = None,
        probe_rows: int = 0,
        on_probes: Callable[[Batch], None] | None = None,
    ) -> StepResult:
        """Score `rollout` and update on it. `trained_on`: the version the actor last published;
        `lag_bound`: the most versions a token may lag (0 colocated); `actor_moved`: the actor
        has updated since that publish (no token is fresh then); `rewards`: its rule rewards
        when the source started them already; `probe_rows`: the first rows to hand to
        `on_probes`, with the actor's log-probs under `trained_on` (`old_log_probs`), as soon
        as they are scored (before the update)."""
        c = self.config
        mask, versions = rollout.tensors["response_mask"], rollout.tensors["versions"]
        lag = version_lag(versions, mask, trained_on)[mask.bool()]
        if lag.numel() and int(lag.max()) > lag_bound:
            raise RuntimeError(
                f"step {step}: a sample lags {int(lag.max())} versions, more than the "
                f"bound ({lag_bound}): the schedule is broken"
            )
        # Tokens sampled by the weights the actor holds: their log-probs must match its own.
        fresh = mask * (versions == trained_on)
        if actor_moved:
            fresh = torch.zeros_like(fresh)
        probe_pass = None
        if c.on_policy_update:  # the update's own first pass checks them
            rollout = rollout.union(Batch.from_dict({"fresh_mask": fresh}))
            if probe_rows:
                # No old-log-prob pass over the batch: only the probe rows get one, queued
                # on the actor ahead of the update, so it runs under `trained_on`.
                probe_pass = self.members.actor.compute_log_prob.submit(rollout[:probe_rows])
        rollout, metrics = self.score(rollout, rewards)
        if probe_rows and on_probes is not None:
            # Handed over before the update: an explorer can score them while it trains.
            if probe_pass is not None:
                on_probes(rollout[:probe_rows].union(probe_pass.get()))
            elif "old_log_probs" in rollout:
                on_probes(rollout[:probe_rows])

        trained = rollout
        if c.algorithm.off_policy_correction == "mask":
            kept = mask_stale_tokens(mask, versions, trained_on, c.algorithm.mask_version_lag)
            trained = Batch(
                dict(rollout.tensors, response_mask=kept), rollout.non_tensors, rollout.meta
            )
            metrics["actor/masked_stale_tokens"] = float((mask - kept).sum())
        order = balanced_order(trained["attention_mask"].sum(-1), self.members.training_workers)
        update, worker = self.update(trained[order], step)
        t = rollout.tensors
        if "old_log_probs" in t:  # else the update's own pass reported the sync check
            diff_mean, diff_max = masked_abs_stats(
                t["rollout_log_probs"] - t["old_log_probs"], fresh
            )
            update["rollout/logprob_diff_mean"] = diff_mean
            update["rollout/logprob_diff_max"] = diff_max
            update["actor/entropy_old"] = float(masked_mean(t["entropys"], mask))
            # The same fresh tokens: k3 KL(rollout || trainer), ratio quantiles and the tokens
            # beyond algorithm.importance_cap, reported whatever the correction.
            update.update(
                mismatch_stats(
                    t["old_log_probs"],
                    t["rollout_log_probs"],
                    fresh,
                    {"cap": c.algorithm.importance_cap},
                )
            )
        metrics.update(update)
        metrics.update({k: v for k, v in worker.items() if k.startswith("memory/")})
        for key in WORKER_PASS_TIMES:
            if key != "timing_s/values" or self.members.critic is not None:
                metrics[key] = worker.get(key, 0.0)
        if self.members.teacher is not None:
            metrics["timing_s/teacher"] = worker.get("timing_s/teacher", 0.0)
        metrics.update(version_stats(versions, mask, trained_on))
        lengths = mask.sum(-1)
        metrics.update(
            {
                "rollout/fresh_tokens": float(fresh.sum()),
                "sync/version": float(trained_on),
                "sync/version_lag_mean": metrics["sample/version_lag_mean"],
                "sync/version_lag_max": metrics["sample/version_lag_max"],
                "response_length/mean": float(lengths.float().mean()),
                "response_length/max": float(lengths.max()),
                "perf/tokens": float(rollout["attention_mask"].sum()),
            }
        )
        if "agent_stats" in rollout:
            metrics.update(agent_metrics(list(rollout["agent_stats"])))
        # Without a KL loss (or during the critic's warm-up) the update reports none.
        metrics.setdefault("actor/kl_loss", 0.0)
        metrics.setdefault("rollout/logprob_diff_mean", 0.0)
        metrics.setdefault("rollout/logprob_diff_max", 0.0)
        return StepResult(rollout, metrics, worker)

    # --- scoring ----------------------------------------------------------------------------

    def score(
        self, rollout: Batch, started_rewards: Scores | None = None
    ) -> tuple[Batch, dict[str, float]]:
        """The rewards (in the reward processes; the reward model's pass queued first on the
        workers) overlap the workers' other passes. `started_rewards`: the rule rewards a
        source started as the rows arrived (timing_s/reward is then only what is left)."""
        c, m = self.config, self.members
        started = time.perf_counter()
        rewards = (
            submit_rewards(c.reward, self.rewards, m.reward_model, rollout, m.judge)
            if started_rewards is None
            else started_rewards
        )
        futures = [
            m.reference.compute_ref_log_prob.submit(rollout) if c.needs_reference else None,
            None if c.on_policy_update else m.actor.compute_log_prob.submit(rollout),
            m.critic.compute_values.submit(rollout) if m.critic is not None else None,
            m.teacher.compute_teacher_log_prob.submit(rollout) if m.teacher is not None else None,
        ]
        scores, metrics = rewards.result()
        # 0 under dynamic sampling (unless a short batch was backfilled); else the share of the
        # step that teaches a group baseline nothing.
        metrics["reward/all_equal_groups"] = all_equal_fraction(list(rollout["uid"]), scores)
        if c.reward.overlong_buffer.enable:
            # DAPO's length penalty joins the score the advantages see; reward/mean stays the
            # reward function's (docs/algorithms.md, "Overlong shaping (DAPO)").
            infos = rollout.non_tensors.get("extra_info")
            budgets = response_budgets(
                None if infos is None else list(infos),
                list(rollout["uid"]),
                c.rollout.response_length,
            )
            penalties, overlong_metrics = shape_overlong(rollout, budgets, c.reward.overlong_buffer)
            scores = scores + penalties
            metrics.update(overlong_metrics)
        metrics["timing_s/reward"] = time.perf_counter() - started
        for future in futures:
            if future is not None:
                rollout = rollout.union(future.get())
        rollout, advantage_metrics = self.add_advantages(rollout, scores)
        metrics.update(advantage_metrics)
        metrics["timing_s/scoring"] = time.perf_counter() - started
        return rollout, metrics

    def add_advantages(
        self, rollout: Batch, scores: torch.Tensor
    ) -> tuple[Batch, dict[str, float]]:
        """Token rewards (the in-reward KL penalty applied when it is on), then the advantages
        of algorithm.adv_estimator (and the critic's returns); their metrics."""
        a, t = self.config.algorithm, rollout.tensors
        mask = t["response_mask"]
        metrics: dict[str, float] = {}
        if self.kl_ctrl is None:
            rewards = token_level_rewards(scores, mask)
        else:
            kl, current_kl = kl_in_reward(t["old_log_probs"], t["ref_log_prob"], mask, a.kl_penalty)
            rewards = token_level_rewards(scores, mask, kl, self.kl_ctrl.value)
            metrics = {"critic/kl": current_kl, "critic/kl_coeff": self.kl_ctrl.value}
            self.kl_ctrl.update(current_kl, len(rollout))
        if "env_rewards" in t:  # an environment's per-turn rewards, at each turn's end
            rewards = rewards + t["env_rewards"] * mask
        values = t["values"] if self.members.critic is not None else None
        found = compute_advantages(
            a.adv_estimator,
            rewards,
            mask,
            rollout["uid"],
            values=values,
            gamma=a.gamma,
            lam=a.lam,
            norm_adv_by_std=a.norm_adv_by_std,
        )
        added = {"token_level_scores": scores, "token_level_rewards": rewards}
        advantages = found.advantages
        if self.members.teacher is not None:  # on-policy distillation (docs/algorithms.md)
            d = self.config.distill
            student, teacher = t["rollout_log_probs"], t["teacher_log_prob"]
            distilled = reverse_kl_advantages(student, teacher, mask, d.coef)
            advantages = mix_with_task(distilled, advantages, mask, d.reward_coef)
            metrics.update(distill_metrics(student, teacher, mask, distilled))
        added["advantages"] = advantages
        if found.returns is not None and values is not None:
            added["returns"] = found.returns
            metrics.update(
                {
                    "critic/values/mean": float(masked_mean(values, mask)),
                    "critic/returns/mean": float(masked_mean(found.returns, mask)),
                    "critic/vf_explained_var": explained_variance(found.returns, values, mask),
                }
            )
        per_token = advantages if advantages.dim() == 2 else advantages[:, None].expand_as(mask)
        metrics["critic/advantages/mean"] = float(masked_mean(per_token, mask))
        return rollout.union(Batch.from_dict(added)), metrics

    # --- update -----------------------------------------------------------------------------

    def update(self, batch: Batch, step: int) -> tuple[dict[str, float], dict[str, float]]:
        """The critic's update, then the actor's (none during the critic's warm-up); the
        update metrics and the workers' recorded metrics. pop_metrics is queued right behind
        the update (a Ray actor runs one caller's calls in order): no round trip of its own."""
        m = self.members
        metrics: dict[str, float] = {}
        if m.critic is not None:
            started = time.perf_counter()
            metrics.update(reduce_over_ranks(m.critic.update_critic(batch)))
            metrics["timing_s/update_critic"] = time.perf_counter() - started
        started = time.perf_counter()
        update = None
        if step > self.config.trainer.critic_warmup:
            update = m.actor.update_actor.submit(batch)
        worker = m.actor.pop_metrics.submit()
        if update is not None:
            metrics.update(reduce_over_ranks(update.get()))
        metrics["timing_s/update_actor"] = time.perf_counter() - started
        return metrics, reduce_over_ranks(worker.get())


def merge_updates(parts: list[dict[str, float]]) -> dict[str, float]:
    """One train step's metrics from its updates (fully_async may take several per step, each
    of the same number of rows): sums for counts and seconds, maxima for maxima, means for the
    rest, each over the updates that report the key (a worker records a publish only in the
    update after it); a mean over counted items is weighted by its count (WEIGHTED_BY)."""
    merged: dict[str, float] = {}
    for key in dict.fromkeys(key for part in parts for key in part):
        values = [part[key] for part in parts if key in part]
        weight_key = WEIGHTED_BY.get(key)
        weights = [part.get(weight_key, 0.0) for part in parts if key in part] if weight_key else []
        if sum(weights) > 0:
            merged[key] = sum(v * w for v, w in zip(values, weights, strict=True)) / sum(weights)
        elif key.endswith("_max") or key.endswith("/max"):
            merged[key] = max(values)
        elif key.endswith("_min") or key.endswith("/min"):
            merged[key] = min(values)
        elif key.startswith(("timing_s/", *COUNTED)) or key in SUMMED:
            merged[key] = sum(values)
        else:
            merged[key] = sum(values) / len(values)
    return merged


SUMMED = frozenset({"perf/tokens", "rollout/fresh_tokens", "actor/masked_stale_tokens"})
WEIGHTED_BY = {
    key: "rollout/fresh_tokens"
    for key in (
        "rollout/logprob_diff_mean",
        "rollout/mismatch_k3",
        "rollout/ratio_above_cap",
        "rollout/ratio_below_cap",
    )
}
"""Means over a counted subset: an update with none of it (0 fresh tokens) adds nothing."""
