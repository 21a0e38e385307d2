"""The entry point as a user meets it: the console script from any directory, and bad input
a new user tries (one line, no traceback). The first run from an empty directory (the demo
built, three steps, checkpoint retention) is test_grpo_e2e.py's shared run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.trainer.helpers import child_env, run_entry_point, write_assets

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


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
