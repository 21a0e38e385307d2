"""The Synchronizer: the one place that holds each side's sync state and weight version, the
newest published weight versions and the timeline of every state change.

It knows no tensors and no model: a published payload is opaque (ObjectRefs for `memory`, a
directory for `checkpoint`, nothing for `nccl`). `Synchronizer` is a plain class guarded by one
`threading.Condition`, so it is testable without Ray; `SynchronizerActor` runs it as a threaded
Ray actor, where the blocking waits of both sides are served by concurrent threads.

"Stopped" differs from "not started yet": both read STOPPED, but a wait ends with
PeerStoppedError only once a side has been stopped (`stop`, or a move to STOPPED), so the two
sides may start in any order.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import ray

from hybrid.synchronizer.decide import SyncView
from hybrid.synchronizer.errors import PeerStoppedError
from hybrid.synchronizer.states import (
    METHODS,
    SIDES,
    Method,
    Side,
    SyncState,
    Transition,
    check_transition,
)

MAX_CONCURRENCY = 32
"""Calls the actor serves at once: every blocked wait holds one thread."""


class Synchronizer:
    def __init__(self, method: Method, timeline_path: str | None, keep_versions: int = 2) -> None:
        if method not in METHODS:
            raise ValueError(f"sync.method must be one of {list(METHODS)}, got {method!r}")
        if keep_versions < 1:
            raise ValueError(f"sync.keep_versions must be >= 1, got {keep_versions}")
        self.method: Method = method
        self.keep_versions = keep_versions
        self._cond = threading.Condition()
        self._states: dict[Side, SyncState] = dict.fromkeys(SIDES, SyncState.STOPPED)
        self._versions: dict[Side, int] = dict.fromkeys(SIDES, -1)
        self._stop_reasons: dict[Side, str | None] = dict.fromkeys(SIDES, None)
        self._published: list[tuple[int, Any]] = []  # oldest first, at most keep_versions
        self._timeline: list[Transition] = []
        self._timeline_path = Path(timeline_path) if timeline_path else None
        if self._timeline_path is not None:
            # One file per Synchronizer: a fresh one replays from STOPPED (check_timeline).
            self._timeline_path.parent.mkdir(parents=True, exist_ok=True)
            self._timeline_path.write_text("")

    # --- states -----------------------------------------------------------------------------

    def set_state(
        self, side: Side, new: SyncState, version: int | None = None, note: str = ""
    ) -> None:
        """Move `side` to `new` (TransitionError if its table forbids it), logging the move
        with the side's version (`version`, when given, is stored first)."""
        new = SyncState(new)
        with self._cond:
            old = self._state_of(side)
            check_transition(self.method, side, old, new)
            if version is not None:
                self._versions[side] = version
            self._move(side, old, new, note)
            if new is SyncState.STOPPED:
                self._stop_reasons[side] = note or "moved to stopped"
            elif old is SyncState.STOPPED:
                self._stop_reasons[side] = None  # started (again)
            self._cond.notify_all()

    def stop(self, side: Side, reason: str, version: int | None = None) -> None:
        """Mark `side` stopped for `reason` and wake every waiter (`version`, when given, is
        the side's version as it stops). Idempotent: a second stop keeps the first reason. A
        side that never started is not logged (it was STOPPED) but its reason is kept, so
        waiters on it fail."""
        with self._cond:
            old = self._state_of(side)
            if old is SyncState.STOPPED and self._stop_reasons[side] is not None:
                return
            if version is not None:
                self._versions[side] = version
            if old is not SyncState.STOPPED:
                self._move(side, old, SyncState.STOPPED, reason)
            self._stop_reasons[side] = reason
            self._cond.notify_all()

    def state(self, side: Side) -> SyncState:
        with self._cond:
            return self._state_of(side)

    def states(self) -> dict[str, str]:
        with self._cond:
            return {side: state.value for side, state in self._states.items()}

    def version(self, side: Side) -> int:
        """The weight version `side` holds (-1: nothing loaded yet)."""
        with self._cond:
            self._state_of(side)
            return self._versions[side]

    def view(self) -> SyncView:
        """Both sides' states and versions and the newest published version, read at one
        moment (what the sides decide on: hybrid.synchronizer.decide)."""
        with self._cond:
            return SyncView(
                trainer=self._states["trainer"],
                explorer=self._states["explorer"],
                trainer_version=self._versions["trainer"],
                explorer_version=self._versions["explorer"],
                newest=self._published[-1][0] if self._published else -1,
            )

    def timeline(self) -> list[dict[str, Any]]:
        with self._cond:
            return [move.to_json() for move in self._timeline]

    # --- versions ---------------------------------------------------------------------------

    def publish(self, version: int, payload: Any = None) -> None:
        """The trainer published `version` (newer than every earlier one); keep the newest
        `keep_versions` payloads and drop the older ones.

        Under Ray, ObjectRefs passed inside a list (or dict) argument arrive as ObjectRefs, not
        values, and this actor then holds a reference that keeps each object alive until its
        version is dropped. A bare ObjectRef argument would be resolved to its value instead.
        An object still fate-shares with its owner (the process that `ray.put` it): a
        publisher that may exit before the explorer reads should put with
        `_owner=<this actor>`.
        """
        with self._cond:
            newest = self._published[-1][0] if self._published else -1
            if version <= newest:
                raise ValueError(
                    f"published version {version} is not newer than the newest published "
                    f"version {newest}"
                )
            self._published.append((version, payload))
            # Dropping the pairs releases their ObjectRefs (the objects can then be freed).
            del self._published[: -self.keep_versions]
            self._versions["trainer"] = max(self._versions["trainer"], version)
            self._cond.notify_all()

    def newest(self) -> tuple[int, Any]:
        """The newest published (version, payload); (-1, None) before the first publish."""
        with self._cond:
            return self._published[-1] if self._published else (-1, None)

    def payload(self, version: int) -> Any:
        with self._cond:
            for kept, payload in self._published:
                if kept == version:
                    return payload
            raise KeyError(
                f"weight version {version} is not kept; kept: {[v for v, _ in self._published]}"
            )

    # --- waits ------------------------------------------------------------------------------

    def wait_for_version(self, min_version: int, timeout_s: float, waiter: Side) -> int | None:
        """Block until the newest published version is >= `min_version` and return it, or
        return None after `timeout_s`. Raise PeerStoppedError when a side stops first (a
        version already published is still returned)."""
        deadline = time.monotonic() + timeout_s
        waited_for = f"weight version >= {min_version}"
        with self._cond:
            sides = self._sides_to_watch(_peer(waiter), waiter)
            while True:
                if self._published and self._published[-1][0] >= min_version:
                    return self._published[-1][0]
                self._raise_if_stopped(sides, waiter, waited_for)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._cond.wait(remaining)

    def wait_for_state(
        self,
        side: Side,
        states: Iterable[SyncState],
        timeout_s: float,
        waiter: Side,
        min_version: int | None = None,
    ) -> SyncState | None:
        """Block until `side` is in one of `states` (holding at least `min_version`, when
        given) and return that state, or return None after `timeout_s`. Raise PeerStoppedError
        when a side stops first (unless STOPPED is awaited).

        This waits for a state, not an event: a state the side leaves again at once may be
        missed, so await states the side holds until the waiter acts (nccl's WAITING_SYNC).
        Conversely a state may still show an event that is over: the trainer stays
        WAITING_SYNC for a moment after its broadcast has been received, so an explorer that
        asks for the next offer names the version it needs."""
        wanted = frozenset(SyncState(state) for state in states)
        deadline = time.monotonic() + timeout_s
        waited_for = f"{side} in {sorted(state.value for state in wanted)}"
        if min_version is not None:
            waited_for += f" at weight version >= {min_version}"
        with self._cond:
            sides = self._sides_to_watch(side, waiter)
            while True:
                if self._states[side] in wanted and (
                    min_version is None or self._versions[side] >= min_version
                ):
                    return self._states[side]
                if SyncState.STOPPED not in wanted:
                    self._raise_if_stopped(sides, waiter, waited_for)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._cond.wait(remaining)

    # --- under the lock ---------------------------------------------------------------------

    def _state_of(self, side: Side) -> SyncState:
        if side not in self._states:
            raise ValueError(f"side must be one of {list(SIDES)}, got {side!r}")
        return self._states[side]

    def _sides_to_watch(self, awaited: Side, waiter: Side) -> tuple[Side, ...]:
        self._state_of(awaited)
        self._state_of(waiter)
        # The awaited side first: its stop is the usual cause; the waiter's own stop (by the
        # driver, say) ends its wait too.
        return (awaited,) if awaited == waiter else (awaited, waiter)

    def _raise_if_stopped(self, sides: tuple[Side, ...], waiter: Side, waited_for: str) -> None:
        for side in sides:
            reason = self._stop_reasons[side]
            if self._states[side] is SyncState.STOPPED and reason is not None:
                raise PeerStoppedError(side, reason, waiter, waited_for)

    def _move(self, side: Side, old: SyncState, new: SyncState, note: str) -> None:
        self._states[side] = new
        move = Transition(side=side, old=old, new=new, version=self._versions[side], note=note)
        self._timeline.append(move)
        if self._timeline_path is not None:
            # One line per move, flushed: a killed run leaves a readable file.
            with self._timeline_path.open("a") as file:
                file.write(json.dumps(move.to_json()) + "\n")


def _peer(side: Side) -> Side:
    return "explorer" if side == "trainer" else "trainer"


# Ray's overloads of `remote` list no actor-only option (max_concurrency); Ray accepts it.
SynchronizerActor = ray.remote(num_cpus=0, max_concurrency=MAX_CONCURRENCY)(  # type: ignore[call-overload]
    Synchronizer
)
"""The Synchronizer as a threaded Ray actor; it needs no CPU of its own (it only waits)."""
