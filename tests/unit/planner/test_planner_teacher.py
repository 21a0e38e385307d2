"""The memory planner with on-policy distillation's teacher (distill.teacher_path): its shard by
hand from the Qwen2.5-32B shape (not the student's), added to every phase and nothing else
changed; its onload / forward / offload boundaries where the worker's phase bracket records
them; its offload moving exactly its shard to the host (CUDA only); its forward following its
own micro-batch; its shape read from the directory's config.json; a config.json that does not
load reported in the plan's output; a suggestion that reaches for its offload."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from torch import nn

from hybrid.memory.components import parameter_bytes
from hybrid.memory.ledger import MemoryLedger
from hybrid.memory.model_shape import model_shape
from hybrid.memory.records import COMPONENTS, GIB, step_phases
from hybrid.models import TinyModelConfig, qwen2_config
from hybrid.planner.format import format_plan, to_json
from hybrid.planner.plan import Plan, plan_memory
from hybrid.planner.suggest import suggest
from hybrid.planner.teacher_sizes import TEACHER_PHASES
from hybrid.sharding.offload import Offloader
from profiling.plan import compose_config

pytestmark = pytest.mark.unit

LAUNCHER = "qwen2_5_7b_gsm8k_8gpu"  # 8 workers per node, bf16 on the planned GPU
TEACHER = "distill.teacher_path=Qwen2.5-32B"
OFFLOADED = "distill.offload.param_offload=true"
# Qwen2.5-32B by hand: h, kv heads x head_dim, MLP width, L, V; q/k/v with biases, untied LM head.
H, KV, MLP, L, V = 5120, 1024, 27648, 64, 152064
QWEN_32B_PARAMS = L * (2 * H * H + H + 2 * (H * KV + KV) + 3 * H * MLP + 2 * H) + 2 * V * H + H
# Every 32B tensor's rows divide by 8: rank 0's bf16 shard is exactly P / 8 x 2 bytes.
SHARD_GIB = QWEN_32B_PARAMS // 8 * 2 / GIB


def plan(*overrides: str, gib: float = 80.0, preset: str = LAUNCHER) -> Plan:
    config = compose_config(preset, list(overrides))
    return plan_memory(config, model_shape("Qwen2.5-7B"), gib)


def pinned(nbytes: int) -> int:
    """torch's pinned host block: the next power of two."""
    return 1 << (nbytes - 1).bit_length()


def test_the_teacher_adds_exactly_its_own_shard_to_every_phase() -> None:
    assert QWEN_32B_PARAMS == model_shape("Qwen2.5-32B").num_params == 32_763_876_352
    student, distilled = plan(), plan(TEACHER)
    assert distilled.teacher == "Qwen2.5-32B" and student.teacher is None
    for name, before in student.phases.items():
        after = distilled.phases[name]
        # Resident outside its pass (no offload): 7.63 GiB of 32B bf16, not the student's 1.77.
        assert after.components_gib.pop("teacher_params") == pytest.approx(SHARD_GIB, rel=1e-12)
        assert after.components_gib == before.components_gib, name
        assert after.transient_gib == before.transient_gib, name
        assert after.peak_gib == pytest.approx(before.peak_gib + SHARD_GIB, rel=1e-12), name
    assert distilled.peak_gib == pytest.approx(student.peak_gib + SHARD_GIB, rel=1e-12)
    # HSDP: sharded like the reference, over one replica's 4 ranks.
    hsdp = plan(TEACHER, "actor.hsdp_replicas=2").phases["trainer/ready"].components_gib
    assert hsdp["teacher_params"] == pytest.approx(2 * SHARD_GIB, rel=1e-12)
    assert set(COMPONENTS) >= {"teacher_params"}


def test_the_teacher_phases_sit_before_the_first_update_as_the_worker_records_them() -> None:
    grpo = step_phases(critic=False)
    update = grpo.index("update/onload")
    assert tuple(plan(TEACHER).phases) == grpo[:update] + TEACHER_PHASES + grpo[update:]
    # With PPO's critic the teacher is submitted after its values pass, before any update.
    ppo = step_phases(critic=True)
    update = ppo.index("update_critic/onload")
    gae = ("algorithm.adv_estimator=gae", "critic.micro_batch_size=4", TEACHER)
    assert tuple(plan(*gae).phases) == ppo[:update] + TEACHER_PHASES + ppo[update:]
    # The worker's bracket (Offloader.phase) around its own teacher/forward, on a real ledger.
    model = nn.Linear(4, 4)
    offloader = Offloader(model, None, model.weight.device, True, optimizer_offload=False)
    ledger = MemoryLedger()
    ledger.track("teacher", lambda: {"teacher_params": parameter_bytes(model)})
    with offloader.phase("teacher", ledger):
        ledger.record("teacher/forward", reuse_components=True)
    records = ledger.pop_records(step=1)
    assert tuple(r.phase for r in records) == TEACHER_PHASES
    assert all(set(r.components_gib) <= set(COMPONENTS) for r in records)


def forward(p: Plan, phase: str = "teacher/forward") -> dict[str, float]:
    return p.phases[phase].transient_gib


def test_the_teacher_forward_is_the_reference_forward_of_its_shape() -> None:
    # The student as its own teacher at the reference's micro-batch: the same scoring forward,
    # by rows or by a token budget.
    same = plan("distill.teacher_path=Qwen2.5-7B", "distill.micro_batch_size=16")
    assert forward(same) == forward(same, "ref/forward")
    budget = ("use_dynamic_bsz=true", "log_prob_max_token_len_per_gpu=4096")
    by_tokens = plan(
        "distill.teacher_path=Qwen2.5-7B",
        *(f"{owner}.{setting}" for owner in ("distill", "ref") for setting in budget),
    )
    assert forward(by_tokens) == forward(by_tokens, "ref/forward")
    # A smaller micro-batch runs fewer tokens; the 32B teacher gathers its own larger layers.
    by_micro = [
        sum(forward(plan(TEACHER, f"distill.micro_batch_size={m}")).values()) for m in (1, 4, 16)
    ]
    assert by_micro == sorted(by_micro) and by_micro[0] < by_micro[-1]
    root, layer = 2 * V * H + H, 2 * H * H + H + 2 * (H * KV + KV) + 3 * H * MLP + 2 * H
    unsharded = forward(plan(TEACHER))["unsharded_params"]
    assert unsharded == pytest.approx((root + 2 * layer) * 2 / GIB, rel=1e-12)


def test_offload_moves_the_teacher_to_the_host_outside_its_pass() -> None:
    student, resident, offloaded = plan(), plan(TEACHER), plan(TEACHER, OFFLOADED)
    for name, phase in offloaded.phases.items():
        held = phase.components_gib.get("teacher_params", 0.0)
        if name in TEACHER_PHASES:
            assert held == pytest.approx(SHARD_GIB, rel=1e-12), name
            assert phase.peak_gib == pytest.approx(resident.phases[name].peak_gib), name
        else:
            assert held == 0.0, name
            assert phase.peak_gib == pytest.approx(student.phases[name].peak_gib), name
    # Host: 8 workers' shards, each tensor's shard in its own power-of-two pinned block.
    assert "teacher_params" not in resident.host_gib
    assert offloaded.host_gib["teacher_params"] == pytest.approx(8 * SHARD_GIB, rel=1e-12)
    rows = {"q": H // 8 * H, "q_bias": H // 8, "kv": KV // 8 * H, "kv_bias": KV // 8}
    rows |= {"o": H // 8 * H, "mlp": MLP // 8 * H, "norm": H // 8}
    per_layer = [rows["q"], rows["q_bias"], *[rows["kv"], rows["kv_bias"]] * 2, rows["o"]]
    per_layer += [rows["mlp"]] * 3 + [rows["norm"]] * 2
    tensors = per_layer * L + [V // 8 * H] * 2 + [rows["norm"]]
    assert sum(tensors) * 8 == QWEN_32B_PARAMS
    rounding = 8 * sum(pinned(2 * n) - 2 * n for n in tensors) / GIB
    added = offloaded.host_gib["pinned_rounding"] - resident.host_gib["pinned_rounding"]
    assert added == pytest.approx(rounding, rel=1e-12)
    assert offloaded.host_steady_gib == pytest.approx(
        resident.host_steady_gib + 8 * SHARD_GIB + rounding, rel=1e-12
    )
    # Rank 0 reads the whole teacher in bf16 at startup: 61 GiB, more than the 7B's fp32 28.4.
    assert resident.host_startup_gib == pytest.approx(QWEN_32B_PARAMS * 2 / GIB, rel=1e-12)
    assert student.host_startup_gib < resident.host_startup_gib


def test_on_cpu_the_teacher_stays_resident_and_nothing_reaches_the_host() -> None:
    # Sharded over both workers: `auto` replicas would replicate the tiny student, and the
    # teacher with it, on this host (then its whole weights on each rank).
    sharded = "actor.hsdp_replicas=1"
    config = compose_config("config", ["distill.teacher_path=bench-100m", OFFLOADED, sharded])
    p = plan_memory(config, model_shape("tiny"), 16.0)
    shard = model_shape("bench-100m").shard(config.trainer.num_workers)
    dtype = round(p.phases["trainer/ready"].components_gib["teacher_params"] * GIB / shard)
    assert dtype in (2, 4)  # `auto` resolves for this CPU: bf16 or fp32
    assert all(
        phase.components_gib["teacher_params"] == pytest.approx(shard * dtype / GIB)
        for phase in p.phases.values()
    )
    assert "teacher_params" not in p.host_gib


def test_the_teacher_shape_is_read_from_its_directory(tmp_path: Path) -> None:
    # The tiny preset's config.json: the plan counts it, not the 7B student's shape.
    qwen2_config(TinyModelConfig.preset("tiny")).save_pretrained(tmp_path)
    p = plan(f"distill.teacher_path={tmp_path}")
    assert p.teacher == str(tmp_path)
    tiny = model_shape("tiny").shard(8) * 2 / GIB
    assert p.phases["trainer/ready"].components_gib["teacher_params"] == pytest.approx(tiny)
    assert not p.warnings


@pytest.mark.parametrize("broken", ["no config.json", "not JSON", "no such directory"])
def test_a_teacher_config_that_does_not_load_is_reported(tmp_path: Path, broken: str) -> None:
    teacher = tmp_path / "teacher"
    if broken != "no such directory":
        teacher.mkdir()
    if broken == "not JSON":
        (teacher / "config.json").write_text("{ not json")
    p = plan(f"distill.teacher_path={teacher}")
    assert p.teacher is None
    assert not set(TEACHER_PHASES) & set(p.phases)
    [warning] = [w for w in p.warnings if "distill.teacher_path" in w]
    assert repr(str(teacher)) in warning and "leaves the teacher out" in warning
    text = format_plan(p)
    assert f"warning: distill.teacher_path={str(teacher)!r}" in text
    assert "distilling from" not in text
    as_json = json.loads(to_json(p))["plan"]
    assert as_json["teacher"] is None and warning in as_json["warnings"]


def test_suggestions_reach_for_the_teacher_offload() -> None:
    # vLLM's 85% beside a resident 32B teacher's shard: rollout/generate is 0.6 GiB over.
    config = compose_config(LAUNCHER, [TEACHER, "rollout.gpu_memory_utilization=0.85"])
    base = plan_memory(config, model_shape("Qwen2.5-7B"), 80.0)
    assert not base.fits and base.peak_phase == "rollout/generate"
    found = suggest(config, model_shape("Qwen2.5-7B"), 80.0)
    assert found[0].overrides == ("distill.offload.param_offload=true",)
    assert found[0].plan.fits
    assert found[0].plan.peak_gib == pytest.approx(base.peak_gib - SHARD_GIB, rel=1e-12)
    # Without a teacher no distill.* change is ever proposed.
    student = compose_config(LAUNCHER, ["rollout.gpu_memory_utilization=0.95"])
    proposed = suggest(student, model_shape("Qwen2.5-7B"), 80.0)
    assert proposed and not any(o.startswith("distill.") for s in proposed for o in s.overrides)
