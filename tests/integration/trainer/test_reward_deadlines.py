"""Rewards through the real driver (Ray, FSDP2 trainers, the toy engine): each row is a call in
the reward processes under `reward.timeout_s`. A reward that hangs stops the run within its
deadline naming the row (`reward.on_error=fail`); hanging, raising, NaN and string rewards are
each scored and counted by kind (`reward.on_error=score`); no reward process outlives the run.
"""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path

import pytest

from hybrid.rewards.manager import RewardError
from hybrid.rewards.outcome import ERROR_KINDS
from hybrid.trainer.loop import Driver
from tests.integration.trainer.helpers import read_metrics, small_config, write_assets

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

# Which rows misbehave follows a checksum of the response: the toy engine's samples are random
# text, so every kind turns up within a few steps, and never a whole batch.
MISBEHAVING = """
import math, time, zlib

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    bucket = zlib.crc32(solution_str.encode()) % 10
    if bucket == 0 and HANG:
        time.sleep(3600)
    if bucket == 1:
        raise ValueError("could not parse the answer")
    if bucket == 2:
        return math.nan
    if bucket == 3:
        return "0.5"
    return 1.0
"""


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_assets(tmp_path_factory.mktemp("toy"))


def reward_file(directory: Path, *, hang: bool) -> Path:
    path = directory / "misbehaving_reward.py"
    path.write_text(f"HANG = {hang}\n{MISBEHAVING}")
    return path


def run(assets: Path, out: Path, reward: Path, *extra: str) -> None:
    config = small_config(
        assets,
        out,
        "rollout.engine=toy",
        f"reward.custom_path={reward}",
        "reward.num_workers=2",
        *extra,
    )
    Driver(config).fit()


@pytest.mark.full  # by default: the manager's hung row in tests/unit/rewards/test_pool.py
def test_a_hanging_reward_stops_the_run_within_its_deadline_naming_the_row(
    ray_cluster: None, assets: Path, tmp_path: Path
) -> None:
    reward = reward_file(tmp_path, hang=True)
    started = time.monotonic()
    with pytest.raises(RewardError) as info:
        run(assets, tmp_path / "run", reward, "trainer.total_steps=20", "reward.timeout_s=3")
    took = time.monotonic() - started
    message = str(info.value)
    assert "uid" in message and "(data_source 'arithmetic')" in message, message
    assert "reward.on_error=score" in message
    # The first failing step ends the run; each kind can be first, a timeout costs 3 s.
    assert any(f": {kind}: " in message for kind in ERROR_KINDS), message
    assert took < 120, took
    assert not multiprocessing.active_children(), multiprocessing.active_children()


@pytest.mark.full  # by default: every kind through real processes in tests/unit/rewards
def test_with_on_error_score_every_kind_is_scored_and_counted(
    ray_cluster: None, assets: Path, tmp_path: Path
) -> None:
    reward = reward_file(tmp_path, hang=True)
    out = tmp_path / "run"
    run(
        assets,
        out,
        reward,
        "trainer.total_steps=4",
        "reward.timeout_s=2",
        "reward.on_error=score",
        "reward.error_score=-1",
    )
    metrics = read_metrics(out)
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]
    for m in metrics:
        by_kind = sum(m[f"reward/errors/{kind}"] for kind in ERROR_KINDS)
        assert m["reward/errors"] == by_kind > 0, m
        assert m["reward/min"] == -1.0 and m["reward/max"] == 1.0, m
        # Timed-out rows cost their deadline each, two at a time: the step shows it.
        assert m["timing_s/reward"] >= 2.0 * (m["reward/errors/timeout"] > 0), m
    for kind in ERROR_KINDS:
        assert sum(m[f"reward/errors/{kind}"] for m in metrics) > 0, kind
    assert not multiprocessing.active_children(), multiprocessing.active_children()
