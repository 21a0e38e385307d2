"""GPU smoke test, Run 1: single-rank NCCL FSDP2, offload, update, gather, ledger, MFU.

The first CUDA run of the whole trainer side (GPU preflight, section 3, Run 1), one process,
world size 1, `nccl` with `device_id` (gloo with --device cpu). It proves:
- `Hardware.detect` resolves the trainer's `auto` dtype to bfloat16 on the GPU;
- `build_fsdp_model` (sdpa, i.e. our `sdpa_varlen`, gradient checkpointing) on the
  bench-100m model, then three `PolicyTrainer.update` steps on packed micro-batches through
  the chunked head: one micro-batch short enough for the dense block mask, one long enough
  for the per-sequence calls;
- the same three steps from the same initial state with
  `Offloader(param_offload=True, optimizer_offload=True)` moving everything to the host
  between steps give identical `actor/pg_loss` and `actor/grad_norm`; each offload lowers
  `torch.cuda.memory_allocated` by the shard + AdamW bytes, and after each onload the
  parameters are DTensors on the device again (the FSDP2 path no CPU test reaches);
- `iter_full_parameters(model, "layer", bf16)` yields every parameter at its full shape;
- the memory ledger's records, with `torch.cuda.mem_get_info` at every boundary, go to
  `<out>/ledger.json` (the context and NCCL overhead the planner reserves for).
It also measures the update's MFU on a Qwen2.5-1.5B-shaped model with random weights
(6 x parameters x tokens + the causal attention term, over the GPU's bf16 dense peak);
printed, not asserted (the goal is >= 40%).

    timeout 420 python3 tests/gpu/smoke_fsdp.py --out out
    python tests/gpu/smoke_fsdp.py --out /tmp/smoke --device cpu      # logic check, tiny

Writes <out>/smoke_fsdp.json (figures, checks), <out>/smoke_fsdp.log and <out>/ledger.json;
exits 1 naming the failed checks, 2 if the deadline cut work short.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from _smoke_common import (
    SHAPES,
    DeviceLedger,
    Smoke,
    allocated,
    base_parser,
    device_info,
    gib,
    peak_allocated,
    random_fsdp_model,
    release,
    reset_peak,
    script_device,
    synthetic_batch,
    timed,
)
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor

from hybrid.data import Batch
from hybrid.dtypes import Hardware, auto_dtype, torch_dtype
from hybrid.memory.components import (
    full_parameter_count,
    gradient_bytes,
    optimizer_state_bytes,
    parameter_bytes,
)
from hybrid.models import TinyModelConfig, build_tiny_model, vocab_size
from hybrid.sharding.gather import iter_full_parameters
from hybrid.sharding.offload import Offloader
from hybrid.workers.config import ActorConfig, OptimConfig, WorkerSpec
from hybrid.workers.forward import PassConfig
from hybrid.workers.fsdp import build_fsdp_model, build_optimizer
from hybrid.workers.policy import PolicyTrainer

STEPS = 3
MICRO_BATCH = 4
# Rows 0-3 pack to < 1024 tokens (the dense block-mask call), rows 4-7 to > 1024 (one causal
# call per sequence): both sdpa_varlen paths run in every step.
PROMPTS = [40, 64, 80, 96, 256, 200, 160, 256]
RESPONSES = [64, 128, 96, 160, 512, 640, 384, 700]
COMPARED = ("actor/pg_loss", "actor/grad_norm")
# bf16 dense tensor-core peak (TFLOP/s) by device name, first match wins.
PEAK_BF16_TFLOPS = (("H100 PCIe", 756.0), ("H100", 989.0), ("H200", 989.0))


def parse_args() -> argparse.Namespace:
    parser = base_parser(__doc__ or "", budget_s=360)
    parser.add_argument("--model", choices=sorted(SHAPES), help="default: bench-100m (cpu: tiny)")
    parser.add_argument(
        "--mfu-shape", choices=sorted(SHAPES), help="default: qwen2.5-1.5b (cpu: tiny)"
    )
    parser.add_argument("--peak-tflops", type=float, help="override the detected bf16 peak")
    parser.add_argument(
        "--mfu-profile",
        action="store_true",
        help="also profile one update (top kernels to <out>/mfu_profile.txt) and time the "
        "update without gradient checkpointing",
    )
    args = parser.parse_args()
    cpu = args.device == "cpu"
    args.model = args.model or ("tiny" if cpu else "bench-100m")
    args.mfu_shape = args.mfu_shape or ("tiny" if cpu else "qwen2.5-1.5b")
    return args


def init_world(device: torch.device) -> DeviceMesh:
    """World 1 on the real backend: NCCL bound to the device, or gloo on CPU."""
    dist.init_process_group(
        "nccl" if device.type == "cuda" else "gloo",
        store=dist.HashStore(),
        rank=0,
        world_size=1,
        device_id=device if device.type == "cuda" else None,
    )
    return init_device_mesh(device.type, (1,), mesh_dim_names=("fsdp",))


def environment(smoke: Smoke, device: torch.device) -> torch.dtype:
    hardware = Hardware.detect(device)
    resolved = auto_dtype("trainer", hardware)
    smoke.figure("hardware", hardware.description)
    smoke.figure("trainer_dtype_auto", resolved)
    smoke.figure("all_gather_single_exists", hasattr(dist, "all_gather_single"))
    if device.type == "cuda":
        smoke.figure("cuda", torch.version.cuda)
        smoke.figure("capability", list(torch.cuda.get_device_capability(device)))
        smoke.check("env/bf16", resolved == "bfloat16", f"auto resolved to {resolved}")
    return torch_dtype(resolved)


# --- the actor -----------------------------------------------------------------------------


class Actor:
    """The FSDP2 model from the checkpoint, its AdamW and trainer, tracked by the ledger."""

    def __init__(
        self,
        model_dir: Path,
        mesh: DeviceMesh,
        device: torch.device,
        dtype: torch.dtype,
        ledger: DeviceLedger,
    ) -> None:
        self.device = device
        self.model = build_fsdp_model(
            str(model_dir), mesh, device, param_dtype=dtype, gradient_checkpointing=True
        )
        self.optimizer = build_optimizer(self.model, 1e-5, 0.0, (0.9, 0.999), 1e-8)
        config = ActorConfig(micro_batch_size=MICRO_BATCH, optim=OptimConfig(lr=1e-5))
        passes = PassConfig(micro_batch_size=MICRO_BATCH)
        self.trainer = PolicyTrainer(
            self.model, self.optimizer, config, WorkerSpec(), passes, ledger
        )
        ledger.track("actor", self.components)
        ledger.record("init/model")

    def components(self) -> dict[str, Any]:
        return {
            "actor_params": parameter_bytes(self.model),
            "actor_grads": gradient_bytes(self.model),
            "optimizer_state": optimizer_state_bytes(self.optimizer),
        }

    def device_bytes(self) -> int:
        """Shards, buffers and AdamW moments on the device: what an offload moves."""
        if self.device.type != "cuda":
            return 0  # on CPU the offload target is the device itself: nothing moves
        return parameter_bytes(self.model)["cuda"] + optimizer_state_bytes(self.optimizer)["cuda"]


def plain_updates(smoke: Smoke, actor: Actor, batch: Batch, ledger: DeviceLedger) -> list:
    steps, seconds = [], []
    for step in range(1, STEPS + 1):
        ledger.label = f"plain/step{step}"
        metrics, elapsed = timed(actor.device, lambda: actor.trainer.update(batch))
        smoke.log(f"  plain step {step}: {_headline(metrics)}, {elapsed:.2f}s")
        steps.append(metrics)
        seconds.append(round(elapsed, 3))
    smoke.figure("plain_update_s", seconds)
    return steps


def offloaded_updates(smoke: Smoke, actor: Actor, batch: Batch, ledger: DeviceLedger) -> list:
    """The worker's sequence: offload after build, then per step onload, update, offload."""
    offloader = Offloader(actor.model, actor.optimizer, actor.device, True, True)
    expected = actor.device_bytes()
    before = allocated(actor.device)
    offloader.offload_params()
    check_offloaded(smoke, actor, "init", before - allocated(actor.device), expected)
    steps, seconds = [], []
    for step in range(1, STEPS + 1):
        ledger.label = f"offload/step{step}"
        start = time.perf_counter()
        with offloader.phase("update", ledger, with_optimizer=True):
            check_onloaded(smoke, actor, f"step{step}")
            metrics = actor.trainer.update(batch)
            expected, before = actor.device_bytes(), allocated(actor.device)
        seconds.append(round(time.perf_counter() - start, 3))
        check_offloaded(smoke, actor, f"step{step}", before - allocated(actor.device), expected)
        smoke.log(f"  offloaded step {step}: {_headline(metrics)}, {seconds[-1]:.2f}s")
        steps.append(metrics)
    smoke.figure("offloaded_step_s", seconds)  # onload + update + offload
    offloader.onload_params()
    return steps


def check_onloaded(smoke: Smoke, actor: Actor, when: str) -> None:
    params = list(actor.model.parameters())
    wrong = [
        type(p).__name__ + "@" + str(p.device)
        for p in params
        if not isinstance(p, DTensor) or p.device.type != actor.device.type
    ]
    smoke.check(
        f"offload/onloaded_dtensors_{when}",
        not wrong,
        f"{len(params) - len(wrong)}/{len(params)} parameters are DTensors on "
        f"{actor.device.type}" + (f"; first wrong: {wrong[0]}" if wrong else ""),
    )


def check_offloaded(smoke: Smoke, actor: Actor, when: str, drop: int, expected: int) -> None:
    on_host = all(p.device.type == "cpu" for p in actor.model.parameters())
    smoke.check(f"offload/params_on_host_{when}", on_host, "every parameter on cpu")
    tolerance = 0.02 * expected + (16 << 20)
    smoke.check(
        f"offload/memory_drop_{when}",
        abs(drop - expected) <= tolerance,
        f"allocated fell by {gib(drop)} GiB; shards + AdamW state on the device were "
        f"{gib(expected)} GiB (tolerance {gib(tolerance)} GiB); now "
        f"{gib(allocated(actor.device))} GiB allocated",
    )


def _headline(metrics: dict[str, float]) -> str:
    return ", ".join(f"{key.split('/')[1]} {metrics[key]!r}" for key in COMPARED)


def compare(smoke: Smoke, plain: list[dict], offloaded: list[dict]) -> None:
    for key in COMPARED:
        pairs = [(p[key], o[key]) for p, o in zip(plain, offloaded, strict=True)]
        worst = max(abs(a - b) / max(abs(a), 1e-30) for a, b in pairs)
        smoke.check(
            f"offload/same_{key.split('/')[1]}",
            all(a == b for a, b in pairs),
            f"plain vs offloaded per step: {pairs}; largest relative difference {worst:.3g}",
        )


def gather(smoke: Smoke, actor: Actor, dtype: torch.dtype) -> None:
    """The sync's gather at layer granularity (world 1: the local shards, cast)."""
    shapes = {name: tuple(p.shape) for name, p in actor.model.named_parameters()}
    reset_peak(actor.device)
    base = allocated(actor.device)

    def consume() -> list[str]:
        bad = []
        for name, tensor in iter_full_parameters(actor.model, "layer", dtype):
            if (
                isinstance(tensor, DTensor)
                or tuple(tensor.shape) != shapes[name]
                or (tensor.dtype != dtype or tensor.device.type != actor.device.type)
            ):
                bad.append(
                    f"{name}: {type(tensor).__name__} {tuple(tensor.shape)} "
                    f"{tensor.dtype} {tensor.device}"
                )
            shapes.pop(name, None)
            del tensor  # let go before the next one is gathered: the peak is the gather's own
        return bad

    bad, seconds = timed(actor.device, consume)
    smoke.figure("gather_layer_s", round(seconds, 4))
    smoke.figure("gather_layer_peak_gib", gib(peak_allocated(actor.device) - base))
    smoke.check(
        "gather/full_tensors",
        not bad and not shapes,
        f"wrong: {bad[:3]}; never yielded: {sorted(shapes)[:3]}",
    )


# --- MFU -----------------------------------------------------------------------------------


def peak_tflops(args: argparse.Namespace, device: torch.device) -> float | None:
    if args.peak_tflops:
        return args.peak_tflops
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in PEAK_BF16_TFLOPS if key in name), None)


def update_flops(shape: TinyModelConfig, parameters: int, batch: Batch) -> float:
    """Model FLOPs of one update (forward + backward, recomputation not counted):
    6 x parameters x tokens, plus causal attention: 6 x layers x width x sum(L_i^2)."""
    lengths = batch.tensors["attention_mask"].sum(-1).double()
    width = shape.num_attention_heads * shape.head_dim
    dense = 6.0 * parameters * float(lengths.sum())
    attention = 6.0 * shape.num_hidden_layers * width * float((lengths**2).sum())
    return dense + attention


def measure_mfu(
    smoke: Smoke,
    args: argparse.Namespace,
    mesh: DeviceMesh,
    device: torch.device,
    dtype: torch.dtype,
    checkpointing: bool = True,
) -> None:
    torch.use_deterministic_algorithms(False)  # the real update's kernels, not the bitwise ones
    shape = SHAPES[args.mfu_shape]
    model = random_fsdp_model(
        shape, mesh, device, param_dtype=dtype, gradient_checkpointing=checkpointing
    )
    tag = "mfu" if checkpointing else "mfu_no_ckpt"
    optimizer = build_optimizer(model, 1e-6, 0.0, (0.9, 0.999), 1e-8)
    config = ActorConfig(micro_batch_size=4, optim=OptimConfig(lr=1e-6))
    trainer = PolicyTrainer(model, optimizer, config, WorkerSpec(), PassConfig(4))
    prompt, response = (512, 1536) if device.type == "cuda" else (32, 96)
    batch = synthetic_batch([prompt] * 16, [response] * 16, vocab_size(shape.vocab)).to(device)
    parameters = full_parameter_count(model)
    flops = update_flops(shape, parameters, batch)
    smoke.figure(f"{tag}_shape", args.mfu_shape)
    smoke.figure(f"{tag}_parameters", parameters)
    smoke.figure(f"{tag}_tokens_per_update", int(batch.tensors["attention_mask"].sum()))
    reset_peak(device)
    _, warmup_s = timed(device, lambda: trainer.update(batch))
    smoke.log(f"  warm-up update {warmup_s:.2f}s")
    seconds: list[float] = []
    while len(seconds) < 3 and smoke.left_s() > 2 * warmup_s + 10:
        seconds.append(timed(device, lambda: trainer.update(batch))[1])
        smoke.log(f"  update {len(seconds)}: {seconds[-1]:.3f}s")
    if not seconds:
        smoke.skip(f"{tag}_timed_updates", "deadline after the warm-up update", deadline=True)
        return
    median = statistics.median(seconds)
    achieved = flops / median / 1e12
    smoke.figure(f"{tag}_update_s", round(median, 4))
    smoke.figure(f"{tag}_achieved_tflops", round(achieved, 3))
    smoke.figure(f"{tag}_peak_memory_gib", gib(peak_allocated(device)))
    peak = peak_tflops(args, device)
    smoke.figure(f"{tag}_peak_tflops", peak)
    if peak:
        smoke.figure(tag, round(achieved / peak, 4))
        if checkpointing:
            # Gradient checkpointing recomputes every forward: the hardware does 8/6 of this.
            smoke.figure("hfu_with_recompute", round(achieved / peak * 8 / 6, 4))
    else:
        smoke.log("  unknown bf16 peak for this device: pass --peak-tflops for the MFU")
    if args.mfu_profile and checkpointing and smoke.left_s() > 2 * warmup_s + 10:
        profile_update(smoke, args.out / "mfu_profile.txt", lambda: trainer.update(batch))


def profile_update(smoke: Smoke, path: Path, update: Callable[[], Any]) -> None:
    """One update under torch.profiler: where the device time goes, by kernel and by op."""
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        update()
        if cuda:
            torch.cuda.synchronize()
    averages = prof.key_averages()
    by_device = averages.table(sort_by="self_device_time_total", row_limit=40)
    by_cpu = averages.table(sort_by="self_cpu_time_total", row_limit=20)
    path.write_text(f"by self device time\n{by_device}\n\nby self CPU time\n{by_cpu}\n")
    smoke.log(f"  profile written to {path}")
    for line in by_device.splitlines()[:18]:
        smoke.log("  " + line[:160])


# --- main ----------------------------------------------------------------------------------


def run(smoke: Smoke, args: argparse.Namespace, device: torch.device, tmp: Path) -> None:
    mesh = smoke.section("init_process_group", 0, init_world, device)
    if mesh is None:
        return
    dtype = environment(smoke, device)
    shape = SHAPES[args.model]
    model_dir = smoke.section("build_checkpoint", 30, build_tiny_model, tmp / args.model, shape)
    if model_dir is None:
        return
    batch = synthetic_batch(PROMPTS, RESPONSES, vocab_size(shape.vocab)).to(device)
    smoke.figure("update_tokens", int(batch.tensors["attention_mask"].sum()))
    ledger = DeviceLedger(device)

    def train(label: str, updates: Callable[..., list[dict]]) -> tuple[list[dict], Actor]:
        ledger.label = f"{label}/init"
        actor = Actor(model_dir, mesh, device, dtype, ledger)
        return updates(smoke, actor, batch, ledger), actor

    plain = smoke.section("plain_updates", 60, train, "plain", plain_updates)
    plain_steps = plain[0] if plain else None
    ledger.untrack("actor")
    del plain
    release(device)
    offloaded = smoke.section("offloaded_updates", 60, train, "offload", offloaded_updates)
    if offloaded is not None:
        if plain_steps is not None:
            compare(smoke, plain_steps, offloaded[0])
        smoke.section("gather", 20, gather, smoke, offloaded[1], dtype)
    ledger.untrack("actor")
    del offloaded
    release(device)
    ledger.label = "end"
    ledger.record("end")
    ledger.write(args.out / "ledger.json")
    smoke.figure("ledger_records", len(ledger.rows))
    smoke.figure("device_memory_end", device_info(device))
    smoke.section("mfu", 60, measure_mfu, smoke, args, mesh, device, dtype)
    if args.mfu_profile:
        no_checkpointing = functools.partial(measure_mfu, checkpointing=False)
        smoke.section(
            "mfu_no_checkpointing", 60, no_checkpointing, smoke, args, mesh, device, dtype
        )


def main() -> int:
    args = parse_args()
    # Two runs of the same steps must match bit for bit: deterministic cuBLAS and kernels.
    # Not warn_only: with it, SDPA's flash and memory-efficient backward stay nondeterministic.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    smoke = Smoke("smoke_fsdp", args.out, args.budget_s)
    device = script_device(args.device)
    smoke.figure("device", torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            run(smoke, args, device, Path(tmp))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return smoke.finish(args)


if __name__ == "__main__":
    raise SystemExit(main())
