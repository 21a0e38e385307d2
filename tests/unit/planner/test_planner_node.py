"""The memory planner's node inputs: the CUDA reserve counts one worker's NCCL communicators
(more with tensor parallelism and HSDP, larger with NVLS, none on CPU), the host RAM of a
node follows the offload flags and the engine's sleep level (figures derived here from the
Qwen2.5-7B shape, torch's power-of-two pinned blocks included), a too-small
--host-memory-gib is a problem, a fit thinner than the reserve's uncertainty warns, and an
A100 gets vLLM's small batch defaults."""

from __future__ import annotations

import json

import pytest

from hybrid.memory.model_shape import model_shape
from hybrid.memory.records import GIB
from hybrid.planner.format import format_plan, to_json
from hybrid.planner.plan import Plan, plan_memory
from hybrid.planner.reserve import (
    CONTEXT_BYTES,
    FRAGMENTATION_BYTES,
    NVLS_COMMUNICATOR_BYTES,
    RESERVE_UNCERTAINTY,
    RING_COMMUNICATOR_BYTES,
)
from hybrid.planner.suggest import suggest
from profiling.plan import compose_config, main

pytestmark = pytest.mark.unit

LAUNCHER = "qwen2_5_7b_gsm8k_8gpu"
LORA_PRESET = "qwen2_5_7b_lora_gsm8k_8gpu"
P = 7_615_616_512  # Qwen2.5-7B
NVLS, RING = NVLS_COMMUNICATOR_BYTES / GIB, RING_COMMUNICATOR_BYTES / GIB
BASE = (CONTEXT_BYTES + FRAGMENTATION_BYTES) / GIB
TWO_NODES = ("trainer.num_workers=16", "trainer.nnodes=2")
NO_OFFLOAD = ("actor.offload.param_offload=false", "actor.offload.optimizer_offload=false")


def plan(
    *overrides: str,
    preset: str = LAUNCHER,
    gib: float = 80.0,
    gpu: str = "h100",
    nvls: bool | None = None,
    host_memory_gib: float | None = None,
) -> Plan:
    config = compose_config(preset, list(overrides))
    shape = model_shape("Qwen2.5-7B")
    return plan_memory(config, shape, gib, gpu=gpu, nvls=nvls, host_memory_gib=host_memory_gib)


def groups(p: Plan) -> dict[str, bool]:
    """Communicator name -> whether it has NVLS."""
    return {c.name: c.nvls for c in p.reserve.communicators}


def pow2(nbytes: int) -> int:
    return 1 << (nbytes - 1).bit_length()


def shards(world: int) -> list[int]:
    """Elements of rank 0's shard of every Qwen2.5-7B parameter (ceil(rows / world) rows)."""
    sizes = []
    for _, dims in model_shape("Qwen2.5-7B").params:
        rows, cols = dims[0], (dims[1] if len(dims) == 2 else 1)
        sizes.append(-(-rows // world) * cols)
    return sizes


def test_the_reserve_grows_with_the_communicators_of_tp_and_hsdp() -> None:
    tp1, tp2, tp4 = (plan(f"rollout.tensor_parallel_size={tp}") for tp in (1, 2, 4))
    # 8 workers on an 8-GPU node: the default and vLLM's world groups have NVLS
    assert groups(tp1) == {"default": True, "vllm world": True}
    assert tp1.reserve_gib == pytest.approx(BASE + 2 * NVLS)
    # TP 2: the rollout mesh's tp group and vLLM's (torch + PyNccl), 2 GPUs each: no NVLS
    tp_groups = {"rollout tp": False, "vllm tp": False, "vllm tp pynccl": False}
    assert groups(tp2) == {**groups(tp1), **tp_groups}
    assert tp2.reserve_gib - tp1.reserve_gib == pytest.approx(3 * RING)
    # TP 4: the same three groups, 4 GPUs each: NVLS
    assert tp4.reserve_gib - tp1.reserve_gib == pytest.approx(3 * NVLS)
    assert tp2.budget_gib == pytest.approx(80.0 - tp2.reserve_gib)
    # HSDP over 2 nodes: + the shard group (8 on the node: NVLS) and the replicate group (one
    # rank per node: no NVLS)
    flat, hsdp = plan(*TWO_NODES), plan(*TWO_NODES, "actor.hsdp_replicas=2")
    added = {c.name: c for c in hsdp.reserve.communicators}
    assert added["hsdp shard"].nvls and added["hsdp shard"].local_ranks == 8
    assert not added["hsdp replicate"].nvls and added["hsdp replicate"].local_ranks == 1
    assert hsdp.reserve_gib - flat.reserve_gib == pytest.approx(NVLS + RING)


def test_nvls_makes_communicators_larger_and_is_assumed_only_on_full_h100_nodes() -> None:
    on, off = plan(nvls=True), plan(nvls=False)
    assert plan().reserve.nvls and plan().reserve_gib == on.reserve_gib  # 8 per node: assumed
    assert not off.reserve.nvls and not any(groups(off).values())
    assert on.reserve_gib - off.reserve_gib == pytest.approx(2 * (NVLS - RING))
    assert off.reserve_gib == pytest.approx(BASE + 5 * RING)
    assert not plan(gpu="a100").reserve.nvls  # no NVLink SHARP on an A100's NVSwitch
    four = plan("trainer.num_workers=4", "data.train_batch_size=256")
    assert not four.reserve.nvls  # fewer than 8 workers per node: no NVSwitch assumed
    cpu = plan_memory(compose_config("config", []), model_shape("tiny"), 8.0)
    assert cpu.reserve_gib == 0 and cpu.reserve.communicators == () and cpu.budget_gib == 8.0
    # the uncertainty: what NVLS adds, + a quarter of the reserve without it
    extra = 2 * (NVLS - RING)
    expected = extra + RESERVE_UNCERTAINTY * (on.reserve_gib - extra)
    assert on.reserve.uncertainty_gib == pytest.approx(expected)
    assert off.reserve.uncertainty_gib == pytest.approx(RESERVE_UNCERTAINTY * off.reserve_gib)


def test_the_reserve_is_printed_with_its_parts_and_is_in_the_json(
    capsys: pytest.CaptureFixture[str],
) -> None:
    text = format_plan(plan())
    assert "Reserve: 5.50 GiB per worker = CUDA context 0.50 + 5 NCCL communicators" in text
    assert "vllm tp pynccl" in text and "uncertainty" in text
    argv = ["--config-name", LAUNCHER, "--model", "Qwen2.5-7B", "--json", "--no-nvls"]
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)["plan"]
    assert data["reserve"]["nvls"] is False and data["reserve_gib"] == data["reserve"]["total_gib"]
    names = [c["name"] for c in data["reserve"]["communicators"]]
    assert names == ["default", "rollout tp", "vllm world", "vllm tp", "vllm tp pynccl"]
    assert data["warnings"] == [] and data["host_steady_gib"] > 0


def test_host_ram_of_the_7b_preset_with_every_offload_from_the_shape() -> None:
    p, workers = plan(), 8
    actor = [n * 4 for n in shards(8)]  # fp32 master shard, one pinned block per tensor
    ref = [n * 2 for n in shards(8)]  # bf16 reference
    parts = {
        "actor_params": workers * sum(actor),
        "optimizer_state": workers * 2 * sum(actor),  # exp_avg + exp_avg_sq
        "ref_params": workers * sum(ref),
    }
    pinned = workers * (3 * sum(map(pow2, actor)) + sum(map(pow2, ref)))
    parts["pinned_rounding"] = pinned - sum(parts.values())
    assert p.host_gib == pytest.approx({k: v / GIB for k, v in parts.items()})
    assert p.host_gib["actor_params"] == pytest.approx(P // 8 * 4 * 8 / GIB)
    assert pow2(19008 * 3584 * 4) == 512 << 20  # the embedding's 260 MiB shard
    assert p.host_steady_gib == pytest.approx(pinned / GIB)
    # rank 0: the fp32 state dict at startup; fp32 + its bf16 copy at the final export
    assert p.host_startup_gib == pytest.approx(P * 4 / GIB)
    assert p.host_export_gib == pytest.approx(P * 6 / GIB)
    assert p.host_peak_gib == pytest.approx(p.host_steady_gib + p.host_export_gib)
    assert plan("trainer.export_hf=false").host_peak_gib == pytest.approx(
        p.host_steady_gib + p.host_startup_gib
    )
    kept = plan(*NO_OFFLOAD, "ref.offload.param_offload=false")
    assert kept.host_gib == {} and kept.host_steady_gib == 0
    assert "Host RAM per node (GiB): " in format_plan(p) and "pinned_rounding" in format_plan(p)


def test_only_lora_adapter_mode_keeps_the_engine_weights_on_the_host() -> None:
    adapter = plan(preset=LORA_PRESET)  # sleep level 1: a pinned copy of the engine's weights
    weights = adapter.phases["rollout/wake_kv"].components_gib["rollout_weights"]
    assert adapter.host_gib["rollout_weights"] == pytest.approx(8 * weights)
    assert "actor_params" not in adapter.host_gib  # the LoRA preset keeps the actor on device
    merge = plan("sync.lora_mode=merge", preset=LORA_PRESET)  # level 2: discarded
    assert "rollout_weights" not in merge.host_gib
    assert "rollout_weights" not in plan().host_gib  # full fine-tuning: level 2
    assert adapter.host_export_gib == pytest.approx(P * 2 / GIB)  # merged, bf16


def test_too_little_host_memory_is_a_problem(capsys: pytest.CaptureFixture[str]) -> None:
    roomy, tight = plan(host_memory_gib=512.0), plan(host_memory_gib=128.0)
    assert roomy.fits and roomy.host_fits is True and roomy.host_memory_gib == 512.0
    assert not tight.fits and tight.host_fits is False
    assert [q for q in tight.problems if q.startswith("host RAM")] == list(tight.problems)
    assert plan().host_fits is None and plan().host_memory_gib is None  # not checked
    # every offload raises host RAM: nothing to suggest for it
    config, shape = compose_config(LAUNCHER, []), model_shape("Qwen2.5-7B")
    assert suggest(config, shape, 80.0, host_memory_gib=128.0) == []
    argv = ["--config-name", LAUNCHER, "--model", "Qwen2.5-7B", "--host-memory-gib", "128"]
    assert main([*argv, "--suggest"]) == 0
    out = capsys.readouterr().out
    assert "DOES NOT FIT" in out and "host RAM: rank 0's node peaks at" in out
    assert "Suggestions: none here for host RAM" in out
    assert main([*argv[:-1], "0"]) == 1
    assert "--host-memory-gib" in capsys.readouterr().err
    with pytest.raises(ValueError, match="host_memory_gib"):
        plan(host_memory_gib=-1.0)


def test_a_fit_thinner_than_the_reserve_uncertainty_warns(
    capsys: pytest.CaptureFixture[str],
) -> None:
    thin, roomy = plan(gib=32.0), plan(gib=80.0)  # the update's 24.3 GiB on 32 GiB GPUs
    assert thin.fits and 0 <= thin.margin_gib < thin.reserve.uncertainty_gib
    assert len(thin.warnings) == 1 and thin.warnings[0].startswith("thin margin")
    assert roomy.fits and roomy.warnings == ()
    assert not plan(gib=24.0).warnings  # does not fit: problems, not a warning
    assert "warning: thin margin" in format_plan(thin)
    assert json.loads(to_json(thin))["plan"]["warnings"] == list(thin.warnings)
    argv = ["--config-name", LAUNCHER, "--model", "Qwen2.5-7B", "--gpu-memory-gib", "32"]
    assert main(argv) == 0
    assert "warning: thin margin" in capsys.readouterr().out


def test_an_a100_gets_vllms_small_batch_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    h100, a100 = plan(), plan(gpu="a100")
    assert h100.kv_tokens_needed == 320 * 1536  # 256 x 2 / 8 prompts x 5 per engine
    assert a100.kv_tokens_needed == 256 * 1536  # max_num_seqs 256
    # inputs_embeds of 8,192 tokens instead of 16,384 (h x 2 bytes each)
    ready = "trainer/ready"
    overhead = {p.gpu: p.phases[ready].components_gib["engine_overhead"] for p in (h100, a100)}
    assert overhead["h100"] - overhead["a100"] == pytest.approx(8192 * 3584 * 2 / GIB)
    assert main(["--config-name", LAUNCHER, "--model", "Qwen2.5-7B", "--gpu", "a100"]) == 0
    assert "on cuda (a100)" in capsys.readouterr().out
    with pytest.raises(ValueError, match="gpu must be one of"):
        plan(gpu="v100")
