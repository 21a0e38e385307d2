"""When each side of the split placement syncs, decided on one read of the Synchronizer (pure).

`SyncView` is what `Synchronizer.view` returns: both sides' states and versions and the newest
published version, read together under its lock (one round trip, and no mix of two moments).
The driver's two sides (hybrid/trainer/weight_sync.py) take one view, decide here, then act.

Whether the transport is a rendezvous (nccl: both sides meet for every version) matters to the
explorer only: there a version is "on offer" while the trainer waits in WAITING_SYNC, and an
open offer must always be joined (the trainer is blocked on it); otherwise the newest published
version waits in the store and the explorer takes it when its style says so.
"""

from __future__ import annotations

from dataclasses import dataclass

from hybrid.synchronizer.policy import SyncPolicy
from hybrid.synchronizer.states import SyncState


@dataclass(frozen=True)
class SyncView:
    trainer: SyncState
    explorer: SyncState
    trainer_version: int
    """The newest version the trainer has published or offers (-1: none yet)."""
    explorer_version: int
    """The version the explorer's engine holds (-1: nothing loaded yet)."""
    newest: int
    """The newest published version the Synchronizer keeps (-1: none yet)."""


def trainer_publishes(view: SyncView, policy: SyncPolicy, version: int, after_step: bool) -> bool:
    """Whether the trainer publishes `version` (its weights now): never when that version (or
    a newer one) is out already or the explorer is gone; after a step when the style's schedule
    says so; at any time when a dynamic explorer asks for something newer than it holds."""
    if view.newest >= version or view.explorer is SyncState.STOPPED:
        return False
    if after_step and policy.trainer_publishes_after(version):
        return True
    return (
        policy.style == "dynamic_by_explorer"
        and view.explorer in (SyncState.REQUIRE_SYNC, SyncState.WAITING_SYNC)
        and view.explorer_version < version
    )


def offer_open(view: SyncView, held: int) -> bool:
    """Rendezvous: the trainer offers a version newer than `held` right now. Its state alone
    would not do: it stays WAITING_SYNC for a moment after the explorer has received its
    broadcast, and joining that finished offer would wait for a send that never comes."""
    return view.trainer is SyncState.WAITING_SYNC and view.trainer_version > held


def explorer_syncs(
    view: SyncView, held: int, wanted: bool, takes_newer: bool, rendezvous: bool
) -> bool:
    """Whether the explorer, holding `held`, syncs now: when it `wanted` to (its staleness
    bound or its request schedule), when an offer is open (rendezvous), or when a newer
    version is published and it `takes_newer` ones (fixed style, the fully-async catch-up)."""
    if wanted:
        return True
    if rendezvous:
        return offer_open(view, held)
    return takes_newer and view.newest > held
