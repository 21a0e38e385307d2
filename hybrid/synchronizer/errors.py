"""The error a Synchronizer wait raises when a side it depends on has stopped."""

from __future__ import annotations


class PeerStoppedError(RuntimeError):
    """A side stopped (finished, failed, or was stopped by the driver) while another waited."""

    def __init__(self, side: str, reason: str, waiter: str, waited_for: str) -> None:
        super().__init__(f"{side} stopped ({reason}) while {waiter} waited for {waited_for}")
        self.side = side
        self.reason = reason
        self.waiter = waiter
        self.waited_for = waited_for

    def __reduce__(self) -> tuple[type, tuple[str, str, str, str]]:
        # Ray pickles the exception back to the caller: rebuild from the fields.
        return (type(self), (self.side, self.reason, self.waiter, self.waited_for))
