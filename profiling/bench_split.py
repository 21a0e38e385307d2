"""Split placement against colocated, on the same cores, and what each weight transport costs.

Part 1 (throughput): the demo config (arithmetic task) on `--preset`, with 16-token responses
(`THROUGHPUT_RUN`), run three ways, interleaved round by round so that the machine's drift hits
all alike:
  colocated            2 workers, each generating and training in turn
  split on-policy      1 explorer + 1 trainer, fixed interval 1 offset 0 (lag 0)
  split one-step-off   the same with offset 1 (generation of step k+1 overlaps update k)
Each prints the median step (timing_s/step, after `--warmup` steps) and step period (between
the ends of consecutive steps: the step plus the publish and the logging after it), generated
tokens per second over the step, and the median generation, update and publish times;
the last lines give one-step-off / on-policy and split / colocated tokens/s (target: one-step-
off >= 1.4x on-policy) and one-step-off's step and period over max(generate, update +
publish), what a perfect overlap would take (target: step <= 1.1x).

Part 2 (`--sync-preset`, default bench-100m, engine in `--sync-dtype`, default bf16): per
transport (nccl, memory, checkpoint), the median time from the trainer starting to publish a
version to the explorer holding it (publish + load; nccl's two halves overlap, so it takes the
longer), after `WARM_SYNCS` syncs, against the raw gather + copy of the same bytes through the
same medium (`sync_floors.py`: cast, move one flat buffer, copy out) and against the memcpy
floor under all of them; the colocated in-process sync is printed beside them. Target: each
transport <= 2x its medium's floor. Last line: a JSON object with everything.

    python profiling/bench_split.py [--steps 16] [--rounds 3] [--preset tiny] [overrides...]
    python profiling/bench_split.py --skip-throughput --transports nccl
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
from bench_step import compose_run, prepare, step_periods
from bench_step import run as run_any
from sync_floors import checkpoint_floor, memcpy_floor, memory_floor, nccl_floor, read_model_weights

THROUGHPUT_RUN = ["rollout.response_length=16"]
"""Responses long enough that generation weighs about as much as the update: one-step-off can
only hide the shorter of the two (the demo's 4-token answers make generation a fifth of the
step, and the overlap could then win at most ~1.2x)."""
VARIANTS = {
    "colocated": ["trainer.num_workers=2"],
    "split_on_policy": ["trainer.mode=split", "sync.offset=0"],
    "split_one_step_off": ["trainer.mode=split", "sync.offset=1"],
}
TRANSPORTS = ("nccl", "memory", "checkpoint")
WARM_SYNCS = 2
SYNC_RUN_SIZE = [
    "data.train_batch_size=2",
    "rollout.n=2",
    "algorithm.ppo_mini_batch_size=2",
    "actor.micro_batch_size=4",
    "ref.micro_batch_size=4",
]
"""The sync runs only need steps to publish between: the smallest batch keeps them short."""
"""Sync rows left out of the medians: the first publishes fault in fresh memory (staging
buffers, the object store's pages) that later ones reuse."""


def run(root: Path, name: str, steps: int, overrides: list[str]) -> list[dict[str, Any]]:
    """A fresh run of `steps` steps (the checkpoint transport writes under the run)."""
    extra = ["trainer.resume=disable", f"sync.checkpoint_dir={root / name / 'weights'}"]
    return run_any(root, name, steps, [*extra, *overrides])


def throughput(rows: list[dict[str, Any]], samples_per_step: int) -> dict[str, float]:
    """Median step, period and tokens/s, and the two halves that one-step-off overlaps."""
    periods = step_periods(rows)
    step = statistics.median(r["timing_s/step"] for r in rows)
    tokens = statistics.median(r["response_length/mean"] for r in rows) * samples_per_step
    out = {
        "step_s": round(step, 4),
        "period_s": round(statistics.median(periods), 4),
        "tokens_per_s": round(tokens / step, 1),
    }
    for key in ("gen", "update_actor", "publish"):
        out[f"{key}_s"] = round(statistics.median(r.get(f"timing_s/{key}", 0.0) for r in rows), 4)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--preset", default="tiny", choices=["tiny", "bench-100m"])
    parser.add_argument("--sync-preset", default="bench-100m", choices=["tiny", "bench-100m"])
    parser.add_argument("--sync-steps", type=int, default=8)
    parser.add_argument("--skip-sync", action="store_true")
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--transports", nargs="+", default=list(TRANSPORTS), choices=TRANSPORTS)
    parser.add_argument(
        "--sync-dtype",
        default="bfloat16",
        help="rollout.dtype of the sync runs (bf16 is what the memory transport publishes)",
    )
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    report: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        if not args.skip_throughput:
            report.update(throughputs(Path(tmp) / "throughput", args))
        if not args.skip_sync:
            report["sync"] = sync_costs(
                Path(tmp) / "sync",
                args.sync_preset,
                args.sync_steps,
                args.sync_dtype,
                args.transports,
            )
    print(json.dumps(report))


def throughputs(root: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Part 1: the three variants, interleaved round by round."""
    report: dict[str, Any] = {}
    prepare(root, args.preset)
    overrides = [*THROUGHPUT_RUN, *args.overrides]
    cfg = compose_run(root, "config", args.steps, overrides)
    per_step = cfg.data.train_batch_size * cfg.rollout.n
    measured: dict[str, list[dict[str, Any]]] = {name: [] for name in VARIANTS}
    for round_index in range(args.rounds):
        for name, variant in VARIANTS.items():
            rows = run(root, f"{name}_{round_index}", args.steps, [*variant, *overrides])
            measured[name] += rows[args.warmup :]
            print(f"round {round_index + 1} {name}: {throughput(rows[args.warmup :], per_step)}")
    for name, rows in measured.items():
        report[name] = throughput(rows, per_step)
        got = report[name]
        print(
            f"{name:20s} step {got['step_s']:.3f} s (period {got['period_s']:.3f} s)  "
            f"{got['tokens_per_s']:.0f} tokens/s  (gen {got['gen_s']:.3f} s, update "
            f"{got['update_actor_s']:.3f} s, publish {got['publish_s']:.3f} s)"
        )
    off, on = report["split_one_step_off"], report["split_on_policy"]
    report["one_step_off_over_on_policy"] = round(off["tokens_per_s"] / on["tokens_per_s"], 3)
    # The same over the periods (what a run's wall time sees: the publish and the logging
    # between steps included).
    report["one_step_off_over_on_policy_by_period"] = round(on["period_s"] / off["period_s"], 3)
    report["split_on_policy_over_colocated"] = round(
        on["tokens_per_s"] / report["colocated"]["tokens_per_s"], 3
    )
    overlapped = max(off["gen_s"], off["update_actor_s"] + off["publish_s"])
    report["one_step_off_step_over_overlap"] = round(off["step_s"] / overlapped, 3)
    report["one_step_off_period_over_overlap"] = round(off["period_s"] / overlapped, 3)
    print(
        f"one-step-off / on-policy tokens/s: {report['one_step_off_over_on_policy']} (target >= "
        f"1.4); by the step periods {report['one_step_off_over_on_policy_by_period']}"
    )
    print(
        f"one-step-off step / max(generate, update + publish) = {overlapped:.3f} s: "
        f"{report['one_step_off_step_over_overlap']} (target <= 1.1), period "
        f"{report['one_step_off_period_over_overlap']}"
    )
    return report


def sync_costs(
    root: Path, preset: str, steps: int, dtype_name: str, transports: list[str]
) -> dict[str, Any]:
    """Part 2: each transport's sync against the floors of `sync_floors.py`."""
    prepare(root, preset)
    dtype = getattr(torch, dtype_name)
    weights = read_model_weights(root / "model")
    memcpy, nbytes = memcpy_floor(weights, dtype)
    floors: dict[str, float] = {}
    if "memory" in transports:
        floors["memory"] = memory_floor(weights, dtype)
    if "nccl" in transports:
        floors["nccl"] = nccl_floor(root / "model", dtype)
    if "checkpoint" in transports:
        floors["checkpoint"] = checkpoint_floor(weights, dtype, root / "floor")
    del weights
    engine = [f"rollout.dtype={dtype_name}", "sync.strategy=auto", *SYNC_RUN_SIZE]
    rows = run(root, "colocated_sync", steps, ["trainer.num_workers=1", *engine])[WARM_SYNCS:]
    colocated = statistics.median(r["timing_s/sync_gather"] + r["timing_s/sync_load"] for r in rows)
    costs: dict[str, Any] = {
        "bytes": nbytes,
        "memcpy_floor_s": round(memcpy, 4),
        "colocated_sync_s": round(colocated, 4),
    }
    print(
        f"{nbytes / 2**20:.0f} MiB of {dtype_name}: memcpy floor {memcpy:.3f} s, "
        f"colocated in-process sync (gather + load into vLLM) {colocated:.3f} s"
    )
    for method in transports:
        overrides = ["trainer.mode=split", f"sync.method={method}", *engine]
        rows = run(root, f"sync_{method}", steps, overrides)[WARM_SYNCS:]
        per_sync = [
            # nccl's two halves run at once (the explorer receives while the trainer sends).
            max(r["timing_s/publish"], r["timing_s/explorer_load"])
            if method == "nccl"
            else r["timing_s/publish"] + r["timing_s/explorer_load"]
            for r in rows
            if r["sync/explorer_syncs"]
        ]
        seconds, floor = statistics.median(per_sync), floors[method]
        costs[method] = {
            "sync_s": round(seconds, 4),
            "publish_s": round(statistics.median(r["timing_s/publish"] for r in rows), 4),
            "load_s": round(statistics.median(r["timing_s/explorer_load"] for r in rows), 4),
            "medium_floor_s": round(floor, 4),
            "over_medium_floor": round(seconds / floor, 2),
            "over_memcpy_floor": round(seconds / memcpy, 2),
        }
        print(
            f"{method:10s} sync {seconds:.3f} s = {seconds / floor:.2f}x its medium's floor "
            f"{floor:.3f} s (target <= 2), {seconds / memcpy:.1f}x the memcpy floor"
        )
    return costs


if __name__ == "__main__":
    main()
