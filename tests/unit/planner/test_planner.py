"""Unit tests for `hybrid.planner.plan` and its CLI `profiling.plan`: configs are composed
from configs/ with Hydra overrides (like the CLI and the trainer), expectations are computed
by hand from the Qwen2.5 sizes where they can be (parameter count, shard and optimizer bytes,
gather sizes, KV tokens), and the trends that matter are checked: peaks grow with the
micro-batch and the response length, offload and a finer gather lower what they should and
nothing else, LoRA lowers the trainer side, the 8-GPU launcher config fits at 80 GiB and not
at 24 GiB, and every suggestion, applied as Hydra overrides, fits. LoRA: the rank comes from
model.lora (or the override argument / --lora-rank, the same plan), no reference copy, AdamW
state and gradients of the adapter shard only, a sync of adapters only in adapter mode."""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path

import pytest

from hybrid.memory.model_shape import model_shape
from hybrid.memory.records import COMPONENTS, GIB, step_phases
from hybrid.planner.plan import Plan, plan_memory
from hybrid.planner.suggest import suggest
from hybrid.trainer.config import TrainerRunConfig
from profiling.plan import as_hydra_override, compose, compose_config, main

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[3]
LAUNCHER = "qwen2_5_7b_gsm8k_8gpu"
LORA_PRESET = "qwen2_5_7b_lora_gsm8k_8gpu"
LORA_OFF = ("model.lora.rank=0", "model.lora.alpha=16")  # the preset with LoRA off
# Qwen2.5-7B: hidden, MLP width, layers, KV width (4 heads x 128), vocabulary.
H, MLP, L, KV, V = 3584, 18944, 28, 4 * 128, 152064
QWEN_7B_PARAMS = 7_615_616_512
GRPO_PHASES = step_phases(critic=False)
TRAINER_PHASES = [p for p in GRPO_PHASES if p.split("/")[0] in ("ref", "old_log_prob", "update")]


def launcher(*overrides: str) -> TrainerRunConfig:
    return compose_config(LAUNCHER, list(overrides))


def plan(*overrides: str, gib: float = 80.0, lora_rank: int = 0) -> Plan:
    return plan_memory(launcher(*overrides), model_shape("Qwen2.5-7B"), gib, lora_rank)


def lora_plan(*overrides: str, gib: float = 80.0) -> Plan:
    config = compose_config(LORA_PRESET, list(overrides))
    return plan_memory(config, model_shape("Qwen2.5-7B"), gib)


def adapter_elements(rank: int) -> int:
    """r x (in + out) on q, k, v, o, gate, up, down of every layer."""
    return L * rank * ((H + H) + 2 * (H + KV) + (H + H) + 3 * (H + MLP))


def adapter_shard(rank: int, world: int = 8) -> int:
    """Rank 0's FSDP2 shard: ceil(rows / world) rows of A (rank, in) and of B (out, rank)."""
    projections = [(H, H), (H, KV), (H, KV), (H, H), (H, MLP), (H, MLP), (MLP, H)]  # (in, out)
    rows = sum(-(-rank // world) * i + -(-o // world) * rank for i, o in projections)
    return L * rows


def peak(p: Plan, phase: str) -> float:
    return p.phases[phase].peak_gib


def trainer_peak(p: Plan) -> float:
    return max(peak(p, phase) for phase in TRAINER_PHASES)


def test_qwen25_7b_preset_has_the_published_parameter_count() -> None:
    layer = 2 * H * H + 2 * H * KV + H + 2 * KV + 3 * H * MLP + 2 * H  # attn (+bias), MLP, norms
    assert 2 * V * H + L * layer + H == QWEN_7B_PARAMS  # untied embedding and LM head
    shape = model_shape("Qwen2.5-7B")
    assert shape.num_params == QWEN_7B_PARAMS
    assert shape.largest_layer == layer
    assert shape.largest_tensor[1] == V * H
    assert not shape.tied_embeddings
    assert model_shape("Qwen2.5-0.5B").num_params == 494_032_768  # tied


def test_a_model_directory_gives_the_same_shape_as_its_preset(tmp_path: Path) -> None:
    from hybrid.models import TinyModelConfig, build_tiny_model

    directory = build_tiny_model(tmp_path / "tiny", TinyModelConfig.preset("tiny"))
    from_dir, preset = model_shape(str(directory)), model_shape("tiny")
    assert from_dir.params == preset.params and from_dir.tied_embeddings
    assert from_dir.kv_bytes_per_token(1) == 2 * 2 * 1 * 64 * 2  # K+V, 2 layers, 1 head of 64


def test_unknown_preset_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"Qwen2\.5-7B.*Qwen2\.5-32B"):
        model_shape("Qwen2.5-8B")


def test_every_phase_is_predicted_with_known_components() -> None:
    p = plan()
    assert tuple(p.phases) == GRPO_PHASES
    for name, phase in p.phases.items():
        assert set(phase.components_gib) <= set(COMPONENTS), name
        total = sum(phase.components_gib.values()) + sum(phase.transient_gib.values())
        assert phase.peak_gib == pytest.approx(total), name
    assert p.peak_gib == max(phase.peak_gib for phase in p.phases.values())
    assert "runtime" not in p.phases["trainer/ready"].components_gib  # predicted as 0


def test_peaks_grow_with_the_micro_batch_and_the_response_length() -> None:
    by_micro = [plan(f"actor.micro_batch_size={m}") for m in (1, 2, 4, 8)]
    for phase in ("update/forward", "update/backward", "old_log_prob/forward"):
        peaks = [peak(p, phase) for p in by_micro]
        assert peaks == sorted(peaks) and len(set(peaks)) == len(peaks), phase
    by_ref_micro = [peak(plan(f"ref.micro_batch_size={m}"), "ref/forward") for m in (1, 4, 16)]
    assert by_ref_micro[0] < by_ref_micro[1] < by_ref_micro[2]
    by_length = [plan(f"rollout.response_length={r}") for r in (256, 512, 1024)]
    for phase in ("update/forward", "update/backward", "ref/forward", "old_log_prob/forward"):
        peaks = [peak(p, phase) for p in by_length]
        assert peaks[0] < peaks[1] < peaks[2], phase
    small, large = plan("data.train_batch_size=256"), plan("data.train_batch_size=512")
    assert large.kv_tokens_needed == 2 * small.kv_tokens_needed


def test_optimizer_offload_frees_exactly_the_adam_state_outside_the_update() -> None:
    kept = plan("actor.offload.optimizer_offload=false")
    offloaded = plan("actor.offload.optimizer_offload=true")
    adam_gib = 2 * (QWEN_7B_PARAMS // 8) * 4 / GIB  # exp_avg + exp_avg_sq, fp32, 1/8 shard
    for phase in ("trainer/ready", "rollout/generate", "old_log_prob/forward", "ref/forward"):
        assert peak(kept, phase) - peak(offloaded, phase) == pytest.approx(adam_gib), phase
    # The update onloads the state for its whole duration (trainer_phase(with_optimizer=True)).
    for phase in ("update/forward", "update/backward", "update/optimizer_step"):
        assert peak(kept, phase) == pytest.approx(peak(offloaded, phase)), phase


def test_param_offload_only_acts_on_gpu() -> None:
    tiny = model_shape("tiny")
    base = plan_memory(compose_config("config", []), tiny, 8.0)
    offload = [
        "actor.offload.param_offload=true",
        "actor.offload.optimizer_offload=true",
        "ref.offload.param_offload=true",
    ]
    moved = compose_config("config", offload)
    assert plan_memory(moved, tiny, 8.0).phases == base.phases
    ready = base.phases["trainer/ready"].components_gib  # the CPU engine never sleeps
    assert {"actor_params", "optimizer_state", "rollout_weights", "kv_cache"} <= set(ready)
    assert base.budget_gib == 8.0  # no CUDA reserve on CPU


def test_layer_gather_lowers_the_sync_peak_by_all_but_the_largest_group() -> None:
    full, layer = plan("sync.gather=full"), plan("sync.gather=layer")
    saved_gib = (QWEN_7B_PARAMS - V * H) * 2 / GIB  # bf16; the embedding is the largest group
    drop = peak(full, "sync/gather_load") - peak(layer, "sync/gather_load")
    assert drop == pytest.approx(saved_gib)
    tensor = plan("sync.gather=tensor")
    assert peak(tensor, "sync/gather_load") == pytest.approx(peak(layer, "sync/gather_load"))
    bucket = plan("sync.gather=bucket", "sync.bucket_mb=64")
    assert peak(bucket, "sync/gather_load") <= peak(layer, "sync/gather_load")


def test_kv_capacity_with_explicit_bytes_matches_a_hand_computation() -> None:
    p = plan(f"rollout.kv_cache_memory_bytes={4 << 30}")
    per_token = 2 * L * (4 // 2) * 128 * 2  # K and V, 2 of 4 KV heads per TP rank, bf16
    assert p.kv_bytes_per_token == per_token
    assert p.kv_cache_gib == pytest.approx(4.0)
    assert p.kv_tokens == (4 << 30) // per_token // 16 * 16
    assert p.kv_tokens_needed == (256 * 2 // 8) * 5 * (512 + 1024)  # prompts x n x S per engine
    short = plan(f"rollout.kv_cache_memory_bytes={1 << 20}")
    assert not short.fits
    assert any("rollout.max_model_len" in problem for problem in short.problems)


def test_launcher_config_fits_at_80_gib_but_not_at_24() -> None:
    roomy, tight = plan(gib=80.0), plan(gib=24.0)
    assert roomy.fits and roomy.problems == ()
    assert roomy.kv_tokens >= roomy.kv_tokens_needed
    assert not tight.fits and tight.margin_gib < 0


# Over budget, and fixable: the launcher without gradient checkpointing on 40 GiB GPUs. (The
# launcher itself on 24 GiB no longer has a fix: the update alone needs 24.3 GiB since vLLM's
# CUDA graphs (1 GiB) are planned, beside a 5.5 GiB reserve.)
OVER_BUDGET, OVER_BUDGET_GIB = ("model.gradient_checkpointing=false",), 40.0


def test_suggestions_for_an_over_budget_config_fit_when_applied_as_overrides() -> None:
    shape = model_shape("Qwen2.5-7B")
    assert not plan(*OVER_BUDGET, gib=OVER_BUDGET_GIB).fits
    suggestions = suggest(launcher(*OVER_BUDGET), shape, OVER_BUDGET_GIB)
    assert len(suggestions) >= 2
    counts = [len(s.overrides) for s in suggestions]
    assert counts == sorted(counts)
    for s in suggestions:
        assert s.plan.fits
        # through Hydra again
        replanned = plan_memory(launcher(*OVER_BUDGET, *s.overrides), shape, OVER_BUDGET_GIB)
        assert replanned.fits and replanned.peak_gib == pytest.approx(s.plan.peak_gib)
    assert suggest(launcher(), shape, 80.0) == []  # already fits


def test_suggest_picks_the_largest_gpu_memory_utilization_that_fits() -> None:
    p = plan("rollout.gpu_memory_utilization=0.95")
    assert any("vLLM needs" in problem for problem in p.problems)  # actor shards + 76 GiB
    best = suggest(launcher("rollout.gpu_memory_utilization=0.95"), model_shape("Qwen2.5-7B"), 80)
    # vLLM needs U = u x 80 GiB free beside the actor's fp32 shard, within the budget
    free = p.budget_gib - QWEN_7B_PARAMS // 8 * 4 / GIB
    largest = max(k / 20 for k in range(1, 20) if k / 20 * 80 <= free)
    assert best[0].overrides == (f"rollout.gpu_memory_utilization={largest:g}",)
    assert largest == 0.85  # 0.9 before the reserve counted NCCL communicators (1.5 GiB flat)


def test_lora_lowers_the_trainer_peak_and_keeps_adam_state_for_adapters_only() -> None:
    rank = 16
    full, lora = plan(), plan(lora_rank=rank)
    for phase in ("update/forward", "update/backward", "update/optimizer_step"):
        assert peak(lora, phase) < peak(full, phase), phase
    # With a smaller reference micro-batch the update sets the trainer-side peak.
    small_ref = ("ref.micro_batch_size=4",)
    assert trainer_peak(plan(*small_ref, lora_rank=rank)) < trainer_peak(plan(*small_ref))
    state = lora.phases["update/onload"].components_gib["optimizer_state"]
    assert state == pytest.approx(2 * adapter_elements(rank) / 8 * 4 / GIB)  # fp32, 1/8 shard


def test_lora_preset_has_a_lower_trainer_peak_than_the_same_config_without_lora() -> None:
    lora, full = lora_plan(), lora_plan(*LORA_OFF)
    assert lora.lora_rank == 32 and full.lora_rank == 0
    # actor and optimizer stay on the device: full fine-tuning would keep 3.55 + 7.09 GiB there
    assert trainer_peak(lora) < trainer_peak(full) - 8
    for phase in TRAINER_PHASES:
        assert peak(lora, phase) < peak(full, phase), phase
    assert lora.fits and full.fits


def test_lora_has_no_reference_and_adapter_only_gradients_and_adam_state() -> None:
    p, rank = lora_plan(), 32
    shard_gib = adapter_shard(rank) * 4 / GIB  # fp32 master dtype
    assert adapter_shard(rank) == adapter_elements(rank) // 8  # every dim divides by 8 here
    # ref.offload.param_offload=false would keep a reference resident in every phase, if there
    # were one
    for name, phase in lora_plan("ref.offload.param_offload=false").phases.items():
        assert "ref_params" not in phase.components_gib, name
    # the reference forward runs on the actor (frozen bf16 base + adapters)
    actor = p.phases["ref/forward"].components_gib["actor_params"]
    assert actor == pytest.approx((QWEN_7B_PARAMS // 8 * 2 + adapter_shard(rank) * 4) / GIB)
    backward = p.phases["update/backward"].components_gib
    assert backward["optimizer_state"] == pytest.approx(2 * shard_gib)
    assert backward["actor_grads"] == pytest.approx(shard_gib)
    assert backward["optimizer_state"] < 0.1  # vs 7.09 GiB with full fine-tuning


def test_a_target_modules_list_counts_only_those_projections() -> None:
    p = lora_plan("model.lora.target_modules=[q_proj,v_proj]")
    attention = L * 32 * ((H + H) + (H + KV))  # q: 3584 -> 3584, v: 3584 -> 512
    state = p.phases["update/onload"].components_gib["optimizer_state"]
    assert state == pytest.approx(2 * attention / 8 * 4 / GIB)
    assert any("on q_proj, v_proj:" in note for note in p.notes)


def test_adapter_sync_gathers_far_less_than_a_full_weight_layer_gather() -> None:
    rank = 32
    adapter = lora_plan().phases["sync/gather_load"].transient_gib
    # layered: one layer's adapters in bf16 (each layer goes to the host) + one cast shard
    largest_shard = 4 * MLP  # A of down_proj: 32 / 8 rows x 18,944 (= B of gate/up: 2,368 x 32)
    layer = adapter_elements(rank) // L
    assert adapter == {"gather_buffers": pytest.approx((layer + largest_shard) * 2 / GIB)}
    whole = lora_plan("sync.layered_summon=false").phases["sync/gather_load"].transient_gib
    assert whole == {
        "gather_buffers": pytest.approx((adapter_elements(rank) + largest_shard) * 2 / GIB)
    }
    full_layer = plan("sync.gather=layer").phases["sync/gather_load"].transient_gib
    assert whole["gather_buffers"] < full_layer["gather_buffers"] / 5  # 0.15 vs 1.14 GiB
    decoder_layer_gib = (QWEN_7B_PARAMS - 2 * V * H - H) / L * 2 / GIB  # one layer in bf16
    assert adapter["gather_buffers"] < decoder_layer_gib / 2
    # merge sends full weights: at least a decoder layer (layered), the whole model (not)
    layered = lora_plan("sync.lora_mode=merge").phases["sync/gather_load"]
    assert sum(layered.transient_gib.values()) > decoder_layer_gib + 0.5  # + merged copies
    everything = lora_plan("sync.lora_mode=merge", "sync.layered_summon=false")
    gathered = everything.phases["sync/gather_load"].transient_gib["gather_buffers"]
    assert gathered > QWEN_7B_PARAMS * 2 / GIB
    # only adapter mode's engine holds adapter slots (rank 32 on every projection, bf16)
    weights = {
        mode: lora_plan(f"sync.lora_mode={mode}").phases["rollout/wake_kv"].components_gib
        for mode in ("adapter", "merge")
    }
    slots = weights["adapter"]["rollout_weights"] - weights["merge"]["rollout_weights"]
    assert slots == pytest.approx(adapter_elements(rank) * 2 / GIB)


def test_adapter_mode_checks_the_first_sync_of_the_base() -> None:
    layer = lora_plan(gib=20.0)  # fits, the first sync (layer groups of the base) included
    assert any("the first sync also sends the base" in note for note in layer.notes)
    assert not any(problem.startswith("first sync") for problem in layer.problems)
    assert layer.fits
    whole = lora_plan("sync.gather=full", gib=20.0)  # the base in one group: 14.2 GiB
    assert any(problem.startswith("first sync") for problem in whole.problems)
    assert peak(whole, "sync/gather_load") == pytest.approx(peak(layer, "sync/gather_load"))


def test_lora_rank_from_the_config_equals_the_argument() -> None:
    shape = model_shape("Qwen2.5-7B")
    by_config = plan("++model.lora.rank=32")
    by_argument = plan(lora_rank=32)
    assert by_config.phases == by_argument.phases
    assert by_config.lora_rank == by_argument.lora_rank == 32
    assert by_config.phases != plan().phases
    overridden = plan_memory(launcher("++model.lora.rank=8"), shape, 80.0, lora_rank=32)
    assert overridden.phases == by_config.phases and overridden.lora_rank == 32
    with pytest.raises(ValueError, match="lora_rank"):
        plan_memory(launcher(), shape, 80.0, lora_rank=-1)


def test_cli_lora_rank_is_the_model_lora_rank_override(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--config-name", LAUNCHER, "--model", "Qwen2.5-7B", "--json"]
    assert main([*argv, "--lora-rank", "32"]) == 0
    shortcut = json.loads(capsys.readouterr().out)["plan"]
    assert main([*argv, "++model.lora.rank=32"]) == 0
    override = json.loads(capsys.readouterr().out)["plan"]
    assert shortcut == override and shortcut["lora_rank"] == 32
    assert main(["--config-name", LORA_PRESET, "--model", "Qwen2.5-7B", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["plan"]["lora_rank"] == 32  # from the YAML


def test_suggestions_for_a_lora_config_fit_and_leave_the_reference_alone() -> None:
    shape = model_shape("Qwen2.5-7B")
    # full logits: the reference forward (16 x 1,536 tokens) takes 30.8 GiB
    config = compose_config(LORA_PRESET, ["model.log_prob_chunk_tokens=0"])
    suggestions = suggest(config, shape, 24.0)
    assert suggestions
    for s in suggestions:
        assert s.plan.fits and s.plan.lora_rank == 32
        assert not any(o.startswith("ref.offload.param_offload") for o in s.overrides)


def test_cli_prints_fits_for_the_launcher_config(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`python -m profiling.plan ...` as run from a shell: the module's entry block, in this
    process (a child would spend seconds importing what this one has)."""
    argv = ["--config-name", LAUNCHER, "--model", "Qwen2.5-7B", "--gpu-memory-gib", "80"]
    monkeypatch.setattr(sys, "argv", ["profiling/plan.py", *argv])
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_path(str(REPO / "profiling" / "plan.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert exit_info.value.code == 0, out
    assert "FITS: peak" in out and "DOES NOT FIT" not in out
    assert "rollout/generate" in out and "KV cache:" in out


def test_cli_json_and_suggestions_over_budget(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--config-name", LAUNCHER, "--model", "Qwen2.5-7B", "--gpu-memory-gib", "40"]
    argv += OVER_BUDGET
    assert main([*argv, "--suggest", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["plan"]["fits"] is False
    assert list(data["plan"]["phases"]) == list(GRPO_PHASES)
    assert data["suggestions"] and all(s["margin_gib"] >= 0 for s in data["suggestions"])
    assert main([*argv, "--suggest"]) == 0
    assert "DOES NOT FIT" in capsys.readouterr().out


def test_overrides_of_keys_the_yaml_lacks_get_a_plus() -> None:
    # The composed config holds every schema field (configs/ starts from the registered schema,
    # tests/unit/trainer/test_config_reachable.py): only a key it lacks (a typo, which the
    # strict converter then names) needs Hydra's `+`.
    cfg = compose("config", [])
    assert as_hydra_override(cfg, "actor.no_such_flag=true") == "+actor.no_such_flag=true"
    offload = "actor.offload.optimizer_offload=true"
    assert as_hydra_override(cfg, offload) == offload
    assert as_hydra_override(cfg, "actor.micro_batch_size=2") == "actor.micro_batch_size=2"
    assert as_hydra_override(cfg, "sync.gather=layer") == "sync.gather=layer"
    compose("config", ["+actor.no_such_flag=true", offload])  # composes


def test_cli_bad_input_names_the_option(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--config-name", LAUNCHER, "--model", "Qwen9-1B"]) == 1
    error = capsys.readouterr().err
    assert "--model" in error and "Qwen2.5-7B" in error  # lists the presets
    # The launcher leaves model.path unset (it drops the demo's inputs): the planner asks for
    # --model, whether the path is unset by the preset or by an override.
    assert main(["--config-name", LAUNCHER]) == 1
    assert "--model" in capsys.readouterr().err
    assert main(["--model", "tiny", "model.path=???"]) == 0
    capsys.readouterr()
    assert main(["model.path=???"]) == 1
    assert "--model" in capsys.readouterr().err
    assert main(["--model", str(REPO / "no-such-model-dir")]) == 1
    assert "--model" in capsys.readouterr().err
    assert main(["--model", "tiny", "actor.no_such_field=1"]) == 1
    assert "actor.no_such_field" in capsys.readouterr().err


def test_hsdp_shards_over_one_replica_and_splits_rows_over_all_ranks() -> None:
    """16 GPUs as 2 HSDP replicas of 8: every shard is as large as on one 8-GPU node, while
    each rank takes half the rows."""
    resident = ("actor.offload.optimizer_offload=false", "actor.offload.param_offload=false")
    flat = plan("trainer.num_workers=16", "trainer.nnodes=2", *resident)
    hsdp = plan("trainer.num_workers=16", "trainer.nnodes=2", "actor.hsdp_replicas=2", *resident)
    one_node = plan(*resident)
    adam_16 = 2 * (QWEN_7B_PARAMS // 16) * 4 / GIB
    ready = "trainer/ready"
    assert flat.phases[ready].components_gib["optimizer_state"] == pytest.approx(adam_16, rel=1e-3)
    for name in ("optimizer_state", "actor_params"):
        assert hsdp.phases[ready].components_gib[name] == pytest.approx(
            one_node.phases[ready].components_gib[name]
        ), name
    assert hsdp.kv_tokens_needed == flat.kv_tokens_needed


def test_two_node_32b_preset_fits_at_80_gib_without_hsdp_and_not_with_it() -> None:
    """configs/qwen2_5_32b_gsm8k_2x8gpu.yaml (examples/run_qwen2_5_32b_gsm8k_2x8gpu.sh): 16
    workers on 2 nodes, TP 4. HSDP (2 replicas of 8) doubles the actor's shards: its update
    fitted the old flat 1.5 GiB reserve by 0.81 GiB, and fits none of the reserves that count
    its 7 NCCL communicators (10.5 GiB with NVLS, 4.5 GiB without)."""
    shape = model_shape("Qwen2.5-32B")
    flat_config = compose_config("qwen2_5_32b_gsm8k_2x8gpu", [])
    assert (flat_config.trainer.nnodes, flat_config.trainer.workers_per_node) == (2, 8)
    flat = plan_memory(flat_config, shape, 80.0)
    hsdp_config = compose_config("qwen2_5_32b_gsm8k_2x8gpu", ["actor.hsdp_replicas=2"])
    hsdp = plan_memory(hsdp_config, shape, 80.0)
    assert flat.fits and flat.problems == () and flat.warnings == (), flat.problems
    assert flat.kv_tokens >= flat.kv_tokens_needed and hsdp.kv_tokens >= hsdp.kv_tokens_needed
    for nvls in (None, False):
        p = plan_memory(hsdp_config, shape, 80.0, nvls=nvls)
        assert not p.fits and p.peak_phase == "update/optimizer_step"
        assert all(problem.startswith("update/") for problem in p.problems), p.problems
        assert 80.0 - p.reserve_gib < p.peak_gib < 80.0 - 1.5  # the old flat reserve's fit
    backward = "update/backward"
    assert hsdp.phases[backward].components_gib["optimizer_state"] == pytest.approx(
        2 * flat.phases[backward].components_gib["optimizer_state"], rel=1e-3
    )
