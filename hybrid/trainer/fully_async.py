"""The GRPO driver for fully_async.enable (verl's fully-async plan) on the split placement.

The Rollouter (hybrid/explorer/rollouter.py, a driver thread) keeps the explorers generating
into the MessageQueue, paced by the staleness rule; the trainer (the main thread) takes
`require_batches` mini-batches of whole groups as soon as they are there, updates the actor on
them, and after `trigger_parameter_sync_step` such updates (one train step) publishes the next
weight version, which the Rollouter picks up between generation chunks (plan 2) or between
whole batches (plan 1). Groups that arrive too stale are dropped by the queue and counted.

Resuming restarts the Rollouter at the prompt loader's position at the checkpoint: prompts that
were in flight then (generating or queued) are not replayed, and the log says how many.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

import ray

from hybrid.buffer.message_queue import MessageQueueActor
from hybrid.buffer.staleness import production_budget
from hybrid.data import Batch
from hybrid.explorer.rollouter import Rollouter
from hybrid.trainer.config import TrainerRunConfig
from hybrid.trainer.metrics import Sinks
from hybrid.trainer.split import POLL_S, SplitTrainer

logger = logging.getLogger(__name__)


class FullyAsyncTrainer(SplitTrainer):
    def __init__(self, config: TrainerRunConfig) -> None:
        super().__init__(config)
        self._spare: list[Batch] = []
        self._draws = 0
        self._prompt_lock = threading.Lock()
        self.budget = production_budget(
            config.fully_async.staleness_threshold, config.groups_per_version
        )

    def make_buffer(self) -> Any:
        return None  # the queue is made in run_steps, once the starting version is known

    # --- the Rollouter's inputs --------------------------------------------------------------

    def next_prompts(self, count: int) -> Batch:
        """The next `count` prompt rows, each with its sampling seed."""
        with self._prompt_lock:
            rows = sum(len(b) for b in self._spare)
            while rows < count:
                self._draws += 1
                batch = self.seeded_prompts(self._draws)
                self._spare.append(batch)
                rows += len(batch)
            spare = Batch.concat(self._spare)
            self._spare = [spare[count:]] if count < len(spare) else []
            return spare[:count]

    # --- the loops ---------------------------------------------------------------------------

    def run_steps(self, sinks: Sinks) -> dict[str, float]:
        c, fa = self.config, self.config.fully_async
        self._draws = self.step * c.data.train_batch_size  # distinct seeds after a resume
        self.buffer = self.queue = MessageQueueActor.remote(
            c.rollout.n, self.budget, fa.max_version_lag, start_version=self.step
        )
        self.sides.start(self.step)
        # Plan 2 keeps as many groups in the engine as the staleness rule allows (a step costs
        # about the same with more sequences); plan 1 generates batches of train_batch_size.
        self.rollouter = Rollouter(
            self.explorers,
            self.queue,
            self.next_prompts,
            self.sides.explorer_catch_up,
            groups_in_flight=self.budget if fa.partial_rollout else c.data.train_batch_size,
            max_steps=fa.chunk_tokens if fa.partial_rollout else None,
            partial_rollout=fa.partial_rollout,
            on_error=self._rollouter_failed,
        )
        metrics: dict[str, float] = {}
        try:
            self.sides.initial_sync(self.step, first_explorer_step=self.step + 1)
            if c.trainer.val_before_train and self.val_data is not None and self.step == 0:
                sinks.log(0, self.validate())
            self.rollouter.start()
            while self.step < c.trainer.total_steps:
                self.step += 1
                metrics = self.train_step()
                self.finish_step(sinks, metrics)
                if self.step < c.trainer.total_steps:
                    ray.get(self.queue.published.remote(self.step))
                self.sides.trainer_sync(self.step, after_step=True)
        except BaseException as error:
            cause = self.stop_after_failure(error, self.rollouter.stopping)
            if cause is not error:
                raise cause from error
            raise
        self.rollouter.stopping.set()
        ray.get(self.synchronizer.stop.remote("trainer", "finished"))
        self.rollouter.join(timeout=c.sync.timeout_s)
        self.write_record()
        return metrics

    def root_cause(self, error: BaseException) -> BaseException:
        """A dead Rollouter makes the trainer's next take or sync fail too: report it."""
        return self.rollouter.error or error

    def _rollouter_failed(self, error: BaseException) -> None:
        """Wake the trainer wherever it waits (a take, a broadcast) with the Rollouter's end."""
        reason = f"Rollouter failed: {type(error).__name__}: {error}"
        ray.get(self.synchronizer.stop.remote("explorer", reason))
        ray.get(self.queue.close.remote(reason))

    def write_record(self) -> None:
        """fully_async.json: where every started group ended, and the pacing record."""
        record = ray.get(self.queue.record.remote())
        record["accounting"] = ray.get(self.queue.accounting.remote())
        # The queue's in-flight count must be exactly what the explorers still hold.
        record["explorer_groups_in_flight"] = self.rollouter.pending_groups
        path = Path(self.config.trainer.output_dir) / "fully_async.json"
        path.write_text(json.dumps(record, indent=1))

    def train_step(self) -> dict[str, float]:
        c, fa = self.config, self.config.fully_async
        started = time.perf_counter()
        trained_on = self.step - 1
        waited = 0.0
        parts: list[dict[str, float]] = []
        for _ in range(fa.trigger_parameter_sync_step):
            t0 = time.perf_counter()
            samples = self.take_groups(c.groups_per_update, trained_on)
            waited += time.perf_counter() - t0
            parts.append(self.train_on(samples, trained_on, fa.max_version_lag)[1])
        step_s = time.perf_counter() - started
        metrics = merge_updates(parts)
        accounting = ray.get(self.queue.accounting.remote())
        metrics.update(self.sides.times.drain())
        metrics.update(self.rollouter.drain())
        metrics.update(
            {
                "trainer/idle_ratio": waited / step_s,
                "queue/depth": float(accounting["queued"]),
                "queue/dropped_stale": float(accounting["dropped"]),
                "queue/in_flight": float(accounting["in_flight"]),
                "timing_s/step": step_s,
                "timing_s/trainer_wait": waited,
                "perf/throughput": metrics["perf/tokens"] / step_s,
            }
        )
        return metrics

    def take_groups(self, groups: int, trained_on: int) -> list[Any]:
        """The next `groups` groups the trainer at `trained_on` may train (stale ones are
        dropped by the queue); fails with the Rollouter's error if it died."""
        started = time.perf_counter()
        timeout_s = self.config.sync.timeout_s
        while True:
            samples = ray.get(self.queue.take.remote(groups, trained_on, POLL_S))
            if samples is not None:
                return list(samples)
            if self.rollouter.error is not None:
                raise self.rollouter.error
            if time.perf_counter() - started > timeout_s:
                raise TimeoutError(
                    f"trainer step {self.step}: {groups} groups did not arrive from the "
                    f"Rollouter within sync.timeout_s={timeout_s}s"
                )

    def save(self, loader_state: dict[str, int] | None = None) -> None:
        with self._prompt_lock:
            position = self.loader.state_dict()
            in_flight = sum(len(b) for b in self._spare)
        if in_flight:
            logger.info(
                "checkpoint at step %d: %d drawn prompts not yet generated", self.step, in_flight
            )
        super(SplitTrainer, self).save(position)


def merge_updates(parts: list[dict[str, float]]) -> dict[str, float]:
    """One train step's metrics from its updates (each of the same number of rows): sums for
    counts and seconds, maxima for maxima, means for the rest."""
    merged: dict[str, float] = {}
    for key in parts[0]:
        values = [part[key] for part in parts]
        if key.endswith("_max") or key.endswith("/max"):
            merged[key] = max(values)
        elif key.startswith("timing_s/") or key in SUMMED:
            merged[key] = sum(values)
        else:
            merged[key] = sum(values) / len(values)
    return merged


SUMMED = frozenset({"perf/tokens", "rollout/fresh_tokens", "actor/masked_stale_tokens"})
