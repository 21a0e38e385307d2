"""The driver: one loop for every trainer.mode.

A run is a `TrainStep` (score + update, hybrid/trainer/step.py) fed by a `RolloutSource`
(where samples come from: hybrid/trainer/sources/) and followed by a `WeightPublisher` (how the
new version reaches the engines: hybrid/trainer/publisher.py). trainer.mode picks the three
parts in `assemble`; the loop does not know which it holds. Colocated is the case where the
source generates on the training workers and the publisher has nothing to send (0 steps
off-policy); split and fully_async differ only in their source.

The driver holds no model: it moves Batches between the worker-group views and does the cheap
math (rewards, advantages, balancing, the KL controller) on CPU.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import torch

from hybrid.algorithms.kl_control import KLController, make_kl_controller
from hybrid.data import PromptDataset, PromptLoader
from hybrid.data.vision_prompts import load_vision_processor
from hybrid.models import load_tokenizer
from hybrid.rewards.answers import answer_function
from hybrid.rewards.config import JudgeConfig, RewardModelConfig
from hybrid.rewards.manager import RewardManager, default_pool_size
from hybrid.rewards.registry import BUILTIN_REWARDS, load_reward_function
from hybrid.rollout.base import GREEDY, Sampling
from hybrid.synchronizer.actor import SynchronizerActor
from hybrid.synchronizer.client import SynchronizerClient
from hybrid.trainer import placement
from hybrid.trainer.agent_setup import check_agent_rows, prepare_agent
from hybrid.trainer.checkpoints import (
    CheckpointWriter,
    checkpoint_dir,
    critic_checkpoint_dir,
    resumable_checkpoint,
)
from hybrid.trainer.config import TrainerRunConfig
from hybrid.trainer.config_derived import sync_policy
from hybrid.trainer.metrics import Sinks, drop_rows_after, make_sinks
from hybrid.trainer.model_rewards import submit_rewards
from hybrid.trainer.prompts import PromptFeed
from hybrid.trainer.publisher import InProcessPublisher, WeightPublisher, transport_sides
from hybrid.trainer.sft_stage import SftStage
from hybrid.trainer.sources import BufferSource, ColocatedSource, QueueSource, RolloutSource
from hybrid.trainer.sources.explorers import ExplorerSide
from hybrid.trainer.sources.group_filter import DynamicSampling
from hybrid.trainer.step import StepResult, TrainStep, merge_updates
from hybrid.trainer.val_metrics import prompt_samples, validation_metrics
from hybrid.trainer.weight_sync import WeightChannel
from hybrid.workers.critic import check_critic_model
from hybrid.workers.lora import LORA_ADAPTER_DIR, check_lora_setup
from hybrid.workers.reward_model import check_reward_model
from hybrid.workers.teacher import check_teacher_model

logger = logging.getLogger(__name__)

CRITIC_EXPORT_DIR = "hf_critic"
"""Beside hf_model: PPO's critic as a Hugging Face value model."""


def check_data_sources(
    *datasets: PromptDataset | None, scorers: Sequence[RewardModelConfig | JudgeConfig] = ()
) -> None:
    """Every row needs a reward: a built-in rule reward, or a model's score alone (the reward
    model's or the judge's combine is `replace` for its data source). Fail before any worker
    starts, naming the row."""

    def replaced(source: str) -> bool:
        return any(s.enabled and s.combine_for(source) == "replace" for s in scorers)

    for dataset in datasets:
        for row in dataset.rows if dataset is not None else []:
            if row.data_source not in BUILTIN_REWARDS and not replaced(row.data_source):
                raise ValueError(
                    f"{row.source}: data_source {row.data_source!r} has no built-in reward "
                    f"(known: {sorted(BUILTIN_REWARDS)}); set reward.custom_path to a file with "
                    "compute_score, or score it by a reward model alone (reward.model.path with "
                    f"reward.model.combine_by_source={{{row.data_source}: replace}})"
                )


def assemble(
    config: TrainerRunConfig,
    workers: placement.Placement,
    feed: PromptFeed,
    pad_token_id: int,
    rewards: RewardManager,
) -> tuple[RolloutSource, WeightPublisher]:
    """The source and the publisher of trainer.mode (the one place the mode is read after
    the workers started)."""
    c = config
    filter_groups = c.algorithm.filter_groups
    per_update = c.groups_per_update if c.trainer.mode == "fully_async" else c.data.train_batch_size
    sampling = DynamicSampling(filter_groups, rewards, per_update) if filter_groups.enable else None
    if workers.explorers is None:
        return ColocatedSource(workers.members.actor, feed, sampling), InProcessPublisher()
    out = Path(c.trainer.output_dir)
    synchronizer = SynchronizerClient(
        SynchronizerActor.remote(
            c.sync.method, str(out / "sync_timeline.jsonl"), c.sync.keep_versions
        )
    )
    channel = WeightChannel(c.sync, synchronizer, workers.members.actor, workers.explorers)
    channel.connect()
    publisher, follower = transport_sides(
        sync_policy(c.sync), channel, c.trainer.total_steps, c.trainer.output_dir
    )
    side = ExplorerSide(c, workers.explorers, publisher, follower, feed, pad_token_id)
    # The queue hands groups over as they finish: their rule rewards can start at once, unless
    # a reward model or the judge scores the batch too (the train step then combines them).
    streamed = None if c.reward.model.enabled or c.reward.judge.enabled else rewards
    source = (
        QueueSource(side, streamed, sampling)
        if c.trainer.mode == "fully_async"
        else BufferSource(side, sampling)
    )
    return source, publisher


class Driver:
    def __init__(self, config: TrainerRunConfig) -> None:
        config.check_paths()
        check_lora_setup(
            config.model.path,
            config.model.lora,
            config.sync.lora_mode,
            config.rollout.engine,
            config.actor.ep_size,
        )
        c = self.config = config
        tokenizer = load_tokenizer(c.model.path)
        self.agent = prepare_agent(c.rollout, tokenizer)
        tools = (self.agent.schemas or None) if self.agent is not None else None
        max_prompt = c.data.max_prompt_length
        # Read and tokenized before any worker starts: a bad row costs no start-up. An SFT-only
        # run (trainer.total_steps=0) reads no RL prompts. A vision-language model's rows go
        # through its processor (images counted in the prompt's length).
        self.sft = SftStage(c) if c.sft.enabled else None
        rl = c.trainer.total_steps > 0
        processor, max_images = load_vision_processor(c.model.path), c.rollout.max_images
        self.train_data = (
            PromptDataset(
                c.data.train_files,
                tokenizer,
                max_prompt,
                tools=tools,
                processor=processor,
                max_images=max_images,
            )
            if rl
            else None
        )
        self.val_data = (
            PromptDataset(
                c.data.val_files,
                tokenizer,
                max_prompt,
                tools=tools,
                processor=processor,
                max_images=max_images,
            )
            if c.data.val_files and rl
            else None
        )
        if self.agent is not None:
            check_agent_rows(self.agent, self.train_data, self.val_data)
        self.loader = (
            PromptLoader(
                self.train_data, c.data.train_batch_size, seed=c.data.seed, shuffle=c.data.shuffle
            )
            if self.train_data is not None
            else None
        )
        custom = (
            load_reward_function(c.reward.custom_path, c.reward.custom_name)
            if c.reward.custom_path
            else None
        )
        # What validation's maj@k votes on: the custom file's extract_answer, if it has one.
        self.answers = answer_function(c.reward.custom_path)
        if custom is None:
            scorers = (c.reward.model, c.reward.judge)
            check_data_sources(self.train_data, self.val_data, scorers=scorers)
        r = c.reward
        self.rewards = RewardManager(
            custom,
            num_workers=default_pool_size() if r.num_workers is None else r.num_workers,
            calls_per_worker=r.calls_per_worker,
            timeout_s=r.timeout_s,
            on_error=r.on_error,
            error_score=r.error_score,
        )
        if c.use_critic:
            check_critic_model(c.critic.model.path or c.model.path, c.model.path)
        if c.reward.model.enabled:
            check_reward_model(c.reward.model)
        if c.distill.teacher_path is not None:
            check_teacher_model(c.distill.teacher_path, c.model.path)
        a = c.algorithm
        self.kl_ctrl: KLController | None = (
            make_kl_controller(
                a.kl_ctrl.type, a.kl_ctrl.kl_coef, a.kl_ctrl.target_kl, a.kl_ctrl.horizon
            )
            if a.use_kl_in_reward
            else None
        )
        self.step = 0
        self.reward_history: list[float] = []
        self.first_step_started: float | None = None

    # --- the run ----------------------------------------------------------------------------

    def fit(self) -> dict[str, float]:
        """The SFT stage when sft.train_files are set (hybrid/trainer/sft_stage.py), then RL
        from its weights (none when trainer.total_steps=0), then the export."""
        c, sft = self.config, self.sft
        self.start()
        sinks = Sinks([])
        try:
            metrics: dict[str, float] = {}
            if sft is not None:
                # Before the RL resume and the first publish: explorers start from its weights.
                members = self.workers.members
                # With LoRA the reference is the base (adapters off), as in RL; an SFT-only
                # run has no KL term to serve.
                own_reference = (
                    c.needs_reference and not c.model.lora.enabled and c.trainer.total_steps > 0
                )
                metrics = sft.run(
                    self.actor,
                    members.training_workers,
                    self.critic is not None,
                    members.reference if own_reference else None,
                )
            if c.trainer.total_steps > 0:
                # Before the sinks open: a resume takes the rows after its checkpoint out of
                # metrics.jsonl, which the jsonl sink then appends to.
                self.resume()
                sinks = make_sinks(
                    c.trainer.loggers,
                    Path(c.trainer.output_dir),
                    c.trainer.total_steps,
                    dataclasses.asdict(c),
                    log_freq=c.trainer.log_freq,
                )
                metrics = self.run(sinks)
            self.export()
        except BaseException:
            sinks.close()
            self.rewards.close()
            self.workers.stop(after_failure=True)
            raise
        sinks.close()
        self.rewards.close()
        self.workers.stop()
        return metrics

    def start(self) -> None:
        """The workers of trainer.mode and the three parts of the loop."""
        c = self.config
        out = Path(c.trainer.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        # The config as given, until the workers resolve `auto` (placement rewrites it).
        (out / "config.json").write_text(json.dumps(dataclasses.asdict(c), indent=1))
        self.workers = placement.start(c)
        self.worker_facts = self.workers.facts
        m = self.workers.members
        self.actor, self.critic = m.actor, m.critic
        self.log_memory(0)
        if self.loader is None or self.train_data is None:
            return  # SFT alone: no rollouts, no weights to publish
        self.feed = PromptFeed(self.loader, c.trainer.seed)
        try:
            self.source, self.publisher = assemble(
                c, self.workers, self.feed, self.train_data.pad_token_id, self.rewards
            )
        except BaseException:
            self.workers.stop(after_failure=True)
            raise
        self.train = TrainStep(c, m, self.rewards, self.kl_ctrl)

    def run(self, sinks: Sinks) -> dict[str, float]:
        """The starting weights into the engines, validation before training, the steps."""
        c = self.config
        metrics: dict[str, float] = {}
        try:
            self.publisher.start(self.step)
            if c.trainer.val_before_train and self.val_data is not None and self.step == 0:
                sinks.log(0, self.validate())
                self.log_memory(0)
            self.source.start(self.step)
            while self.step < c.trainer.total_steps:
                self.step += 1
                metrics = self.train_one_step()
                self.finish_step(sinks, metrics)
                self.publisher.after_step(self.step)
        except BaseException as error:
            cause = self.source.fail(error)
            if cause is not error:
                raise cause from error
            raise
        self.source.finish()
        self.publisher.finish()
        return metrics

    def train_one_step(self) -> dict[str, float]:
        """The source's batches for this step, each scored and trained on under the version
        the actor last published (step - 1); one metrics dict."""
        snapshot = self.step == self.config.trainer.memory_snapshot_step
        if snapshot:
            self.actor.start_memory_history()
        started = time.perf_counter()
        trained_on = self.step - 1
        results: list[StepResult] = []
        for rollout in self.source.batches(self.step):
            # After the first update the actor no longer holds version `trained_on`.
            moved = bool(results)
            results.append(
                self.train(
                    rollout.batch,
                    self.step,
                    trained_on,
                    self.source.lag_bound,
                    moved,
                    rollout.rewards,
                    self.source.probe_rows,
                    partial(self.source.probes_scored, trained_on=trained_on),
                )
            )
        step_s = time.perf_counter() - started
        if snapshot:
            out = Path(self.config.trainer.output_dir) / "memory_snapshots"
            self.actor.dump_memory_history(str(out), self.step)
        metrics = merge_updates([r.metrics for r in results])
        worker = merge_updates([r.worker for r in results])
        metrics.update(self.source.metrics(worker, step_s))
        metrics.update(self.publisher.metrics(worker))
        metrics["timing_s/step"] = step_s
        if self.agent is not None:
            metrics.update(self.agent.metrics)
        tokens_per_s = metrics["perf/tokens"] / step_s
        metrics["perf/throughput"] = tokens_per_s / self.config.trainer.training_workers
        return metrics

    def finish_step(self, sinks: Sinks, metrics: dict[str, float]) -> None:
        """After a step's update: validation when due, the metric sinks, a checkpoint when
        due, the memory ledger."""
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

    def validate(self) -> dict[str, float]:
        """trainer.val_n responses per validation prompt (greedy at val_temperature 0), scored
        as in training: val/ means and the val-core / val-aux estimators per data source."""
        assert self.val_data is not None
        t = self.config.trainer
        sampling = (
            GREEDY if t.val_temperature == 0 else Sampling(t.val_n, t.val_temperature, t.val_top_p)
        )
        size = self.config.data.val_batch_size
        batches = PromptLoader(self.val_data, size, seed=0, shuffle=False, drop_last=False)
        scores, prompts = [], []
        members, rules = self.workers.members, []
        for batch in batches.validation_batches(size):
            rollout = self.source.generate_for_validation(batch, sampling)
            # Combined with the reward model's or the judge's scores as in training.
            pending = submit_rewards(
                self.config.reward, self.rewards, members.reward_model, rollout, members.judge
            )
            scores.append(pending.result()[0])
            prompts += prompt_samples(rollout, scores[-1], self.answers)
            assert pending.rule_scores is not None
            rules.append(pending.rule_scores)
        joined = torch.cat(scores)
        metrics = {"val/reward_mean": float(joined.mean()), "val/num_prompts": float(len(prompts))}
        rule = torch.cat(rules)
        scored_by_model = members.reward_model is not None or members.judge is not None
        if scored_by_model and not rule.isnan().all():
            # The rule's verdict on the same answers: what the model's scores are worth.
            metrics["val/rule_mean"] = float(rule[~rule.isnan()].mean())
        metrics.update(validation_metrics(prompts))
        return metrics

    def log_memory(self, step: int) -> None:
        """Drain every worker's memory ledger; append it to memory.jsonl when due."""
        self.writer.log_memory(self.actor, step)

    def export(self) -> None:
        out = Path(self.config.trainer.output_dir)
        if self.config.model.lora.enabled:
            self.actor.export_adapter(str(out / LORA_ADAPTER_DIR))
        if self.config.trainer.export_hf:  # with LoRA: the adapters merged into the base
            self.actor.export_hf(str(out / "hf_model"))
            if self.critic is not None:
                self.critic.export_hf(str(out / CRITIC_EXPORT_DIR))

    # --- checkpoints ------------------------------------------------------------------------

    @property
    def writer(self) -> CheckpointWriter:
        """The checkpoints and memory.jsonl under output_dir."""
        t = self.config.trainer
        return CheckpointWriter(Path(t.output_dir), t.max_checkpoints_to_keep, t.memory_log_freq)

    def save(self) -> None:
        """A checkpoint of this step (with the critic's state, and the LoRA adapter alone),
        with the prompt position the source says a resumed run starts from."""
        extra: dict[str, Any] = {
            "step": self.step,
            "loader": self.source.resume_position(self.step),
        }
        if self.kl_ctrl is not None:
            extra["kl_ctrl"] = self.kl_ctrl.state_dict()
        lora = self.config.model.lora.enabled
        self.writer.save(self.step, self.actor, extra, critic=self.critic, adapter=lora)

    def resume(self) -> None:
        """resume=auto: continue from the newest whole checkpoint (each damaged newer one
        named in a warning, none deleted), with metrics.jsonl cut back to its step."""
        out = self.config.trainer.output_dir
        if self.config.trainer.resume != "auto":
            return
        choice = resumable_checkpoint(out, needs_critic=self.critic is not None)
        found = choice.found
        start = "starting from step 0" if found is None else f"resuming from {found[1].name}"
        for damaged, reason in choice.skipped:
            logger.warning(
                "checkpoint %s is damaged (%s); %s",
                checkpoint_dir(out, damaged),
                reason,
                start,
            )
        self.drop_metrics_after(0 if found is None else found[0])
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
        assert self.loader is not None  # resume runs only with RL steps
        self.loader.load_state_dict(extra["loader"])
        logger.info("resumed from %s at step %d", path, self.step)

    def drop_metrics_after(self, step: int) -> None:
        """The rows a crashed run logged after the checkpoint this run continues from leave
        metrics.jsonl (kept aside), so that each step is logged once."""
        metrics = Path(self.config.trainer.output_dir) / "metrics.jsonl"
        dropped, aside = drop_rows_after(metrics, step)
        if dropped:
            logger.warning(
                "%s: moved %d rows logged after step %d (by a run that stopped before its next "
                "checkpoint) to %s; this run logs those steps again",
                metrics,
                dropped,
                step,
                aside,
            )
