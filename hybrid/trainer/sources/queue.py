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

The queue hears of each version from the trainer's publisher, once, as it goes out
(`on_published`): which groups were trained by then is what paces the Rollouter.

Resuming restarts the Rollouter at the prompt loader's position at the checkpoint: prompts
that were in flight then (generating or queued) are not replayed, and the log says how many.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import ray

from hybrid.buffer.message_queue import MessageQueueActor
from hybrid.buffer.staleness import production_budget
from hybrid.data import Batch
from hybrid.rewards.manager import RewardManager, RewardStream, Scores
from hybrid.rollout.base import Sampling
from hybrid.trainer.sources.base import Rollout
from hybrid.trainer.sources.explorers import POLL_S, ExplorerSide, poll, stop_side
from hybrid.trainer.sources.group_filter import DynamicSampling, FilterTally
from hybrid.trainer.sources.rollouter import Rollouter

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
        self.parts_per_update: list[int] = []
        self.config, self.feed = side.config, side.feed
        config = side.config
        self.lag_bound = config.fully_async.max_version_lag
        self.probe_rows = 0
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
            self.side.follower.catch_up,
            groups_in_flight=self.budget if fa.partial_rollout else c.data.train_batch_size,
            max_steps=fa.chunk_tokens if fa.partial_rollout else None,
            partial_rollout=fa.partial_rollout,
            # Dynamic sampling hands filtered groups' places back within a version.
            wake_on_grants=self.sampling is not None,
            on_error=self._rollouter_failed,
        )
        self.side.publisher.subscribe(self)
        self.rollouter.start()

    def on_published(self, version: int) -> None:
        """The trainer publishes `version`, having trained every group it took so far."""
        ray.get(self.queue.published.remote(version))

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
                parts, rewards = self.take_filtered(step)
            self.wait_s += time.perf_counter() - started
            self.parts_per_update.append(len(parts))
            yield Rollout(parts[0] if len(parts) == 1 else Batch.concat(parts), rewards)

    def take_filtered(self, step: int) -> tuple[list[Batch], Scores]:
        """Dynamic sampling: an update's groups whose rewards differ, each part scored as it
        leaves the queue; at most max_num_gen_batches updates' worth taken (then on_exhausted
        decides). The queue counts the groups left out as filtered: the Rollouter may start
        others in their place."""
        assert self.sampling is not None
        reported = 0

        def report(tally: FilterTally) -> None:
            # At once: the Rollouter may be waiting for these places to start more groups.
            nonlocal reported
            if tally.not_trained != reported:
                ray.get(self.queue.filtered.remote(tally.not_trained - reported))
                reported = tally.not_trained

        batch, scores = self.sampling.collect(
            f"train step {step}",
            lambda _, room: self.take(room, step, score=False)[0],
            progress=report,
        )
        return [batch], scores

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
        while missing:
            samples = poll(
                partial(self._take_groups, missing, step - 1),
                self.rollouter,
                timeout_s,
                f"trainer step {step}: no group arrived from the Rollouter within "
                f"sync.timeout_s={timeout_s}s ({missing} of {groups} still missing)",
            )
            part = self.side.to_batch(samples)
            if stream is not None:
                stream.add(part)
            parts.append(part)
            missing -= len(samples) // self.config.rollout.n
        return parts, stream

    def _take_groups(self, groups: int, trainer_version: int) -> list[Any] | None:
        """Up to `groups` groups once one is there (None after POLL_S)."""
        samples = ray.get(self.queue.take.remote(groups, trainer_version, POLL_S, 1))
        return None if samples is None else list(samples)

    def probes_scored(self, probes: Batch, trained_on: int) -> None:
        pass  # probe_rows = 0: never asked

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
            out.update(self.sampling.metrics())
            out["queue/filtered"] = float(accounting["filtered"])
        return out

    def resume_position(self, step: int) -> dict[str, int]:
        position, in_flight = self.feed.position()
        if in_flight:
            logger.info(
                "checkpoint at step %d: %d drawn prompts not yet generated", step, in_flight
            )
        return position

    def generate_for_validation(self, prompts: Batch, sampling: Sampling) -> Batch:
        return self.side.generate_for_validation(prompts, sampling)

    def finish(self) -> None:
        assert self.rollouter is not None
        self.rollouter.stopping.set()
        # The Rollouter never ends by itself: the trainer's side ends first (which ends a wait
        # for a version), and the Rollouter stops at its next turn.
        self.side.publisher.stop("finished")
        self.rollouter.join(timeout=self.config.sync.timeout_s)
        self.write_record()

    def fail(self, error: BaseException) -> BaseException:
        if self.rollouter is not None:
            self.rollouter.stopping.set()
        reason = f"trainer loop failed: {type(error).__name__}: {error}"
        stop_side(self.side.publisher, self.queue, reason)
        # A dead Rollouter makes the trainer's next take or sync fail too: report it.
        died = None if self.rollouter is None else self.rollouter.error
        return died or error

    def _rollouter_failed(self, error: BaseException) -> None:
        """Wake the trainer wherever it waits (a take, a broadcast) with the Rollouter's end."""
        stop_side(
            self.side.follower, self.queue, f"Rollouter failed: {type(error).__name__}: {error}"
        )

    def write_record(self) -> None:
        """fully_async.json: where every started group ended, and the pacing record."""
        assert self.rollouter is not None
        record = ray.get(self.queue.record.remote())
        record["accounting"] = ray.get(self.queue.accounting.remote())
        # The queue's in-flight count must be exactly what the explorers still hold.
        record["explorer_groups_in_flight"] = self.rollouter.pending_groups
        path = Path(self.config.trainer.output_dir) / "fully_async.json"
        path.write_text(json.dumps(record, indent=1))
