"""Activation memory per rank with and without Ulysses sequence parallelism (issue 45, item 6).

Two gloo ranks (one thread each) hold an FSDP2-sharded Qwen2 (hidden 256, 4 query heads, 2 kv
heads, 4 layers, the 14-token arithmetic vocabulary, so that activations and not logits
dominate) and run one forward + backward of the update's scoring pass over the same long
packed micro-batch (4 rows of --tokens-per-row tokens): sp = 1 (each rank the whole row, as
two data-parallel ranks with the same rows) and sp = 2 (each rank half of it, attention by
all-to-all). Measured: the growth of the process's peak RSS during the pass over the RSS
before it (the ledger's CPU measure, hybrid.memory.ledger: VmHWM reset before the pass), the
larger of the two ranks. Every variant runs in fresh processes (an allocator that kept the
previous pass's pages would hide the next one's growth), variants interleaved A B A B; the
medians and their ratio are printed.

Target: sp = 2 at most 0.6x of sp = 1 (the activations halve; the weights' all-gathers and
the all-to-all buffers do not).

    python profiling/bench_sp_memory.py [--tokens-per-row 2048] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from hybrid.data.sample import Sample, SampleStatus, samples_to_batch
from hybrid.memory.ledger import measure_and_reset, reset_rss_peak
from hybrid.models import TinyModelConfig, build_tiny_model
from hybrid.ports import free_port
from hybrid.workers.forward import PassConfig, score_micro_batch
from hybrid.workers.fsdp import build_fsdp_model
from hybrid.workers.sequence_parallel import SpGroup

WORLD = 2
GIB = 1 << 30
MODEL = {
    "hidden_size": 256,
    "intermediate_size": 1024,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "dtype": "float32",
}


def _batch(tokens_per_row: int) -> Any:
    """4 rows: a 16-token prompt and the rest response, random arithmetic-vocabulary ids."""
    g = torch.Generator().manual_seed(0)
    response = tokens_per_row - 16
    samples = [
        Sample(
            uid=str(i),
            index=0,
            prompt_ids=torch.randint(1, 14, (16,), generator=g).tolist(),
            response_ids=torch.randint(1, 14, (response,), generator=g).tolist(),
            rollout_log_probs=[0.0] * response,
            versions=[0] * response,
            status=SampleStatus.COMPLETED,
        )
        for i in range(4)
    ]
    return samples_to_batch(samples, response, pad_token_id=0, prompt_width=16)


def _rank(rank: int, port: int, sp: int, model_dir: str, tokens_per_row: int, out: str) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("cpu", (WORLD,), mesh_dim_names=("fsdp",))
        fp32 = {"param_dtype": torch.float32, "reduce_dtype": torch.float32}
        model = build_fsdp_model(model_dir, mesh, torch.device("cpu"), **fp32)
        group = SpGroup(dist.group.WORLD, rank, sp) if sp > 1 else None
        config = PassConfig(4, chunk_tokens=1024, sp=group)
        batch = _batch(tokens_per_row)
        mask = batch.tensors["response_mask"]
        # A short pass first: kernels, the all-to-all's first use and the allocator warm up.
        warm = score_micro_batch(model, batch[[0]], config, with_entropy=False)
        (warm.log_probs * mask[[0]]).sum().backward()
        model.zero_grad(set_to_none=True)
        before = measure_and_reset().current_gib
        reset_rss_peak()
        scores = score_micro_batch(model, batch, config, with_entropy=False)
        (-(scores.log_probs * mask).sum() / mask.sum()).backward()
        peak = measure_and_reset().peak_gib
        Path(out, f"rank{rank}.json").write_text(json.dumps({"growth_gib": peak - before}))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _measure(sp: int, model_dir: str, tokens_per_row: int) -> float:
    with tempfile.TemporaryDirectory() as out:
        mp.start_processes(
            _rank,
            args=(free_port("127.0.0.1"), sp, model_dir, tokens_per_row, out),
            nprocs=WORLD,
            start_method="spawn",
        )
        growths = [
            json.loads(Path(out, f"rank{r}.json").read_text())["growth_gib"] for r in range(WORLD)
        ]
    return max(growths)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens-per-row", type=int, default=2048)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        config = TinyModelConfig.preset("tiny", vocab="arithmetic", **MODEL)
        model_dir = str(build_tiny_model(Path(root) / "model", config, seed=0))
        figures: dict[int, list[float]] = {1: [], 2: []}
        for round_index in range(args.rounds):
            for sp in (1, 2):
                growth = _measure(sp, model_dir, args.tokens_per_row)
                figures[sp].append(growth)
                print(f"round {round_index + 1}, sp {sp}: peak RSS growth {growth:.3f} GiB")
    medians = {sp: statistics.median(values) for sp, values in figures.items()}
    tokens = 4 * args.tokens_per_row
    print(
        f"{tokens} tokens in one packed micro-batch: sp 1 {medians[1]:.3f} GiB, sp 2 "
        f"{medians[2]:.3f} GiB a rank, ratio {medians[2] / medians[1]:.2f} (target <= 0.6)"
    )
    print(
        json.dumps(
            {
                "tokens": tokens,
                "sp1_gib": medians[1],
                "sp2_gib": medians[2],
                "ratio": medians[2] / medians[1],
                "runs": figures,
            }
        )
    )


if __name__ == "__main__":
    main()
