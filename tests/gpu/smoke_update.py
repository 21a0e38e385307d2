"""GPU smoke test: the actor update under its kernel settings, side by side (issue 48).

One process, world size 1, `nccl` with `device_id` (gloo with --device cpu), bf16 compute
(what `Hardware.detect` resolves), a Qwen2.5-1.5B-shaped model with random weights
(`--shape`; cpu: tiny). `PolicyTrainer.update` over packed micro-batches (one optimizer step
of `--rows` rows in micro-batches of `--micro-batch`) under each setting:
- eager:       the update as built;
- compiled:    each decoder layer compiled (hybrid.workers.compiled_blocks; actor.compile);
- fused:       liger-kernel's ops (hybrid.workers.fused_kernels.FUSED_OPS: RMSNorm, RoPE,
               SwiGLU, and the fused log-prob head where a pass wants no entropy); only on
               CUDA with liger_kernel importable, else skipped with the reason;
- reduce_once: gradients reduce-scattered once per optimizer step (actor.grad_reduce=step);
- all:         compiled + fused (where it runs) + reduce_once;
each with and without gradient checkpointing (`--checkpointing`), interleaved round by round
(round 0 warms up and compiles; rounds 1.. are timed). Models are shared where the kernels
are the same (eager and reduce_once; compiled and all when fused is out); checkpointing is
switched per update on the same model.

Per setting: tokens/s (the median timed update), its ratio to eager (same checkpointing),
MFU (smoke_fsdp's formula: 6 x parameters x tokens + causal attention, over the bf16 peak),
the peak allocated memory above what was allocated before the update, and the graphs dynamo
compiled (`compiled_graphs()`) at the first update and after it: the check `recompiles/...`
wants 0 after the first. With --mfu-profile, one more update per setting under torch.profiler:
the device time split into matmul / attention / communication / copies / the rest, and the
elementwise share (device time outside matmul and attention kernels), with each setting's
top kernels in <out>/update_profile.txt.

liger patches its family's module globals (apply_rotary_pos_emb, the norm and MLP classes)
for every model of that family in the process; here they are put back after the fused models
are built and swapped in only around the fused settings' updates, so that eager stays eager.
The fused models are patched after sharding (random_fsdp_model shards as it builds); liger's
patches set module attributes only, so that is the same model `build_fsdp_model` makes.

    timeout 220 python3 tests/gpu/smoke_update.py --out out --budget-s 180 --mfu-profile
    python tests/gpu/smoke_update.py --out /tmp/smoke --device cpu    # logic check, tiny

A setting whose next update would overrun --budget-s is skipped (its warm-up) or runs fewer
timed rounds. Writes <out>/smoke_update.json (figures, checks) and <out>/smoke_update.log;
exits 1 naming the failed checks, 2 if the deadline cut work short.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import math
import statistics
import sys
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import torch
import torch.distributed as dist
from _smoke_common import (
    SHAPES,
    Smoke,
    allocated,
    base_parser,
    empty_cache,
    gib,
    peak_allocated,
    random_fsdp_model,
    reset_peak,
    script_device,
    synchronize,
    synthetic_batch,
    timed,
)
from smoke_fsdp import environment, init_world, peak_tflops, update_flops
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from hybrid.data import Batch
from hybrid.memory.components import full_parameter_count
from hybrid.models import TinyModelConfig, vocab_size
from hybrid.workers import log_prob_head
from hybrid.workers.compiled_blocks import compile_blocks, compiled_graphs, is_compiled
from hybrid.workers.config import ActorConfig, OptimConfig, WorkerSpec
from hybrid.workers.forward import PassConfig
from hybrid.workers.fsdp import build_optimizer, decoder_layers
from hybrid.workers.fused_kernels import FUSED_OPS, apply_fused_kernels
from hybrid.workers.policy import PolicyTrainer

# --- settings ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Setting:
    name: str
    compiled: bool = False
    fused: bool = False
    reduce_once: bool = False

    @property
    def model_key(self) -> tuple[bool, bool]:
        """Settings with the same kernels share one model (and its optimizer)."""
        return (self.compiled, self.fused)


SETTINGS = {
    "eager": Setting("eager"),
    "compiled": Setting("compiled", compiled=True),
    "fused": Setting("fused", fused=True),
    "reduce_once": Setting("reduce_once", reduce_once=True),
    "all": Setting("all", compiled=True, fused=True, reduce_once=True),
}
# First guesses at a first update's cost (seconds), for the budget: before anything was
# measured, and what compiling a layer's graphs (inductor on cuda, aot_eager on cpu) or the
# first launch of liger's Triton kernels adds.
FIRST_UPDATE_S = {"cuda": 10.0, "cpu": 5.0}
COMPILE_S = {"cuda": 45.0, "cpu": 10.0}
FUSED_FIRST_S = {"cuda": 15.0, "cpu": 0.0}
RESERVE_S = 3.0
"""Kept back for the table and the JSON at the end."""
AGREE_RTOL = 0.05
"""The first update's grad norm of a setting against eager's (same rows, same initial
weights, bf16): a first guess, to be replaced by the spread the GPU run shows."""
COMPARED = ("actor/pg_loss", "actor/grad_norm")


def parse_args() -> argparse.Namespace:
    parser = base_parser(__doc__ or "", budget_s=180)
    parser.add_argument("--shape", choices=sorted(SHAPES), help="default qwen2.5-1.5b (cpu: tiny)")
    parser.add_argument("--layers", type=int, help="override the shape's decoder layer count")
    parser.add_argument("--rows", type=int, help="rows per update (default 8; cpu 4)")
    parser.add_argument("--micro-batch", type=int, default=2, help="rows per micro-batch")
    parser.add_argument("--prompt", type=int, help="prompt tokens per row (default 512; cpu 24)")
    parser.add_argument(
        "--response", type=int, help="response tokens per row (default 1536; cpu 40)"
    )
    parser.add_argument(
        "--rounds", type=int, help="timed rounds after the warm-up (default 3; cpu 1)"
    )
    parser.add_argument(
        "--settings",
        default=",".join(SETTINGS),
        help=f"comma-separated, from {', '.join(SETTINGS)} (default: all of them)",
    )
    parser.add_argument(
        "--checkpointing",
        choices=("on", "off", "both"),
        default="both",
        help="gradient checkpointing of the decoder layers (default: both, side by side)",
    )
    parser.add_argument(
        "--compile-backend",
        help="torch.compile backend of the compiled settings (default inductor, as "
        "actor.compile; cpu: aot_eager, no C++ build)",
    )
    parser.add_argument("--peak-tflops", type=float, help="override the detected bf16 peak")
    parser.add_argument(
        "--mfu-profile",
        action="store_true",
        help="profile one more update per setting: the device time by kernel category and "
        "the top kernels (<out>/update_profile.txt)",
    )
    args = parser.parse_args()
    cpu = args.device == "cpu"
    args.shape = args.shape or ("tiny" if cpu else "qwen2.5-1.5b")
    args.rows = args.rows or (4 if cpu else 8)
    args.rounds = args.rounds or (1 if cpu else 3)
    args.prompt = args.prompt or (24 if cpu else 512)
    args.response = args.response or (40 if cpu else 1536)
    args.compile_backend = args.compile_backend or ("aot_eager" if cpu else "inductor")
    names = [name.strip() for name in args.settings.split(",") if name.strip()]
    unknown = sorted(set(names) - set(SETTINGS))
    if unknown or not names:
        parser.error(f"--settings: unknown {unknown}; choose from {', '.join(SETTINGS)}")
    args.settings = names
    if args.rows % args.micro_batch:
        parser.error(f"--rows {args.rows} is not a multiple of --micro-batch {args.micro_batch}")
    return args


def liger_unavailable(device: torch.device) -> str | None:
    """Why the fused settings cannot run here (None: they can)."""
    if device.type != "cuda":
        return "liger-kernel's kernels are Triton kernels for CUDA; this run is on the CPU"
    try:
        importlib.import_module("liger_kernel.transformers.monkey_patch")
    except Exception as error:  # not installed, or it does not import with this torch
        return f"liger_kernel does not import ({type(error).__name__}: {error})"
    return None


# --- liger's module-level patches, kept to the fused models -------------------------------

_MISSING = object()


class FamilyGlobals:
    """The names liger's `apply_liger_kernel_to_<family>` rebinds in the family's modeling
    module: captured while the fused models are built, put back at once, swapped in only
    around the fused settings' updates."""

    def __init__(self) -> None:
        self.module: ModuleType | None = None
        self.patched: dict[str, Any] = {}
        self.original: dict[str, Any] = {}

    @contextmanager
    def capture(self, model: nn.Module) -> Iterator[None]:
        module = family_module(model)
        before = dict(vars(module))
        try:
            yield
        finally:
            for name, value in list(vars(module).items()):
                if before.get(name, _MISSING) is not value:
                    self.patched[name] = value
                    self.original.setdefault(name, before.get(name, _MISSING))
            self.module = module
            self._bind(self.original)

    @contextmanager
    def active(self, on: bool) -> Iterator[None]:
        if not on or not self.patched:
            yield
            return
        self._bind(self.patched)
        try:
            yield
        finally:
            self._bind(self.original)

    def names(self) -> list[str]:
        return sorted(self.patched)

    def _bind(self, values: dict[str, Any]) -> None:
        assert self.module is not None
        for name, value in values.items():
            if value is _MISSING:
                if hasattr(self.module, name):
                    delattr(self.module, name)
            else:
                setattr(self.module, name, value)


def family_module(model: nn.Module) -> ModuleType:
    """The transformers modeling module of `model`'s family (the FSDP2 class subclasses it)."""
    for cls in type(model).__mro__:
        if cls.__module__.startswith("transformers.models."):
            return sys.modules[cls.__module__]
    raise TypeError(f"{type(model).__name__} is not a transformers model class")


# --- models, trainers, runs ----------------------------------------------------------------


def named_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    names = {id(module): name for name, module in model.named_modules()}
    return [(names[id(layer)], layer) for layer in decoder_layers(model)]


def set_checkpointing(model: nn.Module, on: bool) -> None:
    """Gradient checkpointing of the decoder layers on or off (the model was built with it,
    so each layer holds its checkpoint function): what `gradient_checkpointing_disable`
    sets, without re-registering the input-grad hook at each switch."""
    for module in model.modules():
        if hasattr(module, "gradient_checkpointing"):
            module.gradient_checkpointing = on


@dataclass
class Member:
    """One model with its optimizer, shared by the settings of the same kernels."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    fused: bool
    compiled: bool
    build_bytes: int
    """Allocated by the build: the parameter shards (AdamW's state comes at the first step)."""
    updated: bool = False


@dataclass
class Run:
    """One setting at one checkpointing choice: its trainer and what its updates measured."""

    setting: Setting
    checkpointing: bool
    trainer: PolicyTrainer
    member: Member
    warmup_s: float | None = None
    seconds: list[float] = field(default_factory=list)
    peaks: list[int] = field(default_factory=list)
    """Peak allocated bytes of each update above what was allocated at its start."""
    absolute_peaks: list[int] = field(default_factory=list)
    """The same peaks with everything resident (every setting's models and AdamW state)."""
    graphs: list[int] = field(default_factory=list)
    """Graphs dynamo compiled during each update, the warm-up's first."""
    metrics: list[dict[str, float]] = field(default_factory=list)
    fused_head_calls: list[int] = field(default_factory=list)
    failed: str | None = None
    profile: dict[str, Any] | None = None

    @property
    def key(self) -> str:
        return f"{self.setting.name}/{'ckpt' if self.checkpointing else 'no_ckpt'}"


class FusedHeadCounter:
    """Counts calls of liger's fused log-prob head (hybrid.workers.log_prob_head reads
    `fused_log_probs` from its module globals at call time)."""

    def __init__(self) -> None:
        self.calls = 0
        self.original = log_prob_head.fused_log_probs

        def counted(*args: Any, **kwargs: Any) -> torch.Tensor:
            self.calls += 1
            return self.original(*args, **kwargs)

        log_prob_head.fused_log_probs = counted  # type: ignore[assignment]

    def restore(self) -> None:
        log_prob_head.fused_log_probs = self.original  # type: ignore[assignment]


def build_member(
    smoke: Smoke,
    args: argparse.Namespace,
    shape: TinyModelConfig,
    mesh: DeviceMesh,
    device: torch.device,
    dtype: torch.dtype,
    setting: Setting,
    family: FamilyGlobals,
) -> Member:
    before = allocated(device)
    model = random_fsdp_model(shape, mesh, device, param_dtype=dtype, gradient_checkpointing=True)
    if setting.fused:
        with family.capture(model):
            apply_fused_kernels(model, str(model.config.model_type), FUSED_OPS)
        smoke.log(f"  liger patched {family.names()} of {family_module(model).__name__}")
    if setting.compiled:
        compile_blocks(named_layers(model), "actor", required=True, backend=args.compile_backend)
    optimizer = build_optimizer(model, 1e-6, 0.0, (0.9, 0.999), 1e-8)
    return Member(model, optimizer, setting.fused, setting.compiled, allocated(device) - before)


def needs_s(run: Run, runs: list[Run], device: torch.device) -> float:
    """Seconds the run's next update may take, for the budget: 1.3 x its last timed update;
    before that, twice the fastest update seen so far (a warm-up that compiled is no guide
    to the updates after it), plus, for a model's first update, its compile and liger's first
    launches."""
    if run.seconds:
        return 1.3 * run.seconds[-1] + 1.0
    latest = [r.seconds[-1] if r.seconds else r.warmup_s for r in runs]
    known = [s for s in latest if s is not None]
    base = 2.0 * min(known) + 1.0 if known else FIRST_UPDATE_S[device.type]
    if run.warmup_s is not None or run.member.updated:
        return base  # its graphs and kernels exist (at most checkpointing differs)
    compile_s = COMPILE_S[device.type] if run.setting.compiled else 0.0
    fused_s = FUSED_FIRST_S[device.type] if run.setting.fused else 0.0
    return base + compile_s + fused_s


def one_update(
    run: Run, batch: Batch, device: torch.device, family: FamilyGlobals
) -> tuple[dict[str, float], float, int, int, int, int]:
    """(metrics, seconds, peak bytes above the start, peak bytes, graphs compiled, fused-head
    calls)."""
    model = run.member.model
    set_checkpointing(model, run.checkpointing)
    synchronize(device)
    reset_peak(device)  # no empty_cache: the timed update would pay the driver's allocations
    start_bytes = allocated(device)
    graphs_before = compiled_graphs()
    counter = FusedHeadCounter()
    try:
        with family.active(run.member.fused):
            metrics, seconds = timed(device, lambda: run.trainer.update(batch))
    finally:
        counter.restore()
    peak = peak_allocated(device)
    graphs = compiled_graphs() - graphs_before
    return metrics, seconds, max(peak - start_bytes, 0), peak, graphs, counter.calls


def attempt(smoke: Smoke, run: Run, batch: Batch, device: torch.device, family: FamilyGlobals,
            warmup: bool) -> None:  # fmt: skip
    """One update of `run`, recorded; an error fails the run (its check) and the run stops."""
    try:
        metrics, seconds, peak, absolute, graphs, head_calls = one_update(
            run, batch, device, family
        )
    except Exception as error:  # recorded by name; the other settings go on
        smoke.log(traceback.format_exc().rstrip())
        run.failed = f"{type(error).__name__}: {str(error).strip().splitlines()[0][:300]}"
        smoke.check(f"update/{run.key}", False, f"raised {run.failed}")
        run.member.optimizer.zero_grad(set_to_none=True)  # what the failed step accumulated
        empty_cache(device)
        return
    run.member.updated = True
    if warmup:
        run.warmup_s = seconds
    else:
        run.seconds.append(seconds)
    run.peaks.append(peak)
    run.absolute_peaks.append(absolute)
    run.graphs.append(graphs)
    run.metrics.append({key: float(metrics[key]) for key in COMPARED})
    run.fused_head_calls.append(head_calls)
    smoke.log(
        f"  {'warm-up' if warmup else 'timed'} {run.key}: {seconds:.3f}s, peak +{gib(peak)} GiB, "
        f"graphs +{graphs}, pg_loss {metrics['actor/pg_loss']:.6g}, "
        f"grad_norm {metrics['actor/grad_norm']:.6g}"
    )


# --- the profile's split -------------------------------------------------------------------

CATEGORIES = ("matmul", "attention", "communication", "copy", "elementwise")
# Kernel (cuda) or aten op (cpu) name fragments, lower case, tried in this order. cuBLAS on
# Hopper names its GEMMs nvjet_* and sm90_xmma_*; sdpa's kernels are flash_*, fmha_* (the
# memory-efficient one, a CUTLASS kernel: attention before matmul) or cudnn's *sdpa*.
_MATMUL = "gemm nvjet xmma cutlass wgmma cublas splitk matmul triton_tem aten::mm aten::addmm aten::bmm aten::baddbmm _grouped_mm"
_PATTERNS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("attention", ("flash", "fmha", "attention", "sdpa", "attn")),
    ("communication", ("nccl", "c10d::", "all_gather", "reduce_scatter", "allreduce")),
    ("copy", ("memcpy", "memset", "aten::copy_", "aten::_to_copy", "aten::fill_", "aten::zero_")),
    ("matmul", tuple(_MATMUL.split())),
)


LIGER_KERNELS = ("_rms_norm_", "_swiglu_", "rope", "liger", "cross_entropy_kernel")
"""Name fragments of liger-kernel's Triton kernels (ops/rms_norm.py, swiglu.py, rope.py,
fused_linear_cross_entropy.py): the evidence that a fused setting ran them."""


def category(name: str) -> str:
    lower = name.lower()
    for label, fragments in _PATTERNS:
        if any(fragment in lower for fragment in fragments):
            return label
    return "elementwise"


def time_split(averages: Any, on_device: bool) -> dict[str, Any]:
    """Device time (cuda: the kernels' own time; cpu: the aten ops' self CPU time, a logic
    check only) per category, in ms, with each category's share and the elementwise share
    (everything but matmul and attention kernels, as issue 48 measures it)."""
    from torch.autograd import DeviceType

    totals = dict.fromkeys(CATEGORIES, 0.0)
    top: dict[str, list[tuple[float, str]]] = {label: [] for label in CATEGORIES}
    liger: dict[str, float] = {}
    for event in averages:
        if on_device:
            if event.device_type == DeviceType.CPU:
                continue
            us = float(event.self_device_time_total)
        else:
            if not event.key.startswith("aten::"):
                continue  # autograd nodes and Python wrappers: their ops are counted
            us = float(event.self_cpu_time_total)
        label = category(event.key)
        totals[label] += us
        top[label].append((us, event.key))
        if on_device and any(fragment in event.key.lower() for fragment in LIGER_KERNELS):
            liger[event.key] = liger.get(event.key, 0.0) + us
    total = sum(totals.values())
    split: dict[str, Any] = {
        "total_ms": round(total / 1e3, 3),
        "ms": {label: round(us / 1e3, 3) for label, us in totals.items()},
        "share": {label: round(us / total, 4) if total else None for label, us in totals.items()},
        "elementwise_share": (
            round((total - totals["matmul"] - totals["attention"]) / total, 4) if total else None
        ),
        "source": "cuda kernels" if on_device else "cpu aten ops (logic check)",
        "top_elementwise": [name[:90] for _, name in sorted(top["elementwise"], reverse=True)[:5]],
        "liger_kernels": sorted(name[:60] for name in liger)[:12],
        "liger_share": round(sum(liger.values()) / total, 4) if total else None,
    }
    return split


def profile_run(
    smoke: Smoke,
    run: Run,
    batch: Batch,
    device: torch.device,
    family: FamilyGlobals,
    report: list[str],
) -> None:
    from torch.profiler import ProfilerActivity, profile

    on_device = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_device else [])
    set_checkpointing(run.member.model, run.checkpointing)
    with family.active(run.member.fused), profile(activities=activities) as prof:
        run.trainer.update(batch)
        synchronize(device)
    averages = prof.key_averages()
    run.profile = time_split(averages, on_device)
    sort_by = "self_device_time_total" if on_device else "self_cpu_time_total"
    report.append(f"== {run.key}\n{averages.table(sort_by=sort_by, row_limit=25)}\n")
    smoke.log(
        f"  profile {run.key}: elementwise share {run.profile['elementwise_share']}, "
        f"split {run.profile['share']}"
    )


# --- the results ---------------------------------------------------------------------------


def summarise(
    smoke: Smoke,
    runs: list[Run],
    flops: float,
    peak: float | None,
    tokens: int,
) -> list[dict[str, Any]]:
    rows = []
    eager_rate = {
        r.checkpointing: tokens / statistics.median(r.seconds)
        for r in runs
        if r.setting.name == "eager" and r.seconds
    }
    for run in runs:
        row: dict[str, Any] = {"setting": run.key, "timed_updates": len(run.seconds)}
        if run.failed:
            row["failed"] = run.failed
        if run.warmup_s is not None:
            row["warmup_s"] = round(run.warmup_s, 3)
        if run.seconds:
            median = statistics.median(run.seconds)
            row["update_s"] = round(median, 4)
            row["tokens_per_s"] = round(tokens / median, 1)
            base = eager_rate.get(run.checkpointing)
            row["over_eager"] = round(tokens / median / base, 3) if base else None
            row["achieved_tflops"] = round(flops / median / 1e12, 3)
            row["mfu"] = round(flops / median / 1e12 / peak, 4) if peak else None
        if run.peaks:
            row["update_peak_gib"] = gib(max(run.peaks))
        if run.absolute_peaks:
            row["peak_allocated_gib"] = gib(max(run.absolute_peaks))
        row["model_build_gib"] = gib(run.member.build_bytes)
        if run.graphs:
            row["graphs_first_update"] = run.graphs[0]
            row["graphs_after_first"] = sum(run.graphs[1:])
        if run.fused_head_calls:
            row["fused_head_calls_per_update"] = run.fused_head_calls[-1]
        if run.metrics:
            row["first_update"] = run.metrics[0]
        if run.profile is not None:
            row["elementwise_share"] = run.profile["elementwise_share"]
            row["profile"] = run.profile
        rows.append(row)
        smoke.figure(f"run/{run.key}", row)
    return rows


def dynamo_figures(smoke: Smoke) -> None:
    """dynamo's own counters: graph breaks by reason (each compiled layer runs as the graphs
    between them) and its stats (unique graphs, recompiles), to read a slow compiled setting."""
    from torch._dynamo.utils import counters

    breaks = sorted(counters["graph_break"].items(), key=lambda item: -item[1])
    smoke.figure("dynamo_graph_breaks", {reason[:160]: n for reason, n in breaks[:10]})
    smoke.figure("dynamo_stats", dict(counters["stats"]))


def checks(smoke: Smoke, runs: list[Run]) -> None:
    eager_first = {
        r.checkpointing: r.metrics[0] for r in runs if r.setting.name == "eager" and r.metrics
    }
    for run in runs:
        if not run.metrics:
            continue
        norms = [m["actor/grad_norm"] for m in run.metrics]
        smoke.check(
            f"finite/{run.key}",
            all(math.isfinite(n) for n in norms)
            and all(math.isfinite(m["actor/pg_loss"]) for m in run.metrics),
            f"grad norms {[round(n, 6) for n in norms]}",
        )
        if run.setting.compiled:
            if len(run.graphs) > 1:
                smoke.check(
                    f"recompiles/{run.key}",
                    sum(run.graphs[1:]) == 0,
                    f"graphs compiled per update {run.graphs} (the first compiles; then 0)",
                )
            compiled = [is_compiled(layer) for _, layer in named_layers(run.member.model)]
            smoke.check(
                f"compiled_layers/{run.key}",
                all(compiled),
                f"{sum(compiled)}/{len(compiled)} decoder layers run compiled",
            )
        if run.setting.fused and run.profile is not None:
            smoke.check(
                f"liger_ran/{run.key}",
                bool(run.profile["liger_kernels"]),
                f"liger's kernels in the profile: {run.profile['liger_kernels']}",
            )
        if run.setting.fused and run.fused_head_calls and not any(run.fused_head_calls):
            smoke.log(
                f"  note {run.key}: the fused head ran 0 times: the update asks for the entropy "
                "(PolicyTrainer scores with_entropy=True), so the chunked head runs"
            )
        reference = eager_first.get(run.checkpointing)
        if run.setting.name != "eager" and reference is not None:
            ours, theirs = run.metrics[0]["actor/grad_norm"], reference["actor/grad_norm"]
            relative = abs(ours - theirs) / max(abs(theirs), 1e-30)
            smoke.check(
                f"agrees_with_eager/{run.key}",
                relative <= AGREE_RTOL,
                f"first update: grad_norm {ours:.6g} vs eager {theirs:.6g} (relative "
                f"{relative:.3g}, tolerance {AGREE_RTOL}); pg_loss "
                f"{run.metrics[0]['actor/pg_loss']:.6g} vs {reference['actor/pg_loss']:.6g}",
            )


def table(rows: list[dict[str, Any]]) -> list[str]:
    def cell(row: dict[str, Any], key: str, fmt: str) -> str:
        value = row.get(key)
        return "-" if value is None else format(value, fmt)

    lines = [
        f"{'setting':<22}{'tok/s':>11}{'x eager':>9}{'MFU':>8}{'peak GiB':>10}"
        f"{'graphs':>9}{'+after':>8}{'elemwise':>10}  note"
    ]
    for row in rows:
        note = row.get("failed", "") or ("" if row.get("timed_updates") else "not timed")
        lines.append(
            f"{row['setting']:<22}{cell(row, 'tokens_per_s', ',.0f'):>11}"
            f"{cell(row, 'over_eager', '.3f'):>9}{cell(row, 'mfu', '.1%'):>8}"
            f"{cell(row, 'update_peak_gib', '.2f'):>10}{cell(row, 'graphs_first_update', 'd'):>9}"
            f"{cell(row, 'graphs_after_first', 'd'):>8}{cell(row, 'elementwise_share', '.1%'):>10}"
            f"  {note[:60]}"
        )
    return lines


# --- main ----------------------------------------------------------------------------------


def run_all(smoke: Smoke, args: argparse.Namespace, device: torch.device) -> list[str]:
    mesh = smoke.section("init_process_group", 0, init_world, device)
    if mesh is None:
        return []
    dtype = environment(smoke, device)
    smoke.figure("dtype", str(dtype).removeprefix("torch."))
    torch.use_deterministic_algorithms(False)
    shape = SHAPES[args.shape]
    if args.layers:
        shape = dataclasses.replace(shape, num_hidden_layers=args.layers)
    settings = [SETTINGS[name] for name in args.settings]
    no_liger = liger_unavailable(device) if any(s.fused for s in settings) else None
    if no_liger is not None:
        if SETTINGS["fused"] in settings:
            smoke.skip("fused", no_liger)
            settings.remove(SETTINGS["fused"])
        if SETTINGS["all"] in settings:
            smoke.log(f"  all: without liger's ops ({no_liger})")
            index = settings.index(SETTINGS["all"])
            settings[index] = Setting("all", compiled=True, reduce_once=True)
    modes = {"on": [True], "off": [False], "both": [True, False]}[args.checkpointing]
    smoke.figure("shape", args.shape)
    smoke.figure("layers", shape.num_hidden_layers)
    smoke.figure("compile_backend", args.compile_backend)
    smoke.figure("settings", [s.name for s in settings])
    smoke.figure("checkpointing", modes)

    vocab = vocab_size(shape.vocab)
    batch = synthetic_batch([args.prompt] * args.rows, [args.response] * args.rows, vocab)
    batch = batch.to(device)
    tokens = int(batch.tensors["attention_mask"].sum())
    smoke.figure("tokens_per_update", tokens)
    smoke.figure("micro_batches_per_step", args.rows // args.micro_batch)

    family = FamilyGlobals()
    members: dict[tuple[bool, bool], Member] = {}
    for setting in settings:
        if setting.model_key in members:
            continue
        name = f"build/{'compiled' if setting.compiled else 'eager'}" + (
            "+fused" if setting.fused else ""
        )
        member = smoke.section(
            name, 10, build_member, smoke, args, shape, mesh, device, dtype, setting, family
        )
        if member is not None:
            members[setting.model_key] = member
    if not members:
        return []
    first = next(iter(members.values()))
    parameters = full_parameter_count(first.model)
    flops = update_flops(shape, parameters, batch)
    peak = peak_tflops(args, device)
    smoke.figure("parameters", parameters)
    smoke.figure("update_flops", flops)
    smoke.figure("peak_tflops", peak)
    if peak is None:
        smoke.log("  unknown bf16 peak for this device: pass --peak-tflops for the MFU")

    config = ActorConfig(micro_batch_size=args.micro_batch, optim=OptimConfig(lr=1e-6))
    runs: list[Run] = []
    for checkpointing in modes:  # interleaved: every setting of one mode, then the other
        for setting in settings:
            member = members.get(setting.model_key)
            if member is None:
                continue
            passes = PassConfig(args.micro_batch, fused_head=setting.fused)
            trainer = PolicyTrainer(
                member.model, member.optimizer, config, WorkerSpec(), passes,
                reduce_once=setting.reduce_once,
            )  # fmt: skip
            runs.append(Run(setting, checkpointing, trainer, member))

    for round_index in range(args.rounds + 1):
        warmup = round_index == 0
        live = [r for r in runs if r.failed is None and (warmup or r.warmup_s is not None)]
        if not live:
            break
        if round_index >= 2:
            # A later round runs only whole: the settings keep the same number of samples.
            whole = sum(needs_s(r, runs, device) for r in live)
            if smoke.left_s() < whole + RESERVE_S:
                for later in range(round_index, args.rounds + 1):
                    smoke.skip(
                        f"timed_round_{later}",
                        f"deadline: {smoke.left_s():.0f}s left, a round needs {whole:.0f}s",
                        deadline=True,
                    )
                break
        smoke.log(f"== round {round_index}/{args.rounds}" + (" (warm-up)" if warmup else ""))
        for run in live:
            need = needs_s(run, runs, device)
            if smoke.left_s() < need + RESERVE_S:
                what = "warm-up" if warmup else f"timed round {round_index}"
                smoke.skip(
                    f"{run.key}/{what}",
                    f"deadline: {smoke.left_s():.0f}s left, needs about {need:.0f}s",
                    deadline=True,
                )
                continue
            attempt(smoke, run, batch, device, family, warmup)

    report: list[str] = []
    if args.mfu_profile:
        smoke.log("== profiles")
        for run in runs:
            if run.failed is not None or not run.seconds:
                continue
            # The update under the profiler, then key_averages over its events (seconds).
            need = 2.0 * needs_s(run, runs, device) + 5.0
            if smoke.left_s() < need + RESERVE_S:
                smoke.skip(
                    f"profile/{run.key}",
                    f"deadline: {smoke.left_s():.0f}s left, needs about {need:.0f}s",
                    deadline=True,
                )
                continue
            try:
                profile_run(smoke, run, batch, device, family, report)
            except Exception as error:
                smoke.log(traceback.format_exc().rstrip())
                smoke.check(f"profile/{run.key}", False, f"raised {type(error).__name__}: {error}")
        if report:
            path = args.out / "update_profile.txt"
            path.write_text("\n".join(report))
            smoke.log(f"  top kernels per setting written to {path}")

    rows = summarise(smoke, runs, flops, peak, tokens)
    dynamo_figures(smoke)
    checks(smoke, runs)
    lines = table(rows)
    smoke.log("tokens/s: the median timed update; x eager: over eager at the same checkpointing;")
    smoke.log("peak GiB: allocated above the update's start; graphs: compiled at the first")
    smoke.log("update, +after: at the later ones (0 wanted); elemwise: device time outside")
    smoke.log("matmul and attention kernels (--mfu-profile)")
    for line in lines:
        smoke.log(line)
    return lines


def main() -> int:
    args = parse_args()
    smoke = Smoke("smoke_update", args.out, args.budget_s)
    device = script_device(args.device)
    smoke.figure("device", torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu")
    lines: list[str] = []
    try:
        lines = run_all(smoke, args, device)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    code = smoke.finish(args)
    print("\n".join(lines), flush=True)  # the table last, where a tail of the output shows it
    return code


if __name__ == "__main__":
    raise SystemExit(main())
