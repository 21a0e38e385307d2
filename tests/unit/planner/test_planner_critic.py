"""The memory planner with PPO's critic (algorithm.adv_estimator=gae): the value model's size
by hand from the Qwen2.5 shapes, its phases where the step records them, its offload flags
moving exactly its own components, its transients following its own micro-batch and
checkpointing, suggestions that reach for the critic's knobs, and the 3B PPO launcher's plan
at 2 / 4 / 8 x 80 GiB (the README's line)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from hybrid.memory.model_shape import model_shape
from hybrid.memory.records import CRITIC_PHASES, GIB, STEP_PHASES, step_phases
from hybrid.planner.plan import Plan, plan_memory
from hybrid.planner.suggest import suggest
from profiling.plan import compose_config, main

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[3]
PPO_LAUNCHER = REPO / "examples" / "run_qwen2_5_3b_countdown_ppo.sh"
GAE = ("algorithm.adv_estimator=gae", "critic.micro_batch_size=4")  # 40 rows per worker
# Qwen2.5-7B: hidden, vocabulary, parameters (untied LM head); Qwen2.5-0.5B (tied).
H, V, QWEN_7B_PARAMS = 3584, 152064, 7_615_616_512
H_05B, QWEN_05B_PARAMS = 896, 494_032_768
CRITIC_COMPONENTS = {"critic_params", "critic_grads", "critic_optimizer_state"}


def plan(*overrides: str, gib: float = 80.0) -> Plan:
    config = compose_config("qwen2_5_7b_gsm8k_8gpu", [*GAE, *overrides])
    return plan_memory(config, model_shape("Qwen2.5-7B"), gib)


def held(p: Plan, phase: str) -> set[str]:
    return set(p.phases[phase].components_gib)


def test_the_value_model_is_the_decoder_with_a_scalar_head() -> None:
    untied = model_shape("Qwen2.5-7B").value_model()
    assert untied.num_params == QWEN_7B_PARAMS - V * H + H + 1  # no LM head; score + bias
    assert [name for name, _ in untied.params[-2:]] == ["score.weight", "score.bias"]
    tied = model_shape("Qwen2.5-0.5B").value_model()
    assert tied.num_params == QWEN_05B_PARAMS + H_05B + 1  # the tied head was never listed


def test_a_gae_plan_has_every_step_phase_and_the_critic_shard_by_hand() -> None:
    p = plan()
    assert tuple(p.phases) == STEP_PHASES
    # Rank 0's fp32 shard of the 7B value model over 8 ranks: every decoder and embedding
    # tensor splits evenly; the (1, H) head and its bias stay one row each on rank 0.
    shard = (QWEN_7B_PARAMS - V * H) // 8 + H + 1
    update = p.phases["update_critic/optimizer_step"].components_gib
    assert update["critic_params"] == pytest.approx(shard * 4 / GIB, rel=1e-12)
    assert update["critic_grads"] == update["critic_params"]
    assert update["critic_optimizer_state"] == pytest.approx(2 * shard * 4 / GIB, rel=1e-12)
    # A GRPO plan of the same config has neither the phases nor the components.
    grpo = plan_memory(compose_config("qwen2_5_7b_gsm8k_8gpu", []), model_shape("Qwen2.5-7B"), 80.0)
    assert tuple(grpo.phases) == step_phases(critic=False)
    assert not any(CRITIC_COMPONENTS & held(grpo, phase) for phase in grpo.phases)


def test_critic_offload_moves_only_the_critic_outside_its_phases() -> None:
    kept = plan()
    offloaded = plan("critic.offload.param_offload=true", "critic.offload.optimizer_offload=true")
    for phase in STEP_PHASES:
        moved = held(kept, phase) - held(offloaded, phase)
        if phase.startswith("update_critic/"):  # params and optimizer state onloaded
            assert moved == set(), phase
        elif phase.startswith("values/"):  # params onloaded, the optimizer state stays away
            assert moved == {"critic_optimizer_state"}, phase
        else:
            assert moved == {"critic_params", "critic_optimizer_state"}, phase
    assert {p.split("/")[0] for p in CRITIC_PHASES} == {"values", "update_critic"}
    # Gradients exist only between the critic's first backward and its optimizer step.
    assert [p for p in STEP_PHASES if "critic_grads" in held(kept, p)] == [
        "update_critic/forward",  # accumulating: the launcher's micro-batch < its rows
        "update_critic/backward",
        "update_critic/optimizer_step",
    ]


def test_critic_transients_follow_its_own_micro_batch_and_checkpointing() -> None:
    base = plan("critic.micro_batch_size=4")
    bigger = plan("critic.micro_batch_size=8")
    checkpointed = plan("critic.micro_batch_size=8", "critic.gradient_checkpointing=true")
    for phase in ("values/forward", "update_critic/forward", "update_critic/backward"):
        assert bigger.phases[phase].peak_gib > base.phases[phase].peak_gib, phase
    assert (
        checkpointed.phases["update_critic/backward"].peak_gib
        < bigger.phases["update_critic/backward"].peak_gib
    )
    # The actor's phases do not see the critic's knobs (the critic's resident bytes aside).
    for phase in ("old_log_prob/forward", "update/backward"):
        assert bigger.phases[phase] == base.phases[phase] == checkpointed.phases[phase]
    # No logits: the value head's update holds no (tokens, vocabulary) buffer.
    assert "logits" not in bigger.phases["update_critic/backward"].transient_gib


def test_suggestions_for_an_over_budget_critic_fit() -> None:
    config = compose_config("qwen2_5_7b_gsm8k_8gpu", [*GAE, "critic.micro_batch_size=8"])
    shape = model_shape("Qwen2.5-7B")
    assert not plan_memory(config, shape, 40.0).fits
    found = suggest(config, shape, 40.0)
    assert found and any(o.startswith("critic.") for s in found for o in s.overrides)
    for s in found:  # applied through Hydra again, each one fits
        again = compose_config(
            "qwen2_5_7b_gsm8k_8gpu", [*GAE, "critic.micro_batch_size=8", *s.overrides]
        )
        assert plan_memory(again, shape, 40.0).fits, s.overrides


def launcher_overrides() -> list[str]:
    """The launcher's Hydra overrides, less those that name its shell variables."""
    command = PPO_LAUNCHER.read_text().split("python -m hybrid.main", 1)[1]
    words = shlex.split(command.replace("\\\n", " "))
    return [w for w in words if "=" in w and "$" not in w]


@pytest.mark.parametrize("workers", [2, 4, 8])
def test_the_3b_ppo_launcher_fits_on_80_gib_gpus(
    workers: int, capsys: pytest.CaptureFixture[str]
) -> None:
    overrides = [*launcher_overrides(), f"trainer.num_workers={workers}"]
    assert "algorithm.adv_estimator=gae" in overrides
    assert "critic.offload.optimizer_offload=true" in overrides
    assert main(["--model", "Qwen2.5-3B", *overrides]) == 0
    out = capsys.readouterr().out
    assert "update_critic/backward" in out and "critic_params" in out
    assert out.splitlines()[-1].startswith("FITS: peak")
