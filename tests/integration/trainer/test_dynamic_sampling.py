"""DAPO's dynamic sampling through real runs, in every mode: 3 steps on the tiny model and the
arithmetic prompts, in-process on the session's Ray cluster with real FSDP2 trainers. The
generation is the deterministic toy engine's (rollout.engine=toy: the tiny model itself,
sampled on CPU), since the filter is driver logic; the CPU demo runs it on vLLM
(docs/algorithms.md, "Dynamic sampling (DAPO)").

The untrained model answers about one prompt in ten, so most groups of 4 samples are
all-wrong: every step needs several rounds, and each trained batch holds only groups whose
rewards differ.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hybrid.trainer.loop import Driver
from tests.integration.trainer.helpers import ONE_WORKER, read_metrics, small_config, write_assets
from tests.integration.trainer.test_fully_async import check_accounting

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

STEPS = 3
FILTER = (
    "rollout.engine=toy",
    "algorithm.filter_groups.enable=true",
    "algorithm.filter_groups.max_num_gen_batches=20",
    "rollout.response_length=2",  # the sum's digit and the end of the answer
    "actor.use_kl_loss=false",
    "sync.method=memory",
)
MODES = {
    "colocated": ONE_WORKER,
    "split": ("trainer.mode=split",),
    "fully_async": ("trainer.mode=fully_async", "sync.timeout_s=120"),
}


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_assets(tmp_path_factory.mktemp("filter"))


@pytest.mark.parametrize(
    "mode",
    # By default colocated (the default tier's budget); the explorer loop's and the queue's
    # filters under -m full.
    ["colocated", *(pytest.param(m, marks=pytest.mark.full) for m in ("split", "fully_async"))],
)
def test_trained_batches_hold_only_informative_groups(
    ray_cluster: None, assets: Path, tmp_path: Path, mode: str
) -> None:
    out = tmp_path / mode
    Driver(small_config(assets, out, *FILTER, f"trainer.total_steps={STEPS}", *MODES[mode])).fit()
    metrics = read_metrics(out)
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    for m in metrics:
        assert m["reward/all_equal_groups"] == 0.0, m
        # Groups with a right and a wrong answer: the reward's mean is strictly inside (0, 1).
        assert 0.0 < m["reward/mean"] < 1.0
    tallies = {key: sum(m[key] for m in metrics) for key in metrics[0] if key.startswith("filter/")}
    # Every group generated is kept, uninformative or surplus; none is trained twice or lost.
    parts = ("groups_kept", "groups_uninformative", "groups_surplus")
    assert tallies["filter/groups_scored"] == sum(tallies[f"filter/{p}"] for p in parts)
    assert tallies["filter/groups_kept"] == 4 * STEPS  # data.train_batch_size per step
    assert tallies["filter/groups_uninformative"] > 0  # the filter had work to do
    assert tallies["filter/short_batches"] == tallies["filter/groups_backfilled"] == 0
    if mode == "fully_async":
        record = json.loads((out / "fully_async.json").read_text())
        check_accounting(record)
        assert record["accounting"]["filtered"] == tallies["filter/groups_uninformative"]


@pytest.mark.full  # GroupFilter's error is a unit test (tests/unit/trainer)
def test_running_out_of_rounds_stops_the_run_naming_the_field(
    ray_cluster: None, assets: Path, tmp_path: Path
) -> None:
    config = small_config(
        assets, tmp_path, *FILTER, "trainer.total_steps=1",
        "algorithm.filter_groups.max_num_gen_batches=1", "rollout.n=2", "actor.micro_batch_size=4",
    )  # fmt: skip
    with pytest.raises(RuntimeError, match=r"train step 1: dynamic sampling kept \d of the 4"):
        Driver(config).fit()


@pytest.mark.full  # the short batch's bookkeeping is a unit test (tests/unit/trainer)
def test_a_short_batch_is_backfilled_and_counted(
    ray_cluster: None, assets: Path, tmp_path: Path
) -> None:
    config = small_config(
        assets, tmp_path, *FILTER, "trainer.total_steps=1", "rollout.n=2", "actor.micro_batch_size=4",
        "algorithm.filter_groups.max_num_gen_batches=1", "algorithm.filter_groups.on_exhausted=short",
    )  # fmt: skip
    Driver(config).fit()
    (m,) = read_metrics(tmp_path)
    assert m["filter/short_batches"] == 1.0
    assert m["filter/groups_backfilled"] == 4 - m["filter/groups_kept"] > 0
    assert m["reward/all_equal_groups"] == m["filter/groups_backfilled"] / 4
