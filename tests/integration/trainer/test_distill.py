"""On-policy distillation through real runs: 3 steps on the tiny model and the arithmetic prompts,
in-process (`Driver(config).fit()` on the session's Ray cluster), with real Ray and FSDP2 and the
teacher as its own member of the WorkerDict.

By default, colocated on the deterministic toy engine: a teacher of the student's vocabulary
but other weights (another seed, peakier logits) reports finite distill/ metrics, a positive
reverse KL, and advantages that are exactly the distillation's (distill.reward_coef=0); the
student as its own teacher (the peaky model on both sides) agrees with it on every token of
step 1, so the teacher's log-probs line up with the sampled tokens. Under -m full: the same identity on vLLM (its fp32 log-probs against
the FSDP teacher's), split and fully_async runs and a LoRA student.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from hybrid.models import TinyModelConfig, build_tiny_model
from hybrid.trainer.loop import Driver
from tests.integration.trainer.helpers import (
    ONE_WORKER,
    config_from_overrides,
    read_metrics,
    small_run_overrides,
    write_assets,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

STEPS = 3
COEF = 2.0
DISTILL_KEYS = (
    "distill/reverse_kl",
    "distill/teacher_log_prob_mean",
    "distill/advantage_mean",
    "distill/log_ratio_abs_max",
)
TOY = ("rollout.engine=toy",)
FP32 = ("rollout.dtype=float32", "actor.precision.param_dtype=float32")
IDENTITY_GAP = {"toy": 1e-4, "vllm": 1e-3}
"""Largest |student - teacher| of a step-1 token with the student as its own teacher: the
engine's fp32 log-probs against the FSDP teacher's (the toy engine runs the same model in the
same dtype; vLLM's fp32 log-probs match FSDP's within ~1e-3; both were ~4e-6 here)."""


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = write_assets(tmp_path_factory.mktemp("distill"))
    # The student's vocabulary, other weights: another seed and a wider init, so that the
    # teacher's distribution is far from the (near-uniform) untrained student's.
    teacher = TinyModelConfig.preset(
        "tiny", vocab="arithmetic", dtype="float32", initializer_range=0.2
    )
    build_tiny_model(root / "teacher", teacher, seed=1)
    return root


def distill_run(
    assets: Path, out: Path, teacher: Path, *extra: str, student: Path | None = None
) -> list[dict]:
    """A run of STEPS steps distilling `teacher` into `student` (the assets' model unless
    given), checked for what every distillation run reports; its metrics."""
    overrides = small_run_overrides(
        assets, out, f"trainer.total_steps={STEPS}",
        f"distill.teacher_path={teacher}", f"distill.coef={COEF}",
        "distill.precision.param_dtype=float32", "distill.micro_batch_size=4",
        *extra,
    )  # fmt: skip
    if student is not None:
        overrides = [o for o in overrides if not o.startswith("model.path=")]
        overrides.append(f"model.path={student}")
    config = config_from_overrides(overrides)
    assert config.distill.enabled
    Driver(config).fit()
    metrics = read_metrics(out)
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    for row in metrics:
        missing = [key for key in DISTILL_KEYS if key not in row]
        assert not missing, (row["step"], missing)
        bad = {k: row[k] for k in DISTILL_KEYS if not math.isfinite(row[k])}
        assert not bad, (row["step"], bad)
        # distill.reward_coef=0: the advantage is -coef x (student - teacher) alone.
        assert row["distill/advantage_mean"] == pytest.approx(
            -COEF * row["distill/reverse_kl"], rel=1e-4, abs=1e-6
        )
        assert row["critic/advantages/mean"] == pytest.approx(
            row["distill/advantage_mean"], rel=1e-4, abs=1e-6
        )
        assert row["actor/step_applied"] == 1.0
    return metrics


def check_another_teacher(metrics: list[dict]) -> None:
    """The teacher's log-probs are not the student's: the reverse-KL estimate is clearly
    positive (a KL, estimated on 16 samples of a near-uniform student)."""
    for row in metrics:
        assert row["distill/reverse_kl"] > 0.05, row
        assert row["distill/advantage_mean"] < 0, row


@pytest.mark.full  # the default tier's budget: the student as its own teacher runs by default
def test_colocated_with_another_teacher(ray_cluster: None, assets: Path, tmp_path: Path) -> None:
    metrics = distill_run(assets, tmp_path / "run", assets / "teacher", *TOY)
    check_another_teacher(metrics)
    # Trained on the distillation advantage alone, the student moves toward the teacher
    # (2.49 -> 1.67 nats over 3 steps here; the toy engine repeats it exactly).
    assert metrics[-1]["distill/reverse_kl"] < 0.9 * metrics[0]["distill/reverse_kl"], metrics


@pytest.mark.parametrize("engine", ["toy", pytest.param("vllm", marks=pytest.mark.full)])
def test_the_student_as_its_own_teacher_has_no_reverse_kl(
    ray_cluster: None, assets: Path, tmp_path: Path, engine: str
) -> None:
    peaky = assets / "teacher"  # far from uniform: a misplaced log-prob would stand out
    workers = ONE_WORKER if engine == "toy" else ()
    metrics = distill_run(
        assets, tmp_path / engine, peaky, f"rollout.engine={engine}", *FP32, *workers,
        student=peaky,
    )  # fmt: skip
    # Step 1 samples with the starting weights, which the teacher keeps; later steps sample
    # with updated ones.
    first = metrics[0]
    assert first["distill/log_ratio_abs_max"] < IDENTITY_GAP[engine], first
    assert abs(first["distill/reverse_kl"]) < IDENTITY_GAP[engine], first
    assert first["distill/teacher_log_prob_mean"] < -0.1, first


DECOUPLED = {
    "split": ("trainer.mode=split", "sync.method=memory", "sync.offset=1"),
    "fully_async": ("trainer.mode=fully_async",),
}


@pytest.mark.full  # the teacher with the trainer group; by default colocated only
@pytest.mark.parametrize("mode", sorted(DECOUPLED))
def test_decoupled_modes_with_another_teacher(
    ray_cluster: None, assets: Path, tmp_path: Path, mode: str
) -> None:
    out = tmp_path / mode
    settings = (*DECOUPLED[mode], "sync.timeout_s=60", f"sync.checkpoint_dir={out / 'weights'}")
    check_another_teacher(distill_run(assets, out, assets / "teacher", *TOY, *settings))


@pytest.mark.full  # LoRA's adapters with the teacher beside the actor's base
def test_lora_student_with_another_teacher(ray_cluster: None, assets: Path, tmp_path: Path) -> None:
    out = tmp_path / "lora"
    lora = ("model.lora.rank=8", "actor.optim.lr=1e-2")
    check_another_teacher(distill_run(assets, out, assets / "teacher", *TOY, *lora))
