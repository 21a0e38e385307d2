"""trainer.mode=split: explorer workers generate into the experience buffer while trainer
workers train; the Synchronizer keeps them within the style's lag (sync.style).

The explorer loop (a driver thread) draws prompt batches in order, brings the engines to an
allowed weight version (`SyncSides.explorer_sync`) and has the explorers generate; they put
their Samples into the buffer themselves. The trainer takes one train batch of whole groups
per step, answering sync requests while it waits. Either side's failure stops the other: the
Synchronizer and the buffer wake every waiter, and the run ends with the first error, which
names the side.

With dynamic sampling the explorer loop scores each round's groups itself and puts only a train
batch of informative ones into the buffer, generating further rounds on the same weights as
needed: the sync schedule and the trainer's side do not change.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import ray

from hybrid.buffer.errors import BufferClosedError
from hybrid.buffer.experience import ExperienceBufferActor
from hybrid.controller import StallError, WorkerDiedError
from hybrid.data import Batch
from hybrid.data.sample import Sample
from hybrid.trainer.sources.base import Rollout
from hybrid.trainer.sources.explorers import POLL_S, ExplorerSide
from hybrid.trainer.sources.group_filter import DynamicSampling, FilterTally, GroupFilter
from hybrid.trainer.step import StepResult

DEATH_GRACE_S = 10.0
"""How long a failed trainer waits for the explorer loop to report a worker death."""
PROBE_ROWS_PER_EXPLORER = 2
PROBE_COLUMNS = ["input_ids", "attention_mask", "responses", "response_mask", "old_log_probs"]


class ExplorerLoop(threading.Thread):
    """Explorer steps first..last: sync as allowed, then generate into the buffer."""

    def __init__(self, source: BufferSource, first: int, last: int) -> None:
        super().__init__(name="explorer-loop", daemon=True)
        self.source = source
        self.first, self.last = first, last
        self.error: BaseException | None = None
        self.loader_states: dict[int, dict[str, int]] = {}
        """The prompt loader's position before each explorer step, recorded as soon as the
        step before drew its batch (checkpoints need the trainer's position, which lags)."""
        self.gen_s = 0.0
        self.stopping = threading.Event()

    def run(self) -> None:
        s, buffer = self.source.side, self.source.buffer
        try:
            for step in range(self.first, self.last + 1):
                if self.stopping.is_set():
                    return
                waited = time.perf_counter()
                s.sides.explorer_sync(step)
                s.sides.times.explorer_wait_s += time.perf_counter() - waited
                if self.source.sampling is not None:
                    self.explore_filtered(step)
                    continue
                prompts = s.feed.batch(step)
                self.loader_states[step + 1] = s.feed.position()[0]
                stats = s.explorers.explore(prompts, buffer, s.config.sync.timeout_s)
                self.gen_s += max(st["gen_s"] for st in stats)
            s.sides.explorer_finished()
        except BaseException as error:  # handed to the trainer, which raises it
            self.error = error
            reason = f"explorer loop failed: {type(error).__name__}: {error}"
            ray.get(s.sides.sync.stop.remote("explorer", reason))
            ray.get(buffer.close.remote(reason))

    def explore_filtered(self, step: int) -> None:
        """Dynamic sampling: rounds of fresh prompts on this step's weights until a train batch
        of informative groups is there (or the rounds run out), then only those groups go into
        the buffer. The trainer takes and scores them as usual."""
        s, sampling = self.source.side, self.source.sampling
        assert sampling is not None
        kept = GroupFilter(
            sampling.config, sampling.rewards, sampling.groups, f"explorer step {step}"
        )
        groups: dict[str, list[Sample]] = {}
        while kept.missing and not kept.exhausted():
            started = time.perf_counter()
            per_rank = s.explorers.explore_samples(s.feed.batch(step, kept.tally.rounds))
            self.gen_s += time.perf_counter() - started
            fresh: dict[str, list[Sample]] = {}
            for sample in (sample for rank in per_rank for sample in rank):
                # A row repeated to fill the last rank (DP_COMPUTE's padding) comes back twice.
                if not any(seen.index == sample.index for seen in fresh.get(sample.uid, [])):
                    fresh.setdefault(sample.uid, []).append(sample)
            groups.update(fresh)
            kept.add(s.to_batch([sample for group in fresh.values() for sample in group]))
            kept.round_done()
        self.loader_states[step + 1] = s.feed.position()[0]
        try:
            batch, _ = kept.finish()
        finally:
            with self.source.tally_lock:
                self.source.tally.add(kept.tally)
        chosen = [sample for uid in dict.fromkeys(batch["uid"]) for sample in groups[str(uid)]]
        ray.get(self.source.buffer.put.remote(chosen, s.config.sync.timeout_s))


class BufferSource:
    def __init__(self, side: ExplorerSide, sampling: DynamicSampling | None = None) -> None:
        """`sampling`: dynamic sampling on the explorer side (the buffer gets only informative
        groups)."""
        self.side = side
        self.sampling = sampling
        self.tally = FilterTally()
        self.tally_lock = threading.Lock()
        self.config, self.sides = side.config, side.sides
        self.lag_bound = side.sides.policy.lag_bound()
        # Room for the batches the style lets the explorer run ahead (a bigger one never fills).
        groups = side.config.data.train_batch_size * side.sides.policy.buffer_batches()
        self.buffer = ExperienceBufferActor.remote(side.config.rollout.n, groups)
        self.loop: ExplorerLoop | None = None
        self.wait_s = 0.0

    def start(self, step: int) -> None:
        self.loop = ExplorerLoop(self, step + 1, self.config.trainer.total_steps)
        self.loop.start()

    def batches(self, step: int) -> Iterator[Rollout]:
        yield Rollout(self.side.to_batch(self.take(step)))

    def take(self, step: int) -> list[Any]:
        """The next train batch of whole groups; answers sync requests while it waits."""
        assert self.loop is not None
        timeout_s = self.config.sync.timeout_s
        started = time.perf_counter()
        while True:
            samples = ray.get(self.buffer.take.remote(self.config.data.train_batch_size, POLL_S))
            if samples is not None:
                self.wait_s = time.perf_counter() - started
                return list(samples)
            if self.loop.error is not None:
                raise self.loop.error
            if time.perf_counter() - started > timeout_s:
                raise TimeoutError(
                    f"trainer step {step}: no train batch from the explorer within "
                    f"sync.timeout_s={timeout_s}s"
                )
            self.sides.trainer_sync(step - 1, after_step=False)

    def trained(self, result: StepResult, trained_on: int) -> None:
        """A few trained rows, scored under the version the actor holds, check the explorer's
        copy of that version before it moves on (SyncSides._probe)."""
        rows = min(
            len(result.batch), PROBE_ROWS_PER_EXPLORER * self.config.trainer.num_explorer_workers
        )
        if "old_log_probs" in result.batch:
            self.sides.probes[trained_on] = result.batch.select(PROBE_COLUMNS)[:rows]
        for stale in [v for v in self.sides.probes if v < trained_on - self.lag_bound - 1]:
            self.sides.probes.pop(stale, None)  # versions the explorer skipped

    def metrics(self, worker: dict[str, float], step_s: float) -> dict[str, float]:
        assert self.loop is not None
        depth = ray.get(self.buffer.depth.remote())
        gen_s, self.loop.gen_s = self.loop.gen_s, 0.0
        out = {
            "buffer/groups": float(depth.groups),
            "timing_s/trainer_wait": self.wait_s,
            "timing_s/gen": gen_s,
        }
        if self.sampling is not None:  # the explorer's rounds since the last step
            with self.tally_lock:
                out.update(self.tally.metrics())
                self.tally = FilterTally()
        return out

    def after_step(self, step: int) -> None:
        pass

    def resume_position(self, step: int) -> dict[str, int]:
        # The loader has run ahead with the explorer: its position after this step's batch,
        # so that a resumed run draws the next batch as this one would have.
        assert self.loop is not None
        return self.loop.loader_states[step + 1]

    def generate_greedy(self, prompts: Batch) -> Batch:
        return self.side.generate_greedy(prompts)

    def finish(self) -> None:
        assert self.loop is not None
        self.loop.join(timeout=self.config.sync.timeout_s)
        last = self.config.trainer.total_steps
        ray.get(self.sides.sync.set_state.remote("trainer", "stopped", last, "finished"))

    def fail(self, error: BaseException) -> BaseException:
        if self.loop is not None:
            self.loop.stopping.set()
        reason = f"trainer loop failed: {type(error).__name__}: {error}"
        ray.get(self.sides.sync.stop.remote("trainer", reason))
        ray.get(self.buffer.close.remote(reason))
        # A dead or stalled explorer makes the trainer's next sync or take fail too (a closed
        # connection, a closed buffer): report the root cause, which names the explorer.
        if isinstance(error, WorkerDiedError) or self.loop is None or self.loop.ident is None:
            return error
        self.loop.join(timeout=DEATH_GRACE_S)
        died = self.loop.error
        if isinstance(died, (WorkerDiedError, StallError)) or isinstance(error, BufferClosedError):
            return died or error
        return error
