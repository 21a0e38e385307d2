"""The hybrid engine on CPU: generate, score, update, re-sync, in two colocated WorkerDicts.

Each WorkerDict actor hosts the FSDP2 actor with its in-process vLLM engine (member
`actor_rollout`) and the frozen reference policy (member `ref`). One round:
  1. generate_sequences: rollout_mode() gathers the actor's shards into vLLM in place, samples,
     and trainer_mode() releases the engine again;
  2. the reference and the actor score the sampled tokens (ref / old log-probs);
  3. update_actor: a PPO-clip step on a toy reward (the share of printable ASCII characters);
  4. the engine's log-probs of the same tokens after the next sync equal the actor's.
Prints the sync error (engine vs actor) each round and the per-phase time and memory.

    python examples/cpu_demo.py [--rounds 3] [--num-prompts 8]
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch

from hybrid.controller import (
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    create_colocated_worker_cls,
)
from hybrid.data import Batch
from hybrid.data.prompts import chat_prompts
from hybrid.models import TinyModelConfig, build_tiny_model, load_tokenizer
from hybrid.rollout.config import RolloutConfig
from hybrid.workers import (
    ActorConfig,
    ActorRolloutWorker,
    HybridWorkerConfig,
    ModelConfig,
    ReferenceWorker,
)


def masked_max(values: torch.Tensor, mask: torch.Tensor) -> float:
    return float((values.abs() * mask).max())


def printable_share(text: str) -> float:
    """Toy reward: the share of printable ASCII characters in a response."""
    return sum(32 <= ord(c) < 127 for c in text) / max(len(text), 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--output-dir", type=Path, default=Path("outputs/demo"))
    args = parser.parse_args()

    # Workers inherit the driver's environment: keep vLLM's start-up chatter out of the demo.
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    started = time.monotonic()
    model_dir = build_tiny_model(
        args.output_dir / "tiny-qwen2",
        TinyModelConfig.preset("tiny", initializer_range=0.1),
        seed=0,
    )
    print(f"[demo] tiny Qwen2 model written to {model_dir}", flush=True)
    config = HybridWorkerConfig(
        model=ModelConfig(path=str(model_dir)),
        actor=ActorConfig(lr=1e-3, micro_batch_size=4),
        rollout=RolloutConfig(prompt_length=32, response_length=12, max_model_len=128),
    )
    worker_dict_cls = create_colocated_worker_cls(
        {
            "actor_rollout": RayClassWithInitArgs(ActorRolloutWorker, config),
            "ref": RayClassWithInitArgs(ReferenceWorker, config),
        }
    )
    print(
        "[demo] starting 2 WorkerDict actors (FSDP2 actor + vLLM engine + reference each) ...",
        flush=True,
    )
    group = RayWorkerGroup(RayResourcePool([2]), worker_dict_cls)
    views = group.spawn(prefix_set={"actor_rollout", "ref"})
    actor, ref = views["actor_rollout"], views["ref"]
    try:
        actor.init_model()
        ref.init_model()
        print(f"[demo] workers up after {time.monotonic() - started:.1f}s", flush=True)
        prompts = chat_prompts(
            load_tokenizer(model_dir), [f"{i}+{i + 1}=" for i in range(args.num_prompts)], 32
        ).select(["input_ids", "attention_mask"])
        for round_index in range(args.rounds):
            rollout = actor.generate_sequences(prompts)
            mask = rollout["response_mask"]
            old = actor.compute_log_prob(rollout)["old_log_probs"]
            ref_lp = ref.compute_ref_log_prob(rollout)["ref_log_prob"]
            rewards = torch.tensor([printable_share(text) for text in rollout["response_text"]])
            advantages = (rewards - rewards.mean()) / (rewards.std() + 1e-6)
            train = rollout.union(Batch.from_dict({"old_log_probs": old, "advantages": advantages}))
            update = actor.update_actor(train)[0]
            engine_after = actor.compute_engine_log_prob(train)["engine_log_probs"]
            actor_after = actor.compute_log_prob(train)["old_log_probs"]
            metrics = actor.pop_metrics()[0]
            print(
                f"[round {round_index + 1}] reward {rewards.mean():.3f}  "
                f"rollout-vs-actor |dlogp| {masked_max(rollout['rollout_log_probs'] - old, mask):.4f}  "
                f"after update: engine-vs-actor {masked_max(engine_after - actor_after, mask):.4f}  "
                f"actor moved {masked_max(actor_after - old, mask):.3f}  "
                f"ref-vs-actor(before) {masked_max(ref_lp - old, mask):.4f}  "
                f"grad_norm {update['actor/grad_norm']:.3f}"
            )
            print(
                "          timing_s: "
                + ", ".join(
                    f"{k.removeprefix('timing_s/')} {v:.2f}"
                    for k, v in metrics.items()
                    if k.startswith("timing_s/")
                )
                + f"  | rss after sync {metrics.get('memory/rollout/ready/rss_gib', 0):.2f} GiB"
            )
        print(f"[demo] sample response: {rollout['response_text'][0]!r}")
        actor.shutdown_engine()
    finally:
        group.shutdown()
    print(f"[demo] done in {time.monotonic() - started:.1f}s")


if __name__ == "__main__":
    main()
