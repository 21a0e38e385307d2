"""`hybrid.sandbox` ends every process a program started, even one that left the program's
session (setsid), and the program itself still sees ordinary pids and signals."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hybrid.sandbox import SandboxLimits, network_isolation_error, run
from tests.conftest import REPO_ROOT
from tests.unit.sandbox.processes import HOST_PID, pid_namespace_error, running

pytestmark = pytest.mark.unit

PID_NAMESPACE_ERROR = pid_namespace_error()
ISOLATION_ERROR = network_isolation_error()
needs_pid_namespace = pytest.mark.skipif(
    PID_NAMESPACE_ERROR is not None,
    reason=f"this kernel refuses PID namespaces ({PID_NAMESPACE_ERROR}); there a setsid'd "
    "grandchild can escape, as docs/configuration.md says",
)
NETWORKS = [
    pytest.param(
        "deny",
        marks=pytest.mark.skipif(
            ISOLATION_ERROR is not None, reason=f"namespaces refused: {ISOLATION_ERROR}"
        ),
    ),
    "allow",
]


def _escape(ending: str) -> str:
    """A program that forks a child which leaves the program's session and process group,
    records its pid where the test can read it, then keeps appending to a file the test owns;
    the program then waits for its deadline (`ending="deadline"`) or exits at once."""
    return f"""
import os, sys, time
folder = sys.stdin.read()
if os.fork() == 0:
    os.setsid()
    with open(os.path.join(folder, 'pid.tmp'), 'w') as out:
        out.write(str({HOST_PID}))
    os.replace(os.path.join(folder, 'pid.tmp'), os.path.join(folder, 'pid'))
    with open(os.path.join(folder, 'beats'), 'a') as beats:
        while True:
            beats.write('.')
            beats.flush()
            time.sleep(0.02)
while not os.path.exists(os.path.join(folder, 'pid')):
    time.sleep(0.01)
print('escaped', flush=True)
if {ending!r} == 'deadline':
    while True:
        time.sleep(1)
"""


@pytest.fixture
def escapee(tmp_path: Path) -> Iterator[Path]:
    """A folder for `_escape`'s files; its escaped process is killed afterwards if still there
    (the test started it: a failing test must not leave it behind)."""
    yield tmp_path
    pid_file = tmp_path / "pid"
    if pid_file.exists() and running(pid := int(pid_file.read_text())):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _assert_ends_within_a_second(folder: Path) -> None:
    pid = int((folder / "pid").read_text())
    deadline = time.monotonic() + 1.0
    while running(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not running(pid), f"the setsid'd grandchild {pid} outlived the run"
    beats = (folder / "beats").stat().st_size
    time.sleep(0.2)
    assert (folder / "beats").stat().st_size == beats, "it still writes"


@needs_pid_namespace
@pytest.mark.parametrize("network", NETWORKS)
@pytest.mark.parametrize("ending", ["deadline", "exit"])
def test_a_setsid_grandchild_ends_with_the_run(escapee: Path, network: str, ending: str) -> None:
    limits = SandboxLimits(time_s=1.5, network=network)  # type: ignore[arg-type]
    result = run(_escape(ending), limits, stdin=str(escapee))
    assert result.stdout == "escaped\n", result
    assert result.timed_out == (ending == "deadline"), result
    _assert_ends_within_a_second(escapee)


@needs_pid_namespace
def test_a_killed_caller_takes_the_whole_tree_down(escapee: Path) -> None:
    # As the reward pool kills a reward call at its deadline: run() never gets to clean up.
    caller_source = (
        "import sys\n"
        "from hybrid.sandbox import SandboxLimits, run\n"
        f"run({_escape('deadline')!r}, SandboxLimits(time_s=120), stdin={str(escapee)!r})\n"
    )
    # TMPDIR: the scratch folder that the killed run() leaves behind lands in the test's folder.
    caller = subprocess.Popen(
        [sys.executable, "-c", caller_source],
        cwd=REPO_ROOT,
        env={**os.environ, "TMPDIR": str(escapee)},
    )
    try:
        deadline = time.monotonic() + 60.0
        while not (escapee / "pid").exists() and time.monotonic() < deadline:
            assert caller.poll() is None, "the caller ended before the program started"
            time.sleep(0.05)
    finally:
        caller.kill()
        caller.wait()
    _assert_ends_within_a_second(escapee)


@needs_pid_namespace
def test_the_program_is_pid_2_under_an_init_of_its_own() -> None:
    result = run("import os\nprint(os.getpid(), os.getppid())\n")
    assert result.ok and result.stdout == "2 1\n", result


@pytest.mark.parametrize("network", NETWORKS)
def test_exit_codes_and_signals_reach_the_caller_as_the_program_ended(network: str) -> None:
    limits = SandboxLimits(network=network)  # type: ignore[arg-type]
    exited = run("import sys\nsys.exit(3)\n", limits)
    assert (exited.exit_code, exited.killed_by_signal) == (3, None), exited
    # SIGTERM's default action ends the program: it is not its namespace's init.
    terminated = run("import os, signal\nos.kill(os.getpid(), signal.SIGTERM)\n", limits)
    assert (terminated.exit_code, terminated.killed_by_signal) == (None, 15), terminated
    assert not terminated.timed_out
    aborted = run("import os\nos.abort()\n", limits)
    assert aborted.killed_by_signal == signal.SIGABRT, aborted


def test_a_program_that_ignores_sigxcpu_is_killed_at_the_hard_cpu_limit() -> None:
    source = "import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\nwhile True:\n    pass\n"
    result = run(source, SandboxLimits(time_s=20.0, cpu_s=1))
    assert result.killed_by_signal == signal.SIGKILL and not result.timed_out, result
    assert result.duration_s < 10.0


_REFUSING_CALLER = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
# A user namespace without an id mapping may not create another one: from here on, the kernel
# refuses the sandbox every namespace, as some containers do.
if libc.unshare(0x10000000) != 0:
    raise SystemExit('cannot make the refusing namespace: ' + os.strerror(ctypes.get_errno()))
from hybrid.sandbox import SandboxLimits, SandboxUnavailable, run
try:
    run('pass')
    print('deny ran')
except SandboxUnavailable:
    print('deny refused')
for source in ['import os\\nprint(os.getpid() > 2)', 'raise SystemExit(3)']:
    result = run(source, SandboxLimits(network='allow'))
    print(f'{result.exit_code}:{result.stdout.strip()}')
"""


@needs_pid_namespace  # it makes the refusing machine out of a user namespace
def test_where_namespaces_are_refused_allow_falls_back_to_running_without() -> None:
    caller = subprocess.run(
        [sys.executable, "-c", _REFUSING_CALLER],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert caller.returncode == 0, caller.stderr
    # The program is no namespace's pid 2 there: it runs as the bootstrap's process itself.
    assert caller.stdout.splitlines() == ["deny refused", "0:True", "3:"], caller
