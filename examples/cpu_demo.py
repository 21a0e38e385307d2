"""The smallest real thing hybrid does: a colocated generate on CPU.

Two WorkerDict actors each host a vLLM engine (member `rollout`) and a Hugging Face copy of
the same model (member `ref`) in one process. The driver sends prompts through the `rollout`
view (split across the two ranks), then asks the `ref` view for the log-probs of the sampled
tokens: both members computing the same function is what the weight sync will keep true.

    python examples/cpu_demo.py [--num-prompts 8] [--max-tokens 12]
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch

from hybrid.controller import (
    Dispatch,
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    Worker,
    create_colocated_worker_cls,
    register,
)
from hybrid.data import Batch
from hybrid.models import TinyModelConfig, build_tiny_model, load_tokenizer


class VllmGenerator(Worker):
    """An in-process vLLM engine per rank (external_launcher: one engine per process)."""

    def __init__(self, model_dir: str, seed: int) -> None:
        import torch.distributed as dist

        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine must live in this process
        from vllm import LLM

        if not dist.is_initialized():
            dist.init_process_group("gloo")
        self.seed = seed
        self.llm = LLM(
            model=model_dir,
            dtype="bfloat16",
            enforce_eager=True,
            kv_cache_memory_bytes=64 << 20,
            max_model_len=256,
            seed=seed,
            distributed_executor_backend="external_launcher",
        )

    @register(dispatch_mode=Dispatch.DP_COMPUTE)
    def generate(self, batch: Batch, max_tokens: int) -> Batch:
        from vllm import SamplingParams

        # One seed per prompt: reproducible, yet different samples for different prompts.
        params = [
            SamplingParams(
                temperature=1.0, max_tokens=max_tokens, logprobs=0, seed=self.seed + int(i)
            )
            for i in batch["index"]
        ]
        outputs = self.llm.generate([str(p) for p in batch["prompt"]], params, use_tqdm=False)
        samples = [out.outputs[0] for out in outputs]
        return batch.union(
            Batch.from_dict(
                {},
                non_tensors={
                    "prompt_ids": [list(out.prompt_token_ids) for out in outputs],
                    "response": [s.text for s in samples],
                    "response_ids": [list(s.token_ids) for s in samples],
                    "rollout_logprobs": [
                        [lp[t].logprob for t, lp in zip(s.token_ids, s.logprobs, strict=True)]
                        for s in samples
                    ],
                    "rank": [self.rank] * len(samples),
                },
            )
        )


class HFScorer(Worker):
    """The same weights in transformers: log-probs of given tokens (bf16, like the engine)."""

    def __init__(self, model_dir: str) -> None:
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).eval()

    @register(dispatch_mode=Dispatch.DP_COMPUTE)
    @torch.no_grad()
    def log_probs(self, batch: Batch) -> Batch:
        scores = []
        for prompt_ids, response_ids in zip(
            batch["prompt_ids"], batch["response_ids"], strict=True
        ):
            ids = torch.tensor([list(prompt_ids) + list(response_ids)])
            logits = self.model(ids).logits.float()[0, len(prompt_ids) - 1 : -1]
            targets = torch.tensor(response_ids)
            scores.append(torch.log_softmax(logits, -1).gather(-1, targets[:, None])[:, 0].tolist())
        return Batch.from_dict({}, non_tensors={"ref_logprobs": scores})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=12)
    parser.add_argument("--output-dir", type=Path, default=Path("outputs/demo"))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    # Workers inherit the driver's environment: keep vLLM's start-up chatter out of the demo.
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    started = time.monotonic()
    model_dir = build_tiny_model(
        args.output_dir / "tiny-qwen2", TinyModelConfig.preset("tiny"), seed=args.seed
    )
    print(f"[demo] tiny Qwen2 model written to {model_dir}", flush=True)

    print("[demo] starting 2 WorkerDict actors (vLLM engine + HF model in each) ...", flush=True)
    worker_dict_cls = create_colocated_worker_cls(
        {
            "rollout": RayClassWithInitArgs(VllmGenerator, str(model_dir), args.seed),
            "ref": RayClassWithInitArgs(HFScorer, str(model_dir)),
        }
    )
    group = RayWorkerGroup(RayResourcePool([2]), worker_dict_cls)
    try:
        views = group.spawn(prefix_set={"rollout", "ref"})
        print(f"[demo] workers up after {time.monotonic() - started:.1f}s", flush=True)
        tokenizer = load_tokenizer(model_dir)
        prompts = [
            tokenizer.apply_chat_template(
                [{"role": "user", "content": f"{i}+{i + 1}="}],
                add_generation_prompt=True,
                tokenize=False,
            )
            for i in range(args.num_prompts)
        ]
        prompt_batch = Batch.from_dict(
            {}, non_tensors={"prompt": prompts, "index": list(range(len(prompts)))}
        )
        rollouts = views["rollout"].generate(prompt_batch, max_tokens=args.max_tokens)
        scored = rollouts.union(views["ref"].log_probs(rollouts))
    finally:
        group.shutdown()

    max_diff = 0.0
    for i in range(len(scored)):
        engine, ref = (
            torch.tensor(scored["rollout_logprobs"][i]),
            torch.tensor(scored["ref_logprobs"][i]),
        )
        max_diff = max(max_diff, float((engine - ref).abs().max()))
        print(f"  rank {scored['rank'][i]}  {i}+{i + 1}=  ->  {scored['response'][i]!r}")
    print(
        f"[demo] {len(scored)} samples; max |vLLM - HF| log-prob over sampled tokens: {max_diff:.4f}"
    )
    print(f"[demo] done in {time.monotonic() - started:.1f}s")


if __name__ == "__main__":
    main()
