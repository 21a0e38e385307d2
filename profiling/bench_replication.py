"""The actor's update sharded (FSDP2) or replicated on every rank: what `actor.hsdp_replicas=0`
(auto) picks between (hybrid.workers.replication), and how a replica is held.

Two gloo ranks, one thread each (2 ranks on 2 cores, as the CPU trainer runs), each building
every model from the same checkpoint: `sharded` on a (world,) mesh (actor.hsdp_replicas=1);
on a (world, 1) mesh (actor.hsdp_replicas=world) `hsdp`, FSDP2 with one replica per rank, and
`replicated`, the plain module the trainer builds there (hybrid.workers.replicated: one flat
gradient all-reduce). Every round runs one update of each, alternating, on the same rows; a
round's time is the slowest rank's. Reported: the median seconds of each, replicated /
sharded and replicated / hsdp, plus the models' gradient norms on the first update (equal up
to the order of the sums: the same update).

  --preset tiny (default): the demo's model and step (16 rows a rank of 6-10 prompt and 4-16
      response tokens, one micro-batch), the size auto replicates;
  --preset bench-100m: ~100M parameters, GSM8K-like rows (prompts 60-250, responses 20-400
      tokens), the size auto shards.

Last line: a JSON object.

    python profiling/bench_replication.py [--preset tiny] [--rounds 30]
    python profiling/bench_replication.py --preset bench-100m --rounds 3 --rows-per-rank 4 \
        --micro-batch-size 2
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from hybrid.data import Batch
from hybrid.models import TinyModelConfig, build_tiny_model
from hybrid.models.tokenizer import vocab_size
from hybrid.workers.config import ActorConfig, OptimConfig, WorkerSpec
from hybrid.workers.forward import PassConfig
from hybrid.workers.fsdp import build_fsdp_model, build_optimizer
from hybrid.workers.parallel import fsdp_mesh_shape
from hybrid.workers.policy import PolicyTrainer
from hybrid.workers.replicated import gradient_replicas

# Run as a script: its siblings import by file name, here and in the spawned ranks.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_update import gsm8k_like_batch, padded_rows, rank_share

WORLD = 2
VARIANTS = {"sharded": (1, False), "hsdp": (WORLD, False), "replicated": (WORLD, True)}
"""Variant: (actor.hsdp_replicas, whether a replica is a plain module)."""
DEMO_PROMPT, DEMO_RESPONSE = 16, 16


def demo_like_batch(rows: int, vocab: int, seed: int) -> Batch:
    """The demo step's rows: prompts of 6-10 tokens left-padded to 16, responses of 4-16."""
    return padded_rows(rows, vocab, seed, (6, 10, DEMO_PROMPT), (4, DEMO_RESPONSE, DEMO_RESPONSE))


def _rank_main(
    rank: int, port: int, model_dir: str, vocab: int, args: argparse.Namespace, out: str
) -> None:
    torch.set_num_threads(1)  # 2 ranks on 2 cores
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        from torch.distributed.device_mesh import init_device_mesh

        config = ActorConfig(micro_batch_size=args.micro_batch_size, optim=OptimConfig(lr=1e-4))
        pass_config = PassConfig(args.micro_batch_size, packed=True, chunk_tokens=1024)
        trainers = {}
        for name, (replicas, plain) in VARIANTS.items():
            shape, names = fsdp_mesh_shape(WORLD, replicas)
            mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
            model = build_fsdp_model(
                model_dir,
                mesh,
                torch.device("cpu"),
                param_dtype=torch.float32,
                plain_replicas=plain,
            )
            optimizer = build_optimizer(model, 1e-4, 0.0, (0.9, 0.999), 1e-8)
            trainers[name] = PolicyTrainer(
                model,
                optimizer,
                config,
                WorkerSpec(),
                pass_config,
                reduce_once=True,
                replicas=gradient_replicas(model, mesh),
            )
        rows = args.rows_per_rank * WORLD
        if args.preset == "tiny":
            whole = demo_like_batch(rows, vocab, seed=0)
            batch = whole[rank * args.rows_per_rank : (rank + 1) * args.rows_per_rank]
        else:
            batch = rank_share(gsm8k_like_batch(rows, vocab, seed=0), rank)
        seconds: dict[str, list[float]] = {name: [] for name in VARIANTS}
        first_norms: dict[str, float] = {}
        for round_index in range(args.rounds + 1):  # round 0 warms up
            for name, trainer in trainers.items():
                dist.barrier()
                start = time.perf_counter()
                metrics = trainer.update(batch)
                elapsed = torch.tensor([time.perf_counter() - start])
                dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slowest rank
                if round_index:
                    seconds[name].append(float(elapsed))
                else:
                    first_norms[name] = metrics["actor/grad_norm"]
        if rank == 0:
            Path(out).write_text(json.dumps({"seconds": seconds, "grad_norms": first_norms}))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=("tiny", "bench-100m"), default="tiny")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--rows-per-rank", type=int, default=16)
    parser.add_argument("--micro-batch-size", type=int, default=16)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        vocab = "arithmetic" if args.preset == "tiny" else "text"
        tiny = TinyModelConfig.preset(args.preset, vocab=vocab)
        model_dir = build_tiny_model(Path(tmp) / "model", tiny)
        out = Path(tmp) / "result.json"
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        print(
            f"[bench_replication] {args.preset}, 2 ranks, fp32, {args.rows_per_rank} rows a rank, "
            f"micro-batches of {args.micro_batch_size}, {args.rounds} rounds ...",
            flush=True,
        )
        spawn_args = (port, str(model_dir), vocab_size(vocab), args, str(out))
        mp.spawn(_rank_main, args=spawn_args, nprocs=WORLD)
        measured = json.loads(out.read_text())
    result: dict[str, Any] = {"preset": args.preset, "rows": args.rows_per_rank * WORLD}
    for name, times in measured["seconds"].items():
        result[f"{name}_s"] = round(statistics.median(times), 4)
        result[f"{name}_min_s"] = round(min(times), 4)
        result[f"{name}_grad_norm"] = measured["grad_norms"][name]
    result["replicated_over_sharded"] = round(result["replicated_s"] / result["sharded_s"], 3)
    result["replicated_over_hsdp"] = round(result["replicated_s"] / result["hsdp_s"], 3)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
