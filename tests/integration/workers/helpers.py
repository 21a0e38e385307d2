"""Building a colocated actor/ref/rollout group on the tiny model, and prompt batches."""

from __future__ import annotations

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
from hybrid.sharding.config import SyncConfig
from hybrid.workers.config import (
    ActorConfig,
    HybridWorkerConfig,
    LoraConfig,
    ModelConfig,
    OptimConfig,
    RefConfig,
)
from hybrid.workers.ref import ReferenceWorker
from tests.integration.workers.hybrid_workers import InspectableActorRollout

PROMPTS = ["1+2=", "3+4=", "12+30=", "7+7=", "9+1=", "5+6="]


def worker_config(
    model_dir: Path, sync: SyncConfig | None = None, lr: float = 1e-3, lora_rank: int = 0
) -> HybridWorkerConfig:
    return HybridWorkerConfig(
        model=ModelConfig(path=str(model_dir), lora=LoraConfig(rank=lora_rank)),
        # Sharded (auto would replicate this model on a CPU): the gather GPUs run.
        actor=ActorConfig(optim=OptimConfig(lr=lr), micro_batch_size=2, hsdp_replicas=1),
        # The same micro-batches on every side: bf16 passes over packed micro-batches are
        # bit-identical across passes only when the rows are packed together alike.
        ref=RefConfig(micro_batch_size=2),
        rollout=RolloutConfig(prompt_length=32, response_length=8, max_model_len=128, seed=0),
        sync=sync or SyncConfig(),
    )


def build_model(root: Path, tied: bool = True) -> Path:
    config = TinyModelConfig.preset("tiny", tie_word_embeddings=tied, initializer_range=0.1)
    return build_tiny_model(root / ("tiny-tied" if tied else "tiny-untied"), config, seed=0)


def start_group(config: HybridWorkerConfig) -> tuple[RayWorkerGroup, dict]:
    cls = create_colocated_worker_cls(
        {
            "actor_rollout": RayClassWithInitArgs(InspectableActorRollout, config),
            "ref": RayClassWithInitArgs(ReferenceWorker, config),
        }
    )
    group = RayWorkerGroup(RayResourcePool([2]), cls)
    views = group.spawn(prefix_set={"actor_rollout", "ref"})
    views["actor_rollout"].init_model()
    views["ref"].init_model()
    return group, views


def stop_group(group: RayWorkerGroup) -> None:
    group.spawn({"actor_rollout"})["actor_rollout"].shutdown_engine()
    group.shutdown()


def prompt_batch(model_dir: Path, texts: list[str], prompt_length: int = 32) -> Batch:
    """Left-padded chat prompts."""
    return chat_prompts(load_tokenizer(model_dir), texts, prompt_length).select(
        ["input_ids", "attention_mask"]
    )


def masked_max_abs_diff(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> float:
    return float(((a - b).abs() * mask).max())
