"""DAPO's overlong shaping against values worked out by hand from the paper's formula:
with L_max = 10 and L_cache = 4 the ramp starts after 6 tokens and loses 1/4 per token, so
7 -> -0.25, 8 -> -0.5, 10 -> -1, and anything past the budget -1. Per-row budgets (a row's
extra_info.max_response_tokens), agent trajectories (tool tokens count towards the budget) and
the config's errors, each naming the field."""

from __future__ import annotations

import math

import pytest
import torch

from hybrid.data.sample import Sample, SampleStatus, samples_to_batch
from hybrid.rewards.config import OverlongBufferConfig
from hybrid.rewards.overlong import (
    length_ramp,
    overlong_penalty,
    response_lengths,
    shape_overlong,
)
from hybrid.rollout.base import response_budgets
from tests.unit.trainer.test_config_reachable import compose_config, to_typed

pytestmark = pytest.mark.unit


def ramp(lengths: list[int], budget: int | list[int], buffer_len: int) -> list[float]:
    budgets = [budget] * len(lengths) if isinstance(budget, int) else budget
    return length_ramp(torch.tensor(lengths), torch.tensor(budgets), buffer_len).tolist()


def test_the_boundaries_of_the_buffer() -> None:
    # |y| = L_max - L_cache (6): no penalty; +1: 1/4; = L_max: -1; > L_max: -1, not beyond.
    assert ramp([0, 5, 6, 7, 8, 9, 10, 11, 40], 10, 4) == [
        0.0, 0.0, 0.0, -0.25, -0.5, -0.75, -1.0, -1.0, -1.0,
    ]  # fmt: skip


def test_a_buffer_of_one_token_penalises_only_rows_at_their_budget() -> None:
    assert ramp([0, 8, 9, 10, 11], 10, 1) == [0.0, 0.0, 0.0, -1.0, -1.0]


def test_the_factor_scales_the_penalty_and_the_metrics_count_rows_in_the_buffer() -> None:
    lengths, budgets = torch.tensor([3, 7, 8, 10]), torch.tensor([10] * 4)
    penalties, metrics = overlong_penalty(lengths, budgets, 4, 0.5)
    assert penalties.tolist() == [0.0, -0.125, -0.25, -0.5]
    assert metrics["reward/overlong_penalty_mean"] == pytest.approx(-0.875 / 4)
    assert metrics["reward/overlong_fraction"] == 0.75


def test_a_factor_of_zero_changes_no_reward_but_still_counts_the_rows() -> None:
    penalties, metrics = overlong_penalty(torch.tensor([2, 9, 10]), torch.tensor([10] * 3), 4, 0.0)
    assert penalties.abs().sum().item() == 0.0
    assert metrics["reward/overlong_penalty_mean"] == 0.0
    assert metrics["reward/overlong_fraction"] == pytest.approx(2 / 3)


def test_an_empty_batch_has_zero_metrics() -> None:
    empty = torch.zeros(0, dtype=torch.long)
    penalties, metrics = overlong_penalty(empty, empty, 4, 1.0)
    assert penalties.numel() == 0
    assert metrics == {"reward/overlong_penalty_mean": 0.0, "reward/overlong_fraction": 0.0}


def test_each_row_ramps_towards_its_own_budget() -> None:
    # Budgets 10, 5 and 3 with a buffer of 4: row 2 starts after 1 token; row 3's budget is
    # shorter than the buffer, so its whole budget is the buffer (ramp from 0 tokens, 1/3 each).
    assert ramp([7, 3, 1], [10, 5, 3], 4) == pytest.approx([-0.25, -0.5, -1 / 3])
    assert ramp([10, 5, 3, 0], [10, 5, 3, 3], 4) == [-1.0, -1.0, -1.0, 0.0]
    # The same length is free under a large budget and fully penalised under a small one.
    assert ramp([5, 5], [10, 5], 4) == [0.0, -1.0]


def sample(uid: str, response: int, loss_mask: list[int] | None = None, **meta: object) -> Sample:
    ids = list(range(3, 3 + response))
    return Sample(
        uid=uid,
        index=0,
        prompt_ids=[1, 2],
        response_ids=ids,
        rollout_log_probs=[0.0] * response,
        versions=[0] * response,
        status=SampleStatus.COMPLETED,
        metadata=dict(meta),
        loss_mask=loss_mask,
        token_rewards=None if loss_mask is None else [0.0] * response,
        agent_stats=None if loss_mask is None else {"turns": 2.0},
    )


def test_the_batch_budgets_come_from_each_rows_extra_info() -> None:
    """What TrainStep.score does: the budgets of hybrid.rollout.base, then the penalty."""
    rows = [
        sample("a", 8, extra_info={}),  # budget rollout.response_length = 8: at its budget
        sample("b", 4, extra_info={"max_response_tokens": 4}),  # at its own budget
        sample("c", 4, extra_info={"max_response_tokens": 6}),  # 4 of 6, buffer from 4
        sample("d", 4, extra_info={"max_response_tokens": 99}),  # capped at 8: free
    ]
    batch = samples_to_batch(rows, response_length=8, pad_token_id=0)
    infos = list(batch.non_tensors["extra_info"])
    budgets = response_budgets(infos, list(batch["uid"]), 8)
    assert budgets == [8, 4, 6, 8]
    config = OverlongBufferConfig(enable=True, len=2, penalty_factor=1.0)
    penalties, metrics = shape_overlong(batch, budgets, config)
    assert penalties.tolist() == [-1.0, -1.0, 0.0, 0.0]
    assert metrics["reward/overlong_fraction"] == 0.5


def test_an_agent_rows_length_counts_the_tool_tokens() -> None:
    # 8 response tokens, of which the model sampled 4 (a tool reply in the middle): the budget
    # of 8 is full, so the row takes the whole penalty though its loss mask holds only 4 tokens.
    agent = sample("t", 8, loss_mask=[1, 1, 0, 0, 0, 0, 1, 1])
    short = sample("u", 5, loss_mask=[1, 0, 0, 1, 1])
    batch = samples_to_batch([agent, short], response_length=8, pad_token_id=0)
    assert batch.tensors["response_mask"].sum(-1).tolist() == [4, 3]
    assert response_lengths(batch).tolist() == [8, 5]
    penalties, _ = shape_overlong(batch, [8, 8], OverlongBufferConfig(enable=True, len=4))
    assert penalties.tolist() == [-1.0, -0.25]


def test_budgets_must_match_the_batch() -> None:
    batch = samples_to_batch([sample("a", 2)], response_length=4, pad_token_id=0)
    with pytest.raises(ValueError, match="3 budgets for a batch of 1 rows"):
        shape_overlong(batch, [4, 4, 4], OverlongBufferConfig())
    with pytest.raises(ValueError, match="budget must be >= 1"):
        length_ramp(torch.tensor([1]), torch.tensor([0]), 1)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"len": 0}, r"reward\.overlong_buffer\.len must be an integer >= 1 \(tokens\), got 0"),
        ({"len": -3}, r"reward\.overlong_buffer\.len must be an integer >= 1"),
        ({"len": True}, r"reward\.overlong_buffer\.len must be an integer >= 1"),
        ({"penalty_factor": -0.1}, r"reward\.overlong_buffer\.penalty_factor must be .*>= 0"),
        ({"penalty_factor": math.nan}, r"reward\.overlong_buffer\.penalty_factor must be"),
        ({"penalty_factor": math.inf}, r"reward\.overlong_buffer\.penalty_factor must be"),
    ],
)
def test_bad_settings_are_refused_naming_the_field(fields: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        OverlongBufferConfig(**fields)


def test_the_buffer_must_be_shorter_than_the_response_length() -> None:
    on = "reward.overlong_buffer.enable=true"
    with pytest.raises(
        ValueError,
        match=r"reward\.overlong_buffer\.len \(4\) must be < rollout\.response_length \(4\)",
    ):
        to_typed(compose_config(overrides=(on, "reward.overlong_buffer.len=4")))
    built = to_typed(compose_config(overrides=(on, "reward.overlong_buffer.len=3")))
    assert built.reward.overlong_buffer == OverlongBufferConfig(enable=True, len=3)
    # Off, the buffer's length is not held against the budget.
    off = to_typed(compose_config(overrides=("reward.overlong_buffer.len=64",)))
    assert not off.reward.overlong_buffer.enable
