"""Reward calls in worker processes, each under a deadline.

A reward function is user code: it may hang (a regex that backtracks forever, a sandbox that
never returns), crash the interpreter, or cost tens of milliseconds a row. Run inline on the
driver, any of these stalls the whole run with no error. Here each row is one call in one of
`size` reward processes (hybrid/rewards/worker.py); a call that outlives its deadline gets its process killed (and
replaced on the next call), and its row comes back as a `timeout` outcome naming how long it
ran. The function travels to the processes once, by value (cloudpickle), so a custom function
loaded from a file works as well as a built-in.

Outcomes, one per call, in call order: ("ok", score, extras) or (kind, message, {}) with kind
one of ERROR_KINDS. What a failed row means for the run is the manager's business.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from multiprocessing.connection import Connection, wait
from typing import Any

import cloudpickle

from hybrid.rewards.outcome import Outcome

START_TIMEOUT_S = 120.0
"""How long a new process may take to start and load the function."""


class _Process:
    """One reward process (hybrid/rewards/worker.py) and the rows it was sent and has not
    answered yet, in order: the first of them is running, since `started`."""

    def __init__(self, fn_bytes: bytes) -> None:
        self.scratch = tempfile.mkdtemp(prefix="hybrid-reward-")
        child_in, parent_out = os.pipe()
        parent_in, child_out = os.pipe()
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "hybrid.rewards.worker",
                str(child_in),
                str(child_out),
                self.scratch,
            ],
            pass_fds=(child_in, child_out),
            stdin=subprocess.DEVNULL,
        )
        os.close(child_in)
        os.close(child_out)
        self.conn = Connection(parent_in, writable=False)
        """What the process sends: `wait` watches it."""
        self._outbox = Connection(parent_out, readable=False)
        self.rows: deque[tuple[int, tuple]] = deque()
        self.started = 0.0
        self._outbox.send_bytes(fn_bytes)

    def wait_ready(self) -> None:
        """Until the process has loaded the function. The deadline of a call starts once the
        process runs the function, not while it starts and imports (seconds on a loaded
        machine)."""
        if not self.conn.poll(START_TIMEOUT_S):
            self.kill()
            raise RuntimeError(f"a reward process did not start within {START_TIMEOUT_S:g} s")
        try:
            state, message = self.conn.recv()
        except (EOFError, OSError):  # it exited before it could say why
            self.kill()
            state, message = "exited", f"it exited with code {self.exit_code}"
        if state != "ready":
            self.kill()
            raise RuntimeError(f"a reward process could not load the reward function: {message}")

    @property
    def exit_code(self) -> int | None:
        return self.process.poll()

    def send(self, chunk: list[tuple[int, tuple]]) -> None:
        self.rows.extend(chunk)
        self.started = time.monotonic()
        self._outbox.send(chunk)

    def answered(self, task: int) -> None:
        """The running row is done: the next one starts now."""
        assert self.rows and self.rows[0][0] == task, (task, self.rows[0][0])
        self.rows.popleft()
        self.started = time.monotonic()

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(timeout=5)
        self.end()

    def stop(self) -> None:
        """Close its input: the process returns from its loop; killed if it does not."""
        self._outbox.close()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=5)
        self.end()

    def end(self) -> None:
        """After the process is gone: its pipes and its temporary files."""
        self.conn.close()
        self._outbox.close()
        shutil.rmtree(self.scratch, ignore_errors=True)


class RewardPool:
    """`size` processes calling one reward function; `map` blocks until every call is done or
    past its deadline. Not thread-safe: one `map` at a time (the manager runs one per step).

    Rows go out in chunks (one message per chunk, a reply per row): a round trip per row
    would cost more than a cheap rule reward itself. Each process is sent about a quarter of
    its share at a time, so a slow row delays few others."""

    def __init__(self, fn: Any, size: int, timeout_s: float) -> None:
        if size < 1:
            raise ValueError(f"reward.num_workers: a pool needs at least 1 process, got {size}")
        if not timeout_s > 0:
            raise ValueError(
                f"reward.timeout_s must be a positive number of seconds, got {timeout_s}"
            )
        self.size, self.timeout_s = size, timeout_s
        self._fn_bytes = cloudpickle.dumps(fn)
        self._processes: list[_Process] = []
        self.killed = 0
        """Processes killed at a deadline since the pool started."""
        self._cancelled = threading.Event()

    def map(self, calls: list[tuple]) -> list[Outcome]:
        """One outcome per call, in order."""
        outcomes: list[Outcome | None] = [None] * len(calls)
        pending = deque(enumerate(calls))
        chunk_size = max(1, len(calls) // (self.size * 4))
        started = [
            _Process(self._fn_bytes)
            for _ in range(min(self.size, len(calls)) - len(self._processes))
        ]
        try:
            for worker in started:  # started together, waited for in turn
                worker.wait_ready()
        except BaseException:
            for worker in started:
                worker.kill()
            raise
        self._processes.extend(started)
        try:
            while pending or any(w.rows for w in self._processes):
                if self._cancelled.is_set():
                    raise RuntimeError("the reward pool was closed while scoring")
                for worker in self._processes:
                    if pending and not worker.rows:
                        count = min(chunk_size, len(pending))
                        worker.send([pending.popleft() for _ in range(count)])
                busy = {w.conn: w for w in self._processes if w.rows}
                for ready in wait(list(busy), timeout=self._next_deadline(busy)):
                    worker = busy[ready]  # type: ignore[index]
                    try:
                        task, outcome = worker.conn.recv()
                    except (EOFError, OSError):  # the process died mid-call (os._exit, a crash)
                        worker.process.wait(timeout=5)  # reap it: its exit code is known then
                        message = f"the reward process died (exit code {worker.exit_code})"
                        self._replace(worker, ("exception", message, {}), outcomes, pending)
                        continue
                    outcomes[task] = outcome
                    worker.answered(task)
                self._expire(outcomes, pending)
        except BaseException:
            for worker in self._processes:
                if worker.rows:
                    worker.kill()
            self._processes = [w for w in self._processes if not w.rows]
            raise
        assert all(outcome is not None for outcome in outcomes)
        return outcomes  # type: ignore[return-value]

    def _replace(
        self,
        worker: _Process,
        outcome: Outcome,
        outcomes: list[Outcome | None],
        pending: deque[tuple[int, tuple]],
    ) -> None:
        """`worker`'s running row gets `outcome`; the rows queued behind it go back to the
        front of `pending`; a fresh process takes its place."""
        (running, _), *queued = worker.rows
        outcomes[running] = outcome
        worker.kill()
        self._processes.remove(worker)
        pending.extendleft(reversed(queued))
        replacement = _Process(self._fn_bytes)
        replacement.wait_ready()
        self._processes.append(replacement)

    def _next_deadline(self, busy: dict[Connection, _Process]) -> float:
        """Seconds until the first running row passes its deadline (at most 1: a cancel is
        noticed within a second)."""
        earliest = min(w.started for w in busy.values()) + self.timeout_s
        return max(0.0, min(earliest - time.monotonic(), 1.0))

    def _expire(self, outcomes: list[Outcome | None], pending: deque[tuple[int, tuple]]) -> None:
        """Kill each process whose running row is past its deadline; the row times out."""
        now = time.monotonic()
        for worker in [w for w in self._processes if w.rows]:
            ran = now - worker.started
            if ran >= self.timeout_s:
                message = f"no score after {ran:.1f} s (reward.timeout_s={self.timeout_s:g})"
                self._replace(worker, ("timeout", message, {}), outcomes, pending)
                self.killed += 1

    def cancel(self) -> None:
        """Make a `map` running on another thread kill its busy processes and raise (within a
        second): the run is ending and will not wait for its scores."""
        self._cancelled.set()

    def close(self) -> None:
        """End every process (each returns from its loop once its input closes)."""
        for worker in self._processes:
            worker.stop()
        self._processes = []
