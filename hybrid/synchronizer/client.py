"""The driver's handle on the Synchronizer actor: each of its calls, blocking and typed.

The trainer side (hybrid/trainer/publisher.py) and the explorer side
(hybrid/trainer/follower.py) reach the actor only through this class, so every state move,
stop and wait goes by one name, and no caller writes `ray.get(handle.x.remote(...))`.
Thread-safe: it holds nothing but the handle, and the threaded actor serves both sides at once.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import ray

from hybrid.synchronizer.decide import SyncView
from hybrid.synchronizer.states import Side, SyncState


class SynchronizerClient:
    def __init__(self, handle: Any) -> None:
        self.handle = handle
        """The actor itself, for the workers that publish into it (transport payloads)."""

    def set_state(
        self, side: Side, state: SyncState, version: int | None = None, note: str = ""
    ) -> None:
        ray.get(self.handle.set_state.remote(side, state, version, note))

    def stop(self, side: Side, reason: str, version: int | None = None) -> None:
        """Mark `side` stopped for `reason` (idempotent: the first reason stays) and wake
        every waiter."""
        ray.get(self.handle.stop.remote(side, reason, version))

    def view(self) -> SyncView:
        view: SyncView = ray.get(self.handle.view.remote())
        return view

    def version(self, side: Side) -> int:
        return int(ray.get(self.handle.version.remote(side)))

    def newest(self) -> tuple[int, Any]:
        newest, payload = ray.get(self.handle.newest.remote())
        return int(newest), payload

    def payload(self, version: int) -> Any:
        return ray.get(self.handle.payload.remote(version))

    def wait_for_state(
        self,
        side: Side,
        states: Iterable[SyncState],
        timeout_s: float,
        waiter: Side,
        min_version: int | None = None,
    ) -> SyncState | None:
        """`side` in one of `states` (None after `timeout_s`): Synchronizer.wait_for_state."""
        seen = ray.get(
            self.handle.wait_for_state.remote(side, list(states), timeout_s, waiter, min_version)
        )
        return None if seen is None else SyncState(seen)

    def wait_for_version(self, min_version: int, timeout_s: float, waiter: Side) -> int | None:
        """The newest published version once >= `min_version` (None after `timeout_s`)."""
        got = ray.get(self.handle.wait_for_version.remote(min_version, timeout_s, waiter))
        return None if got is None else int(got)
