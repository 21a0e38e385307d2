"""The memory planner: what one worker's device holds at every phase of a GRPO step, and
what each node's host RAM holds, predicted from the run's config and the model's shape,
without a GPU.

`plan_memory(config, shape, gpu_memory_gib)` gives, for every boundary of
hybrid.memory.records.STEP_PHASES, the components resident at the phase's peak (COMPONENTS
names, so the memory report puts them next to the measured ones) and the transient bytes that
make the peak. This module places them in the phases and judges the fit; what each of them
weighs is hybrid.planner.sizes's, derived in docs/memory-model.md (LoRA included).
hybrid.planner.reserve sizes what is kept free outside the phases (CUDA context, NCCL
communicators, fragmentation), hybrid.planner.host the host RAM per node;
hybrid.planner.suggest searches the cheapest config changes that make an over-budget run fit;
hybrid.planner.format prints a plan. Per worker (one GPU), steady state (step >= 2:
AdamW's state exists).

actor.offload.param_offload / actor.offload.optimizer_offload / ref.offload.param_offload /
distill.offload.param_offload park their tensors on the host outside the phases that use them,
with trainer.use_gpu only (on CPU the moves are no-ops). On CUDA the engine sleeps in trainer
mode: its weights dropped (level 2; level 1, a pinned host copy, in LoRA adapter mode) and its
KV cache too; on CPU both stay. The optimizer state is onloaded for the whole update
(`trainer_phase("update", with_optimizer=True)`), so optimizer_offload lowers every phase but
update/*. An offload phase's components are those before the move (its peak). On-policy
distillation's teacher (distill.teacher_path) is sized from its own config.json
(hybrid.planner.teacher_sizes): teacher_params, and its teacher/onload|forward|offload
boundaries before the first update; a teacher whose config does not load is left out with a
warning that says so. With LoRA the reference forward runs on the actor (adapters disabled),
and adapter mode's first sync (the base) is left out of the steady phases: a note gives its
peak, and a problem is raised when it does not fit. Under Ulysses sequence parallelism
(actor.sp_size = N) every pass (the actor's, the reference's, the critic's, the teacher's)
counts a rank's slice of each micro-batch (its tokens / N) and the attention's all-to-all,
the rows split over W / N data-parallel slots, and the reserve the sp mesh's two
communicators.

Fits: every phase's peak <= gpu memory - the reserve (CUDA context 0.5 GiB + fragmentation
0.5 GiB + 1.5 GiB per NCCL communicator with NVLS, 0.5 without; none on CPU), the KV cache
holds max_model_len tokens, vLLM can start, and, given host_memory_gib, rank 0's node's host
peak stays below it. A fit by less than the reserve's uncertainty gets a warning. The
constants are estimates, to be calibrated with profiling.memory_report.

Worked example: configs/qwen2_5_7b_gsm8k_8gpu.yaml (Qwen2.5-7B on 8 x 80 GiB, tp 2, S = 512 +
1024, micro-batch 4, ref micro-batch 16, gradient checkpointing, every offload on):
  P = 7,615,616,512: 951,952,064 per rank = 3.55 GiB fp32 parameters, 3.55 GiB gradients,
  7.09 GiB AdamW state; vLLM weights 7.09 GiB per TP rank.
  Sync gather: layer 1.14 GiB (the 545M-element embedding, larger than a 233M layer), full
  14.3 GiB; the sync peaks at 13.1 GiB (actor onloaded + engine weights + gather).
  Update backward (b = 4: 6,144 tokens, 4,096 scored; chunks of 1,024): checkpointed
  activations 1.27 GiB + 0.05 of scored hidden states and their gradient, the LM head's chunk
  buffers 1.45 GiB (1,024 x V x (4 + 4 + 2)), unsharded root + 2 layers 2.90 GiB, LM-head
  gradient 1.02 GiB + its fp32 accumulator 2.03 GiB, + 15.5 GiB resident -> 24.3 GiB (31.2
  with model.log_prob_chunk_tokens=0: 10.4 GiB of full logits, 2 x 1.74 bf16 + 3 x 2.32
  fp32). The reference forward (b = 16, 24,576 tokens) reaches 9.45 GiB, 3.42 of it a no-grad
  layer's working set (31.7 with full logits, 25.5 of them).
  KV: U = 0.6 x 80 = 48 GiB - 7.09 weights - 1.36 overhead (1 of it CUDA graphs) - 2.90
  sampler reserve = 36.6 GiB = 1,372,400 tokens at 28 KiB per token, for 491,520 needed (320
  sequences x 1,536).
  Reserve: 0.5 context + 0.5 fragmentation + the default group and vLLM's world (8 GPUs on
  the node: NVLS) 1.5 each + the rollout tp group, vLLM's tp group and its PyNccl (2 GPUs: no
  NVLS) 0.5 each = 5.5 GiB, uncertain by 2.88 (2 x 1.0 for NVLS + 25% of 3.5).
  Peak: rollout/generate, 47.5 GiB; fits with a 27.0 GiB margin (budget 74.5 GiB).
  Host RAM per node (8 workers, pinned): actor 3.55 x 8 = 28.4 GiB, AdamW state 56.7,
  reference 1.77 x 8 = 14.2, + 89.5 GiB of power-of-two rounding (an embedding or LM-head
  shard of 19,008 x 3,584 fp32, 260 MiB, takes a 512 MiB block; a gate / up / down shard of
  32.4 MiB a 64 MiB one) = 188.8 GiB on every node. Rank 0's node adds the fp32 state dict,
  28.4 GiB, at startup and 42.6 (fp32 + its bf16 copy) at the final export: 231.3 GiB.

Worked example, LoRA: configs/qwen2_5_7b_lora_gsm8k_8gpu.yaml (the same run with rank-32
all-linear adapters, adapter sync, layered; actor and optimizer state kept on the device):
  Adapters 28 layers x 32 x 90,112 (in + out of the seven projections) = 80,740,352 (1.06% of
  P): 10,092,544 per rank = 38.5 MiB fp32, as much gradient, 77 MiB AdamW state; with the
  1.77 GiB bf16 base shard, actor_params 1.81 GiB. vLLM weights 7.09 + 0.15 GiB adapter slots.
  Sync gather: one layer's adapters, 5.6 MiB (0.15 GiB for all of them; the first sync: the
  base's embedding, 1.02 GiB; merge would gather 0.45 GiB and hold 1.07 GiB of merged copies
  and temporaries per layer).
  Update backward: its first layer's (activations 1.27 saved + 1.98 recomputed and gradients)
  + unsharded 2.91 + 3.28 resident -> 9.46 GiB (24.3 with full fine-tuning). The reference
  forward is the trainer-side peak at 9.58 GiB (the no-grad layer's 3.42, the actor's 1.81 in
  place of the reference's 1.77).
  KV: 48 GiB - 7.24 weights - 1.36 overhead - 2.90 sampler reserve = 36.5 GiB = 1,366,768
  tokens. Peak: rollout/generate, 49.4 GiB (1.89 above full fine-tuning's: the actor and its
  AdamW state stay on the device); fits with a 25.1 GiB margin (the same 5.5 GiB reserve).
  Host RAM per node: nothing offloaded, but the engine sleeps at level 1: its weights' pinned
  backup, 7.24 x 8 = 57.9 GiB + 50.3 of rounding (a fused gate_up shard of 136 MB takes 256
  MiB) = 108.2 GiB; rank 0's node + 14.5 at startup (bf16 base + fp32 adapters), + 14.2 at
  the export (merged, bf16): 122.7 GiB.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import psutil

from hybrid.memory.model_shape import LORA_TARGETS, ModelShape, model_shape
from hybrid.memory.records import COMPONENTS, GIB, step_phases
from hybrid.models.routers import experts_dtype
from hybrid.planner.adapters import lora_rank_of, lora_targets
from hybrid.planner.critic_sizes import CriticSizes
from hybrid.planner.host import HostMemory, host_memory
from hybrid.planner.passes import Bytes
from hybrid.planner.reserve import (
    DEFAULT_GPU,
    GPU_KINDS,
    RESERVE_UNCERTAINTY,
    Reserve,
    cuda_reserve,
)
from hybrid.planner.sizes import WorkerSizes, gather_peak
from hybrid.planner.teacher_sizes import TeacherSizes, teacher_of, with_teacher_phases
from hybrid.workers.replication import trainer_replicas

if TYPE_CHECKING:
    from hybrid.trainer.config import TrainerRunConfig

__all__ = ["ModelShape", "PhasePrediction", "Plan", "model_shape", "plan_memory"]


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
    gpu: str
    """The GPU kind planned for (hybrid.planner.reserve.GPU_KINDS)."""
    gpu_memory_gib: float
    reserve_gib: float
    """Kept free on CUDA (0 on CPU): reserve.total_gib."""
    reserve: Reserve
    """Its parts: CUDA context, fragmentation, the NCCL communicators; its uncertainty."""
    budget_gib: float
    """gpu_memory_gib - reserve_gib: what every phase's peak must stay below."""
    lora_rank: int
    phases: dict[str, PhasePrediction]
    """By STEP_PHASES name, in step order (the critic's only with one), and the teacher's
    (teacher_sizes.TEACHER_PHASES) with distillation."""
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
    host_gib: dict[str, float]
    """Host RAM of every node in steady state, by hybrid.planner.host.HOST_PARTS name."""
    host_steady_gib: float
    host_startup_gib: float
    """Rank 0's full state dict at startup, on rank 0's node beside the steady state."""
    host_export_gib: float
    """Rank 0's gathered state dict and its bf16 copy at the final export (0 without)."""
    host_peak_gib: float
    """Rank 0's node at its fullest: steady + max(startup, export)."""
    host_memory_gib: float | None
    """Host RAM per node given to the planner (None: not checked)."""
    host_fits: bool | None
    """host_peak_gib <= host_memory_gib (None when host_memory_gib is)."""
    fits: bool
    problems: tuple[str, ...]
    """Why it does not fit (empty when it fits)."""
    notes: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    """Fits, but by less than the reserve's uncertainty (reserve.uncertainty_gib); or a part
    of the run the plan could not count (a teacher whose config.json does not load)."""
    teacher: str | None = None
    """The distillation teacher's shape (its directory or preset) when counted; None without
    distillation or when its config.json did not load (then a warning says so)."""
    parameters: int = 0
    """The actor's parameters."""
    active_parameters: int = 0
    """Those one token computes with (a mixture of experts: the top-k experts of each MoE
    layer; a dense model: all)."""

    @property
    def margin_gib(self) -> float:
        return self.budget_gib - self.peak_gib


# --- phases --------------------------------------------------------------------------------


def _resident(
    w: WorkerSizes,
    critic: CriticSizes | None,
    teacher: TeacherSizes | None,
    *,
    actor: bool,
    optimizer: bool,
    ref: bool,
    teacher_params: bool,
    weights: bool,
    kv: bool,
    grads: bool,
    critic_params: bool,
    critic_optimizer: bool,
    critic_grads: bool,
) -> Bytes:
    """Component bytes on the device (zeros left out), given what is there."""
    trainable = w.trainable_shard * w.master
    value = critic.params() if critic is not None else 0
    frozen_teacher = teacher.params() if teacher is not None and teacher_params else 0
    held = {
        "actor_params": w.actor_params() if actor else 0,
        "actor_grads": trainable if grads else 0,
        "optimizer_state": 2 * trainable if optimizer else 0,
        "ref_params": w.ref_params() if ref else 0,
        "teacher_params": frozen_teacher,
        "critic_params": value if critic_params else 0,
        "critic_grads": value if critic_grads else 0,
        "critic_optimizer_state": 2 * value if critic_optimizer else 0,
        "rollout_weights": w.rollout_weights() if weights else 0,
        "kv_cache": max(w.kv_cache(), 0) if kv else 0,
        "engine_overhead": w.engine_overhead(),
    }
    return {name: held[name] for name in COMPONENTS if held.get(name)}


def _phases(
    w: WorkerSizes, critic: CriticSizes | None, teacher: TeacherSizes | None
) -> dict[str, tuple[Bytes, Bytes]]:
    """(resident, transient) bytes at the peak of every boundary the step records."""
    c, gpu = w.config, w.on_gpu
    kept = {  # between phases; offload and the engine's sleep act only on CUDA
        "actor": not (gpu and c.actor.offload.param_offload),
        "optimizer": not (gpu and c.actor.offload.optimizer_offload),
        "ref": not (gpu and c.ref.offload.param_offload),
        "teacher_params": not (gpu and c.distill.offload.param_offload),
        "weights": not (gpu and c.rollout.free_cache_engine),
        "kv": not (gpu and c.rollout.free_cache_engine),
        "grads": False,
        "critic_params": critic is not None and not (gpu and c.critic.offload.param_offload),
        "critic_optimizer": critic is not None and not (gpu and c.critic.offload.optimizer_offload),
        "critic_grads": False,
    }

    def on(**moved: bool) -> Bytes:
        return _resident(w, critic, teacher, **{**kept, **moved})

    # The reference runs for a KL (loss or reward); with LoRA it is the actor, adapters disabled.
    ref, ref_forward = on(), {}
    if c.needs_reference:
        ref = on(actor=True) if w.ref_is_actor else on(ref=True)
        ref_forward = w.scoring("ref", w.ref_cb, 2)
    sync, rollout = on(actor=True, weights=True), on(weights=True, kv=True)
    update = on(actor=True, optimizer=True)
    with_grads = on(actor=True, optimizer=True, grads=True)
    # Gradients survive between micro-batches of a mini-batch (freed by the optimizer step).
    accumulating = w.micro_batch("update").split
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
        "old_log_prob/forward": (on(actor=True), w.scoring("old_log_prob", w.cb, 3)),
        "old_log_prob/offload": (on(actor=True), {}),
        **(_critic_phases(critic, on) if critic is not None else {}),
        "update/onload": (update, {}),
        "update/forward": (with_grads if accumulating else update, w.update_forward()),
        "update/backward": (with_grads, w.update_backward()),
        "update/optimizer_step": (with_grads, {"optimizer_temps": w.optimizer_temporaries()}),
        "update/offload": (update, {}),
    }
    order = step_phases(critic is not None)
    assert tuple(phases) == order, "phases drifted from STEP_PHASES"
    if teacher is None:
        return phases
    scoring = on(teacher_params=True)
    phases["teacher/onload"] = (scoring, {})
    phases["teacher/forward"] = (scoring, teacher.forward())
    phases["teacher/offload"] = (scoring, {})
    return {name: phases[name] for name in with_teacher_phases(order)}


def _critic_phases(critic: CriticSizes, on: Callable[..., Bytes]) -> dict[str, tuple[Bytes, Bytes]]:
    """The critic's values pass and update (its optimizer state onloaded for the update)."""
    values, update = on(critic_params=True), on(critic_params=True, critic_optimizer=True)
    with_grads = on(critic_params=True, critic_optimizer=True, critic_grads=True)
    temporaries = {"optimizer_temps": critic.optimizer_temporaries()}
    return {
        "values/onload": (values, {}),
        "values/forward": (values, critic.values_forward()),
        "values/offload": (values, {}),
        "update_critic/onload": (update, {}),
        "update_critic/forward": (
            with_grads if critic.accumulates else update,
            critic.update_forward(),
        ),
        "update_critic/backward": (with_grads, critic.update_backward()),
        "update_critic/optimizer_step": (with_grads, temporaries),
        "update_critic/offload": (update, {}),
    }


def _gib(table: Bytes) -> dict[str, float]:
    return {name: nbytes / GIB for name, nbytes in table.items() if nbytes}


def plan_memory(
    config: TrainerRunConfig,
    shape: ModelShape,
    gpu_memory_gib: float,
    lora_rank: int = 0,
    critic_shape: ModelShape | None = None,
    *,
    gpu: str = DEFAULT_GPU,
    nvls: bool | None = None,
    host_memory_gib: float | None = None,
    teacher_shape: ModelShape | None = None,
) -> Plan:
    """Predicted memory of one worker at every phase of a step, and of each node's host RAM
    (see the module docstring).

    LoRA comes from config.model.lora; `lora_rank` > 0 overrides its rank (the same plan as
    the override model.lora.rank=R). With a critic (algorithm.adv_estimator=gae) its decoder
    is `critic_shape`, by default the actor's `shape` (critic.model.path unset).
    `gpu`: the GPU kind (GPU_KINDS; an A100 gets vLLM's small batch defaults and no NVLS).
    `nvls`: whether the node has NVLink SHARP, which makes NCCL communicators larger (None:
    assumed with >= 8 CUDA workers per node on an H100 / H200; False for NCCL_NVLS_ENABLE=0).
    `host_memory_gib`: host RAM per node; when given, a host peak above it is a problem.
    `teacher_shape`: the distillation teacher's (distill.teacher_path set), by default read
    from distill.teacher_path; when that does not load, the teacher is left out and a warning
    says so."""
    _check_node(gpu_memory_gib, gpu, host_memory_gib)
    config = _replicas_resolved(config, shape, host_memory_gib)
    rank = lora_rank_of(config, lora_rank)
    w = WorkerSizes(config, shape, rank, gpu_memory_gib * GIB, gpu)
    critic = CriticSizes(config, critic_shape or shape) if config.use_critic else None
    teacher, teacher_unread = teacher_of(config, teacher_shape)
    phases = _predict(w, critic, teacher)
    peak_phase = max(phases, key=lambda name: phases[name].peak_gib)
    reserve = cuda_reserve(config, nvls, gpu)
    budget = gpu_memory_gib - reserve.total_gib
    kv_bytes, per_token = w.kv_cache(), shape.kv_bytes_per_token(w.tp)
    kv_tokens = max(kv_bytes, 0) // per_token // 16 * 16
    seqs = min(w.sequences_per_engine(), w.vllm_limits()[1])
    problems = _problems(w, phases, budget, kv_bytes, kv_tokens)
    host = host_memory(w, critic, teacher)
    problems += _host_problems(host, host_memory_gib)
    notes = ["runtime (interpreter, libraries) is not predicted: 0 here, on the host too"]
    if rank:
        notes += _lora_notes(w, phases["sync/gather_load"], budget, problems)
    if 0 < kv_tokens < seqs * w.seq:
        notes.append(
            f"the KV cache holds {kv_tokens:,} of the {seqs * w.seq:,} tokens one rollout needs "
            f"per engine: about {kv_tokens // w.seq} of {seqs} sequences run at once, the rest "
            "queue"
        )
    notes += _expert_notes(w, shape)
    margin = budget - phases[peak_phase].peak_gib
    return Plan(
        model=shape.name,
        device="cuda" if w.on_gpu else "cpu",
        gpu=gpu,
        gpu_memory_gib=gpu_memory_gib,
        reserve_gib=reserve.total_gib,
        reserve=reserve,
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
        host_gib=host.parts_gib,
        host_steady_gib=host.steady_gib,
        host_startup_gib=host.startup_gib,
        host_export_gib=host.export_gib,
        host_peak_gib=host.peak_gib,
        host_memory_gib=host_memory_gib,
        host_fits=None if host_memory_gib is None else host.peak_gib <= host_memory_gib,
        fits=not problems,
        problems=tuple(problems),
        notes=tuple(notes),
        warnings=(
            *_thin_margin(reserve, margin, phases[peak_phase].peak_gib, peak_phase),
            *([teacher_unread] if teacher_unread else []),
        ),
        teacher=None if teacher is None else teacher.shape.name,
        parameters=shape.num_params,
        active_parameters=shape.active_params,
    )


def _replicas_resolved(
    config: TrainerRunConfig, shape: ModelShape, host_memory_gib: float | None
) -> TrainerRunConfig:
    """`config` with actor.hsdp_replicas auto (0) resolved as the workers will resolve it
    (hybrid.workers.replication) on a host of `host_memory_gib` (None: this machine's)."""
    a = config.actor
    if a.hsdp_replicas > 0:
        return config
    host = psutil.virtual_memory().total if host_memory_gib is None else host_memory_gib * GIB
    replicas = trainer_replicas(
        a,
        shape,
        lora=config.model.lora.enabled,
        world=config.trainer.training_workers,
        on_cpu=not config.trainer.use_gpu,
        device_bytes=int(host),
    )
    return dataclasses.replace(config, actor=dataclasses.replace(a, hsdp_replicas=replicas))


def _expert_notes(w: WorkerSizes, shape: ModelShape) -> list[str]:
    """How a mixture of experts' experts are sharded and gathered (none for a dense model)."""
    if not shape.num_experts:
        return []
    world, experts = w.config.trainer.training_workers, shape.num_experts
    sync = w.config.sync
    gathered = gather_peak(shape, sync.gather, sync.bucket_mb << 20) * w.engine_bytes
    return [
        f"mixture of experts: {shape.num_moe_layers} MoE layers x {experts} experts, top-"
        f"{shape.experts_per_token}; {shape.active_params / 1e9:.2f}B of "
        f"{shape.num_params / 1e9:.2f}B parameters active per token",
        _expert_placement(world, experts, w.config.actor.ep_size)
        + f"; the sync (sync.gather={sync.gather}) gathers at most "
        f"{gathered / GIB:.2f} GiB at once ("
        + (
            "a bucket of experts under their checkpoint names)"
            if sync.gather == "bucket"
            else "a layer's experts together; sync.gather=bucket: a bucket of experts)"
        ),
        *_routing_record_note(w, shape),
    ]


def _expert_placement(world: int, experts: int, ep_size: int) -> str:
    if ep_size == 1:
        return (
            f"experts: FSDP2 shards each stacked expert tensor by expert, "
            f"{-(-experts // world)} of {experts} per rank"
        )
    efsdp = world // ep_size
    return (
        f"experts: expert parallelism (actor.ep_size={ep_size}), each rank owns "
        f"{experts // ep_size} of {experts} experts"
        + (f", their rows split over {efsdp} ranks" if efsdp > 1 else "")
        + "; tokens reach them by all-to-all, so a pass never gathers the other experts"
    )


def _routing_record_note(w: WorkerSizes, shape: ModelShape) -> list[str]:
    """Router replay's record: one expert index per (token, MoE layer, top-k slot) of every
    row of a step, on the host, through the driver (none without replay)."""
    replay = w.config.actor.router_replay
    if replay == "off":
        return []
    index_bytes = experts_dtype(shape.num_experts).itemsize
    per_row = w.seq * shape.num_moe_layers * shape.experts_per_token * index_bytes
    rows = w.config.rows_per_step
    return [
        f"router replay ({replay}): the routing record is {rows * per_row / GIB:.2f} GiB a step "
        f"({rows} rows x {w.seq} tokens x {shape.num_moe_layers} layers x top-"
        f"{shape.experts_per_token}, {index_bytes} byte each), host memory through the driver, "
        f"{rows * per_row / w.world / GIB:.2f} GiB a worker"
    ]


def _check_node(gpu_memory_gib: float, gpu: str, host_memory_gib: float | None) -> None:
    if gpu_memory_gib <= 0:
        raise ValueError(f"gpu_memory_gib must be > 0, got {gpu_memory_gib}")
    if gpu not in GPU_KINDS:
        raise ValueError(f"gpu must be one of {GPU_KINDS}, got {gpu!r}")
    if host_memory_gib is not None and host_memory_gib <= 0:
        raise ValueError(f"host_memory_gib must be > 0 (or None), got {host_memory_gib}")


def _predict(
    w: WorkerSizes, critic: CriticSizes | None, teacher: TeacherSizes | None
) -> dict[str, PhasePrediction]:
    """Every phase's components and transients in GiB, and its peak."""
    phases = {}
    for name, (resident, transient) in _phases(w, critic, teacher).items():
        components, extra = _gib(resident), _gib(transient)
        peak = sum(components.values()) + sum(extra.values())
        phases[name] = PhasePrediction(peak, components, extra)
    return phases


def _thin_margin(reserve: Reserve, margin: float, peak: float, phase: str) -> tuple[str, ...]:
    """A warning when the peak fits by less than the reserve's uncertainty."""
    if not 0 <= margin < reserve.uncertainty_gib:
        return ()
    share = f"{RESERVE_UNCERTAINTY:.0%} of the reserve"
    why = f"what NVLS adds + {share} without it" if reserve.nvls else share
    return (
        f"thin margin: the peak ({peak:.2f} GiB at {phase}) fits by {margin:.2f} GiB, less than "
        f"the reserve's uncertainty ({reserve.uncertainty_gib:.2f} GiB: {why}); measure the "
        "reserve on the GPU (torch.cuda.mem_get_info around the first collectives) before "
        "relying on this fit",
    )


def _host_problems(host: HostMemory, host_memory_gib: float | None) -> list[str]:
    if host_memory_gib is None or host.peak_gib <= host_memory_gib:
        return []
    moment = "in steady state"
    if host.peak_gib > host.steady_gib:
        moment = "at startup" if host.startup_gib >= host.export_gib else "at the final export"
    return [
        f"host RAM: rank 0's node peaks at {host.peak_gib:.1f} GiB {moment} (every node holds "
        f"{host.steady_gib:.1f} GiB in steady state) > {host_memory_gib:.1f} GiB of host RAM (--host-memory-gib)"
    ]


def _lora_notes(
    w: WorkerSizes, sync: PhasePrediction, budget: float, problems: list[str]
) -> list[str]:
    """What LoRA changes, and the first sync of adapter mode (the base), which the steady-state
    phases leave out; a problem is added to `problems` when that sync does not fit."""
    a, targets, s = w.lora, lora_targets(w.config), w.shape
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
    w: WorkerSizes, phases: dict[str, PhasePrediction], budget: float, kv_bytes: int, kv_tokens: int
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
