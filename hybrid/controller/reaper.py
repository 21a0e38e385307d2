"""The reaper: when the driver of a local Ray cluster is gone, by any cause SIGKILL included,
it stops every process of that cluster that is still running.

Why Ray alone is not enough (ray 2.x, seen on 2.60): gcs_server, raylet and the monitors die
with the driver that started them, and workers exit when their raylet does, but the dashboard
agent and the runtime-env agent first report the raylet's death to the GCS that died with it,
which blocks them for `publish_error_to_driver`'s fixed 60 s; and a SIGSTOPped worker never
notices at all.

How it knows the cluster, and nothing else: the driver sets MARK_VARIABLE to a fresh value
around `ray.init`, so the processes ray.init starts carry it and pass it on (workers, what
workers spawn). /proc/<pid>/environ shows a process's starting environment, but a process that
rewrites its title (Ray's agents do) blanks it; so the reaper also counts every descendant of
a marked process, and remembers each member it has seen (pid and start time: pids get reused),
since a member whose parent died is re-parented to init. It refreshes that view every POLL_S.

How it knows the driver is gone: it blocks on a pipe whose only write end the driver holds;
end of file means the driver closed it or died. The driver sends one line, `started`, once
ray.init returned; the cluster's own processes are then the marked children of the driver, and
once none of them runs (ray.shutdown) the reaper stops the rest and exits while the driver
lives on. A driver that forks without exec hands the write end to the fork: EOF then waits for
both.

It runs as a script with the stdlib alone (`python -I reaper.py`): `-m hybrid.controller.reaper`
would import the package, and with it Ray and torch, for a process that mostly waits.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

MARK_VARIABLE = "HYBRID_RAY_CLUSTER_MARK"
"""Environment variable whose value names one local cluster; set only around ray.init."""

STARTED = b"started\n"
"""The driver's one message: ray.init returned, so the cluster's own processes exist."""

POLL_S = 1.0
"""How often the reaper refreshes its view of the cluster while the driver lives."""

GRACE_S = 2.0
"""How long a process has to exit after SIGTERM before it gets SIGKILL."""

KILL_WAIT_S = 5.0
"""How long after the SIGKILLs the reaper keeps looking for members still running."""


@dataclass(frozen=True)
class Proc:
    """One process, as /proc shows it."""

    pid: int
    ppid: int
    name: str
    state: str
    """One letter: R, S, D, T (stopped), Z (zombie), X (dead), ..."""
    start_ticks: int
    """Start time after boot in clock ticks: with the pid, names one process."""
    marked: bool
    """Whether its environment holds this cluster's mark."""

    @property
    def running(self) -> bool:
        return self.state not in "ZX"


def parse_stat(text: str, marked: bool = False) -> Proc:
    """Parse /proc/<pid>/stat. The name sits in parentheses and may hold spaces and
    parentheses itself, so the fields after it are counted from the last ')'."""
    head, _, tail = text.rpartition(")")
    pid, _, name = head.partition(" (")
    fields = tail.split()  # proc(5) fields 3 (state), 4 (ppid) ... 22 (starttime)
    return Proc(int(pid), int(fields[1]), name, fields[0], int(fields[19]), marked)


def carries_mark(environ: bytes, mark: str) -> bool:
    """Whether a process environment (/proc/<pid>/environ: NUL-separated entries) holds
    MARK_VARIABLE=mark exactly."""
    return f"{MARK_VARIABLE}={mark}".encode() in environ.split(b"\0")


def cluster_members(table: Mapping[int, Proc], known: Mapping[int, int]) -> dict[int, int]:
    """The running processes of the cluster, as pid -> start ticks: the marked ones, the ones
    seen before (`known`, same pid and start time), and every descendant of those."""
    children: dict[int, list[int]] = {}
    for proc in table.values():
        children.setdefault(proc.ppid, []).append(proc.pid)
    pending = [
        proc.pid
        for proc in table.values()
        if proc.marked or known.get(proc.pid) == proc.start_ticks
    ]
    members: dict[int, int] = {}
    while pending:
        pid = pending.pop()
        if pid in members or not table[pid].running:
            continue
        members[pid] = table[pid].start_ticks
        pending.extend(children.get(pid, []))
    return members


def read_table(mark: str) -> dict[int, Proc]:
    """Every process this user may read, by pid. Other users' processes are unreadable and
    left out; so is one that ends while being read."""
    table: dict[int, Proc] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            environ = Path(entry.path, "environ").read_bytes()
            proc = parse_stat(Path(entry.path, "stat").read_text(), carries_mark(environ, mark))
        except (OSError, IndexError, ValueError):
            continue
        table[proc.pid] = proc
    return table


def _signal(pid: int, signum: int) -> None:
    with suppress(ProcessLookupError):  # gone since the scan: nothing left to stop
        os.kill(pid, signum)


def stop_members(
    mark: str, known: Mapping[int, int], exclude: frozenset[int], grace_s: float = GRACE_S
) -> list[str]:
    """SIGTERM every member (and SIGCONT, so a stopped one can act on it), SIGKILL those
    still running after grace_s, and keep looking KILL_WAIT_S more for members started
    meanwhile. Returns one line per process signalled; empty when none ran."""
    last_signal: dict[int, str] = {}
    names: dict[int, str] = {}
    started = time.monotonic()
    while True:
        table = read_table(mark)
        known = {p: t for p, t in cluster_members(table, known).items() if p not in exclude}
        elapsed = time.monotonic() - started
        if not known or elapsed > grace_s + KILL_WAIT_S:
            break
        for pid in known:
            names[pid] = table[pid].name
            if pid not in last_signal:
                _signal(pid, signal.SIGTERM)
                _signal(pid, signal.SIGCONT)
                last_signal[pid] = "SIGTERM"
            elif elapsed > grace_s and last_signal[pid] != "SIGKILL":
                _signal(pid, signal.SIGKILL)
                last_signal[pid] = "SIGKILL"
        time.sleep(0.1)
    for pid in known:
        last_signal[pid] = "STILL RUNNING"
    return [f"{pid} {names[pid]}: {sent}" for pid, sent in sorted(last_signal.items())]


def wait_for_end(pipe_fd: int, mark: str, driver_pid: int) -> tuple[str, dict[int, int]]:
    """Block until the driver is gone or its cluster's own processes stopped; say which, with
    the members seen last."""
    known: dict[int, int] = {}
    own: dict[int, int] = {}
    while True:
        readable, _, _ = select.select([pipe_fd], [], [], POLL_S)
        message = os.read(pipe_fd, 64) if readable else None
        if message == b"":
            return f"the driver (pid {driver_pid}) is gone", known
        table = read_table(mark)
        known = cluster_members(table, known)
        if message is not None and STARTED in message:
            own = {pid: t for pid, t in known.items() if table[pid].ppid == driver_pid}
        if own and not any(known.get(pid) == t for pid, t in own.items()):
            return f"the Ray cluster of the driver (pid {driver_pid}) stopped", known


def main(argv: list[str]) -> None:
    mark, driver_pid = argv[1], int(argv[2])
    why, known = wait_for_end(sys.stdin.fileno(), mark, driver_pid)
    stopped = stop_members(mark, known, exclude=frozenset({os.getpid(), driver_pid}))
    if stopped:
        lines = "\n".join(f"  {line}" for line in stopped)
        message = f"hybrid reaper: {why}; stopped what was left of its Ray cluster:\n{lines}\n"
        with suppress(OSError):  # the driver's stderr may be a pipe nobody reads any more
            sys.stderr.write(message)
            sys.stderr.flush()


@dataclass
class Reaper:
    """The driver's end: holds the pipe whose end of file tells the reaper to act."""

    process: subprocess.Popen[bytes]
    mark: str

    @classmethod
    def start(cls) -> Reaper:
        """Start a reaper for a cluster about to be started under a new mark. Its own session
        keeps it out of the terminal's Ctrl-C and of a kill aimed at the driver's group."""
        mark = uuid.uuid4().hex
        process = subprocess.Popen(
            [sys.executable, "-I", str(Path(__file__)), mark, str(os.getpid())],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            start_new_session=True,
        )
        return cls(process, mark)

    @contextmanager
    def marking(self) -> Iterator[None]:
        """Mark what starts inside the block (ray.init's processes) as this cluster's."""
        os.environ[MARK_VARIABLE] = self.mark
        try:
            yield
        finally:
            del os.environ[MARK_VARIABLE]

    def cluster_started(self) -> None:
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(STARTED)
            self.process.stdin.flush()
        except BrokenPipeError:
            raise RuntimeError(
                f"the reaper of the local Ray cluster (pid {self.process.pid}) exited with "
                f"code {self.process.poll()} before the cluster started; its error is above"
            ) from None

    def release(self) -> None:
        """Close the pipe: the reaper stops what is left of the cluster and exits."""
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.poll()  # collects an exit status already there; never waits


if __name__ == "__main__":
    main(sys.argv)
