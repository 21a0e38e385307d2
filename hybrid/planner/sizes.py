"""The memory planner's byte model of one worker: what each component and transient weighs,
from the run's config and the model's shape, as `WorkerSizes`. hybrid.planner.plan places
them in the phases of a step and judges the fit. Every term is derived in
docs/memory-model.md; the sections of `WorkerSizes` follow its headings (resident components,
KV cache and generation, weight sync, the trainer's passes).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

import torch

from hybrid.dtypes import ComputeDtypes, Hardware, dtype_bytes
from hybrid.memory.model_shape import ModelShape
from hybrid.memory.records import GIB
from hybrid.planner.adapters import (
    Adapters,
    adapters_of,
    adapts_experts,
    engine_lora_rank,
    lora_targets,
)
from hybrid.planner.passes import (
    Bytes,
    MicroBatch,
    PassName,
    all_to_all_bytes,
    head_chunk_bytes,
    largest_moment,
    logits_bytes,
    micro_batch_of,
    reduce_bytes,
    scoring_bytes,
    unsharded_bytes,
)
from hybrid.planner.reserve import DEFAULT_GPU

if TYPE_CHECKING:
    from hybrid.trainer.config import TrainerRunConfig

__all__ = ["WorkerSizes", "gather_peak", "planned_hardware"]

CPU_DEFAULT_UTILIZATION = 0.9
"""vLLM's own gpu_memory_utilization default (the engine passes ours only on CUDA)."""
SAMPLER_BYTES_PER_LOGIT = 20
ENGINE_WORKSPACE_BYTES = 256 << 20
"""NCCL / cuBLAS workspaces and sampler state of the engine, outside its sleep pools."""
CUDA_GRAPH_BYTES = 1 << 30
"""Rough size of vLLM's CUDA graphs when rollout.enforce_eager is false."""
PLANNED_GPU = Hardware("cuda", native_bf16=True, description="a GPU with bf16 (planned)")
"""The presets plan for bf16 GPUs (A100, H100): `auto` dtypes resolve as they would there."""
MERGE_BYTES_PER_ELEMENT = 12
"""hybrid.workers.lora.merge_into_base: W.float(), B @ A and its scaled copy, fp32, at once."""


@dataclass(frozen=True)
class WorkerSizes:
    """Bytes of one worker's components and transients, from (config, shape, LoRA rank,
    device memory)."""

    config: TrainerRunConfig
    shape: ModelShape
    lora_rank: int
    gpu_bytes: float
    gpu: str = DEFAULT_GPU
    """The GPU kind (hybrid.planner.reserve.GPU_KINDS): vLLM's batch defaults depend on it."""

    # --- the run's dimensions (docs/memory-model.md, "Notation") ---

    @property
    def on_gpu(self) -> bool:
        return self.config.trainer.use_gpu

    @cached_property
    def dtypes(self) -> ComputeDtypes:
        """actor / ref / rollout dtypes with `auto` resolved for the planned device."""
        c = self.config
        return ComputeDtypes.resolve(
            c.actor.precision.param_dtype,
            c.ref.precision.param_dtype,
            c.rollout.dtype,
            planned_hardware(self.on_gpu),
            self.shape.hidden_size,
        )

    @property
    def engine_bytes(self) -> int:
        """Bytes per element of the engine's weights (and of the tensors the sync gathers)."""
        return dtype_bytes(self.dtypes.rollout)

    @property
    def cb(self) -> int:
        return dtype_bytes(self.dtypes.actor)

    @property
    def master(self) -> int:
        return dtype_bytes(self.config.actor.precision.master_dtype)

    @property
    def tp(self) -> int:
        return self.config.rollout.tensor_parallel_size

    @property
    def seq(self) -> int:
        return self.config.rollout.prompt_length + self.config.rollout.response_length

    @property
    def world(self) -> int:
        """Ranks: every worker holds a shard and, in rollout mode, runs its own prompts."""
        return self.config.trainer.num_workers

    @property
    def sp(self) -> int:
        """actor.sp_size: the ranks that split each packed row of a pass (its rows go to
        world / sp data-parallel slots)."""
        return self.config.actor.sp_size

    @property
    def shard_world(self) -> int:
        """Ranks a parameter is sharded over (all of them, or one HSDP replica's)."""
        return self.world // self.config.actor.hsdp_replicas

    @property
    def lora(self) -> Adapters:
        targets, experts = lora_targets(self.config), adapts_experts(self.config, self.shape)
        return adapters_of(self.shape, self.lora_rank, targets, self.shard_world, experts)

    @property
    def adapter_sync(self) -> bool:
        """LoRA with sync.lora_mode=adapter: a LoRA-enabled engine, adapters sent each sync."""
        return self.lora_rank > 0 and self.config.sync.lora_mode == "adapter"

    # --- actor and reference (docs/memory-model.md, "Resident components", "LoRA") ---

    @property
    def trainable_shard(self) -> int:
        return self.lora.shard if self.lora_rank else self.shape.shard(self.shard_world)

    def actor_params(self) -> int:
        if self.lora_rank:  # frozen base in the compute dtype + adapters in the master dtype
            return self.shape.shard(self.shard_world) * self.cb + self.trainable_shard * self.master
        return self.trainable_shard * self.master

    @property
    def ref_is_actor(self) -> bool:
        """LoRA: the reference forward is the actor's with its adapters disabled (no copy)."""
        return self.lora_rank > 0

    @property
    def ref_cb(self) -> int:
        """Bytes per element of the weights the reference forward runs on."""
        return self.cb if self.ref_is_actor else dtype_bytes(self.dtypes.ref)

    def ref_params(self) -> int:
        """The reference copy: built for the KL loss only, and none with LoRA."""
        if not self.config.needs_reference or self.ref_is_actor:
            return 0
        return self.shape.shard(self.shard_world) * dtype_bytes(self.dtypes.ref)

    # --- engine and KV cache (docs/memory-model.md, "KV cache", "Generation") ---

    def rollout_weights(self) -> int:
        s = self.shape
        split = -(-(s.num_params - s.norm_params) // self.tp)
        # enable_lora preallocates one adapter slot of max_lora_rank on every projection vLLM
        # supports (all of q,k,v,o,gate,up,down whatever the targets; unsplit: an upper bound)
        slots = s.adapters(engine_lora_rank(self.lora_rank)) if self.adapter_sync else 0
        return self.engine_bytes * (split + s.norm_params + slots)

    def vllm_limits(self) -> tuple[int, int]:
        """vLLM's offline (max_num_batched_tokens, max_num_seqs) for this device (its
        EngineArgs.get_batch_defaults: an A100 gets the small ones whatever its memory)."""
        large = self.gpu_bytes >= 70 * GIB and "a100" not in self.gpu
        return (16384, 1024) if large else (8192, 256)

    def engine_overhead(self) -> int:
        if not self.on_gpu:
            return 0
        graphs = 0 if self.config.rollout.enforce_eager else CUDA_GRAPH_BYTES
        embeds = self.vllm_limits()[0] * self.shape.hidden_size * self.engine_bytes
        return embeds + ENGINE_WORKSPACE_BYTES + graphs

    def engine_activations(self, tokens: int, seqs: int) -> int:
        forward = tokens * self.shape.engine_forward(self.tp)
        return max(forward, seqs * self.shape.vocab_size * SAMPLER_BYTES_PER_LOGIT)

    def engine_requested(self) -> int | None:
        """vLLM's share U when it sizes the KV cache from gpu_memory_utilization."""
        r = self.config.rollout
        if r.kv_cache_memory_bytes is not None:
            return None
        utilization = r.gpu_memory_utilization if self.on_gpu else CPU_DEFAULT_UTILIZATION
        return int(utilization * self.gpu_bytes)

    def kv_cache(self) -> int:
        requested = self.engine_requested()
        if requested is None:
            return int(self.config.rollout.kv_cache_memory_bytes or 0)
        profiled = self.engine_activations(*self.vllm_limits())
        return requested - self.rollout_weights() - self.engine_overhead() - profiled

    def sequences_per_engine(self) -> int:
        c = self.config
        prompts = -(-c.data.train_batch_size * self.tp // self.world)
        return prompts * c.rollout.n

    def generate_activations(self) -> int:
        max_tokens, max_seqs = self.vllm_limits()
        seqs = self.sequences_per_engine()
        prompt_tokens = seqs // self.config.rollout.n * self.config.rollout.prompt_length
        return self.engine_activations(min(max_tokens, prompt_tokens), min(max_seqs, seqs))

    # --- weight sync (docs/memory-model.md, "Weight sync", "Adapter sync", "Merge sync") ---

    def cast_shard(self) -> int:
        """The one shard cast to the engine's dtype beside a group's full tensors (none for a
        LoRA base already in that dtype: `.to(dtype)` returns it as is)."""
        if self.lora_rank and self.dtypes.actor == self.dtypes.rollout:
            return 0
        return self.shape.largest_shard(self.shard_world) * self.engine_bytes

    def weight_gather(self) -> int:
        """Full bf16 weights of sync.gather's largest group: every sync of full fine-tuning,
        the first of LoRA's adapter mode (the frozen base)."""
        group = gather_peak(self.shape, self.config.sync.gather, self.config.sync.bucket_mb << 20)
        return group * self.engine_bytes + self.cast_shard()

    def sync_transient(self) -> Bytes:
        """What a steady-state sync gathers (see hybrid.sharding.lora_sync for LoRA)."""
        a = self.lora
        if not self.lora_rank:
            return {"gather_buffers": self.weight_gather()}
        if self.adapter_sync:  # gather_adapter moves each group to the host once gathered
            group = a.layer if self.config.sync.layered_summon else a.elements
            return {"gather_buffers": (group + a.largest_shard) * self.engine_bytes}
        # merge: a group's base (bf16) and adapters (fp32), the merged copies of its adapted
        # weights, merge_into_base's fp32 temporaries of the largest one
        layered = self.config.sync.layered_summon
        base = self.shape.largest_layer if layered else self.shape.num_params
        adapters, adapted = (a.layer, a.adapted_layer) if layered else (a.elements, a.adapted)
        merged = (adapted - a.largest_adapted) * self.engine_bytes
        merge = {
            "gather_buffers": base * self.engine_bytes + adapters * 4 + self.cast_shard(),
            "merge_temps": merged + MERGE_BYTES_PER_ELEMENT * a.largest_adapted,
        }
        if not layered:
            return merge
        # a root tensor (the embedding) is a group of its own, and may be the larger one
        root = gather_peak(self.shape, "layer", self.config.sync.bucket_mb << 20)
        return largest_moment(
            merge, {"gather_buffers": root * self.engine_bytes + self.cast_shard()}
        )

    # --- the trainer's passes (docs/memory-model.md, "Transients": "Micro-batches" to
    # "Optimizer step") ---

    def optimizer_temporaries(self) -> int:
        if self.on_gpu:  # foreach AdamW: one temporary the size of the trainable shard
            return self.trainable_shard * self.master
        largest = (
            self.lora.largest_shard
            if self.lora_rank
            else self.shape.largest_shard(self.shard_world)
        )
        return largest * self.master

    def logits(self, mb: MicroBatch, full: int, fp32_copies: int) -> int:
        """Full-logits path (docs/memory-model.md, "Logits, full"): `full` (T, V) tensors in
        the compute dtype + `fp32_copies` (n, V) in fp32 (with rows, T = b x S and n = b x R)."""
        return logits_bytes(self.shape, mb, self.cb, full, fp32_copies)

    @property
    def chunked(self) -> bool:
        """Log-probs from the chunked scoring head (model.log_prob_chunk_tokens > 0)."""
        return self.config.model.log_prob_chunk_tokens > 0

    def head_chunk(self, mb: MicroBatch, backward: bool) -> int:
        """The scoring head's (c, V) buffers (docs/memory-model.md, "Logits, chunked")."""
        chunk = self.config.model.log_prob_chunk_tokens
        return head_chunk_bytes(self.shape, mb, self.cb, chunk, backward)

    def micro_batch(self, name: PassName) -> MicroBatch:
        """The largest micro-batch of a pass (docs/memory-model.md, "Micro-batches")."""
        a, ref = self.config.actor, self.config.ref
        update, dynamic, budget, micro = {
            "ref": (
                False,
                ref.use_dynamic_bsz,
                ref.log_prob_max_token_len_per_gpu,
                ref.micro_batch_size,
            ),
            "old_log_prob": (
                False,
                a.use_dynamic_bsz,
                a.log_prob_max_token_len_per_gpu,
                a.micro_batch_size,
            ),
            "update": (True, a.use_dynamic_bsz, a.ppo_max_token_len_per_gpu, a.micro_batch_size),
        }[name]
        return micro_batch_of(self.config, update, dynamic, budget, micro, self.sp)

    def unsharded(self, dtype_bytes: int) -> int:
        """The root + the current layer + the prefetched layer, all-gathered by FSDP2."""
        return unsharded_bytes(self.shape, dtype_bytes, self.lora.layer, self.config.actor.ep_size)

    # Trainer-side transients: a no-grad forward, the update's forward and backward.

    def scoring(self, name: PassName, dtype_bytes: int, fp32_copies: int) -> Bytes:
        """A no-grad forward (reference or old log-probs) on weights of `dtype_bytes`
        (passes.scoring_bytes). `fp32_copies`: of the full-logits path."""
        chunk = self.config.model.log_prob_chunk_tokens
        unsharded = self.unsharded(dtype_bytes)
        return scoring_bytes(
            self.shape, self.micro_batch(name), self.cb, unsharded, chunk, fp32_copies
        )

    def update_forward(self) -> Bytes:
        mb, s, cb = self.micro_batch("update"), self.shape, self.cb
        saved = mb.tokens * s.saved_activations(cb, self.config.model.gradient_checkpointing)
        base = {"unsharded_params": self.unsharded(cb), "activations": saved}
        layer = {
            **base,
            "activations": saved + mb.tokens * s.nograd_layer(cb),
            "all_to_all": all_to_all_bytes(s, mb, cb),
        }
        if self.chunked:  # the scored hidden states are saved for the head's backward
            states = mb.scored * s.hidden_size * cb
            head = {
                **base,
                "activations": saved + states,
                "logits": self.head_chunk(mb, backward=False),
            }
        else:
            fp32 = 4 + (1 if self.config.actor.entropy_coeff > 0 else 0)  # + the entropy's graph
            head = {**base, "logits": self.logits(mb, 1, fp32)}
        return largest_moment(head, layer)

    def update_backward(self) -> Bytes:
        """The largest of three moments: the loss's backward through the LM head; the first
        decoder layer's backward (recompute, activation and layer gradients); the root's
        reduce-scatter at the end (its parameters already resharded)."""
        s, a, mb = self.shape, self.config.actor, self.micro_batch("update")
        cb, lora = self.cb, self.lora_rank > 0
        checkpointed = self.config.model.gradient_checkpointing
        saved = mb.tokens * s.saved_activations(cb, checkpointed)
        work = mb.tokens * s.layer_backward(cb, checkpointed)
        reduce = reduce_bytes(self.dtypes.actor, a.precision.reduce_dtype)
        # Until the embedding's gradient closes the root group, it holds the LM head's gradient;
        # with LoRA the root is frozen and only the adapters have gradients.
        head_grad = 0 if lora else s.vocab_size * s.hidden_size * cb
        layer = s.largest_pass_layer(a.ep_size)
        layer_grads = (self.lora.layer if lora else layer) * reduce
        unsharded = self.unsharded(cb)
        if self.chunked:  # the saved states and their gradient; fp32 head-gradient accumulator
            states = mb.scored * s.hidden_size * cb
            head = {
                "unsharded_grads": head_grad + (0 if lora else s.vocab_size * s.hidden_size * 4),
                "activations": saved + 2 * states,
                "logits": self.head_chunk(mb, backward=True),
            }
            kept = 0  # nothing of the head's outlives its backward
        else:
            head = {
                "unsharded_grads": head_grad,
                "activations": saved,
                "logits": self.logits(mb, 2, 3),
            }
            kept = self.logits(mb, 1, 0)  # the (T, V) logits
        return largest_moment(
            {"unsharded_params": unsharded, **head},
            {
                "unsharded_params": unsharded,
                "unsharded_grads": head_grad + layer_grads,
                "activations": saved + work,
                "logits": kept,
                "all_to_all": all_to_all_bytes(s, mb, cb),  # its backward's, as many
            },
            {"unsharded_grads": (0 if lora else s.root_params) * reduce, "logits": kept},
        )


def planned_hardware(on_gpu: bool) -> Hardware:
    """What `auto` dtypes resolve for: a bf16 GPU, or this machine's CPU."""
    return PLANNED_GPU if on_gpu else Hardware.detect(torch.device("cpu"))


@functools.cache
def gather_peak(shape: ModelShape, mode: str, bucket_bytes: int) -> int:
    """Elements of the largest group the weight sync gathers at once: the sync's own
    `group_parameters` on meta tensors (bf16, like the sync)."""
    from hybrid.sharding.gather import group_parameters

    params = shape.params
    if mode == "bucket" and shape.num_experts:
        # The stacked experts go a bucket of experts at a time (hybrid.sharding.full_weights.
        # expert_buckets; at least one expert of each rank, which this leaves out).
        params = tuple(
            piece
            for name, dims in shape.params
            for piece in (
                [(f"{name}.{e}", dims[1:]) for e in range(dims[0])]
                if ".mlp.experts." in name and dims and dims[0] == shape.num_experts
                else [(name, dims)]
            )
        )
    named = [(name, torch.empty(dims, device="meta")) for name, dims in params]
    groups = group_parameters(named, mode, bucket_bytes, torch.bfloat16)  # type: ignore[arg-type]
    return max(sum(t.numel() for _, t in group) for group in groups)
