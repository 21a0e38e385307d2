"""A worker that stops making progress in the middle of a run (SIGSTOP: alive, silent) ends
the run within the phase's deadline, in every mode and on either side: the driver exits with
one line naming the phase and the stopped rank, and no worker process is left behind.

The driver runs as `python -m hybrid.main` in a child process; the test reads the workers'
progress files (hybrid/controller/progress.py: pid and current call) to pick its target, stops
it in the middle of a call once two steps are done, and times the end from there.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hybrid.controller.progress import read_progress
from hybrid.controller.stall import process_state
from tests.conftest import REPO_ROOT
from tests.integration.trainer.helpers import child_env, small_run_overrides, write_assets

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

FLOOR_S = 20.0
"""trainer.stall_timeout_s of these runs: long enough for a loaded 2-core machine's slowest
real phase, short enough for a test."""

CASES = {
    # mode, the side whose worker is stopped (its progress dir), the rank
    "colocated-worker": ("colocated", "workers", 1),
    "split-explorer": ("split", "explorer", 0),
    "split-trainer": ("split", "trainer", 0),
    "fully_async-explorer": ("fully_async", "explorer", 0),
    "fully_async-trainer": ("fully_async", "trainer", 0),
}


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_assets(tmp_path_factory.mktemp("stalls"))


def steps_done(out: Path) -> int:
    path = out / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.is_file() else 0


def worker_pids(out: Path) -> list[int]:
    """Every worker's pid, from the progress files of every side."""
    root = out / "logs" / "progress"
    return [json.loads(p.read_text())["pid"] for p in root.glob("*/rank_*.json")]


def stop_mid_call(driver: subprocess.Popen, progress_dir: Path, rank: int, out: Path) -> int:
    """SIGSTOP the rank while it runs a call, once two steps are done; its pid."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        assert driver.poll() is None, "the run ended before the worker could be stopped"
        seen = read_progress(progress_dir, rank)
        if steps_done(out) >= 2 and seen is not None and seen.running:
            os.kill(seen.pid, signal.SIGSTOP)
            return seen.pid
        time.sleep(0.005)
    raise AssertionError("no step finished within 300 s")


@pytest.mark.full  # by default: tests/integration/controller/test_stall.py (the same path, fast)
@pytest.mark.parametrize("case", list(CASES))
def test_a_stopped_worker_ends_the_run_naming_phase_and_rank(
    assets: Path, tmp_path: Path, case: str
) -> None:
    mode, side, rank = CASES[case]
    out = tmp_path / "run"
    split = (
        () if mode == "colocated" else ("sync.timeout_s=300", f"sync.checkpoint_dir={out / 'w'}")
    )
    args = small_run_overrides(
        assets,
        out,
        "trainer.total_steps=1000",
        f"trainer.mode={mode}",
        f"trainer.stall_timeout_s={FLOOR_S}",
        *split,
    )
    env = child_env()
    env["PYTHONPATH"] = str(REPO_ROOT)
    driver = subprocess.Popen(
        [sys.executable, "-m", "hybrid.main", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        pid = stop_mid_call(driver, out / "logs" / "progress" / side, rank, out)
        stopped_at = time.monotonic()
        _, stderr = driver.communicate(timeout=3 * FLOOR_S + 120)
        ended_s = time.monotonic() - stopped_at
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    print(f"ended {ended_s:.1f}s after SIGSTOP: {stderr.strip().splitlines()[-1]}")
    assert driver.returncode == 1, stderr[-3000:]
    line = stderr.strip().splitlines()[-1]
    assert line.startswith("hybrid: ") and " stalled on rank" in line, line
    assert f"pid {pid}, stopped" in line, line
    # A phase seen before waits max(floor, 4 x its slowest) -- on CPU the floor -- and the
    # workers are killed, not asked to stop; the rest is the driver's own exit.
    assert ended_s < FLOOR_S + 60, (ended_s, line)
    assert (out / "logs" / "error.txt").is_file()
    time.sleep(1.0)
    left = [p for p in worker_pids(out) if process_state(p) not in (None, "exited")]
    assert left == [], f"worker processes left running: {left}"
