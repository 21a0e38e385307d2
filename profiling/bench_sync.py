"""Weight-sync cost of each gather mode on a ~100M-parameter Qwen2 (2 CPU workers).

For each mode (tensor, layer, bucket) the actor's shards are gathered and loaded into the
in-process vLLM engine; next to it, in the same run, the same bytes move by one flat
all-gather plus one copy (the floor any sync pays). The modes and the floor are interleaved
round by round, and medians are reported. Also measured:
  - where the time goes: gather (our iterator), engine load (vLLM's loaders, including the
    CPU repack), and the repack alone (oneDNN/sgl packing of the same linear shapes);
  - peak extra RSS (sampled every 2 ms, median over rounds) relative to the largest decoder
    layer's bytes in bf16: of the whole sync, and of the gather alone (our share; the rest
    is vLLM's reload materialising and repacking each module).
Last line: a JSON object with all of it.

    python profiling/bench_sync.py [--rounds 3] [--preset bench-100m]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

import psutil
import ray
import torch
import torch.distributed as dist

from hybrid.controller import (
    Dispatch,
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    register,
)
from hybrid.models import TinyModelConfig, build_tiny_model
from hybrid.rollout.config import RolloutConfig
from hybrid.sharding.config import SyncConfig
from hybrid.sharding.gather import group_parameters, iter_full_parameters
from hybrid.workers.actor_rollout import ActorRolloutWorker
from hybrid.workers.config import ActorConfig, HybridWorkerConfig, ModelConfig

MODES = ("tensor", "layer", "bucket")


class PeakRss:
    """Samples this process's RSS in a thread; `peak - start` is the extra memory."""

    def __init__(self, interval_s: float = 0.002) -> None:
        self.interval_s = interval_s
        self.process = psutil.Process()

    def __enter__(self) -> PeakRss:
        self.start = self.peak = self.process.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.process.memory_info().rss)
            time.sleep(self.interval_s)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.process.memory_info().rss)


class SyncBench(ActorRolloutWorker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def sync_once(self, gather: str, bucket_mb: int) -> dict[str, float]:
        self.modes.configure(SyncConfig(gather=gather, bucket_mb=bucket_mb))  # type: ignore[arg-type]
        dist.barrier()
        with PeakRss() as rss:
            times = self.modes.sync_weights()
        return {
            "sync_s": times.total_s,
            "gather_s": times.gather_s,
            "peak_extra_bytes": rss.peak - rss.start,
        }

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def gather_only(self, gather: str, bucket_mb: int) -> dict[str, float]:
        """The gather alone (each full tensor dropped at once): our share of the peak."""
        dist.barrier()
        with PeakRss() as rss:
            start = time.perf_counter()
            for _ in iter_full_parameters(self.model, gather, torch.bfloat16, bucket_mb << 20):  # type: ignore[arg-type]
                pass
            seconds = time.perf_counter() - start
        return {"gather_only_s": seconds, "gather_peak_extra_bytes": rss.peak - rss.start}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def flat_floor(self) -> float:
        """One flat all-gather of every parameter's bf16 bytes, plus one copy of the result.

        The buffers are allocated and touched once, outside the timing: the floor is the
        cost of moving the bytes, not of first-touch page faults."""
        if not hasattr(self, "_floor_buffers"):
            total = sum(p.numel() for p in self.model.parameters()) * 2
            world = dist.get_world_size()
            local = torch.ones(-(-total // world), dtype=torch.uint8)
            gathered = torch.zeros(local.numel() * world, dtype=torch.uint8)
            self._floor_buffers = (local, gathered, torch.zeros_like(gathered))
        local, gathered, destination = self._floor_buffers
        dist.barrier()
        start = time.perf_counter()
        dist.all_gather_single(gathered, local)
        destination.copy_(gathered)
        return time.perf_counter() - start

    @register(dispatch_mode=Dispatch.RANK_ZERO)
    def model_facts(self, bucket_mb: int) -> dict[str, float]:
        named = list(self.model.named_parameters())
        layers = group_parameters(named, "layer", bucket_mb << 20, torch.bfloat16)
        layer_bytes = max(sum(p.numel() for _, p in g) * 2 for g in layers if len(g) > 1)
        return {
            "parameters": sum(p.numel() for _, p in named),
            "bf16_bytes": sum(p.numel() for _, p in named) * 2,
            "largest_layer_bytes": layer_bytes,
        }

    @register(dispatch_mode=Dispatch.RANK_ZERO)
    def repack_seconds(self) -> float:
        """vLLM's CPU repack of every linear weight of the engine, timed on its own."""
        from vllm.model_executor.layers.linear import LinearBase
        from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

        probes = []
        for module in self.engine.model.modules():
            if isinstance(module, LinearBase):
                shape = (module.output_size_per_partition, module.input_size_per_partition)
                probe = torch.nn.Module()
                probe.weight = torch.nn.Parameter(
                    torch.full(shape, 0.01, dtype=torch.bfloat16), requires_grad=False
                )
                probes.append(probe)
        start = time.perf_counter()
        for probe in probes:
            dispatch_cpu_unquantized_gemm(probe, remove_weight=True)
        return time.perf_counter() - start


# The memory phase serves every allocation above 64 KiB with its own mmap, returned to the OS
# on free: RSS then follows live memory and a transient peak shows instead of hiding in a
# reused heap. It slows allocation down, so the timings come from a run with the default
# allocator. (Ray workers inherit the driver's environment.)
MEMORY_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536"}


def run_rounds(args: argparse.Namespace, phase: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny_model(
            Path(tmp) / "model", TinyModelConfig.preset(args.preset), seed=0
        )
        config = HybridWorkerConfig(
            model=ModelConfig(path=str(model_dir)),
            actor=ActorConfig(),
            rollout=RolloutConfig(max_model_len=128, prompt_length=32, response_length=16),
        )
        print(f"[bench_sync] {phase} phase: starting 2 workers on {args.preset} ...", flush=True)
        group = RayWorkerGroup(RayResourcePool([2]), RayClassWithInitArgs(SyncBench, config))
        try:
            group.init_model()
            facts = group.model_facts(args.bucket_mb)
            group.sync_once("layer", args.bucket_mb)  # warm-up: first load, allocator, packing
            runs: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
            floors = []
            for r in range(args.rounds):
                for mode in MODES:
                    runs[mode].append(group.sync_once(mode, args.bucket_mb)[0])
                    runs[mode][-1].update(group.gather_only(mode, args.bucket_mb)[0])
                floors.append(group.flat_floor()[0])
                times = ", ".join(f"{m} {runs[m][-1]['sync_s']:.3f}s" for m in MODES)
                print(
                    f"  round {r + 1}/{args.rounds}: {times}, floor {floors[-1]:.3f}s", flush=True
                )
            repack_s = statistics.median(group.repack_seconds() for _ in range(args.rounds))
            group.shutdown_engine()
        finally:
            group.shutdown()
    return {"facts": facts, "runs": runs, "floors": floors, "repack_s": repack_s}


def timing_summary(measured: dict[str, Any], preset: str) -> dict[str, Any]:
    facts, runs, floors = measured["facts"], measured["runs"], measured["floors"]
    floor_s = statistics.median(floors)
    result: dict[str, Any] = {
        "model": preset,
        "parameters": facts["parameters"],
        "bf16_mb": round(facts["bf16_bytes"] / 2**20, 1),
        "largest_layer_mb": round(facts["largest_layer_bytes"] / 2**20, 2),
        "flat_allgather_copy_s": round(floor_s, 4),
        "flat_allgather_copy_min_s": round(min(floors), 4),
        "repack_s": round(measured["repack_s"], 4),
    }
    for mode in MODES:
        sync_s = statistics.median(run["sync_s"] for run in runs[mode])
        gather_s = statistics.median(run["gather_s"] for run in runs[mode])
        result[mode] = {
            "sync_s": round(sync_s, 4),
            "ratio_to_floor": round(sync_s / floor_s, 2),
            "gather_s": round(gather_s, 4),
            "engine_load_s": round(sync_s - gather_s, 4),
        }
    best = min(MODES, key=lambda m: result[m]["sync_s"])
    result["best_mode"] = best
    result["best_ratio"] = result[best]["ratio_to_floor"]
    return result


def memory_summary(measured: dict[str, Any]) -> dict[str, dict[str, float]]:
    layer_bytes = measured["facts"]["largest_layer_bytes"]
    summary = {}
    for mode in MODES:
        runs = measured["runs"][mode]
        summary[mode] = {
            "peak_extra_over_largest_layer": round(
                statistics.median(r["peak_extra_bytes"] for r in runs) / layer_bytes, 2
            ),
            "gather_only_peak_over_largest_layer": round(
                statistics.median(r["gather_peak_extra_bytes"] for r in runs) / layer_bytes, 2
            ),
        }
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--preset", default="bench-100m")
    parser.add_argument("--bucket-mb", type=int, default=64)
    parser.add_argument("--phase", choices=["all", "memory"], default="all")
    args = parser.parse_args()

    if args.phase == "memory":
        print(json.dumps(memory_summary(run_rounds(args, "memory"))))
        return
    result = timing_summary(run_rounds(args, "timing"), args.preset)
    ray.shutdown()
    command = [sys.executable, __file__, "--phase", "memory", "--rounds", str(args.rounds)]
    command += ["--preset", args.preset, "--bucket-mb", str(args.bucket_mb)]
    memory_run = subprocess.run(
        command, env={**os.environ, **MEMORY_ENV}, check=True, capture_output=True, text=True
    )
    # Ray may print worker log lines after ours: take the last JSON line.
    memory = json.loads(
        [line for line in memory_run.stdout.splitlines() if line.startswith("{")][-1]
    )
    for mode in MODES:
        result[mode].update(memory[mode])
    print(json.dumps(result))


if __name__ == "__main__":
    main()
