"""The reaper of a local Ray cluster: its pure parts on hand-built process tables, then the
real script against a stand-in driver (plain processes, no Ray) that is SIGKILLed or that
stops its own processes the way ray.shutdown does."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hybrid.controller import reaper
from hybrid.controller.reaper import (
    MARK_VARIABLE,
    Proc,
    carries_mark,
    cluster_members,
    parse_stat,
    read_table,
)

pytestmark = pytest.mark.unit

REAPER_FILE = Path(reaper.__file__)


def _stat_line(pid: int, name: str, state: str, ppid: int, start_ticks: int) -> str:
    # proc(5): pid (comm) state ppid, then fields 5..21, starttime is field 22, then more
    middle = " ".join(["0"] * 17)
    return f"{pid} ({name}) {state} {ppid} {middle} {start_ticks} 1 2 3\n"


def test_parse_stat_reads_a_name_with_spaces_and_parentheses() -> None:
    proc = parse_stat(_stat_line(42, "ray::A (b) c", "T", 7, 123456), marked=True)
    assert proc == Proc(42, 7, "ray::A (b) c", "T", 123456, True)
    assert proc.running


def test_parse_stat_reads_this_process() -> None:
    proc = parse_stat(Path("/proc/self/stat").read_text())
    assert (proc.pid, proc.ppid, proc.running) == (os.getpid(), os.getppid(), True)
    assert proc.start_ticks > 0


@pytest.mark.parametrize("state", ["Z", "X"])
def test_a_zombie_or_dead_process_is_not_running(state: str) -> None:
    assert not parse_stat(_stat_line(1, "x", state, 0, 5)).running


def test_only_the_exact_mark_counts() -> None:
    environ = b"A=1\0" + f"{MARK_VARIABLE}=abc".encode() + b"\0B=2\0"
    assert carries_mark(environ, "abc")
    assert not carries_mark(environ, "ab")
    assert not carries_mark(environ + f"{MARK_VARIABLE}x=abcd\0".encode(), "abcd")
    assert not carries_mark(b"", "abc")  # a zombie, or a title that blanked the environment


def _table(*procs: Proc) -> dict[int, Proc]:
    return {proc.pid: proc for proc in procs}


def test_members_are_the_marked_processes_and_all_their_descendants() -> None:
    table = _table(
        Proc(10, 1, "driver", "S", 100, marked=False),
        Proc(11, 10, "raylet", "S", 101, marked=True),
        Proc(12, 11, "ray::Agent", "S", 102, marked=False),  # its title blanked the mark
        Proc(13, 12, "helper", "S", 103, marked=False),
        Proc(14, 10, "reward", "S", 104, marked=False),  # the driver's, not the cluster's
        Proc(15, 1, "other", "S", 105, marked=False),
    )
    assert cluster_members(table, known={}) == {11: 101, 12: 102, 13: 103}


def test_a_known_member_counts_after_reparenting_but_not_a_reused_pid() -> None:
    table = _table(
        Proc(12, 1, "ray::Agent", "S", 102, marked=False),  # raylet died: re-parented to init
        Proc(13, 12, "helper", "S", 103, marked=False),
        Proc(20, 1, "unrelated", "S", 999, marked=False),  # pid 20 was a member once
    )
    assert cluster_members(table, known={12: 102, 20: 200}) == {12: 102, 13: 103}


def test_zombies_are_not_members() -> None:
    table = _table(
        Proc(11, 1, "raylet", "Z", 101, marked=False),
        Proc(12, 1, "worker", "T", 102, marked=True),  # stopped still counts
    )
    assert cluster_members(table, known={11: 101}) == {12: 102}


def test_read_table_sees_this_process_and_its_mark() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(30)"],
        env={**os.environ, MARK_VARIABLE: "m1"},
    )
    try:
        table = read_table("m1")
        assert table[os.getpid()].ppid == os.getppid() and not table[os.getpid()].marked
        assert table[child.pid].marked and table[child.pid].ppid == os.getpid()
    finally:
        child.kill()
        child.wait()


# A stand-in driver: starts a reaper, then under the mark a sleeper, one that ignores SIGTERM
# and one whose child starts with a clean environment (as if its title blanked the mark).
FAKE_DRIVER = """
import importlib.util, json, signal, subprocess, sys, time
spec = importlib.util.spec_from_file_location("reaper", sys.argv[1])
reaper = importlib.util.module_from_spec(spec)
sys.modules["reaper"] = reaper
spec.loader.exec_module(reaper)
READY = "import os, signal, subprocess, sys, time\\n"
SLEEPER = READY + "print(os.getpid(), flush=True); time.sleep(60)"
STUBBORN = READY + "signal.signal(signal.SIGTERM, signal.SIG_IGN)\\n" + SLEEPER
PARENT = READY + (
    "c = subprocess.Popen(['sleep', '60'], env={})\\n"
    "print(c.pid, flush=True); time.sleep(60)"
)
handle = reaper.Reaper.start()
with handle.marking():
    children = [
        subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        for code in (SLEEPER, STUBBORN, PARENT)
    ]
handle.cluster_started()
said = [int(child.stdout.readline()) for child in children]  # each is up: a pid
print(json.dumps({"reaper": handle.process.pid, "children": [c.pid for c in children],
                  "grandchild": said[2]}), flush=True)
if sys.argv[2] == "shutdown":  # like ray.shutdown: the driver's own children go, it stays
    time.sleep(1.5)  # the reaper refreshes its view every POLL_S: let it meet the grandchild
    for child in children:
        child.kill()
        child.wait()
time.sleep(60)
"""


def _alive(pid: int) -> bool:
    try:
        return parse_stat(Path(f"/proc/{pid}/stat").read_text()).running
    except OSError:
        return False


def _wait_until_gone(pids: list[int], deadline_s: float) -> list[int]:
    end = time.monotonic() + deadline_s
    while (left := [pid for pid in pids if _alive(pid)]) and time.monotonic() < end:
        time.sleep(0.1)
    return left


@pytest.fixture
def fake_driver(request: pytest.FixtureRequest) -> Iterator[tuple[subprocess.Popen, dict]]:
    driver = subprocess.Popen(
        [sys.executable, "-c", FAKE_DRIVER, str(REAPER_FILE), request.param],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert driver.stdout is not None
    pids = json.loads(driver.stdout.readline())
    yield driver, pids
    for pid in [driver.pid, *pids["children"], pids["grandchild"], pids["reaper"]]:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
    driver.wait()


@pytest.mark.parametrize("fake_driver", ["run"], indirect=True)
def test_a_sigkilled_driver_leaves_nothing_running(
    fake_driver: tuple[subprocess.Popen, dict],
) -> None:
    driver, pids = fake_driver
    bystander = subprocess.Popen(["sleep", "60"])  # same user, not the cluster's
    try:
        os.kill(pids["children"][0], signal.SIGSTOP)  # SIGTERM alone would never land
        driver.kill()
        cluster = [*pids["children"], pids["grandchild"]]
        assert _wait_until_gone([*cluster, pids["reaper"]], deadline_s=10) == []
        assert _alive(bystander.pid)
        assert driver.stderr is not None
        report = driver.stderr.read()  # EOF: the reaper, which shares it, has exited
        assert f"the driver (pid {driver.pid}) is gone" in report
        stopped, stubborn = pids["children"][:2]
        assert f"{stopped} python: SIGTERM" in report, report  # continued, then obeyed
        assert f"{stubborn} python: SIGKILL" in report, report
    finally:
        bystander.kill()
        bystander.wait()


@pytest.mark.parametrize("fake_driver", ["shutdown"], indirect=True)
def test_the_reaper_exits_once_the_cluster_stops_and_the_driver_lives_on(
    fake_driver: tuple[subprocess.Popen, dict],
) -> None:
    driver, pids = fake_driver
    assert _wait_until_gone([pids["reaper"]], deadline_s=10) == []
    assert driver.poll() is None
    # the grandchild with a clean environment outlived its parent; the reaper knew it
    assert _wait_until_gone([pids["grandchild"]], deadline_s=1) == []
