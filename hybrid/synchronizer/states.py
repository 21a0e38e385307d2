"""The Synchronizer's four states and which moves between them each side may make.

Trinity-RFT's diagrams, one table per (method, side): with `nccl` both sides meet in
WAITING_SYNC for the broadcast; with `memory` and `checkpoint` the trainer never stops to sync
(it stays RUNNING) and the explorer alone moves RUNNING <-> REQUIRE_SYNC. Every side may start
(STOPPED -> RUNNING) and may stop or die from any state. Pure: no Ray, no tensors, so every
edge is unit-tested and a whole run's `sync_timeline.jsonl` can be replayed (`check_timeline`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal, get_args


class SyncState(StrEnum):
    STOPPED = "stopped"
    """Not started yet, finished, or dead."""
    RUNNING = "running"
    """Training or exploring."""
    REQUIRE_SYNC = "require_sync"
    """The explorer asks for new weights."""
    WAITING_SYNC = "waiting_sync"
    """Blocked in a sync (nccl: both sides join the broadcast)."""


Side = Literal["trainer", "explorer"]
Method = Literal["nccl", "memory", "checkpoint"]
SIDES: tuple[Side, ...] = get_args(Side)
METHODS: tuple[Method, ...] = get_args(Method)

_S = SyncState
_START_STOP = frozenset(
    {(_S.STOPPED, _S.RUNNING)} | {(old, _S.STOPPED) for old in _S if old is not _S.STOPPED}
)
_SYNC_MOVES: dict[tuple[Method, Side], frozenset[tuple[SyncState, SyncState]]] = {
    ("nccl", "trainer"): frozenset({(_S.RUNNING, _S.WAITING_SYNC), (_S.WAITING_SYNC, _S.RUNNING)}),
    ("nccl", "explorer"): frozenset(
        {
            (_S.RUNNING, _S.REQUIRE_SYNC),
            (_S.REQUIRE_SYNC, _S.WAITING_SYNC),
            (_S.WAITING_SYNC, _S.RUNNING),
            # a dynamic request that timed out; it is retried at the next step
            (_S.REQUIRE_SYNC, _S.RUNNING),
        }
    ),
    ("memory", "trainer"): frozenset(),
    ("memory", "explorer"): frozenset(
        {(_S.RUNNING, _S.REQUIRE_SYNC), (_S.REQUIRE_SYNC, _S.RUNNING)}
    ),
}
_SYNC_MOVES["checkpoint", "trainer"] = _SYNC_MOVES["memory", "trainer"]
_SYNC_MOVES["checkpoint", "explorer"] = _SYNC_MOVES["memory", "explorer"]


class TransitionError(ValueError):
    """A side tried a move its (method, side) table does not allow."""


def _check_method_side(method: str, side: str) -> None:
    if method not in METHODS:
        raise ValueError(f"sync method must be one of {list(METHODS)}, got {method!r}")
    if side not in SIDES:
        raise ValueError(f"side must be one of {list(SIDES)}, got {side!r}")


def allowed_transitions(method: Method, side: Side) -> frozenset[tuple[SyncState, SyncState]]:
    """Every (old, new) move `side` may make under `method`, start and stop included."""
    _check_method_side(method, side)
    return _START_STOP | _SYNC_MOVES[method, side]


def check_transition(method: Method, side: Side, old: SyncState, new: SyncState) -> None:
    """Raise TransitionError naming the move and the moves allowed from `old`."""
    allowed = allowed_transitions(method, side)
    if (old, new) in allowed:
        return
    moves = sorted(f"{o.value} -> {n.value}" for o, n in allowed if o is old)
    raise TransitionError(
        f"{method} {side} may not move {old.value} -> {new.value}; "
        f"allowed from {old.value}: {moves or 'none'}"
    )


@dataclass(frozen=True)
class Transition:
    """One logged move of one side (a line of `sync_timeline.jsonl`)."""

    side: Side
    old: SyncState
    new: SyncState
    version: int
    """The side's weight version at that moment (-1: nothing loaded yet)."""
    note: str = ""
    """Why, where it matters (a stop's reason, a timed-out request)."""
    time: float = field(default_factory=time.time)
    """Wall-clock seconds (time.time())."""

    def to_json(self) -> dict[str, Any]:
        return {
            "time": self.time,
            "side": self.side,
            "old": self.old.value,
            "new": self.new.value,
            "version": self.version,
            "note": self.note,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Transition:
        return cls(
            side=data["side"],
            old=SyncState(data["old"]),
            new=SyncState(data["new"]),
            version=int(data["version"]),
            note=data.get("note", ""),
            time=float(data["time"]),
        )


def check_timeline(method: Method, transitions: Iterable[Transition]) -> None:
    """Replay each side's moves from STOPPED; raise TransitionError at the first illegal one
    (a move not in the table, or one whose `old` is not where the side was)."""
    where: dict[str, SyncState] = dict.fromkeys(SIDES, SyncState.STOPPED)
    for index, move in enumerate(transitions):
        _check_method_side(method, move.side)
        if move.old is not where[move.side]:
            raise TransitionError(
                f"timeline entry {index}: {move.side} logged {move.old.value} -> "
                f"{move.new.value} but was {where[move.side].value}"
            )
        try:
            check_transition(method, move.side, move.old, move.new)
        except TransitionError as error:
            raise TransitionError(f"timeline entry {index}: {error}") from None
        where[move.side] = move.new
