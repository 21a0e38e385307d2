"""The SFT stage's config rules, its resume rules read from an output directory, and the SFT
demo's inputs built on first use."""

from __future__ import annotations

from pathlib import Path

import pytest

from hybrid.data.arithmetic_task import write_arithmetic_sft
from hybrid.data.sft import SftDataset
from hybrid.main import build_config
from hybrid.models import load_tokenizer
from hybrid.trainer.checkpoints import checkpoint_dir, write_manifest
from hybrid.trainer.compose import compose, to_run_config
from hybrid.trainer.config import TrainerRunConfig
from hybrid.trainer.demo_assets import DEMO_SFT_FILE, missing_demo_assets
from hybrid.trainer.sft_stage import sft_dir, sft_start

pytestmark = pytest.mark.unit

SFT_ON = ("sft.train_files=[sft.jsonl]",)


def typed(*overrides: str) -> TrainerRunConfig:
    return to_run_config(compose("config", list(overrides)))


# --- config ----------------------------------------------------------------------------------


def test_sft_is_off_by_default_and_on_with_files() -> None:
    assert not typed().sft.enabled
    assert typed(*SFT_ON).sft.enabled


def test_an_sft_only_run_needs_sft() -> None:
    assert typed("trainer.total_steps=0", *SFT_ON).trainer.total_steps == 0
    with pytest.raises(ValueError, match=r"trainer\.total_steps=0 .* needs sft\.train_files"):
        typed("trainer.total_steps=0")
    with pytest.raises(ValueError, match=r"trainer\.total_steps must be >= 0"):
        typed("trainer.total_steps=-1", *SFT_ON)


def test_a_step_splits_evenly_over_the_training_workers() -> None:
    with pytest.raises(
        ValueError, match=r"sft\.batch_size \(5\) must be divisible by trainer\.num_workers \(2\)"
    ):
        typed("sft.batch_size=5", *SFT_ON)
    split = ("trainer.mode=split", "trainer.num_trainer_workers=1", "sft.batch_size=5", *SFT_ON)
    assert typed(*split).sft.batch_size == 5
    typed("sft.batch_size=5")  # SFT off: nothing to split


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("sft.truncation=left", r"sft\.truncation must be one of \['error', 'right'\]"),
        ("sft.save_freq=-1", r"sft\.save_freq must be >= 0"),
        ("sft.lr=0", r"sft\.lr must be > 0"),
        ("sft.total_steps=0", r"sft\.total_steps must be > 0"),
        ("sft.max_length=0", r"sft\.max_length must be > 0"),
    ],
)
def test_bad_values_name_their_field(override: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        typed(override)


def test_missing_sft_files_are_named_before_any_worker(tmp_path: Path) -> None:
    missing, prompts = tmp_path / "nope.parquet", tmp_path / "prompts.jsonl"
    prompts.write_text("")  # the RL prompts exist (a fresh checkout has no demo data)
    overrides = [
        f"sft.train_files=[{missing}]",
        f"data.train_files=[{prompts}]",
        "data.val_files=[]",
    ]
    config = to_run_config(compose("config", overrides))
    with pytest.raises(ValueError, match=rf"sft\.train_files: {missing} does not exist"):
        config.check_paths()


# --- resume rules ----------------------------------------------------------------------------


def saved(root: Path, step: int) -> Path:
    """A whole step_<step> checkpoint under root (files, then the manifest)."""
    directory = checkpoint_dir(root, step)
    directory.mkdir(parents=True)
    (directory / "__0_0.distcp").write_bytes(b"x" * 10)
    write_manifest(directory, step, None)
    return directory


def test_a_fresh_directory_starts_sft_at_step_0(tmp_path: Path) -> None:
    assert sft_start(tmp_path, 10, "auto", needs_critic=False).action == "fresh"


def test_a_partial_sft_checkpoint_continues_the_stage(tmp_path: Path) -> None:
    saved(sft_dir(tmp_path), 4)
    newest = saved(sft_dir(tmp_path), 8)
    damaged = saved(sft_dir(tmp_path), 9)
    (damaged / "__0_0.distcp").write_bytes(b"")
    start = sft_start(tmp_path, 10, "auto", needs_critic=False)
    assert (start.action, start.step, start.checkpoint) == ("continue", 8, newest)
    assert [step for step, _ in start.skipped] == [9]


def test_the_last_sft_step_means_the_stage_is_done(tmp_path: Path) -> None:
    final = saved(sft_dir(tmp_path), 10)
    start = sft_start(tmp_path, 10, "auto", needs_critic=False)
    assert (start.action, start.checkpoint) == ("done", final)
    # Fewer SFT steps asked for than were run: done too.
    assert sft_start(tmp_path, 5, "auto", needs_critic=False).action == "done"


def test_an_rl_checkpoint_means_sft_is_over(tmp_path: Path) -> None:
    saved(sft_dir(tmp_path), 3)  # even a partial SFT stage: RL began after it
    saved(tmp_path, 1)
    assert sft_start(tmp_path, 10, "auto", needs_critic=False).action == "skip"
    # An RL checkpoint that is not whole does not count (the RL resume would not load it).
    (checkpoint_dir(tmp_path, 1) / "manifest.json").unlink()
    assert sft_start(tmp_path, 10, "auto", needs_critic=False).action == "continue"


def test_resume_disable_always_starts_over(tmp_path: Path) -> None:
    saved(sft_dir(tmp_path), 10)
    saved(tmp_path, 1)
    assert sft_start(tmp_path, 10, "disable", needs_critic=False).action == "fresh"


# --- the demo --------------------------------------------------------------------------------


def test_the_sft_demo_builds_its_rows_on_first_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    config = build_config(compose("sft_grpo_demo", []))
    assert config.sft.train_files == [DEMO_SFT_FILE]
    assert missing_demo_assets(config) == []
    expected = write_arithmetic_sft(tmp_path / "script", seed=0)
    assert Path(DEMO_SFT_FILE).read_bytes() == expected.read_bytes()
    # Every row fits the demo's sft.max_length, the target one digit and EOS.
    data = SftDataset(
        config.sft.train_files, load_tokenizer(config.model.path), config.sft.max_length
    )
    assert {len(row.response_ids) for row in data.rows} == {2}
    assert sorted(p.name for p in Path(DEMO_SFT_FILE).parent.iterdir()) == [
        "sft.parquet",
        "test.parquet",
        "train.parquet",
    ]
