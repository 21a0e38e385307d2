"""trainer.mode=split: explorer workers generate into the experience buffer while trainer
workers train; the Synchronizer keeps them within the style's lag (sync.style).

The explorer loop (a driver thread) draws prompt batches in order, has its `SyncFollower` bring
the engines to an allowed weight version and has the explorers generate; they put their
Samples into the buffer themselves. The trainer takes one train batch of whole groups per step;
while it waits, its `TransportPublisher` answers sync requests. Either side's failure stops the
other: the Synchronizer and the buffer wake every waiter, and the run ends with the first
error, which names the side.

With dynamic sampling the explorer loop scores each round's groups itself and puts only a train
batch of informative ones into the buffer, generating further rounds on the same weights as
needed: the sync schedule and the trainer's side do not change. The kept groups' scores stay on
the driver (`KeptScores`, by uid), and the train batch that takes those groups gets them: the
step does not score them again.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import ray

from hybrid.buffer.errors import BufferClosedError
from hybrid.buffer.experience import ExperienceBufferActor
from hybrid.controller import StallError, WorkerDiedError
from hybrid.data import Batch
from hybrid.data.sample import Sample
from hybrid.rewards.manager import ScoredRows
from hybrid.rollout.base import Sampling
from hybrid.trainer.sources.base import Rollout
from hybrid.trainer.sources.explorers import POLL_S, ExplorerSide, poll, stop_side
from hybrid.trainer.sources.group_filter import DynamicSampling

DEATH_GRACE_S = 10.0
"""How long a failed trainer waits for the explorer loop to report a worker death."""
PROBE_ROWS_PER_EXPLORER = 2
PROBE_COLUMNS = ["input_ids", "attention_mask", "responses", "response_mask", "old_log_probs"]


class KeptScores:
    """Dynamic sampling's scored rule rewards of the groups the explorer loop put into the
    buffer, by uid, until the train batch that takes them claims them. The explorer loop puts,
    the trainer takes: one lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._groups: dict[str, tuple[list[int], ScoredRows]] = {}
        """uid -> (each row's index in the group, those rows' scores)."""

    def put(self, batch: Batch, scored: ScoredRows) -> None:
        """`scored`: the rewards of `batch`'s rows (whole groups)."""
        rows_of: dict[str, list[int]] = {}
        for row, uid in enumerate(batch["uid"]):
            rows_of.setdefault(str(uid), []).append(row)
        with self._lock:
            for uid, rows in rows_of.items():
                self._groups[uid] = ([int(batch["index"][r]) for r in rows], scored.select(rows))

    def take(self, batch: Batch) -> ScoredRows:
        """The scores of `batch`'s rows, in its order (its groups were put, whole)."""
        uids = [str(uid) for uid in batch["uid"]]
        with self._lock:
            groups = {uid: self._groups.pop(uid) for uid in dict.fromkeys(uids)}
        where: dict[tuple[str, int], int] = {}
        for uid, (indices, _) in groups.items():
            for index in indices:
                where[uid, index] = len(where)
        joined = ScoredRows.concat([scored for _, scored in groups.values()])
        indices = [int(index) for index in batch["index"]]
        return joined.select([where[key] for key in zip(uids, indices, strict=True)])


class ExplorerLoop(threading.Thread):
    """Explorer steps first..last: sync as allowed, then generate into the buffer."""

    def __init__(self, source: BufferSource, first: int, last: int) -> None:
        super().__init__(name="explorer-loop", daemon=True)
        self.source = source
        self.first, self.last = first, last
        self.error: BaseException | None = None
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        """This thread writes the figures below; the trainer reads them."""
        self._loader_states: dict[int, dict[str, int]] = {}
        """The prompt loader's position before each explorer step, recorded as soon as the
        step before drew its batch (checkpoints need the trainer's position, which lags)."""
        self._gen_s = 0.0

    def run(self) -> None:
        s, buffer = self.source.side, self.source.buffer
        try:
            for step in range(self.first, self.last + 1):
                if self.stopping.is_set():
                    return
                s.follower.before_step(step)
                if self.source.sampling is not None:
                    self.explore_filtered(step, self.source.sampling)
                    continue
                prompts = s.feed.batch(step)
                self._position_before(step + 1)
                stats = s.explorers.explore(prompts, buffer, s.config.sync.timeout_s)
                self._add_gen_s(max(st["gen_s"] for st in stats))
            s.follower.finished()
        except BaseException as error:  # handed to the trainer, which raises it
            self.error = error
            stop_side(s.follower, buffer, f"explorer loop failed: {type(error).__name__}: {error}")

    def explore_filtered(self, step: int, sampling: DynamicSampling) -> None:
        """Dynamic sampling: rounds of fresh prompts on this step's weights until a train batch
        of informative groups is there (or the rounds run out), then only those groups go into
        the buffer, their scores kept for the trainer."""
        s = self.source.side
        groups: dict[str, list[Sample]] = {}

        def next_round(round: int, room: int) -> Sequence[Batch]:
            started = time.perf_counter()
            per_rank = s.explorers.explore_samples(s.feed.batch(step, round))
            self._add_gen_s(time.perf_counter() - started)
            fresh: dict[str, list[Sample]] = {}
            for sample in (sample for rank in per_rank for sample in rank):
                # A row repeated to fill the last rank (DP_COMPUTE's padding) comes back twice.
                if not any(seen.index == sample.index for seen in fresh.get(sample.uid, [])):
                    fresh.setdefault(sample.uid, []).append(sample)
            groups.update(fresh)
            return [s.to_batch([sample for group in fresh.values() for sample in group])]

        batch, scored = sampling.collect(f"explorer step {step}", next_round)
        self._position_before(step + 1)
        self.source.kept.put(batch, scored)  # before the trainer can take the groups
        chosen = [sample for uid in dict.fromkeys(batch["uid"]) for sample in groups[str(uid)]]
        ray.get(self.source.buffer.put.remote(chosen, s.config.sync.timeout_s))

    def drain_gen_s(self) -> float:
        """Seconds the explorers generated since the last drain."""
        with self._lock:
            gen_s, self._gen_s = self._gen_s, 0.0
            return gen_s

    def loader_state(self, step: int) -> dict[str, int]:
        with self._lock:
            return self._loader_states[step]

    def _add_gen_s(self, seconds: float) -> None:
        with self._lock:
            self._gen_s += seconds

    def _position_before(self, step: int) -> None:
        position = self.source.side.feed.position()[0]
        with self._lock:
            self._loader_states[step] = position


class BufferSource:
    def __init__(self, side: ExplorerSide, sampling: DynamicSampling | None = None) -> None:
        """`sampling`: dynamic sampling on the explorer side (the buffer gets only informative
        groups)."""
        self.side = side
        self.sampling = sampling
        self.kept = KeptScores()
        self.config = side.config
        policy = side.publisher.policy
        self.lag_bound = policy.lag_bound()
        self.probe_rows = min(
            side.config.data.train_batch_size * side.config.rollout.n,
            PROBE_ROWS_PER_EXPLORER * side.config.trainer.num_explorer_workers,
        )
        # Room for the batches the style lets the explorer run ahead (a bigger one never fills).
        groups = side.config.data.train_batch_size * policy.buffer_batches()
        self.buffer = ExperienceBufferActor.remote(side.config.rollout.n, groups)
        self.loop: ExplorerLoop | None = None
        self.wait_s = 0.0

    def start(self, step: int) -> None:
        self.loop = ExplorerLoop(self, step + 1, self.config.trainer.total_steps)
        self.loop.start()

    def batches(self, step: int) -> Iterator[Rollout]:
        batch = self.side.to_batch(self.take(step))
        yield Rollout(batch, self.kept.take(batch) if self.sampling is not None else None)

    def take(self, step: int) -> list[Any]:
        """The next train batch of whole groups; the publisher answers sync requests while it
        waits."""
        assert self.loop is not None
        timeout_s = self.config.sync.timeout_s
        started = time.perf_counter()
        samples = poll(
            lambda: ray.get(self.buffer.take.remote(self.config.data.train_batch_size, POLL_S)),
            self.loop,
            timeout_s,
            f"trainer step {step}: no train batch from the explorer within "
            f"sync.timeout_s={timeout_s}s",
            between=lambda: self.side.publisher.serve_while_waiting(step),
        )
        self.wait_s = time.perf_counter() - started
        return list(samples)

    def probes_scored(self, probes: Batch, trained_on: int) -> None:
        """A few rows, scored under the version the actor holds, check the explorer's copy of
        that version before it moves on (SyncFollower._probe); handed over before the update,
        so the explorer can score them while the trainer trains."""
        # Older versions' probes go: the explorer skipped them.
        oldest_kept = trained_on - self.lag_bound - 1
        self.side.publisher.take_probe(trained_on, probes.select(PROBE_COLUMNS), oldest_kept)

    def metrics(self, worker: dict[str, float], step_s: float) -> dict[str, float]:
        assert self.loop is not None
        depth = ray.get(self.buffer.depth.remote())
        out = {
            "buffer/groups": float(depth.groups),
            "timing_s/trainer_wait": self.wait_s,
            "timing_s/gen": self.loop.drain_gen_s(),
        }
        if self.sampling is not None:  # the explorer's rounds since the last step
            out.update(self.sampling.metrics())
        return out

    def resume_position(self, step: int) -> dict[str, int]:
        # The loader has run ahead with the explorer: its position after this step's batch,
        # so that a resumed run draws the next batch as this one would have.
        assert self.loop is not None
        return self.loop.loader_state(step + 1)

    def generate_for_validation(self, prompts: Batch, sampling: Sampling) -> Batch:
        return self.side.generate_for_validation(prompts, sampling)

    def finish(self) -> None:
        assert self.loop is not None
        self.loop.join(timeout=self.config.sync.timeout_s)

    def fail(self, error: BaseException) -> BaseException:
        if self.loop is not None:
            self.loop.stopping.set()
        reason = f"trainer loop failed: {type(error).__name__}: {error}"
        stop_side(self.side.publisher, self.buffer, reason)
        # A dead or stalled explorer makes the trainer's next sync or take fail too (a closed
        # connection, a closed buffer): report the root cause, which names the explorer.
        if isinstance(error, WorkerDiedError) or self.loop is None or self.loop.ident is None:
            return error
        self.loop.join(timeout=DEATH_GRACE_S)
        died = self.loop.error
        if isinstance(died, (WorkerDiedError, StallError)) or isinstance(error, BufferClosedError):
            return died or error
        return error
