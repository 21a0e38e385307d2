"""The planner on a mixture of experts: the Qwen3-30B-A3B preset's parameters, total and active,
counted by hand; per-token widths of the routed experts; the 8-GPU preset's plan (fits on 80 GB
with vLLM TP 2, not with TP 4; TP 4 on an H200), its expert notes and JSON; a tiny MoE model
directory gives its preset's shape."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hybrid.memory.model_shape import model_shape
from hybrid.planner.format import format_plan, to_json
from hybrid.planner.plan import Plan, plan_memory
from profiling.plan import compose_config

pytestmark = pytest.mark.unit

PRESET = "qwen3_30b_a3b_gsm8k_8gpu"
# Qwen3-30B-A3B: hidden, layers, q width (32 heads x 128), kv width (4 x 128), head dim,
# experts, top-k, expert width, vocabulary.
H, L, Q, KV, D, E, K, W, V = 2048, 48, 32 * 128, 4 * 128, 128, 128, 8, 768, 151936


def plan(*overrides: str, gib: float = 80.0, gpu: str = "h100") -> Plan:
    config = compose_config(PRESET, list(overrides))
    return plan_memory(config, model_shape("Qwen3-30B-A3B"), gib, gpu=gpu)


def test_the_preset_counts_total_and_active_parameters_by_hand() -> None:
    attention = H * Q + 2 * H * KV + Q * H + 2 * D  # q, k, v, o; q_norm, k_norm
    experts = E * (2 * W * H + H * W)  # gate_up [E, 2W, H], down [E, H, W]
    layer = attention + H * E + experts + 2 * H  # the router, the two norms
    total = 2 * V * H + L * layer + H  # untied embedding and LM head, final norm
    shape = model_shape("Qwen3-30B-A3B")
    assert shape.num_params == total
    assert shape.expert_params == L * experts
    assert shape.active_params == total - L * experts * (E - K) // E
    assert (shape.num_moe_layers, shape.num_experts, shape.experts_per_token) == (L, E, K)
    assert 30.4e9 < total < 30.6e9 and 3.2e9 < shape.active_params < 3.4e9  # "30.5B, 3.3B"
    # A token's MLP runs through top-k experts of width W side by side.
    assert shape.intermediate_size == K * W
    dense = model_shape("Qwen2.5-7B")
    assert dense.active_params == dense.num_params and dense.expert_params == 0


def test_the_8_gpu_preset_fits_on_80_gb_with_tp_2_and_says_how_experts_are_held() -> None:
    fits = plan()
    assert fits.fits and fits.peak_phase == "update/optimizer_step", fits.problems
    assert (fits.parameters, fits.active_parameters) == (
        model_shape("Qwen3-30B-A3B").num_params,
        model_shape("Qwen3-30B-A3B").active_params,
    )
    text = format_plan(fits)
    assert "(30.53B parameters, 3.35B active)" in text.splitlines()[0]
    assert "16 of 128 per rank" in text and "48 MoE layers x 128 experts, top-8" in text
    data = json.loads(to_json(fits))["plan"]
    assert data["active_parameters"] == fits.active_parameters
    # TP 4 adds two NCCL communicators to the reserve: no longer under 80 GB ...
    assert not plan("rollout.tensor_parallel_size=4").fits
    # ... but well under an H200's 141 GB.
    assert plan("rollout.tensor_parallel_size=4", gib=141.0, gpu="h200").margin_gib > 40


def test_a_tiny_moe_directory_gives_its_preset_s_shape(tmp_path: Path) -> None:
    from hybrid.models import TinyModelConfig, build_tiny_model

    directory = build_tiny_model(tmp_path / "moe", TinyModelConfig.preset("tiny-moe"))
    from_dir, preset = model_shape(str(directory)), model_shape("tiny-moe")
    assert from_dir.params == preset.params
    assert (from_dir.num_experts, from_dir.experts_per_token, from_dir.num_moe_layers) == (4, 2, 1)
    assert from_dir.active_params == from_dir.num_params - from_dir.expert_params // 2


def test_bucketed_experts_lower_the_sync_s_largest_gather_to_the_embedding() -> None:
    from hybrid.planner.sizes import gather_peak

    shape = model_shape("Qwen3-30B-A3B")
    layer = gather_peak(shape, "layer", 64 << 20)
    bucket = gather_peak(shape, "bucket", 64 << 20)
    assert layer >= E * 3 * W * H  # a layer's experts together
    assert bucket == V * H  # the largest tensor left: the embedding (or the LM head)
    assert "a bucket of experts" in format_plan(plan("sync.gather=bucket"))


def test_router_replay_s_record_is_counted_per_step() -> None:
    note = next(n for n in plan().notes if n.startswith("router replay (record)"))
    rows, seq = 256 * 5, 512 + 1024  # the preset's prompts x samples, prompt + response
    assert f"{rows * seq * L * K / 2**30:.2f} GiB a step" in note  # one byte per index
    assert not any(n.startswith("router replay") for n in plan("actor.router_replay=off").notes)


def test_expert_parallelism_leaves_the_other_experts_out_of_every_pass() -> None:
    """actor.ep_size=8: a pass makes whole only a layer's dense part and the rank's own 16 of
    128 experts; the static state (and so the optimizer-step peak) is FSDP's, unchanged."""
    shape = model_shape("Qwen3-30B-A3B")
    experts = E * (2 * W * H + H * W)
    assert shape.largest_pass_layer(1) == shape.largest_layer
    assert shape.largest_pass_layer(8) == shape.largest_layer - experts + experts // 8
    assert (
        model_shape("Qwen2.5-7B").largest_pass_layer(8) == model_shape("Qwen2.5-7B").largest_layer
    )
    fsdp, ep = plan(), plan("actor.ep_size=8")
    gib = 1 << 30
    other = (experts - experts // 8) / gib  # elements of the experts a rank does not own
    # Forward: two layers (the current and the prefetched) in bf16.
    for phase in ("old_log_prob/forward", "update/forward"):
        drop = fsdp.phases[phase].peak_gib - ep.phases[phase].peak_gib
        assert drop == pytest.approx(2 * 2 * other, abs=0.01), phase
    # Backward: a layer's gradients too (its largest moment may then be another one).
    backward = fsdp.phases["update/backward"].peak_gib - ep.phases["update/backward"].peak_gib
    assert backward > 2 * 2 * other + 0.5
    assert ep.peak_gib == fsdp.peak_gib and ep.peak_phase == "update/optimizer_step"
    assert "each rank owns 16 of 128 experts" in format_plan(ep)
    with pytest.raises(ValueError, match=r"actor\.ep_size \(3\) must divide trainer\.num_workers"):
        plan("actor.ep_size=3")


def test_adapters_on_the_experts_are_counted_by_hand() -> None:
    """Named gate/up/down targets put peft's adapters on every expert (the fused gate_up at
    twice the rank); all-linear leaves the experts alone."""
    r = 32
    gate_up = E * 2 * r * H + 2 * W * 2 * r * E  # A (E * 2r, H), B (2W, 2r * E)
    down = E * r * W + H * r * E  # A (E * r, W), B (H, r * E)
    attention = plan("model.lora.rank=32", "sync.lora_mode=merge")
    named = plan(
        "model.lora.rank=32",
        "sync.lora_mode=merge",
        "model.lora.target_modules=[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj]",
    )
    extra = L * (gate_up + down)
    assert extra == 1_962_934_272
    text = format_plan(named)
    assert f"{26_738_688 + extra:,} adapter parameters" in text
    assert "26,738,688 adapter parameters" in format_plan(attention)
    assert (
        named.phases["update/optimizer_step"].peak_gib
        > attention.phases["update/optimizer_step"].peak_gib
    )
