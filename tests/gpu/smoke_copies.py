"""GPU smoke test, Run 3: the host-link costs behind the preflight's "slow" predictions.

GPU preflight, section 3, Run 3. Every interval is timed between `torch.cuda.synchronize`
calls. It measures:
- engine sleep, level 1 against level 2 (finding #6), on a simulated 7.6 GB engine shard
  (7B, TP 2) split into `--num-tensors` tensors (vLLM backs up each allocation on its own):
  level 1 allocates a pinned host backup per tensor, copies device to host, frees the device
  memory; its wake allocates again and copies host to device. Level 2 only frees and re-allocates (the sync rewrites every weight).
  Two cycles each; the second shows the torch host allocator's pinned cache warm;
- actor offload (finding #12): hybrid.sharding.offload's moves (`module.to('cpu',
  non_blocking=True)`, which gives pinned host copies, and the AdamW state the same way) and
  back, for a 3.8 GB fp32 shard plus 7.6 GB of AdamW moments, against blocking pageable
  copies; the second of two cycles is reported;
- a plain device-to-device copy of 1.5 GB (the bf16 stream of the split-transport check) as
  the reference bandwidth.
`--scale` multiplies every size (CPU mode defaults to a small scale: a logic check only).

Not here: the split transport as written (finding #14: two processes joined by
`BroadcastGroup(device="cpu")`) is being rewritten, so it is left for a later run; nor the
optional liger-kernel check (no wheel is carried).

    timeout 480 python3 tests/gpu/smoke_copies.py --out out
    python tests/gpu/smoke_copies.py --out /tmp/smoke --device cpu     # logic check

Writes <out>/smoke_copies.json and <out>/smoke_copies.log; exits 1 naming the failed checks,
2 if the deadline cut work short.
"""

from __future__ import annotations

import argparse
from typing import Any

import torch
from _smoke_common import Smoke, base_parser, empty_cache, release, script_device, timed
from torch import nn

from hybrid.sharding.offload import (
    offload_optimizer,
    offload_params,
    onload_optimizer,
    onload_params,
)

GB = 1e9
ENGINE_SHARD_GB = 7.6  # Qwen2.5-7B bf16 weights over TP 2
ACTOR_SHARD_GB = 3.8  # Qwen2.5-7B fp32 master weights over 8 ranks (AdamW: twice that)
DEVICE_COPY_GB = 1.5
CYCLES = 2


def parse_args() -> argparse.Namespace:
    parser = base_parser(__doc__ or "", budget_s=420)
    parser.add_argument("--scale", type=float, help="size factor (default 1; cpu: 0.002)")
    parser.add_argument(
        "--num-tensors",
        type=int,
        default=339,
        help="tensors per shard (339: a Qwen2-7B actor shard's parameters)",
    )
    args = parser.parse_args()
    args.scale = args.scale or (0.002 if args.device == "cpu" else 1.0)
    return args


def split(total_bytes: float, count: int, itemsize: int) -> list[int]:
    """Element counts of `count` equal tensors holding about `total_bytes`."""
    return [max(1, int(total_bytes / count / itemsize))] * count


def rate(nbytes: int, seconds: float) -> float:
    """GB/s."""
    return round(nbytes / GB / seconds, 2) if seconds > 0 else float("inf")


# --- engine sleep --------------------------------------------------------------------------


def sleep_cycle(device: torch.device, sizes: list[int], level: int, pin: bool) -> dict[str, float]:
    """One sleep and wake of an engine shard of `sizes` bf16 tensors; seconds per step."""
    weights = [torch.ones(n, dtype=torch.bfloat16, device=device) for n in sizes]
    times: dict[str, float] = {}
    backups: list[torch.Tensor] = []
    if level == 1:
        backups, times["pinned_alloc_s"] = timed(
            device,
            lambda: [torch.empty(n, dtype=torch.bfloat16, pin_memory=pin) for n in sizes],
        )
        _, times["d2h_s"] = timed(
            device, lambda: [b.copy_(w) for b, w in zip(backups, weights, strict=True)]
        )
    weights.clear()
    _, times["free_s"] = timed(device, lambda: empty_cache(device))
    weights, times["alloc_s"] = timed(
        device, lambda: [torch.empty(n, dtype=torch.bfloat16, device=device) for n in sizes]
    )
    if level == 1:
        _, times["h2d_s"] = timed(
            device, lambda: [w.copy_(b) for w, b in zip(weights, backups, strict=True)]
        )
        backups.clear()  # vLLM drops the backup after the wake
    times["total_s"] = sum(times.values())
    return rounded(times)


def engine_sleep(smoke: Smoke, args: argparse.Namespace, device: torch.device) -> None:
    sizes = split(ENGINE_SHARD_GB * GB * args.scale, args.num_tensors, 2)
    nbytes = 2 * sum(sizes)
    smoke.figure("engine_shard_gb", round(nbytes / GB, 3))
    pin = device.type == "cuda"
    for level in (1, 2):
        for cycle in range(1, CYCLES + 1):
            times = sleep_cycle(device, sizes, level, pin)
            if level == 1:
                times["d2h_gb_s"] = rate(nbytes, times["d2h_s"])
                times["h2d_gb_s"] = rate(nbytes, times["h2d_s"])
            smoke.figure(f"sleep_level{level}_cycle{cycle}", times)
    release(device)


# --- actor offload -------------------------------------------------------------------------


def actor_shard(
    sizes: list[int], device: torch.device
) -> tuple[nn.ParameterList, torch.optim.AdamW]:
    """An actor's fp32 shard and its AdamW, with the moments one step leaves."""
    shard = nn.ParameterList(nn.Parameter(torch.ones(n, device=device)) for n in sizes)
    optimizer = torch.optim.AdamW(shard.parameters(), foreach=True)
    for p in shard.parameters():
        optimizer.state[p] = {
            "step": torch.tensor(1.0),
            "exp_avg": torch.zeros_like(p),
            "exp_avg_sq": torch.zeros_like(p),
        }
    return shard, optimizer


def ours(
    shard: nn.Module, optimizer: torch.optim.Optimizer, device: torch.device
) -> dict[str, Any]:
    """hybrid.sharding.offload: non-blocking moves (pinned host copies), one sync each."""
    _, off_s = timed(device, lambda: (offload_optimizer(optimizer), offload_params(shard)))
    pinned = device.type == "cuda" and next(shard.parameters()).is_pinned()
    _, on_s = timed(
        device, lambda: (onload_params(shard, device), onload_optimizer(optimizer, device))
    )
    return {"offload_s": off_s, "onload_s": on_s, "host_pinned": pinned}


def pageable(
    shard: nn.Module, optimizer: torch.optim.Optimizer, device: torch.device
) -> dict[str, Any]:
    """Blocking copies into ordinary (pageable) host memory and back."""

    def move(to: torch.device | str) -> None:
        shard.to(to)
        for state in optimizer.state.values():
            for key in ("exp_avg", "exp_avg_sq"):
                state[key] = state[key].to(to)

    _, off_s = timed(device, lambda: move("cpu"))
    pinned = device.type == "cuda" and next(shard.parameters()).is_pinned()
    _, on_s = timed(device, lambda: move(device))
    return {"offload_s": off_s, "onload_s": on_s, "host_pinned": pinned}


def actor_offload(smoke: Smoke, args: argparse.Namespace, device: torch.device) -> None:
    sizes = split(ACTOR_SHARD_GB * GB * args.scale, args.num_tensors, 4)
    shard, optimizer = actor_shard(sizes, device)
    nbytes = 4 * sum(sizes) * 3  # weights + two moments
    smoke.figure("actor_offload_gb", round(nbytes / GB, 3))
    for name, move in (("pinned", ours), ("pageable", pageable)):
        times = [move(shard, optimizer, device) for _ in range(CYCLES)][-1]
        times["offload_gb_s"] = rate(nbytes, times["offload_s"])
        times["onload_gb_s"] = rate(nbytes, times["onload_s"])
        smoke.figure(f"actor_offload_{name}_cycle{CYCLES}", rounded(times))
        on_device = all(p.device.type == device.type for p in shard.parameters())
        smoke.check(f"offload/{name}_back_on_device", on_device, f"parameters on {device.type}")
    del shard, optimizer
    release(device)


def rounded(figures: dict[str, Any]) -> dict[str, Any]:
    return {k: round(v, 4) if isinstance(v, float) else v for k, v in figures.items()}


# --- device copy ---------------------------------------------------------------------------


def device_copy(smoke: Smoke, args: argparse.Namespace, device: torch.device) -> None:
    numel = int(DEVICE_COPY_GB * GB * args.scale)
    src = torch.ones(numel, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    seconds = [timed(device, lambda: dst.copy_(src))[1] for _ in range(CYCLES + 1)][1:]
    best = min(seconds)
    smoke.figure("device_copy", rounded({"gb": numel / GB, "s": best, "gb_s": rate(numel, best)}))
    smoke.check("device_copy/equal", bool(torch.equal(src, dst)), "destination equals source")


def main() -> int:
    args = parse_args()
    smoke = Smoke("smoke_copies", args.out, args.budget_s)
    device = script_device(args.device)
    smoke.figure("device", torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu")
    smoke.figure("scale", args.scale)
    smoke.skip("split_transport", "the BroadcastGroup transport is being rewritten")
    smoke.section("engine_sleep", 30, engine_sleep, smoke, args, device)
    smoke.section("actor_offload", 60, actor_offload, smoke, args, device)
    smoke.section("device_copy", 10, device_copy, smoke, args, device)
    return smoke.finish(args)


if __name__ == "__main__":
    raise SystemExit(main())
