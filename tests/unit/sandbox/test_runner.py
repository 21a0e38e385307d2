"""`hybrid.sandbox`: real subprocesses under real limits. Each limit is shown to bite (a loop
killed at its deadline, an allocation refused, output cut, a connection refused) and, where a
test could pass vacuously, the same program is shown to run without the limit."""

from __future__ import annotations

import math
import os
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hybrid.sandbox import (
    SandboxLimits,
    SandboxUnavailable,
    network_isolation_error,
    run,
    with_overrides,
)
from tests.unit.sandbox.processes import HOST_PID, running

pytestmark = pytest.mark.unit

ISOLATION_ERROR = network_isolation_error()
"""Why this machine cannot isolate the network (None: it can), found by running a probe."""

PRINT_CWD_THEN_LOOP = "import os\nprint(os.getcwd(), flush=True)\nwhile True:\n    pass\n"


def test_a_program_runs_with_its_stdin_and_its_output_comes_back() -> None:
    source = "import sys\nname = input()\nprint('hello', name)\nprint('oops', file=sys.stderr)\n"
    result = run(source, stdin="world\n")
    assert result.ok, result
    assert (result.exit_code, result.stdout, result.stderr) == (0, "hello world\n", "oops\n")
    assert not result.timed_out and not result.truncated and result.killed_by_signal is None


def test_a_failing_program_reports_its_exit_code_and_traceback() -> None:
    result = run("import sys\nprint('partial')\nraise KeyError('missing')\n")
    assert result.exit_code == 1 and not result.ok
    assert result.stdout == "partial\n"
    assert "KeyError: 'missing'" in result.stderr


def test_the_callers_environment_and_packages_stay_out() -> None:
    os.environ["HYBRID_SANDBOX_SECRET"] = "s3cret"
    try:
        source = (
            "import os, sys\n"
            "print(os.environ.get('HYBRID_SANDBOX_SECRET'))\n"
            "print(any('site-packages' in p for p in sys.path))\n"
        )
        result = run(source)
    finally:
        del os.environ["HYBRID_SANDBOX_SECRET"]
    assert result.stdout.split() == ["None", "False"], result


def test_an_infinite_loop_is_killed_near_its_deadline_and_its_scratch_dir_removed() -> None:
    started = time.monotonic()
    result = run(PRINT_CWD_THEN_LOOP, SandboxLimits(time_s=0.5))
    took = time.monotonic() - started
    assert result.timed_out and result.exit_code is None
    assert result.killed_by_signal == signal.SIGKILL
    assert 0.5 <= result.duration_s < 2.0 and took < 3.0, (result.duration_s, took)
    scratch = Path(result.stdout.strip())
    assert scratch.name.startswith("hybrid-sandbox-"), result.stdout
    assert not scratch.exists()


def test_a_child_the_program_leaves_behind_is_killed_with_it() -> None:
    # The child reports its pid as the host numbers it (the program may see other numbers).
    child = f"import os, time\nprint({HOST_PID}, flush=True)\ntime.sleep(60)\n"
    source = (
        "import subprocess, sys\n"
        f"child = subprocess.Popen([sys.executable, '-c', {child!r}], stdout=subprocess.PIPE)\n"
        "print(child.stdout.readline().decode().strip())\n"
    )
    result = run(source)
    assert result.ok, result
    pid = int(result.stdout)
    deadline = time.monotonic() + 5.0
    while running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not running(pid), f"the program's child {pid} outlived it"


def test_a_scratch_dir_the_program_made_unreadable_is_still_removed() -> None:
    source = "import os\nos.mkdir('locked')\nos.chmod('locked', 0)\nprint(os.getcwd())\n"
    result = run(source)
    assert result.ok, result
    assert not Path(result.stdout.strip()).exists()


def test_a_memory_hog_hits_the_address_space_limit() -> None:
    hog = "data = bytearray(512 << 20)\nprint(len(data))\n"
    result = run(hog, SandboxLimits(memory_mb=128))
    assert result.exit_code == 1, result
    assert "MemoryError" in result.stderr


def test_a_busy_loop_hits_the_cpu_limit_before_the_wall_time_limit() -> None:
    result = run("while True:\n    pass\n", SandboxLimits(time_s=20.0, cpu_s=1))
    assert result.killed_by_signal == signal.SIGXCPU and not result.timed_out, result
    assert result.duration_s < 10.0


def test_output_past_the_limit_is_dropped_and_flagged() -> None:
    flood = "import sys\nsys.stdout.write('x' * 100_000)\nsys.stderr.write('y' * 100_000)\n"
    result = run(flood, SandboxLimits(output_bytes=1000))
    assert result.ok and result.truncated
    assert len(result.stdout) + len(result.stderr) == 1000
    assert set(result.stdout + result.stderr) <= {"x", "y"}
    small = run("print('x' * 999, end='')", SandboxLimits(output_bytes=1000))
    assert not small.truncated and len(small.stdout) == 999


@pytest.fixture
def listening_port() -> Iterator[int]:
    """A TCP server on 127.0.0.1 in this process: reachable to any process on the host's
    network."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    try:
        yield server.getsockname()[1]
    finally:
        server.close()


def _connect(port: int) -> str:
    return (
        "import socket\n"
        f"socket.create_connection(('127.0.0.1', {port}), timeout=5).close()\n"
        "print('connected')\n"
    )


@pytest.mark.skipif(
    ISOLATION_ERROR is not None, reason=f"this machine refuses namespaces: {ISOLATION_ERROR}"
)
def test_network_deny_blocks_a_connection_that_allow_makes(listening_port: int) -> None:
    allowed = run(_connect(listening_port), SandboxLimits(network="allow"))
    assert allowed.ok and allowed.stdout == "connected\n", allowed  # the server is reachable
    denied = run(_connect(listening_port))  # network="deny" is the default
    assert denied.exit_code == 1 and "connected" not in denied.stdout, denied
    assert "OSError" in denied.stderr
    lookup = run("import socket\nsocket.getaddrinfo('example.com', 80)\n")
    assert lookup.exit_code == 1 and "gaierror" in lookup.stderr, lookup


@pytest.mark.skipif(
    ISOLATION_ERROR is None, reason="this machine supports namespaces (the test above runs)"
)
def test_without_namespaces_deny_raises_and_allow_runs(listening_port: int) -> None:
    with pytest.raises(SandboxUnavailable, match="network='allow'"):
        run(_connect(listening_port))
    allowed = run(_connect(listening_port), SandboxLimits(network="allow"))
    assert allowed.ok and allowed.stdout == "connected\n", allowed


@pytest.mark.parametrize("field", ["time_s", "memory_mb", "output_bytes", "cpu_s"])
@pytest.mark.parametrize("value", [0, -1, math.nan, math.inf, "5", True])
def test_a_bad_limit_is_named(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=rf"sandbox\.{field} must be a positive"):
        SandboxLimits(**{field: value})  # type: ignore[arg-type]


def test_a_fractional_size_and_an_unknown_network_are_named() -> None:
    with pytest.raises(ValueError, match=r"sandbox\.memory_mb must be a positive whole number"):
        SandboxLimits(memory_mb=1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"sandbox\.network must be one of \['deny', 'allow'\]"):
        SandboxLimits(network="sometimes")  # type: ignore[arg-type]
    assert SandboxLimits(memory_mb=256.0).memory_mb == 256  # type: ignore[arg-type]


def test_overrides_replace_only_the_fields_they_set() -> None:
    base = SandboxLimits(time_s=5.0)
    limits = with_overrides(base, {"time_s": 2, "memory_mb": None}, "row 3")
    assert limits == SandboxLimits(time_s=2)
    assert limits.cpu_limit_s == 2 and SandboxLimits(time_s=0.2).cpu_limit_s == 1
    assert with_overrides(base, None, "row 3") is base
    with pytest.raises(ValueError, match=r"row 3 has unknown field\(s\) \['seconds'\]"):
        with_overrides(base, {"seconds": 1}, "row 3")
    with pytest.raises(ValueError, match=r"row 3: sandbox\.time_s must be a positive number"):
        with_overrides(base, {"time_s": 0}, "row 3")
    with pytest.raises(ValueError, match="row 3 must be a mapping"):
        with_overrides(base, [("time_s", 1)], "row 3")
