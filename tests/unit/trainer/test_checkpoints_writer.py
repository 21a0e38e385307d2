"""The save both the driver and the SFT stage make (`CheckpointWriter`): the order of its
writes, a stale manifest gone before anything is replaced, retention after the manifest, and
the memory log's rule."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, cast

import pytest

from hybrid.controller import WorkerGroupView
from hybrid.memory.records import MemoryRecord, read_records
from hybrid.trainer.checkpoints import (
    MANIFEST_FILE,
    MISSING_MANIFEST,
    CheckpointWriter,
    checkpoint_dir,
    critic_checkpoint_dir,
    manifest_problem,
    write_manifest,
)
from hybrid.workers.lora import LORA_ADAPTER_DIR

pytestmark = pytest.mark.unit


class FakeGroup:
    """A worker-group view that writes a small checkpoint and records what it was asked (and
    whether a manifest of that step was on disk then)."""

    def __init__(self, name: str, calls: list[str], fail: bool = False) -> None:
        self.name, self.calls, self.fail = name, calls, fail
        self.popped: list[int] = []

    def save_checkpoint(self, path: str, extra: dict[str, Any] | None = None) -> None:
        root = Path(path)
        step_dir = root.parents[2] / root.name if root.parent.name == "critic" else root
        manifest = (step_dir / MANIFEST_FILE).exists()
        self.calls.append(f"{self.name}.save manifest={manifest}")
        if self.fail:
            raise RuntimeError(f"{self.name} died mid-save")
        root.mkdir(parents=True, exist_ok=True)
        (root / "__0_0.distcp").write_bytes(b"x" * 30)
        if extra is not None:
            (root / "extra.json").write_text(json.dumps(extra))

    def export_adapter(self, path: str) -> str:
        self.calls.append(f"{self.name}.export_adapter")
        Path(path).mkdir(parents=True)
        (Path(path) / "adapter_model.safetensors").write_bytes(b"w" * 8)
        return path

    def pop_memory_records(self, step: int) -> list[list[MemoryRecord]]:
        self.popped.append(step)
        return [[record(step, rank)] for rank in range(2)]


def record(step: int, rank: int) -> MemoryRecord:
    return MemoryRecord(step, rank, "update/end", 1.0, "cpu", 0.5, 0.75, 1.0)


def view(group: FakeGroup) -> WorkerGroupView:
    return cast(WorkerGroupView, group)


def writer(root: Path, keep: int | None = None, freq: int = 1) -> CheckpointWriter:
    return CheckpointWriter(root, keep, freq, what="SFT checkpoint")


def test_critic_then_actor_then_adapter_then_the_manifest(tmp_path: Path) -> None:
    calls: list[str] = []
    actor, critic = FakeGroup("actor", calls), FakeGroup("critic", calls)
    path = writer(tmp_path).save(3, view(actor), {"step": 3}, critic=view(critic), adapter=True)
    assert path == checkpoint_dir(tmp_path, 3)
    assert calls == [
        "critic.save manifest=False",
        "actor.save manifest=False",
        "actor.export_adapter",
    ]
    manifest = json.loads((path / MANIFEST_FILE).read_text())
    assert sorted(manifest["files"]) == [
        "__0_0.distcp",
        "extra.json",
        f"{LORA_ADAPTER_DIR}/adapter_model.safetensors",
    ]
    assert sorted(manifest["critic_files"]) == ["__0_0.distcp"]
    assert json.loads((path / "extra.json").read_text()) == {"step": 3}
    assert manifest_problem(path, critic_checkpoint_dir(tmp_path, 3)) is None


def test_without_critic_or_adapter_only_the_actor_writes(tmp_path: Path) -> None:
    calls: list[str] = []
    path = writer(tmp_path).save(1, view(FakeGroup("actor", calls)), {"step": 1})
    assert calls == ["actor.save manifest=False"]
    assert json.loads((path / MANIFEST_FILE).read_text())["critic_files"] is None
    assert not (tmp_path / "checkpoints" / "critic").exists()


def test_an_earlier_runs_step_stops_being_whole_before_any_file_is_replaced(
    tmp_path: Path,
) -> None:
    calls: list[str] = []
    old = writer(tmp_path).save(2, view(FakeGroup("actor", calls)), {"step": 2})
    assert manifest_problem(old, None) is None
    dying = FakeGroup("critic", calls, fail=True)
    with pytest.raises(RuntimeError, match="critic died mid-save"):
        writer(tmp_path).save(2, view(FakeGroup("actor", calls)), {}, critic=view(dying))
    assert calls[-1] == "critic.save manifest=False"
    assert manifest_problem(old, None) == MISSING_MANIFEST


def test_retention_runs_once_the_new_checkpoint_is_whole(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[str] = []
    actor, critic = view(FakeGroup("actor", calls)), view(FakeGroup("critic", calls))
    damaged = checkpoint_dir(tmp_path, 4)
    damaged.mkdir(parents=True)  # a save that did not finish: neither counted nor deleted
    with caplog.at_level(logging.INFO, logger="hybrid.trainer.checkpoints"):
        for step in (1, 2, 3):
            writer(tmp_path, keep=2).save(step, actor, {"step": step}, critic=critic)
    assert not checkpoint_dir(tmp_path, 1).exists()
    assert not critic_checkpoint_dir(tmp_path, 1).exists()
    assert checkpoint_dir(tmp_path, 2).is_dir() and checkpoint_dir(tmp_path, 3).is_dir()
    assert damaged.is_dir()
    deleted = [r.getMessage() for r in caplog.records if r.getMessage().startswith("deleted")]
    assert deleted == [
        f"deleted SFT checkpoint {checkpoint_dir(tmp_path, 1)} (trainer.max_checkpoints_to_keep=2)"
    ]


def test_keep_none_deletes_nothing(tmp_path: Path) -> None:
    actor = view(FakeGroup("actor", []))
    for step in (1, 2, 3):
        writer(tmp_path, keep=None).save(step, actor, {})
    assert [p.name for p in sorted((tmp_path / "checkpoints").iterdir())] == [
        "step_1",
        "step_2",
        "step_3",
    ]


@pytest.mark.parametrize(("freq", "logged"), [(1, [0, 1, 2, 3, 4]), (2, [0, 2, 4]), (0, [0])])
def test_the_memory_log_drains_every_step_and_writes_when_due(
    tmp_path: Path, freq: int, logged: list[int]
) -> None:
    actor = FakeGroup("actor", [])
    for step in range(5):
        writer(tmp_path, freq=freq).log_memory(view(actor), step)
    assert actor.popped == [0, 1, 2, 3, 4]
    records = list(read_records(tmp_path / "memory.jsonl"))
    assert [(r.step, r.rank) for r in records] == [(s, rank) for s in logged for rank in (0, 1)]


def test_a_stale_manifest_of_another_step_is_left_alone(tmp_path: Path) -> None:
    other = checkpoint_dir(tmp_path, 5)
    other.mkdir(parents=True)
    (other / "__0_0.distcp").write_bytes(b"y")
    write_manifest(other, 5, None)
    writer(tmp_path).save(6, view(FakeGroup("actor", [])), {})
    assert manifest_problem(other, None) is None
