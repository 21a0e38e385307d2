"""A reward process: `python -m hybrid.rewards.worker READ_FD WRITE_FD SCRATCH`.

Started by `RewardPool` as a plain subprocess rather than through multiprocessing, whose
spawn re-imports the parent's main module in every child (for `python -m hybrid.main`: Hydra,
Ray and the trainer, seconds and hundreds of MB a process). This module imports only the reward
code. Protocol over two pipes of pickled messages: the function (cloudpickled bytes) in,
("ready", "") or ("failed", why) out; then chunks of (task, args) in, one (task, outcome) out
per row, as soon as it is known. With CONCURRENCY > 1 the rows run in that many threads at once
(answers come back out of order): for functions that wait (a remote judge, a sandbox) rather
than compute, whose waits release the GIL. Temporary files go under SCRATCH, which the pool
removes with the process: a call killed at its deadline cannot clean up after itself (a
sandbox's folder).

    python -m hybrid.rewards.worker READ_FD WRITE_FD SCRATCH [CONCURRENCY]
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import tempfile
import threading
import traceback
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection

import cloudpickle

from hybrid.rewards.outcome import Outcome, checked_outcome


def die_with_parent() -> None:
    """Linux: the kernel kills this process when its parent dies, so a driver killed with
    SIGKILL leaves no reward process behind (a stuck call never reads the closed pipe)."""
    with contextlib.suppress(OSError, AttributeError):  # not Linux: no such guarantee
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def call(fn: object, args: tuple) -> Outcome:
    try:
        return checked_outcome(fn(*args))  # type: ignore[operator]
    except Exception as error:  # the user's code: every error becomes the row's outcome
        return ("exception", f"{type(error).__name__}: {error}\n{traceback.format_exc()}", {})


def serve(inbox: Connection, outbox: Connection, concurrency: int = 1) -> None:
    try:
        fn = cloudpickle.loads(inbox.recv_bytes())
    except Exception as error:  # e.g. the function's module is not importable here
        outbox.send(("failed", f"{type(error).__name__}: {error}"))
        return
    outbox.send(("ready", ""))
    if concurrency == 1:
        for task, args in received(inbox):
            outbox.send((task, call(fn, args)))
        return
    # Each row in a thread as soon as it arrives (the pool never sends more than
    # `concurrency` rows at once), its answer sent when it is known.
    sending = threading.Lock()

    def run(task: int, args: tuple) -> None:
        outcome = call(fn, args)
        with sending:
            outbox.send((task, outcome))

    with ThreadPoolExecutor(concurrency, thread_name_prefix="reward") as calls:
        for task, args in received(inbox):
            calls.submit(run, task, args)


def received(inbox: Connection) -> Iterator[tuple[int, tuple]]:
    """The rows the pool sends, chunk by chunk, until it closes the pipe."""
    while True:
        try:
            chunk = inbox.recv()
        except (EOFError, OSError):  # the pool closed the pipe: done
            return
        yield from chunk


def main(argv: list[str]) -> None:
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's to handle
    read_fd, write_fd, scratch = int(argv[0]), int(argv[1]), argv[2]
    concurrency = int(argv[3]) if len(argv) > 3 else 1
    os.environ["TMPDIR"] = tempfile.tempdir = scratch  # for this process and its children
    serve(Connection(read_fd, writable=False), Connection(write_fd, readable=False), concurrency)


if __name__ == "__main__":
    main(sys.argv[1:])
