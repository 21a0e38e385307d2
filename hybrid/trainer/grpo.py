"""The driver loop on one node: GRPO and its critic-free relatives, and PPO with a critic.

Per step: n samples per prompt -> (ref log-probs) -> (old log-probs) -> (critic values) ->
rewards -> (KL penalty in the reward) -> advantages by algorithm.adv_estimator -> (critic
update) -> mini-batched actor update (after trainer.critic_warmup steps) -> metrics ->
checkpoint. The driver holds no model: it moves Batches between the worker-group views and
does the cheap math (rewards, advantages, balancing, the KL controller) on CPU.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from pathlib import Path
from typing import Any

import torch

from hybrid.algorithms.estimators import compute_advantages
from hybrid.algorithms.gae import token_level_rewards
from hybrid.algorithms.kl_control import KLController, kl_in_reward, make_kl_controller
from hybrid.algorithms.logprob import masked_mean
from hybrid.algorithms.value_loss import explained_variance
from hybrid.controller import (
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    WorkerCallError,
    WorkerGroupView,
    create_colocated_worker_cls,
    ensure_ray,
)
from hybrid.data import Batch, PromptDataset, PromptLoader
from hybrid.memory.records import write_records
from hybrid.models import load_tokenizer
from hybrid.rewards.manager import RewardManager
from hybrid.rewards.registry import BUILTIN_REWARDS, load_reward_function
from hybrid.trainer.balance import balanced_order
from hybrid.trainer.checkpoints import (
    checkpoint_dir,
    critic_checkpoint_dir,
    latest_checkpoint,
    prune_checkpoints,
    shared_dir_error,
)
from hybrid.trainer.config import TrainerRunConfig
from hybrid.trainer.console import print_lines, print_startup_summary, run_log_dir
from hybrid.trainer.metrics import Sinks, make_sinks, reduce_over_ranks
from hybrid.workers.actor_rollout import ActorRolloutWorker, WorkerFacts
from hybrid.workers.critic import CriticWorker, check_critic_model
from hybrid.workers.lora import LORA_ADAPTER_DIR, check_lora_setup
from hybrid.workers.ref import ReferenceWorker

logger = logging.getLogger(__name__)

CRITIC_EXPORT_DIR = "hf_critic"
"""Beside hf_model: PPO's critic as a Hugging Face value model."""


def masked_stats(values: torch.Tensor, mask: torch.Tensor) -> tuple[float, float]:
    """(mean, max) of |values| over mask."""
    picked = values.abs()[mask.bool()]
    return (float(picked.mean()), float(picked.max())) if picked.numel() else (0.0, 0.0)


def check_data_sources(*datasets: PromptDataset | None) -> None:
    """Every row needs a reward function: fail before any worker starts, naming the row."""
    for dataset in datasets:
        for row in dataset.rows if dataset is not None else []:
            if row.data_source not in BUILTIN_REWARDS:
                raise ValueError(
                    f"{row.source}: data_source {row.data_source!r} has no built-in reward "
                    f"(known: {sorted(BUILTIN_REWARDS)}); set reward.custom_path to a file with compute_score"
                )


class GRPOTrainer:
    def __init__(self, config: TrainerRunConfig) -> None:
        config.check_paths()
        check_lora_setup(config.model.path, config.model.lora, config.sync.lora_mode)
        self.config = config
        c = config
        tokenizer = load_tokenizer(c.model.path)
        self.train_data = PromptDataset(c.data.train_files, tokenizer, c.data.max_prompt_length)
        self.val_data = (
            PromptDataset(c.data.val_files, tokenizer, c.data.max_prompt_length)
            if c.data.val_files
            else None
        )
        self.loader = PromptLoader(self.train_data, c.data.train_batch_size, seed=c.data.seed)
        custom = (
            load_reward_function(c.reward.custom_path, c.reward.custom_name)
            if c.reward.custom_path
            else None
        )
        if custom is None:
            check_data_sources(self.train_data, self.val_data)
        self.rewards = RewardManager(custom)
        if c.use_critic:
            check_critic_model(c.critic.model.path or c.model.path, c.model.path)
        a = c.algorithm
        self.kl_ctrl: KLController | None = (
            make_kl_controller(
                a.kl_ctrl.type, a.kl_ctrl.kl_coef, a.kl_ctrl.target_kl, a.kl_ctrl.horizon
            )
            if a.use_kl_in_reward
            else None
        )
        self.critic: WorkerGroupView | None = None
        """The critic's view (adv_estimator=gae), set by start_workers."""
        self.step = 0
        self.reward_history: list[float] = []
        self.first_step_started: float | None = None

    # --- workers ---------------------------------------------------------------------------

    def start_workers(self) -> None:
        c = self.config
        worker_config = c.worker_config()
        cls = create_colocated_worker_cls(
            {
                "actor_rollout": RayClassWithInitArgs(ActorRolloutWorker, worker_config),
                "ref": RayClassWithInitArgs(ReferenceWorker, worker_config),
                "critic": RayClassWithInitArgs(CriticWorker, worker_config),
            }
        )
        log_dir = run_log_dir(c.trainer.output_dir, c.trainer.verbose)
        try:
            ensure_ray(c.trainer.ray_address, quiet=log_dir is not None)
        except ConnectionError as error:
            raise ValueError(f"trainer.ray_address={c.trainer.ray_address!r}: {error}") from None
        pool = RayResourcePool(c.trainer.process_on_nodes, use_gpu=c.trainer.use_gpu)
        print_lines([f"starting {c.trainer.num_workers} workers (Ray, FSDP2, vLLM) ..."])
        self.group = RayWorkerGroup(pool, cls, ray_address=c.trainer.ray_address, log_dir=log_dir)
        if c.trainer.nnodes > 1:
            unshared = shared_dir_error(
                c.trainer.output_dir, self.group.ranks_missing, self.group.rank_nodes
            )
            if unshared:
                raise ValueError(unshared)
        views = self.group.spawn(prefix_set={"actor_rollout", "ref", "critic"})
        self.actor, self.ref = views["actor_rollout"], views["ref"]
        self.critic = views["critic"] if c.use_critic else None
        self.actor.init_model()
        # What the workers resolved (dtypes for `auto`, the sync strategy for the engine's
        # weight layout): rank 0 speaks for all, since every rank sees the same hardware kind.
        self.worker_facts: WorkerFacts = self.actor.describe()[0]
        print_startup_summary(c, self.worker_facts, log_dir)
        self.write_resolved_config()
        # With LoRA the reference is the actor's own base (adapters disabled): no second model.
        self.reference = self.actor if c.model.lora.enabled else self.ref
        if c.needs_reference and not c.model.lora.enabled:
            self.ref.init_model()
        if self.critic is not None:
            self.critic.init_model()
        self.log_memory(0)

    def write_resolved_config(self) -> None:
        """config.json with `auto` dtypes replaced by what the workers chose (the memory report
        plans from it)."""
        c, facts = self.config, self.worker_facts
        resolved = dataclasses.replace(
            c,
            actor=dataclasses.replace(c.actor, param_dtype=facts["actor_dtype"]),
            ref=dataclasses.replace(c.ref, param_dtype=facts["ref_dtype"]),
            rollout=dataclasses.replace(c.rollout, dtype=facts["rollout_dtype"]),
        )
        path = Path(c.trainer.output_dir) / "config.json"
        path.write_text(json.dumps(dataclasses.asdict(resolved), indent=1))

    def stop_workers(self, after_failure: bool = False) -> None:
        """Shut the engines down and kill the workers. After a failure this is best effort:
        a dead worker's error must not replace the one that ended the run."""
        try:
            self.actor.shutdown_engine()
        except WorkerCallError as error:
            if not after_failure:
                raise
            logger.debug("engine shutdown after a failure: %s", error)
        self.group.shutdown()

    # --- the loop --------------------------------------------------------------------------

    def fit(self) -> dict[str, float]:
        c = self.config
        out = c.trainer.output_dir
        Path(out).mkdir(parents=True, exist_ok=True)
        # The resolved config, for the memory report's predicted-vs-measured table.
        (Path(out) / "config.json").write_text(json.dumps(dataclasses.asdict(c), indent=1))
        self.start_workers()
        sinks = make_sinks(
            c.trainer.loggers,
            Path(out),
            c.trainer.total_steps,
            dataclasses.asdict(c),
            log_freq=c.trainer.log_freq,
        )
        try:
            self._maybe_resume()
            metrics = self.run_steps(sinks)
            if c.model.lora.enabled:
                self.actor.export_adapter(str(Path(out) / LORA_ADAPTER_DIR))
            if c.trainer.export_hf:  # with LoRA: the adapters merged into the base
                self.actor.export_hf(str(Path(out) / "hf_model"))
                if self.critic is not None:
                    self.critic.export_hf(str(Path(out) / CRITIC_EXPORT_DIR))
        except BaseException:
            sinks.close()
            self.stop_workers(after_failure=True)
            raise
        sinks.close()
        self.stop_workers()
        return metrics

    def run_steps(self, sinks: Sinks) -> dict[str, float]:
        """Validation before training, then the steps up to trainer.total_steps."""
        c = self.config
        out = c.trainer.output_dir
        if c.trainer.val_before_train and self.val_data is not None and self.step == 0:
            sinks.log(0, self.validate())
            self.log_memory(0)
        metrics: dict[str, float] = {}
        while self.step < c.trainer.total_steps:
            self.step += 1
            snapshot = self.step == c.trainer.memory_snapshot_step
            if snapshot:
                self.actor.start_memory_history()
            metrics = self.train_step()
            if snapshot:
                self.actor.dump_memory_history(str(Path(out) / "memory_snapshots"), self.step)
            self.finish_step(sinks, metrics)
        return metrics

    def finish_step(self, sinks: Sinks, metrics: dict[str, float]) -> None:
        """After a step's update, in every placement: validation when due, the metric sinks,
        a checkpoint when due, the memory ledger."""
        t = self.config.trainer
        if self.first_step_started is None:
            self.first_step_started = time.perf_counter() - metrics["timing_s/step"]
        # Wall time from the first step's start: differences between steps are the step
        # periods, whatever a mode does between its steps (a split run publishes there).
        metrics["timing_s/elapsed"] = time.perf_counter() - self.first_step_started
        self.reward_history.append(metrics["reward/mean"])
        if self.val_data is not None and t.test_freq and self.step % t.test_freq == 0:
            metrics.update(self.validate())
        sinks.log(self.step, metrics)
        if self.step == t.total_steps or (t.save_freq and self.step % t.save_freq == 0):
            self.save()
        self.log_memory(self.step)

    def seeded_prompts(self, step: int) -> Batch:
        """The next prompt batch (for `step`) with one sampling seed per row: sampling is a
        function of (seed, step, row), so a resumed run draws what the uninterrupted one drew."""
        base = (self.config.trainer.seed * 1_000_003 + step) * 10_007
        prompts = self.loader.next_batch()
        return prompts.union(Batch.from_dict({"seed": torch.arange(len(prompts)) + base}))

    def train_step(self) -> dict[str, float]:
        c = self.config
        started = time.perf_counter()
        prompts = self.seeded_prompts(self.step)
        t0 = time.perf_counter()
        rollout = self.actor.generate_sequences(prompts)
        gen_s = time.perf_counter() - t0

        # The workers score the rollout (ref, old log-probs unless the update is on-policy,
        # the critic's values) while the driver computes the rewards.
        t0 = time.perf_counter()
        futures = [
            self.reference.compute_ref_log_prob.submit(rollout) if c.needs_reference else None,
            None if c.on_policy_update else self.actor.compute_log_prob.submit(rollout),
            self.critic.compute_values.submit(rollout) if self.critic is not None else None,
        ]
        scores, metrics = self.rewards.score(rollout)
        reward_s = time.perf_counter() - t0
        for future in futures:
            if future is not None:
                rollout = rollout.union(future.get())
        rollout, advantage_metrics = self.add_advantages(rollout, scores)
        metrics.update(advantage_metrics)
        scoring_s = time.perf_counter() - t0

        mask = rollout.tensors["response_mask"]
        lengths = mask.sum(-1)
        order = balanced_order(rollout["attention_mask"].sum(-1), c.trainer.num_workers)
        if self.critic is not None:
            t0 = time.perf_counter()
            metrics.update(reduce_over_ranks(self.critic.update_critic(rollout[order])))
            metrics["timing_s/update_critic"] = time.perf_counter() - t0
        update, update_s, worker = self.run_actor_update(rollout[order])
        step_s = time.perf_counter() - started
        tokens = float(rollout["attention_mask"].sum())
        t = rollout.tensors
        if "old_log_probs" in t:  # else the update's own pass reported these
            diff_mean, diff_max = masked_stats(t["rollout_log_probs"] - t["old_log_probs"], mask)
            update.update(
                {
                    "rollout/logprob_diff_mean": diff_mean,
                    "rollout/logprob_diff_max": diff_max,
                    "actor/entropy_old": float(masked_mean(t["entropys"], t["response_mask"])),
                }
            )
        metrics.update(update)
        metrics.update({k: v for k, v in worker.items() if k.startswith(("memory/", "sync/"))})
        metrics.update(
            {
                "response_length/mean": float(lengths.float().mean()),
                "response_length/max": float(lengths.max()),
                "timing_s/step": step_s,
                # The rollout call as the driver sees it: sync + generation + release + Ray.
                "timing_s/rollout_call": gen_s,
                "timing_s/gen": worker.get("timing_s/gen", 0.0),
                "timing_s/sync": worker.get("timing_s/sync", 0.0),
                "timing_s/sync_gather": worker.get("timing_s/sync_gather", 0.0),
                "timing_s/sync_load": worker.get("timing_s/sync_load", 0.0),
                "timing_s/mode_switch": worker.get("timing_s/mode_switch", 0.0),
                # Worker-side pass times; the driver's rewards overlap them (timing_s/scoring
                # is the wall time of both together).
                "timing_s/ref": worker.get("timing_s/ref", 0.0),
                "timing_s/old_log_prob": worker.get("timing_s/old_log_prob", 0.0),
                **({"timing_s/values": worker.get("timing_s/values", 0.0)} if self.critic else {}),
                "timing_s/reward": reward_s,
                "timing_s/scoring": scoring_s,
                "timing_s/update_actor": update_s,
                "perf/throughput": tokens / step_s / c.trainer.num_workers,
            }
        )
        metrics.setdefault("actor/kl_loss", 0.0)
        return metrics

    def run_actor_update(self, batch: Batch) -> tuple[dict[str, float], float, dict[str, float]]:
        """The actor update (none during the critic's warm-up), its wall time, and the
        workers' metrics of the step. pop_metrics is queued right behind the update (a Ray
        actor runs one caller's calls in order), so its answer needs no round trip of its own."""
        started = time.perf_counter()
        update = None
        if self.step > self.config.trainer.critic_warmup:
            update = self.actor.update_actor.submit(batch)
        worker = self.actor.pop_metrics.submit()
        metrics = {} if update is None else reduce_over_ranks(update.get())
        update_s = time.perf_counter() - started
        return metrics, update_s, reduce_over_ranks(worker.get())

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
        values = t["values"] if self.critic is not None else None
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
        added["advantages"] = found.advantages
        if found.returns is not None and values is not None:
            added["returns"] = found.returns
            metrics.update(
                {
                    "critic/values/mean": float(masked_mean(values, mask)),
                    "critic/returns/mean": float(masked_mean(found.returns, mask)),
                    "critic/vf_explained_var": explained_variance(found.returns, values, mask),
                }
            )
        advantages = found.advantages
        per_token = advantages if advantages.dim() == 2 else advantages[:, None].expand_as(mask)
        metrics["critic/advantages/mean"] = float(masked_mean(per_token, mask))
        return rollout.union(Batch.from_dict(added)), metrics

    def log_memory(self, step: int) -> None:
        """Drain every worker's memory ledger; append it to memory.jsonl when due."""
        per_rank = self.actor.pop_memory_records(step)
        freq = self.config.trainer.memory_log_freq
        if step == 0 or (freq and step % freq == 0):
            path = Path(self.config.trainer.output_dir) / "memory.jsonl"
            write_records(path, [record for records in per_rank for record in records])

    def generate_greedy(self, batch: Batch) -> Batch:
        """One greedy response per prompt row (validation), from this placement's engines."""
        return self.actor.generate_sequences(batch, greedy=True)

    def validate(self) -> dict[str, float]:
        assert self.val_data is not None
        size = self.config.data.val_batch_size
        batches = PromptLoader(self.val_data, size, seed=0, shuffle=False, drop_last=False)
        scores = []
        for batch in batches.validation_batches(size):
            batch_scores, _ = self.rewards.score(self.generate_greedy(batch))
            scores.append(batch_scores)
        joined = torch.cat(scores)
        return {"val/reward_mean": float(joined.mean()), "val/num_prompts": float(len(joined))}

    # --- checkpoints -----------------------------------------------------------------------

    def save(self, loader_state: dict[str, int] | None = None) -> None:
        """A checkpoint of this step; `loader_state`: the prompt loader's position after
        this step's batch (default: where the loader is now)."""
        out = self.config.trainer.output_dir
        path = checkpoint_dir(out, self.step)
        position = self.loader.state_dict() if loader_state is None else loader_state
        extra: dict[str, Any] = {"step": self.step, "loader": position}
        if self.kl_ctrl is not None:
            extra["kl_ctrl"] = self.kl_ctrl.state_dict()
        if self.critic is not None:
            self.critic.save_checkpoint(str(critic_checkpoint_dir(out, self.step)))
        self.actor.save_checkpoint(str(path), extra=extra)
        if self.config.model.lora.enabled:  # the adapter alone, in peft's format
            self.actor.export_adapter(str(path / LORA_ADAPTER_DIR))
        # Only now is this checkpoint complete: the older ones beyond the limit may go.
        keep = self.config.trainer.max_checkpoints_to_keep
        for old in prune_checkpoints(self.config.trainer.output_dir, keep, self.step):
            logger.info("deleted checkpoint %s (trainer.max_checkpoints_to_keep=%s)", old, keep)

    def _maybe_resume(self) -> None:
        if self.config.trainer.resume != "auto":
            return
        found = latest_checkpoint(self.config.trainer.output_dir)
        if found is None:
            return
        step, path = found
        extra = self.actor.load_checkpoint(str(path))[0]
        if self.critic is not None:
            critic = critic_checkpoint_dir(self.config.trainer.output_dir, step)
            if not critic.is_dir():
                raise FileNotFoundError(
                    f"checkpoint {path} has no critic state at {critic}: it was saved by a "
                    "run without a critic (algorithm.adv_estimator was not gae)"
                )
            self.critic.load_checkpoint(str(critic))
        if self.kl_ctrl is not None:
            if "kl_ctrl" not in extra:
                raise KeyError(
                    f"checkpoint {path} has no KL controller state: it was saved by a run "
                    "without algorithm.use_kl_in_reward"
                )
            self.kl_ctrl.load_state_dict(extra["kl_ctrl"])
        self.step = int(extra["step"])
        self.loader.load_state_dict(extra["loader"])
        logger.info("resumed from %s at step %d", path, self.step)
