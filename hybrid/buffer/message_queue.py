"""`MessageQueue`: the fully-async mode's queue of finished prompt groups, with the staleness
accounting that paces the Rollouter (hybrid/buffer/staleness.py has the rules).

The Rollouter `reserve`s groups before it starts them (the production rule: it is granted
fewer, or none, when the version it holds has already been followed by its budget of groups),
the explorer workers `put` each group once all its responses are finished, and the trainer
`take`s groups, oldest completed first; a group whose oldest token lags more than
`max_version_lag` versions behind the trainer's is dropped there and counted, never returned.
The trainer tells the queue each version it `published`, with how many groups it had trained.

Every group is accounted for: started = trained + dropped + filtered (dynamic sampling left
it out) + held here + still generating
(`accounting()`), which is what a test of the sync race checks. The queue's length never
exceeds the production budget (admission bounds it; a put beyond it is a bug and raises).
One `threading.Condition` guards all state, so the threaded actor serves a blocked `take` and
the `put` that wakes it at once.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import ray

from hybrid.buffer.errors import BufferClosedError
from hybrid.buffer.experience import check_finished
from hybrid.buffer.staleness import groups_to_start, within_lag
from hybrid.data.sample import Sample

MAX_CONCURRENCY = 16
"""Calls the actor serves at once: every blocked take holds one thread."""


@dataclass(frozen=True)
class Admission:
    """One grant of the production rule (a line of the Rollouter's pacing record)."""

    version: int
    """The weight version the Rollouter held."""
    granted: int
    started: int
    """Groups started in all, this grant included."""
    dropped: int
    trained_at_version: int


class MessageQueue:
    def __init__(
        self,
        group_size: int,
        budget: int,
        max_version_lag: int,
        start_version: int = 0,
    ) -> None:
        if group_size < 1 or budget < 1:
            raise ValueError(f"group_size and budget must be >= 1, got {group_size}, {budget}")
        self.group_size = group_size
        self.budget = budget
        self.max_version_lag = max_version_lag
        self._cond = threading.Condition()
        self._groups: deque[list[Sample]] = deque()
        self._trained_at: dict[int, int] = {start_version: 0}
        self._started = self._dropped = self._trained = self._filtered = 0
        self._admissions: list[Admission] = []
        self._taken_lags: list[int] = []
        """Per trained group, its oldest token's lag when taken."""
        self._dropped_lags: list[int] = []
        self._closed_reason: str | None = None

    # --- the Rollouter's side ---------------------------------------------------------------

    def reserve(self, wanted: int, version: int) -> int:
        """Start up to `wanted` groups with weight `version` (published earlier); returns how
        many the production rule allows now (0: wait for a newer version)."""
        with self._cond:
            self._raise_if_closed()
            if version not in self._trained_at:
                raise KeyError(f"weight version {version} was never published to the queue")
            trained_at = self._trained_at[version]
            # A filtered group is never trained, so like a dropped one it hands its place back.
            gone = self._dropped + self._filtered
            allowed = groups_to_start(self._started, gone, trained_at, self.budget)
            granted = max(0, min(wanted, allowed))
            self._started += granted
            if granted:
                self._admissions.append(
                    Admission(version, granted, self._started, self._dropped, trained_at)
                )
            return granted

    def put(self, groups: list[list[Sample]]) -> None:
        """Add finished groups (each: group_size Samples of one uid, index 0 .. n-1)."""
        for group in groups:
            self._check_group(group)
        with self._cond:
            self._raise_if_closed()
            if len(self._groups) + len(groups) > self.budget:
                raise RuntimeError(
                    f"the queue would hold {len(self._groups) + len(groups)} groups, more than "
                    f"the production budget {self.budget}: groups were started without a grant"
                )
            self._groups.extend(groups)
            self._cond.notify_all()

    # --- the trainer's side -----------------------------------------------------------------

    def published(self, version: int) -> None:
        """The trainer published `version` after training every group it took so far."""
        with self._cond:
            newest = max(self._trained_at)
            if version <= newest:
                raise ValueError(f"version {version} is not newer than {newest}")
            self._trained_at[version] = self._trained
            self._cond.notify_all()

    def take(
        self,
        num_groups: int,
        trainer_version: int,
        timeout_s: float,
        min_groups: int | None = None,
    ) -> list[Sample] | None:
        """The oldest-completed groups the trainer at `trainer_version` may train, concatenated:
        `num_groups` of them, or with `min_groups` as many as are there up to `num_groups` once
        at least `min_groups` are (the trainer scores groups as they come); stale groups met on
        the way are dropped and counted. None when not enough arrived within `timeout_s` (the
        caller looks at other things and asks again)."""
        least = num_groups if min_groups is None else min_groups
        if not 1 <= least <= num_groups:
            raise ValueError(
                f"need 1 <= min_groups <= num_groups, got min_groups={min_groups}, "
                f"num_groups={num_groups}"
            )
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                self._raise_if_closed()
                self._drop_stale(trainer_version)
                if len(self._groups) >= least:
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._cond.wait(remaining)
            count = min(num_groups, len(self._groups))
            taken: list[Sample] = []
            for _ in range(count):
                group = self._groups.popleft()
                self._taken_lags.append(trainer_version - _oldest(group))
                taken.extend(group)
            self._trained += count
            self._cond.notify_all()
            return taken

    def filtered(self, count: int) -> None:
        """`count` groups the trainer took were left out of training by dynamic sampling (their
        rewards were all equal, or the update had enough): not trained, and the production
        rule lets the Rollouter start others in their place. A negative count takes back
        groups reported earlier that are trained after all (a short batch's backfill)."""
        with self._cond:
            if not -self._filtered <= count <= self._trained:
                raise ValueError(
                    f"filtered {count} groups of {self._trained} taken ({self._filtered} "
                    "filtered before)"
                )
            self._trained -= count
            self._filtered += count
            self._cond.notify_all()

    # --- both -------------------------------------------------------------------------------

    def depth(self) -> int:
        with self._cond:
            return len(self._groups)

    def accounting(self) -> dict[str, int]:
        """Where every started group is: trained, dropped (stale), filtered (dynamic
        sampling), held here, or still generating."""
        with self._cond:
            held = len(self._groups)
            left = self._trained + self._dropped + self._filtered + held
            return {
                "started": self._started,
                "trained": self._trained,
                "dropped": self._dropped,
                "filtered": self._filtered,
                "queued": held,
                "in_flight": self._started - left,
            }

    def record(self) -> dict[str, Any]:
        """The pacing and staleness record (tests and the run's fully_async.json)."""
        with self._cond:
            return {
                "budget": self.budget,
                "max_version_lag": self.max_version_lag,
                "trained_at": dict(self._trained_at),
                "admissions": [vars(a) for a in self._admissions],
                "taken_lags": list(self._taken_lags),
                "dropped_lags": list(self._dropped_lags),
            }

    def close(self, reason: str) -> None:
        """Refuse every later call and wake those waiting; the first reason stays."""
        with self._cond:
            if self._closed_reason is None:
                self._closed_reason = reason
            self._cond.notify_all()

    # --- under the lock ---------------------------------------------------------------------

    def _drop_stale(self, trainer_version: int) -> None:
        kept: deque[list[Sample]] = deque()
        for group in self._groups:
            oldest = _oldest(group)
            if within_lag(oldest, trainer_version, self.max_version_lag):
                kept.append(group)
            else:
                self._dropped += 1
                self._dropped_lags.append(trainer_version - oldest)
        if len(kept) != len(self._groups):
            self._groups = kept
            self._cond.notify_all()

    def _check_group(self, group: list[Sample]) -> None:
        if not group:
            raise ValueError("an empty group")
        uid = group[0].uid
        indexes = sorted(s.index for s in group)
        if indexes != list(range(self.group_size)) or any(s.uid != uid for s in group):
            raise ValueError(
                f"group {uid!r}: needs group_size={self.group_size} samples of one uid with "
                f"index 0 .. {self.group_size - 1}, got {[(s.uid, s.index) for s in group]}"
            )
        for sample in group:
            check_finished(sample, "queue")
            if not sample.versions:
                raise ValueError(f"sample {sample.uid}#{sample.index}: no response tokens")

    def _raise_if_closed(self) -> None:
        if self._closed_reason is not None:
            raise BufferClosedError(self._closed_reason)


def _oldest(group: list[Sample]) -> int:
    return min(sample.oldest_version for sample in group)


# Ray's overloads of `remote` list no actor-only option (max_concurrency); Ray accepts it.
MessageQueueActor = ray.remote(num_cpus=0, max_concurrency=MAX_CONCURRENCY)(  # type: ignore[call-overload]
    MessageQueue
)
"""The queue as a threaded Ray actor needing no CPU of its own (it only stores and waits)."""
