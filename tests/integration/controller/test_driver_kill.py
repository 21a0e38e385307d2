"""A SIGKILLed driver leaves nothing running: a real driver starts its local Ray cluster
(ensure_ray) and one actor, the actor is SIGSTOPped, the driver gets SIGKILL, and within
seconds no process of that cluster remains (the agents alone would otherwise linger ~60 s, the
stopped worker for ever)."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hybrid.controller.reaper import Proc, parse_stat

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

REPO_ROOT = Path(__file__).resolve().parents[3]

DRIVER = """
import os, time
import ray
from hybrid.controller import ensure_ray

@ray.remote(num_cpus=0)
class Sleeper:
    def pid(self) -> int:
        return os.getpid()

ensure_ray(num_cpus=1, quiet=True)
sleeper = Sleeper.remote()
print(ray.get(sleeper.pid.remote()), flush=True)
time.sleep(600)
"""

START_DEADLINE_S = 90.0
"""How long the driver may take to start Ray and the actor (slow on a loaded 2-core box)."""

GONE_DEADLINE_S = 15.0
"""How long after the SIGKILL the cluster may take to vanish (the reaper's grace is 2 s)."""


def _processes() -> dict[int, Proc]:
    table: dict[int, Proc] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                table[int(entry.name)] = parse_stat((entry / "stat").read_text())
            except OSError:
                continue
    return table


def _descendants(root: int) -> dict[int, Proc]:
    table = _processes()
    found: dict[int, Proc] = {}
    pending = [root]
    while pending:
        parent = pending.pop()
        for proc in table.values():
            if proc.ppid == parent and proc.pid not in found:
                found[proc.pid] = proc
                pending.append(proc.pid)
    return found


def _still_running(snapshot: dict[int, Proc]) -> list[str]:
    now = _processes()
    return [
        f"{pid} {proc.name}"
        for pid, proc in snapshot.items()
        if pid in now and now[pid].running and now[pid].start_ticks == proc.start_ticks
    ]


def _read_line(driver: subprocess.Popen, deadline_s: float) -> str:
    assert driver.stdout is not None
    ready, _, _ = select.select([driver.stdout], [], [], deadline_s)
    if not ready:
        raise TimeoutError(f"the driver printed no actor pid within {deadline_s} s")
    return driver.stdout.readline()


def test_a_sigkilled_driver_leaves_no_process_of_its_cluster(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "RAY_ADDRESS": ""}
    stderr_path = tmp_path / "driver.err"
    with stderr_path.open("w") as stderr:
        driver = subprocess.Popen(
            [sys.executable, "-c", DRIVER],
            stdout=subprocess.PIPE,
            stderr=stderr,
            env=env,
            cwd=REPO_ROOT,
        )
    snapshot: dict[int, Proc] = {}
    try:
        line = _read_line(driver, START_DEADLINE_S)
        assert line.strip().isdigit(), (line, stderr_path.read_text())
        actor_pid = int(line)
        snapshot = _descendants(driver.pid)
        names = {proc.name for proc in snapshot.values()}
        # not vacuous: the snapshot holds the cluster, agents and actor included
        assert {"raylet", "gcs_server", "ray::DashboardA", "ray::RuntimeEnv"} <= names, names
        assert actor_pid in snapshot, (actor_pid, names)

        os.kill(actor_pid, signal.SIGSTOP)  # a stopped worker never sees its raylet go
        driver.kill()
        driver.wait()
        deadline = time.monotonic() + GONE_DEADLINE_S
        while (left := _still_running(snapshot)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert left == [], f"still running {GONE_DEADLINE_S} s after the driver's SIGKILL: {left}"
        assert "hybrid reaper: the driver" in stderr_path.read_text()
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
        for entry in _still_running(snapshot):  # a failed run must not leak its cluster
            os.kill(int(entry.split()[0]), signal.SIGKILL)
