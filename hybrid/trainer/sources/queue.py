"""trainer.mode=fully_async (verl's fully-async plan): the Rollouter keeps the explorers
generating into the MessageQueue, paced by the staleness rule; the trainer takes
`require_batches` mini-batches of whole groups as soon as they are there and updates on them,
`trigger_parameter_sync_step` times per train step, after which the next weight version is
published. The Rollouter picks it up between generation chunks (plan 2, partial rollouts) or
between whole batches (plan 1). Groups that arrive too stale are dropped by the queue and
counted. The trainer takes groups as they leave the queue, and each group's rule rewards start
scoring then, while the rest of its batch still generates. With dynamic sampling each part is
scored as it arrives and only groups whose rewards differ count towards the update; the queue
counts the rest as filtered, and the Rollouter starts others in their place.

Resuming restarts the Rollouter at the prompt loader's position at the checkpoint: prompts
that were in flight then (generating or queued) are not replayed, and the log says how many.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ray

from hybrid.buffer.message_queue import MessageQueueActor
from hybrid.buffer.staleness import production_budget
from hybrid.data import Batch
from hybrid.rewards.manager import RewardManager, RewardStream, Scores
from hybrid.trainer.sources.base import Rollout
from hybrid.trainer.sources.explorers import POLL_S, ExplorerSide
from hybrid.trainer.sources.group_filter import DynamicSampling, FilterTally, GroupFilter
from hybrid.trainer.sources.rollouter import Rollouter
from hybrid.trainer.step import StepResult

logger = logging.getLogger(__name__)


class QueueSource:
    def __init__(
        self,
        side: ExplorerSide,
        rewards: RewardManager | None = None,
        sampling: DynamicSampling | None = None,
    ) -> None:
        """`rewards`: score each group's rule rewards as soon as it leaves the queue (None: the
        train step scores the whole batch, e.g. when a reward model takes part); `sampling`:
        dynamic sampling, which scores each part as it arrives and keeps only groups whose
        rewards differ."""
        self.side = side
        self.rewards = rewards
        self.sampling = sampling
        self.tally = FilterTally()
        self.parts_per_update: list[int] = []
        self.config, self.sides, self.feed = side.config, side.sides, side.feed
        config = side.config
        self.lag_bound = config.fully_async.max_version_lag
        self.budget = production_budget(
            config.fully_async.staleness_threshold, config.groups_per_version
        )
        self.queue: Any = None
        self.rollouter: Rollouter | None = None
        self.wait_s = 0.0

    def start(self, step: int) -> None:
        c, fa = self.config, self.config.fully_async
        self.feed.start_rows(step * c.data.train_batch_size)  # distinct seeds after a resume
        self.queue = MessageQueueActor.remote(
            c.rollout.n, self.budget, fa.max_version_lag, start_version=step
        )
        # Plan 2 keeps as many groups in the engine as the staleness rule allows (a step costs
        # about the same with more sequences); plan 1 generates batches of train_batch_size.
        self.rollouter = Rollouter(
            self.side.explorers,
            self.queue,
            self.feed.rows,
            self.sides.explorer_catch_up,
            groups_in_flight=self.budget if fa.partial_rollout else c.data.train_batch_size,
            max_steps=fa.chunk_tokens if fa.partial_rollout else None,
            partial_rollout=fa.partial_rollout,
            # Dynamic sampling hands filtered groups' places back within a version.
            wake_on_grants=self.sampling is not None,
            on_error=self._rollouter_failed,
        )
        self.rollouter.start()

    def batches(self, step: int) -> Iterator[Rollout]:
        self.wait_s = 0.0
        self.parts_per_update = []
        for _ in range(self.config.fully_async.trigger_parameter_sync_step):
            started = time.perf_counter()
            groups = self.config.groups_per_update
            rewards: Scores | None
            if self.sampling is None:
                parts, rewards = self.take(groups, step)
            else:
                parts, rewards = self.take_filtered(groups, step)
            self.wait_s += time.perf_counter() - started
            self.parts_per_update.append(len(parts))
            yield Rollout(parts[0] if len(parts) == 1 else Batch.concat(parts), rewards)

    def take_filtered(self, groups: int, step: int) -> tuple[list[Batch], Scores]:
        """Dynamic sampling: the next `groups` groups whose rewards differ, each part scored as
        it leaves the queue; at most max_num_gen_batches x `groups` taken (then on_exhausted
        decides). The queue counts the groups left out as filtered: the Rollouter may start
        others in their place."""
        assert self.sampling is not None
        c = self.sampling
        kept = GroupFilter(c.config, c.rewards, groups, f"train step {step}")
        budget = c.config.max_num_gen_batches * groups
        taken = reported = 0
        while kept.missing and taken < budget:
            parts, _ = self.take(min(kept.missing, budget - taken), step, score=False)
            for part in parts:
                kept.add(part)
                taken += len(part) // self.config.rollout.n
            # At once: the Rollouter may be waiting for these places to start more groups.
            reported = self._report_filtered(kept.tally.not_trained, reported)
        # Rounds, as colocated counts them: the update's worth of groups taken.
        kept.tally.rounds = -(-taken // groups)
        try:
            batch, scores = kept.finish()
        finally:
            self.tally.add(kept.tally)
            self._report_filtered(kept.tally.not_trained, reported)  # less if backfilled
        return [batch], scores

    def _report_filtered(self, not_trained: int, reported: int) -> int:
        if not_trained != reported:
            ray.get(self.queue.filtered.remote(not_trained - reported))
        return not_trained

    def take(
        self, groups: int, step: int, score: bool = True
    ) -> tuple[list[Batch], RewardStream | None]:
        """The next `groups` groups the trainer at version step - 1 may train (stale ones are
        dropped by the queue), as the parts they arrived in; each part's rule rewards start
        scoring as it arrives, while the rest still generate. Fails with the Rollouter's error
        if it died."""
        assert self.rollouter is not None
        timeout_s = self.config.sync.timeout_s
        stream = None if self.rewards is None or not score else self.rewards.stream()
        parts: list[Batch] = []
        missing = groups
        waited_since = time.perf_counter()
        while missing:
            samples = ray.get(self.queue.take.remote(missing, step - 1, POLL_S, 1))
            if samples is not None:
                part = self.side.to_batch(list(samples))
                if stream is not None:
                    stream.add(part)
                parts.append(part)
                missing -= len(samples) // self.config.rollout.n
                waited_since = time.perf_counter()
                continue
            if self.rollouter.error is not None:
                raise self.rollouter.error
            if time.perf_counter() - waited_since > timeout_s:
                raise TimeoutError(
                    f"trainer step {step}: no group arrived from the Rollouter within "
                    f"sync.timeout_s={timeout_s}s ({missing} of {groups} still missing)"
                )
        return parts, stream

    def trained(self, result: StepResult, trained_on: int) -> None:
        pass

    def metrics(self, worker: dict[str, float], step_s: float) -> dict[str, float]:
        assert self.rollouter is not None
        accounting = ray.get(self.queue.accounting.remote())
        out = {
            **self.rollouter.drain(),
            "trainer/idle_ratio": self.wait_s / step_s,
            "queue/depth": float(accounting["queued"]),
            "queue/dropped_stale": float(accounting["dropped"]),
            "queue/in_flight": float(accounting["in_flight"]),
            "timing_s/trainer_wait": self.wait_s,
            # >1: the groups came in several parts, each scored as it came.
            "queue/parts_per_update": sum(self.parts_per_update) / len(self.parts_per_update),
        }
        if self.sampling is not None:
            out.update(self.tally.metrics())
            out["queue/filtered"] = float(accounting["filtered"])
            self.tally = FilterTally()
        return out

    def after_step(self, step: int) -> None:
        if step < self.config.trainer.total_steps:
            ray.get(self.queue.published.remote(step))

    def resume_position(self, step: int) -> dict[str, int]:
        position, in_flight = self.feed.position()
        if in_flight:
            logger.info(
                "checkpoint at step %d: %d drawn prompts not yet generated", step, in_flight
            )
        return position

    def generate_greedy(self, prompts: Batch) -> Batch:
        return self.side.generate_greedy(prompts)

    def finish(self) -> None:
        assert self.rollouter is not None
        self.rollouter.stopping.set()
        ray.get(self.sides.sync.stop.remote("trainer", "finished"))
        self.rollouter.join(timeout=self.config.sync.timeout_s)
        self.write_record()

    def fail(self, error: BaseException) -> BaseException:
        if self.rollouter is not None:
            self.rollouter.stopping.set()
        reason = f"trainer loop failed: {type(error).__name__}: {error}"
        ray.get(self.sides.sync.stop.remote("trainer", reason))
        if self.queue is not None:
            ray.get(self.queue.close.remote(reason))
        # A dead Rollouter makes the trainer's next take or sync fail too: report it.
        died = None if self.rollouter is None else self.rollouter.error
        return died or error

    def _rollouter_failed(self, error: BaseException) -> None:
        """Wake the trainer wherever it waits (a take, a broadcast) with the Rollouter's end."""
        reason = f"Rollouter failed: {type(error).__name__}: {error}"
        ray.get(self.sides.sync.stop.remote("explorer", reason))
        ray.get(self.queue.close.remote(reason))

    def write_record(self) -> None:
        """fully_async.json: where every started group ended, and the pacing record."""
        assert self.rollouter is not None
        record = ray.get(self.queue.record.remote())
        record["accounting"] = ray.get(self.queue.accounting.remote())
        # The queue's in-flight count must be exactly what the explorers still hold.
        record["explorer_groups_in_flight"] = self.rollouter.pending_groups
        path = Path(self.config.trainer.output_dir) / "fully_async.json"
        path.write_text(json.dumps(record, indent=1))
