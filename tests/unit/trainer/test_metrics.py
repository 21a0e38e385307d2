"""Metric reduction over ranks and every sink behind the one interface."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hybrid.trainer.metrics import JsonlSink, Sinks, make_sinks, reduce_over_ranks

pytestmark = pytest.mark.unit


def test_memory_is_the_max_over_ranks_everything_else_the_mean() -> None:
    reduced = reduce_over_ranks(
        [{"actor/pg_loss": 1.0, "memory/x_gib": 2.0}, {"actor/pg_loss": 3.0, "memory/x_gib": 5.0}]
    )
    assert reduced == {"actor/pg_loss": 2.0, "memory/x_gib": 5.0}


def test_jsonl_appends_one_object_per_step(tmp_path: Path) -> None:
    for steps in ([1, 2], [3]):  # a resumed run continues the same file
        sink = JsonlSink(tmp_path / "metrics.jsonl")
        for step in steps:
            sink.log(step, {"reward/mean": step / 10})
        sink.close()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows == [{"step": s, "reward/mean": s / 10} for s in (1, 2, 3)]


def test_every_sink_through_one_interface(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    sinks = make_sinks(["console", "jsonl", "tensorboard", "wandb"], tmp_path, 2, {"lr": 1.0})
    assert isinstance(sinks, Sinks)
    sinks.log(1, {"reward/mean": 0.5, "timing_s/step": 0.1})
    sinks.close()
    assert "reward 0.5" in capsys.readouterr().out
    assert (tmp_path / "metrics.jsonl").exists()
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert list((tmp_path / "wandb").glob("offline-run-*"))
