"""Does a slow reward slow the demo's step? The CPU demo (`python -m hybrid.main`, the default
config: 16 prompts x 8 samples a step) run for `--steps` steps with the built-in arithmetic
reward, then with the same reward behind a `--cost-ms` wait per row (a remote judge or a
sandbox: it waits rather than computes), scored inline on the driver (`reward.num_workers=0`),
in reward pools of `--pools` processes, and in `--threaded` P x C: P processes running C calls
at once each (`reward.calls_per_worker`). Runs alternate setting by setting, `--repeats`
times; per setting the median over steps 2..N of the step time and its split:
`timing_s/reward` (batch in hand until every score is back: the pool works meanwhile while the
workers compute the reference log-probs), `timing_s/scoring` (until the advantages are
there), the generation and the update. Last line: a JSON object.

    python profiling/bench_reward_step.py [--steps 8] [--cost-ms 50] [--pools 2 32]
        [--threaded 8 16] [--repeats 1] [--no-inline]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

WAITING_REWARD = """
import time

from hybrid.rewards.registry import compute_score as builtin


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    time.sleep({cost_s})
    return builtin(data_source, solution_str, ground_truth, extra_info)
"""

SPLIT = (
    "timing_s/step",
    "timing_s/gen",
    "timing_s/reward",
    "timing_s/scoring",
    "timing_s/update_actor",
)


def run_demo(out: Path, steps: int, *overrides: str) -> list[dict]:
    """The demo for `steps` steps into `out`; its metrics rows."""
    command = [
        sys.executable,
        "-m",
        "hybrid.main",
        f"trainer.output_dir={out}",
        f"trainer.total_steps={steps}",
        "trainer.val_before_train=false",
        "trainer.test_freq=0",
        "trainer.save_freq=0",
        "trainer.export_hf=false",
        "trainer.loggers=[jsonl]",
        *overrides,
    ]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    subprocess.run(command, cwd=REPO, env=env, check=True, capture_output=True, text=True)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return rows


def medians(rows: list[dict]) -> dict[str, float]:
    """Median of each split key over steps 2..N (step 1 starts the engines' caches)."""
    later = rows[1:] or rows
    return {key: statistics.median(r.get(key, 0.0) for r in later) for key in SPLIT}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--cost-ms", type=float, default=50.0)
    parser.add_argument("--pools", type=int, nargs="+", default=[2, 32])
    parser.add_argument(
        "--threaded",
        type=int,
        nargs=2,
        default=[8, 16],
        metavar=("PROCESSES", "CALLS"),
        help="one more setting: PROCESSES reward processes x CALLS calls at once in each",
    )
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument(
        "--no-inline", action="store_true", help="skip the inline setting (6.4 s a step)"
    )
    args = parser.parse_args()
    report: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        waiting = Path(tmp) / "waiting_reward.py"
        waiting.write_text(WAITING_REWARD.format(cost_s=args.cost_ms / 1000))
        slow = f"reward.custom_path={waiting}"
        settings = {"builtin, pool 2": ["reward.num_workers=2"]}
        if not args.no_inline:
            settings[f"+{args.cost_ms:g} ms/row, inline"] = [slow, "reward.num_workers=0"]
        for pool in args.pools:
            settings[f"+{args.cost_ms:g} ms/row, pool {pool}"] = [
                slow,
                f"reward.num_workers={pool}",
            ]
        processes, calls = args.threaded
        settings[f"+{args.cost_ms:g} ms/row, pool {processes}x{calls}"] = [
            slow,
            f"reward.num_workers={processes}",
            f"reward.calls_per_worker={calls}",
        ]
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in settings}
        for repeat in range(args.repeats):
            for index, (name, overrides) in enumerate(settings.items()):
                out = Path(tmp) / f"run_{repeat}_{index}"
                runs[name].append(medians(run_demo(out, args.steps, *overrides)))
                print(f"  ran {name} ({repeat + 1}/{args.repeats})", file=sys.stderr, flush=True)
        print(f"{'setting':<26}" + "".join(f"{key.split('/')[1]:>12}" for key in SPLIT))
        for name, found in runs.items():
            report[name] = {key: statistics.median(f[key] for f in found) for key in SPLIT}
            cells = "".join(f"{report[name][key]:12.3f}" for key in SPLIT)
            print(f"{name:<26}{cells}")
    print(json.dumps(report))


if __name__ == "__main__":
    main()
