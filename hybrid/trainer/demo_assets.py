"""The default run's inputs, built on first use: `python -m hybrid.main` on a fresh checkout.

configs/config.yaml (its `inputs: demo`, configs/inputs/demo.yaml) points model.path and the
data files at outputs/demo/, which examples/run_cpu_demo.sh (`make demo`) fills. When a run's
config names exactly those default paths (`is_demo_run`) and some are missing,
`build_missing_demo_assets` builds those as the script does:

    python -m hybrid.models --output-dir outputs/demo/model --preset tiny --vocab arithmetic --seed 0
    python examples/data/arithmetic.py --output-dir outputs/demo/data --seed 0

(same functions, same bytes). Relative paths are taken from the working directory, as the run
itself reads them. A run with any other model or data path is the user's: nothing is built,
and a missing path is reported by `TrainerRunConfig.check_paths`, naming its field. Each asset
is built under a temporary name and moved into place, so an interrupted build leaves nothing
that looks complete.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from hybrid.data.arithmetic_task import write_arithmetic_task
from hybrid.models import TinyModelConfig, build_tiny_model
from hybrid.trainer.config import TrainerRunConfig

DEMO_MODEL_PATH = "outputs/demo/model"
DEMO_DATA_DIR = "outputs/demo/data"
DEMO_TRAIN_FILE = f"{DEMO_DATA_DIR}/train.parquet"
DEMO_VAL_FILE = f"{DEMO_DATA_DIR}/test.parquet"
DEMO_SEED = 0


def _is(path: str, default: str) -> bool:
    return os.path.normpath(path) == os.path.normpath(default)


def is_demo_run(config: TrainerRunConfig) -> bool:
    """The config reads the demo's model and data at their default paths (validation on the
    demo's held-out file or off). A run that changed any of them is the user's own: half a
    demo (e.g. their model, the demo's prompts) is never filled in behind their back."""
    train, val = config.data.train_files, config.data.val_files
    return (
        _is(config.model.path, DEMO_MODEL_PATH)
        and len(train) == 1
        and _is(train[0], DEMO_TRAIN_FILE)
        and (not val or (len(val) == 1 and _is(val[0], DEMO_VAL_FILE)))
    )


def missing_demo_assets(config: TrainerRunConfig) -> list[Path]:
    """The default demo paths a demo run reads that do not exist (in build order)."""
    if not is_demo_run(config):
        return []
    wanted = [DEMO_MODEL_PATH, DEMO_TRAIN_FILE, *(DEMO_VAL_FILE for _ in config.data.val_files)]
    return [Path(path) for path in wanted if not Path(path).exists()]


def build_missing_demo_assets(config: TrainerRunConfig) -> list[Path]:
    """Build the default demo model and data files this config reads and lacks; returns what
    was built (empty when nothing was missing or the paths are not the defaults)."""
    missing = missing_demo_assets(config)
    for path in missing:
        path.parent.mkdir(parents=True, exist_ok=True)
    if Path(DEMO_MODEL_PATH) in missing:
        with tempfile.TemporaryDirectory(dir=Path(DEMO_MODEL_PATH).parent) as tmp:
            model = TinyModelConfig.preset("tiny", vocab="arithmetic")
            built = build_tiny_model(Path(tmp) / "model", model, seed=DEMO_SEED)
            built.rename(DEMO_MODEL_PATH)
    files = [path for path in missing if path != Path(DEMO_MODEL_PATH)]
    if files:
        with tempfile.TemporaryDirectory(dir=DEMO_DATA_DIR) as tmp:
            written = write_arithmetic_task(tmp, seed=DEMO_SEED)
            for path in files:  # a split that exists is left alone (it has the same bytes)
                shutil.move(written[path.stem], path)
    return missing


def demo_notice(built: list[Path]) -> str:
    """The one line the entry point prints after building."""
    return (
        f"[hybrid] built the demo inputs {', '.join(map(str, built))} (they were missing; "
        "the tiny arithmetic model and task of examples/run_cpu_demo.sh)"
    )
