"""Split placement against colocated, on the same cores, and what each weight transport costs.

Part 1 (throughput): the demo config (arithmetic task) on `--preset` run three ways,
interleaved round by round so that the machine's drift hits all alike:
  colocated            2 workers, each generating and training in turn
  split on-policy      1 explorer + 1 trainer, fixed interval 1 offset 0 (lag 0)
  split one-step-off   the same with offset 1 (generation of step k+1 overlaps update k)
Each prints the median step period (after `--warmup` steps) and generated tokens per second;
the last lines give one-step-off / on-policy and split / colocated tokens/s (target: one-step-
off >= 1.4x on-policy).

Part 2 (`--sync-preset`, default bench-100m): per transport (nccl, memory, checkpoint), the
median time from the trainer starting to publish a version to the explorer holding it (publish
+ load; nccl's two halves overlap, so it takes the longer), against two floors measured in this
process on the same weights: a raw copy of every tensor into a preallocated buffer (the bytes
moved once), and the colocated in-process sync of the same model (gather + load into vLLM).
Target: each transport <= 2x the raw floor. Last line: a JSON object with everything.

    python profiling/bench_split.py [--steps 12] [--rounds 2] [--preset tiny] [overrides...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_step import compose_run, prepare
from bench_step import run as run_any

VARIANTS = {
    "colocated": ["trainer.num_workers=2"],
    "split_on_policy": ["trainer.placement=split", "sync.offset=0"],
    "split_one_step_off": ["trainer.placement=split", "sync.offset=1"],
}
TRANSPORTS = ("nccl", "memory", "checkpoint")


def run(root: Path, name: str, steps: int, overrides: list[str]) -> list[dict[str, Any]]:
    """A fresh run of `steps` steps (the checkpoint transport writes under the run)."""
    extra = ["trainer.resume=disable", f"sync.checkpoint_dir={root / name / 'weights'}"]
    return run_any(root, name, steps, [*extra, *overrides])


def throughput(rows: list[dict[str, Any]], samples_per_step: int) -> dict[str, float]:
    step = statistics.median(r["timing_s/step"] for r in rows)
    tokens = statistics.median(r["response_length/mean"] for r in rows) * samples_per_step
    return {"step_s": round(step, 4), "tokens_per_s": round(tokens / step, 1)}


def raw_copy_floor(model_dir: Path, dtype: torch.dtype, repeats: int = 3) -> tuple[float, int]:
    """Seconds to copy every weight once into a preallocated buffer of the engine's dtype."""
    weights = {}
    for file in sorted(model_dir.glob("*.safetensors")):
        weights.update(load_file(str(file)))
    targets = {name: torch.empty(t.shape, dtype=dtype) for name, t in weights.items()}
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        for name, tensor in weights.items():
            targets[name].copy_(tensor)
        times.append(time.perf_counter() - started)
    return statistics.median(times), sum(t.numel() * t.element_size() for t in targets.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--preset", default="tiny", choices=["tiny", "bench-100m"])
    parser.add_argument("--sync-preset", default="bench-100m", choices=["tiny", "bench-100m"])
    parser.add_argument("--sync-steps", type=int, default=4)
    parser.add_argument("--skip-sync", action="store_true")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    report: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "throughput"
        prepare(root, args.preset)
        cfg = compose_run(root, "config", args.steps, args.overrides)
        per_step = cfg.data.train_batch_size * cfg.rollout.n
        measured: dict[str, list[dict[str, Any]]] = {name: [] for name in VARIANTS}
        for round_index in range(args.rounds):
            for name, overrides in VARIANTS.items():
                rows = run(root, f"{name}_{round_index}", args.steps, [*overrides, *args.overrides])
                measured[name] += rows[args.warmup :]
                print(
                    f"round {round_index + 1} {name}: {throughput(rows[args.warmup :], per_step)}"
                )
        for name, rows in measured.items():
            report[name] = throughput(rows, per_step)
            print(
                f"{name:20s} step {report[name]['step_s']:.3f} s  {report[name]['tokens_per_s']:.0f} tokens/s"
            )
        off, on = report["split_one_step_off"], report["split_on_policy"]
        report["one_step_off_over_on_policy"] = round(off["tokens_per_s"] / on["tokens_per_s"], 3)
        report["split_on_policy_over_colocated"] = round(
            on["tokens_per_s"] / report["colocated"]["tokens_per_s"], 3
        )
        print(
            f"one-step-off / on-policy tokens/s: {report['one_step_off_over_on_policy']} (target >= 1.4)"
        )
        if not args.skip_sync:
            report["sync"] = sync_costs(Path(tmp) / "sync", args.sync_preset, args.sync_steps)
    print(json.dumps(report))


def sync_costs(root: Path, preset: str, steps: int) -> dict[str, Any]:
    prepare(root, preset)
    costs: dict[str, Any] = {}
    rows = run(root, "colocated_sync", steps, ["trainer.num_workers=1", "sync.strategy=auto"])
    colocated = statistics.median(
        r["timing_s/sync_gather"] + r["timing_s/sync_load"] for r in rows[1:]
    )
    dtype = json.loads((root / "colocated_sync" / "config.json").read_text())["rollout"]["dtype"]
    floor, nbytes = raw_copy_floor(root / "model", getattr(torch, dtype))
    costs["bytes"] = nbytes
    costs["raw_copy_floor_s"] = round(floor, 4)
    costs["colocated_sync_s"] = round(colocated, 4)
    print(
        f"sync floor: raw copy {floor:.3f} s ({nbytes / 2**20:.0f} MiB), colocated in-process sync {colocated:.3f} s"
    )
    for method in TRANSPORTS:
        rows = run(
            root, f"sync_{method}", steps, ["trainer.placement=split", f"sync.method={method}"]
        )
        per_sync = [
            max(r["timing_s/publish"], r["timing_s/explorer_load"])
            if method == "nccl"
            else r["timing_s/publish"] + r["timing_s/explorer_load"]
            for r in rows[1:]
            if r["sync/explorer_syncs"]
        ]
        seconds = statistics.median(per_sync)
        costs[method] = {"sync_s": round(seconds, 4), "over_raw_floor": round(seconds / floor, 2)}
        print(
            f"{method:10s} sync {seconds:.3f} s = {seconds / floor:.2f}x the raw floor (target <= 2)"
        )
    return costs


if __name__ == "__main__":
    main()
