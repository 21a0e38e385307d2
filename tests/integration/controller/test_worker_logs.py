"""A group with a log_dir: each worker's output (Python, C-level, logging) lands in its own file,
our warnings still reach the console once, and errors still reach the driver with the worker's
traceback, whether the worker raises or dies."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray

from hybrid.controller import (
    Dispatch,
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    Worker,
    WorkerCallError,
    WorkerDiedError,
    register,
)
from hybrid.controller.worker_dict import worker_log_path

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

logger = logging.getLogger("hybrid.tests.chatty")


class Chatty(Worker):
    """Writes through every channel a library might use, then fails on request."""

    def __init__(self) -> None:
        print(f"print from rank {self.rank} in __init__")

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def chatter(self) -> int:
        print(f"python stdout of rank {self.rank}")
        os.write(1, f"fd 1 of rank {self.rank}\n".encode())  # what C code and vLLM do
        os.write(2, f"fd 2 of rank {self.rank}\n".encode())
        logging.getLogger("vllm.fake").info("library info of rank %d", self.rank)
        for _ in range(3):  # repeated every step: the console gets it once
            logger.warning("a fallback that matters")
        return os.getpid()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def fail_on(self, rank: int) -> None:
        if self.rank == rank:
            self._deep_failure()

    def _deep_failure(self) -> None:
        raise ValueError(f"deliberate failure on rank {self.rank}")

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def die_on(self, rank: int) -> None:
        if self.rank == rank:
            print("last words before the crash", flush=True)
            os._exit(1)


@pytest.fixture(scope="module")
def logged(ray_cluster: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayWorkerGroup]:
    log_dir = tmp_path_factory.mktemp("run") / "logs"
    group = RayWorkerGroup(RayResourcePool([2]), RayClassWithInitArgs(Chatty), log_dir=log_dir)
    yield group
    group.shutdown()


def read_log(group: RayWorkerGroup, rank: int) -> str:
    assert group.log_dir is not None
    return worker_log_path(group.log_dir, rank).read_text()


def ray_stderr(pid: int) -> str:
    """What Ray forwards to the driver's console from this worker (its own stderr file)."""
    logs = Path(ray._private.worker.global_worker.node.get_logs_dir_path())
    return "".join(path.read_text() for path in logs.glob(f"worker-*-{pid}.err"))


def wait_for(predicate: object, timeout_s: float = 10.0) -> None:
    assert callable(predicate)
    deadline = time.monotonic() + timeout_s
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.2)


def test_every_channel_goes_to_the_rank_s_log_file(logged: RayWorkerGroup) -> None:
    pids = logged.chatter()
    for rank, pid in enumerate(pids):
        text = read_log(logged, rank)
        for line in (
            f"print from rank {rank} in __init__",
            f"python stdout of rank {rank}",
            f"fd 1 of rank {rank}",
            f"fd 2 of rank {rank}",
            f"library info of rank {rank}",
            "a fallback that matters",
        ):
            assert line in text, f"{line!r} missing from worker_{rank}.log"
        # The console (Ray's stderr file of the worker) got our warning once, nothing else.
        wait_for(lambda pid=pid: "a fallback that matters" in ray_stderr(pid))
        forwarded = ray_stderr(pid)
        assert forwarded.count("a fallback that matters") == 1
        for noise in ("python stdout", "fd 1 of", "fd 2 of", "library info", "print from"):
            assert noise not in forwarded


def test_a_worker_exception_shows_its_traceback_on_the_driver(logged: RayWorkerGroup) -> None:
    with pytest.raises(WorkerCallError) as info:
        logged.fail_on(1)
    message = str(info.value)
    assert "Chatty.fail_on failed on rank 1" in message
    assert "Traceback" in message and "_deep_failure" in message
    assert "deliberate failure on rank 1" in message
    # The log file has it too, after whatever the worker printed before it.
    assert "_deep_failure" in read_log(logged, 1)
    assert logged.fail_on(5) == [None, None]  # still usable


def test_a_dead_worker_s_error_quotes_its_log(ray_cluster: None, tmp_path: Path) -> None:
    group = RayWorkerGroup(
        RayResourcePool([2]), RayClassWithInitArgs(Chatty), log_dir=tmp_path / "logs"
    )
    try:
        with pytest.raises(WorkerDiedError) as info:
            group.die_on(0)
        assert info.value.rank == 0
        assert "last words before the crash" in str(info.value)
        assert str(worker_log_path(tmp_path / "logs", 0)) in str(info.value)
    finally:
        group.shutdown()
