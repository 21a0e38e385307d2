"""CriticWorker: PPO's value model, its own member of the WorkerDict (`critic`).

Built from the actor's parts: the FSDP2 builder (with a value head instead of the LM head),
the optimizer factory, packed micro-batches and token budgets, the offload policy, sharded
checkpoints. Like the reference it leaves the device after each of its phases when its
offload flags say so, so that generation finds the memory free; every phase is marked in the
process's memory ledger (`values/...`, `update_critic/...`).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from transformers import PretrainedConfig

from hybrid.controller import Dispatch, Worker, register
from hybrid.data import Batch
from hybrid.dtypes import Hardware, resolve_dtype, torch_dtype
from hybrid.memory.components import (
    ByDevice,
    gradient_bytes,
    optimizer_state_bytes,
    parameter_bytes,
)
from hybrid.memory.ledger import process_ledger
from hybrid.model_families import model_hidden_size
from hybrid.sharding.offload import Offloader
from hybrid.workers.checkpoint import load_checkpoint, save_checkpoint
from hybrid.workers.config import HybridWorkerConfig
from hybrid.workers.export import export_hf_model
from hybrid.workers.forward import pass_config
from hybrid.workers.fsdp import build_fsdp_model, build_optimizer, warmup_scheduler
from hybrid.workers.kernels import plan_for_model
from hybrid.workers.parallel import init_trainer_parallel
from hybrid.workers.replicated import gradient_replicas
from hybrid.workers.value import ValueTrainer, compute_values

SCHEDULER_KEY = "critic_lr_scheduler"


def check_critic_model(critic_path: str, actor_path: str) -> None:
    """Fail before any worker starts, naming critic.model.path, unless the critic's checkpoint
    is a decoder transformers can put a value head on and reads the actor's token ids."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES,
    )

    try:
        config = AutoConfig.from_pretrained(critic_path)
    except (OSError, ValueError) as error:
        raise ValueError(
            f"critic.model.path={critic_path!r} is not a Hugging Face model directory: {error}"
        ) from None
    if config.model_type not in MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES:
        raise ValueError(
            f"critic.model.path={critic_path!r}: a {config.model_type!r} model has no "
            "token-classification (value head) class in transformers; use a decoder such as "
            "Qwen2, Llama or Mistral"
        )
    actor_vocab = AutoConfig.from_pretrained(actor_path).vocab_size
    if config.vocab_size != actor_vocab:
        raise ValueError(
            f"critic.model.path={critic_path!r}: vocabulary of {config.vocab_size} tokens, the "
            f"actor's ({actor_path}) has {actor_vocab}: the critic reads the actor's token ids"
        )


class CriticWorker(Worker):
    def __init__(self, config: HybridWorkerConfig) -> None:
        self.config = config
        # The process's ledger: shared with actor_rollout, which drains it.
        self.ledger = process_ledger(self.rank, self.rank_env.node)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        c, critic = self.config, self.config.critic
        parallel = init_trainer_parallel(self.rank_env, c)
        self.device = parallel.device
        precision = critic.precision
        dtype = resolve_dtype(
            precision.param_dtype,
            "trainer",
            Hardware.detect(self.device),
            model_hidden_size(critic.model.path) if critic.model.path else None,
        )
        if critic.model.path is None:
            raise ValueError("critic.model.path is unresolved (the trainer sets the actor's)")
        self.kernels = plan_for_model("critic", critic, critic.model.path, self.device)
        self.model = build_fsdp_model(
            critic.model.path,
            parallel.fsdp_mesh,
            self.device,
            param_dtype=torch_dtype(dtype),
            reduce_dtype=torch_dtype(precision.reduce_dtype),
            master_dtype=torch_dtype(precision.master_dtype),
            attn_implementation=c.model.attn_implementation,
            gradient_checkpointing=critic.gradient_checkpointing,
            value_head=True,
            expert_mesh=parallel.expert_mesh,
            sp_size=parallel.sp_size,
            kernels=self.kernels,
        )
        optim = critic.optim
        self.optimizer = build_optimizer(
            self.model, optim.lr, optim.weight_decay, optim.betas, optim.eps
        )
        self.scheduler = warmup_scheduler(self.optimizer, optim.lr_warmup_steps)
        self.forward_pass = pass_config(
            c.model,
            critic.micro_batch_size,
            critic.use_dynamic_bsz,
            critic.forward_max_token_len_per_gpu,
            "critic.forward_max_token_len_per_gpu",
            sp=parallel.sp,
        )
        update_pass = pass_config(
            c.model,
            critic.micro_batch_size,
            critic.use_dynamic_bsz,
            critic.ppo_max_token_len_per_gpu,
            "critic.ppo_max_token_len_per_gpu",
            sp=parallel.sp,
        )
        self.trainer = ValueTrainer(
            self.model,
            self.optimizer,
            self.scheduler,
            critic,
            c.derived,
            update_pass,
            self.ledger,
            parallel.data_parallel_group,
            gradient_replicas(self.model, parallel.fsdp_mesh),
        )
        self.ledger.track("critic", self._components)
        self.ledger.record("init/critic")
        self.offloader = Offloader(
            self.model,
            self.optimizer,
            self.device,
            critic.offload.param_offload,
            critic.offload.optimizer_offload,
        )
        self.offloader.offload_optimizer()
        self.offloader.offload_params()

    def _components(self) -> dict[str, ByDevice]:
        return {
            "critic_params": parameter_bytes(self.model),
            "critic_grads": gradient_bytes(self.model),
            "critic_optimizer_state": optimizer_state_bytes(self.optimizer),
        }

    @register(dispatch_mode=Dispatch.TRAIN_DP)
    def compute_values(self, batch: Batch) -> Batch:
        """The critic's value of every response token (the state before it)."""
        with self.offloader.phase("values", self.ledger):
            self.model.eval()
            values = compute_values(self.model, batch.to(self.device), self.forward_pass)
            self.ledger.record("values/forward", reuse_components=True)
        return Batch.from_dict({"values": values.cpu()})

    @register(dispatch_mode=Dispatch.TRAIN_DP)
    def update_critic(self, batch: Batch) -> dict[str, float]:
        with self.offloader.phase("update_critic", self.ledger, with_optimizer=True):
            return self.trainer.update(batch.to(self.device))

    @register(dispatch_mode=Dispatch.RANK_ZERO)
    def export_hf(self, path: str) -> str:
        """The critic as a Hugging Face directory at `path` (written by rank 0): bf16 weights
        and a config naming the value-head class (AutoModelForTokenClassification loads it,
        num_labels=1)."""
        from transformers.models.auto.modeling_auto import (
            MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES,
        )

        config: PretrainedConfig = copy.deepcopy(self.model.config)  # type: ignore[assignment]
        config.architectures = [MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES[config.model_type]]
        assert self.config.critic.model.path is not None
        with self.offloader.phase("export_hf", self.ledger):
            return str(export_hf_model(self.model, self.config.critic.model.path, path, config))

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, path: str) -> None:
        with self.offloader.phase("save_checkpoint", self.ledger, with_optimizer=True):
            extra = {SCHEDULER_KEY: self.scheduler.state_dict()}
            save_checkpoint(Path(path), self.model, self.optimizer, extra)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, path: str) -> dict[str, Any]:
        with self.offloader.phase("load_checkpoint", self.ledger, with_optimizer=True):
            extra = load_checkpoint(Path(path), self.model, self.optimizer)
        self.scheduler.load_state_dict(extra[SCHEDULER_KEY])
        return extra
