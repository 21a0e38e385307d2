"""Trainer-side speed: padded vs packed vs packed + token-budget micro-batches.

Default mode: the actor update (forward, backward, optimizer step) and the no-grad log-prob
pass of a ~100M-parameter Qwen2 (`bench-100m`) under FSDP2 on 2 CPU ranks (gloo, one thread
each), on a batch whose lengths follow a GSM8K-like spread (prompts 60-250 tokens, responses
20-400), left/right-padded as the rollout delivers it and split over the ranks as the trainer
splits it (equal rows, near-equal tokens). Variants, interleaved round by round:
  padded:          fixed micro-batches of rows, padding included, full logits (the old path)
  packed:          the same micro-batches, valid tokens only, chunked log-prob head
  packed_dynamic:  packed, micro-batches by token budget (--max-tokens per micro-batch)
Tokens/s counts valid tokens (prompt + response) over the slowest rank's median seconds.
Target: packed_dynamic >= 1.5x padded on the update.

--logprob-memory: peak memory of the no-grad log-prob pass of one process on a model with a
32k vocabulary, full logits vs the chunked head (same packed inputs; the padded full-logit
pass beside them). Peak = the highest RSS sampled every millisecond during the pass, minus
the RSS before it. Target: chunked <= 1/4 of full.

--settings: the update (packed micro-batches of --micro-batch-size rows) under the kernel
settings side by side, interleaved round by round in one run, on the same rows:
  eager:                  the update as built (the baseline)
  compiled:               each decoder layer compiled (actor.compile=on, inductor)
  reduce_once:            gradients reduce-scattered once per optimizer step (actor.grad_reduce=step)
  compiled+reduce_once:   both
  fused:                  liger-kernel's ops (actor.fused_kernels=on): CUDA only, listed as skipped on CPU
Tokens/s over the slowest rank's median seconds, the ratio to eager, and the graphs compiled
after the first (warm-up) round: 0 when nothing recompiles. --dtype picks the compute dtype
(bfloat16 default, float32).

Last line: a JSON object with every figure.

    python profiling/bench_update.py [--rounds 3] [--rows-per-rank 8]
    python profiling/bench_update.py --logprob-memory [--memory-rows 32]
    python profiling/bench_update.py --settings [--dtype float32] [--rounds 3]
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
from hybrid.data.sample import position_ids_from_mask
from hybrid.models import TinyModelConfig, build_tiny_model
from hybrid.trainer.balance import balanced_order
from hybrid.workers import varlen_attention
from hybrid.workers.compiled_blocks import compiled_graphs
from hybrid.workers.config import ActorConfig, OptimConfig, WorkerSpec
from hybrid.workers.forward import PassConfig, score_responses
from hybrid.workers.fsdp import build_fsdp_model, build_optimizer
from hybrid.workers.kernels import KernelPlan
from hybrid.workers.policy import PolicyTrainer

# Run as a script: its siblings import by file name, here and in the spawned ranks.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from sampler import PeakRss

PROMPT_WIDTH, RESPONSE_WIDTH = 250, 400
WORLD = 2


def padded_rows(
    rows: int, vocab: int, seed: int, prompts: tuple[int, int, int], responses: tuple[int, int, int]
) -> Batch:
    """Rollout-like rows of random tokens: prompts of `prompts` = (shortest, longest, width)
    tokens left-padded to width, responses of (shortest, longest, width) right-padded, the
    rollout's log-probs and a group advantage per row (the on-policy update's inputs)."""
    (p_low, p_high, p_width), (r_low, r_high, r_width) = prompts, responses
    g = torch.Generator().manual_seed(seed)
    prompt_lengths = torch.randint(p_low, p_high + 1, (rows,), generator=g)
    response_lengths = torch.randint(r_low, r_high + 1, (rows,), generator=g)
    prompt_mask = (torch.arange(p_width) >= p_width - prompt_lengths[:, None]).long()
    response_mask = (torch.arange(r_width) < response_lengths[:, None]).long()
    mask = torch.cat([prompt_mask, response_mask], dim=1)
    ids = torch.randint(1, vocab, mask.shape, generator=g) * mask
    return Batch.from_dict(
        {
            "input_ids": ids,
            "attention_mask": mask,
            "position_ids": position_ids_from_mask(mask),
            "responses": ids[:, p_width:],
            "response_mask": response_mask,
            "rollout_log_probs": -torch.rand((rows, r_width), generator=g) - 1.0,
            "advantages": torch.randn(rows, generator=g),
        }
    )


def gsm8k_like_batch(rows: int, vocab: int, seed: int) -> Batch:
    """Prompts of 60-250 tokens left-padded to 250, responses of 20-400 right-padded to 400,
    old log-probs equal to the rollout's."""
    batch = padded_rows(rows, vocab, seed, (60, PROMPT_WIDTH, PROMPT_WIDTH),
                        (20, RESPONSE_WIDTH, RESPONSE_WIDTH))  # fmt: skip
    old = Batch.from_dict({"old_log_probs": batch.tensors["rollout_log_probs"]})
    return batch.union(old)


def rank_share(batch: Batch, rank: int) -> Batch:
    """This rank's rows, split as the trainer splits a step: equal row counts, near-equal
    token sums (hybrid.trainer.balance)."""
    order = balanced_order(batch.tensors["attention_mask"].sum(-1), WORLD)
    rows = len(batch) // WORLD
    return batch[order[rank * rows : (rank + 1) * rows]]


def variants(micro_batch_size: int, max_tokens: int) -> dict[str, PassConfig]:
    return {
        "padded": PassConfig(micro_batch_size, packed=False, chunk_tokens=0),
        "packed": PassConfig(micro_batch_size, packed=True, chunk_tokens=1024),
        "packed_dynamic": PassConfig(
            micro_batch_size, packed=True, chunk_tokens=1024, max_tokens=max_tokens
        ),
    }


# --- update speed (2 gloo ranks) ---------------------------------------------------------


def _rank_main(rank: int, port: int, model_dir: str, args: argparse.Namespace, out: str) -> None:
    torch.set_num_threads(1)  # 2 ranks on 2 cores
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("cpu", (WORLD,), mesh_dim_names=("fsdp",))
        model = build_fsdp_model(model_dir, mesh, torch.device("cpu"))
        optimizer = build_optimizer(model, 1e-7, 0.0, (0.9, 0.999), 1e-8)
        config = ActorConfig(micro_batch_size=args.micro_batch_size, optim=OptimConfig(lr=1e-7))
        batch = rank_share(gsm8k_like_batch(args.rows_per_rank * WORLD, 272, seed=0), rank)
        passes = variants(args.micro_batch_size, args.max_tokens)
        seconds: dict[str, dict[str, list[float]]] = {
            name: {"update": [], "log_prob": []} for name in passes
        }
        for round_index in range(args.rounds + 1):  # round 0 warms up
            for name, pass_config in passes.items():
                trainer = PolicyTrainer(model, optimizer, config, WorkerSpec(), pass_config)
                for kind in ("update", "log_prob"):
                    dist.barrier()
                    start = time.perf_counter()
                    if kind == "update":
                        trainer.update(batch)
                    else:
                        model.eval()
                        score_responses(model, batch, pass_config, with_entropy=True)
                    elapsed = torch.tensor([time.perf_counter() - start])
                    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slowest rank
                    if round_index:
                        seconds[name][kind].append(float(elapsed))
                if rank == 0:
                    print(
                        f"  round {round_index}/{args.rounds} {name}: update "
                        f"{seconds[name]['update'][-1] if round_index else float('nan'):.2f}s",
                        flush=True,
                    )
        tokens = torch.tensor([float(batch.tensors["attention_mask"].sum())])
        dist.all_reduce(tokens)
        if rank == 0:
            Path(out).write_text(json.dumps({"seconds": seconds, "tokens": float(tokens)}))
    finally:
        dist.destroy_process_group()


def update_speed(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny_model(Path(tmp) / "model", TinyModelConfig.preset("bench-100m"))
        out = Path(tmp) / "result.json"
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        print(f"[bench_update] 2 ranks, bench-100m, {args.rows_per_rank} rows per rank ...")
        mp.spawn(_rank_main, args=(port, str(model_dir), args, str(out)), nprocs=WORLD)
        measured = json.loads(out.read_text())
    tokens = measured["tokens"]
    result: dict[str, Any] = {
        "model": "bench-100m",
        "rows": args.rows_per_rank * WORLD,
        "valid_tokens": tokens,
        "padded_tokens": args.rows_per_rank * WORLD * (PROMPT_WIDTH + RESPONSE_WIDTH),
        "rounds": args.rounds,
    }
    for kind in ("update", "log_prob"):
        for name, times in measured["seconds"].items():
            median = statistics.median(times[kind])
            result[f"{kind}/{name}_s"] = round(median, 3)
            result[f"{kind}/{name}_tokens_per_s"] = round(tokens / median, 1)
        for name in ("packed", "packed_dynamic"):
            result[f"{kind}/ratio_{name}_over_padded"] = round(
                result[f"{kind}/{name}_tokens_per_s"] / result[f"{kind}/padded_tokens_per_s"], 2
            )
    result["target_ratio"] = 1.5
    result["target_met"] = result["update/ratio_packed_dynamic_over_padded"] >= 1.5
    return result


# --- kernel settings (2 gloo ranks) -------------------------------------------------------

SETTINGS = ("eager", "compiled", "reduce_once", "compiled+reduce_once")


def _settings_main(
    rank: int, port: int, model_dir: str, args: argparse.Namespace, out: str
) -> None:
    torch.set_num_threads(1)  # 2 ranks on 2 cores
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("cpu", (WORLD,), mesh_dim_names=("fsdp",))
        dtype = getattr(torch, args.dtype)
        plans = {
            "eager": KernelPlan("actor"),
            "compiled": KernelPlan("actor", compile=True, compile_required=True),
        }
        models = {
            name: build_fsdp_model(
                model_dir, mesh, torch.device("cpu"), param_dtype=dtype, kernels=plan
            )
            for name, plan in plans.items()
        }
        config = ActorConfig(micro_batch_size=args.micro_batch_size, optim=OptimConfig(lr=1e-7))
        pass_config = PassConfig(args.micro_batch_size, packed=True, chunk_tokens=1024)
        trainers = {}
        for name in SETTINGS:
            model = models["compiled" if "compiled" in name else "eager"]
            optimizer = build_optimizer(model, 1e-7, 0.0, (0.9, 0.999), 1e-8)
            trainers[name] = PolicyTrainer(
                model, optimizer, config, WorkerSpec(), pass_config,
                reduce_once="reduce_once" in name,
            )  # fmt: skip
        batch = rank_share(gsm8k_like_batch(args.rows_per_rank * WORLD, 272, seed=0), rank)
        seconds: dict[str, list[float]] = {name: [] for name in SETTINGS}
        graphs_after_warmup = 0
        for round_index in range(args.rounds + 1):  # round 0 warms up (and compiles)
            for name, trainer in trainers.items():
                dist.barrier()
                start = time.perf_counter()
                trainer.update(batch)
                elapsed = torch.tensor([time.perf_counter() - start])
                dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slowest rank
                if round_index:
                    seconds[name].append(float(elapsed))
                if rank == 0:
                    print(
                        f"  round {round_index}/{args.rounds} {name}: {float(elapsed):.2f}s",
                        flush=True,
                    )
            if round_index == 0:
                graphs_after_warmup = compiled_graphs()
        if rank == 0:
            tokens = int(
                gsm8k_like_batch(args.rows_per_rank * WORLD, 272, seed=0)
                .tensors["attention_mask"]
                .sum()
            )
            result = {
                "seconds": seconds,
                "tokens": tokens,
                "recompiles_after_warmup": compiled_graphs() - graphs_after_warmup,
                "graphs_at_warmup": graphs_after_warmup,
            }
            Path(out).write_text(json.dumps(result))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def kernel_settings(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny_model(Path(tmp) / "model", TinyModelConfig.preset("bench-100m"))
        out = Path(tmp) / "result.json"
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        print(
            f"[bench_update] settings: 2 ranks, bench-100m, {args.dtype}, "
            f"{args.rows_per_rank} rows per rank, micro-batches of {args.micro_batch_size} ..."
        )
        print("  fused: skipped (liger-kernel's kernels run on CUDA; this run is on the CPU)")
        mp.spawn(_settings_main, args=(port, str(model_dir), args, str(out)), nprocs=WORLD)
        measured = json.loads(out.read_text())
    tokens = measured["tokens"]
    result: dict[str, Any] = {
        "model": "bench-100m",
        "dtype": args.dtype,
        "rows": args.rows_per_rank * WORLD,
        "valid_tokens": tokens,
        "micro_batch_size": args.micro_batch_size,
        "rounds": args.rounds,
        "fused": "skipped: CUDA only",
        "recompiles_after_warmup": measured["recompiles_after_warmup"],
    }
    for name, times in measured["seconds"].items():
        result[f"{name}_s"] = round(statistics.median(times), 3)
        result[f"{name}_tokens_per_s"] = round(tokens / statistics.median(times), 1)
    for name in SETTINGS[1:]:
        result[f"ratio_{name}_over_eager"] = round(
            result[f"{name}_tokens_per_s"] / result["eager_tokens_per_s"], 3
        )
    return result


# --- log-prob pass memory (one process) ---------------------------------------------------


def logprob_memory(args: argparse.Namespace) -> dict[str, Any]:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=args.vocab,
        hidden_size=768,
        intermediate_size=3072,
        num_hidden_layers=4,
        num_attention_heads=12,
        num_key_value_heads=4,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
    )
    config._attn_implementation = varlen_attention.register()  # as build_fsdp_model does
    model = Qwen2ForCausalLM(config).to(torch.bfloat16).eval()
    batch = gsm8k_like_batch(args.memory_rows, args.vocab, seed=0)
    mib = {"padded_full": [], "packed_full": [], "packed_chunked": []}
    configs = {
        "padded_full": PassConfig(args.memory_rows, packed=False, chunk_tokens=0),
        "packed_full": PassConfig(args.memory_rows, packed=True, chunk_tokens=0),
        "packed_chunked": PassConfig(args.memory_rows, packed=True, chunk_tokens=1024),
    }
    print(f"[bench_update] log-prob pass memory: vocab {args.vocab}, {len(batch)} rows ...")
    for round_index in range(args.rounds + 1):
        for name, pass_config in configs.items():
            with PeakRss(interval_s=0.001) as rss:
                score_responses(model, batch, pass_config, with_entropy=True)
            if round_index:  # round 0 warms up (allocator, kernels)
                mib[name].append(rss.extra_bytes / 2**20)
                print(
                    f"  round {round_index} {name}: peak +{rss.extra_bytes / 2**20:.0f} MiB",
                    flush=True,
                )
    result: dict[str, Any] = {
        "vocab": args.vocab,
        "rows": len(batch),
        "valid_tokens": int(batch.tensors["attention_mask"].sum()),
        "response_tokens": int(batch.tensors["response_mask"].sum()),
    }
    for name, values in mib.items():
        result[f"{name}_peak_mib"] = round(statistics.median(values), 1)
    result["ratio_chunked_over_packed_full"] = round(
        result["packed_chunked_peak_mib"] / result["packed_full_peak_mib"], 3
    )
    result["ratio_chunked_over_padded_full"] = round(
        result["packed_chunked_peak_mib"] / result["padded_full_peak_mib"], 3
    )
    result["target_ratio"] = 0.25
    result["target_met"] = result["ratio_chunked_over_packed_full"] <= 0.25
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rows-per-rank", type=int, default=8)
    parser.add_argument("--micro-batch-size", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=4096)
    parser.add_argument("--logprob-memory", action="store_true")
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument("--memory-rows", type=int, default=32, help="rows of the memory pass")
    parser.add_argument("--settings", action="store_true", help="kernel settings side by side")
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    args = parser.parse_args()
    if args.logprob_memory:
        result = logprob_memory(args)
    elif args.settings:
        result = kernel_settings(args)
    else:
        result = update_speed(args)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
