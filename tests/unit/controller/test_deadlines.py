"""Phase deadlines, progress records and the stall message: the pure parts of never waiting
forever (the real-stack tests are tests/integration/controller/test_stall.py and
tests/integration/trainer/test_stalls.py)."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hybrid.controller.deadlines import FIRST_SCALE, SCALE, Deadlines
from hybrid.controller.errors import StallError
from hybrid.controller.progress import ProgressWriter, read_progress
from hybrid.controller.stall import Watch, process_state
from hybrid.validation import check_timeout

pytestmark = pytest.mark.unit


def test_a_first_call_gets_the_first_scale_of_the_floor() -> None:
    assert Deadlines(10.0).for_phase("actor.update") == FIRST_SCALE * 10.0


def test_later_calls_scale_with_the_slowest_but_never_go_below_the_floor() -> None:
    deadlines = Deadlines(10.0)
    deadlines.done("actor.update", 1.0)
    assert deadlines.for_phase("actor.update") == 10.0
    deadlines.done("actor.update", 7.0)
    deadlines.done("actor.update", 2.0)  # a faster call does not shorten it
    assert deadlines.for_phase("actor.update") == SCALE * 7.0
    assert deadlines.for_phase("other.phase") == FIRST_SCALE * 10.0
    assert "slowest earlier call 7s" in deadlines.rule("actor.update")
    assert "first call" in deadlines.rule("other.phase")


@pytest.mark.parametrize("bad", [0, -1.0, math.nan, math.inf, "10", True, None])
def test_a_deadline_that_is_not_a_positive_number_is_named(bad: object) -> None:
    with pytest.raises(ValueError, match=r"trainer\.stall_timeout_s"):
        check_timeout("trainer.stall_timeout_s", bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"trainer\.stall_timeout_s"):
        Deadlines(bad)  # type: ignore[arg-type]


def test_progress_records_the_call_and_the_last_boundary(tmp_path: Path) -> None:
    writer = ProgressWriter(tmp_path, rank=3, flush_s=0)  # every change written at once
    writer.call_started("actor_rollout.generate_sequences")
    writer.boundary("sync/wake_weights")
    seen = read_progress(tmp_path, 3)
    assert seen is not None
    assert (seen.rank, seen.pid, seen.call) == (3, os.getpid(), "actor_rollout.generate_sequences")
    assert seen.running and seen.boundary == "sync/wake_weights"
    text = seen.describe(time.time() + 5)
    assert text.startswith("in actor_rollout.generate_sequences for 5.")
    assert "last boundary 'sync/wake_weights' 5." in text
    writer.call_finished()
    done = read_progress(tmp_path, 3)
    assert done is not None and not done.running
    assert done.describe(time.time()).startswith("idle: actor_rollout.generate_sequences finished")


def test_the_progress_thread_writes_the_newest_record_without_writing_every_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writes = 0
    write = ProgressWriter._write

    def counted(self: ProgressWriter) -> None:
        nonlocal writes
        writes += 1
        write(self)

    monkeypatch.setattr(ProgressWriter, "_write", counted)
    writer = ProgressWriter(tmp_path, rank=0, flush_s=0.05)
    writer.call_started("actor.update_actor")
    for index in range(500):  # a small step passes dozens of boundaries in milliseconds
        writer.boundary(f"update/forward {index}")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        seen = read_progress(tmp_path, 0)
        if seen is not None and seen.boundary == "update/forward 499":
            break
        time.sleep(0.01)
    assert seen is not None and seen.call == "actor.update_actor"
    assert seen.boundary == "update/forward 499", seen
    assert writes < 100, f"{writes} writes for 501 changes"


def test_a_missing_or_torn_progress_file_reads_as_none(tmp_path: Path) -> None:
    assert read_progress(None, 0) is None
    assert read_progress(tmp_path, 0) is None
    (tmp_path / "rank_0.json").write_text('{"rank": 0, "pid"')
    assert read_progress(tmp_path, 0) is None


def test_process_state_tells_a_stopped_process_from_a_waiting_one() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        deadline = time.monotonic() + 10
        while process_state(child.pid) != "waiting" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert process_state(child.pid) == "waiting"
        os.kill(child.pid, signal.SIGSTOP)
        stopped = "stopped (SIGSTOP or a debugger)"
        while process_state(child.pid) != stopped and time.monotonic() < deadline:
            time.sleep(0.01)  # it runs briefly to take the signal
        assert process_state(child.pid) == stopped
    finally:
        child.kill()
        child.wait()
    assert process_state(child.pid) is None


def test_process_state_reads_a_command_name_with_spaces_and_parentheses(tmp_path: Path) -> None:
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "stat").write_text("42 (ray::Worker (x) y) T 1 42 42 0 -1")
    assert process_state(42, proc=tmp_path) == "stopped (SIGSTOP or a debugger)"


def test_the_stall_error_names_phase_ranks_deadline_and_what_each_rank_did(
    tmp_path: Path,
) -> None:
    ProgressWriter(tmp_path, rank=1, flush_s=0).call_started("trainer.update_actor")
    watch = Watch(Deadlines(5.0), tmp_path, local_pids={1: os.getpid()})
    error = watch.stall_error("trainer.update_actor", [0, 1], 15.2, "first call")
    assert isinstance(error, StallError) and isinstance(error, TimeoutError)
    assert watch.stalled
    text = str(error)
    assert text.startswith("trainer.update_actor stalled on ranks 0, 1: no result after 15s")
    assert "rank 0: no progress record" in text
    assert f"rank 1 (pid {os.getpid()}, running): in trainer.update_actor for" in text
    assert "\n" not in text  # one line on the console
    # It crosses Ray as itself (rebuilt from its fields).
    import pickle

    again = pickle.loads(pickle.dumps(error))
    assert (again.phase, again.ranks, str(again)) == (error.phase, error.ranks, text)


def test_a_stall_names_a_worker_stopped_in_another_group_of_the_run(tmp_path: Path) -> None:
    """The explorer waits in a weight sync whose sender, a trainer worker, is stopped: the
    explorer's stall names the stopped trainer, and the trainer's group is marked stalled."""
    deadlines = Deadlines(5.0)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        os.kill(child.pid, signal.SIGSTOP)
        stopped = "stopped (SIGSTOP or a debugger)"
        deadline = time.monotonic() + 10
        while process_state(child.pid) != stopped and time.monotonic() < deadline:
            time.sleep(0.01)
        explorer = Watch(deadlines, tmp_path / "explorer", local_pids={0: os.getpid()})
        trainer = Watch(deadlines, tmp_path / "trainer", local_pids={0: child.pid})
        assert deadlines.watches == [explorer, trainer]
        error = explorer.stall_error("ExplorerWorker.load_weights", [0], 20.0, "first call")
        text = str(error)
        assert text.startswith("ExplorerWorker.load_weights stalled on rank 0")
        assert f"stopped: trainer rank 0 (pid {child.pid}, {stopped})" in text
        assert explorer.stalled and trainer.stalled
    finally:
        child.kill()
        child.wait()
