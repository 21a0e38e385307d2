"""Checkpoint retention (trainer.max_checkpoints_to_keep): which whole checkpoints go, on
every edge of the rule: keep all, keep 1, fewer than the limit, interrupted saves, damaged
checkpoints, the latest. (The manifest itself: test_checkpoints_manifest.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from hybrid.trainer.checkpoints import (
    checkpoint_dir,
    checkpoints_to_delete,
    complete_checkpoints,
    critic_checkpoint_dir,
    prune_checkpoints,
    resumable_checkpoint,
    write_manifest,
)

pytestmark = pytest.mark.unit


def make(root: Path, *names: str) -> None:
    """Whole checkpoints (or leftovers, by their names): one file and a manifest each."""
    for name in names:
        directory = root / "checkpoints" / name
        directory.mkdir(parents=True)
        (directory / "extra.pt").write_bytes(b"x")
        step = name.removeprefix("step_").split(".")[0]
        write_manifest(directory, int(step) if step.isdigit() else -1, None)


def steps(root: Path) -> list[int]:
    return [step for step, _ in complete_checkpoints(root)]


def ckpts(*step_numbers: int) -> list[tuple[int, Path]]:
    return [(s, Path(f"step_{s}")) for s in step_numbers]


def test_none_keeps_everything() -> None:
    assert checkpoints_to_delete(ckpts(1, 2, 3, 4), None, just_saved=4) == []


def test_keep_one_deletes_all_but_the_latest_oldest_first() -> None:
    assert checkpoints_to_delete(ckpts(3, 1, 2), 1, just_saved=3) == [
        Path("step_1"),
        Path("step_2"),
    ]


def test_fewer_or_as_many_as_the_limit_deletes_nothing() -> None:
    assert checkpoints_to_delete([], 2) == []
    assert checkpoints_to_delete(ckpts(5), 2, just_saved=5) == []
    assert checkpoints_to_delete(ckpts(5, 6), 2, just_saved=6) == []
    assert checkpoints_to_delete(ckpts(5, 6, 7), 2, just_saved=7) == [Path("step_5")]


def test_the_just_saved_checkpoint_survives_a_newer_leftover() -> None:
    # resume=disable over an old run's output_dir: step_10 is newer than what was just saved.
    # The latest (step_10, what a resume would load) and the new step_2 both stay.
    assert checkpoints_to_delete(ckpts(1, 2, 10), 1, just_saved=2) == [Path("step_1")]


def test_a_limit_below_one_is_an_error() -> None:
    with pytest.raises(ValueError, match="max_checkpoints_to_keep must be >= 1"):
        checkpoints_to_delete(ckpts(1), 0)


def test_interrupted_and_foreign_directories_are_neither_counted_nor_deleted(
    tmp_path: Path,
) -> None:
    assert complete_checkpoints(tmp_path) == []
    # A save killed before its rename leaves step_N.tmp; one killed mid-replace, step_N.old.
    make(tmp_path, "step_1", "step_2", "step_3", "step_4.tmp", "step_2.old", "notes")
    (tmp_path / "checkpoints" / "step_9").write_text("a file, not a checkpoint")
    assert steps(tmp_path) == [1, 2, 3]
    deleted = prune_checkpoints(tmp_path, 2, just_saved=3)
    assert deleted == [checkpoint_dir(tmp_path, 1)]
    assert steps(tmp_path) == [2, 3]
    left = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert left == ["notes", "step_2", "step_2.old", "step_3", "step_4.tmp", "step_9"]


def test_prune_with_no_limit_or_no_directory_touches_nothing(tmp_path: Path) -> None:
    assert prune_checkpoints(tmp_path, 1, just_saved=1) == []
    make(tmp_path, "step_1", "step_2")
    assert prune_checkpoints(tmp_path, None, just_saved=2) == []
    assert steps(tmp_path) == [1, 2]


def test_steps_sort_by_number_not_by_name(tmp_path: Path) -> None:
    make(tmp_path, "step_9", "step_10", "step_100")
    assert steps(tmp_path) == [9, 10, 100]
    assert prune_checkpoints(tmp_path, 2, just_saved=100) == [checkpoint_dir(tmp_path, 9)]


def test_a_damaged_newest_is_neither_counted_nor_deleted_and_the_whole_ones_stay(
    tmp_path: Path,
) -> None:
    make(tmp_path, "step_1", "step_2", "step_3")
    (checkpoint_dir(tmp_path, 3) / "extra.pt").unlink()  # step_3 damaged
    checkpoint_dir(tmp_path, 4).mkdir()  # step_4: killed before its manifest
    assert steps(tmp_path) == [1, 2]
    # keep=1 counts step_1 and step_2 only: step_2, what a resume loads, stays.
    assert resumable_checkpoint(tmp_path, needs_critic=False).found == (
        2,
        checkpoint_dir(tmp_path, 2),
    )
    assert prune_checkpoints(tmp_path, 1, just_saved=4) == [checkpoint_dir(tmp_path, 1)]
    left = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert left == ["step_2", "step_3", "step_4"]
    # The damaged ones never fill the quota: keep=2 with two damaged newer deletes nothing.
    assert prune_checkpoints(tmp_path, 2, just_saved=4) == []


def test_a_damaged_critic_counts_only_for_a_run_that_loads_it(tmp_path: Path) -> None:
    for step in (1, 2):
        critic = critic_checkpoint_dir(tmp_path, step)
        critic.mkdir(parents=True)
        (critic / "__0_0.distcp").write_bytes(b"critic")
        checkpoint_dir(tmp_path, step).mkdir(parents=True)
        (checkpoint_dir(tmp_path, step) / "extra.pt").write_bytes(b"x")
        write_manifest(checkpoint_dir(tmp_path, step), step, critic)
    (critic_checkpoint_dir(tmp_path, 2) / "__0_0.distcp").write_bytes(b"cut")
    assert [s for s, _ in complete_checkpoints(tmp_path, needs_critic=True)] == [1]
    assert [s for s, _ in complete_checkpoints(tmp_path, needs_critic=False)] == [1, 2]
    assert prune_checkpoints(tmp_path, 1, just_saved=2, needs_critic=True) == []
    assert prune_checkpoints(tmp_path, 1, just_saved=2) == [checkpoint_dir(tmp_path, 1)]
    assert not critic_checkpoint_dir(tmp_path, 1).exists()  # its critic state went with it
