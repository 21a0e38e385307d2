"""The planner under Ulysses sequence parallelism (actor.sp_size): sp = 1 keeps the figures it
had; at sp = 2 and 4 a rank's activation and logits terms are those of its slice of the row,
checked against the formulas of docs/memory-model.md by hand, plus the all-to-all's transient;
rows split over the data-parallel slots; the critic and the teacher split theirs too; the sp
mesh's communicators join the reserve; the
longest response that fits grows with sp (Qwen2.5-7B and Qwen3-8B on 8 x 80 GB); the
long-context preset fits and its launcher exists; `--suggest` proposes sp where only sp fits;
the Qwen3-8B preset counted by hand."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from hybrid.memory.model_shape import ModelShape, model_shape
from hybrid.memory.records import GIB
from hybrid.planner.format import format_longest
from hybrid.planner.longest import LongestFit, longest_responses, with_response
from hybrid.planner.passes import PassName
from hybrid.planner.plan import Plan, plan_memory
from hybrid.planner.sizes import WorkerSizes
from hybrid.planner.suggest import _values, sp_sizes, suggest, with_sp
from hybrid.trainer.config import TrainerRunConfig
from profiling.plan import compose_config, main

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[3]
PRESET = "qwen2_5_7b_longctx_8gpu"
LAUNCHER = "qwen2_5_7b_gsm8k_8gpu"
# Qwen2.5-7B: hidden, MLP width, layers, KV width (4 heads x 128), vocabulary; bf16 compute.
H, MLP, L, KV, V, CB = 3584, 18944, 28, 4 * 128, 152064, 2
S, R = 2048 + 30720, 30720  # the preset's prompt + response, response
CHUNK = 1024  # model.log_prob_chunk_tokens


def preset(*overrides: str) -> TrainerRunConfig:
    return compose_config(PRESET, list(overrides))


def plan(config: TrainerRunConfig, model: str = "Qwen2.5-7B", gib: float = 80.0) -> Plan:
    return plan_memory(config, model_shape(model), gib, gpu="h100")


def at_sp(sp: int, *overrides: str) -> TrainerRunConfig:
    """The preset at `sp`, each sp group's micro-batch one whole sequence in the update and
    two in the scoring passes (the per-rank budgets S / sp and 2 S / sp)."""
    update, scoring = S // sp, 2 * S // sp
    return preset(
        f"actor.sp_size={sp}",
        f"actor.ppo_max_token_len_per_gpu={update}",
        f"actor.log_prob_max_token_len_per_gpu={scoring}",
        f"ref.log_prob_max_token_len_per_gpu={scoring}",
        *overrides,
    )


# --- the formulas of docs/memory-model.md, by hand ------------------------------------------

A = 8 * H + CB * (5 * H + 2 * KV + 4 * MLP)  # a layer's saved activations per token
LAYER = 2 * H * H + 2 * H * KV + H + 2 * KV + 3 * H * MLP + 2 * H  # attention (+bias), MLP, norms


def saved(t: int) -> int:
    """Checkpointed forward: every layer's input and the final norm, per token."""
    return t * (L * H * CB + 4 * H + H * CB)


def nograd_layer(t: int) -> int:
    return t * (4 * H + CB * (3 * H + 3 * MLP))


def layer_backward(t: int) -> int:
    """The recomputed layer and the activation gradients."""
    return t * (A + (2 * H + 3 * MLP) * CB)


def all_to_all(t: int, sp: int) -> int:
    return 0 if sp == 1 else 4 * t * H * CB


def larger(*moments: dict[str, int]) -> dict[str, int]:
    return max(moments, key=lambda m: sum(m.values()))


def update_forward(t: int, n: int, sp: int, chunked: bool) -> dict[str, int]:
    """Its activations, logits and all-to-all at the larger of its two moments."""
    if chunked:  # the scored states are saved; 3 (c, V) fp32 buffers
        head = {"activations": saved(t) + n * H * CB, "logits": 3 * min(CHUNK, n) * V * 4}
    else:  # (T, V) in bf16 + 4 fp32 (n, V) copies
        head = {"activations": saved(t), "logits": t * V * CB + 4 * n * V * 4}
    layer = {"activations": saved(t) + nograd_layer(t), "all_to_all": all_to_all(t, sp)}
    return larger(head, layer)


def update_backward(t: int, n: int, sp: int, chunked: bool) -> dict[str, int]:
    """Its activations, logits and all-to-all at the larger of its moments (the unsharded
    parameters, the same in both, left out; the gradients counted to pick the moment)."""
    head_grad = V * H * CB  # the LM head's unsharded gradient
    layer_grads = LAYER * (CB + 4)  # a layer's, in bf16 and its fp32 copy for the reduce
    if chunked:
        head = {
            "grads": head_grad + V * H * 4,  # + the fp32 accumulator of the LM head's gradient
            "activations": saved(t) + 2 * n * H * CB,
            "logits": min(CHUNK, n) * V * (4 + 4 + CB),
        }
        kept = 0
    else:
        head = {
            "grads": head_grad,
            "activations": saved(t),
            "logits": 2 * t * V * CB + 3 * n * V * 4,
        }
        kept = t * V * CB
    layer = {
        "grads": head_grad + layer_grads,
        "activations": saved(t) + layer_backward(t),
        "logits": kept,
        "all_to_all": all_to_all(t, sp),
    }
    moment = larger(head, layer)
    return {k: v for k, v in moment.items() if k != "grads"}


def transient(p: Plan, phase: str) -> dict[str, float]:
    keys = ("activations", "logits", "all_to_all")
    return {k: p.phases[phase].transient_gib.get(k, 0.0) for k in keys}


def gib(moment: dict[str, int]) -> dict[str, float]:
    return {k: moment.get(k, 0) / GIB for k in ("activations", "logits", "all_to_all")}


# --- sp = 1 ----------------------------------------------------------------------------------


def test_sp_1_keeps_the_8_gpu_preset_s_figures() -> None:
    """The figures docs/memory.md prints for the 8-GPU preset, no all-to-all, no sp groups."""
    p = plan(compose_config(LAUNCHER, []))
    figures = {"ref/forward": 9.45, "update/backward": 24.26, "rollout/generate": 47.49}
    assert {phase: round(p.phases[phase].peak_gib, 2) for phase in figures} == figures
    assert not any("all_to_all" in phase.transient_gib for phase in p.phases.values())
    assert [c.name for c in p.reserve.communicators if c.name.startswith("sp")] == []
    assert (round(p.reserve_gib, 2), round(p.margin_gib, 2)) == (5.5, 27.01)


def test_sp_1_micro_batches_are_the_formula_of_micro_batches() -> None:
    config = compose_config(LAUNCHER, [])
    w = WorkerSizes(config, model_shape("Qwen2.5-7B"), 0, 80 * GIB)
    seq, r = 512 + 1024, 1024
    passes: tuple[tuple[PassName, int], ...] = (("ref", 16), ("old_log_prob", 4), ("update", 4))
    for name, b in passes:
        mb = w.micro_batch(name)
        assert (mb.tokens, mb.scored, mb.split, mb.sp) == (b * seq, b * r, True, 1), name


# --- sp = 2, 4: a rank's slice ------------------------------------------------------------


@pytest.mark.parametrize("chunked", [True, False], ids=["chunked-head", "full-logits"])
def test_update_activations_and_logits_are_a_rank_s_slice(chunked: bool) -> None:
    """One sequence of S tokens per update micro-batch: each of sp ranks runs S / sp tokens,
    all of them scored (a 30,720-token response fills every slice but the first's start),
    and the update's terms are the formulas at S / sp, + the all-to-all's 4 x (S / sp) x h."""
    head = () if chunked else ("model.log_prob_chunk_tokens=0",)
    plans = {sp: plan(at_sp(sp, *head)) for sp in (1, 2, 4)}
    for sp, p in plans.items():
        t = n = S // sp  # by tokens, a budget's tokens may all be scored (min(T / sp, n))
        expected = {
            "update/forward": update_forward(t, n, sp, chunked),
            "update/backward": update_backward(t, n, sp, chunked),
        }
        for phase, moment in expected.items():
            assert transient(p, phase) == pytest.approx(gib(moment)), (sp, phase)
        mb = WorkerSizes(at_sp(sp, *head), model_shape("Qwen2.5-7B"), 0, 80 * GIB).micro_batch(
            "update"
        )
        assert (mb.tokens, mb.scored, mb.sp) == (t, n, sp)
    # The terms shrink by the factor: the same formulas on 1 / sp of the tokens. Full logits:
    # exactly (the same moments win). The chunked head's (c, V) buffers do not shrink
    # (c = 1,024 < S / 4) and the all-to-all comes on top: within 25% of the factor.
    for phase in ("update/forward", "update/backward"):
        one = sum(transient(plans[1], phase).values())
        for sp in (2, 4):
            terms = transient(plans[sp], phase)
            if chunked:
                assert one / sp <= sum(terms.values()) <= 1.25 * one / sp, (sp, phase)
            else:
                assert terms["all_to_all"] == 0  # the head's moments are the larger
                assert sum(terms.values()) == pytest.approx(one / sp, rel=1e-12), (sp, phase)


def test_the_all_to_all_joins_the_layer_moments() -> None:
    """A no-grad layer's working set in the scoring passes, the update's layer moments."""
    p = plan(at_sp(4))
    t = 2 * S // 4  # two sequences per scoring micro-batch
    forward = p.phases["ref/forward"].transient_gib
    assert forward["activations"] == pytest.approx(nograd_layer(t) / GIB)
    assert forward["all_to_all"] == pytest.approx(4 * t * H * CB / GIB)
    assert p.phases["update/backward"].transient_gib["all_to_all"] == pytest.approx(
        4 * (S // 4) * H * CB / GIB
    )


def test_the_critic_and_the_teacher_split_their_rows_too() -> None:
    """PPO's critic and the distillation teacher run under actor.sp_size as the actor does:
    a 4-row micro-batch of 1,536-token rows is 3,072 tokens a rank at sp = 2, its no-grad
    layer working set half of sp = 1's, beside the all-to-all's 4 x 3,072 x h."""
    extra = ("algorithm.adv_estimator=gae", "critic.micro_batch_size=4")
    extra += ("distill.teacher_path=Qwen2.5-7B", "distill.micro_batch_size=4")
    one, two = (plan(compose_config(LAUNCHER, [*extra, f"actor.sp_size={sp}"])) for sp in (1, 2))
    t = 4 * (512 + 1024) // 2
    values = two.phases["values/forward"].transient_gib  # a no-grad layer's moment
    assert values["activations"] == pytest.approx(nograd_layer(t) / GIB)
    assert values["all_to_all"] == pytest.approx(4 * t * H * CB / GIB)
    halved = one.phases["values/forward"].transient_gib["activations"] / 2
    assert values["activations"] == pytest.approx(halved)
    # The teacher's chunked head is its larger moment: the slice's hidden states and its
    # scored ones, min(T / sp, n) = min(3,072, 4 x 1,024).
    teacher = two.phases["teacher/forward"].transient_gib
    assert teacher["activations"] == pytest.approx((t + min(t, 4 * 1024)) * H * CB / GIB)
    whole = one.phases["teacher/forward"].transient_gib["activations"]
    assert whole == pytest.approx((2 * t + 4 * 1024) * H * CB / GIB)
    for phase in ("update_critic/forward", "update_critic/backward"):
        assert two.phases[phase].transient_gib["all_to_all"] == pytest.approx(4 * t * H * CB / GIB)


def test_rows_split_over_the_data_parallel_slots() -> None:
    """By rows: a slot holds rows_per_step / (W / sp) rows. A reference micro-batch of 64
    rows takes all 32 rows of a worker at sp = 1; at sp = 4 a slot's 128 rows take two
    micro-batches of 64 rows, each rank running a quarter of their tokens. The update's
    share of a mini-batch is per slot too (TrainerRunConfig.mini_batch_rows_per_worker)."""
    rows = ("ref.use_dynamic_bsz=false", "ref.micro_batch_size=64")
    one = WorkerSizes(with_sp(preset(*rows), 1)[0], qwen7b(), 0, 80 * GIB).micro_batch("ref")
    four = WorkerSizes(preset(*rows), qwen7b(), 0, 80 * GIB).micro_batch("ref")
    assert (one.tokens, one.scored, one.split) == (32 * S, 32 * R, False)  # 256 rows / 8
    assert (four.tokens, four.scored, four.split) == (16 * S, 16 * S, True)  # 256 / 2, over 4
    assert preset().mini_batch_rows_per_worker == 16 * 8 // 2
    assert with_sp(preset(), 1)[0].mini_batch_rows_per_worker == 16 * 8 // 8


def test_the_sp_mesh_adds_two_communicators_to_the_reserve() -> None:
    four, two = plan(preset()).reserve, plan(with_sp(preset(), 2)[0]).reserve
    sp4 = {c.name: (c.ranks, c.local_ranks, c.nvls) for c in four.communicators}
    assert sp4["sp"] == (4, 4, True) and sp4["sp dp"] == (2, 2, False)
    sp2 = {c.name: (c.ranks, c.local_ranks, c.nvls) for c in two.communicators}
    assert sp2["sp"] == (2, 2, False) and sp2["sp dp"] == (4, 4, True)
    one = plan(with_sp(preset(), 1)[0]).reserve
    assert four.total_gib - one.total_gib == pytest.approx(1.5 + 0.5)


# --- the long-context preset ---------------------------------------------------------------


def test_the_long_context_preset_fits_on_8_x_80_gb() -> None:
    config = preset()
    assert config.actor.sp_size == 4 and config.data_parallel_workers == 2
    assert config.rollout.prompt_length + config.rollout.response_length >= 32768
    assert config.rollout.max_model_len >= S
    assert config.model.gradient_checkpointing and config.model.log_prob_chunk_tokens > 0
    for budget in (
        config.actor.ppo_max_token_len_per_gpu,
        config.actor.log_prob_max_token_len_per_gpu,
        config.ref.log_prob_max_token_len_per_gpu,
    ):
        assert budget * config.actor.sp_size >= S  # a group holds a whole sequence
    p = plan(config)
    assert p.fits and not p.warnings, (p.problems, p.warnings)
    assert p.peak_phase == "rollout/generate" and p.margin_gib > p.reserve.uncertainty_gib
    print(f"\n{PRESET}: peak {p.peak_gib:.2f} GiB at {p.peak_phase}, margin {p.margin_gib:+.2f}")
    # Without sp the same 32k sequences fit too, at 4 x a rank's activations.
    one = plan(with_sp(config, 1)[0])
    assert one.fits
    assert one.phases["update/backward"].peak_gib > p.phases["update/backward"].peak_gib + 10
    launcher = REPO / "examples" / "run_qwen2_5_7b_longctx_8gpu.sh"
    assert os.access(launcher, os.X_OK)
    assert f"--config-name {PRESET}" in launcher.read_text()


def test_sp_sizes_follow_the_head_rule_and_the_node() -> None:
    """Qwen2.5-7B's 28 query heads: not 8; Qwen3-8B's 32 (8 kv heads): 2, 4 and 8; the
    30B mixture of experts: none (sp does not run MoE)."""
    config = preset()
    assert sp_sizes(config, model_shape("Qwen2.5-7B")) == [2, 4]
    assert sp_sizes(config, model_shape("Qwen3-8B")) == [2, 4, 8]
    assert sp_sizes(config, model_shape("Qwen3-30B-A3B")) == []
    assert sp_sizes(preset("model.use_remove_padding=false", "actor.sp_size=1"), qwen7b()) == []
    # a budget is halved no lower than a sequence per group: S / 4 is the preset's already
    assert _values(config, qwen7b(), "actor.ppo_max_token_len_per_gpu", 0) == []


def qwen7b() -> ModelShape:
    return model_shape("Qwen2.5-7B")


# --- the longest response ---------------------------------------------------------------------


@pytest.mark.parametrize("model", ["Qwen2.5-7B", "Qwen3-8B"])
def test_sp_fits_a_strictly_longer_response_on_8_x_80_gb(model: str) -> None:
    fits = longest_responses(preset(), model_shape(model), 80.0, gpu="h100")
    by_sp = {fit.sp: fit for fit in fits}
    assert set(by_sp) == {1, *sp_sizes(preset(), model_shape(model))}
    print(f"\n{model}: " + ", ".join(f"sp {f.sp}: {f.response_length:,}" for f in fits))
    one, four = by_sp[1], by_sp[4]
    assert one.response_length >= 32768  # the preset's 30,720 fits without sp too
    assert four.response_length > 3 * one.response_length  # about 4 x, less the all-to-all
    assert by_sp[2].response_length > one.response_length
    for fit in fits:  # the search's answer: fits, one step more does not
        assert fit.plan is not None and fit.plan.fits and not fit.at_limit
        assert fit.response_length % fit.step == 0
        config = with_sp(preset(), fit.sp)[0]
        assert plan(with_response(config, fit.response_length)[0], model).fits
        assert not plan(with_response(config, fit.response_length + fit.step)[0], model).fits
        assert fit.limited_by
        # the length to rely on before the reserve is measured: clear of its uncertainty
        clear = plan(with_response(config, fit.clear_response_length)[0], model)
        assert 0 < fit.clear_response_length <= fit.response_length
        assert clear.margin_gib >= clear.reserve.uncertainty_gib and not clear.warnings
    text = format_longest(fits, 4)
    assert "actor.sp_size=4: " in text and "<-- the config's" in text


def test_the_overrides_of_a_longest_fit_rebuild_its_plan() -> None:
    fit = longest_responses(preset(), qwen7b(), 80.0, sizes=(1,))[0]
    assert fit.overrides[0] == "actor.sp_size=1"
    rebuilt = plan(preset(*fit.overrides))
    assert fit.plan is not None and rebuilt.peak_gib == fit.plan.peak_gib
    budgets = [o for o in fit.overrides if "max_token_len" in o]
    seq = 2048 + fit.response_length
    assert budgets and all(int(o.split("=")[1]) == seq for o in budgets)  # one sequence at sp 1


def test_the_search_reports_a_limit_and_a_length_that_never_fits() -> None:
    small = longest_responses(preset(), qwen7b(), 80.0, sizes=(4,), limit=8192)[0]
    assert small.at_limit and small.response_length == 8192 and not small.limited_by
    assert "at least 8,192 tokens" in format_longest([small], 4)
    none = longest_responses(preset(), qwen7b(), 16.0, sizes=(4,))[0]
    assert none.response_length == 0 and none.plan is None and none.limited_by
    assert "none, not even 1,024 tokens" in format_longest([none], 4)


# --- --suggest and the CLI ---------------------------------------------------------------------


def test_suggest_proposes_sp_for_a_response_only_sp_fits() -> None:
    """131,072-token sequences at sp = 1: the update's activations of one sequence do not fit
    one GPU, and no offload, checkpointing or budget helps (a budget holds one sequence);
    sp = 2 with the budgets halved (the same tokens per group) does."""
    long = with_response(with_sp(preset(), 1)[0], 131072 - 2048)[0]
    base = plan(long)
    assert not base.fits and base.peak_phase == "update/backward"
    found = suggest(long, qwen7b(), 80.0, gpu="h100")
    assert found and all(s.plan.fits for s in found)
    first = found[0]
    assert first.overrides[0] == "actor.sp_size=2"
    assert "actor.ppo_max_token_len_per_gpu=65536" in first.overrides
    assert first.config.actor.sp_size == 2


def test_the_cli_prints_the_longest_responses_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--config-name", PRESET, "--model", "Qwen3-8B", "--longest"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "Longest response that fits" in out and "actor.sp_size=8: " in out
    assert main([*args, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    longest = {row["sp"]: row for row in data["longest"]}
    assert set(longest) == {1, 2, 4, 8}
    assert longest[8]["response_length"] > longest[1]["response_length"]
    one_sp = ["actor.sp_size=1", "rollout.response_length=129024", "rollout.max_model_len=131072"]
    one_sp += [f"{k}=131072" for k in ("actor.ppo_max_token_len_per_gpu",)]
    one_sp += [f"{k}=131072" for k in ("actor.log_prob_max_token_len_per_gpu",)]
    one_sp += ["ref.log_prob_max_token_len_per_gpu=131072"]
    assert main(["--config-name", PRESET, "--model", "Qwen2.5-7B", "--suggest", *one_sp]) == 0
    assert "1. actor.sp_size=2 actor.ppo_max_token_len_per_gpu=65536" in capsys.readouterr().out


def test_a_config_invalid_at_some_sp_is_named() -> None:
    fit = longest_responses(preset(), qwen7b(), 80.0, sizes=(3,))[0]
    assert fit.error is not None and fit.response_length == 0
    assert "not valid for this config" in format_longest([fit], 4)
    assert isinstance(fit, LongestFit)


# --- the Qwen3-8B preset -------------------------------------------------------------------------


def test_the_qwen3_8b_preset_counts_its_parameters_by_hand() -> None:
    h, inter, layers, q, kv, d, v = 4096, 12288, 36, 32 * 128, 8 * 128, 128, 151936
    attention = h * q + 2 * h * kv + q * h + 2 * d  # q, k, v, o (no bias); q_norm, k_norm
    layer = attention + 3 * h * inter + 2 * h  # gate, up, down; the two RMSNorms
    total = 2 * v * h + layers * layer + h  # untied embedding and LM head, final norm
    shape = model_shape("Qwen3-8B")
    assert shape.num_params == total == 8_190_735_360  # "8.2B"
    assert shape.largest_layer == layer and shape.root_params == 2 * v * h + h
    assert (shape.num_attention_heads, shape.num_kv_heads, shape.head_dim) == (32, 8, 128)
    assert not shape.tied_embeddings and shape.num_experts == 0
    assert shape.kv_bytes_per_token(2) == 2 * layers * 4 * d * 2  # 8 kv heads over tp 2
