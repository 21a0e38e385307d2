"""`RewardPool`: reward calls in spawned processes, each under a deadline. Real processes; a
call that never returns is killed at its deadline and its row named, the rest still scored."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from hybrid.data import Batch
from hybrid.rewards import load_reward_function
from hybrid.rewards.manager import RewardError, RewardManager
from hybrid.rewards.pool import RewardPool

pytestmark = pytest.mark.unit

REWARD_FILE = """
import math, os, time

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str == "hang":
        time.sleep(3600)
    if solution_str == "raise":
        raise ValueError("no answer found")
    if solution_str == "nan":
        return math.nan
    if solution_str == "text":
        return "1.0"
    if solution_str == "exit":
        os._exit(3)
    if solution_str == "pid":
        return {"score": 1.0, "pid": os.getpid()}
    if solution_str == "litter":  # files left behind by a call killed at its deadline
        import tempfile
        open(os.path.join(tempfile.mkdtemp(), "half_written"), "w").write("x")
        time.sleep(3600)
    return float(solution_str == ground_truth)
"""


@pytest.fixture(scope="module")
def reward_fn(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A custom reward loaded from a file: it reaches the processes by value."""
    path = tmp_path_factory.mktemp("reward") / "my_reward.py"
    path.write_text(REWARD_FILE)
    return load_reward_function(str(path))


def call(response: str, gold: str = "a") -> tuple:
    return ("s", response, gold, None)


def test_every_kind_of_failure_comes_back_named_and_the_rest_is_scored(reward_fn: Any) -> None:
    pool = RewardPool(reward_fn, size=2, timeout_s=2.0)
    try:
        started = time.monotonic()
        outcomes = pool.map(
            [
                call("a"),
                call("hang"),
                call("raise"),
                call("nan"),
                call("text"),
                call("exit"),
                call("b"),
            ]
        )
        took = time.monotonic() - started
    finally:
        pool.close()
    kinds = [o[0] for o in outcomes]
    assert kinds == ["ok", "timeout", "exception", "not_finite", "wrong_type", "exception", "ok"]
    assert [outcomes[0][1], outcomes[6][1]] == [1.0, 0.0]
    assert "reward.timeout_s=2" in outcomes[1][1]
    assert outcomes[2][1].startswith("ValueError: no answer found")
    assert "exit code 3" in outcomes[5][1]
    assert pool.killed == 1
    assert took < 2.0 + 10.0, took  # the hung call cost its deadline, not an hour


def test_processes_are_reused_and_a_killed_one_is_replaced(reward_fn: Any) -> None:
    pool = RewardPool(reward_fn, size=1, timeout_s=1.0)
    try:
        first = pool.map([call("pid"), call("pid")])
        pool.map([call("hang")])
        after = pool.map([call("pid")])
    finally:
        pool.close()
    pids = [o[2]["pid"] for o in first]
    assert pids[0] == pids[1] != os.getpid()
    assert after[0][0] == "ok" and after[0][2]["pid"] != pids[0]


def test_bad_pool_settings_name_the_field() -> None:
    with pytest.raises(ValueError, match=r"reward\.timeout_s must be a positive number"):
        RewardPool(lambda *a: 0.0, size=1, timeout_s=0)
    with pytest.raises(ValueError, match=r"reward\.num_workers"):
        RewardPool(lambda *a: 0.0, size=0, timeout_s=1)


def test_the_manager_fails_on_a_hung_row_within_its_deadline(reward_fn: Any) -> None:
    rows = ["a", "hang", "a"]
    batch = Batch.from_dict(
        {"responses": torch.zeros(3, 1, dtype=torch.long)},
        {"response_text": rows, "ground_truth": ["a"] * 3, "data_source": ["gsm8k", "math", "x"]},
    )
    manager = RewardManager(reward_fn, num_workers=2, timeout_s=1.0)
    try:
        pending = manager.submit(batch)  # returns at once; the pool works meanwhile
        with pytest.raises(RewardError, match=r"row 1 \(data_source 'math'\): timeout: no score"):
            pending.result(timeout=30)
    finally:
        manager.close()
    scoring = RewardManager(reward_fn, num_workers=2, timeout_s=1.0, on_error="score")
    try:
        scores, metrics = scoring.score(batch)
    finally:
        scoring.close()
    assert scores.tolist() == [1.0, 0.0, 1.0]
    assert metrics["reward/errors"] == 1.0 and metrics["reward/errors/timeout"] == 1.0


def test_closing_the_manager_abandons_a_batch_in_the_pool(reward_fn: Any) -> None:
    """A run ending for another reason does not wait out a hung row's deadline."""
    batch = Batch.from_dict(
        {"responses": torch.zeros(1, 1, dtype=torch.long)},
        {"response_text": ["hang"], "ground_truth": ["a"], "data_source": ["s"]},
    )
    manager = RewardManager(reward_fn, num_workers=1, timeout_s=600)
    pending = manager.submit(batch)
    time.sleep(1.0)  # the call is running
    started = time.monotonic()
    manager.close()
    assert time.monotonic() - started < 10
    with pytest.raises(RuntimeError, match="closed while scoring"):
        pending.result(timeout=1)


def test_a_call_killed_at_its_deadline_leaves_no_temporary_files(reward_fn: Any) -> None:
    import tempfile

    def scratch_dirs() -> set[str]:
        return {p.name for p in Path(tempfile.gettempdir()).glob("hybrid-reward-*")}

    before = scratch_dirs()
    pool = RewardPool(reward_fn, size=1, timeout_s=1.0)
    try:
        outcomes = pool.map([call("litter"), call("a")])
        during = scratch_dirs()
    finally:
        pool.close()
    assert [o[0] for o in outcomes] == ["timeout", "ok"]
    assert len(during - before) == 1  # the replacement's; the killed process's is gone
    assert not scratch_dirs() - before  # (other processes' own may come and go meanwhile)


class _ExitsWhenLoaded:
    """Unpickling it ends the process: a reward process that dies while it starts."""

    def __reduce__(self) -> tuple:
        return (os._exit, (3,))


def test_a_process_that_dies_while_starting_is_named_and_leaves_nothing() -> None:
    import tempfile

    before = set(Path(tempfile.gettempdir()).glob("hybrid-reward-*"))
    pool = RewardPool(_ExitsWhenLoaded(), size=1, timeout_s=5.0)
    with pytest.raises(
        RuntimeError, match="could not load the reward function: it exited with code 3"
    ):
        pool.map([call("a")])
    pool.close()
    assert not set(Path(tempfile.gettempdir()).glob("hybrid-reward-*")) - before


WAITING_FILE = """
import os, threading, time

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str == "hang":
        time.sleep(3600)
    if solution_str == "exit":
        time.sleep(0.2)  # while the other calls of its process run
        os._exit(3)
    started = time.time()
    time.sleep(2.0 if solution_str == "slow" else 0.2)
    return {"score": 1.0, "pid": os.getpid(), "thread": threading.get_ident(),
            "started": started, "ended": time.time()}
"""


@pytest.fixture
def waiting_fn(tmp_path: Path) -> Any:
    path = tmp_path / "waiting.py"
    path.write_text(WAITING_FILE)
    return load_reward_function(str(path))


def test_calls_that_wait_overlap_in_the_threads_of_each_process(waiting_fn: Any) -> None:
    pool = RewardPool(waiting_fn, size=2, timeout_s=30.0, concurrency=8)
    try:
        pool.map([call("warm")] * 2)  # start the processes
        outcomes = pool.map([call(str(i)) for i in range(16)])
    finally:
        pool.close()
    assert [o[0] for o in outcomes] == ["ok"] * 16
    assert len({o[2]["pid"] for o in outcomes}) == 2
    assert len({(o[2]["pid"], o[2]["thread"]) for o in outcomes}) == 16
    # 16 calls of 0.2 s on 2 processes x 8 threads: in each process, calls ran at the same
    # time (read from the calls' own clocks, not the wall time of the map, which a loaded
    # machine stretches).
    for pid in {o[2]["pid"] for o in outcomes}:
        spans = [(o[2]["started"], o[2]["ended"]) for o in outcomes if o[2]["pid"] == pid]
        assert most_at_once(spans) >= 2, spans


def most_at_once(spans: list[tuple[float, float]]) -> int:
    """The largest number of the (start, end) intervals that hold one instant."""
    events = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    running = most = 0
    for _, step in events:
        running += step
        most = max(most, running)
    return most


def test_a_deadline_kills_the_process_and_its_other_calls_run_again(waiting_fn: Any) -> None:
    pool = RewardPool(waiting_fn, size=1, timeout_s=1.0, concurrency=4)
    try:
        outcomes = pool.map([call("a"), call("hang"), call("b"), call("c"), call("d")])
        assert pool.killed == 1
    finally:
        pool.close()
    kinds = [o[0] for o in outcomes]
    assert kinds == ["ok", "timeout", "ok", "ok", "ok"], outcomes
    assert "reward.timeout_s=1" in outcomes[1][1]


def test_a_process_that_dies_fails_every_call_it_was_running(waiting_fn: Any) -> None:
    pool = RewardPool(waiting_fn, size=1, timeout_s=30.0, concurrency=3)
    try:
        outcomes = pool.map([call("slow"), call("exit"), call("slow"), call("b")])
    finally:
        pool.close()
    # The three first ran together in the process that exit ended; b ran after, elsewhere.
    assert [o[0] for o in outcomes] == ["exception", "exception", "exception", "ok"], outcomes
    assert "died (exit code 3) while running 3 calls" in outcomes[1][1]


def test_a_pool_of_zero_calls_per_process_is_refused(waiting_fn: Any) -> None:
    with pytest.raises(ValueError, match=r"reward\.calls_per_worker must be >= 1"):
        RewardPool(waiting_fn, size=1, timeout_s=1.0, concurrency=0)
