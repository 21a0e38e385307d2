"""What a run's config implies and no user sets: sizes (rows per step, rows per optimizer step
on each rank, groups per update), the members it needs (a critic, a reference), whether an
update is on-policy, and what the workers receive (`worker_spec`, `worker_config`).

Pure functions of a validated `TrainerRunConfig` (hybrid.trainer.config, whose properties of
the same names read them). The cross-field rules (hybrid.trainer.config_rules) read them too,
so a size is computed in one place; a rule that divides by one checks its divisor first.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from hybrid.sharding.config import ScheduleConfig
from hybrid.synchronizer.policy import SyncPolicy
from hybrid.workers.config import CriticModelConfig, HybridWorkerConfig, WorkerSpec

if TYPE_CHECKING:
    from hybrid.trainer.config import TrainerRunConfig


def sync_policy(sync: ScheduleConfig) -> SyncPolicy:
    """The split placement's schedule from the sync group (its rules checked there)."""
    return SyncPolicy(
        style=sync.style,
        interval=sync.interval,
        offset=sync.offset,
        explorer_steps=sync.explorer_steps,
        max_staleness=sync.max_staleness,
    )


def use_critic(config: TrainerRunConfig) -> bool:
    return config.algorithm.adv_estimator == "gae"


def needs_reference(config: TrainerRunConfig) -> bool:
    """The reference's log-probs serve the KL loss and the KL penalty in the reward."""
    return config.actor.use_kl_loss or config.algorithm.use_kl_in_reward


def training_workers_field(config: TrainerRunConfig) -> str:
    """The field(s) a user sets the trainer's data-parallel slots with, for error messages."""
    field_name = "trainer.num_trainer_workers" if config.trainer.split else "trainer.num_workers"
    return field_name if config.actor.sp_size == 1 else f"{field_name} / actor.sp_size"


def data_parallel_workers(config: TrainerRunConfig) -> int:
    """The trainer's data-parallel slots: its workers, or their sp groups with sequence
    parallelism (the sp ranks of a slot split its sequences, not its rows)."""
    return config.trainer.training_workers // config.actor.sp_size


def rows_per_step(config: TrainerRunConfig) -> int:
    """Samples per step: prompts x rollout.n."""
    return config.data.train_batch_size * config.rollout.n


def groups_per_update(config: TrainerRunConfig) -> int:
    """fully_async: prompt groups the trainer takes for one update."""
    return config.fully_async.require_batches * config.algorithm.ppo_mini_batch_size


def groups_per_version(config: TrainerRunConfig) -> int:
    """fully_async: prompt groups trained with one weight version (one train step)."""
    return config.fully_async.trigger_parameter_sync_step * groups_per_update(config)


def mini_batch_rows_per_worker(config: TrainerRunConfig) -> int:
    """Rows of one optimizer step on each data-parallel slot."""
    rows = config.algorithm.ppo_mini_batch_size * config.rollout.n
    return rows // data_parallel_workers(config)


def on_policy_update(config: TrainerRunConfig) -> bool:
    """One epoch over one mini-batch: the old log-probs (taken under the weights the update
    starts from) are the update's own first pass, its ratio exactly 1, so the separate
    old-log-prob pass is skipped. Colocated and split: a train batch is one update;
    fully_async: what the trainer takes for one update. Split still scores its probe rows,
    the few that check each explorer's copy of the version (SyncFollower), in a pass of their
    own (RolloutSource.probe_rows)."""
    algorithm = config.algorithm
    if algorithm.use_kl_in_reward:
        return False  # the penalty is taken between the old and the reference log-probs
    if config.trainer.mode == "fully_async":
        groups = groups_per_update(config)
    else:
        groups = config.data.train_batch_size
    return (
        algorithm.skip_old_log_prob
        and config.actor.ppo_epochs == 1
        and algorithm.ppo_mini_batch_size == groups
    )


def worker_spec(config: TrainerRunConfig) -> WorkerSpec:
    """The values the workers need that the user does not set: rows per optimizer step
    and the off-policy correction in effect."""
    correction, cap = config.algorithm.off_policy_correction, config.algorithm.importance_cap
    return WorkerSpec(
        mini_batch_rows=mini_batch_rows_per_worker(config),
        tis_cap=cap if correction in ("tis", "token_tis") else config.actor.tis_cap,
        decoupled_cap=cap if correction == "decoupled" else None,
        icepop_cap=cap if correction == "icepop" else None,
        seq_mask_cap=cap if correction == "seq_mask_is" else None,
        mismatch_cap=cap,
    )


def worker_config(config: TrainerRunConfig) -> HybridWorkerConfig:
    """What every WorkerDict member receives: the user's groups (the critic's model path
    resolved) and the derived `WorkerSpec`."""
    critic = dataclasses.replace(
        config.critic,
        model=CriticModelConfig(path=config.critic.model.path or config.model.path),
    )
    rollout = config.rollout
    if config.actor.router_replay == "rollout":  # R3 replays what the engine returns
        rollout = dataclasses.replace(rollout, return_routed_experts=True)
    return HybridWorkerConfig(
        model=config.model,
        actor=config.actor,
        ref=config.ref,
        rollout=rollout,
        sync=config.sync,
        critic=critic,
        reward_model=config.reward.model,
        distill=config.distill,
        derived=worker_spec(config),
    )
