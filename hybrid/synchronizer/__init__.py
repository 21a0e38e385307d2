"""The Synchronizer of the split placement (Trinity-RFT): each side's state, when each side
syncs, the published weight versions and the timeline. Knows no tensors and no model.

states.py  the four states and each (method, side)'s allowed moves (pure)
policy.py  the `fixed` and `dynamic_by_explorer` schedules and their lag bound (pure)
decide.py  each side's "sync now?" on one view of the Synchronizer (pure)
actor.py   the Synchronizer class and its threaded Ray actor
client.py  the driver's blocking, typed handle on that actor (every call the two sides make)
errors.py  PeerStoppedError
"""

from hybrid.synchronizer.actor import Synchronizer, SynchronizerActor
from hybrid.synchronizer.client import SynchronizerClient
from hybrid.synchronizer.decide import SyncView, explorer_syncs, offer_open, trainer_publishes
from hybrid.synchronizer.errors import PeerStoppedError
from hybrid.synchronizer.policy import SyncPolicy, SyncStyle
from hybrid.synchronizer.states import (
    Method,
    Side,
    SyncState,
    Transition,
    TransitionError,
    allowed_transitions,
    check_timeline,
    check_transition,
)

__all__ = [
    "Method",
    "PeerStoppedError",
    "Side",
    "SyncPolicy",
    "SyncState",
    "SyncStyle",
    "SyncView",
    "Synchronizer",
    "SynchronizerActor",
    "SynchronizerClient",
    "Transition",
    "TransitionError",
    "allowed_transitions",
    "check_timeline",
    "check_transition",
    "explorer_syncs",
    "offer_open",
    "trainer_publishes",
]
