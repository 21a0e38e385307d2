"""DAPO's overlong shaping through a real colocated run: 2 steps on the tiny model, in-process
(`Driver(config).fit()` on the session's Ray cluster, real Ray and FSDP2 trainers), generation
by the deterministic toy engine (rollout.engine=toy) with rollout.ignore_eos=true, so every
response runs to its budget and every row must take the whole penalty, -penalty_factor.

Half the prompts lower their budget with extra_info.max_response_tokens: if the shaping
measured them against rollout.response_length instead, they would sit before the buffer and go
unpenalised (reward/overlong_fraction 0.5).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hybrid.data import write_rows
from hybrid.trainer.loop import Driver
from tests.integration.trainer.helpers import ONE_WORKER, read_metrics, small_config, write_assets

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

STEPS = 2
FACTOR = 0.5
SHORT_BUDGET = 2
"""extra_info.max_response_tokens of every other prompt (rollout.response_length is 4)."""


def test_every_row_at_its_budget_takes_the_whole_penalty(ray_cluster: None, tmp_path: Path) -> None:
    assets = write_assets(tmp_path / "assets")
    rows = [json.loads(line) for line in (assets / "train.jsonl").read_text().splitlines()]
    for number, row in enumerate(rows):
        if number % 2:
            row["extra_info"]["max_response_tokens"] = SHORT_BUDGET
    write_rows(rows, assets / "train.jsonl")
    out = tmp_path / "run"
    config = small_config(
        assets, out, "rollout.engine=toy", *ONE_WORKER, f"trainer.total_steps={STEPS}",
        "rollout.ignore_eos=true", "reward.overlong_buffer.enable=true",
        "reward.overlong_buffer.len=2", f"reward.overlong_buffer.penalty_factor={FACTOR}",
    )  # fmt: skip
    assert config.rollout.response_length == 4
    Driver(config).fit()

    metrics = read_metrics(out)
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    for row in metrics:
        assert row["reward/overlong_fraction"] == 1.0, row["step"]
        assert row["reward/overlong_penalty_mean"] == pytest.approx(-FACTOR), row["step"]
        # reward/mean is the reward function's score, unshaped: never below the arithmetic
        # reward's 0, while the score the advantages use is lower by the penalty.
        assert row["reward/mean"] >= 0.0, row["step"]
    # The batches held prompts of both budgets (the short ones are what the check is about).
    assert any(row["response_length/mean"] < config.rollout.response_length for row in metrics)
