"""`ExperienceBuffer`: the bounded queue of finished Samples between explorers and the trainer.

Explorers `put` Samples; the Samples of one prompt (`uid`) wait as a partial group until all
`group_size` responses (`index` 0 .. group_size-1) arrived, then the group becomes available.
The trainer `take`s whole groups, first completed first out, each group in `index` order (GRPO
needs every response of a prompt together to normalise its advantages).

Bounds: at most `capacity_groups` groups, complete and partial together; a `put` that would
exceed it waits for the trainer to take (backpressure on the explorers). A put is all or
nothing: it is validated whole, then waits, then lands whole.

Accepted statuses are COMPLETED and TRUNCATED. PENDING (a partial rollout not yet resumed) and
ABORTED ("not to be trained on", sample.py) are refused: a group with an aborted response
would reach the trainer one response short of a full group, so the explorer either resumes the
response or drops the whole group (and never puts any of its samples).

The buffer forgets a uid once its group is taken: a later sample with that uid starts a new
group. One `threading.Condition` guards all state, so the threaded Ray actor
(`ExperienceBufferActor`) can serve a blocked `take` and the `put` that wakes it at once.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass

import ray

from hybrid.buffer.errors import BufferClosedError, BufferTimeoutError
from hybrid.data.sample import Sample, SampleStatus

ACCEPTED_STATUSES = frozenset({SampleStatus.COMPLETED, SampleStatus.TRUNCATED})

MAX_CONCURRENCY = 16
"""Calls the actor serves at once: every blocked put or take holds one thread."""


@dataclass(frozen=True)
class BufferDepth:
    """What the buffer holds now, and what passed through it so far."""

    groups: int
    """Complete groups waiting to be taken."""
    partial_groups: int
    """Uids with some, but not all, of their samples."""
    samples: int
    """Samples held, those of partial groups included."""
    put_groups: int
    """Groups completed in the buffer since it was made."""
    taken_groups: int
    """Groups taken since it was made."""


def _name(sample: Sample) -> str:
    return f"{sample.uid}#{sample.index}"


def check_finished(sample: Sample, holder: str) -> None:
    """A sample the `holder` (the buffer, the queue) may keep: finished, and whole."""
    if sample.status not in ACCEPTED_STATUSES:
        raise ValueError(
            f"sample {_name(sample)}: status {sample.status.value}, the {holder} takes only "
            f"{sorted(s.value for s in ACCEPTED_STATUSES)} (resume a pending response; drop "
            "the whole group of an aborted one)"
        )
    sample.check()


class ExperienceBuffer:
    """Complete GRPO groups of Samples, FIFO by completion, bounded by `capacity_groups`."""

    def __init__(self, group_size: int, capacity_groups: int) -> None:
        if group_size < 1:
            raise ValueError(f"group_size must be at least 1, got {group_size}")
        if capacity_groups < 1:
            raise ValueError(f"capacity_groups must be at least 1, got {capacity_groups}")
        self.group_size = group_size
        self.capacity_groups = capacity_groups
        self._cond = threading.Condition()
        self._partial: dict[str, dict[int, Sample]] = {}
        self._complete: dict[str, list[Sample]] = {}  # insertion order = completion order
        self._num_samples = 0
        self._put_groups = 0
        self._taken_groups = 0
        self._closed_reason: str | None = None

    def put(self, samples: list[Sample], timeout_s: float | None = None) -> None:
        """Add finished samples; wait up to `timeout_s` (None: forever) for room for their groups.

        Raises ValueError for a sample the buffer refuses (named `uid#index`) or a put of more
        groups than the capacity, BufferTimeoutError when no room freed in time, and
        BufferClosedError once the buffer is closed.
        """
        uids: set[str] = set()
        for sample in samples:
            self._check_alone(sample)
            uids.add(sample.uid)
        duplicates = [
            key for key, count in Counter((s.uid, s.index) for s in samples).items() if count > 1
        ]
        if duplicates:
            uid, index = duplicates[0]
            raise ValueError(f"sample {uid}#{index}: appears more than once in one put")
        if len(uids) > self.capacity_groups:
            raise ValueError(
                f"a put of {len(uids)} groups can never fit a buffer of capacity_groups="
                f"{self.capacity_groups}"
            )
        with self._cond:
            self._raise_if_closed()
            self._check_against_held(samples)
            if not self._cond.wait_for(
                lambda: self._closed_reason is not None or self._fits(uids), timeout_s
            ):
                raise BufferTimeoutError(
                    f"put of {len(uids)} groups waited {timeout_s} s for room and the trainer "
                    f"took too little: capacity_groups={self.capacity_groups}, {self._describe()}"
                )
            self._raise_if_closed()
            self._check_against_held(samples)  # another put may have landed while we waited
            for sample in samples:
                self._add(sample)
            self._cond.notify_all()

    def take(self, num_groups: int, timeout_s: float) -> list[Sample] | None:
        """The first `num_groups` complete groups, concatenated, each in `index` order.

        Waits up to `timeout_s` for that many; returns None if they did not arrive in time, so
        the caller can look at other things between tries. Raises BufferClosedError once closed.
        """
        if not 1 <= num_groups <= self.capacity_groups:
            raise ValueError(
                f"num_groups must be in 1 .. capacity_groups={self.capacity_groups}, got {num_groups}"
            )
        with self._cond:
            ready = self._cond.wait_for(
                lambda: self._closed_reason is not None or len(self._complete) >= num_groups,
                timeout_s,
            )
            self._raise_if_closed()
            if not ready:
                return None
            taken: list[Sample] = []
            for uid in list(self._complete)[:num_groups]:
                taken.extend(self._complete.pop(uid))
            self._num_samples -= len(taken)
            self._taken_groups += num_groups
            self._cond.notify_all()
            return taken

    def depth(self) -> BufferDepth:
        with self._cond:
            return BufferDepth(
                groups=len(self._complete),
                partial_groups=len(self._partial),
                samples=self._num_samples,
                put_groups=self._put_groups,
                taken_groups=self._taken_groups,
            )

    def close(self, reason: str) -> None:
        """Refuse every later put and take, and wake those waiting; the first reason stays."""
        with self._cond:
            if self._closed_reason is None:
                self._closed_reason = reason
            self._cond.notify_all()

    def _check_alone(self, sample: Sample) -> None:
        """What can be checked of one sample without the buffer's state."""
        if not 0 <= sample.index < self.group_size:
            raise ValueError(
                f"sample {_name(sample)}: index {sample.index} outside 0 .. {self.group_size - 1} "
                f"(group_size={self.group_size})"
            )
        check_finished(sample, "buffer")

    def _check_against_held(self, samples: list[Sample]) -> None:
        for sample in samples:
            if sample.uid in self._complete:
                raise ValueError(
                    f"sample {_name(sample)}: more than group_size={self.group_size} samples for "
                    f"uid {sample.uid!r}, whose group is already complete"
                )
            if sample.index in self._partial.get(sample.uid, {}):
                raise ValueError(f"sample {_name(sample)}: already in the buffer")

    def _fits(self, uids: set[str]) -> bool:
        new_groups = len(uids - self._partial.keys())
        return len(self._complete) + len(self._partial) + new_groups <= self.capacity_groups

    def _add(self, sample: Sample) -> None:
        group = self._partial.setdefault(sample.uid, {})
        group[sample.index] = sample
        self._num_samples += 1
        if len(group) == self.group_size:
            del self._partial[sample.uid]
            self._complete[sample.uid] = [group[index] for index in range(self.group_size)]
            self._put_groups += 1

    def _raise_if_closed(self) -> None:
        if self._closed_reason is not None:
            raise BufferClosedError(self._closed_reason)

    def _describe(self) -> str:
        return (
            f"holding {len(self._complete)} complete + {len(self._partial)} partial groups "
            f"({self._num_samples} samples)"
        )


# Ray's overloads of `remote` list no actor-only option (max_concurrency); Ray accepts it.
ExperienceBufferActor = ray.remote(num_cpus=0, max_concurrency=MAX_CONCURRENCY)(  # type: ignore[call-overload]
    ExperienceBuffer
)
"""The buffer as a threaded Ray actor, needing no CPU of its own (it only stores and waits): a
blocked `take` holds one thread, so a `put` from another caller still runs and wakes it."""
