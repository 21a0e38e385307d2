"""The first command of the README on a fresh checkout: `python -m hybrid.main` from a working
directory where nothing exists builds the demo model and data, trains, writes its metrics; and
checkpoint retention keeps only the newest `trainer.max_checkpoints_to_keep`.

One subprocess (the real entry point, its own Ray and vLLM), small sizes, three steps with a
checkpoint after each and a limit of two."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hybrid.trainer.checkpoints import complete_checkpoints
from hybrid.trainer.demo_assets import DEMO_MODEL_PATH, DEMO_TRAIN_FILE, DEMO_VAL_FILE
from tests.conftest import REPO_ROOT
from tests.integration.trainer.helpers import child_env, read_metrics, write_assets

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

SMALL = (
    "trainer.total_steps=3",
    "trainer.save_freq=1",
    "trainer.max_checkpoints_to_keep=2",
    "trainer.output_dir=run",
    "trainer.val_before_train=false",
    "trainer.loggers=[jsonl]",
    "trainer.export_hf=false",
    "data.train_batch_size=4",
    "algorithm.ppo_mini_batch_size=4",
    "rollout.n=4",
    "actor.micro_batch_size=4",
)


def run_entry_point(
    cwd: Path, *overrides: str, timeout: float = 180
) -> subprocess.CompletedProcess:
    """`python -m hybrid.main overrides...` in `cwd`, as a user runs it from a checkout."""
    env = child_env()
    env["PYTHONPATH"] = str(REPO_ROOT)
    return subprocess.run(
        [sys.executable, "-m", "hybrid.main", *overrides],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_the_entry_point_builds_the_demo_and_trains_from_nothing(tmp_path: Path) -> None:
    done = run_entry_point(tmp_path, *SMALL, timeout=540)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    built = [line for line in done.stdout.splitlines() if "built the demo inputs" in line]
    assert len(built) == 1, done.stdout
    for path in (DEMO_MODEL_PATH, DEMO_TRAIN_FILE, DEMO_VAL_FILE):
        assert path in built[0]
        assert (tmp_path / path).exists(), path
    assert (tmp_path / DEMO_MODEL_PATH / "config.json").is_file()
    assert "3 steps in" in done.stdout  # the entry point's summary line

    run = tmp_path / "run"
    assert [m["step"] for m in read_metrics(run)] == [1, 2, 3]
    assert json.loads((run / "config.json").read_text())["trainer"]["max_checkpoints_to_keep"] == 2
    # Saved at steps 1, 2, 3 with a limit of 2: step_1 went once step_3 was complete.
    assert [step for step, _ in complete_checkpoints(run)] == [2, 3]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_2", "step_3"]


def test_the_console_script_finds_its_configs_from_any_directory(tmp_path: Path) -> None:
    script = Path(sys.executable).parent / "hybrid-train"
    if not script.is_file():
        pytest.skip("the console script is not installed in this environment (pip install -e .)")
    done = subprocess.run(
        [str(script), "--cfg", "job", "trainer.max_checkpoints_to_keep=2"],
        cwd=tmp_path,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "max_checkpoints_to_keep: 2" in done.stdout
    assert not (tmp_path / "outputs").exists()  # --cfg prints the config and runs nothing


@pytest.mark.full  # the default tier's budget: each message is a unit test of its check
def test_bad_input_a_new_user_tries_is_one_line_without_a_traceback(tmp_path: Path) -> None:
    """An empty model directory and a CSV file named .parquet: exit code 2 and one line on
    stderr naming the field or the file; the traceback goes to the run's logs."""
    empty_model = tmp_path / "empty_model"
    empty_model.mkdir()
    model = write_assets(tmp_path / "assets") / "model"
    fake = tmp_path / "train.parquet"
    fake.write_text("question,answer\n1+1,2\n")
    cases = [
        ((f"model.path={empty_model}",), "hybrid: model.path: ", "has no config.json", False),
        (
            (f"model.path={model}", f"data.train_files=[{fake}]", "data.val_files=[]"),
            f"hybrid: {fake} is named .parquet but is not a parquet file",
            "its first line is 'question,answer'",
            True,
        ),
    ]
    for overrides, start, detail, logged in cases:
        done = run_entry_point(tmp_path, *overrides, "trainer.output_dir=run")
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2, done.stderr[-3000:]
        assert lines and lines[-1].startswith(start) and detail in lines[-1], done.stderr[-3000:]
        assert "Traceback" not in done.stderr and "HYDRA_FULL_ERROR" not in done.stderr
        assert (tmp_path / "run" / "logs" / "error.txt").is_file() == logged
