"""The memory planner's byte model: what each component and transient of one worker weighs,
from the run's config and the model's shape, as `WorkerSizes`. hybrid.memory.planner places
them in the phases of a step and judges the fit; the derivation of every term is here.

Per worker (one GPU), steady state (step >= 2: AdamW's state exists). Notation:
W = trainer.num_workers, P = parameters, h / I / L / V = hidden size, MLP width, layers,
vocabulary, kv = KV heads x head_dim, S = rollout.prompt_length + rollout.response_length,
R = rollout.response_length, cb = bytes of actor.param_dtype; T and n: see micro-batches.
With HSDP (actor.hsdp_replicas = H) parameters shard over W / H ranks instead of W: read
W / H for W wherever a shard is meant; rows still split over all W.

Resident (COMPONENTS names; what the code keeps where):
  actor_params     P/W x bytes(master_dtype): the FSDP2 full shard (rank 0 holds ceil(rows/W)
                   rows of every tensor, the largest shard). LoRA: see below.
  actor_grads      the trainable shard in master dtype, from a mini-batch's first backward to
                   the optimizer step (zero_grad(set_to_none=True)).
  optimizer_state  AdamW exp_avg + exp_avg_sq: 2 x the trainable shard x bytes(master).
  ref_params       P/W x bytes(ref.param_dtype), only when a KL needs the reference
                   (actor.use_kl_loss, algorithm.use_kl_in_reward); none with LoRA.
  rollout_weights  2 bytes x ((P - norm weights) / tp + norm weights): vLLM's bf16 weights
                   (+ the adapter slots of a LoRA engine).
  kv_cache         see below.
  engine_overhead  vLLM's buffers outside its sleep pools: inputs_embeds (max_num_batched_tokens
                   x h x 2) + 256 MiB of NCCL / cuBLAS workspaces (+1 GiB of CUDA graphs
                   without enforce_eager); an estimate, 0 on CPU.
  runtime          predicted 0: the interpreter and libraries are unknown to a planner (the
                   measured CPU report counts the process RSS, which includes them).

Transient (the larger of a phase's moments, not their sum):
  Micro-batches: each pass (reference, old log-probs, update) runs T tokens at once and
  scores n response tokens, out of the m rows a worker holds for it (ceil(rows_per_step / W);
  the update: its share of a mini-batch). By rows (b = the pass's micro_batch_size, at most
  m): T = b x S, n = b x R; packing (model.use_remove_padding) runs the valid tokens only, but
  its worst case is b full-length rows: the same bound. By token budget (use_dynamic_bsz,
  B = the pass's *_max_token_len_per_gpu): at most min(B, m x S) valid tokens, which is T
  when packed; padded, each row counts S however few valid tokens it has (>= 1), so
  T = min(B, m) x S. Then n = min(valid, m x R), not valid x R / S: short prompts let
  responses fill the budget. The update accumulates gradients when its rows may take more
  than one micro-batch (b < m, or B < m x S).
  FSDP2 keeps the root (embedding, final norm, LM head) unsharded through forward and
  backward, and one decoder layer plus one prefetched: (root + 2 x layer) x cb. Backward holds
  the LM head's unsharded gradient (V x h x cb) until the embedding's closes the root group,
  one layer's unsharded gradients (cb, + a reduce_dtype copy for the reduce-scatter), and at
  the end the whole root's (parameters resharded by then).
  Saved activations per token and decoder layer (flash / sdpa attention: no S^2 term):
    2 RMSNorms x (4h fp32 upcast + h x cb normalised) + attention (q, k, v after RoPE, the
    output, o_proj's input: (3h + 2kv) x cb) + SwiGLU (gate, silu, up, product: 4I x cb)
    A = 8h + cb x (5h + 2kv + 4I)   (18h + 4kv + 8I bytes in bf16)
  Forward with grad saves T x (L x A + 4h + h x cb) (+ the final norm); with
  model.gradient_checkpointing (one checkpoint per layer) T x (L x h x cb + 4h + h x cb),
  and backward recomputes one layer (T x A) beside activation gradients
  T x (2h + 3I) x cb. A no-grad layer's working set: T x (4h + cb x (3h + 3I)).
  Logits, model.log_prob_chunk_tokens = C > 0 (hybrid.workers.log_prob_head): the n scored
  hidden states are gathered (n x h x cb; saved for the update's backward) and the LM head runs
  c = min(C, n) rows at a time. Forward: 3 (c, V) fp32 buffers (logits, exp / probabilities, a
  temporary), entropy or not. Backward recomputes each chunk: one (c, V) fp32 buffer (log p,
  then dlogits, in place), the probabilities and dlogits cast to cb, c x V x (8 + cb), beside
  the hidden-state gradient (n x h x cb) and, in full fine-tuning, an fp32 accumulator of the
  LM head's gradient (V x h x 4) next to its cb result. No (T, V) tensor exists, and nothing
  of the head's outlives its backward.
  Logits, C = 0 (full logits): HF computes (T, V) in cb; log-prob and entropy upcast the
  scored (n, V) to fp32: 2 fp32 copies for a log-prob (copy, logsumexp temporary), 3 with the
  entropy (copy, softmax, product), 4 in the update's forward (the copy saved for backward +
  the entropy's 3; 5 with entropy_coeff > 0); backward adds the (T, V) gradient in cb and 3
  fp32 (saved copy, its gradient, the softmax), and the (T, V) logits stay until the end.
  Optimizer step: foreach AdamW (CUDA) allocates one trainable-shard-sized temporary in master
  dtype (sqrt(exp_avg_sq)); the for-loop version (CPU) the largest single shard.
  Sync (bf16): the largest group of the sync's own `group_parameters` (full = every parameter,
  tensor = the largest tensor, layer = the largest decoder layer or root tensor, bucket = up
  to max(bucket_mb, the largest tensor)) + one cast shard; LoRA: see below.
  Generation: vLLM's forward working set, tokens x (6h + 6I/tp) x 2 bytes for
  min(max_num_batched_tokens, the engine's prompt tokens) tokens, or its sampler, 20 bytes
  per logit (fp32 logits, sorted values, int64 indices, probabilities) x min(max_num_seqs,
  sequences) x V, whichever is larger.

KV cache: bytes per token = 2 (K, V) x L x max(1, kv_heads / tp) x head_dim x 2 (bf16). With
rollout.kv_cache_memory_bytes set it is exactly that. Without (CUDA), vLLM requests
U = gpu_memory_utilization x gpu memory and keeps KV = U - rollout_weights - engine_overhead
- its profiled peak (the generation estimate at max_num_batched_tokens / max_num_seqs =
16384 / 1024 on >= 70 GiB GPUs other than the A100, 8192 / 256 otherwise); it refuses to
start unless U is free then (the actor's shards are already on the device). What the trainer
leaves on the device in rollout mode comes on top of U. On CPU with the bytes null, vLLM's
default utilisation 0.9 applies to the given memory. A cache below rollout.max_model_len
tokens does not fit (vLLM refuses to start). One rollout needs, per engine, (train_batch_size
x tp / W) prompts x n sequences of S tokens, at most max_num_seqs of them at once; a smaller
cache only queues.

LoRA (model.lora; plan_memory's `lora_rank` > 0 overrides its rank): rank-r adapters A (r, in)
and B (out, r) on the model.lora.target_modules among q,k,v,o,gate,up,down (all seven for
all-linear, as hybrid.workers.lora picks for Qwen2; other names are not counted, so a model
whose decoder linears are named otherwise, e.g. a fused qkv_proj, is under-counted). The base
is frozen in param_dtype, the adapters are in master dtype and alone trainable:
actor_params = P/W x cb + the adapter shard x bytes(master); actor_grads and optimizer_state
cover the adapter shard only. No ref_params: the reference forward is the actor's with its
adapters disabled (the reference's micro-batches). FSDP2 unshards a layer's adapters with it;
backward holds no LM-head or root gradient (nor the chunked head's fp32 accumulator), and
one layer's adapter gradients.
sync.lora_mode=adapter starts vLLM with enable_lora: one slot of max_lora_rank (r rounded up to
a size vLLM accepts) on all seven projections, whatever the targets, in bf16 in
rollout_weights (unsplit by tp: an upper bound). Its sync (hybrid.sharding.lora_sync) gathers
every adapter in bf16 and keeps them until the peft file is written: the gather is all the
adapters whatever sync.layered_summon (which only bounds each collective). The first sync also
sends the base, grouped by sync.gather and already bf16 (no cast shard: `weight_gather`); the
steady phases leave it out (hybrid.memory.planner notes its peak and whether it fits). merge
gathers a decoder layer's (layered_summon; else the whole model's) base in bf16 and adapters in
fp32, keeps the merged bf16 copy of every adapted weight of the group and, for the one being
merged, merge_into_base's fp32 temporaries (W.float(), B @ A, its scaled copy: 12 bytes per
element); a root tensor alone (the embedding) may be the larger group. vLLM then needs no
adapter slots.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Literal

import torch

from hybrid.dtypes import ComputeDtypes, Hardware, dtype_bytes
from hybrid.memory.model_shape import LORA_TARGETS, ModelShape, count, is_layer, layer_key
from hybrid.memory.records import GIB
from hybrid.memory.reserve import DEFAULT_GPU

if TYPE_CHECKING:
    from hybrid.trainer.config import TrainerRunConfig

__all__ = [
    "Adapters",
    "Bytes",
    "MicroBatch",
    "PassName",
    "WorkerSizes",
    "largest_moment",
    "lora_rank_of",
    "lora_targets",
    "micro_batch_of",
    "planned_hardware",
    "reduce_bytes",
    "unsharded_bytes",
]

CPU_DEFAULT_UTILIZATION = 0.9
"""vLLM's own gpu_memory_utilization default (the engine passes ours only on CUDA)."""
SAMPLER_BYTES_PER_LOGIT = 20
ENGINE_WORKSPACE_BYTES = 256 << 20
"""NCCL / cuBLAS workspaces and sampler state of the engine, outside its sleep pools."""
CUDA_GRAPH_BYTES = 1 << 30
"""Rough size of vLLM's CUDA graphs when rollout.enforce_eager is false."""
PLANNED_GPU = Hardware("cuda", native_bf16=True, description="a GPU with bf16 (planned)")
"""The presets plan for bf16 GPUs (A100, H100): `auto` dtypes resolve as they would there."""
CHUNK_FORWARD_FP32 = 3
"""(c, V) fp32 buffers of the scoring head's forward: logits, exp / probabilities, a temporary."""
MERGE_BYTES_PER_ELEMENT = 12
"""hybrid.workers.lora.merge_into_base: W.float(), B @ A and its scaled copy, fp32, at once."""

Bytes = dict[str, int]
PassName = Literal["ref", "old_log_prob", "update"]


@dataclass(frozen=True)
class MicroBatch:
    """The largest micro-batch of one pass (see the module docstring's micro-batches)."""

    tokens: int
    """T: tokens the model runs on (padded: rows x S)."""
    scored: int
    """n: response tokens scored (what the LM head sees in the chunked path)."""
    split: bool
    """Whether the pass's rows may take more than one micro-batch (the update accumulates)."""


# --- LoRA adapters -------------------------------------------------------------------------


def lora_rank_of(config: TrainerRunConfig, lora_rank: int = 0) -> int:
    """The LoRA rank a plan uses: `lora_rank` when > 0 (an override), else model.lora.rank."""
    if lora_rank < 0:
        raise ValueError(f"lora_rank must be >= 0, got {lora_rank}")
    return lora_rank or config.model.lora.rank


def lora_targets(config: TrainerRunConfig) -> tuple[str, ...]:
    """The projections with adapters: model.lora.target_modules, all of them for all-linear."""
    targets = config.model.lora.target_modules
    return LORA_TARGETS if isinstance(targets, str) else tuple(targets)


@dataclass(frozen=True)
class Adapters:
    """Elements of the actor's adapters and of the base weights they adapt (0 without LoRA).
    Per-layer maxima are taken separately: exact for uniform decoder layers."""

    elements: int
    shard: int
    """Rank 0's FSDP2 shard of the adapters (ceil(rows / world) rows of each)."""
    largest_shard: int
    layer: int
    """The most adapter elements in one decoder layer."""
    adapted: int
    """Base weights that carry an adapter (what a merge rewrites)."""
    adapted_layer: int
    largest_adapted: int


@functools.cache
def _adapters(shape: ModelShape, rank: int, targets: tuple[str, ...], world: int) -> Adapters:
    # lora_params names: `model.layers.3.mlp.up_proj.lora_A.weight` (module short name at -3)
    adapters = [(n, d) for n, d in shape.lora_params(rank) if n.split(".")[-3] in targets]
    params = dict(shape.params)
    modules = dict.fromkeys(name.rsplit(".lora_", 1)[0] for name, _ in adapters)
    bases = [(f"{m}.weight", params[f"{m}.weight"]) for m in modules]
    shards = [-(-rows // world) * cols for _, (rows, cols) in adapters]

    def per_layer(items: list[tuple[str, tuple[int, ...]]]) -> int:
        groups: dict[str, int] = {}
        for name, dims in items:
            groups[layer_key(name)] = groups.get(layer_key(name), 0) + count(((name, dims),))
        return max((n for key, n in groups.items() if is_layer(key)), default=0)

    return Adapters(
        elements=count(tuple(adapters)),
        shard=sum(shards),
        largest_shard=max(shards, default=0),
        layer=per_layer(adapters),
        adapted=count(tuple(bases)),
        adapted_layer=per_layer(bases),
        largest_adapted=max((count((b,)) for b in bases), default=0),
    )


@functools.cache
def _engine_lora_rank(rank: int) -> int:
    """vLLM's max_lora_rank for an adapter of `rank` (rounded up to a size vLLM accepts)."""
    from hybrid.rollout.vllm_engine import vllm_lora_rank

    return vllm_lora_rank(rank)


# --- one worker's sizes --------------------------------------------------------------------


@dataclass(frozen=True)
class WorkerSizes:
    """Bytes of one worker's components and transients, from (config, shape, LoRA rank,
    device memory)."""

    config: TrainerRunConfig
    shape: ModelShape
    lora_rank: int
    gpu_bytes: float
    gpu: str = DEFAULT_GPU
    """The GPU kind (hybrid.memory.reserve.GPU_KINDS): vLLM's batch defaults depend on it."""

    @property
    def on_gpu(self) -> bool:
        return self.config.trainer.use_gpu

    @cached_property
    def dtypes(self) -> ComputeDtypes:
        """actor / ref / rollout dtypes with `auto` resolved for the planned device."""
        c = self.config
        return ComputeDtypes.resolve(
            c.actor.param_dtype, c.ref.param_dtype, c.rollout.dtype, planned_hardware(self.on_gpu)
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
        return dtype_bytes(self.config.actor.master_dtype)

    @property
    def tp(self) -> int:
        return self.config.rollout.tensor_parallel_size

    @property
    def seq(self) -> int:
        return self.config.rollout.prompt_length + self.config.rollout.response_length

    @property
    def world(self) -> int:
        """Data-parallel ranks: every worker takes its own rows."""
        return self.config.trainer.num_workers

    @property
    def shard_world(self) -> int:
        """Ranks a parameter is sharded over (all of them, or one HSDP replica's)."""
        return self.world // self.config.actor.hsdp_replicas

    @property
    def lora(self) -> Adapters:
        return _adapters(self.shape, self.lora_rank, lora_targets(self.config), self.shard_world)

    @property
    def adapter_sync(self) -> bool:
        """LoRA with sync.lora_mode=adapter: a LoRA-enabled engine, adapters sent each sync."""
        return self.lora_rank > 0 and self.config.sync.lora_mode == "adapter"

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

    def rollout_weights(self) -> int:
        s = self.shape
        split = -(-(s.num_params - s.norm_params) // self.tp)
        # enable_lora preallocates one adapter slot of max_lora_rank on every projection vLLM
        # supports (all of q,k,v,o,gate,up,down whatever the targets; unsplit: an upper bound)
        slots = s.adapters(_engine_lora_rank(self.lora_rank)) if self.adapter_sync else 0
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

    def cast_shard(self) -> int:
        """The one shard cast to the engine's dtype beside a group's full tensors (none for a
        LoRA base already in that dtype: `.to(dtype)` returns it as is)."""
        if self.lora_rank and self.dtypes.actor == self.dtypes.rollout:
            return 0
        return self.shape.largest_shard(self.shard_world) * self.engine_bytes

    def weight_gather(self) -> int:
        """Full bf16 weights of sync.gather's largest group: every sync of full fine-tuning,
        the first of LoRA's adapter mode (the frozen base)."""
        group = self.shape.gather_peak(self.config.sync.gather, self.config.sync.bucket_mb << 20)
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
        root = self.shape.gather_peak("layer", self.config.sync.bucket_mb << 20) * self.engine_bytes
        return largest_moment(merge, {"gather_buffers": root + self.cast_shard()})

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
        """Full-logits path: `full` (T, V) tensors in the compute dtype + `fp32_copies` (n, V)
        in fp32 (with rows, T = b x S and n = b x R)."""
        v = self.shape.vocab_size
        return full * mb.tokens * v * self.cb + fp32_copies * mb.scored * v * 4

    @property
    def chunked(self) -> bool:
        """Log-probs from the chunked scoring head (model.log_prob_chunk_tokens > 0)."""
        return self.config.model.log_prob_chunk_tokens > 0

    def head_chunk(self, mb: MicroBatch, backward: bool) -> int:
        """The scoring head's (c, V) buffers: 3 fp32 in forward, fp32 + probabilities + the cb
        cast of dlogits in backward."""
        rows = min(self.config.model.log_prob_chunk_tokens, mb.scored)
        per_logit = 2 * 4 + self.cb if backward else CHUNK_FORWARD_FP32 * 4
        return rows * self.shape.vocab_size * per_logit

    def micro_batch(self, name: PassName) -> MicroBatch:
        """The largest micro-batch of a pass (see the module docstring)."""
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
        return micro_batch_of(self.config, update, dynamic, budget, micro)

    def unsharded(self, dtype_bytes: int) -> int:
        """The root + the current layer + the prefetched layer, all-gathered by FSDP2."""
        return unsharded_bytes(self.shape, dtype_bytes, self.lora.layer)

    # Trainer-side transients: a no-grad forward, the update's forward and backward.

    def scoring(self, name: PassName, dtype_bytes: int, fp32_copies: int) -> Bytes:
        """A no-grad forward (reference or old log-probs): the larger of a layer's working set
        and the LM head's (beside the final hidden states), with the unsharded parameters.
        `fp32_copies`: of the full-logits path."""
        mb, s, cb = self.micro_batch(name), self.shape, self.cb
        unsharded = self.unsharded(dtype_bytes)
        hidden = mb.tokens * s.hidden_size * cb
        if self.chunked:  # + the gathered hidden states of the scored tokens
            head = {
                "activations": hidden + mb.scored * s.hidden_size * cb,
                "logits": self.head_chunk(mb, backward=False),
            }
        else:
            head = {"activations": hidden, "logits": self.logits(mb, 1, fp32_copies)}
        return largest_moment(
            {"unsharded_params": unsharded, "activations": mb.tokens * s.nograd_layer(cb)},
            {"unsharded_params": unsharded, **head},
        )

    def update_forward(self) -> Bytes:
        mb, s, cb = self.micro_batch("update"), self.shape, self.cb
        saved = mb.tokens * s.saved_activations(cb, self.config.model.gradient_checkpointing)
        base = {"unsharded_params": self.unsharded(cb), "activations": saved}
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
        return largest_moment(head, {**base, "activations": saved + mb.tokens * s.nograd_layer(cb)})

    def update_backward(self) -> Bytes:
        """The largest of three moments: the loss's backward through the LM head; the first
        decoder layer's backward (recompute, activation and layer gradients); the root's
        reduce-scatter at the end (its parameters already resharded)."""
        s, a, mb = self.shape, self.config.actor, self.micro_batch("update")
        cb, lora = self.cb, self.lora_rank > 0
        checkpointed = self.config.model.gradient_checkpointing
        saved = mb.tokens * s.saved_activations(cb, checkpointed)
        work = mb.tokens * s.layer_backward(cb, checkpointed)
        reduce = reduce_bytes(self.dtypes.actor, a.reduce_dtype)
        # Until the embedding's gradient closes the root group, it holds the LM head's gradient;
        # with LoRA the root is frozen and only the adapters have gradients.
        head_grad = 0 if lora else s.vocab_size * s.hidden_size * cb
        layer_grads = (self.lora.layer if lora else s.largest_layer) * reduce
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
            },
            {"unsharded_grads": (0 if lora else s.root_params) * reduce, "logits": kept},
        )


def planned_hardware(on_gpu: bool) -> Hardware:
    """What `auto` dtypes resolve for: a bf16 GPU, or this machine's CPU."""
    return PLANNED_GPU if on_gpu else Hardware.detect(torch.device("cpu"))


def reduce_bytes(compute: str, reduce_dtype: str) -> int:
    """Per element of a layer's unsharded gradient: the compute dtype's, + a copy in the
    reduce dtype for the reduce-scatter when the two differ."""
    return dtype_bytes(compute) + (dtype_bytes(reduce_dtype) if reduce_dtype != compute else 0)


def unsharded_bytes(shape: ModelShape, dtype_bytes: int, adapter_layer: int = 0) -> int:
    """The root + the current layer + the prefetched layer, all-gathered by FSDP2."""
    return (shape.root_params + 2 * (shape.largest_layer + adapter_layer)) * dtype_bytes


def micro_batch_of(
    config: TrainerRunConfig, update: bool, dynamic: bool, budget: int, micro: int
) -> MicroBatch:
    """The largest micro-batch of a pass over the rows one worker holds for it (an update:
    its share of a mini-batch), by rows (`micro`) or by the token `budget` when `dynamic`."""
    c = config
    seq, r = c.rollout.prompt_length + c.rollout.response_length, c.rollout.response_length
    rows = c.mini_batch_rows_per_worker if update else -(-c.rows_per_step // c.trainer.num_workers)
    if not dynamic:
        b = min(micro, rows)
        return MicroBatch(tokens=b * seq, scored=b * r, split=b < rows)
    valid = min(budget, rows * seq)
    # Padded, the budget bounds the valid tokens only: a row may hold a single one.
    tokens = valid if c.model.use_remove_padding else min(budget, rows) * seq
    return MicroBatch(tokens=tokens, scored=min(valid, rows * r), split=valid < rows * seq)


def largest_moment(*moments: Bytes) -> Bytes:
    """The moment with the most bytes (a phase's peak is its largest moment, not their sum)."""
    return max(moments, key=lambda moment: sum(moment.values()))
