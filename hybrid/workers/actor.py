"""ActorWorker: the FSDP2 actor of one WorkerDict, without a rollout engine.

The training half every placement shares: the model and its optimizer, the offload policy,
the scoring and update passes (PolicyTrainer), checkpoints and exports. `ActorRolloutWorker`
adds the in-process engine and the mode switch (colocated); the split placement's trainer
workers use this class as it is and publish their weights through a transport
(`hybrid.workers.trainer_worker`). Training-side work runs inside `self._phase(...)`, which onloads
and offloads by config and marks the memory ledger.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, TypedDict

import torch

from hybrid.controller import Dispatch, Worker, register
from hybrid.data import Batch
from hybrid.data.sample import ROUTED_EXPERTS
from hybrid.dtypes import ComputeDtypes, Dtype, Hardware, torch_dtype
from hybrid.memory.components import (
    ByDevice,
    full_parameter_count,
    gradient_bytes,
    optimizer_state_bytes,
    parameter_bytes,
)
from hybrid.memory.ledger import process_ledger
from hybrid.memory.records import MemoryRecord
from hybrid.models.routers import find_routers
from hybrid.sharding.lora_files import write_adapter
from hybrid.sharding.lora_sync import LoraSync, adapter_directory
from hybrid.sharding.offload import Offloader
from hybrid.workers.checkpoint import load_checkpoint, save_checkpoint
from hybrid.workers.config import HybridWorkerConfig
from hybrid.workers.export import export_hf_model, write_hf_model
from hybrid.workers.forward import pass_config, score_responses
from hybrid.workers.fsdp import build_fsdp_model, build_optimizer, warmup_scheduler
from hybrid.workers.grad_reduce import (
    device_memory_bytes,
    reduces_once_per_step,
    trainable_gradient_bytes,
)
from hybrid.workers.kernels import plan_for_model
from hybrid.workers.lora import adapter_spec, adapters_disabled, expert_adapters
from hybrid.workers.parallel import ParallelState, init_trainer_parallel
from hybrid.workers.policy import PolicyTrainer
from hybrid.workers.replicated import gradient_replicas
from hybrid.workers.routing import MoeRouting
from hybrid.workers.sft import SftTrainer, reset_optimizer, set_learning_rate
from hybrid.workers.vision_inputs import vision_family

SCHEDULER_KEY = "actor_lr_scheduler"
"""The warm-up's position in a checkpoint's extra state."""


class WorkerFacts(TypedDict):
    """What a worker resolved at start-up (`describe`)."""

    parameters: int
    hardware: str
    actor_dtype: Dtype
    ref_dtype: Dtype
    rollout_dtype: Dtype
    kernels: str
    """The actor's fused ops and compiled layers (hybrid.workers.kernels)."""
    hsdp_replicas: int
    """The trainer's model replicas, actor.hsdp_replicas with auto resolved (1: plain FSDP)."""
    sync_strategy: str
    weight_layout: str
    weight_notes: list[str]
    """What the engine stores apart from what the sync sends (hybrid.rollout.weights)."""


class ActorWorker(Worker):
    def __init__(self, config: HybridWorkerConfig) -> None:
        self.config = config
        self.ledger = process_ledger(self.rank, self.rank_env.node)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        c = self.config
        self.parallel: ParallelState = init_trainer_parallel(self.rank_env, c)
        device = self.parallel.device
        self.hardware = Hardware.detect(device)
        self.dtypes: ComputeDtypes = c.compute_dtypes(self.hardware)
        self.kernels = plan_for_model("actor", c.actor, c.model.path, device)
        self.model = build_fsdp_model(
            c.model.path,
            self.parallel.fsdp_mesh,
            device,
            param_dtype=torch_dtype(self.dtypes.actor),
            reduce_dtype=torch_dtype(c.actor.precision.reduce_dtype),
            master_dtype=torch_dtype(c.actor.precision.master_dtype),
            attn_implementation=c.model.attn_implementation,
            gradient_checkpointing=c.model.gradient_checkpointing,
            lora=c.model.lora,
            expert_mesh=self.parallel.expert_mesh,
            sp_size=self.parallel.sp_size,
            freeze_vision_tower=c.model.freeze_vision_tower,
            kernels=self.kernels,
        )
        vision = vision_family(self.model, c.model.path)
        a, optim = c.actor, c.actor.optim
        self.optimizer = build_optimizer(
            self.model, optim.lr, optim.weight_decay, optim.betas, optim.eps
        )
        self.ledger.track("actor", self._actor_components)
        self.ledger.record("init/actor")
        self.offloader = Offloader(
            self.model, self.optimizer, device, a.offload.param_offload, a.offload.optimizer_offload
        )
        lora = c.model.lora
        self.lora_sync = (
            LoraSync(
                self.model,
                adapter_spec(self.model, lora, c.model.path),
                adapter_directory(self.rank),
                torch_dtype(self.dtypes.rollout),
                expert_adapters(self.model),
            )
            if lora.enabled
            else None
        )
        self.update_pass = pass_config(
            c.model,
            a.micro_batch_size,
            a.use_dynamic_bsz,
            a.ppo_max_token_len_per_gpu,
            "actor.ppo_max_token_len_per_gpu",
            sp=self.parallel.sp,
            vision=vision,
            fused_head=self.kernels.fused_head,
        )
        self.log_prob_pass = pass_config(
            c.model,
            a.micro_batch_size,
            a.use_dynamic_bsz,
            a.log_prob_max_token_len_per_gpu,
            "actor.log_prob_max_token_len_per_gpu",
            sp=self.parallel.sp,
            vision=vision,
            fused_head=self.kernels.fused_head,
        )
        self.ref_pass = pass_config(
            c.model,
            c.ref.micro_batch_size,
            c.ref.use_dynamic_bsz,
            c.ref.log_prob_max_token_len_per_gpu,
            "ref.log_prob_max_token_len_per_gpu",
            sp=self.parallel.sp,
            vision=vision,
            fused_head=self.kernels.fused_head,
        )
        replicas = gradient_replicas(self.model, self.parallel.fsdp_mesh)
        routers = find_routers(self.model)
        self.routing = MoeRouting(routers) if routers else None
        """Hooks on the MoE routers: replay, load and drift figures (None: a dense model)."""
        self.trainer = PolicyTrainer(
            self.model,
            self.optimizer,
            c.actor,
            c.derived,
            self.update_pass,
            self.ledger,
            self.routing,
            self.parallel.data_parallel_group,
            warmup_scheduler(self.optimizer, optim.lr_warmup_steps),
            reduce_once=reduces_once_per_step(
                a.grad_reduce,
                world=self.parallel.fsdp_mesh.size(),
                gradient_bytes=trainable_gradient_bytes(self.model),
                device_bytes=device_memory_bytes(device),
            ),
            replicas=replicas,
        )
        # SFT trains the same model with the same optimizer and micro-batches (docs/sft.md).
        self.sft = SftTrainer(
            self.model,
            self.optimizer,
            self.update_pass,
            optim.max_grad_norm,
            self.ledger,
            self.parallel.data_parallel_group,
            replicas,
        )
        self._init_rollout()
        self.offloader.offload_optimizer()
        self.offloader.offload_params()

    def _init_rollout(self) -> None:
        """The rollout side of the worker: none here (the colocated worker builds its engine)."""

    def _phase(
        self, name: str, with_optimizer: bool = False, caller: str | None = None
    ) -> AbstractContextManager[None]:
        """Training-side work with the actor on device (`caller`: the method a mode error
        names, where a mode switch exists)."""
        return self.offloader.phase(name, self.ledger, with_optimizer)

    def _actor_components(self) -> dict[str, ByDevice]:
        return {
            "actor_params": parameter_bytes(self.model),
            "actor_grads": gradient_bytes(self.model),
            "optimizer_state": optimizer_state_bytes(self.optimizer),
        }

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def describe(self) -> WorkerFacts:
        """What this worker resolved at start-up, for the start-up summary and config.json."""
        return {
            "parameters": full_parameter_count(self.model),
            "hardware": self.hardware.description,
            "actor_dtype": self.dtypes.actor,
            "ref_dtype": self.dtypes.ref,
            "rollout_dtype": self.dtypes.rollout,
            "kernels": self.kernels.describe(),
            "hsdp_replicas": self.parallel.hsdp_replicas,
            "sync_strategy": "",
            "weight_layout": "",
            "weight_notes": [],
        }

    # --- training ------------------------------------------------------------------------

    @register(dispatch_mode=Dispatch.TRAIN_DP)
    def compute_log_prob(self, batch: Batch) -> Batch:
        """The actor's log-probs and entropy of `responses` (old_log_probs for PPO)."""
        with self._phase("old_log_prob", caller="compute_log_prob"):
            self.model.eval()
            replay = self.config.actor.router_replay
            # measure / record (R2): this pass records the experts; rollout (R3): it computes
            # with the engine's, as the update will.
            scored = score_responses(
                self.model,
                batch.to(self.parallel.device),
                self.log_prob_pass,
                with_entropy=True,
                routing=self.routing if replay != "off" else None,
                replay_routing=replay == "rollout",
            )
            # A no-grad forward changes nothing a component source counts.
            self.ledger.record("old_log_prob/forward", reuse_components=True)
        out = {"old_log_probs": scored["log_probs"].cpu(), "entropys": scored["entropy"].cpu()}
        if ROUTED_EXPERTS in scored:  # the experts the update replays or compares with
            out[ROUTED_EXPERTS] = scored[ROUTED_EXPERTS]
        return Batch.from_dict(out)

    @register(dispatch_mode=Dispatch.TRAIN_DP)
    def compute_ref_log_prob(self, batch: Batch) -> Batch:
        """The reference policy's log-probs with LoRA: the actor with its adapters disabled,
        i.e. the frozen base model (no second copy of the weights)."""
        if self.lora_sync is None:
            raise RuntimeError(
                "actor_rollout.compute_ref_log_prob serves LoRA runs (the base is the "
                "reference); without LoRA call the ref worker's compute_ref_log_prob"
            )
        with self._phase("ref", caller="compute_ref_log_prob"):
            self.model.eval()
            with adapters_disabled(self.model):
                scored = score_responses(
                    self.model, batch.to(self.parallel.device), self.ref_pass, with_entropy=False
                )
            self.ledger.record("ref/forward", reuse_components=True)
        return Batch.from_dict({"ref_log_prob": scored["log_probs"].cpu()})

    @register(dispatch_mode=Dispatch.TRAIN_DP)
    def update_actor(self, batch: Batch) -> dict[str, float]:
        with self._phase("update", with_optimizer=True, caller="update_actor"):
            return self.trainer.update(batch.to(self.parallel.device))

    @register(dispatch_mode=Dispatch.TRAIN_DP)
    def sft_update(self, batch: Batch, lr: float) -> dict[str, float]:
        """One SFT optimizer step on this rank's rows (hybrid.workers.sft) at learning rate
        `lr` (sft.lr; end_sft puts actor.optim.lr back)."""
        with self._phase("sft_update", with_optimizer=True, caller="sft_update"):
            set_learning_rate(self.optimizer, lr)
            return self.sft.update(batch.to(self.parallel.device))

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def end_sft(self) -> None:
        """The SFT stage is over: actor.optim.lr again, and no Adam moments (RL starts from
        the SFT weights with a fresh optimizer)."""
        optim = self.config.actor.optim
        reset_optimizer(self.optimizer, optim.lr)
        self.trainer.scheduler = warmup_scheduler(self.optimizer, optim.lr_warmup_steps)

    # --- state ---------------------------------------------------------------------------

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def pop_metrics(self) -> dict[str, float]:
        """This step's timings and memory headline (the whole process: ref included)."""
        return self.ledger.pop_metrics()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def pop_memory_records(self, step: int) -> list[MemoryRecord]:
        """The memory ledger's boundaries since the last call, stamped with `step`."""
        return self.ledger.pop_records(step)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def start_memory_history(self, max_entries: int = 100_000) -> None:
        """Record every CUDA allocation from now on (torch's memory snapshot history)."""
        if self.parallel.device.type != "cuda":
            raise RuntimeError("memory snapshots need CUDA (trainer.use_gpu=true)")
        torch.cuda.memory._record_memory_history(max_entries=max_entries)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def dump_memory_history(self, directory: str, step: int) -> str:
        """Save the recorded history as `<directory>/rank<r>_step<s>.pickle` and stop."""
        path = Path(directory) / f"rank{self.rank}_step{step}.pickle"
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.cuda.memory._dump_snapshot(str(path))
        torch.cuda.memory._record_memory_history(enabled=None)
        return str(path)

    def _scheduler(self) -> torch.optim.lr_scheduler.LRScheduler:
        """The update's warm-up (built with the trainer; built again when SFT ends)."""
        assert self.trainer.scheduler is not None
        return self.trainer.scheduler

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, path: str, extra: dict[str, Any] | None = None) -> None:
        with self._phase("save_checkpoint", with_optimizer=True):
            state = {**(extra or {}), SCHEDULER_KEY: self._scheduler().state_dict()}
            save_checkpoint(Path(path), self.model, self.optimizer, state)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, path: str) -> dict[str, Any]:
        with self._phase("load_checkpoint", with_optimizer=True):
            extra = load_checkpoint(Path(path), self.model, self.optimizer)
        scheduler = self._scheduler()
        if SCHEDULER_KEY in extra:  # checkpoints before the actor's warm-up have none
            scheduler.load_state_dict(extra.pop(SCHEDULER_KEY))
            for group, lr in zip(self.optimizer.param_groups, scheduler.get_last_lr(), strict=True):
                group["lr"] = lr  # where the warm-up stood, whatever the optimizer file held
        return extra

    @register(dispatch_mode=Dispatch.RANK_ZERO)
    def export_hf(self, path: str) -> str:
        """The actor as a Hugging Face model directory at `path` (written by rank 0); with
        LoRA the adapters merged into the base."""
        with self._phase("export_hf"):
            if self.lora_sync is not None:
                merged = dict(self.lora_sync.iter_merged(layered=True, on_group_done=None))
                return str(write_hf_model(merged, self.config.model.path, path))
            return str(export_hf_model(self.model, self.config.model.path, path))

    @register(dispatch_mode=Dispatch.RANK_ZERO)
    def export_adapter(self, path: str) -> str:
        """The LoRA adapter as a peft directory at `path` (PeftModel.from_pretrained and
        vLLM's LoRARequest load it); written by rank 0."""
        if self.lora_sync is None:
            raise RuntimeError("export_adapter needs LoRA (model.lora.rank > 0)")
        with self._phase("export_adapter"):
            tensors = self.lora_sync.gather_adapter(layered=True, on_group_done=None)
            if self.rank == 0:
                write_adapter(Path(path), tensors, self.lora_sync.spec)
        return path

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def shutdown_engine(self) -> None:
        """Free what must go before the process group ends (LoRA's adapter files here)."""
        if self.lora_sync is not None:
            self.lora_sync.remove_files()
