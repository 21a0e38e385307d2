"""The memory planner: what one worker's device holds at every phase of a GRPO step,
predicted from the run's config and the model's shape, without a GPU.

`plan_memory(config, shape, gpu_memory_gib)` gives, for every boundary of
hybrid.memory.records.STEP_PHASES, the components resident at the phase's peak (COMPONENTS
names, so the memory report puts them next to the measured ones) and the transient bytes that
make the peak. hybrid.memory.suggest searches the cheapest config changes that make an
over-budget run fit; hybrid.memory.plan_format prints a plan. Per worker (one GPU), steady state (step >= 2: AdamW's state exists). Notation:
W = trainer.num_workers, P = parameters, h / I / L / V = hidden size, MLP width, layers,
vocabulary, kv = KV heads x head_dim, S = rollout.prompt_length + rollout.response_length,
R = rollout.response_length, b = the micro-batch, cb = bytes of actor.param_dtype.

Resident (what the code keeps where):
  actor_params     P/W x bytes(master_dtype): the FSDP2 full shard (rank 0 holds ceil(rows/W)
                   rows of every tensor, the largest shard). LoRA: see below.
  actor_grads      the trainable shard in master dtype, from a mini-batch's first backward to
                   the optimizer step (zero_grad(set_to_none=True)).
  optimizer_state  AdamW exp_avg + exp_avg_sq: 2 x the trainable shard x bytes(master).
  ref_params       P/W x bytes(ref.param_dtype), only with actor.use_kl_loss (the reference is
                   built for the KL loss); none with LoRA.
  rollout_weights  2 bytes x ((P - norm weights) / tp + norm weights): vLLM's bf16 weights
                   (+ the adapter slots of a LoRA engine).
  kv_cache         see below.
  engine_overhead  vLLM's buffers outside its sleep pools: inputs_embeds (max_num_batched_tokens
                   x h x 2) + 256 MiB of NCCL / cuBLAS workspaces (+1 GiB of CUDA graphs
                   without enforce_eager); an estimate, 0 on CPU.
  runtime          predicted 0: the interpreter and libraries are unknown to a planner (the
                   measured CPU report counts the process RSS, which includes them).
actor.param_offload / actor.optimizer_offload / ref.param_offload park their tensors on the
host outside the phases that use them, with trainer.use_gpu only (on CPU the moves are
no-ops). On CUDA the engine sleeps (level 1) in trainer mode: weights to the host, KV cache
dropped; on CPU both stay. The optimizer state is onloaded for the whole update
(`trainer_phase("update", with_optimizer=True)`), so optimizer_offload lowers every
phase but update/*. An offload phase's components are those before the move (its peak).

Transient (the larger of a phase's moments, not their sum):
  FSDP2 keeps the root (embedding, final norm, LM head) unsharded through forward and
  backward, and one decoder layer plus one prefetched: (root + 2 x layer) x cb. Backward holds
  the LM head's unsharded gradient (V x h x cb) until the embedding's closes the root group,
  one layer's unsharded gradients (cb, + a reduce_dtype copy for the reduce-scatter), and at
  the end the whole root's (parameters resharded by then).
  Saved activations per token and decoder layer (flash / sdpa attention: no S^2 term):
    2 RMSNorms x (4h fp32 upcast + h x cb normalised) + attention (q, k, v after RoPE, the
    output, o_proj's input: (3h + 2kv) x cb) + SwiGLU (gate, silu, up, product: 4I x cb)
    A = 8h + cb x (5h + 2kv + 4I)   (18h + 4kv + 8I bytes in bf16)
  Forward with grad saves b x S x (L x A + 4h + h x cb) (+ the final norm); with
  model.gradient_checkpointing (one checkpoint per layer) b x S x (L x h x cb + 4h + h x cb),
  and backward recomputes one layer (b x S x A) beside activation gradients
  b x S x (2h + 3I) x cb. A no-grad layer's working set: b x S x (4h + cb x (3h + 3I)).
  Logits: HF computes (b, S, V) in cb and `response_logits` keeps a view of it; log-prob and
  entropy upcast the response slice (b, R, V) to fp32: 2 fp32 copies for a log-prob (copy,
  logsumexp temporary), 3 with the entropy (copy, softmax, product), 4 in the update's
  forward (the copy saved for backward + the entropy's 3; 5 with entropy_coeff > 0); backward
  adds the (b, S, V) gradient in cb and 3 fp32 (saved copy, its gradient, the softmax).
  b = ref.micro_batch_size for the reference, actor.micro_batch_size for old log-probs and the
  update (at most the rows a worker has).
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
16384 / 1024 on >= 70 GiB devices, 8192 / 256 below); it refuses to start unless U is free
then (the actor's shards are already on the device). What the trainer leaves on the device
in rollout mode comes on top of U. On CPU with the bytes null, vLLM's default utilisation 0.9
applies to the given memory. A cache below rollout.max_model_len tokens does not fit (vLLM
refuses to start). One rollout needs, per engine, (train_batch_size x tp / W) prompts x n
sequences of S tokens, at most max_num_seqs of them at once; a smaller cache only queues.

LoRA (model.lora; plan_memory's `lora_rank` > 0 overrides its rank): rank-r adapters A (r, in)
and B (out, r) on the model.lora.target_modules among q,k,v,o,gate,up,down (all seven for
all-linear, as hybrid.workers.lora picks for Qwen2; other names are not counted, so a model
whose decoder linears are named otherwise, e.g. a fused qkv_proj, is under-counted). The base
is frozen in param_dtype, the adapters are in master dtype and alone trainable:
actor_params = P/W x cb + the adapter shard x bytes(master); actor_grads and optimizer_state
cover the adapter shard only. No ref_params: the reference forward is the actor's with its
adapters disabled (b = ref.micro_batch_size). FSDP2 unshards a layer's adapters with it;
backward holds no LM-head or root gradient, and one layer's adapter gradients.
sync.lora_mode=adapter starts vLLM with enable_lora: one slot of max_lora_rank (r rounded up to
a size vLLM accepts) on all seven projections, whatever the targets, in bf16 in
rollout_weights (unsplit by tp: an upper bound). Its sync (hybrid.sharding.lora_sync) gathers
every adapter in bf16 and keeps them until the peft file is written: the gather is all the
adapters whatever sync.layered_summon (which only bounds each collective). The first sync also
sends the base, grouped by sync.gather and already bf16 (no cast shard); the steady phases
leave it out, a note gives its peak and a problem is raised when it does not fit. merge gathers
a decoder layer's (layered_summon; else the whole model's) base in bf16 and adapters in fp32,
keeps the merged bf16 copy of every adapted weight of the group and, for the one being merged,
merge_into_base's fp32 temporaries (W.float(), B @ A, its scaled copy: 12 bytes per element);
a root tensor alone (the embedding) may be the larger group. vLLM then needs no adapter slots.

Fits: every phase's peak <= gpu memory - 1.5 GiB (CUDA context ~0.5 GiB, NCCL buffers,
allocator fragmentation; no reserve on CPU), the KV cache holds max_model_len tokens, and
vLLM can start. The constants are estimates, to be calibrated with profiling.memory_report.

Worked example: configs/qwen2_5_7b_gsm8k_8gpu.yaml (Qwen2.5-7B on 8 x 80 GiB, tp 2, S = 512 +
1024, micro-batch 4, ref micro-batch 16, gradient checkpointing, every offload on):
  P = 7,615,616,512: 951,952,064 per rank = 3.55 GiB fp32 parameters, 3.55 GiB gradients,
  7.09 GiB AdamW state; vLLM weights 7.09 GiB per TP rank.
  Sync gather: layer 1.14 GiB (the 545M-element embedding, larger than a 233M layer), full
  14.3 GiB; the sync peaks at 12.1 GiB (actor onloaded + engine weights + gather).
  Update backward (b = 4, 6,144 tokens): checkpointed activations 1.27 GiB, logits 10.4 GiB
  (2 x 1.74 bf16 + 3 x 2.32 fp32), unsharded root + 2 layers 2.90 GiB, LM-head gradient
  1.02 GiB, + 14.5 GiB resident -> 30.2 GiB. The reference forward (b = 16) reaches 30.7 GiB,
  25.5 of it logits.
  KV: U = 0.6 x 80 = 48 GiB - 7.09 weights - 0.36 overhead - 2.90 sampler reserve = 37.6 GiB
  = 1,409,856 tokens at 28 KiB per token, for 491,520 needed (320 sequences x 1,536).
  Peak: rollout/generate, 47.5 GiB; fits with a 31.0 GiB margin (budget 78.5 GiB).

Worked example, LoRA: configs/qwen2_5_7b_lora_gsm8k_8gpu.yaml (the same run with rank-32
all-linear adapters, adapter sync, layered; actor and optimizer state kept on the device):
  Adapters 28 layers x 32 x 90,112 (in + out of the seven projections) = 80,740,352 (1.06% of
  P): 10,092,544 per rank = 38.5 MiB fp32, as much gradient, 77 MiB AdamW state; with the
  1.77 GiB bf16 base shard, actor_params 1.81 GiB. vLLM weights 7.09 + 0.15 GiB adapter slots.
  Sync gather: the adapters, 0.15 GiB (the first sync: the base's embedding, 1.02 GiB; merge
  would gather 0.45 GiB and hold 1.07 GiB of merged copies and temporaries per layer).
  Update backward: logits 10.4 + unsharded 2.91 + activations 1.27 + 2.28 resident -> 16.9 GiB
  (30.2 with full fine-tuning). The reference forward stays at 30.8 GiB (25.5 of logits, the
  actor's 1.81 in place of the reference's 1.77): the trainer-side peak.
  KV: 48 GiB - 7.24 weights - 0.36 overhead - 2.90 sampler reserve = 37.5 GiB = 1,404,224
  tokens. Peak: rollout/generate, 49.4 GiB (1.89 above full fine-tuning's: the actor and its
  AdamW state stay on the device); fits with a 29.1 GiB margin.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hybrid.memory.model_shape import (
    LORA_TARGETS,
    ModelShape,
    count,
    is_layer,
    layer_key,
    model_shape,
)
from hybrid.memory.records import COMPONENTS, GIB, STEP_PHASES

if TYPE_CHECKING:
    from hybrid.trainer.config import TrainerRunConfig

__all__ = ["ModelShape", "PhasePrediction", "Plan", "lora_rank_of", "model_shape", "plan_memory"]

RESERVE_GIB = 1.5
"""Kept free on CUDA: CUDA context, NCCL buffers, allocator fragmentation."""
CPU_DEFAULT_UTILIZATION = 0.9
"""vLLM's own gpu_memory_utilization default (the engine passes ours only on CUDA)."""
SAMPLER_BYTES_PER_LOGIT = 20
ENGINE_WORKSPACE_BYTES = 256 << 20
"""NCCL / cuBLAS workspaces and sampler state of the engine, outside its sleep pools."""
CUDA_GRAPH_BYTES = 1 << 30
"""Rough size of vLLM's CUDA graphs when rollout.enforce_eager is false."""
ENGINE_BYTES = 2
"""vLLM runs in bfloat16, and the sync gathers in bfloat16."""
MERGE_BYTES_PER_ELEMENT = 12
"""hybrid.workers.lora.merge_into_base: W.float(), B @ A and its scaled copy, fp32, at once."""
_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}

Bytes = dict[str, int]


@dataclass(frozen=True)
class PhasePrediction:
    peak_gib: float
    """sum(components_gib) + sum(transient_gib)."""
    components_gib: dict[str, float]
    """Resident at the phase's peak (for an offload: before the move), by COMPONENTS name."""
    transient_gib: dict[str, float]
    """Alive only within the phase (activations, logits, unsharded params, gather buffers)."""


@dataclass(frozen=True)
class Plan:
    model: str
    device: str
    """"cuda" (trainer.use_gpu) or "cpu"."""
    gpu_memory_gib: float
    reserve_gib: float
    budget_gib: float
    """gpu_memory_gib - reserve_gib: what every phase's peak must stay below."""
    lora_rank: int
    phases: dict[str, PhasePrediction]
    """By STEP_PHASES name, in step order."""
    peak_phase: str
    peak_gib: float
    steady_gib: dict[str, float]
    """Sum of the components in the trainer-mode and rollout-mode steady states."""
    kv_cache_gib: float
    kv_bytes_per_token: int
    kv_tokens: int
    """Tokens one engine's KV cache holds (whole 16-token blocks)."""
    kv_tokens_needed: int
    """Tokens one rollout needs per engine to run all its sequences at once."""
    fits: bool
    problems: tuple[str, ...]
    """Why it does not fit (empty when it fits)."""
    notes: tuple[str, ...] = ()

    @property
    def margin_gib(self) -> float:
        return self.budget_gib - self.peak_gib


# --- LoRA adapters -------------------------------------------------------------------------


def lora_rank_of(config: TrainerRunConfig, lora_rank: int = 0) -> int:
    """The LoRA rank a plan uses: `lora_rank` when > 0 (an override), else model.lora.rank."""
    if lora_rank < 0:
        raise ValueError(f"lora_rank must be >= 0, got {lora_rank}")
    return lora_rank or config.model.lora.rank


def _targets(config: TrainerRunConfig) -> tuple[str, ...]:
    """The projections with adapters: model.lora.target_modules, all of them for all-linear."""
    targets = config.model.lora.target_modules
    return LORA_TARGETS if isinstance(targets, str) else tuple(targets)


@dataclass(frozen=True)
class _Adapters:
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
def _adapters(shape: ModelShape, rank: int, targets: tuple[str, ...], world: int) -> _Adapters:
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

    return _Adapters(
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
class _Worker:
    """Bytes of one worker, from (config, shape, device memory, LoRA adapters)."""

    config: TrainerRunConfig
    shape: ModelShape
    lora_rank: int
    gpu_bytes: float

    @property
    def on_gpu(self) -> bool:
        return self.config.trainer.use_gpu

    @property
    def cb(self) -> int:
        return _BYTES[self.config.actor.param_dtype]

    @property
    def master(self) -> int:
        return _BYTES[self.config.actor.master_dtype]

    @property
    def tp(self) -> int:
        return self.config.rollout.tensor_parallel_size

    @property
    def seq(self) -> int:
        return self.config.rollout.prompt_length + self.config.rollout.response_length

    @property
    def world(self) -> int:
        return self.config.trainer.num_workers

    @property
    def lora(self) -> _Adapters:
        return _adapters(self.shape, self.lora_rank, _targets(self.config), self.world)

    @property
    def adapter_sync(self) -> bool:
        """LoRA with sync.lora_mode=adapter: a LoRA-enabled engine, adapters sent each sync."""
        return self.lora_rank > 0 and self.config.sync.lora_mode == "adapter"

    @property
    def trainable_shard(self) -> int:
        return self.lora.shard if self.lora_rank else self.shape.shard(self.world)

    def actor_params(self) -> int:
        if self.lora_rank:  # frozen base in the compute dtype + adapters in the master dtype
            return self.shape.shard(self.world) * self.cb + self.trainable_shard * self.master
        return self.trainable_shard * self.master

    def ref_params(self) -> int:
        return self.shape.shard(self.world) * _BYTES[self.config.ref.param_dtype]

    def rollout_weights(self) -> int:
        s = self.shape
        split = -(-(s.num_params - s.norm_params) // self.tp)
        # enable_lora preallocates one adapter slot of max_lora_rank on every projection vLLM
        # supports (all of q,k,v,o,gate,up,down whatever the targets; unsplit: an upper bound)
        slots = s.adapters(_engine_lora_rank(self.lora_rank)) if self.adapter_sync else 0
        return ENGINE_BYTES * (split + s.norm_params + slots)

    def vllm_limits(self) -> tuple[int, int]:
        """vLLM's offline (max_num_batched_tokens, max_num_seqs) for a device this big."""
        return (16384, 1024) if self.gpu_bytes >= 70 * GIB else (8192, 256)

    def engine_overhead(self) -> int:
        if not self.on_gpu:
            return 0
        graphs = 0 if self.config.rollout.enforce_eager else CUDA_GRAPH_BYTES
        embeds = self.vllm_limits()[0] * self.shape.hidden_size * ENGINE_BYTES
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
        """The one shard cast to bf16 beside a group's full tensors (none for a bf16 LoRA base:
        `.to(bfloat16)` returns it as is)."""
        if self.lora_rank and self.config.actor.param_dtype == "bfloat16":
            return 0
        return self.shape.largest_shard(self.world) * ENGINE_BYTES

    def weight_gather(self) -> int:
        """Full bf16 weights of sync.gather's largest group: every sync of full fine-tuning,
        the first of LoRA's adapter mode (the frozen base)."""
        group = self.shape.gather_peak(self.config.sync.gather, self.config.sync.bucket_mb << 20)
        return group * ENGINE_BYTES + self.cast_shard()

    def sync_transient(self) -> Bytes:
        """What a steady-state sync gathers (see hybrid.sharding.lora_sync for LoRA)."""
        a = self.lora
        if not self.lora_rank:
            return {"gather_buffers": self.weight_gather()}
        if self.adapter_sync:  # gather_adapter moves each group to the host once gathered
            group = a.layer if self.config.sync.layered_summon else a.elements
            return {"gather_buffers": (group + a.largest_shard) * ENGINE_BYTES}
        # merge: a group's base (bf16) and adapters (fp32), the merged copies of its adapted
        # weights, merge_into_base's fp32 temporaries of the largest one
        layered = self.config.sync.layered_summon
        base = self.shape.largest_layer if layered else self.shape.num_params
        adapters, adapted = (a.layer, a.adapted_layer) if layered else (a.elements, a.adapted)
        merged = (adapted - a.largest_adapted) * ENGINE_BYTES
        merge = {
            "gather_buffers": base * ENGINE_BYTES + adapters * 4 + self.cast_shard(),
            "merge_temps": merged + MERGE_BYTES_PER_ELEMENT * a.largest_adapted,
        }
        if not layered:
            return merge
        # a root tensor (the embedding) is a group of its own, and may be the larger one
        root = self.shape.gather_peak("layer", self.config.sync.bucket_mb << 20) * ENGINE_BYTES
        return _largest(merge, {"gather_buffers": root + self.cast_shard()})

    def optimizer_temporaries(self) -> int:
        if self.on_gpu:  # foreach AdamW: one temporary the size of the trainable shard
            return self.trainable_shard * self.master
        largest = (
            self.lora.largest_shard if self.lora_rank else self.shape.largest_shard(self.world)
        )
        return largest * self.master

    def logits(self, b: int, full: int, fp32_copies: int) -> int:
        """`full` (b, S, V) tensors in the compute dtype + `fp32_copies` (b, R, V) in fp32."""
        v, r = self.shape.vocab_size, self.config.rollout.response_length
        return full * b * self.seq * v * self.cb + fp32_copies * b * r * v * 4

    def unsharded(self, dtype_bytes: int) -> int:
        """The root + the current layer + the prefetched layer, all-gathered by FSDP2."""
        s = self.shape
        layer = s.largest_layer + self.lora.layer
        return (s.root_params + 2 * layer) * dtype_bytes


# --- transients ----------------------------------------------------------------------------


def _largest(*moments: Bytes) -> Bytes:
    return max(moments, key=lambda moment: sum(moment.values()))


def _scoring(w: _Worker, micro: int, dtype_bytes: int, fp32_copies: int) -> Bytes:
    """A no-grad forward (reference or old log-probs): the larger of a layer's working set
    and the logits, beside the unsharded parameters."""
    b = min(micro, -(-w.config.rows_per_step // w.world))
    tokens, unsharded = b * w.seq, w.unsharded(dtype_bytes)
    return _largest(
        {"unsharded_params": unsharded, "activations": tokens * w.shape.nograd_layer(w.cb)},
        {
            "unsharded_params": unsharded,
            "activations": tokens * w.shape.hidden_size * w.cb,
            "logits": w.logits(b, 1, fp32_copies),
        },
    )


def _update_forward(w: _Worker) -> Bytes:
    b, s = w.config.actor.micro_batch_size, w.shape
    saved = b * w.seq * s.saved_activations(w.cb, w.config.model.gradient_checkpointing)
    fp32 = 4 + (1 if w.config.actor.entropy_coeff > 0 else 0)  # + the entropy's graph
    base = {"unsharded_params": w.unsharded(w.cb), "activations": saved}
    return _largest(
        {**base, "logits": w.logits(b, 1, fp32)},
        {**base, "activations": saved + b * w.seq * s.nograd_layer(w.cb)},
    )


def _update_backward(w: _Worker) -> Bytes:
    """The largest of three moments: the loss's backward through the logits; the first
    decoder layer's backward (recompute, activation and layer gradients); the root's
    reduce-scatter at the end (its parameters already resharded)."""
    s, a, b = w.shape, w.config.actor, w.config.actor.micro_batch_size
    checkpointed = w.config.model.gradient_checkpointing
    saved = b * w.seq * s.saved_activations(w.cb, checkpointed)
    recompute = s.layer_activations(w.cb) if checkpointed else 0
    work = b * w.seq * (recompute + (2 * s.hidden_size + 3 * s.intermediate_size) * w.cb)
    reduce = w.cb + (_BYTES[a.reduce_dtype] if a.reduce_dtype != a.param_dtype else 0)
    # Until the embedding's gradient closes the root group, it holds the LM head's gradient.
    head_grad = 0 if w.lora_rank else s.vocab_size * s.hidden_size * w.cb
    layer_grads = (w.lora.layer if w.lora_rank else s.largest_layer) * reduce
    unsharded = w.unsharded(w.cb)
    return _largest(
        {
            "unsharded_params": unsharded,
            "unsharded_grads": head_grad,
            "activations": saved,
            "logits": w.logits(b, 2, 3),
        },
        {
            "unsharded_params": unsharded,
            "unsharded_grads": head_grad + layer_grads,
            "activations": saved + work,
            "logits": w.logits(b, 1, 0),
        },
        {
            "unsharded_grads": (0 if w.lora_rank else s.root_params) * reduce,
            "logits": w.logits(b, 1, 0),
        },
    )


# --- phases --------------------------------------------------------------------------------


def _resident(
    w: _Worker, *, actor: bool, optimizer: bool, ref: bool, weights: bool, kv: bool, grads: bool
) -> Bytes:
    """Component bytes on the device (zeros left out), given what is there."""
    trainable = w.trainable_shard * w.master
    uses_ref = w.config.actor.use_kl_loss and not w.lora_rank  # LoRA: the actor is the reference
    held = {
        "actor_params": w.actor_params() if actor else 0,
        "actor_grads": trainable if grads else 0,
        "optimizer_state": 2 * trainable if optimizer else 0,
        "ref_params": w.ref_params() if ref and uses_ref else 0,
        "rollout_weights": w.rollout_weights() if weights else 0,
        "kv_cache": max(w.kv_cache(), 0) if kv else 0,
        "engine_overhead": w.engine_overhead(),
    }
    return {name: held[name] for name in COMPONENTS if held.get(name)}


def _phases(w: _Worker) -> dict[str, tuple[Bytes, Bytes]]:
    """(resident, transient) bytes at the peak of every STEP_PHASES interval."""
    c, gpu = w.config, w.on_gpu
    kept = {  # between phases; offload and the engine's sleep act only on CUDA
        "actor": not (gpu and c.actor.param_offload),
        "optimizer": not (gpu and c.actor.optimizer_offload),
        "ref": not (gpu and c.ref.param_offload),
        "weights": not (gpu and c.rollout.free_cache_engine),
        "kv": not (gpu and c.rollout.free_cache_engine),
        "grads": False,
    }

    def on(**moved: bool) -> Bytes:
        return _resident(w, **{**kept, **moved})

    # The reference runs only for the KL loss; with LoRA it is the actor, adapters disabled.
    ref, ref_forward = on(), {}
    if c.actor.use_kl_loss:
        ref = on(actor=True) if w.lora_rank else on(ref=True)
        ref_dtype = w.cb if w.lora_rank else _BYTES[c.ref.param_dtype]
        ref_forward = _scoring(w, c.ref.micro_batch_size, ref_dtype, 2)
    sync, rollout = on(actor=True, weights=True), on(weights=True, kv=True)
    update = on(actor=True, optimizer=True)
    with_grads = on(actor=True, optimizer=True, grads=True)
    # Gradients survive between micro-batches of a mini-batch (freed by the optimizer step).
    accumulating = c.mini_batch_rows_per_worker > c.actor.micro_batch_size
    phases = {
        "rollout/enter": (on(), {}),
        "sync/onload_actor": (on(actor=True), {}),
        "sync/wake_weights": (sync, {}),
        "sync/gather_load": (sync, w.sync_transient()),
        "sync/offload_actor": (sync, {}),
        "rollout/wake_kv": (rollout, {}),
        "rollout/generate": (rollout, {"engine_activations": w.generate_activations()}),
        "trainer/release_kv": (rollout, {}),
        "trainer/ready": (on(), {}),
        "ref/onload": (ref, {}),
        "ref/forward": (ref, ref_forward),
        "ref/offload": (ref, {}),
        "old_log_prob/onload": (on(actor=True), {}),
        "old_log_prob/forward": (on(actor=True), _scoring(w, c.actor.micro_batch_size, w.cb, 3)),
        "old_log_prob/offload": (on(actor=True), {}),
        "update/onload": (update, {}),
        "update/forward": (with_grads if accumulating else update, _update_forward(w)),
        "update/backward": (with_grads, _update_backward(w)),
        "update/optimizer_step": (with_grads, {"optimizer_temps": w.optimizer_temporaries()}),
        "update/offload": (update, {}),
    }
    assert tuple(phases) == STEP_PHASES, "the planner's phases drifted from STEP_PHASES"
    return phases


def _gib(table: Bytes) -> dict[str, float]:
    return {name: nbytes / GIB for name, nbytes in table.items() if nbytes}


def plan_memory(
    config: TrainerRunConfig, shape: ModelShape, gpu_memory_gib: float, lora_rank: int = 0
) -> Plan:
    """Predicted memory of one worker at every phase of a step (see the module docstring).

    LoRA comes from config.model.lora; `lora_rank` > 0 overrides its rank (the same plan as
    the override model.lora.rank=R)."""
    if gpu_memory_gib <= 0:
        raise ValueError(f"gpu_memory_gib must be > 0, got {gpu_memory_gib}")
    rank = lora_rank_of(config, lora_rank)
    w = _Worker(config, shape, rank, gpu_memory_gib * GIB)
    phases = {}
    for name, (resident, transient) in _phases(w).items():
        components, extra = _gib(resident), _gib(transient)
        peak = sum(components.values()) + sum(extra.values())
        phases[name] = PhasePrediction(peak, components, extra)
    peak_phase = max(phases, key=lambda name: phases[name].peak_gib)
    reserve = RESERVE_GIB if w.on_gpu else 0.0
    budget = gpu_memory_gib - reserve
    kv_bytes, per_token = w.kv_cache(), shape.kv_bytes_per_token(w.tp)
    kv_tokens = max(kv_bytes, 0) // per_token // 16 * 16
    seqs = min(w.sequences_per_engine(), w.vllm_limits()[1])
    problems = _problems(w, phases, budget, kv_bytes, kv_tokens)
    notes = ["runtime (interpreter, libraries) is not predicted: 0 here"]
    if rank:
        notes += _lora_notes(w, phases["sync/gather_load"], budget, problems)
    if 0 < kv_tokens < seqs * w.seq:
        notes.append(
            f"the KV cache holds {kv_tokens:,} of the {seqs * w.seq:,} tokens one rollout needs "
            f"per engine: about {kv_tokens // w.seq} of {seqs} sequences run at once, the rest "
            "queue"
        )
    return Plan(
        model=shape.name,
        device="cuda" if w.on_gpu else "cpu",
        gpu_memory_gib=gpu_memory_gib,
        reserve_gib=reserve,
        budget_gib=budget,
        lora_rank=rank,
        phases=phases,
        peak_phase=peak_phase,
        peak_gib=phases[peak_phase].peak_gib,
        steady_gib={
            mode: sum(phases[phase].components_gib.values())
            for mode, phase in (("trainer", "trainer/ready"), ("rollout", "rollout/wake_kv"))
        },
        kv_cache_gib=kv_bytes / GIB,
        kv_bytes_per_token=per_token,
        kv_tokens=kv_tokens,
        kv_tokens_needed=seqs * w.seq,
        fits=not problems,
        problems=tuple(problems),
        notes=tuple(notes),
    )


def _lora_notes(w: _Worker, sync: PhasePrediction, budget: float, problems: list[str]) -> list[str]:
    """What LoRA changes, and the first sync of adapter mode (the base), which the steady-state
    phases leave out; a problem is added to `problems` when that sync does not fit."""
    a, targets, s = w.lora, _targets(w.config), w.shape
    unknown = [t for t in targets if t not in LORA_TARGETS]
    notes = [
        f"LoRA rank {w.lora_rank} on {', '.join(t for t in targets if t in LORA_TARGETS)}: "
        f"{a.elements:,} adapter parameters ({100 * a.elements / s.num_params:.2f}% of "
        f"{s.num_params:,}); gradients and AdamW state for them only; no reference model"
    ]
    if unknown:
        notes.append(
            f"model.lora.target_modules {unknown} are not counted (planner: {LORA_TARGETS})"
        )
    if w.adapter_sync:
        first = w.weight_gather() / GIB
        peak = sum(sync.components_gib.values()) + first
        notes.append(
            f"the first sync also sends the base (sync.gather={w.config.sync.gather}: "
            f"{first:.2f} GiB gathered, sync/gather_load {peak:.2f} GiB); later ones the adapters"
        )
        if peak > budget:
            problems.append(f"first sync (the base): peak {peak:.2f} GiB > budget {budget:.2f} GiB")
    return notes


def _problems(
    w: _Worker, phases: dict[str, PhasePrediction], budget: float, kv_bytes: int, kv_tokens: int
) -> list[str]:
    problems = [
        f"{name}: peak {phase.peak_gib:.2f} GiB > budget {budget:.2f} GiB"
        for name, phase in phases.items()
        if phase.peak_gib > budget
    ]
    r, requested = w.config.rollout, w.engine_requested()
    if kv_bytes <= 0:
        problems.append(
            f"no room for a KV cache: vLLM's share ({(requested or 0) / GIB:.2f} GiB) is below "
            "its weights + activation reserve; raise rollout.gpu_memory_utilization"
        )
    elif kv_tokens < r.max_model_len:
        problems.append(
            f"the KV cache holds {kv_tokens} tokens < rollout.max_model_len ({r.max_model_len}): "
            "vLLM refuses to start"
        )
    if w.on_gpu and requested is not None:
        free = budget * GIB - w.actor_params()  # the actor is built before the engine
        if requested > free:
            problems.append(
                f"vLLM needs {requested / GIB:.2f} GiB free at start (rollout."
                f"gpu_memory_utilization={r.gpu_memory_utilization}) but the actor's shards "
                f"leave {free / GIB:.2f} GiB"
            )
    return problems
