"""trainer.mode=colocated: the training workers generate between updates (the hybrid engine).

Each step draws its prompts and calls `generate_sequences` on the actor group; the mode switch
inside the call gathers the actor's weights into the engine first, so the samples always come
from the weights being trained (version step - 1, lag 0). With dynamic sampling a step may
generate several rounds, each on fresh prompts and the same weights.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import torch

from hybrid.controller import WorkerGroupView
from hybrid.data import Batch
from hybrid.data.sample import NO_VERSION
from hybrid.rollout.base import Sampling
from hybrid.trainer.prompts import PromptFeed
from hybrid.trainer.sources.base import Rollout
from hybrid.trainer.sources.group_filter import DynamicSampling


class ColocatedSource:
    lag_bound = 0
    probe_rows = 0

    def __init__(
        self, actor: WorkerGroupView, feed: PromptFeed, sampling: DynamicSampling | None = None
    ) -> None:
        self.actor = actor
        self.feed = feed
        self.sampling = sampling
        self.rollout_s = 0.0

    def start(self, step: int) -> None:
        pass  # nothing runs between steps

    def batches(self, step: int) -> Iterator[Rollout]:
        self.rollout_s = 0.0
        if self.sampling is None:
            yield Rollout(self._generate(step, 0))
            return
        # Dynamic sampling: rounds of fresh prompts, all on this step's weights, until the
        # batch is full of informative groups or the rounds run out.
        batch, scores = self.sampling.collect(
            f"train step {step}", lambda round, _: [self._generate(step, round)]
        )
        yield Rollout(batch, scores)

    def _generate(self, step: int, round: int) -> Batch:
        prompts = self.feed.batch(step, round)
        started = time.perf_counter()
        rollout = self.actor.generate_sequences(prompts)
        self.rollout_s += time.perf_counter() - started
        return with_version(rollout, step - 1)

    def probes_scored(self, probes: Batch, trained_on: int) -> None:
        pass  # probe_rows = 0: never asked

    def metrics(self, worker: dict[str, float], step_s: float) -> dict[str, float]:
        out = {
            "timing_s/gen": worker.get("timing_s/gen", 0.0),
            # The rollout call as the driver sees it: sync + generation + release + Ray.
            "timing_s/trainer_wait": self.rollout_s,
            "timing_s/rollout_call": self.rollout_s,
        }
        if self.sampling is not None:
            out.update(self.sampling.metrics())
        return out

    def resume_position(self, step: int) -> dict[str, int]:
        return self.feed.position()[0]

    def generate_for_validation(self, prompts: Batch, sampling: Sampling) -> Batch:
        return self.actor.generate_sequences(prompts, sampling=sampling)

    def finish(self) -> None:
        pass

    def fail(self, error: BaseException) -> BaseException:
        return error


def with_version(rollout: Batch, version: int) -> Batch:
    """Mark every response token as sampled by `version`: colocated generation runs on the
    weights the actor holds (the workers count syncs since they started, which a resumed run
    restarts; the driver knows the step)."""
    mask = rollout.tensors["response_mask"].bool()
    versions = torch.full(mask.shape, NO_VERSION, dtype=torch.long).masked_fill(mask, version)
    return Batch(dict(rollout.tensors, versions=versions), rollout.non_tensors, rollout.meta)
