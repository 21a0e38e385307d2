"""What the two decoupled sources (split's buffer, fully-async's queue) share: the explorer
group they generate with, the two sides of the sync (the trainer's `TransportPublisher`, the
explorer's `SyncFollower`), the prompts, how Samples become a train batch, the trainer's
polling take, and the failure path that stops one side and closes the store."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import ray

from hybrid.controller import RayWorkerGroup
from hybrid.data import Batch
from hybrid.data.sample import samples_to_batch
from hybrid.rollout.base import Sampling
from hybrid.trainer.config import TrainerRunConfig
from hybrid.trainer.follower import SyncFollower
from hybrid.trainer.prompts import PromptFeed
from hybrid.trainer.publisher import TransportPublisher

POLL_S = 0.5
"""How often the trainer, waiting for data, looks at the generating side's health (and, in
split, at sync requests)."""

T = TypeVar("T")


@dataclass
class ExplorerSide:
    config: TrainerRunConfig
    explorers: RayWorkerGroup
    publisher: TransportPublisher
    """The trainer's side of the sync (main thread)."""
    follower: SyncFollower
    """The explorer's side of the sync (the source's generating thread)."""
    feed: PromptFeed
    pad_token_id: int

    def to_batch(self, samples: list[Any]) -> Batch:
        c = self.config
        return samples_to_batch(
            samples, c.rollout.response_length, self.pad_token_id, c.data.max_prompt_length
        )

    def generate_for_validation(self, prompts: Batch, sampling: Sampling) -> Batch:
        """Validation runs on the explorers, with the weights they hold (never the dummy
        weights an engine starts with: the starting version is loaded before anything runs)."""
        out = self.explorers.generate_sequences(prompts, sampling=sampling)
        held = out.tensors["versions"][out.tensors["response_mask"].bool()]
        if held.numel() and int(held.min()) < 0:
            raise RuntimeError("validation ran on an explorer that holds no weight version yet")
        return out


class Producer(Protocol):
    """The generating side's thread (split's explorer loop, fully-async's Rollouter)."""

    error: BaseException | None
    """What ended it, if it failed."""


def poll(
    take: Callable[[], T | None],
    producer: Producer,
    timeout_s: float,
    timeout_error: str,
    between: Callable[[], None] | None = None,
) -> T:
    """What `take()` (a store's take that waits up to POLL_S) returns first. Between tries: the
    producer's error is raised if it failed, TimeoutError(`timeout_error`, which names the
    producer) once `timeout_s` passed without data, else `between()`."""
    started = time.perf_counter()
    while True:
        got = take()
        if got is not None:
            return got
        if producer.error is not None:
            raise producer.error
        if time.perf_counter() - started > timeout_s:
            raise TimeoutError(timeout_error)
        if between is not None:
            between()


class Side(Protocol):
    def stop(self, reason: str) -> None:
        """Mark this side stopped for `reason` (waking the other side's waits)."""
        ...


def stop_side(side: Side, store: Any, reason: str) -> None:
    """A failure's path: stop `side` (the failed one) and close the `store` (the buffer or the
    queue actor, when there is one yet) with the same reason, so every waiter on either side
    wakes with it."""
    side.stop(reason)
    if store is not None:
        ray.get(store.close.remote(reason))
