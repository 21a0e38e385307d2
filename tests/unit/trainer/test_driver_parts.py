"""Pure parts of the driver: token balancing, checkpoint discovery, the strict config builder."""

from __future__ import annotations

import pytest
import torch

from hybrid.trainer.balance import balanced_order
from hybrid.trainer.config import TrainerRunConfig
from hybrid.trainer.schema import from_dict

pytestmark = pytest.mark.unit


def test_balanced_order_is_a_permutation_with_even_token_loads() -> None:
    lengths = torch.tensor([100, 90, 1, 1, 2, 2, 3, 1])  # naive halves: 192 vs 8
    order = balanced_order(lengths, 2)
    assert sorted(order.tolist()) == list(range(8))
    loads = [int(lengths[order[:4]].sum()), int(lengths[order[4:]].sum())]
    assert abs(loads[0] - loads[1]) <= 12  # 100 + small vs 90 + small
    naive = [int(lengths[:4].sum()), int(lengths[4:].sum())]
    assert abs(loads[0] - loads[1]) < abs(naive[0] - naive[1])
    with pytest.raises(ValueError, match="do not split into 3 equal partitions"):
        balanced_order(lengths, 3)


def _minimal(**overrides: object) -> dict:
    config: dict = {"model": {"path": "m"}, "rollout": {"n": 4}, "trainer": {"num_workers": 2}}
    for dotted, value in overrides.items():  # actor__optim__lr: config["actor"]["optim"]["lr"]
        *groups, key = dotted.split("__")
        section = config
        for group in groups:
            section = section.setdefault(group, {})
        section[key] = value
    return config


def test_from_dict_builds_frozen_typed_configs() -> None:
    config = from_dict(
        TrainerRunConfig, _minimal(actor__optim__betas=[0.9, 0.95], actor__optim__lr=1)
    )
    assert config.actor.optim.betas == (0.9, 0.95)
    assert config.actor.optim.lr == 1.0 and isinstance(config.actor.optim.lr, float)
    assert config.rows_per_step == config.data.train_batch_size * 4
    with pytest.raises(dataclasses_frozen_error()):
        config.actor.optim.lr = 2.0  # type: ignore[misc]


def dataclasses_frozen_error() -> type[Exception]:
    import dataclasses

    return dataclasses.FrozenInstanceError


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"actor__learnin_rate": 1.0}, r"unknown config keys \['actor\.learnin_rate'\]"),
        ({"actor__optim__lr": "fast"}, r"actor\.optim\.lr must be a float, got 'fast'"),
        (
            {"actor__optim__learnin_rate": 1.0},
            r"unknown config keys \['actor\.optim\.learnin_rate'\]",
        ),
        ({"sync__gather": "rows"}, r"sync\.gather must be one of"),
        (
            {"algorithm__ppo_mini_batch_size": 3},
            r"must be a multiple of algorithm\.ppo_mini_batch_size \(3\)",
        ),
        ({"actor__micro_batch_size": 5}, r"must be a multiple of actor\.micro_batch_size \(5\)"),
    ],
)
def test_bad_configs_name_the_field(overrides: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        from_dict(TrainerRunConfig, _minimal(**overrides))
