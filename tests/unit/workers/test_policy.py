"""PolicyTrainer on a real (tiny, unsharded) HF model in one process: the loss terms compose,
TIS reweights, decoupled PPO reweights and drops tokens above its cap, IcePop drops tokens
outside its band, sequence-level masked IS weighs and drops whole rows, the on-policy pass
reports the rollout/trainer mismatch, missing inputs are named, and the micro-batch size does
not change the step."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from transformers import AutoModelForCausalLM

from hybrid.algorithms.off_policy import mismatch_stats
from hybrid.data import Batch
from hybrid.data.sample import position_ids_from_mask
from hybrid.models import TinyModelConfig, build_tiny_model
from hybrid.workers.config import ActorConfig, OptimConfig, WorkerSpec
from hybrid.workers.forward import PassConfig, score_responses
from hybrid.workers.policy import PolicyTrainer

pytestmark = pytest.mark.unit

NO_CLIP = OptimConfig(max_grad_norm=1e9)
"""The optimizer config of tests that compare steps: no gradient clipping."""


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> torch.nn.Module:
    path = build_tiny_model(
        tmp_path_factory.mktemp("m"), TinyModelConfig.preset("tiny", dtype="float32"), seed=0
    )
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


def _batch(rows: int = 4, prompt: int = 3, response: int = 4) -> Batch:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 200, (rows, prompt + response), generator=g)
    mask = torch.ones_like(ids)
    response_mask = torch.ones((rows, response), dtype=torch.long)
    response_mask[0, 2:] = 0
    mask[0, prompt + 2 :] = 0
    log_probs = -torch.rand((rows, response), generator=g) - 4.0
    return Batch.from_dict(
        {
            "input_ids": ids,
            "attention_mask": mask,
            "position_ids": position_ids_from_mask(mask),
            "responses": ids[:, prompt:],
            "response_mask": response_mask,
            "old_log_probs": log_probs,
            "rollout_log_probs": log_probs - 0.5,
            "ref_log_prob": log_probs,
            "advantages": torch.tensor([1.0, -1.0, 0.5, -0.5]),
        }
    )


def _update(
    model: torch.nn.Module,
    config: ActorConfig,
    batch: Batch,
    passes: PassConfig | None = None,
    spec: WorkerSpec | None = None,
) -> tuple[dict[str, float], torch.nn.Module]:
    """One update of a copy of `model`; `spec`: the trainer's derived values (default: the
    whole batch in one step, no off-policy correction)."""
    fresh = copy.deepcopy(model)
    # SGD: the step is the gradient itself (AdamW would blow rounding noise up to lr-sized steps).
    optimizer = torch.optim.SGD(fresh.parameters(), lr=1e-2)
    passes = passes or PassConfig(micro_batch_size=config.micro_batch_size)
    trainer = PolicyTrainer(fresh, optimizer, config, spec or WorkerSpec(), passes)
    return trainer.update(batch), fresh


def _same_step(a: torch.nn.Module, b: torch.nn.Module, atol: float = 1e-6) -> bool:
    return all(
        torch.allclose(pa, pb, atol=atol)
        for pa, pb in zip(a.parameters(), b.parameters(), strict=True)
    )


def test_micro_batch_size_does_not_change_the_step(model: torch.nn.Module) -> None:
    whole, a = _update(model, ActorConfig(micro_batch_size=4, optim=NO_CLIP), _batch())
    split, b = _update(model, ActorConfig(micro_batch_size=1, optim=NO_CLIP), _batch())
    assert whole["actor/pg_loss"] == pytest.approx(split["actor/pg_loss"], abs=1e-6)
    assert whole["actor/grad_norm"] == pytest.approx(split["actor/grad_norm"], rel=1e-4)
    assert _same_step(a, b)


@pytest.mark.parametrize(
    "passes",
    [
        PassConfig(micro_batch_size=2, packed=False, chunk_tokens=0),
        PassConfig(micro_batch_size=2, packed=True, chunk_tokens=3),
        PassConfig(micro_batch_size=2, packed=True, chunk_tokens=3, max_tokens=14),
    ],
    ids=["padded full logits", "packed chunked", "packed chunked token budget"],
)
def test_the_step_does_not_depend_on_how_the_pass_runs(
    model: torch.nn.Module, passes: PassConfig
) -> None:
    config = ActorConfig(micro_batch_size=2, optim=NO_CLIP, entropy_coeff=0.01)
    reference, a = _update(model, config, _batch(), PassConfig(micro_batch_size=4))
    got, b = _update(model, config, _batch(), passes)
    for key in ("actor/pg_loss", "actor/entropy", "actor/grad_norm"):
        assert got[key] == pytest.approx(reference[key], rel=1e-5, abs=1e-6), key
    assert _same_step(a, b)


def test_an_on_policy_update_skips_the_old_log_prob_pass(model: torch.nn.Module) -> None:
    batch = _batch()
    config = ActorConfig(micro_batch_size=2, optim=NO_CLIP)
    passes = PassConfig(micro_batch_size=2)
    current = score_responses(model, batch, passes, with_entropy=True)
    kept = [key for key in batch.keys() if key != "old_log_probs"]  # noqa: SIM118 (a Batch)
    without = batch.select(kept)
    with_old = without.union(Batch.from_dict({"old_log_probs": current["log_probs"]}))
    separate, a = _update(model, config, with_old, passes)
    skipped, b = _update(model, config, without, passes)
    assert skipped["actor/pg_loss"] == pytest.approx(separate["actor/pg_loss"], abs=1e-6)
    assert skipped["actor/pg_clipfrac"] == 0.0  # the ratio is exactly 1
    assert _same_step(a, b)
    # The skipped pass's metrics come from the update's own forward.
    mask = batch.tensors["response_mask"].bool()
    gaps = (batch.tensors["rollout_log_probs"] - current["log_probs"]).abs()[mask]
    assert skipped["rollout/logprob_diff_max"] == pytest.approx(float(gaps.max()), rel=1e-5)
    assert skipped["rollout/logprob_diff_mean"] == pytest.approx(float(gaps.mean()), rel=1e-5)
    entropy_old = float(current["entropy"][mask].mean())
    assert skipped["actor/entropy_old"] == pytest.approx(entropy_old, rel=1e-5)
    # Decoupled modes mark the tokens sampled by the held weights: only those are compared.
    fresh = torch.zeros_like(batch.tensors["response_mask"])
    fresh[2:, 1:] = 1  # rows 2-3 from their second token
    with_fresh = without.union(Batch.from_dict({"fresh_mask": fresh}))
    marked, _ = _update(model, config, with_fresh, passes)
    fresh_gaps = (batch.tensors["rollout_log_probs"] - current["log_probs"]).abs()[fresh.bool()]
    assert marked["rollout/logprob_diff_max"] == pytest.approx(float(fresh_gaps.max()), rel=1e-5)
    assert marked["rollout/logprob_diff_mean"] == pytest.approx(float(fresh_gaps.mean()), rel=1e-5)
    # More than one optimizer step needs the old log-probs of before the first one.
    with pytest.raises(KeyError, match="old_log_probs unless the update is on-policy"):
        _update(model, ActorConfig(micro_batch_size=2, ppo_epochs=2), without, passes)


def test_kl_entropy_and_tis_compose(model: torch.nn.Module) -> None:
    base, _ = _update(model, ActorConfig(micro_batch_size=2), _batch())
    assert base["actor/kl_loss"] == 0.0 and base["actor/entropy"] > 0
    with_kl, _ = _update(
        model, ActorConfig(micro_batch_size=2, use_kl_loss=True, kl_loss_type="k1"), _batch()
    )
    assert with_kl["actor/kl_loss"] != 0.0
    with_tis, _ = _update(
        model, ActorConfig(micro_batch_size=2), _batch(), spec=WorkerSpec(tis_cap=1.2)
    )
    # exp(old - rollout) = exp(0.5) = 1.65, capped at 1.2: every advantage is scaled by 1.2.
    assert with_tis["actor/pg_loss"] == pytest.approx(1.2 * base["actor/pg_loss"], rel=1e-5)


def test_missing_inputs_are_named(model: torch.nn.Module) -> None:
    batch = _batch().select(
        [
            "input_ids",
            "attention_mask",
            "position_ids",
            "responses",
            "response_mask",
            "old_log_probs",
            "advantages",
        ]
    )
    with pytest.raises(KeyError, match="ref_log_prob"):
        _update(model, ActorConfig(use_kl_loss=True), batch)
    with pytest.raises(KeyError, match="rollout_log_probs"):
        _update(model, ActorConfig(), batch, spec=WorkerSpec(tis_cap=2.0))
    with pytest.raises(KeyError, match="rollout_log_probs"):
        _update(model, ActorConfig(), batch, spec=WorkerSpec(decoupled_cap=2.0))


def _with(batch: Batch, **tensors: torch.Tensor) -> Batch:
    """`batch` with some tensors replaced."""
    kept = [key for key in batch.keys() if key not in tensors]  # noqa: SIM118 (a Batch)
    return batch.select(kept).union(Batch.from_dict(tensors))


def test_decoupled_with_a_large_cap_scales_the_update_by_the_weights(
    model: torch.nn.Module,
) -> None:
    # exp(old - rollout) = exp(0.5) = 1.6487 on every token, below the cap: nothing dropped.
    config = ActorConfig(micro_batch_size=2, optim=NO_CLIP)
    base, plain = _update(model, config, _batch())
    decoupled, a = _update(model, config, _batch(), spec=WorkerSpec(decoupled_cap=10.0))
    assert decoupled["actor/pg_loss"] == pytest.approx(
        math.exp(0.5) * base["actor/pg_loss"], rel=1e-5
    )
    assert decoupled["actor/grad_norm"] == pytest.approx(
        math.exp(0.5) * base["actor/grad_norm"], rel=1e-5
    )
    assert decoupled["actor/decoupled_kept_frac"] == 1.0
    assert "actor/decoupled_kept_frac" not in base
    # SGD: the step is the gradient, so it is the plain step times the weight ...
    for p0, p1, p2 in zip(model.parameters(), plain.parameters(), a.parameters(), strict=True):
        torch.testing.assert_close(p2 - p0, math.exp(0.5) * (p1 - p0), atol=1e-6, rtol=1e-4)
    # ... and, with no weight above either cap, TIS's step.
    _, b = _update(model, config, _batch(), spec=WorkerSpec(tis_cap=10.0))
    assert _same_step(a, b)


@pytest.mark.parametrize("loss_agg_mode", ["token-mean", "seq-mean-token-mean"])
def test_decoupled_drops_the_tokens_above_the_cap(
    model: torch.nn.Module, loss_agg_mode: str
) -> None:
    batch = _batch()
    old = batch.tensors["old_log_probs"]
    # old - rollout = 0.5 (weight 1.65, kept) or 2.0 (weight 7.39 > cap 2, dropped)
    gap = torch.tensor(
        [[0.5, 2.0, 2.0, 2.0], [0.5, 0.5, 2.0, 2.0], [2.0, 0.5, 0.5, 0.5], [0.5, 0.5, 0.5, 0.5]]
    )
    batch = _with(batch, rollout_log_probs=old - gap)
    config = ActorConfig(micro_batch_size=2, optim=NO_CLIP, loss_agg_mode=loss_agg_mode)
    got, a = _update(model, config, batch, spec=WorkerSpec(decoupled_cap=2.0))
    # Response tokens: 2 (row 0 has two) + 4 + 4 + 4 = 14; kept: 1 + 2 + 3 + 4 = 10.
    assert got["actor/decoupled_kept_frac"] == pytest.approx(10 / 14)
    # The same step without a correction: per-token advantages A * 1.65 on kept tokens, 0 on
    # dropped ones, and the full mask, so every normaliser (per-row lengths too) is unchanged.
    weights = torch.where(gap == 0.5, math.exp(0.5), 0.0)
    advantages = batch.tensors["advantages"].unsqueeze(-1) * weights
    expected, b = _update(model, config, _with(batch, advantages=advantages))
    for key in ("actor/pg_loss", "actor/grad_norm"):
        assert got[key] == pytest.approx(expected[key], rel=1e-5, abs=1e-7), key
    assert _same_step(a, b)


def test_decoupled_with_a_tiny_cap_drops_every_token(model: torch.nn.Module) -> None:
    # every weight is exp(0.5) > 1e-3: no token is left for the pg term (the only term here)
    config = ActorConfig(micro_batch_size=2, optim=NO_CLIP)
    got, updated = _update(model, config, _batch(), spec=WorkerSpec(decoupled_cap=1e-3))
    assert got["actor/decoupled_kept_frac"] == 0.0
    assert got["actor/pg_loss"] == 0.0
    assert got["actor/grad_norm"] == 0.0
    assert _same_step(model, updated, atol=0.0)


def test_decoupled_on_policy_uses_the_update_s_own_log_probs(model: torch.nn.Module) -> None:
    # Without old_log_probs the proximal policy is this pass's log-probs; with no weight above
    # either cap, decoupled PPO and TIS take the same step.
    kept = [key for key in _batch().keys() if key != "old_log_probs"]  # noqa: SIM118 (a Batch)
    batch = _batch().select(kept)
    config = ActorConfig(micro_batch_size=2, optim=NO_CLIP)
    decoupled, a = _update(model, config, batch, spec=WorkerSpec(decoupled_cap=1e6))
    tis, b = _update(model, config, batch, spec=WorkerSpec(tis_cap=1e6))
    assert decoupled["actor/decoupled_kept_frac"] == 1.0
    assert decoupled["actor/pg_loss"] == pytest.approx(tis["actor/pg_loss"], rel=1e-6)
    assert _same_step(a, b)


def test_icepop_drops_the_tokens_outside_the_band(model: torch.nn.Module) -> None:
    batch = _batch()
    old = batch.tensors["old_log_probs"]
    # old - rollout = 0.5 (weight 1.65, kept), 2.0 (7.39 > cap 2) or -2.0 (0.14 < 1/2): dropped
    gap = torch.tensor(
        [[0.5, -2.0, 2.0, 2.0], [0.5, 0.5, 2.0, -2.0], [-2.0, 0.5, 0.5, 0.5], [0.5] * 4]
    )
    batch = _with(batch, rollout_log_probs=old - gap)
    config = ActorConfig(micro_batch_size=2, optim=NO_CLIP)
    got, a = _update(model, config, batch, spec=WorkerSpec(icepop_cap=2.0))
    # Response tokens: 2 + 4 + 4 + 4 = 14; kept: 1 + 2 + 3 + 4 = 10.
    assert got["actor/icepop_kept_frac"] == pytest.approx(10 / 14)
    assert "actor/decoupled_kept_frac" not in got
    weights = torch.where(gap == 0.5, math.exp(0.5), 0.0)
    advantages = batch.tensors["advantages"].unsqueeze(-1) * weights
    expected, b = _update(model, config, _with(batch, advantages=advantages))
    for key in ("actor/pg_loss", "actor/grad_norm"):
        assert got[key] == pytest.approx(expected[key], rel=1e-5, abs=1e-7), key
    assert _same_step(a, b)


def test_seq_mask_is_weighs_and_drops_whole_rows(model: torch.nn.Module) -> None:
    batch = _batch()
    old = batch.tensors["old_log_probs"]
    # Mean log-ratio over each row's response tokens (row 0 has two; its padding's 3.0 is
    # ignored): 0.5 (kept, weight e^0.5), 1.0 (e > cap 2: dropped), 0.25 (kept, e^0.25),
    # -1.0 (1/e < 1/2: dropped).
    gap = torch.tensor(
        [[0.5, 0.5, 3.0, 3.0], [1.0] * 4, [0.5, 0.5, 0.5, -0.5], [-1.0] * 4]
    )
    batch = _with(batch, rollout_log_probs=old - gap)
    config = ActorConfig(micro_batch_size=2, optim=NO_CLIP, loss_agg_mode="seq-mean-token-mean")
    got, a = _update(model, config, batch, spec=WorkerSpec(seq_mask_cap=2.0))
    assert got["actor/seq_mask_is_kept_frac"] == pytest.approx(6 / 14)
    row_weights = torch.tensor([math.exp(0.5), 0.0, math.exp(0.25), 0.0])
    advantages = (batch.tensors["advantages"] * row_weights).unsqueeze(-1).expand(4, 4)
    expected, b = _update(model, config, _with(batch, advantages=advantages.contiguous()))
    for key in ("actor/pg_loss", "actor/grad_norm"):
        assert got[key] == pytest.approx(expected[key], rel=1e-5, abs=1e-7), key
    assert _same_step(a, b)


def test_the_on_policy_pass_reports_the_mismatch(model: torch.nn.Module) -> None:
    # Without old_log_probs the update's own pass gives the trainer's side of the ratio.
    batch = _batch()
    passes = PassConfig(micro_batch_size=2)
    current = score_responses(model, batch, passes, with_entropy=True)["log_probs"]
    without = batch.select([key for key in batch.keys() if key != "old_log_probs"])  # noqa: SIM118
    config = ActorConfig(micro_batch_size=2, optim=NO_CLIP)
    got, _ = _update(model, config, without, passes, spec=WorkerSpec(mismatch_cap=1.5))
    mask = batch.tensors["response_mask"]
    expected = mismatch_stats(current, batch.tensors["rollout_log_probs"], mask, {"cap": 1.5})
    assert {k: got[k] for k in expected} == pytest.approx(expected, rel=1e-5)
    assert got["rollout/mismatch_k3"] > 0 and got["rollout/ratio_max"] > got["rollout/ratio_min"]
