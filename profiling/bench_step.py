"""Where a GRPO step's time goes on the demo config, and the mode switch's share of it.

Runs the default config (configs/config.yaml: arithmetic task, 2 CPU workers) on the tiny
model, or on `--preset bench-100m` (~100M parameters), for a number of steps and reports
medians over the steps after the first (warm-up) of: gen (vLLM generation), sync (gather +
load into the engine), mode switch (entering and leaving rollout mode apart from the weight
transfer: wake/release, offload moves, RNG swap, prefix-cache reset, ledger), the rest of the
rollout call (Ray, packing), ref, old_logprob (worker-side pass times), reward (driver, which
overlaps the passes), scoring (the wall time of rewards + passes together), update. Target:
mode-switch share < 5% of the step; the sync's own share is reported beside it.

--before-after runs the same config twice, one after the other: "before" with the trainer-side
speed-ups off (padded passes, full logits, the old-log-prob pass always run), "after" as
configured; it prints both splits and the after/before step-time ratio.

--dtypes runs the config with every compute dtype (actor, ref and engine) in bfloat16 and in
float32, alternating (bf16, fp32, bf16, fp32, ... for --rounds rounds), and reports each
one's medians and the bf16/fp32 ratios of the step, the update and generation: how much the
dtype `auto` picks on this machine matters here. Last line: a JSON object.

    python profiling/bench_step.py [--steps 30] [--preset tiny] [extra Hydra overrides...]
    python profiling/bench_step.py --before-after --preset bench-100m --steps 6 \
        rollout.response_length=64 rollout.max_model_len=128
    python profiling/bench_step.py --dtypes --rounds 2 --steps 12
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from hybrid.dtypes import Hardware
from hybrid.main import build_config
from hybrid.trainer.compose import compose
from hybrid.trainer.config import TrainerRunConfig
from hybrid.trainer.loop import Driver

REPO = Path(__file__).resolve().parents[1]
# The trainer-side speed-ups off: what a step cost before them.
BEFORE = (
    "model.use_remove_padding=false",
    "model.log_prob_chunk_tokens=0",
    "algorithm.skip_old_log_prob=false",
)


def prepare(root: Path, preset: str) -> None:
    """The model (arithmetic vocabulary) and the arithmetic dataset under `root`."""
    model = [sys.executable, "-m", "hybrid.models", "--output-dir", str(root / "model")]
    subprocess.run([*model, "--preset", preset, "--vocab", "arithmetic"], check=True)
    data = [sys.executable, str(REPO / "examples/data/arithmetic.py")]
    subprocess.run([*data, "--output-dir", str(root / "data")], check=True)


def compose_run(root: Path, name: str, steps: int, overrides: list[str]) -> TrainerRunConfig:
    """The default config on the model and data under `root`, writing to `root/name`."""
    cfg = compose(
        "config",
        [
            f"model.path={root / 'model'}",
            f"data.train_files=[{root / 'data' / 'train.parquet'}]",
            "data.val_files=[]",
            f"trainer.output_dir={root / name}",
            f"trainer.total_steps={steps}",
            "trainer.loggers=[jsonl]",
            "trainer.val_before_train=false",
            "trainer.export_hf=false",
            *overrides,
        ],
    )
    return build_config(cfg)


def run(root: Path, name: str, steps: int, overrides: list[str]) -> list[dict[str, Any]]:
    """Train `steps` steps (either placement); every step's metrics."""
    config = compose_run(root, name, steps, overrides)
    Driver(config).fit()
    lines = (root / name / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def run_steps(root: Path, name: str, steps: int, overrides: list[str]) -> list[dict[str, Any]]:
    return run(root, name, steps, overrides)[1:]  # the first step warms up


def step_periods(rows: list[dict[str, Any]]) -> list[float]:
    """Seconds between the ends of consecutive steps of one run (`rows` may join several:
    their seams are left out): the step plus what follows it (the metric sinks, the memory
    ledger's drain, a split run's publish, a checkpoint when due)."""
    return [
        b["timing_s/elapsed"] - a["timing_s/elapsed"]
        for a, b in itertools.pairwise(rows)
        if b["step"] == a["step"] + 1
    ]


def summarise(rows: list[dict[str, Any]]) -> dict[str, float]:
    def median(key: str) -> float:
        return statistics.median(row.get(key, 0.0) for row in rows)

    step = median("timing_s/step")
    gen, switch = median("timing_s/gen"), median("timing_s/mode_switch")
    sync = median("timing_s/sync_gather") + median("timing_s/sync_load")
    call = median("timing_s/rollout_call")
    periods = step_periods(rows)
    return {
        "steps_measured": len(rows),
        "step_s": round(step, 4),
        "period_s": round(statistics.median(periods), 4) if periods else float("nan"),
        "gen_s": round(gen, 4),
        "sync_s": round(sync, 4),
        "sync_gather_s": round(median("timing_s/sync_gather"), 4),
        "sync_load_s": round(median("timing_s/sync_load"), 4),
        "mode_switch_s": round(switch, 4),
        # The rest of the driver's rollout call: Ray transport, packing the Batch.
        "rollout_call_rest_s": round(max(call - gen - sync - switch, 0.0), 4),
        "ref_s": round(median("timing_s/ref"), 4),
        "old_logprob_s": round(median("timing_s/old_log_prob"), 4),
        "reward_s": round(median("timing_s/reward"), 4),
        "scoring_s": round(median("timing_s/scoring"), 4),
        "update_s": round(median("timing_s/update_actor"), 4),
        "mode_switch_share": round(switch / step, 4),
        "sync_share": round(sync / step, 4),
        "response_length_mean": round(median("response_length/mean"), 1),
    }


DTYPE_VARIANTS = ("bfloat16", "float32")


def compare_dtypes(root: Path, steps: int, rounds: int, overrides: list[str]) -> dict[str, Any]:
    """Alternate the dtype variants round by round (the machine's drift hits both alike)."""
    rows: dict[str, list[dict[str, Any]]] = {dtype: [] for dtype in DTYPE_VARIANTS}
    for round_index in range(rounds):
        for dtype in DTYPE_VARIANTS:
            chosen = [f"actor.precision.param_dtype={dtype}", f"ref.precision.param_dtype={dtype}"]
            chosen.append(f"rollout.dtype={dtype}")
            name = f"{dtype}-{round_index}"
            rows[dtype] += run_steps(root, name, steps, [*chosen, *overrides])
            print(f"{name}: {json.dumps(summarise(rows[dtype]))}", flush=True)
    result = {dtype: summarise(measured) for dtype, measured in rows.items()}
    bf16, fp32 = result["bfloat16"], result["float32"]
    return {
        "cpu": Hardware.detect(torch.device("cpu")).description,
        **result,
        "bf16_over_fp32": {
            key: round(bf16[f"{key}_s"] / fp32[f"{key}_s"], 3) for key in ("step", "update", "gen")
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--preset", default="tiny", choices=["tiny", "bench-100m"])
    parser.add_argument("--before-after", action="store_true")
    parser.add_argument("--dtypes", action="store_true", help="bf16 against fp32, alternating")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of --dtypes")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        prepare(root, args.preset)
        if args.dtypes:
            result: dict[str, Any] = compare_dtypes(root, args.steps, args.rounds, args.overrides)
        elif not args.before_after:
            result = summarise(run_steps(root, "run", args.steps, args.overrides))
        else:
            before = summarise(run_steps(root, "before", args.steps, [*BEFORE, *args.overrides]))
            print("before:", json.dumps(before), flush=True)
            after = summarise(run_steps(root, "after", args.steps, args.overrides))
            print("after:", json.dumps(after), flush=True)
            result = {
                "preset": args.preset,
                "before": before,
                "after": after,
                "step_ratio_before_over_after": round(before["step_s"] / after["step_s"], 3),
                "trainer_side_before_s": round(before["scoring_s"] + before["update_s"], 4),
                "trainer_side_after_s": round(after["scoring_s"] + after["update_s"], 4),
            }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
