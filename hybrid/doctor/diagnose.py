"""The doctor's verdicts: `diagnose(config, facts, shape)` is a pure function of the composed
config, what was gathered about the machine (hybrid.doctor.facts) and the model's shape.

Sections, in the report's order: versions (hybrid.doctor.stack), gpus (hybrid.doctor.placement),
environment (hybrid.doctor.environment), then here: attention (model.attn_implementation as
hybrid.workers.attention resolves it), rollout (what hybrid.rollout.engine_args hands vLLM on
this device, and an explicit GPU KV cache checked against the model), memory (the planner's
verdict, hybrid.planner.plan) and inputs (model.path and the data files).

GPU memory for the plan: the smallest GPU torch sees here, else `gpu_memory_gib` (stated as
assumed). On CPU the workers share the host: its RAM / the workers per node.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hybrid.doctor.environment import environment_checks
from hybrid.doctor.facts import HostFacts, InputFacts
from hybrid.doctor.placement import placement_checks
from hybrid.doctor.stack import stack_checks, versions
from hybrid.doctor.verdict import Check, PlanSummary, Report
from hybrid.memory.model_shape import ModelShape, known_presets
from hybrid.planner.plan import plan_memory
from hybrid.rollout.engine_args import MIN_GPU_KV_SEQUENCES, EngineSite
from hybrid.rollout.engines import engine_class
from hybrid.workers.attention import resolve_attn_implementation

if TYPE_CHECKING:
    from hybrid.trainer.config import TrainerRunConfig

DEFAULT_GPU_MEMORY_GIB = 80.0
UNSET = "???"
GPU_KINDS = {"H200": "h200", "H100": "h100", "A100": "a100"}
"""GPU names -> the planner's GPU kind (hybrid.planner.reserve), matched in the device name."""


def diagnose(
    config: TrainerRunConfig,
    facts: HostFacts,
    shape: ModelShape | None,
    *,
    config_name: str,
    shape_source: str = "",
    inputs: InputFacts | None = None,
    gpu_memory_gib: float = DEFAULT_GPU_MEMORY_GIB,
    critic_shape: ModelShape | None = None,
) -> Report:
    """Every check of the report (see the module docstring). `shape_source` says where the
    shape came from (or, with none, why); `gpu_memory_gib` is assumed when no GPU is seen."""
    t = config.trainer
    cluster_nodes = len(facts.ray.nodes) if facts.ray and facts.ray.used_by_run else 1
    checks = [
        *stack_checks(facts, t.use_gpu),
        *placement_checks(config, facts),
        *environment_checks(config, facts, multi_node=t.nnodes > 1 or cluster_nodes > 1),
        attention_check(config, facts),
        *rollout_checks(config, shape),
    ]
    memory, plan = memory_checks(
        config, facts, shape, shape_source, config_name, gpu_memory_gib, critic_shape
    )
    checks += [*memory, *input_checks(config, inputs or InputFacts())]
    return Report(
        config=config_name,
        device="cuda" if t.use_gpu else "cpu",
        checks=tuple(checks),
        versions=versions(facts),
        plan=plan,
    )


def attention_check(config: TrainerRunConfig, facts: HostFacts) -> Check:
    requested, on_cuda = config.model.attn_implementation, config.trainer.use_gpu
    try:
        chosen = resolve_attn_implementation(
            requested, flash_installed=facts.flash_attn_installed, on_cuda=on_cuda
        )
    except ValueError as error:
        what, _, fix = str(error).partition("; ")
        return Check("attention", "FAIL", what, fix=fix)
    flash = "flash-attn installed" if facts.flash_attn_installed else "flash-attn not installed"
    where = "CUDA" if on_cuda else "CPU"
    return Check(
        "attention", "ok", f"model.attn_implementation={requested} -> {chosen} ({flash}, {where})"
    )


def rollout_checks(config: TrainerRunConfig, shape: ModelShape | None) -> list[Check]:
    r, gpu = config.rollout, config.trainer.use_gpu
    # A Ray GPU actor sees exactly one device (hybrid.controller.resource_pool).
    site = EngineSite("cuda" if gpu else "cpu", visible_devices=1 if gpu else 0, local_rank=0)
    adapter_sync = config.model.lora.enabled and config.sync.lora_mode == "adapter"
    engine = engine_class(r.engine)
    checks = [Check("rollout", "ok", engine.describe_site(r, site, adapter_sync))]
    if not gpu or r.kv_cache_memory_bytes is None:
        return checks
    if shape is None:
        checks.append(
            Check(
                "rollout",
                "warn",
                f"rollout.kv_cache_memory_bytes={r.kv_cache_memory_bytes}: not checked",
                "no model shape to size a token by",
                "pass --model",
            )
        )
        return checks
    try:
        engine.check_kv_budget(r, site, shape.kv_bytes_per_token(r.tensor_parallel_size))
    except ValueError as error:
        checks.append(
            Check(
                "rollout",
                "FAIL",
                f"rollout.kv_cache_memory_bytes={r.kv_cache_memory_bytes}: too small for "
                f"{MIN_GPU_KV_SEQUENCES} sequences of rollout.max_model_len={r.max_model_len}",
                str(error),
            )
        )
    return checks


def memory_per_worker(
    config: TrainerRunConfig, facts: HostFacts, gpu_memory_gib: float
) -> tuple[float, str]:
    """(GiB per worker, where it came from)."""
    if config.trainer.use_gpu:
        if facts.gpus:
            return min(g.memory_gib for g in facts.gpus), "detected"
        return gpu_memory_gib, "assumed (--gpu-memory-gib)"
    if facts.host_memory_gib > 0:
        per_node = config.trainer.workers_per_node
        return facts.host_memory_gib / per_node, f"host RAM / {per_node} workers"
    return gpu_memory_gib, "assumed (--gpu-memory-gib)"


def plan_options(config: TrainerRunConfig, facts: HostFacts) -> dict[str, Any]:
    """The planner's optional inputs this machine answers: its host RAM, its GPU kind, and
    NVLS switched off by the environment."""
    options: dict[str, Any] = {}
    if facts.host_memory_gib > 0:
        options["host_memory_gib"] = facts.host_memory_gib
    kinds = [kind for name, kind in GPU_KINDS.items() for g in facts.gpus if name in g.name]
    if config.trainer.use_gpu and kinds:
        options["gpu"] = kinds[0]
    if facts.env.get("NCCL_NVLS_ENABLE") == "0":
        options["nvls"] = False
    return options


def memory_checks(
    config: TrainerRunConfig,
    facts: HostFacts,
    shape: ModelShape | None,
    shape_source: str,
    config_name: str,
    gpu_memory_gib: float,
    critic_shape: ModelShape | None,
) -> tuple[list[Check], PlanSummary | None]:
    if shape is None:
        return [
            Check(
                "memory",
                "warn",
                "memory plan skipped: no model shape",
                shape_source,
                f"pass --model with a preset ({', '.join(known_presets())}) or a model directory",
            )
        ], None
    memory, source = memory_per_worker(config, facts, gpu_memory_gib)
    plan = plan_memory(
        config, shape, memory, critic_shape=critic_shape, **plan_options(config, facts)
    )
    summary = PlanSummary(
        plan.fits,
        plan.peak_gib,
        plan.margin_gib,
        plan.peak_phase,
        memory,
        source,
        plan.model,
        plan.parameters,
        plan.active_parameters,
    )
    unit = "GPU" if config.trainer.use_gpu else "worker"
    where = f"{memory:.1f} GiB per {unit}, {source}; model {plan.model}, {shape_source}"
    # The planner words its host-RAM problem "host RAM: ..." (hybrid.planner.plan).
    host = [p for p in plan.problems if p.startswith("host RAM")]
    device = [p for p in plan.problems if p not in host]
    suggest = (
        f"python -m profiling.plan --config-name {config_name} --model {plan.model} --suggest "
        "(with the same overrides)"
    )
    if device:
        checks = [
            Check(
                "memory",
                "FAIL",
                f"memory plan: does not fit ({plan.model}, {memory:.1f} GiB per {unit})",
                "; ".join(device) + f" ({where})",
                suggest,
            )
        ]
    else:
        checks = [
            Check(
                "memory",
                "ok",
                f"plan fits: peak {plan.peak_gib:.2f} GiB at {plan.peak_phase}, margin "
                f"{plan.margin_gib:.2f} GiB",
                where,
            )
        ]
    host_peak = getattr(plan, "host_peak_gib", 0.0)
    if host:
        checks.append(
            Check(
                "memory",
                "FAIL",
                f"host RAM: {host_peak:.1f} GiB on rank 0's node (this node has "
                f"{facts.host_memory_gib:.1f} GiB)",
                "; ".join(host),
                "run on nodes with that much RAM, or offload less "
                "(actor.offload.param_offload, actor.offload.optimizer_offload, "
                "ref.offload.param_offload) and set trainer.export_hf=false",
            )
        )
    elif config.trainer.use_gpu and host_peak:
        checks.append(
            Check(
                "memory",
                "ok",
                f"host RAM: the plan's peak is {host_peak:.1f} GiB per node "
                f"(this node has {facts.host_memory_gib:.1f} GiB)",
            )
        )
    checks += [Check("memory", "warn", text) for text in getattr(plan, "warnings", ())]
    return checks, summary


def input_checks(config: TrainerRunConfig, inputs: InputFacts) -> list[Check]:
    path, checks = config.model.path, []
    if path == UNSET:
        checks.append(
            Check(
                "inputs",
                "FAIL",
                "model.path: unset (???)",
                fix="pass model.path=DIR, a local Hugging Face model directory (the "
                "examples/run_*.sh scripts set it)",
            )
        )
    elif not inputs.model_dir:
        checks.append(
            Check(
                "inputs",
                "FAIL",
                f"model.path: {path} is not a local directory",
                fix="pass model.path=DIR, a local Hugging Face model directory",
            )
        )
    checks += [
        Check(
            "inputs",
            "FAIL",
            f"{entry} does not exist",
            fix="write the data first (examples/data/*.py; the examples/run_*.sh scripts do) "
            "or point the field at existing files",
        )
        for entry in inputs.missing_files
    ]
    if inputs.demo_built:
        checks.append(
            Check(
                "inputs",
                "ok",
                "the demo's model and data are built on first run: " + ", ".join(inputs.demo_built),
            )
        )
    if not checks:
        checks.append(Check("inputs", "ok", f"model.path and the data files exist ({path})"))
    return checks
