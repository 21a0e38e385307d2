"""A worker that is alive but stuck (SIGSTOPped, or sleeping inside a call) makes the call
raise StallError within its deadline, naming the phase, the ranks and what each was last seen
doing; shutting the group down leaves no worker process behind, a stopped one included."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from hybrid.controller import (
    Deadlines,
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    StallError,
)
from hybrid.controller.progress import read_progress
from hybrid.controller.stall import process_state
from tests.integration.controller.workers import Collective, SlowStart

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

FLOOR_S = 2.0


def wait_gone(pids: list[int], within_s: float) -> list[int]:
    """The pids still present (a zombie counts as gone) after up to `within_s` seconds."""
    deadline = time.monotonic() + within_s
    while True:
        alive = [pid for pid in pids if process_state(pid) not in (None, "exited")]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)


def stalling_group(tmp_path: Path) -> RayWorkerGroup:
    return RayWorkerGroup(
        RayResourcePool([2]),
        RayClassWithInitArgs(Collective),
        deadlines=Deadlines(FLOOR_S),
        progress_dir=tmp_path / "progress",
    )


def test_a_stopped_worker_is_named_and_killed(ray_cluster: None, tmp_path: Path) -> None:
    group = stalling_group(tmp_path)
    try:
        assert group.all_reduce_sum(1.0) == [3.0, 3.0]  # a first call sets the phase's pace
        pids = dict(group.watch.local_pids) if group.watch else {}
        assert sorted(pids) == [0, 1]
        os.kill(pids[1], signal.SIGSTOP)
        started = time.monotonic()
        with pytest.raises(StallError) as info:
            group.all_reduce_sum(1.0)  # rank 0 waits in the all-reduce for stopped rank 1
        waited = time.monotonic() - started
        error = info.value
        assert error.phase == "Collective.all_reduce_sum"
        assert error.ranks == [0, 1]
        assert FLOOR_S <= waited < FLOOR_S + 5
        text = str(error)
        assert f"pid {pids[1]}, stopped" in text and f"pid {pids[0]}, waiting" in text
        assert "in Collective.all_reduce_sum for" in text
        assert group.stalled
    finally:
        group.shutdown()
    assert wait_gone(list(pids.values()), within_s=30) == []


@pytest.mark.full  # by default: the stopped worker above (the same wait, a different cause)
def test_a_worker_stuck_inside_a_call_names_its_last_boundary(
    ray_cluster: None, tmp_path: Path
) -> None:
    group = stalling_group(tmp_path)
    try:
        assert group.ping() == [0, 1]
        started = time.monotonic()
        with pytest.raises(StallError) as info:
            group.pass_boundary_then_sleep("test/stuck_here", 120.0)
        # Its first call: 3 x the floor.
        assert 3 * FLOOR_S <= time.monotonic() - started < 3 * FLOOR_S + 5
        assert info.value.ranks == [0, 1]
        assert "last boundary 'test/stuck_here'" in str(info.value)
        assert "first call: 3 x trainer.stall_timeout_s=2" in str(info.value)
    finally:
        pids = list(group.watch.local_pids.values()) if group.watch else []
        group.shutdown()
    assert wait_gone(pids, within_s=30) == []


@pytest.mark.full  # by default: the stopped worker above
def test_a_member_that_never_finishes_starting_stalls_the_group_and_is_killed(
    ray_cluster: None, tmp_path: Path
) -> None:
    started = time.monotonic()
    with pytest.raises(StallError) as info:
        RayWorkerGroup(
            RayResourcePool([2]),
            RayClassWithInitArgs(SlowStart),
            deadlines=Deadlines(1.0),
            progress_dir=tmp_path,
        )
    assert 3.0 <= time.monotonic() - started < 3.0 + 10  # a first call: 3 x the floor
    assert info.value.phase == "SlowStart.__init__" and info.value.ranks == [0, 1]
    pids = [seen.pid for rank in (0, 1) if (seen := read_progress(tmp_path, rank))]
    assert len(pids) == 2
    assert wait_gone(pids, within_s=30) == []
