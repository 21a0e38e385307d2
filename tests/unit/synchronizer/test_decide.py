"""The sides' "sync now?" decisions on a view of the Synchronizer, edge by edge of their
tables, and `Synchronizer.view` reading both sides at one moment."""

from __future__ import annotations

import itertools

import pytest

from hybrid.synchronizer.actor import Synchronizer
from hybrid.synchronizer.decide import SyncView, explorer_syncs, offer_open, trainer_publishes
from hybrid.synchronizer.policy import SyncPolicy
from hybrid.synchronizer.states import SyncState

pytestmark = pytest.mark.unit

S = SyncState
FIXED = SyncPolicy("fixed", interval=2, offset=0, max_staleness=1)
DYNAMIC = SyncPolicy("dynamic_by_explorer", explorer_steps=2, max_staleness=1)


def view(
    trainer: SyncState = S.RUNNING,
    explorer: SyncState = S.RUNNING,
    trainer_version: int = 3,
    explorer_version: int = 2,
    newest: int = 2,
) -> SyncView:
    return SyncView(trainer, explorer, trainer_version, explorer_version, newest)


# --- trainer ------------------------------------------------------------------------------


def test_the_fixed_trainer_publishes_on_its_schedule_after_a_step() -> None:
    assert trainer_publishes(view(newest=3), FIXED, 4, after_step=True)
    assert not trainer_publishes(view(newest=2), FIXED, 3, after_step=True)  # interval 2
    # While waiting for data it never publishes on schedule (a fixed explorer never asks).
    assert not trainer_publishes(view(newest=3, explorer=S.REQUIRE_SYNC), FIXED, 4, False)


def test_nothing_is_published_twice_or_to_a_gone_explorer() -> None:
    assert not trainer_publishes(view(newest=4), FIXED, 4, after_step=True)
    assert not trainer_publishes(view(newest=5), FIXED, 4, after_step=True)
    assert not trainer_publishes(view(newest=3, explorer=S.STOPPED), FIXED, 4, True)
    asking = view(newest=3, explorer=S.REQUIRE_SYNC, explorer_version=1)
    assert not trainer_publishes(asking, DYNAMIC, 3, after_step=False)


@pytest.mark.parametrize(
    ("explorer", "explorer_version", "publishes"),
    [
        (S.REQUIRE_SYNC, 2, True),
        (S.WAITING_SYNC, 2, True),
        (S.RUNNING, 2, False),  # not asking
        (S.REQUIRE_SYNC, 3, False),  # asks for what it holds already
        (S.REQUIRE_SYNC, 4, False),
    ],
)
def test_the_dynamic_trainer_publishes_when_asked_for_something_newer(
    explorer: SyncState, explorer_version: int, publishes: bool
) -> None:
    for after_step in (False, True):
        seen = view(explorer=explorer, explorer_version=explorer_version, newest=1)
        assert trainer_publishes(seen, DYNAMIC, 3, after_step) is publishes


def test_a_fixed_trainer_ignores_requests() -> None:
    seen = view(explorer=S.REQUIRE_SYNC, explorer_version=0, newest=1)
    assert not trainer_publishes(seen, FIXED, 3, after_step=False)


# --- explorer -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("trainer", "trainer_version", "held", "open_"),
    [
        (S.WAITING_SYNC, 3, 2, True),
        (S.WAITING_SYNC, 3, 3, False),  # the offer it has just received
        (S.RUNNING, 3, 2, False),
        (S.STOPPED, 3, 2, False),
    ],
)
def test_an_offer_is_open_while_the_trainer_waits_with_a_newer_version(
    trainer: SyncState, trainer_version: int, held: int, open_: bool
) -> None:
    assert offer_open(view(trainer=trainer, trainer_version=trainer_version), held) is open_


def test_an_explorer_that_wants_weights_always_syncs() -> None:
    nothing_new = view(newest=2, trainer_version=2)
    for takes_newer, rendezvous in itertools.product((False, True), repeat=2):
        assert explorer_syncs(nothing_new, 2, True, takes_newer, rendezvous)


def test_without_a_rendezvous_a_newer_version_is_taken_only_when_the_style_takes_it() -> None:
    newer = view(newest=3)
    assert explorer_syncs(newer, 2, wanted=False, takes_newer=True, rendezvous=False)
    assert not explorer_syncs(newer, 2, wanted=False, takes_newer=False, rendezvous=False)
    assert not explorer_syncs(view(newest=2), 2, False, takes_newer=True, rendezvous=False)


def test_with_a_rendezvous_an_open_offer_is_always_joined_and_nothing_else() -> None:
    # The trainer is blocked on its offer: even a style that takes no newer version joins.
    offer = view(trainer=S.WAITING_SYNC, trainer_version=3, newest=2)
    assert explorer_syncs(offer, 2, wanted=False, takes_newer=False, rendezvous=True)
    # A published version that is not on offer any more is not waited for.
    gone = view(trainer=S.RUNNING, trainer_version=3, newest=3)
    assert not explorer_syncs(gone, 2, wanted=False, takes_newer=True, rendezvous=True)


# --- the view -------------------------------------------------------------------------------


def test_the_synchronizer_views_both_sides_and_the_newest_version_at_once() -> None:
    sync = Synchronizer("memory", timeline_path=None, keep_versions=2)
    assert sync.view() == SyncView(S.STOPPED, S.STOPPED, -1, -1, -1)
    sync.set_state("trainer", S.RUNNING, 0)
    sync.set_state("explorer", S.RUNNING, -1)
    sync.publish(0, ["ref"])
    sync.set_state("explorer", S.REQUIRE_SYNC, -1)
    assert sync.view() == SyncView(S.RUNNING, S.REQUIRE_SYNC, 0, -1, 0)
    sync.publish(1, ["ref"])
    sync.set_state("explorer", S.RUNNING, 1)
    assert sync.view() == SyncView(S.RUNNING, S.RUNNING, 1, 1, 1)
