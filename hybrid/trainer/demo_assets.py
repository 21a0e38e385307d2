"""The demos' inputs, built on first use: `python -m hybrid.main` on a fresh checkout.

configs/config.yaml (its `inputs: demo`, configs/inputs/demo.yaml) points model.path and the
data files at outputs/demo/, which examples/run_cpu_demo.sh (`make demo`) fills. When a run's
config names exactly those default paths (`is_demo_run`) and some are missing,
`build_missing_demo_assets` builds those as the script does:

    python -m hybrid.models --output-dir outputs/demo/model --preset tiny --vocab arithmetic --seed 0
    python examples/data/arithmetic.py --output-dir outputs/demo/data --seed 0

(same functions, same bytes). configs/sft_grpo_demo.yaml adds the arithmetic SFT rows
outputs/demo/data/sft.parquet (`write_arithmetic_sft`), built the same way when its
sft.train_files name exactly that file. The agent demo (configs/agent_demo.yaml) reads
outputs/agent_demo/: the tiny model in the "agent" vocabulary and the vault task (hybrid/data/agent_task.py), built
the same way; the mixture-of-experts demo (configs/moe_demo.yaml) outputs/moe_demo/: the
tiny-moe preset (a Qwen3-MoE) and the arithmetic task; the vision-language demo
(configs/vlm_demo.yaml) outputs/vlm_demo/: the tiny-vl preset (a Qwen2-VL) and the digit-reading
task (hybrid/data/digits_task.py). Relative paths are taken from the working directory, as the run
itself reads them. A run with any other model or data path is the user's: nothing is built,
and a missing path is reported by `TrainerRunConfig.check_paths`, naming its field. Each asset
is built under a temporary name and moved into place, so an interrupted build leaves nothing
that looks complete.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hybrid.data.agent_task import write_agent_task
from hybrid.data.arithmetic_task import write_arithmetic_sft, write_arithmetic_task
from hybrid.data.digits_task import write_digits_vl
from hybrid.models import TinyModelConfig, build_tiny_model
from hybrid.models.config import PresetName
from hybrid.models.tokenizer import VocabName
from hybrid.trainer.config import TrainerRunConfig

DEMO_MODEL_PATH = "outputs/demo/model"
DEMO_DATA_DIR = "outputs/demo/data"
DEMO_TRAIN_FILE = f"{DEMO_DATA_DIR}/train.parquet"
DEMO_VAL_FILE = f"{DEMO_DATA_DIR}/test.parquet"
DEMO_SFT_FILE = f"{DEMO_DATA_DIR}/sft.parquet"
DEMO_SEED = 0


@dataclass(frozen=True)
class Demo:
    model_path: str
    data_dir: str
    vocab: VocabName
    write_task: Callable[..., dict[str, Path]]
    write_sft: Callable[..., Path] | None = None
    """Writes the demo's SFT rows into a directory (None: the demo has none)."""
    preset: PresetName = "tiny"
    """The tiny model's preset (tiny-moe: the mixture-of-experts twin)."""

    @property
    def train_file(self) -> str:
        return f"{self.data_dir}/train.parquet"

    @property
    def sft_file(self) -> str:
        return f"{self.data_dir}/sft.parquet"

    @property
    def val_file(self) -> str:
        return f"{self.data_dir}/test.parquet"


DEMOS = (
    Demo(DEMO_MODEL_PATH, DEMO_DATA_DIR, "arithmetic", write_arithmetic_task, write_arithmetic_sft),
    Demo("outputs/agent_demo/model", "outputs/agent_demo/data", "agent", write_agent_task),
    Demo(
        "outputs/moe_demo/model",
        "outputs/moe_demo/data",
        "arithmetic",
        write_arithmetic_task,
        preset="tiny-moe",
    ),
    Demo(
        "outputs/vlm_demo/model",
        "outputs/vlm_demo/data",
        "arithmetic",
        write_digits_vl,
        preset="tiny-vl",
    ),
)


def _is(path: str, default: str) -> bool:
    return os.path.normpath(path) == os.path.normpath(default)


def demo_of(config: TrainerRunConfig) -> Demo | None:
    """The demo whose model and data the config reads at their default paths (validation on
    the demo's held-out file or off). A run that changed any of them is the user's own: half a
    demo (e.g. their model, the demo's prompts) is never filled in behind their back."""
    train, val = config.data.train_files, config.data.val_files
    for demo in DEMOS:
        if (
            _is(config.model.path, demo.model_path)
            and len(train) == 1
            and _is(train[0], demo.train_file)
            and (not val or (len(val) == 1 and _is(val[0], demo.val_file)))
        ):
            return demo
    return None


def is_demo_run(config: TrainerRunConfig) -> bool:
    return demo_of(config) is not None


def missing_demo_assets(config: TrainerRunConfig) -> list[Path]:
    """The default demo paths a demo run reads that do not exist (in build order)."""
    demo = demo_of(config)
    if demo is None:
        return []
    wanted = [demo.model_path, demo.train_file, *(demo.val_file for _ in config.data.val_files)]
    sft = config.sft.train_files
    if demo.write_sft is not None and len(sft) == 1 and _is(sft[0], demo.sft_file):
        wanted.append(demo.sft_file)
    return [Path(path) for path in wanted if not Path(path).exists()]


def build_missing_demo_assets(config: TrainerRunConfig) -> list[Path]:
    """Build the default demo model and data files this config reads and lacks; returns what
    was built (empty when nothing was missing or the paths are not a demo's)."""
    demo = demo_of(config)
    missing = missing_demo_assets(config)
    if demo is None or not missing:
        return []
    for path in missing:
        path.parent.mkdir(parents=True, exist_ok=True)
    if Path(demo.model_path) in missing:
        with tempfile.TemporaryDirectory(dir=Path(demo.model_path).parent) as tmp:
            model = TinyModelConfig.preset(demo.preset, vocab=demo.vocab)
            built = build_tiny_model(Path(tmp) / "model", model, seed=DEMO_SEED)
            built.rename(demo.model_path)
    if demo.write_sft is not None and Path(demo.sft_file) in missing:
        with tempfile.TemporaryDirectory(dir=demo.data_dir) as tmp:
            shutil.move(demo.write_sft(tmp, seed=DEMO_SEED), demo.sft_file)
    files = [path for path in missing if path not in (Path(demo.model_path), Path(demo.sft_file))]
    if files:
        with tempfile.TemporaryDirectory(dir=demo.data_dir) as tmp:
            written = demo.write_task(tmp, seed=DEMO_SEED)
            for path in files:  # a split that exists is left alone (it has the same bytes)
                shutil.move(written[path.stem], path)
    return missing


def demo_notice(built: list[Path]) -> str:
    """The one line the entry point prints after building."""
    return (
        f"[hybrid] built the demo inputs {', '.join(map(str, built))} (they were missing; "
        "the tiny model and the demo's task, as examples/run_cpu_demo.sh builds them)"
    )
