"""ActorRolloutWorker: the FSDP2 actor and the in-process vLLM engine of one WorkerDict.

Composed of small parts: PolicyTrainer (optimisation), VllmEngine (generation), ModeSwitch
(the memory hand-over between them, with the weight sync) and the process's MemoryLedger
(phase boundaries, and the bytes each part holds). The driver reaches it through the
`actor_rollout` view.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypedDict

import torch
from transformers import AutoTokenizer

from hybrid.controller import Dispatch, Worker, register
from hybrid.data import Batch
from hybrid.dtypes import ComputeDtypes, Dtype, Hardware, dtype_bytes, torch_dtype
from hybrid.memory.components import (
    ByDevice,
    full_parameter_count,
    gradient_bytes,
    optimizer_state_bytes,
    parameter_bytes,
)
from hybrid.memory.ledger import process_ledger
from hybrid.memory.records import MemoryRecord
from hybrid.rollout.vllm_engine import VllmEngine
from hybrid.sharding.checksum import verify
from hybrid.sharding.config import SyncConfig
from hybrid.sharding.lora_files import write_adapter
from hybrid.sharding.lora_sync import LoraSync, adapter_directory
from hybrid.sharding.mode import Mode, ModeSwitch
from hybrid.sharding.offload import Offloader
from hybrid.workers.checkpoint import load_checkpoint, save_checkpoint
from hybrid.workers.config import HybridWorkerConfig
from hybrid.workers.export import export_hf_model, write_hf_model
from hybrid.workers.forward import pass_config, score_responses
from hybrid.workers.fsdp import build_fsdp_model, build_optimizer
from hybrid.workers.lora import adapter_spec, adapters_disabled
from hybrid.workers.parallel import ParallelState, gather_across_tp, init_parallel
from hybrid.workers.policy import PolicyTrainer
from hybrid.workers.sequences import pack_rollout, unpad_prompts


class WorkerFacts(TypedDict):
    """What a worker resolved at start-up (`describe`)."""

    parameters: int
    hardware: str
    actor_dtype: Dtype
    ref_dtype: Dtype
    rollout_dtype: Dtype
    sync_strategy: str
    weight_layout: str


class ActorRolloutWorker(Worker):
    def __init__(self, config: HybridWorkerConfig) -> None:
        self.config = config
        self.ledger = process_ledger(self.rank, self.rank_env.node)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        c = self.config
        self.parallel: ParallelState = init_parallel(
            self.rank_env, c.rollout.tensor_parallel_size, c.actor.hsdp_replicas
        )
        device = self.parallel.device
        self.hardware = Hardware.detect(device)
        self.dtypes: ComputeDtypes = c.compute_dtypes(self.hardware)
        self.model = build_fsdp_model(
            c.model.path,
            self.parallel.fsdp_mesh,
            device,
            param_dtype=torch_dtype(self.dtypes.actor),
            reduce_dtype=torch_dtype(c.actor.reduce_dtype),
            master_dtype=torch_dtype(c.actor.master_dtype),
            attn_implementation=c.model.attn_implementation,
            gradient_checkpointing=c.model.gradient_checkpointing,
            lora=c.model.lora,
        )
        a = c.actor
        self.optimizer = build_optimizer(self.model, a.lr, a.weight_decay, a.betas, a.eps)
        self.ledger.track("actor", self._actor_components)
        self.ledger.record("init/actor")
        lora = c.model.lora
        adapter_sync = lora.enabled and c.sync.lora_mode == "adapter"
        self.engine = VllmEngine(
            c.model.path,
            c.rollout,
            device,
            self.dtypes.rollout,
            lora_rank=lora.rank if adapter_sync else 0,
        )
        # vLLM's weights in its dtype, split over the tensor-parallel group. A packed layout
        # holds them in buffers that are not tensors, so count from the shapes.
        self._rollout_weight_bytes = (
            full_parameter_count(self.model)
            * dtype_bytes(self.dtypes.rollout)
            // c.rollout.tensor_parallel_size
        )
        self.ledger.track("rollout", self._rollout_components)
        self.ledger.record("init/rollout")
        self.tokenizer = AutoTokenizer.from_pretrained(c.model.path)
        offloader = Offloader(
            self.model, self.optimizer, device, c.actor.param_offload, c.actor.optimizer_offload
        )
        self.lora_sync = (
            LoraSync(
                self.model,
                adapter_spec(self.model, lora, c.model.path),
                adapter_directory(self.rank),
                torch_dtype(self.dtypes.rollout),
            )
            if lora.enabled
            else None
        )
        self.modes = ModeSwitch(
            self.model,
            self.engine,
            offloader,
            c.sync,
            self.ledger,
            c.rollout.seed + self.rank,
            self.lora_sync,
        )
        a = c.actor
        self.update_pass = pass_config(
            c.model,
            a.micro_batch_size,
            a.use_dynamic_bsz,
            a.ppo_max_token_len_per_gpu,
            "actor.ppo_max_token_len_per_gpu",
        )
        self.log_prob_pass = pass_config(
            c.model,
            a.micro_batch_size,
            a.use_dynamic_bsz,
            a.log_prob_max_token_len_per_gpu,
            "actor.log_prob_max_token_len_per_gpu",
        )
        self.ref_pass = pass_config(
            c.model,
            c.ref.micro_batch_size,
            c.ref.use_dynamic_bsz,
            c.ref.log_prob_max_token_len_per_gpu,
            "ref.log_prob_max_token_len_per_gpu",
        )
        self.trainer = PolicyTrainer(
            self.model, self.optimizer, c.actor, self.update_pass, self.ledger
        )
        self.modes.trainer_mode()  # start with the KV cache released and the actor offloaded
        offloader.offload_optimizer()
        offloader.offload_params()

    def _actor_components(self) -> dict[str, ByDevice]:
        return {
            "actor_params": parameter_bytes(self.model),
            "actor_grads": gradient_bytes(self.model),
            "optimizer_state": optimizer_state_bytes(self.optimizer),
        }

    def _rollout_components(self) -> dict[str, ByDevice]:
        device, host = self.parallel.device.type, "cpu"
        resident = self.engine.resident
        weights_at = device if "weights" in resident else host  # sleep level 1 offloads them
        components = {"rollout_weights": ByDevice({weights_at: self._rollout_weight_bytes})}
        if "kv_cache" in resident:
            components["kv_cache"] = ByDevice({device: self.engine.kv_cache_bytes})
        return components

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def describe(self) -> WorkerFacts:
        """What this worker resolved at start-up, for the start-up summary and config.json."""
        return {
            "parameters": full_parameter_count(self.model),
            "hardware": self.hardware.description,
            "actor_dtype": self.dtypes.actor,
            "ref_dtype": self.dtypes.ref,
            "rollout_dtype": self.dtypes.rollout,
            "sync_strategy": self.modes.strategy,
            "weight_layout": self.engine.weight_layout,
        }

    # --- rollout -------------------------------------------------------------------------

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def enter_rollout_mode(self) -> None:
        """Sync and stay in rollout mode across several generate calls (exit_rollout_mode ends it)."""
        # Check before replacing the open window: dropping it would run its cleanup.
        self.modes.require(Mode.TRAINER, "entering rollout mode")
        self._window = self.modes.rollout_mode()
        self._window.__enter__()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def exit_rollout_mode(self) -> None:
        self.modes.require(Mode.ROLLOUT, "exit_rollout_mode")
        self._window.__exit__(None, None, None)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def current_mode(self) -> str:
        return self.modes.mode.value

    @register(dispatch_mode=Dispatch.DP_COMPUTE)
    def generate_sequences(
        self, batch: Batch, greedy: bool = False, auto_mode: bool = True
    ) -> Batch:
        """Sample one response per row of left-padded `input_ids` / `attention_mask`.

        In trainer mode with auto_mode=True the call enters rollout mode for itself (sync,
        generate, release); with auto_mode=False it requires rollout mode. Rows may carry a
        `seed` column for per-row reproducible sampling.
        """
        if self.modes.mode is Mode.ROLLOUT or not auto_mode:
            return self._generate(batch, greedy)
        with self.modes.rollout_mode():
            return self._generate(batch, greedy)

    def _generate(self, batch: Batch, greedy: bool) -> Batch:
        self.modes.require(Mode.ROLLOUT, "generate_sequences")
        n = 1 if greedy else self.config.rollout.n
        requests = unpad_prompts(batch.tensors["input_ids"], batch.tensors["attention_mask"])
        seeds = batch.tensors["seed"].tolist() if "seed" in batch else [None] * len(batch)
        shared, mine = gather_across_tp(self.parallel, list(zip(requests, seeds, strict=True)))
        shared_seeds = [seed for _, seed in shared]
        with self.ledger.timed("gen"):
            samples = self.engine.generate(
                [request for request, _ in shared],
                greedy=greedy,
                seeds=None if None in shared_seeds else shared_seeds,
            )[mine.start * n : mine.stop * n]
        self.ledger.record("rollout/generate")
        rows = batch.repeat(n, interleave=True)  # n adjacent samples per prompt
        packed = pack_rollout(
            rows.tensors["input_ids"],
            rows.tensors["attention_mask"],
            samples,
            self.config.rollout.response_length,
            self.tokenizer.pad_token_id,
        )
        generated = Batch.from_dict(
            packed, non_tensors={"response_text": [s.text for s in samples]}
        )
        rest = rows.select(
            [
                k
                for k in (*rows.tensors, *rows.non_tensors)
                if k not in ("input_ids", "attention_mask")
            ]
        )
        return rest.union(generated) if rest.keys() else generated

    @register(dispatch_mode=Dispatch.DP_COMPUTE)
    def compute_engine_log_prob(self, batch: Batch) -> Batch:
        """The engine's log-probs of the given responses (the sync check's other side).

        Scores `input_ids` without padding through vLLM prompt log-probs; enters rollout mode
        for the call unless already in it.
        """
        if self.modes.mode is Mode.ROLLOUT:
            return self._engine_log_prob(batch)
        with self.modes.rollout_mode():
            return self._engine_log_prob(batch)

    def _engine_log_prob(self, batch: Batch) -> Batch:
        responses = batch.tensors["responses"]
        sequences = unpad_prompts(batch.tensors["input_ids"], batch.tensors["attention_mask"])
        shared, mine = gather_across_tp(self.parallel, sequences)
        scores = self.engine.score(shared)[mine]
        out = torch.zeros(responses.shape, dtype=torch.float32)
        for i, (seq_scores, mask) in enumerate(
            zip(scores, batch.tensors["response_mask"], strict=True)
        ):
            n = int(mask.sum())
            if n:
                out[i, :n] = torch.tensor(seq_scores[-n:])
        return Batch.from_dict({"engine_log_probs": out})

    # --- training ------------------------------------------------------------------------

    @register(dispatch_mode=Dispatch.DP_COMPUTE)
    def compute_log_prob(self, batch: Batch) -> Batch:
        """The actor's log-probs and entropy of `responses` (old_log_probs for PPO)."""
        with self.modes.trainer_phase("old_log_prob", caller="compute_log_prob"):
            self.model.eval()
            scored = score_responses(
                self.model, batch.to(self.parallel.device), self.log_prob_pass, with_entropy=True
            )
            self.ledger.record("old_log_prob/forward")
        return Batch.from_dict(
            {"old_log_probs": scored["log_probs"].cpu(), "entropys": scored["entropy"].cpu()}
        )

    @register(dispatch_mode=Dispatch.DP_COMPUTE)
    def compute_ref_log_prob(self, batch: Batch) -> Batch:
        """The reference policy's log-probs with LoRA: the actor with its adapters disabled,
        i.e. the frozen base model (no second copy of the weights)."""
        if self.lora_sync is None:
            raise RuntimeError(
                "actor_rollout.compute_ref_log_prob serves LoRA runs (the base is the "
                "reference); without LoRA call the ref worker's compute_ref_log_prob"
            )
        with self.modes.trainer_phase("ref", caller="compute_ref_log_prob"):
            self.model.eval()
            with adapters_disabled(self.model):
                scored = score_responses(
                    self.model, batch.to(self.parallel.device), self.ref_pass, with_entropy=False
                )
            self.ledger.record("ref/forward")
        return Batch.from_dict({"ref_log_prob": scored["log_probs"].cpu()})

    @register(dispatch_mode=Dispatch.DP_COMPUTE)
    def update_actor(self, batch: Batch) -> dict[str, float]:
        with self.modes.trainer_phase("update", with_optimizer=True, caller="update_actor"):
            return self.trainer.update(batch.to(self.parallel.device))

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

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def configure_sync(self, sync: SyncConfig) -> None:
        """Use another gather granularity / strategy from the next sync on (benchmarks)."""
        self.modes.configure(sync)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def verify_rollout_weights(self) -> int:
        """Re-check the engine's readable tensors against the last sync's checksums."""
        if not self.modes.last_checksums:
            raise RuntimeError(
                "no checksums recorded: run a sync with sync.verify_checksum=true first"
            )
        return verify(self.engine.model, self.modes.last_checksums)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, path: str, extra: dict[str, Any] | None = None) -> None:
        with self.modes.trainer_phase("save_checkpoint", with_optimizer=True):
            save_checkpoint(Path(path), self.model, self.optimizer, extra)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, path: str) -> dict[str, Any]:
        with self.modes.trainer_phase("load_checkpoint", with_optimizer=True):
            return load_checkpoint(Path(path), self.model, self.optimizer)

    @register(dispatch_mode=Dispatch.RANK_ZERO)
    def export_hf(self, path: str) -> str:
        """The actor as a Hugging Face model directory at `path` (written by rank 0); with
        LoRA the adapters merged into the base."""
        with self.modes.trainer_phase("export_hf"):
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
        with self.modes.trainer_phase("export_adapter"):
            tensors = self.lora_sync.gather_adapter(layered=True, on_group_done=None)
            if self.rank == 0:
                write_adapter(Path(path), tensors, self.lora_sync.spec)
        return path

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def shutdown_engine(self) -> None:
        """Free the engine before the process group ends (vLLM raises otherwise)."""
        self.engine.shutdown()
        if self.lora_sync is not None:
            self.lora_sync.remove_files()
