"""Unit tests for `hybrid.sharding.config.SyncConfig` validation (errors name the field) and its
split into the weight path and the schedule."""

import dataclasses

import pytest

from hybrid.sharding.config import ScheduleConfig, SyncConfig, WeightPathConfig

pytestmark = pytest.mark.unit


def test_defaults_are_valid() -> None:
    config = SyncConfig()
    assert (config.gather, config.bucket_mb, config.strategy) == ("layer", 64, "auto")


@pytest.mark.parametrize("gather", ["tensor", "layer", "bucket"])
@pytest.mark.parametrize("strategy", ["auto", "reload", "direct"])
def test_every_allowed_choice_is_accepted(gather: str, strategy: str) -> None:
    SyncConfig(gather=gather, strategy=strategy)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"gather": "row"},
            r"sync\.gather must be one of \['full', 'tensor', 'layer', 'bucket'\], got 'row'",
        ),
        (
            {"strategy": "copy"},
            r"sync\.strategy must be one of \['auto', 'reload', 'direct'\], got 'copy'",
        ),
        ({"bucket_mb": 0}, r"sync\.bucket_mb must be > 0, got 0"),
        ({"bucket_mb": -4}, r"sync\.bucket_mb must be > 0, got -4"),
    ],
)
def test_invalid_values_name_the_field(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SyncConfig(**kwargs)


def test_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        SyncConfig().bucket_mb = 1  # type: ignore[misc]


def test_sync_config_is_its_two_parts_and_each_checks_its_own_fields() -> None:
    path = {f.name for f in dataclasses.fields(WeightPathConfig)}
    schedule = {f.name for f in dataclasses.fields(ScheduleConfig)}
    assert not path & schedule, "a field belongs to one part"
    assert {f.name for f in dataclasses.fields(SyncConfig)} == path | schedule
    assert "gather" in path and "method" in schedule and "verify_checksum" in path
    assert isinstance(SyncConfig(), WeightPathConfig) and isinstance(SyncConfig(), ScheduleConfig)
    with pytest.raises(ValueError, match=r"sync\.gather"):
        WeightPathConfig(gather="half")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"sync\.style"):
        ScheduleConfig(style="sometimes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"sync\.offset must be >= 0"):
        SyncConfig(offset=-1)
