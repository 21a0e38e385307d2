"""`actor.policy_loss` from the config to the update: the field is validated naming itself,
PolicyTrainer runs every loss on a real (tiny, unsharded) HF model with the same step however
the batch is split into micro-batches, and the loss metrics fold over micro-batches (means by
token share, `*_max` / `*_min` as extremes)."""

from __future__ import annotations

import copy
import dataclasses
from typing import get_args, get_type_hints

import pytest
import torch
from transformers import AutoModelForCausalLM

from hybrid.algorithms.policy_objectives import POLICY_LOSSES
from hybrid.data import Batch
from hybrid.data.sample import position_ids_from_mask
from hybrid.models import TinyModelConfig, build_tiny_model
from hybrid.workers.config import ActorConfig, OptimConfig, WorkerSpec
from hybrid.workers.forward import PassConfig
from hybrid.workers.policy import PolicyTrainer, fold_loss_metrics

pytestmark = pytest.mark.unit

NO_CLIP = OptimConfig(max_grad_norm=1e9)
EXTRA_METRICS = {
    "vanilla": {"actor/pg_clipfrac", "actor/pg_clipfrac_lower"},
    "gspo": {"actor/pg_clipfrac", "actor/gspo_seq_ratio_max", "actor/gspo_seq_ratio_min"},
    "gspo_token": {"actor/pg_clipfrac", "actor/gspo_seq_ratio_mean"},
    "cispo": {"actor/pg_clipfrac", "actor/cispo_clipfrac_high", "actor/cispo_clipfrac_low"},
    "sapo": {"actor/sapo_gate_weight_mean"},
}


def test_the_config_field_offers_exactly_the_losses() -> None:
    hint = get_type_hints(ActorConfig)["policy_loss"]
    assert get_args(hint) == POLICY_LOSSES
    assert ActorConfig().policy_loss == "vanilla"


def test_a_loss_we_do_not_have_is_refused_naming_the_field() -> None:
    with pytest.raises(ValueError, match=r"actor\.policy_loss must be one of .*got 'grpo'"):
        ActorConfig(policy_loss="grpo")  # type: ignore[arg-type]


@pytest.mark.parametrize("field", ["sapo_tau_pos", "sapo_tau_neg"])
def test_sapo_temperatures_must_be_positive(field: str) -> None:
    sapo = ActorConfig(policy_loss="sapo")
    with pytest.raises(ValueError, match=rf"actor\.{field} must be > 0, got 0\.0"):
        dataclasses.replace(sapo, **{field: 0.0})  # type: ignore[arg-type]


def test_the_papers_settings_are_accepted() -> None:
    ActorConfig(policy_loss="gspo", clip_ratio_low=3e-4, clip_ratio_high=4e-4)
    ActorConfig(policy_loss="cispo", clip_ratio_low=1.0, clip_ratio_high=0.28)  # no lower bound
    ActorConfig(policy_loss="sapo", sapo_tau_pos=1.0, sapo_tau_neg=1.05)


def test_fold_loss_metrics_by_hand() -> None:
    parts = [
        (0.75, {"actor/pg_clipfrac": 0.2, "actor/x_max": 1.5, "actor/x_min": 0.9}),
        (0.25, {"actor/pg_clipfrac": 0.6, "actor/x_max": 1.1, "actor/x_min": 0.7}),
        (0.0, {"actor/pg_clipfrac": 0.0, "actor/x_max": 9.0, "actor/x_min": 0.0}),  # no tokens
    ]
    assert fold_loss_metrics(parts) == {
        "actor/pg_clipfrac": pytest.approx(0.75 * 0.2 + 0.25 * 0.6),  # 0.3
        "actor/x_max": 1.5,  # the empty micro-batch's neutral value does not count
        "actor/x_min": 0.7,
    }
    # With no tokens anywhere the extremes are what the empty calls report.
    assert fold_loss_metrics([(0.0, {"actor/x_max": 1.0})]) == {"actor/x_max": 1.0}


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> torch.nn.Module:
    path = build_tiny_model(
        tmp_path_factory.mktemp("m"), TinyModelConfig.preset("tiny", dtype="float32"), seed=0
    )
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


def _batch(with_old: bool = True, rows: int = 4, prompt: int = 3, response: int = 4) -> Batch:
    """Rows with distinct lengths (row 0 has 2 response tokens), old log-probs off the model's
    so that every ratio differs from 1 (unless with_old is False: on-policy)."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 200, (rows, prompt + response), generator=g)
    mask = torch.ones_like(ids)
    response_mask = torch.ones((rows, response), dtype=torch.long)
    response_mask[0, 2:] = 0
    mask[0, prompt + 2 :] = 0
    log_probs = -torch.rand((rows, response), generator=g) - 4.0
    tensors = {
        "input_ids": ids,
        "attention_mask": mask,
        "position_ids": position_ids_from_mask(mask),
        "responses": ids[:, prompt:],
        "response_mask": response_mask,
        "rollout_log_probs": log_probs,
        "advantages": torch.tensor([1.0, -1.0, 0.5, -0.5]),
    }
    if with_old:
        tensors["old_log_probs"] = log_probs
    return Batch.from_dict(tensors)


def _update(
    model: torch.nn.Module, config: ActorConfig, batch: Batch
) -> tuple[dict[str, float], torch.nn.Module]:
    fresh = copy.deepcopy(model)
    optimizer = torch.optim.SGD(fresh.parameters(), lr=1e-2)
    passes = PassConfig(micro_batch_size=config.micro_batch_size)
    return PolicyTrainer(fresh, optimizer, config, WorkerSpec(), passes).update(batch), fresh


# The batch's old log-probs lie above the model's (ratios ~0.2 to 0.45): with these bands the
# clip of vanilla, GSPO and CISPO (floor 0.35) acts on some tokens, so the check covers both
# branches; SAPO's gate is well below 1 there.
SETTINGS = {
    "vanilla": {"clip_ratio_low": 0.2, "clip_ratio_high": 0.2},
    "gspo": {"clip_ratio_low": 3e-4, "clip_ratio_high": 4e-4},
    "gspo_token": {"clip_ratio_low": 3e-4, "clip_ratio_high": 4e-4},
    "cispo": {"clip_ratio_low": 0.65, "clip_ratio_high": 0.28},
    "sapo": {},
}


@pytest.mark.parametrize("name", POLICY_LOSSES)
def test_every_loss_steps_alike_whatever_the_micro_batch_size(
    model: torch.nn.Module, name: str
) -> None:
    base = ActorConfig(policy_loss=name, optim=NO_CLIP, **SETTINGS[name])  # type: ignore[arg-type]
    for mode in ("token-mean", "seq-mean-token-mean"):
        whole, a = _update(model, dataclasses.replace(base, loss_agg_mode=mode), _batch())
        split, b = _update(
            model, dataclasses.replace(base, loss_agg_mode=mode, micro_batch_size=1), _batch()
        )
        assert EXTRA_METRICS[name] | {"actor/ppo_kl"} <= set(whole), name
        for key, value in whole.items():
            if key.startswith("actor/") and key != "actor/lr":
                assert split[key] == pytest.approx(value, rel=1e-4, abs=1e-6), (mode, key)
        assert whole["actor/grad_norm"] > 0
        if "actor/pg_clipfrac" in whole:
            assert 0 < whole["actor/pg_clipfrac"] < 1, (mode, name)
        for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
            assert torch.allclose(pa, pb, atol=1e-6), (mode, name)


@pytest.mark.parametrize("name", POLICY_LOSSES)
def test_on_policy_every_ratio_is_one(model: torch.nn.Module, name: str) -> None:
    # Without old log-probs the update's own (detached) forward is the old policy: r = 1.
    config = ActorConfig(policy_loss=name)  # type: ignore[arg-type]
    metrics, _ = _update(model, config, _batch(with_old=False))
    assert metrics["actor/ppo_kl"] == 0.0
    if "actor/pg_clipfrac" in EXTRA_METRICS[name]:
        assert metrics["actor/pg_clipfrac"] == 0.0
    if name.startswith("gspo"):
        assert metrics["actor/gspo_seq_ratio_max"] == metrics["actor/gspo_seq_ratio_min"] == 1.0
    if name == "sapo":
        assert metrics["actor/sapo_gate_weight_mean"] == pytest.approx(1.0)
