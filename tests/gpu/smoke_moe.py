"""GPU smoke test: a mixture of experts' training step on one GPU, with and without router replay.

A Qwen3-30B-A3B-shaped model cut to `--layers` decoder layers (hidden 2048, 128 experts of
width 768, top-8, 32 query / 4 KV heads; randomly initialised, bf16, transformers' grouped-GEMM
experts) runs on one packed row of `--tokens` tokens:
- the update's forward and backward, plain and under R2 replay (hybrid.workers.routing: the
  no-grad pass records each token's experts, the grad pass computes with them): seconds,
  tokens/s and MFU by active parameters (6 x active non-embedding parameters x tokens per
  forward+backward) against the GPU's bf16 peak, and the replay's overhead;
- checks: replaying the model's own routing changes the loss by at most 1e-3 relative (the
  gate weights are recomputed from the same logits) and gives the router a gradient; the
  record's shape is (tokens, layers, top-8); a moved router under replay keeps the recorded
  experts (0 routing changes) where the live one differs.

    timeout 300 python3 tests/gpu/smoke_moe.py --out out
    python tests/gpu/smoke_moe.py --out /tmp/smoke --device cpu     # logic check, tiny shape

Writes <out>/smoke_moe.json and <out>/smoke_moe.log; exits 1 naming the failed checks, 2 if
the deadline cut work short.
"""

from __future__ import annotations

import argparse

import torch
from _smoke_common import Smoke, base_parser, device_info, script_device, timed
from transformers import AutoModelForCausalLM, Qwen3MoeConfig

from hybrid.data import Batch
from hybrid.data.sample import ROUTED_EXPERTS
from hybrid.memory.model_shape import QWEN3_MOE_PRESETS, shape_from_config
from hybrid.models.routers import find_routers
from hybrid.workers.routing import MoeRouting

H200_BF16_PEAK = 989e12  # dense bf16 FLOP/s (datasheet), the figure smoke_fsdp.py uses


def parse_args() -> argparse.Namespace:
    parser = base_parser(__doc__ or "", budget_s=240)
    parser.add_argument("--layers", type=int, help="decoder layers (default 2; cpu: 1)")
    parser.add_argument("--tokens", type=int, help="tokens in the packed row (default 4096)")
    parser.add_argument("--repeats", type=int, default=3)
    return parser.parse_args()


def moe_config(device: torch.device, layers: int) -> Qwen3MoeConfig:
    sizes = dict(QWEN3_MOE_PRESETS["Qwen3-30B-A3B"], num_hidden_layers=layers)
    if device.type == "cpu":  # a logic check: the same structure, small
        sizes.update(hidden_size=128, intermediate_size=256, moe_intermediate_size=64,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=32, num_experts=8,
                     num_experts_per_tok=2, vocab_size=512)  # fmt: skip
    return Qwen3MoeConfig(**sizes)


def batch_of(ids: torch.Tensor) -> Batch:
    """The micro-batch a trace reads: one packed row, every position real."""
    return Batch.from_dict({"attention_mask": torch.ones_like(ids)})


def step(model: torch.nn.Module, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Forward and backward of a mean log-prob loss; the loss, detached."""
    logits = model(input_ids=ids, position_ids=positions, use_cache=False).logits
    loss = -torch.log_softmax(logits.float(), dim=-1)[0, :-1].gather(-1, ids[0, 1:, None]).mean()
    loss.backward()
    return loss.detach()


def main() -> int:
    args = parse_args()
    device = script_device(args.device)
    smoke = Smoke("smoke_moe", args.out, args.budget_s)
    layers = args.layers or (2 if device.type == "cuda" else 1)
    tokens = args.tokens or (4096 if device.type == "cuda" else 64)
    config = moe_config(device, layers)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    smoke.figure("device", device_info(device))
    try:
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(
                config, dtype=dtype, experts_implementation="grouped_mm"
            )
        smoke.check("grouped_mm", True, "transformers builds the experts on grouped GEMMs")
    except (TypeError, ValueError) as error:  # an older transformers: its default experts
        smoke.check("grouped_mm", False, f"{type(error).__name__}: {error}")
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    shape = shape_from_config("Qwen3-30B-A3B cut", config)
    embedding = 2 * config.vocab_size * config.hidden_size
    active = shape.active_params - embedding
    smoke.figure("layers", layers)
    smoke.figure("active_params_non_embedding", active)
    routing = MoeRouting(find_routers(model))
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, config.vocab_size, (1, tokens), generator=generator).to(device)
    positions = torch.arange(tokens, device=device)[None]
    micro = batch_of(ids.cpu())

    def record() -> torch.Tensor:
        with torch.no_grad(), routing.trace(micro, packed=True) as trace:
            model(input_ids=ids, position_ids=positions, use_cache=False)
        return trace.used_experts().cpu()

    recorded = record()
    smoke.check(
        "record_shape",
        tuple(recorded.shape) == (tokens, layers, config.num_experts_per_tok),
        f"record {tuple(recorded.shape)}",
    )
    replayed_micro = micro.union(Batch.from_dict({ROUTED_EXPERTS: recorded[None]}))

    def plain() -> torch.Tensor:
        model.zero_grad(set_to_none=True)
        return step(model, ids, positions)

    def replayed() -> torch.Tensor:
        model.zero_grad(set_to_none=True)
        with routing.trace(replayed_micro, packed=True, replay=True, compare=True):
            return step(model, ids, positions)

    def timings() -> None:
        plain()  # warm-up: kernels, allocator
        replayed()
        seconds: dict[str, list[float]] = {"plain": [], "replay": []}
        for _ in range(args.repeats):  # side by side, alternating
            seconds["plain"].append(timed(device, plain)[1])
            seconds["replay"].append(timed(device, replayed)[1])
        best = {name: min(values) for name, values in seconds.items()}
        smoke.figure("step_s", best)
        smoke.figure("tokens_per_s", {n: round(tokens / s) for n, s in best.items()})
        if device.type == "cuda":
            flops = 6 * active * tokens
            smoke.figure(
                "mfu_active", {n: round(flops / s / H200_BF16_PEAK, 3) for n, s in best.items()}
            )
        smoke.figure("replay_overhead", round(best["replay"] / best["plain"] - 1, 3))

    def replay_checks() -> None:
        loss_plain = plain()
        loss_replay = replayed()
        gap = abs(float(loss_replay) - float(loss_plain)) / abs(float(loss_plain))
        smoke.check("own_routing_replayed", gap < 1e-3, f"relative loss gap {gap:.2e}")
        router = find_routers(model)[0].module
        grad = router.weight.grad
        smoke.check(
            "router_gradient_under_replay",
            grad is not None and float(grad.abs().sum()) > 0,
            "the router's weight gets a gradient through the replayed gates",
        )
        with torch.no_grad():
            for r in find_routers(model):
                r.module.weight.add_(torch.randn_like(r.module.weight) * r.module.weight.std() * 4)
        stats = routing.stats()
        with routing.trace(replayed_micro, packed=True, replay=True, compare=True) as trace:
            model.zero_grad(set_to_none=True)
            step(model, ids, positions)
        stats.add(trace)
        figures = stats.metrics(torch.device("cpu"))
        smoke.figure(
            "moved_router",
            {k: round(v, 4) for k, v in figures.items() if "routing" in k or "drift" in k},
        )
        smoke.check(
            "replay_holds_the_record",
            figures["actor/moe_routing_diff_frac"] == 0.0
            and figures["actor/moe_router_drift_frac"] > 0.0,
            f"diff {figures['actor/moe_routing_diff_frac']}, drift {figures['actor/moe_router_drift_frac']:.3f}",
        )

    smoke.section("timings", 30, timings)
    smoke.section("replay_checks", 20, replay_checks)
    return smoke.finish(args)


if __name__ == "__main__":
    raise SystemExit(main())
