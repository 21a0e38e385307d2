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
    answered yet, in the order sent. With concurrency 1 it runs them one after the other (the
    first is running, since `started`); with more, each row runs from the moment it is sent
    (the pool sends no more rows than the process has threads)."""

    def __init__(self, fn_bytes: bytes, concurrency: int = 1) -> None:
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
                str(concurrency),
            ],
            pass_fds=(child_in, child_out),
            stdin=subprocess.DEVNULL,
        )
        os.close(child_in)
        os.close(child_out)
        self.conn = Connection(parent_in, writable=False)
        """What the process sends: `wait` watches it."""
        self._outbox = Connection(parent_out, readable=False)
        self.concurrency = concurrency
        self.rows: dict[int, tuple] = {}
        """task -> its call, for the rows sent and not answered, in the order sent."""
        self._sent_at: dict[int, float] = {}
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

    def room(self, chunk_size: int) -> int:
        """How many rows to send it now: a chunk when it is idle (one at a time), else as many
        as it has free threads."""
        if self.concurrency == 1:
            return 0 if self.rows else chunk_size
        return self.concurrency - len(self.rows)

    def send(self, chunk: list[tuple[int, tuple]]) -> None:
        now = time.monotonic()
        if not self.rows:
            self.started = now
        for task, args in chunk:
            self.rows[task] = args
            self._sent_at[task] = now
        self._outbox.send(chunk)

    def running(self) -> list[tuple[int, float]]:
        """(task, since when) of the rows running now."""
        if self.concurrency == 1:
            return [(next(iter(self.rows)), self.started)] if self.rows else []
        return list(self._sent_at.items())

    def answered(self, task: int) -> None:
        """A row is done (with one thread, the next one starts now)."""
        assert task in self.rows, (task, list(self.rows))
        if self.concurrency == 1:
            assert task == next(iter(self.rows)), (task, list(self.rows))
        del self.rows[task]
        del self._sent_at[task]
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
    """`size` processes calling one reward function, each running `concurrency` calls at once
    (threads; for functions that wait rather than compute); `map` blocks until every call is
    done or past its deadline. Not thread-safe: one `map` at a time (the manager runs them in
    turn).

    With one call per process, rows go out in chunks (one message per chunk, a reply per row):
    a round trip per row would cost more than a cheap rule reward itself. Each process is sent
    about a quarter of its share at a time, so a slow row delays few others. With more, each
    process gets as many rows as it has free threads.

    A call past its deadline kills its process, and with it the other calls that process was
    running: those go back to the queue, to a fresh process."""

    def __init__(self, fn: Any, size: int, timeout_s: float, concurrency: int = 1) -> None:
        if size < 1:
            raise ValueError(f"reward.num_workers: a pool needs at least 1 process, got {size}")
        if concurrency < 1:
            raise ValueError(f"reward.calls_per_worker must be >= 1, got {concurrency}")
        if not timeout_s > 0:
            raise ValueError(
                f"reward.timeout_s must be a positive number of seconds, got {timeout_s}"
            )
        self.size, self.timeout_s, self.concurrency = size, timeout_s, concurrency
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
        wanted = min(self.size, -(-len(calls) // self.concurrency))
        started = [
            _Process(self._fn_bytes, self.concurrency) for _ in range(wanted - len(self._processes))
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
                    count = min(worker.room(chunk_size), len(pending))
                    if count > 0:
                        worker.send([pending.popleft() for _ in range(count)])
                busy = {w.conn: w for w in self._processes if w.rows}
                for ready in wait(list(busy), timeout=self._next_deadline(busy)):
                    worker = busy[ready]  # type: ignore[index]
                    try:
                        task, outcome = worker.conn.recv()
                    except (EOFError, OSError):  # the process died mid-call (os._exit, a crash)
                        worker.process.wait(timeout=5)  # reap it: its exit code is known then
                        # Any of its running rows may have done it: none is tried again.
                        running = [task for task, _ in worker.running()]
                        message = f"the reward process died (exit code {worker.exit_code})"
                        if len(running) > 1:
                            message += f" while running {len(running)} calls"
                        died: Outcome = ("exception", message, {})
                        self._replace(worker, running, died, outcomes, pending)
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
        failed: list[int],
        outcome: Outcome,
        outcomes: list[Outcome | None],
        pending: deque[tuple[int, tuple]],
    ) -> None:
        """The `failed` rows of `worker` get `outcome`; its other rows go back to the front of
        `pending`, in order; a fresh process takes its place."""
        for task in failed:
            outcomes[task] = outcome
        retried = [(task, args) for task, args in worker.rows.items() if task not in failed]
        worker.kill()
        self._processes.remove(worker)
        pending.extendleft(reversed(retried))
        replacement = _Process(self._fn_bytes, self.concurrency)
        replacement.wait_ready()
        self._processes.append(replacement)

    def _next_deadline(self, busy: dict[Connection, _Process]) -> float:
        """Seconds until the first running row passes its deadline (at most 1: a cancel is
        noticed within a second)."""
        starts = [since for worker in busy.values() for _, since in worker.running()]
        earliest = min(starts) + self.timeout_s
        return max(0.0, min(earliest - time.monotonic(), 1.0))

    def _expire(self, outcomes: list[Outcome | None], pending: deque[tuple[int, tuple]]) -> None:
        """Kill each process with a running row past its deadline; those rows time out."""
        now = time.monotonic()
        for worker in [w for w in self._processes if w.rows]:
            late = [(task, now - since) for task, since in worker.running()]
            late = [(task, ran) for task, ran in late if ran >= self.timeout_s]
            if late:
                ran = max(ran for _, ran in late)
                message = f"no score after {ran:.1f} s (reward.timeout_s={self.timeout_s:g})"
                failed = [task for task, _ in late]
                self._replace(worker, failed, ("timeout", message, {}), outcomes, pending)
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
