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
