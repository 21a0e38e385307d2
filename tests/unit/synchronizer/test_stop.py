"""`Synchronizer.stop` (the plain class, no Ray): a side's end is logged once, with the version
it held when given, and a second stop keeps the first reason (a finished trainer side stopped
again by the driver's own finish, say)."""

from __future__ import annotations

import pytest

from hybrid.synchronizer.actor import Synchronizer
from hybrid.synchronizer.states import SyncState

pytestmark = pytest.mark.unit


def test_a_stop_logs_the_version_given_and_the_first_reason_stays() -> None:
    sync = Synchronizer("memory", None)
    sync.set_state("trainer", SyncState.RUNNING, 0, note="start")
    sync.stop("trainer", "finished", version=5)
    sync.stop("trainer", "trainer loop failed: late", version=7)
    assert sync.version("trainer") == 5
    assert [(m["new"], m["version"], m["note"]) for m in sync.timeline()] == [
        ("running", 0, "start"),
        ("stopped", 5, "finished"),
    ]


def test_a_stop_without_a_version_keeps_the_one_held() -> None:
    sync = Synchronizer("nccl", None)
    sync.set_state("explorer", SyncState.RUNNING, 3, note="start")
    sync.stop("explorer", "finished")
    assert sync.timeline()[-1]["version"] == 3 and sync.state("explorer") is SyncState.STOPPED
