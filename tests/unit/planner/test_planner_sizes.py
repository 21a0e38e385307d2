"""Unit tests for the micro-batch and logits terms of `hybrid.planner.sizes`: the chunked
log-prob head (model.log_prob_chunk_tokens) lowers every trainer-side peak of the 8-GPU
Qwen2.5-7B preset and leaves no (tokens, vocab) tensor; chunk 0 is the full-logits formula the
planner had before it, figures included; token budgets (use_dynamic_bsz) set the tokens per
micro-batch, capped at the rows a worker holds; `suggest` proposes the chunked head and token
budgets where they apply."""

from __future__ import annotations

import pytest

from hybrid.memory.model_shape import model_shape
from hybrid.memory.records import GIB
from hybrid.planner.plan import Plan, plan_memory
from hybrid.planner.suggest import suggest
from profiling.plan import compose_config

pytestmark = pytest.mark.unit

LAUNCHER = "qwen2_5_7b_gsm8k_8gpu"
LORA_PRESET = "qwen2_5_7b_lora_gsm8k_8gpu"
FULL_LOGITS = "model.log_prob_chunk_tokens=0"
EAGER = "rollout.enforce_eager=true"
V = 152064  # Qwen2.5-7B's vocabulary
S, R = 512 + 1024, 1024  # the preset's prompt + response, response
PASSES = ("ref/forward", "old_log_prob/forward", "update/forward", "update/backward")
UPDATE_ROWS = 64 * 5 // 8  # ppo_mini_batch_size x n / workers: one mini-batch per worker


def plan(*overrides: str, preset: str = LAUNCHER, gib: float = 80.0) -> Plan:
    return plan_memory(compose_config(preset, list(overrides)), model_shape("Qwen2.5-7B"), gib)


def peak(p: Plan, phase: str) -> float:
    return p.phases[phase].peak_gib


def logits(p: Plan, phase: str) -> float:
    return p.phases[phase].transient_gib.get("logits", 0.0)


@pytest.mark.parametrize("preset", [LAUNCHER, LORA_PRESET])
def test_chunked_logits_lower_every_trainer_pass_and_hold_no_full_logits(preset: str) -> None:
    chunked, full = plan(preset=preset), plan(FULL_LOGITS, preset=preset)
    for phase in PASSES:
        assert peak(chunked, phase) < peak(full, phase), phase
    # the reference's 16 x 1,536-token forward: 25.5 GiB of logits before, at most 3 chunks now
    assert peak(full, "ref/forward") - peak(chunked, "ref/forward") > 20
    forward_chunk = 3 * 1024 * V * 4 / GIB  # (chunk, V) fp32: logits, probabilities, temporary
    for phase in PASSES:
        assert logits(chunked, phase) <= forward_chunk + 1e-9, phase
    assert logits(chunked, "update/forward") == pytest.approx(forward_chunk)
    larger = plan("model.log_prob_chunk_tokens=2048", preset=preset)
    assert logits(larger, "update/forward") == pytest.approx(2 * forward_chunk)
    # backward: one fp32 buffer + the probabilities + dlogits in bf16, per chunk row and logit
    if preset == LAUNCHER:
        assert logits(chunked, "update/backward") == pytest.approx(1024 * V * (4 + 4 + 2) / GIB)


def test_full_logits_reproduce_the_planner_figures_before_chunking() -> None:
    # eager: the figures below predate the planned CUDA graphs (1 GiB of engine overhead)
    full = plan(FULL_LOGITS, EAGER)
    # (T, V) bf16 logits + fp32 copies of the (n, V) response rows; T = b x S, n = b x R
    expected = {
        "ref/forward": 16 * S * V * 2 + 2 * 16 * R * V * 4,  # ref.micro_batch_size = 16
        "old_log_prob/forward": 4 * S * V * 2 + 3 * 4 * R * V * 4,  # with the entropy
        "update/forward": 4 * S * V * 2 + 4 * 4 * R * V * 4,
        "update/backward": 2 * 4 * S * V * 2 + 3 * 4 * R * V * 4,
    }
    for phase, nbytes in expected.items():
        assert logits(full, phase) == pytest.approx(nbytes / GIB), phase
    # the preset's figures as printed before model.log_prob_chunk_tokens existed
    before = {"ref/forward": 30.72, "old_log_prob/forward": 15.55}
    before |= {"update/forward": 29.74, "update/backward": 30.17, "rollout/generate": 47.49}
    assert {phase: round(peak(full, phase), 2) for phase in before} == before
    lora = plan(FULL_LOGITS, EAGER, preset=LORA_PRESET)
    lora_before = {"ref/forward": 30.84, "old_log_prob/forward": 13.90}
    lora_before |= {"update/forward": 17.49, "update/backward": 16.91}
    assert {phase: round(peak(lora, phase), 2) for phase in lora_before} == lora_before


def test_update_peak_grows_with_the_token_budget_up_to_the_rows_a_worker_holds() -> None:
    budgets = [S, 2 * S, 4 * S, 8 * S, 16 * S, UPDATE_ROWS * S]
    dynamic = ("actor.use_dynamic_bsz=true",)
    for phase in ("update/forward", "update/backward"):
        peaks = [
            peak(plan(*dynamic, f"actor.ppo_max_token_len_per_gpu={b}"), phase) for b in budgets
        ]
        assert peaks == sorted(peaks) and len(set(peaks)) == len(peaks), phase
        beyond = plan(*dynamic, f"actor.ppo_max_token_len_per_gpu={2 * UPDATE_ROWS * S}")
        assert peak(beyond, phase) == pytest.approx(peaks[-1]), phase  # capped: all 40 rows
    # without use_dynamic_bsz the budget is not read; with it, the micro_batch_size is not
    assert plan("actor.ppo_max_token_len_per_gpu=1536").phases == plan().phases
    assert plan(*dynamic, "actor.micro_batch_size=1").phases == plan(*dynamic).phases


def test_a_padded_token_budget_is_bounded_by_rows_not_tokens() -> None:
    budget = ("ref.use_dynamic_bsz=true", "ref.log_prob_max_token_len_per_gpu=16384")
    packed = plan(*budget)
    padded = plan(*budget, "model.use_remove_padding=false")
    # packed: 16,384 tokens; padded: rows as short as one token, each padded to S
    assert peak(padded, "ref/forward") > peak(packed, "ref/forward") + 20
    rows = plan("model.use_remove_padding=false")  # by rows the two layouts share a bound
    assert rows.phases == plan().phases


def test_suggest_turns_the_chunked_head_back_on_and_halves_token_budgets() -> None:
    shape = model_shape("Qwen2.5-7B")
    config = compose_config(LORA_PRESET, [FULL_LOGITS])
    first = suggest(config, shape, 24.0)[0]  # the reference's 25.5 GiB of logits
    assert first.overrides == ("model.log_prob_chunk_tokens=1024",) and first.plan.fits
    budget = f"actor.ppo_max_token_len_per_gpu={UPDATE_ROWS * S}"  # a whole mini-batch
    dynamic = compose_config(
        LAUNCHER, ["actor.use_dynamic_bsz=true", budget, "model.gradient_checkpointing=false"]
    )
    suggestions = suggest(dynamic, shape, 80.0)
    assert suggestions and all(s.plan.fits for s in suggestions)
    changed = {o.split("=")[0] for s in suggestions for o in s.overrides}
    assert "actor.ppo_max_token_len_per_gpu" in changed
    assert "actor.micro_batch_size" not in changed  # rows do not bound a token budget's pass
    for s in suggestions:
        for override in s.overrides:
            if override.startswith("actor.ppo_max_token_len_per_gpu="):
                assert int(override.split("=")[1]) >= S  # a row must fit in the budget
