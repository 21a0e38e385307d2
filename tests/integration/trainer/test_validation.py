"""Validation by sampling (trainer.val_n, val_temperature): one step of the small run on the
deterministic toy engine, in-process (`Driver(config).fit()` on the session's Ray cluster),
validating before training with 4 samples per prompt at temperature 1. The first row of
metrics.jsonl carries the val/ means as before and verl's val-core / val-aux estimators for
the data source and for `all` (docs/evaluation.md, "Validation metrics"). The untrained model
never answers an arithmetic prompt, so a custom reward (any leading digit) gives the
estimators something to separate, and its `extract_answer` gives maj@k the answers to vote
on. Colocated runs by default; split (validation on the explorers) under -m full."""

from __future__ import annotations

from pathlib import Path

import pytest

from hybrid.trainer.loop import Driver
from tests.integration.trainer.helpers import ONE_WORKER, read_metrics, small_config, write_assets

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return 1.0 if solution_str[:1].isdigit() else 0.0


def extract_answer(data_source, solution_str):
    return solution_str[:1] or None
"""

MODES = {
    "colocated": ONE_WORKER,
    "split": ("trainer.mode=split", "sync.method=memory"),
}


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = write_assets(tmp_path_factory.mktemp("validation"))
    (root / "reward.py").write_text(REWARD)
    return root


@pytest.mark.parametrize("mode", ["colocated", pytest.param("split", marks=pytest.mark.full)])
def test_sampled_validation_reports_the_estimators(
    ray_cluster: None, assets: Path, tmp_path: Path, mode: str
) -> None:
    out = tmp_path / mode
    config = small_config(
        assets, out, "rollout.engine=toy", "trainer.total_steps=1", *MODES[mode],
        f"data.val_files=[{assets / 'test.jsonl'}]", "trainer.val_before_train=true",
        "trainer.val_n=4", "trainer.val_temperature=1.0",
        f"reward.custom_path={assets / 'reward.py'}",
    )  # fmt: skip
    Driver(config).fit()
    first = read_metrics(out)[0]
    assert first["step"] == 0 and first["val/num_prompts"] == 8, first
    for source in ("arithmetic", "all"):
        core = first[f"val-core/{source}/reward/mean@4"]
        # mean@n over prompts of n samples each is the mean over every sample.
        assert core == pytest.approx(first["val/reward_mean"])
        aux = f"val-aux/{source}/reward"
        for k in (1, 2, 4):
            for name in (f"best@{k}/mean", f"maj@{k}/mean", f"pass@{k}"):
                assert 0.0 <= first[f"{aux}/{name}"] <= 1.0, (source, name)
        assert 0.0 < core < 1.0
        assert first[f"{aux}/pass@4"] > first[f"{aux}/pass@2"] > first[f"{aux}/pass@1"]
        assert first[f"{aux}/pass@1"] == pytest.approx(core)  # a 0/1 reward: pass@1 = mean
        assert first[f"{aux}/best@4/mean"] > first[f"{aux}/best@1/mean"]
    assert not any(key.startswith(("val-core/", "val-aux/")) for key in read_metrics(out)[1])
