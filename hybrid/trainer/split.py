"""The GRPO driver for trainer.placement=split: explorer workers generate while trainer workers
train, the Synchronizer keeping them within the style's lag.

Two loops on the driver. The explorer loop (a thread) draws prompt batches in order, brings
the engines to an allowed weight version (`SyncSides.explorer_sync`) and has the explorers
generate; the explorers put their Samples into the experience buffer themselves. The trainer
loop (the main thread) takes one train batch of whole groups per step, scores it (rewards,
reference, old log-probs), updates the actor and publishes the new version when the style
says so. Either loop's failure stops the other: the Synchronizer and the buffer wake every
waiter, and the run ends with the first error, which names the side.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

import ray

from hybrid.algorithms.off_policy import mask_stale_tokens, version_lag, version_stats
from hybrid.buffer.experience import ExperienceBufferActor
from hybrid.controller import (
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    WorkerDiedError,
    create_colocated_worker_cls,
    ensure_ray,
)
from hybrid.data import Batch
from hybrid.data.sample import samples_to_batch
from hybrid.explorer.worker import ExplorerWorker
from hybrid.synchronizer.actor import SynchronizerActor
from hybrid.trainer.balance import balanced_order
from hybrid.trainer.config import TrainerRunConfig, sync_policy
from hybrid.trainer.console import print_lines, print_startup_summary, run_log_dir
from hybrid.trainer.grpo import GRPOTrainer, masked_stats
from hybrid.trainer.metrics import Sinks, reduce_over_ranks
from hybrid.trainer.weight_sync import SyncSides, WeightChannel
from hybrid.workers.critic import CriticWorker
from hybrid.workers.ref import ReferenceWorker
from hybrid.workers.trainer_worker import TrainerWorker

logger = logging.getLogger(__name__)

DEATH_GRACE_S = 10.0
"""How long a failed trainer loop waits for the explorer loop to report a worker death."""
PROBE_ROWS_PER_EXPLORER = 2
POLL_S = 0.5
"""How often the trainer, waiting for data, looks at sync requests and the explorer loop."""


class ExplorerLoop(threading.Thread):
    """Explorer steps first..last: sync as allowed, then generate into the buffer."""

    def __init__(self, trainer: SplitTrainer, first: int, last: int) -> None:
        super().__init__(name="explorer-loop", daemon=True)
        self.trainer = trainer
        self.first, self.last = first, last
        self.error: BaseException | None = None
        self.loader_states: dict[int, dict[str, int]] = {}
        """The prompt loader's position before each explorer step, recorded as soon as the
        step before drew its batch (checkpoints need the trainer's position, which lags)."""
        self.gen_s = 0.0
        self.stopping = threading.Event()

    def run(self) -> None:
        t = self.trainer
        try:
            for step in range(self.first, self.last + 1):
                if self.stopping.is_set():
                    return
                waited = time.perf_counter()
                t.sides.explorer_sync(step)
                t.sides.times.explorer_wait_s += time.perf_counter() - waited
                prompts = t.seeded_prompts(step)
                self.loader_states[step + 1] = t.loader.state_dict()
                stats = t.explorers.explore(prompts, t.buffer, t.config.sync.timeout_s)
                self.gen_s += max(s["gen_s"] for s in stats)
            t.sides.explorer_finished()
        except BaseException as error:  # handed to the trainer loop, which raises it
            self.error = error
            reason = f"explorer loop failed: {type(error).__name__}: {error}"
            ray.get(t.synchronizer.stop.remote("explorer", reason))
            ray.get(t.buffer.close.remote(reason))


class SplitTrainer(GRPOTrainer):
    def __init__(self, config: TrainerRunConfig) -> None:
        super().__init__(config)
        self.policy = sync_policy(config.sync)
        self.trainer_wait_s = 0.0

    # --- workers ---------------------------------------------------------------------------

    def start_workers(self) -> None:
        c = self.config
        t = c.trainer
        worker_config = c.worker_config()
        log_dir = run_log_dir(t.output_dir, t.verbose)
        try:
            ensure_ray(t.ray_address, quiet=log_dir is not None)
        except ConnectionError as error:
            raise ValueError(f"trainer.ray_address={t.ray_address!r}: {error}") from None
        print_lines(
            [
                f"starting {t.num_explorer_workers} explorer + {t.num_trainer_workers} trainer "
                "workers (Ray, vLLM | FSDP2) ..."
            ]
        )
        self.explorers = RayWorkerGroup(
            RayResourcePool([t.num_explorer_workers], use_gpu=t.use_gpu),
            RayClassWithInitArgs(ExplorerWorker, worker_config),
            ray_address=t.ray_address,
            log_dir=None if log_dir is None else Path(log_dir) / "explorer",
        )
        cls = create_colocated_worker_cls(
            {
                # "trainer": the name errors from this member carry (trainer.<method> failed).
                "trainer": RayClassWithInitArgs(TrainerWorker, worker_config),
                "ref": RayClassWithInitArgs(ReferenceWorker, worker_config),
                "critic": RayClassWithInitArgs(CriticWorker, worker_config),
            }
        )
        self.group = RayWorkerGroup(
            RayResourcePool([t.num_trainer_workers], use_gpu=t.use_gpu),
            cls,
            ray_address=t.ray_address,
            log_dir=None if log_dir is None else Path(log_dir) / "trainer",
        )
        # The reference and PPO's critic live with the trainer group: they serve the update.
        views = self.group.spawn(prefix_set={"trainer", "ref", "critic"})
        self.actor, self.ref = views["trainer"], views["ref"]
        self.reference = self.ref
        self.critic = views["critic"] if c.use_critic else None
        engines = self.explorers.init_engine.submit()
        self.actor.init_model()
        if c.needs_reference:
            self.ref.init_model()
        if self.critic is not None:
            self.critic.init_model()
        engines.get()
        explorer_facts = self.explorers.describe()[0]
        self.worker_facts = self.actor.describe()[0]
        self.worker_facts.update(explorer_facts)
        print_startup_summary(c, self.worker_facts, log_dir)
        self.write_resolved_config()
        out = Path(t.output_dir)
        placement = {
            "explorer": [str(node) for node in self.explorers.rank_nodes],
            "trainer": [str(node) for node in self.group.rank_nodes],
        }
        (out / "placement.json").write_text(json.dumps(placement, indent=1))
        self.synchronizer = SynchronizerActor.remote(
            c.sync.method, str(out / "sync_timeline.jsonl"), c.sync.keep_versions
        )
        self.buffer = self.make_buffer()
        self.channel = WeightChannel(c.sync, self.synchronizer, self.actor, self.explorers)
        self.channel.connect()
        self.sides = SyncSides(self.policy, self.channel, self.synchronizer, t.total_steps)
        self.log_memory(0)

    def make_buffer(self) -> Any:
        """The experience buffer actor: room for the batches the style lets the explorer
        run ahead (a bigger one would never fill)."""
        groups = self.config.data.train_batch_size * self.policy.buffer_batches()
        return ExperienceBufferActor.remote(self.config.rollout.n, groups)

    def stop_workers(self, after_failure: bool = False) -> None:
        """Engines first (vLLM must go before its process group), then the actors; after a
        failure best effort, so that a dead worker's error does not replace the run's."""
        sides = (
            ("explorer", self.explorers.shutdown_engine, self.explorers),
            ("trainer", self.actor.shutdown_engine, self.group),
        )
        for name, shutdown_engine, group in sides:
            try:
                shutdown_engine()
            except Exception as error:
                if not after_failure:
                    raise
                logger.debug("%s shutdown after a failure: %s", name, error)
            group.shutdown()

    # --- the loops -------------------------------------------------------------------------

    def run_steps(self, sinks: Sinks) -> dict[str, float]:
        """The starting weights into the explorers, validation before training (on them),
        then the two loops."""
        c = self.config
        self.sides.start(self.step)
        self.explorer_loop = ExplorerLoop(self, self.step + 1, c.trainer.total_steps)
        metrics: dict[str, float] = {}
        try:
            self.sides.initial_sync(self.step, first_explorer_step=self.step + 1)
            if c.trainer.val_before_train and self.val_data is not None and self.step == 0:
                sinks.log(0, self.validate())
            self.explorer_loop.start()
            while self.step < c.trainer.total_steps:
                self.step += 1
                metrics = self.train_step()
                self.finish_step(sinks, metrics)
                self.sides.trainer_sync(self.step, after_step=True)
        except BaseException as error:
            cause = self.stop_after_failure(error, self.explorer_loop.stopping)
            if cause is not error:
                raise cause from error
            raise
        self.explorer_loop.join(timeout=c.sync.timeout_s)
        if self.sides.digests:
            path = Path(c.trainer.output_dir) / "engine_digests.json"
            path.write_text(json.dumps(self.sides.digests, indent=1))
        ray.get(self.synchronizer.set_state.remote("trainer", "stopped", self.step, "finished"))
        return metrics

    def stop_after_failure(self, error: BaseException, stopping: threading.Event) -> BaseException:
        """The trainer loop raised `error`: stop the generating side's loop (`stopping`), wake
        whatever waits on the Synchronizer or the buffer, and return the error to report."""
        stopping.set()
        reason = f"trainer loop failed: {type(error).__name__}: {error}"
        ray.get(self.synchronizer.stop.remote("trainer", reason))
        ray.get(self.buffer.close.remote(reason))
        return self.root_cause(error)

    def root_cause(self, error: BaseException) -> BaseException:
        """A dead explorer makes the trainer's next sync or take fail too (a closed
        connection, a closed buffer): report the death, which names the explorer, instead."""
        if isinstance(error, WorkerDiedError) or self.explorer_loop.ident is None:
            return error  # the explorer loop never started
        self.explorer_loop.join(timeout=DEATH_GRACE_S)
        died = self.explorer_loop.error
        return died if isinstance(died, WorkerDiedError) else error

    def take_batch(self) -> list[Any]:
        """The next train batch of whole groups; answers sync requests while it waits."""
        c = self.config
        started = time.perf_counter()
        while True:
            samples = ray.get(self.buffer.take.remote(c.data.train_batch_size, POLL_S))
            if samples is not None:
                self.trainer_wait_s = time.perf_counter() - started
                return list(samples)
            if self.explorer_loop.error is not None:
                raise self.explorer_loop.error
            if time.perf_counter() - started > c.sync.timeout_s:
                raise TimeoutError(
                    f"trainer step {self.step}: no train batch from the explorer within "
                    f"sync.timeout_s={c.sync.timeout_s}s"
                )
            self.sides.trainer_sync(self.step - 1, after_step=False)

    def train_step(self) -> dict[str, float]:
        c = self.config
        started = time.perf_counter()
        samples = self.take_batch()
        trained_on = self.step - 1  # the version the actor holds now
        rollout, metrics = self.train_on(samples, trained_on, self.policy.lag_bound())
        # A few of these rows, scored under the version the actor holds, check the
        # explorer's copy of that version before it moves on (SyncSides._probe).
        probe_rows = min(len(rollout), PROBE_ROWS_PER_EXPLORER * c.trainer.num_explorer_workers)
        self.sides.probes[trained_on] = rollout.select(
            ["input_ids", "attention_mask", "responses", "response_mask", "old_log_probs"]
        )[:probe_rows]
        for stale in [v for v in self.sides.probes if v < trained_on - self.policy.lag_bound() - 1]:
            self.sides.probes.pop(stale, None)  # versions the explorer skipped
        depth = ray.get(self.buffer.depth.remote())
        step_s = time.perf_counter() - started
        metrics.update(self.sides.times.drain())
        metrics.update(
            {
                "buffer/groups": float(depth.groups),
                "timing_s/step": step_s,
                "timing_s/trainer_wait": self.trainer_wait_s,
                "timing_s/gen": self._drain_gen_s(),
                "perf/throughput": metrics["perf/tokens"] / step_s,
            }
        )
        return metrics

    def train_on(
        self, samples: list[Any], trained_on: int, lag_bound: int
    ) -> tuple[Batch, dict[str, float]]:
        """Score whole groups of Samples (rewards, reference, old log-probs under
        `trained_on`, the version the actor holds, the critic's values), compute their
        advantages as the colocated step does, and update the critic and the actor on them
        (the actor after trainer.critic_warmup steps). A token lagging more than `lag_bound`
        versions means the schedule broke: raise."""
        c = self.config
        rollout = samples_to_batch(
            samples,
            c.rollout.response_length,
            self.train_data.pad_token_id,
            c.data.max_prompt_length,
        )
        mask, versions = rollout.tensors["response_mask"], rollout.tensors["versions"]
        lag = version_lag(versions, mask, trained_on)[mask.bool()]
        if int(lag.max()) > lag_bound:
            raise RuntimeError(
                f"step {self.step}: a sample lags {int(lag.max())} versions, more than the "
                f"bound ({lag_bound}): the schedule is broken"
            )
        # Tokens sampled by the weights the trainer holds: their log-probs must match.
        fresh = mask * (versions == trained_on)
        if c.on_policy_update:  # the update's own first pass checks them
            rollout = rollout.union(Batch.from_dict({"fresh_mask": fresh}))
        t0 = time.perf_counter()
        futures = [
            self.reference.compute_ref_log_prob.submit(rollout) if c.needs_reference else None,
            None if c.on_policy_update else self.actor.compute_log_prob.submit(rollout),
            self.critic.compute_values.submit(rollout) if self.critic is not None else None,
        ]
        scores, metrics = self.rewards.score(rollout)
        for future in futures:
            if future is not None:
                rollout = rollout.union(future.get())
        rollout, advantage_metrics = self.add_advantages(rollout, scores)
        metrics.update(advantage_metrics)
        scoring_s = time.perf_counter() - t0
        trained = rollout
        if c.algorithm.off_policy_correction == "mask":
            kept = mask_stale_tokens(mask, versions, trained_on, c.algorithm.mask_version_lag)
            tensors = dict(rollout.tensors, response_mask=kept)
            trained = Batch(tensors, rollout.non_tensors, rollout.meta)
            metrics["actor/masked_stale_tokens"] = float((mask - kept).sum())
        order = balanced_order(trained["attention_mask"].sum(-1), c.trainer.num_trainer_workers)
        if self.critic is not None:
            t0 = time.perf_counter()
            metrics.update(reduce_over_ranks(self.critic.update_critic(trained[order])))
            metrics["timing_s/update_critic"] = time.perf_counter() - t0
        update, update_s, worker = self.run_actor_update(trained[order])
        if not c.on_policy_update:  # else the update's own pass reported the sync check
            t = rollout.tensors
            diff_mean, diff_max = masked_stats(t["rollout_log_probs"] - t["old_log_probs"], fresh)
            update.update(
                {"rollout/logprob_diff_mean": diff_mean, "rollout/logprob_diff_max": diff_max}
            )
        metrics.update(update)
        metrics.update({k: v for k, v in worker.items() if k.startswith("memory/")})
        if self.critic is not None:
            metrics["timing_s/values"] = worker.get("timing_s/values", 0.0)
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
                "timing_s/scoring": scoring_s,
                "timing_s/update_actor": update_s,
                "perf/tokens": float(rollout["attention_mask"].sum()),
            }
        )
        metrics.setdefault("actor/kl_loss", 0.0)
        return rollout, metrics

    def _drain_gen_s(self) -> float:
        gen_s, self.explorer_loop.gen_s = self.explorer_loop.gen_s, 0.0
        return gen_s

    def generate_greedy(self, batch: Batch) -> Batch:
        """Validation runs on the explorers, with the weights they hold (never the dummy
        weights an engine starts with: the starting version is loaded before anything runs)."""
        out = self.explorers.generate_sequences(batch, greedy=True)
        held = out.tensors["versions"][out.tensors["response_mask"].bool()]
        if held.numel() and int(held.min()) < 0:
            raise RuntimeError("validation ran on an explorer that holds no weight version yet")
        return out

    def save(self, loader_state: dict[str, int] | None = None) -> None:
        # The loader has run ahead with the explorer: store its position after this step's
        # batch, so that a resumed run draws the next batch as this one would have.
        super().save(self.explorer_loop.loader_states[self.step + 1])
