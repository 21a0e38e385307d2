"""GPU smoke test, Run 2: rank 0 of an 8-rank FSDP2 actor at 7B shapes on one GPU.

NCCL refuses two ranks on one GPU, so rank 0 of 8 runs alone on torch's fake process group
(`FakeStore`, backend "fake"): its collectives move nothing (an all-gather copies the local
shard into every slot), so values are meaningless but the memory and the API calls are real.
GPU preflight, section 3, Run 2. It proves, on a Qwen2-7B-shaped model (hidden 3584, 28
layers, 28 heads, 4 KV heads, MLP 18944; the tiny tokenizer's vocabulary unless
--vocab-size) sharded like `build_fsdp_model` but built on meta with random weights:
- one preset-sized update (micro-batch 4 x 1536 tokens, gradient checkpointing, AdamW state
  present: a first update creates it, the second is measured) runs at world 8, with the peak
  allocated and `mem_get_info` per ledger phase, compared with the memory planner's
  prediction in tests/gpu/plan_expected.json when that file exists;
- the sync's gather `iter_full_parameters(..., bf16)` runs on world 8 through our code
  (whether torch has `dist.all_gather_single`, new in 2.13, is recorded: hybrid.torch_compat
  falls back to `all_gather_into_tensor`), every tensor at its full shape, with its peak by
  granularity (tensor / layer / full);
- `sdpa_varlen` against padded SDPA at 7B layer dims for packs of 512 / 1024 / 8192 tokens,
  forward + backward timed, and whether each pack's call is accepted under
  `sdpa_kernel([FLASH_ATTENTION, EFFICIENT_ATTENTION])`: packs up to 1024 tokens take a
  dense block mask with `enable_gqa`; rejected means it falls to the math kernel.

    timeout 540 python3 tests/gpu/smoke_fakepg.py --world 8 --shape qwen2.5-7b --vocab-size 152064 --out out
    python tests/gpu/smoke_fakepg.py --out /tmp/smoke --device cpu     # logic check, tiny

Writes <out>/smoke_fakepg.json, <out>/smoke_fakepg.log and <out>/fakepg_ledger.json;
exits 1 naming the failed checks, 2 if the deadline cut work short.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from _smoke_common import (
    SHAPES,
    DeviceLedger,
    Smoke,
    allocated,
    base_parser,
    gib,
    peak_allocated,
    random_fsdp_model,
    release,
    reset_peak,
    script_device,
    synthetic_batch,
    timed,
)
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.testing._internal.distributed.fake_pg import FakeStore
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from hybrid.memory.components import full_parameter_count, optimizer_state_bytes, parameter_bytes
from hybrid.models import vocab_size
from hybrid.sharding.gather import Granularity, iter_full_parameters
from hybrid.sharding.offload import offload_optimizer
from hybrid.torch_compat import all_gather_single
from hybrid.workers.config import ActorConfig, WorkerSpec
from hybrid.workers.forward import PassConfig
from hybrid.workers.fsdp import build_optimizer
from hybrid.workers.policy import PolicyTrainer
from hybrid.workers.varlen_attention import DENSE_MAX_TOKENS, varlen_sdpa_attention

PLAN = Path(__file__).with_name("plan_expected.json")
# The planner's components this run does not hold: it has no engine and no reference.
NOT_HERE = ("rollout_weights", "kv_cache", "engine_overhead", "ref_params")
PACKS = (512, 1024, 8192)


def parse_args() -> argparse.Namespace:
    parser = base_parser(__doc__ or "", budget_s=480)
    parser.add_argument("--world", type=int, default=8, help="ranks of the fake group")
    parser.add_argument("--shape", choices=sorted(SHAPES), help="default qwen2.5-7b (cpu: tiny)")
    parser.add_argument("--vocab-size", type=int, help="default: the tiny tokenizer's")
    parser.add_argument("--rows", type=int, default=4, help="rows per micro-batch")
    parser.add_argument("--prompt", type=int, default=512, help="prompt tokens per row")
    parser.add_argument("--response", type=int, default=1024, help="response tokens per row")
    parser.add_argument("--plan", type=Path, default=PLAN, help="the planner's JSON (--json)")
    args = parser.parse_args()
    args.shape = args.shape or ("tiny" if args.device == "cpu" else "qwen2.5-7b")
    return args


def init_fake_world(world: int, device: torch.device) -> DeviceMesh:
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    return init_device_mesh(device.type, (world,), mesh_dim_names=("fsdp",))


# --- the actor at real shapes --------------------------------------------------------------


class Actor:
    """The sharded random-weight model, its AdamW and trainer, tracked by the ledger."""

    def __init__(
        self, args: argparse.Namespace, mesh: DeviceMesh, device: torch.device, ledger: DeviceLedger
    ) -> None:
        shape = SHAPES[args.shape]
        self.vocab = args.vocab_size or vocab_size(shape.vocab)
        self.model = random_fsdp_model(shape, mesh, device, vocab=self.vocab)
        self.optimizer = build_optimizer(self.model, 1e-6, 0.0, (0.9, 0.999), 1e-8)
        config = ActorConfig(micro_batch_size=args.rows)
        self.trainer = PolicyTrainer(
            self.model, self.optimizer, config, WorkerSpec(), PassConfig(args.rows), ledger
        )
        ledger.track("actor", self.components)
        ledger.label = "init"
        ledger.record("init/model")

    def components(self) -> dict[str, Any]:
        return {
            "actor_params": parameter_bytes(self.model),
            "optimizer_state": optimizer_state_bytes(self.optimizer),
        }


def build(
    smoke: Smoke,
    args: argparse.Namespace,
    mesh: DeviceMesh,
    device: torch.device,
    ledger: DeviceLedger,
) -> Actor:
    actor = Actor(args, mesh, device, ledger)
    smoke.figure("parameters", full_parameter_count(actor.model))
    smoke.figure("vocab_size", actor.vocab)
    smoke.figure("shard_gib", gib(parameter_bytes(actor.model)[device.type]))
    return actor


def updates(
    smoke: Smoke, args: argparse.Namespace, actor: Actor, ledger: DeviceLedger
) -> dict[str, dict[str, Any]]:
    """Two one-micro-batch updates; the second, with AdamW's state present, is measured."""
    rows = args.rows
    batch = synthetic_batch([args.prompt] * rows, [args.response] * rows, actor.vocab)
    batch = batch.to(ledger.device)
    for step in (1, 2):
        ledger.label = f"update{step}"
        metrics, seconds = timed(ledger.device, lambda: actor.trainer.update(batch))
        smoke.log(
            f"  update {step}: {seconds:.2f}s, grad_norm {metrics['actor/grad_norm']:.4g}, "
            f"step applied {bool(metrics['actor/step_applied'])}"
        )
    state = optimizer_state_bytes(actor.optimizer)[ledger.device.type]
    smoke.check(
        "update/adamw_state",
        state > 0,
        f"AdamW state {gib(state)} GiB on the device (none if no step was applied)",
    )
    peaks = ledger.phase_peaks("update2")
    smoke.figure("update_phases", peaks)
    return peaks


# --- the sync's gather ---------------------------------------------------------------------


def gather_peaks(
    smoke: Smoke, actor: Actor, device: torch.device, ledger: DeviceLedger
) -> dict[str, dict[str, Any]]:
    """Full bf16 tensors by granularity, as the sync sees them: AdamW state on the host
    (optimizer_offload), the shards on the device."""
    smoke.figure("all_gather_single_exists", hasattr(dist, "all_gather_single"))
    smoke.figure("gather_collective", all_gather_single.__name__)
    offload_optimizer(actor.optimizer)
    release(device)
    shapes = {name: tuple(p.shape) for name, p in actor.model.named_parameters()}
    for granularity in ("tensor", "layer", "full"):
        ledger.label = f"sync/{granularity}"
        ledger.record("sync/onload_actor")
        base = allocated(device)
        reset_peak(device)
        bad, seconds = timed(device, partial(consume, actor.model, granularity, shapes))
        smoke.figure(f"gather_{granularity}_peak_gib", gib(peak_allocated(device) - base))
        smoke.figure(f"gather_{granularity}_s", round(seconds, 3))
        smoke.check(f"gather/{granularity}", not bad, f"full bf16 tensors; wrong: {bad[:3]}")
        ledger.record("sync/gather_load")
    return ledger.phase_peaks("sync/layer")


def consume(
    model: nn.Module, granularity: Granularity, shapes: dict[str, tuple[int, ...]]
) -> list[str]:
    """Take every gathered tensor once, as the engine's loader does; what is wrong with them."""
    seen, bad = set(), []
    for name, tensor in iter_full_parameters(model, granularity, torch.bfloat16):
        if isinstance(tensor, DTensor) or tuple(tensor.shape) != shapes[name]:
            bad.append(f"{name}: {type(tensor).__name__} {tuple(tensor.shape)}")
        if tensor.dtype != torch.bfloat16:
            bad.append(f"{name}: {tensor.dtype}")
        seen.add(name)
        del tensor  # let go before the next one is gathered: the peak is the gather's own
    bad.extend(f"{name}: never yielded" for name in sorted(set(shapes) - seen))
    return bad


# --- the planner's prediction --------------------------------------------------------------


def compare_with_plan(
    smoke: Smoke, plan_path: Path, vocab: int, measured: dict[str, dict[str, Any]]
) -> None:
    """Measured peak per phase next to the plan's (hybrid.planner.format.to_json), and
    next to the plan less what this run does not hold (engine, reference)."""
    if not plan_path.is_file():
        smoke.skip("plan_comparison", f"no planner JSON at {plan_path}")
        return
    plan = json.loads(plan_path.read_text())["plan"]
    smoke.log(
        f"  plan: {plan['model']} on {plan['device']}, {plan['gpu_memory_gib']} GiB; this run's "
        f"vocabulary is {vocab} ids (the LM head's buffers follow it: --vocab-size)"
    )
    smoke.log(f"  {'phase':<24}{'measured':>10}{'plan':>10}{'plan here':>11}{'ratio':>8}")
    rows = {}
    for phase, got in measured.items():
        predicted = plan["phases"].get(phase)
        if predicted is None:
            continue
        absent = sum(predicted["components_gib"].get(name, 0.0) for name in NOT_HERE)
        here = predicted["peak_gib"] - absent
        ratio = got["peak_gib"] / here if here > 0 else None
        rows[phase] = {
            "measured_peak_gib": got["peak_gib"],
            "plan_peak_gib": round(predicted["peak_gib"], 4),
            "plan_here_gib": round(here, 4),
            "measured_over_plan_here": None if ratio is None else round(ratio, 3),
        }
        smoke.log(
            f"  {phase:<24}{got['peak_gib']:>10.2f}{predicted['peak_gib']:>10.2f}"
            f"{here:>11.2f}{'' if ratio is None else f'{ratio:>8.2f}'}"
        )
    smoke.figure("plan_model", plan["model"])
    smoke.figure("plan_comparison", rows)


# --- attention kernels ---------------------------------------------------------------------


class _Attention(nn.Module):
    """What the attention functions read of a decoder layer's attention module."""

    def __init__(self, kv_groups: int) -> None:
        super().__init__()
        self.num_key_value_groups = kv_groups
        self.is_causal = True
        self.eval()


def pack_lengths(tokens: int, seed: int) -> list[int]:
    """Sequence lengths of a GRPO-like pack (64 to 1536 tokens each) filling `tokens`."""
    g = torch.Generator().manual_seed(seed)
    lengths: list[int] = []
    while sum(lengths) < tokens:
        lengths.append(min(int(torch.randint(64, 1537, (1,), generator=g)), tokens - sum(lengths)))
    return lengths


def padded_layout(x: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    """(1, heads, T, d) packed -> (rows, heads, longest, d), right-padded, a new leaf."""
    width = max(lengths)
    pieces = x.detach()[0].split(lengths, dim=1)
    rows = torch.stack([F.pad(p, (0, 0, 0, width - p.shape[1])) for p in pieces])
    return rows.requires_grad_()


def padded_mask(lengths: list[int], device: torch.device) -> torch.Tensor:
    """(rows, 1, longest, longest) bool: causal, padding keys masked (transformers' sdpa mask)."""
    width = max(lengths)
    valid = torch.arange(width, device=device) < torch.tensor(lengths, device=device)[:, None]
    causal = torch.ones(width, width, dtype=torch.bool, device=device).tril()
    return causal & valid[:, None, None, :]


def forward_backward(out: torch.Tensor) -> None:
    out.backward(torch.ones_like(out))


def attention_case(
    smoke: Smoke, device: torch.device, args: argparse.Namespace, tokens: int, seed: int
) -> dict[str, Any]:
    """One pack at the shape's layer dims in bf16, forward + backward: sdpa_varlen on the
    packed row against transformers' sdpa on the padded rows (repeated KV heads, 4-D mask)."""
    shape = SHAPES[args.shape]
    module = _Attention(shape.num_attention_heads // shape.num_key_value_heads)
    lengths = pack_lengths(tokens, seed)
    positions = torch.cat([torch.arange(n) for n in lengths]).to(device)[None]

    def leaf(heads: int) -> torch.Tensor:
        x = torch.randn(1, heads, tokens, shape.head_dim, device=device, dtype=torch.bfloat16)
        return x.requires_grad_()

    q = leaf(shape.num_attention_heads)
    k, v = leaf(shape.num_key_value_heads), leaf(shape.num_key_value_heads)
    q_padded, k_padded, v_padded = (padded_layout(x, lengths) for x in (q, k, v))
    mask = padded_mask(lengths, device)

    def varlen_pass() -> None:
        forward_backward(varlen_sdpa_attention(module, q, k, v, None, position_ids=positions)[0])

    def padded_pass() -> None:
        forward_backward(sdpa_attention_forward(module, q_padded, k_padded, v_padded, mask)[0])

    repeats = 10 if device.type == "cuda" else 2
    case: dict[str, Any] = {
        "sequences": len(lengths),
        "path": "dense mask" if tokens <= DENSE_MAX_TOKENS else "per sequence",
        "varlen_ms": time_ms(smoke, device, repeats, varlen_pass),
        "padded_ms": time_ms(smoke, device, repeats, padded_pass),
    }
    case["varlen_over_padded"] = round(case["varlen_ms"] / case["padded_ms"], 3)
    case["flash_or_efficient"] = restricted(device, varlen_pass)
    return case


def attention(smoke: Smoke, args: argparse.Namespace, device: torch.device) -> None:
    results = {}
    for seed, tokens in enumerate(PACKS):
        results[str(tokens)] = attention_case(smoke, device, args, tokens, seed)
        smoke.log(f"  pack {tokens}: {results[str(tokens)]}")
    smoke.figure("attention", results)
    smoke.figure("dense_mask_gqa_flash_or_efficient", results[str(PACKS[0])]["flash_or_efficient"])


def time_ms(smoke: Smoke, device: torch.device, repeats: int, fn: Callable[[], None]) -> float:
    """Median milliseconds of `fn()` after one warm-up; fewer repeats near the deadline."""
    timed(device, fn)
    seconds = []
    for _ in range(repeats):
        seconds.append(timed(device, fn)[1])
        if smoke.left_s() < 30:
            break
    return round(1e3 * statistics.median(seconds), 3)


def restricted(device: torch.device, fn: Callable[[], None]) -> str:
    """Whether `fn` (forward and backward) runs with only the flash and memory-efficient
    kernels allowed: "accepted", or "rejected: " and the error's first line."""
    try:
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]):
            timed(device, fn)
    except RuntimeError as error:
        return f"rejected: {str(error).strip().splitlines()[0]}"
    return "accepted"


# --- main ----------------------------------------------------------------------------------


def run(smoke: Smoke, args: argparse.Namespace, device: torch.device) -> None:
    mesh = smoke.section("init_process_group", 0, init_fake_world, args.world, device)
    if mesh is None:
        return
    smoke.figure("world", args.world)
    smoke.figure("shape", args.shape)
    ledger = DeviceLedger(device)
    actor = smoke.section("build", 60, build, smoke, args, mesh, device, ledger)
    if actor is not None:
        update = smoke.section("update", 120, updates, smoke, args, actor, ledger)
        sync = smoke.section("sync_gather", 60, gather_peaks, smoke, actor, device, ledger)
        measured = {**(update or {}), **(sync or {})}
        smoke.section(
            "plan_comparison", 5, compare_with_plan, smoke, args.plan, actor.vocab, measured
        )
        ledger.write(args.out / "fakepg_ledger.json")
    ledger.untrack("actor")
    del actor
    release(device)
    smoke.section("attention", 60, attention, smoke, args, device)


def main() -> int:
    args = parse_args()
    smoke = Smoke("smoke_fakepg", args.out, args.budget_s)
    device = script_device(args.device)
    smoke.figure("device", torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu")
    try:
        run(smoke, args, device)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return smoke.finish(args)


if __name__ == "__main__":
    raise SystemExit(main())
