"""What makes a checkpoint whole (its manifest), each kind of damage named, which checkpoint a
resume picks, and metrics.jsonl cut back to the resumed step with nothing lost."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from hybrid.trainer.checkpoints import (
    MANIFEST_FILE,
    MISSING_MANIFEST,
    checkpoint_dir,
    critic_checkpoint_dir,
    manifest_problem,
    resumable_checkpoint,
    write_manifest,
)
from hybrid.trainer.metrics import JsonlSink, drop_rows_after, split_rows_after

pytestmark = pytest.mark.unit

# A checkpoint as two ranks write it: DCP's shards and metadata, RNG states, the driver's
# extra, a LoRA adapter in a subdirectory.
FILES = {
    ".metadata": b"m" * 10,
    "__0_0.distcp": b"a" * 300,
    "__1_0.distcp": b"b" * 200,
    "rng_rank0.pt": b"r" * 40,
    "rng_rank1.pt": b"s" * 40,
    "extra.pt": b"e" * 5,
    "lora_adapter/adapter_model.safetensors": b"w" * 64,
}


def saved(root: Path, step: int, critic: bool = False) -> Path:
    """A step_<step> checkpoint under root as Driver.save leaves it: files, then the manifest."""
    directory = checkpoint_dir(root, step)
    for name, data in FILES.items():
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        (directory / name).write_bytes(data)
    critic_dir = critic_checkpoint_dir(root, step) if critic else None
    if critic_dir is not None:
        critic_dir.mkdir(parents=True)
        (critic_dir / "__0_0.distcp").write_bytes(b"c" * 100)
    write_manifest(directory, step, critic_dir)
    return directory


def test_the_manifest_lists_every_file_with_its_size(tmp_path: Path) -> None:
    directory = saved(tmp_path, 3, critic=True)
    manifest = json.loads((directory / MANIFEST_FILE).read_text())
    assert manifest["step"] == 3 and manifest["format"] == 1
    assert manifest["files"] == {name: len(data) for name, data in FILES.items()}
    assert manifest["critic_files"] == {"__0_0.distcp": 100}
    assert manifest_problem(directory, critic_checkpoint_dir(tmp_path, 3)) is None
    assert manifest_problem(directory, None) is None
    assert sorted(p.name for p in directory.iterdir() if p.name.startswith(MANIFEST_FILE)) == [
        MANIFEST_FILE  # the temporary file was renamed, not left behind
    ]


def test_a_rewritten_manifest_replaces_the_old_one(tmp_path: Path) -> None:
    directory = saved(tmp_path, 1)
    (directory / "extra.pt").write_bytes(b"longer extra")
    assert manifest_problem(directory, None) == "file extra.pt is 12 bytes, the manifest says 5"
    write_manifest(directory, 1, None)
    assert manifest_problem(directory, None) is None


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda d: (d / MANIFEST_FILE).unlink(), MISSING_MANIFEST),
        (lambda d: (d / "__1_0.distcp").unlink(), "file __1_0.distcp missing"),
        (
            lambda d: (d / "rng_rank1.pt").write_bytes(b"x" * 12),
            "file rng_rank1.pt is 12 bytes, the manifest says 40",
        ),
        (
            lambda d: (d / "lora_adapter" / "adapter_model.safetensors").unlink(),
            "file lora_adapter/adapter_model.safetensors missing",
        ),
        (
            lambda d: (d / MANIFEST_FILE).write_text('{"files": {"__0_0'),
            "manifest.json is not valid JSON",
        ),
        (
            lambda d: (d / MANIFEST_FILE).write_text("[]"),
            "manifest.json is not a checkpoint manifest (no 'files' map)",
        ),
        (
            lambda d: (d / MANIFEST_FILE).write_text('{"format": 99, "step": 2, "files": {}}'),
            "manifest.json has format 99; this version reads format 1",
        ),
        (
            lambda d: (d / MANIFEST_FILE).write_text('{"format": 1, "step": 7, "files": {}}'),
            "manifest.json is for step 7, not 2",
        ),
    ],
    ids=[
        "no-manifest",
        "missing-shard",
        "truncated-rng",
        "missing-adapter",
        "torn-json",
        "not-a-manifest",
        "unknown-format",
        "other-step",
    ],
)
def test_each_kind_of_damage_is_named(
    tmp_path: Path, damage: Callable[[Path], object], reason: str
) -> None:
    directory = saved(tmp_path, 2)
    damage(directory)
    assert manifest_problem(directory, None) == reason


def test_the_critics_files_are_checked_only_for_a_run_that_loads_them(tmp_path: Path) -> None:
    directory = saved(tmp_path, 2, critic=True)
    critic = critic_checkpoint_dir(tmp_path, 2)
    (critic / "__0_0.distcp").unlink()
    assert manifest_problem(directory, critic) == "critic file __0_0.distcp missing"
    assert manifest_problem(directory, None) is None
    # Saved without a critic: whole here; the resume names the config mismatch itself.
    plain = saved(tmp_path / "plain", 2)
    assert manifest_problem(plain, critic_checkpoint_dir(tmp_path / "plain", 2)) is None


def test_resume_picks_the_newest_whole_checkpoint_and_names_the_newer_damaged(
    tmp_path: Path,
) -> None:
    for step in (1, 2, 3, 4):
        saved(tmp_path, step)
    (checkpoint_dir(tmp_path, 4) / "__0_0.distcp").unlink()
    (checkpoint_dir(tmp_path, 3) / MANIFEST_FILE).unlink()  # killed before its manifest
    (checkpoint_dir(tmp_path, 1) / "extra.pt").unlink()  # older than the pick: not reported
    (tmp_path / "checkpoints" / "step_5.tmp").mkdir()  # a save killed before its rename
    choice = resumable_checkpoint(tmp_path, needs_critic=False)
    assert choice.found == (2, checkpoint_dir(tmp_path, 2))
    assert choice.skipped == ((4, "file __0_0.distcp missing"), (3, MISSING_MANIFEST))


def test_resume_with_only_damaged_checkpoints_finds_none_and_names_them(tmp_path: Path) -> None:
    assert resumable_checkpoint(tmp_path, needs_critic=False).found is None
    saved(tmp_path, 1, critic=True)
    (critic_checkpoint_dir(tmp_path, 1) / "__0_0.distcp").write_bytes(b"")
    choice = resumable_checkpoint(tmp_path, needs_critic=True)
    assert choice.found is None
    assert choice.skipped == ((1, "critic file __0_0.distcp is 0 bytes, the manifest says 100"),)
    # A run without a critic does not load it: the same checkpoint is whole for it.
    assert resumable_checkpoint(tmp_path, needs_critic=False).found == (
        1,
        checkpoint_dir(tmp_path, 1),
    )


def rows(*steps: int) -> list[str]:
    return [json.dumps({"step": s, "reward/mean": s / 10}) + "\n" for s in steps]


def test_split_rows_keeps_steps_up_to_the_checkpoint_and_drops_a_torn_last_line() -> None:
    lines = [*rows(0, 1, 2, 3), '{"step": 4, "reward/me']  # a kill in the middle of a write
    kept, dropped = split_rows_after(lines, 2)
    assert kept == rows(0, 1, 2)
    assert dropped == [*rows(3), '{"step": 4, "reward/me\n']
    assert split_rows_after(rows(1, 2), 2) == (rows(1, 2), [])
    assert split_rows_after(["\n", '"text"\n', *rows(1)], 5) == (rows(1), ['"text"\n'])


def test_a_resume_cuts_metrics_back_and_keeps_the_dropped_rows_aside(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    assert drop_rows_after(path, 1) == (0, None)  # no file: nothing to do
    path.write_text("".join(rows(1, 2, 3)))
    dropped, aside = drop_rows_after(path, 1)
    assert dropped == 2 and aside == tmp_path / "metrics.jsonl.before_resume_1"
    assert path.read_text() == "".join(rows(1))
    assert aside.read_text() == "".join(rows(2, 3))
    # The resumed run appends; a second crash and resume at the same step adds to the copy.
    sink = JsonlSink(path)
    sink.log(2, {"reward/mean": 0.5})
    sink.close()
    assert drop_rows_after(path, 1) == (1, aside)
    assert path.read_text() == "".join(rows(1))
    assert [json.loads(line)["step"] for line in aside.read_text().splitlines()] == [2, 3, 2]
    assert drop_rows_after(path, 1) == (0, None)  # nothing after step 1 left: file untouched
    assert not (tmp_path / "metrics.jsonl.tmp").exists()
