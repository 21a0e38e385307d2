"""The Rollouter: the fully-async mode's explorer side, a loop of its own (`fit`) on a driver
thread that keeps the explorer group generating into the MessageQueue.

Each turn: pick up newer weights if there are any (plan 2, partial rollouts: every turn, the
unfinished samples continue under them; plan 1: only when nothing is in flight, i.e. between
whole generation batches), ask the queue how many new prompt groups the staleness rule allows,
and have the explorers generate: plan 2 `chunk_tokens` engine steps (about that many tokens of
every sample in flight; unfinished samples stay in the engine, new prompts join as others
finish, so the engine stays full), plan 1 until every response is whole.
With no grant and nothing in flight the Rollouter pauses until the trainer publishes a newer
version (with dynamic sampling, or until the trainer hands filtered groups' places back); that
time is its idle time.

It knows the weights only through `catch_up(wait)` (its `SyncFollower`'s, which the source
passes in: the sync belongs to the Synchronizer's protocol, whose trainer side alone publishes)
and the prompts through `next_prompts(k)`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import ray

from hybrid.controller import RayWorkerGroup
from hybrid.data import Batch

GRANT_POLL_S = 0.05
"""With dynamic sampling, how often a paused Rollouter asks again for a version or a grant."""


class Rollouter(threading.Thread):
    def __init__(
        self,
        explorers: RayWorkerGroup,
        queue: Any,
        next_prompts: Callable[[int], Batch],
        catch_up: Callable[[bool], int],
        *,
        groups_in_flight: int,
        max_steps: int | None,
        partial_rollout: bool,
        on_error: Callable[[BaseException], None],
        wake_on_grants: bool = False,
    ) -> None:
        super().__init__(name="rollouter", daemon=True)
        self.explorers = explorers
        self.queue = queue
        self.next_prompts = next_prompts
        self.catch_up = catch_up
        self.groups_in_flight = groups_in_flight
        """Prompt groups the explorers generate at once (new ones join as others finish)."""
        self.max_steps = max_steps
        """Engine steps per turn (plan 2: chunk_tokens, about that many tokens per sample);
        None (plan 1): until every sample in flight finished."""
        self.partial_rollout = partial_rollout
        self.wake_on_grants = wake_on_grants
        """A pause also ends when the queue grants again under the version held (dynamic
        sampling: the trainer hands filtered groups' places back before it publishes)."""
        self.on_error = on_error
        """Called with the error that ends the loop (not when it was asked to stop)."""
        self.stopping = threading.Event()
        self.error: BaseException | None = None
        self.pending_groups = 0
        self.syncs_mid_generation = 0
        """Weight loads with samples in flight (plan 2: they continue under the new weights)."""
        self.idle_s = self.gen_s = 0.0
        self.tokens = 0.0
        self._since = time.perf_counter()
        self._paused_at: float | None = None
        self._lock = threading.Lock()

    def run(self) -> None:
        try:
            self.fit()
        except BaseException as error:  # read by the trainer loop, which raises it
            if not self.stopping.is_set():
                self.error = error
                self.on_error(error)

    def fit(self) -> None:
        held = self.catch_up(False)
        while not self.stopping.is_set():
            if self.partial_rollout or self.pending_groups == 0:
                before, held = held, self.catch_up(False)
                if held != before and self.pending_groups:
                    self.syncs_mid_generation += 1
            wanted = self.groups_in_flight - self.pending_groups
            granted = ray.get(self.queue.reserve.remote(wanted, held)) if wanted > 0 else 0
            if granted == 0 and self.pending_groups == 0:
                with self._lock:
                    self._paused_at = time.perf_counter()
                if self.wake_on_grants:  # look again soon: a version, or places handed back
                    self.stopping.wait(GRANT_POLL_S)
                    held = self.catch_up(False)
                else:
                    held = self.catch_up(True)  # until the trainer publishes a newer version
                with self._lock:
                    self.idle_s += time.perf_counter() - self._paused_at
                    self._paused_at = None
                continue
            prompts = self.next_prompts(granted) if granted else None
            stats = self.explorers.stream(prompts, self.queue, self.max_steps)
            self.pending_groups = int(sum(s["pending_groups"] for s in stats))
            self._add(gen_s=max(s["gen_s"] for s in stats), tokens=sum(s["tokens"] for s in stats))

    def _add(self, gen_s: float, tokens: float) -> None:
        with self._lock:
            self.gen_s += gen_s
            self.tokens += tokens

    def drain(self) -> dict[str, float]:
        """Since the last drain: the share of wall time spent paused, generate seconds,
        tokens generated (the trainer's step metrics)."""
        with self._lock:
            now = time.perf_counter()
            if self._paused_at is not None:  # a pause that goes on: its share so far
                self.idle_s += now - self._paused_at
                self._paused_at = now
            wall = max(now - self._since, 1e-9)
            out = {
                "rollouter/idle_ratio": min(self.idle_s / wall, 1.0),
                "timing_s/gen": self.gen_s,
                "rollouter/tokens": self.tokens,
                "rollouter/groups_in_flight": float(self.pending_groups),
                "rollouter/syncs_mid_generation": float(self.syncs_mid_generation),
            }
            self.idle_s = self.gen_s = self.tokens = 0.0
            self._since = now
            return out
