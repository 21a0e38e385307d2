"""Errors a group call raises on the driver, each naming the member, method and rank."""

from __future__ import annotations


class WorkerCallError(RuntimeError):
    """A member method raised inside a worker; carries the worker-side traceback."""

    def __init__(self, member: str, method: str, rank: int, detail: str) -> None:
        super().__init__(f"{member}.{method} failed on rank {rank}:\n{detail}")
        self.member = member
        self.method = method
        self.rank = rank
        self.detail = detail

    def __reduce__(self) -> tuple[type, tuple[str, str, int, str]]:
        # Ray pickles the exception back to the driver: rebuild from the fields, not the message.
        return (type(self), (self.member, self.method, self.rank, self.detail))


class WorkerDiedError(WorkerCallError):
    """The worker process is gone (killed, crashed, out of memory) while serving a call."""


class StallError(TimeoutError):
    """A phase passed its deadline: named by phase, the ranks still in it, how long the driver
    waited and what each rank was last seen doing (hybrid/controller/progress.py)."""

    def __init__(self, phase: str, ranks: list[int], waited_s: float, detail: str) -> None:
        super().__init__(
            f"{phase} stalled on rank{'s' if len(ranks) > 1 else ''} "
            f"{', '.join(map(str, ranks))}: no result after {waited_s:.0f}s ({detail})"
        )
        self.phase = phase
        self.ranks = ranks
        self.waited_s = waited_s
        self.detail = detail

    def __reduce__(self) -> tuple[type, tuple[str, list[int], float, str]]:
        return (type(self), (self.phase, self.ranks, self.waited_s, self.detail))
