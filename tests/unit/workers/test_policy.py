"""PolicyTrainer on a real (tiny, unsharded) HF model in one process: the loss terms compose,
TIS reweights, missing inputs are named, and the micro-batch size does not change the step."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM

from hybrid.data import Batch
from hybrid.models import TinyModelConfig, build_tiny_model
from hybrid.workers.config import ActorConfig
from hybrid.workers.forward import PassConfig, score_responses
from hybrid.workers.policy import PolicyTrainer
from hybrid.workers.sequences import position_ids_from_mask

pytestmark = pytest.mark.unit


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
    model: torch.nn.Module, config: ActorConfig, batch: Batch, passes: PassConfig | None = None
) -> tuple[dict[str, float], torch.nn.Module]:
    fresh = copy.deepcopy(model)
    # SGD: the step is the gradient itself (AdamW would blow rounding noise up to lr-sized steps).
    optimizer = torch.optim.SGD(fresh.parameters(), lr=1e-2)
    passes = passes or PassConfig(micro_batch_size=config.micro_batch_size)
    return PolicyTrainer(fresh, optimizer, config, passes).update(batch), fresh


def _same_step(a: torch.nn.Module, b: torch.nn.Module, atol: float = 1e-6) -> bool:
    return all(
        torch.allclose(pa, pb, atol=atol)
        for pa, pb in zip(a.parameters(), b.parameters(), strict=True)
    )


def test_micro_batch_size_does_not_change_the_step(model: torch.nn.Module) -> None:
    whole, a = _update(model, ActorConfig(micro_batch_size=4, max_grad_norm=1e9), _batch())
    split, b = _update(model, ActorConfig(micro_batch_size=1, max_grad_norm=1e9), _batch())
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
    config = ActorConfig(micro_batch_size=2, max_grad_norm=1e9, entropy_coeff=0.01)
    reference, a = _update(model, config, _batch(), PassConfig(micro_batch_size=4))
    got, b = _update(model, config, _batch(), passes)
    for key in ("actor/pg_loss", "actor/entropy", "actor/grad_norm"):
        assert got[key] == pytest.approx(reference[key], rel=1e-5, abs=1e-6), key
    assert _same_step(a, b)


def test_an_on_policy_update_skips_the_old_log_prob_pass(model: torch.nn.Module) -> None:
    batch = _batch()
    config = ActorConfig(micro_batch_size=2, max_grad_norm=1e9)
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
    with_tis, _ = _update(model, ActorConfig(micro_batch_size=2, tis_cap=1.2), _batch())
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
        _update(model, ActorConfig(tis_cap=2.0), batch)
