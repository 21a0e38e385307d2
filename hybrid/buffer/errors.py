"""The buffer's errors: a wait that ran past its deadline, and a buffer shut down under a caller."""

from __future__ import annotations


class BufferTimeoutError(TimeoutError):
    """A `put` waited `timeout_s` for space and the trainer did not take enough to free it."""


class BufferClosedError(RuntimeError):
    """The buffer was closed (`close(reason)`): no more puts or takes.

    `args` is `(reason,)` so that the error pickles back to itself across Ray.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason

    def __str__(self) -> str:
        return f"experience buffer closed: {self.reason}"
