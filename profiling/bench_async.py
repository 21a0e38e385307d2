"""Fully async against the synchronous modes on a task with long-tailed response lengths.

The task: the arithmetic prompts of the demo, where every prompt row carries a response budget
(`extra_info.max_response_tokens`): `--short` tokens for most rows and `--long` (16x) for one
row in `--long-every`, so a batch waits for a few long responses. Its reward is the arithmetic
one, and the engine ignores end-of-sequence (`rollout.ignore_eos`), so that every response
is exactly its budget: the random tiny model would otherwise stop most long ones early.

Four modes on the same cores, interleaved round by round (A B C D A B C D):
  colocated          2 workers, each generating and training in turn
  split_on_policy    1 explorer + 1 trainer, lag 0
  async_plan1        fully_async, new weights between whole generation batches
  async_plan2        fully_async with partial rollouts (chunks of `--chunk` tokens)
Every mode updates the actor per mini-batch of `--mini-batch` prompt groups (4 optimizer steps
per train batch of 16 by default); the fully-async modes publish a version after a train batch
worth of them (`trigger_parameter_sync_step` = train_batch_size / mini-batch), so every mode
trains the same samples with the same updates per version. The mini-batches are what lets the
fully-async trainer start as soon as a few groups are there instead of waiting for the long tail.
Each prints trained response tokens per second over the steps after `--warmup` (from the
wall-clock step periods, `timing_s/elapsed`), the trainer's and the Rollouter's idle ratios and
the dropped groups. Targets: plan 2 >= 1.5x split on-policy tokens/s, trainer idle < 0.2.
Last line: a JSON object with everything.

    python profiling/bench_async.py [--steps 12] [--rounds 2] [overrides...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_step import compose_run
from bench_step import run as run_any

from hybrid.data import write_rows
from hybrid.models import TinyModelConfig, build_tiny_model

FULLY_ASYNC = ["trainer.mode=fully_async", "sync.method=memory"]
MODES = {
    "colocated": ["trainer.num_workers=2"],
    "split_on_policy": ["trainer.mode=split", "sync.method=memory", "sync.offset=0"],
    "async_plan1": [*FULLY_ASYNC, "fully_async.partial_rollout=false"],
    "async_plan2": [*FULLY_ASYNC, "fully_async.partial_rollout=true"],
}


def write_task(root: Path, short: int, long: int, long_every: int) -> None:
    """root/model (tiny Qwen2, arithmetic vocabulary) and root/data/train.parquet: a+b prompts,
    every `long_every`-th row with a budget of `long` tokens, the others `short`."""
    build_tiny_model(root / "model", TinyModelConfig.preset("tiny", vocab="arithmetic"), seed=0)
    rows = []
    for index, (a, b) in enumerate((a, b) for a in range(10) for b in range(10)):
        rows.append(
            {
                "prompt": [{"role": "user", "content": f"{a}+{b}="}],
                "data_source": "arithmetic",
                "reward_model": {"ground_truth": str(a + b)},
                "extra_info": {
                    "index": index,
                    "max_response_tokens": long if index % long_every == 0 else short,
                },
            }
        )
    write_rows(rows, root / "data" / "train.parquet")  # where bench_step.compose_run reads


def summarise(rows: list[dict[str, Any]], samples_per_step: int) -> dict[str, float]:
    """Trained response tokens per wall-clock second, idle ratios, drops, lengths."""
    tokens = sum(r["response_length/mean"] for r in rows[1:]) * samples_per_step
    period = rows[-1]["timing_s/elapsed"] - rows[0]["timing_s/elapsed"]

    def median(key: str) -> float:
        return round(statistics.median(r.get(key, 0.0) for r in rows), 4)

    return {
        "tokens_per_s": round(tokens / period, 1),
        "step_s": round(period / (len(rows) - 1), 4),
        "trainer_idle_ratio": median("trainer/idle_ratio"),
        "rollouter_idle_ratio": median("rollouter/idle_ratio"),
        "dropped_groups": rows[-1].get("queue/dropped_stale", 0.0),
        "response_length_mean": median("response_length/mean"),
        "response_length_max": max(r["response_length/max"] for r in rows),
        "partial_ratio": median("partial/ratio"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--short", type=int, default=8)
    parser.add_argument("--long", type=int, default=128)
    parser.add_argument("--long-every", type=int, default=8)
    parser.add_argument("--chunk", type=int, default=8, help="fully_async.chunk_tokens of plan 2")
    parser.add_argument("--mini-batch", type=int, default=4, help="algorithm.ppo_mini_batch_size")
    parser.add_argument("--threshold", type=float, default=1.0)
    parser.add_argument("--max-lag", type=int, default=4)
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    torch.manual_seed(0)
    report: dict[str, Any] = {"task": vars(args)}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_task(root, args.short, args.long, args.long_every)
        overrides = [
            f"algorithm.ppo_mini_batch_size={args.mini_batch}",
            f"rollout.response_length={args.long}",
            f"rollout.max_model_len={args.long + 32}",
            f"fully_async.chunk_tokens={args.chunk}",
            f"fully_async.staleness_threshold={args.threshold}",
            f"fully_async.max_version_lag={args.max_lag}",
            "trainer.resume=disable",
            "rollout.ignore_eos=true",
            *args.overrides,
        ]
        cfg = compose_run(root, "config", args.steps, overrides)
        per_step = cfg.data.train_batch_size * cfg.rollout.n
        if cfg.data.train_batch_size % args.mini_batch:
            raise SystemExit(
                f"--mini-batch {args.mini_batch} must divide data.train_batch_size "
                f"{cfg.data.train_batch_size}"
            )
        updates_per_version = cfg.data.train_batch_size // args.mini_batch
        overrides.append(f"fully_async.trigger_parameter_sync_step={updates_per_version}")
        measured: dict[str, list[dict[str, Any]]] = {name: [] for name in args.modes}
        for round_index in range(args.rounds):
            for name in args.modes:
                mode = MODES[name]
                run_name = f"{name}_{round_index}"
                rows = run_any(root, run_name, args.steps, [*mode, *overrides])
                rows = rows[args.warmup :]
                measured[name].append(summarise(rows, per_step))
                print(f"round {round_index + 1} {name}: {measured[name][-1]}", flush=True)
        for name, rounds in measured.items():
            report[name] = {
                key: round(statistics.median(r[key] for r in rounds), 4) for key in rounds[0]
            }
            print(f"{name:16s} {report[name]}")
    if "split_on_policy" in report:
        on_policy = report["split_on_policy"]["tokens_per_s"]
        for name in ("colocated", "async_plan1", "async_plan2"):
            if name in report:
                ratio = round(report[name]["tokens_per_s"] / on_policy, 3)
                report[f"{name}_over_split_on_policy"] = ratio
    if "async_plan2_over_split_on_policy" in report:
        print(
            "plan 2 / split on-policy tokens/s: "
            f"{report['async_plan2_over_split_on_policy']} (target >= 1.5), trainer idle "
            f"{report['async_plan2']['trainer_idle_ratio']} (target < 0.2)"
        )
    print(json.dumps(report))


if __name__ == "__main__":
    main()
