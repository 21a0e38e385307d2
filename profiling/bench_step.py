"""Where a GRPO step's time goes on the demo config, and the mode switch's share of it.

Runs the default config (configs/config.yaml: tiny model, arithmetic task, 2 CPU workers)
for a number of steps and reports medians over the steps after the first (warm-up) of:
gen (vLLM generation), sync (gather + load into the engine), mode switch (entering and
leaving rollout mode apart from the weight transfer: wake/release, offload moves, RNG swap,
prefix-cache reset, ledger), the rest of the rollout call (Ray, packing), ref, old_logprob,
update. Last line: a JSON object. Target: mode-switch share < 5% of the step; the sync's own
share is reported beside it.

    python profiling/bench_step.py [--steps 30] [extra Hydra overrides...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from hydra import compose, initialize_config_dir

from hybrid.main import build_config
from hybrid.trainer.grpo import GRPOTrainer

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "hybrid.models",
                "--output-dir",
                str(root / "model"),
                "--vocab",
                "arithmetic",
            ],
            check=True,
        )
        subprocess.run(
            [
                sys.executable,
                str(REPO / "examples/data/arithmetic.py"),
                "--output-dir",
                str(root / "data"),
            ],
            check=True,
        )
        with initialize_config_dir(config_dir=str(REPO / "configs"), version_base=None):
            cfg = compose(
                "config",
                overrides=[
                    f"model.path={root / 'model'}",
                    f"data.train_files=[{root / 'data' / 'train.parquet'}]",
                    "data.val_files=[]",
                    f"trainer.output_dir={root / 'run'}",
                    f"trainer.total_steps={args.steps}",
                    "trainer.loggers=[jsonl]",
                    "trainer.val_before_train=false",
                    "trainer.export_hf=false",
                    *args.overrides,
                ],
            )
        GRPOTrainer(build_config(cfg)).fit()
        rows = [
            json.loads(line) for line in (root / "run" / "metrics.jsonl").read_text().splitlines()
        ][1:]

    def median(key: str) -> float:
        return statistics.median(row.get(key, 0.0) for row in rows)

    step = median("timing_s/step")
    gen, sync, switch = (
        median("timing_s/gen"),
        median("timing_s/sync_gather") + median("timing_s/sync_load"),
        median("timing_s/mode_switch"),
    )
    call = median("timing_s/rollout_call")
    result = {
        "steps_measured": len(rows),
        "step_s": round(step, 4),
        "gen_s": round(gen, 4),
        "sync_s": round(sync, 4),
        "sync_gather_s": round(median("timing_s/sync_gather"), 4),
        "sync_load_s": round(median("timing_s/sync_load"), 4),
        "mode_switch_s": round(switch, 4),
        # The rest of the driver's rollout call: Ray transport, packing the Batch.
        "rollout_call_rest_s": round(max(call - gen - sync - switch, 0.0), 4),
        "ref_s": round(median("timing_s/ref"), 4),
        "old_logprob_s": round(median("timing_s/old_log_prob"), 4),
        "update_s": round(median("timing_s/update_actor"), 4),
        "mode_switch_share": round(switch / step, 4),
        "sync_share": round(sync / step, 4),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
