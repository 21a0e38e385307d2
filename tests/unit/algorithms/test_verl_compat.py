"""Unit tests for the names and rules a verl config relies on (issue 35, item 5):

- `kl` as verl's name of the k1 estimator, in `algorithm.kl_penalty` and `actor.kl_loss_type`;
- `token-sum` loss aggregation (the masked sum, no normaliser; micro-batches and ranks add up);
- the seq-mean modes over the rows with at least one valid token: a fully masked row changes
  nothing, with local normalisers and with the update's global ones (policy.normalisers);
- `reinforce_plus_plus_baseline`, by hand (single-sample group, all-equal group, length-1
  responses, an empty row) and against a loop written from verl's definition.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import get_args

import pytest
import torch

from hybrid.algorithms.advantages import (
    compute_reinforce_plus_plus_advantages,
    compute_reinforce_plus_plus_baseline_advantages,
)
from hybrid.algorithms.estimators import ESTIMATORS, compute_advantages
from hybrid.algorithms.gae import token_level_rewards
from hybrid.algorithms.kl import KL_KINDS, kl_penalty
from hybrid.algorithms.kl_control import kl_in_reward
from hybrid.algorithms.policy_loss import LOSS_AGG_MODES, aggregate_loss, policy_loss
from hybrid.data import Batch
from hybrid.trainer.compose import compose, to_run_config
from hybrid.trainer.config import AdvEstimator, AlgorithmConfig
from hybrid.workers.config import ActorConfig
from hybrid.workers.policy import normalisers

pytestmark = pytest.mark.unit

SEQ_MEAN_MODES = [mode for mode in LOSS_AGG_MODES if mode.startswith("seq-mean")]

# --- kl: verl's name of k1 ---------------------------------------------------------------------

LOG_PROB = torch.tensor([[-1.0, -2.0, -0.3]], dtype=torch.float64)
REF = torch.tensor([[-1.5, -1.0, -0.3]], dtype=torch.float64)


def test_kl_is_k1_by_hand() -> None:
    # d = log_prob - ref = (0.5, -1.0, 0.0), the k1 estimate itself
    expected = torch.tensor([[0.5, -1.0, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(kl_penalty(LOG_PROB, REF, "kl"), expected)
    assert "kl" in KL_KINDS


def test_kl_in_the_reward_penalty_is_k1() -> None:
    mask = torch.tensor([[1, 1, 0]])
    kl, current = kl_in_reward(LOG_PROB, REF, mask, "kl")
    # the masked third token is 0; the row's token-mean (0.5 - 1.0) / 2 = -0.25
    assert kl.tolist() == [[0.5, -1.0, 0.0]]
    assert current == pytest.approx(-0.25)
    k1, k1_current = kl_in_reward(LOG_PROB, REF, mask, "k1")
    torch.testing.assert_close(kl, k1)
    assert current == k1_current


def test_both_kl_fields_take_kl_and_name_themselves_otherwise() -> None:
    assert AlgorithmConfig(kl_penalty="kl").kl_penalty == "kl"
    assert ActorConfig(kl_loss_type="kl").kl_loss_type == "kl"
    with pytest.raises(ValueError, match=r"algorithm\.kl_penalty"):
        AlgorithmConfig(kl_penalty="full")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"actor\.kl_loss_type"):
        ActorConfig(kl_loss_type="full")  # type: ignore[arg-type]


# --- token-sum ---------------------------------------------------------------------------------

# row 0: tokens 1, 2, 3; row 1: token 4; 9s are padding and must not count
PER_TOKEN = torch.tensor([[1.0, 2.0, 3.0, 9.0], [4.0, 9.0, 9.0, 9.0]])
MASK = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])


def test_token_sum_by_hand_ignores_the_normalisers() -> None:
    # 1 + 2 + 3 + 4 = 10, whatever the mini-batch's counts are
    assert aggregate_loss(PER_TOKEN, MASK, "token-sum").item() == pytest.approx(10.0)
    loss = aggregate_loss(PER_TOKEN, MASK, "token-sum", global_tokens=8, global_seqs=4)
    assert loss.item() == pytest.approx(10.0)
    per_token = PER_TOKEN.clone()
    per_token[0, 3], per_token[1, 1] = float("inf"), float("nan")
    assert aggregate_loss(per_token, MASK, "token-sum").item() == pytest.approx(10.0)


def test_token_sum_policy_loss_by_hand() -> None:
    # log_prob = old: ratio 1, no clipping, l = -A on every token.
    # A = (2, -1): row 0 has 2 tokens (-2 each), row 1 one (+1): -2 - 2 + 1 = -3
    old = torch.zeros(2, 2, dtype=torch.float64)
    advantages = torch.tensor([2.0, -1.0], dtype=torch.float64)
    mask = torch.tensor([[1, 1], [1, 0]])
    loss, _ = policy_loss(old.clone(), old, advantages, mask, loss_agg_mode="token-sum")
    assert loss.item() == pytest.approx(-3.0)


# 4 rows of lengths 1, 3, 2, 4 (T = 4); row i holds i + 1 on its tokens: sums 1, 6, 6, 16
LENGTHS = [1, 3, 2, 4]
SPLIT_MASK = (torch.arange(4).unsqueeze(0) < torch.tensor(LENGTHS).unsqueeze(1)).long()
SPLIT_VALUES = torch.arange(1.0, 5.0, dtype=torch.float64).unsqueeze(1).expand(4, 4)


@pytest.mark.parametrize("rows", [1, 2, 4])
def test_token_sum_micro_batches_add_up(rows: int) -> None:
    values = SPLIT_VALUES.clone().requires_grad_(True)
    full = aggregate_loss(values, SPLIT_MASK, "token-sum")
    assert full.item() == pytest.approx(29.0)
    (full_grad,) = torch.autograd.grad(full, values)
    total = torch.zeros((), dtype=torch.float64)
    for start in range(0, 4, rows):
        total = total + aggregate_loss(
            values[start : start + rows], SPLIT_MASK[start : start + rows], "token-sum",
            global_tokens=10, global_seqs=4,
        )  # fmt: skip
    (split_grad,) = torch.autograd.grad(total, values)
    assert total.item() == pytest.approx(29.0)
    torch.testing.assert_close(split_grad, full_grad)
    # every valid token has gradient 1, padding 0
    torch.testing.assert_close(split_grad, SPLIT_MASK.to(torch.float64))


def test_token_sum_ranks_times_world_size_average_to_the_global_sum() -> None:
    # 2 ranks with 2 rows each: sums 7 and 22. FSDP averages over ranks, each rank scales by
    # the world size: (2 * 7 + 2 * 22) / 2 = 29, the sum over both ranks' tokens.
    ranks = [
        aggregate_loss(SPLIT_VALUES[r : r + 2], SPLIT_MASK[r : r + 2], "token-sum").item()
        for r in (0, 2)
    ]
    assert ranks == [7.0, 22.0]
    assert sum(2 * loss for loss in ranks) / 2 == pytest.approx(29.0)


# --- seq-mean modes: a fully masked row contributes nothing ---------------------------------------

# rows 0 and 1 as PER_TOKEN / MASK above; row 2 fully masked, holding garbage
WITH_EMPTY = torch.tensor(
    [[1.0, 2.0, 3.0, 9.0], [4.0, 9.0, 9.0, 9.0], [float("nan"), 7.0, float("inf"), 7.0]]
)
WITH_EMPTY_MASK = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]])


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("seq-mean-token-sum", 5.0),  # (6 + 4) / 2 non-empty rows, not / 3
        ("seq-mean-token-mean", 3.0),  # (6 / 3 + 4 / 1) / 2
        ("seq-mean-token-sum-norm", 1.25),  # (6 / 4 + 4 / 4) / 2, T = 4
    ],
)
def test_seq_mean_modes_by_hand_with_an_empty_row(mode: str, expected: float) -> None:
    assert aggregate_loss(WITH_EMPTY, WITH_EMPTY_MASK, mode).item() == pytest.approx(expected)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_an_empty_row_changes_neither_loss_nor_gradient(mode: str) -> None:
    with_row = WITH_EMPTY.clone().requires_grad_(True)
    without_row = WITH_EMPTY[:2].clone().requires_grad_(True)
    got = aggregate_loss(with_row, WITH_EMPTY_MASK, mode)
    want = aggregate_loss(without_row, WITH_EMPTY_MASK[:2], mode)
    assert got.item() == want.item()
    (got_grad,) = torch.autograd.grad(got, with_row)
    (want_grad,) = torch.autograd.grad(want, without_row)
    torch.testing.assert_close(got_grad[:2], want_grad)
    assert got_grad[2].tolist() == [0.0] * 4


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("rows", [1, 2, 3])
def test_an_empty_row_with_the_update_s_global_normalisers(mode: str, rows: int) -> None:
    # The normalisers the actor and the critic compute (policy.normalisers, one rank) count
    # the empty row as no sequence, so micro-batches of the 3-row batch (one of them possibly
    # all empty) add up to the 2-row batch's loss.
    mini_with = Batch.from_dict({"response_mask": WITH_EMPTY_MASK})
    mini_without = Batch.from_dict({"response_mask": WITH_EMPTY_MASK[:2]})
    _, tokens, seqs = normalisers(mini_with)
    assert (tokens, seqs) == (4.0, 2.0)
    assert normalisers(mini_without) == normalisers(mini_with)
    total = sum(
        aggregate_loss(
            WITH_EMPTY[start : start + rows], WITH_EMPTY_MASK[start : start + rows], mode,
            global_tokens=tokens, global_seqs=seqs,
        ).item()
        for start in range(0, 3, rows)
    )  # fmt: skip
    assert total == pytest.approx(aggregate_loss(WITH_EMPTY[:2], WITH_EMPTY_MASK[:2], mode).item())


def test_policy_loss_with_an_empty_row_matches_the_batch_without_it() -> None:
    generator = torch.Generator().manual_seed(1)
    old = -torch.rand(3, 4, generator=generator, dtype=torch.float64)
    log_prob = old + 0.3 * torch.randn(3, 4, generator=generator, dtype=torch.float64)
    advantages = torch.randn(3, generator=generator, dtype=torch.float64)
    for mode in SEQ_MEAN_MODES:
        got, _ = policy_loss(log_prob, old, advantages, WITH_EMPTY_MASK, loss_agg_mode=mode)
        want, _ = policy_loss(
            log_prob[:2], old[:2], advantages[:2], WITH_EMPTY_MASK[:2], loss_agg_mode=mode
        )
        assert got.item() == pytest.approx(want.item(), abs=1e-12), mode


# --- reinforce_plus_plus_baseline ------------------------------------------------------------


def whiten_by_hand(values: list[float]) -> list[float]:
    """(x - mean) / sqrt(unbiased var + 1e-8) of a flat list of valid-token values."""
    mean = sum(values) / len(values)
    var = sum((x - mean) ** 2 for x in values) / (len(values) - 1)
    return [(x - mean) / math.sqrt(var + 1e-8) for x in values]


def test_baseline_by_hand_with_a_single_sample_group() -> None:
    # group "a": scores 1, 0 -> mean 0.5 -> centred 0.5, -0.5
    # group "b": one row, score 2 -> no baseline (verl: mean taken as 0) -> centred 2
    # lengths 2, 1, 1: valid-token values 0.5, 0.5, -0.5, 2.0
    #   mean 2.5 / 4 = 0.625; squared deviations 0.015625, 0.015625, 1.265625, 1.890625
    #   unbiased var 3.1875 / 3 = 1.0625
    scores = torch.tensor([1.0, 0.0, 2.0])
    mask = torch.tensor([[1, 1], [1, 0], [1, 0]])
    got = compute_reinforce_plus_plus_baseline_advantages(scores, mask, ["a", "a", "b"])
    std = math.sqrt(1.0625 + 1e-8)
    expected = [[-0.125 / std, -0.125 / std], [-1.125 / std, 0.0], [1.375 / std, 0.0]]
    torch.testing.assert_close(got, torch.tensor(expected), atol=1e-6, rtol=0)
    assert got.dtype == torch.float32
    # the whitened values of a whole batch: mean 0 over its valid tokens
    assert float(got[mask.bool()].sum()) == pytest.approx(0.0, abs=1e-6)


def test_baseline_with_only_singletons_is_reinforce_plus_plus_of_the_outcome() -> None:
    # rollout.n = 1: no baseline anywhere; each row's score on every token, whitened, is
    # REINFORCE++ with gamma = 1 on the score at the last token.
    scores = torch.tensor([1.0, 0.0, 0.5, 3.0])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0], [1, 1, 1]])
    got = compute_reinforce_plus_plus_baseline_advantages(scores, mask, [0, 1, 2, 3])
    rewards = token_level_rewards(scores, mask)
    torch.testing.assert_close(got, compute_reinforce_plus_plus_advantages(rewards, mask, 1.0))


def test_baseline_all_equal_groups() -> None:
    # One group, all scores equal: every centred value is 0, and so is its whitening.
    mask = torch.tensor([[1, 1], [1, 0], [1, 1]])
    got = compute_reinforce_plus_plus_baseline_advantages(torch.full((3,), 0.7), mask, [5, 5, 5])
    assert got.tolist() == [[0.0, 0.0], [0.0, 0.0], [0.0, 0.0]]
    # Beside a group with a spread, the all-equal group's rows sit at (0 - mean) / std:
    # centred values 0, 0 (group x) and 1, -1 (group y), length 1 each:
    #   mean 0, unbiased var (1 + 1) / 3 = 2 / 3
    scores = torch.tensor([1.0, 1.0, 2.0, 0.0])
    got = compute_reinforce_plus_plus_baseline_advantages(
        scores, torch.ones(4, 1), ["x", "x", "y", "y"]
    )
    std = math.sqrt(2 / 3 + 1e-8)
    torch.testing.assert_close(got, torch.tensor([[0.0], [0.0], [1 / std], [-1 / std]]))


def test_baseline_length_one_responses() -> None:
    # two rows of one token in one group: centred +-0.5, mean 0, var (0.25 + 0.25) / 1
    got = compute_reinforce_plus_plus_baseline_advantages(
        torch.tensor([1.0, 0.0]), torch.ones(2, 1), ["g", "g"]
    )
    expected = 0.5 / math.sqrt(0.5 + 1e-8)  # 0.7071068
    torch.testing.assert_close(got, torch.tensor([[expected], [-expected]]))
    # one row, one token: a single valid value whitens to 0 (variance of one value: 0)
    single = compute_reinforce_plus_plus_baseline_advantages(
        torch.tensor([4.0]), torch.ones(1, 1), ["g"]
    )
    assert single.tolist() == [[0.0]]


def test_baseline_empty_row() -> None:
    # group A: row 0 (score 1, one token) and row 1 (no valid token; its outcome is 0 since
    # token_level_rewards gives it none) -> mean 0.5 -> row 0 centred 0.5
    # group B: rows 2, 3 (scores 0, 1, one token each) -> centred -0.5, 0.5
    # valid values 0.5, -0.5, 0.5: mean 1/6, deviations 1/3, -2/3, 1/3, var (2/3) / 2 = 1/3
    # The empty row gets 0 everywhere and stays out of the mean and the variance.
    mask = torch.tensor([[1, 0], [0, 0], [1, 0], [1, 0]])
    rewards = token_level_rewards(torch.tensor([1.0, 7.0, 0.0, 1.0]), mask)
    got = compute_advantages(
        "reinforce_plus_plus_baseline", rewards, mask, ["A", "A", "B", "B"]
    ).advantages
    std = math.sqrt(1 / 3 + 1e-8)
    expected = [[1 / 3 / std, 0.0], [0.0, 0.0], [-2 / 3 / std, 0.0], [1 / 3 / std, 0.0]]
    torch.testing.assert_close(got, torch.tensor(expected))
    assert got[[0, 2, 3], 0].tolist() == pytest.approx(whiten_by_hand([0.5, -0.5, 0.5]))


def verl_reference(
    token_rewards: torch.Tensor, mask: torch.Tensor, uids: list[int]
) -> torch.Tensor:
    """verl's reinforce_plus_plus_baseline step by step, as its definition reads: the summed
    token rewards, minus the group's mean (0 for a group of one), tiled over the response,
    whitened over the mask (mean, unbiased var, eps 1e-8), times the mask."""
    scores = token_rewards.sum(-1).double()
    by_group: dict[int, list[float]] = defaultdict(list)
    for uid, score in zip(uids, scores.tolist(), strict=True):
        by_group[uid].append(score)
    means = {uid: (sum(s) / len(s) if len(s) > 1 else 0.0) for uid, s in by_group.items()}
    centred = torch.tensor([s - means[u] for s, u in zip(scores.tolist(), uids, strict=True)])
    tiled = centred.double().unsqueeze(-1).expand(mask.shape) * mask
    valid = tiled[mask.bool()]
    mean = valid.mean()
    var = ((valid - mean) ** 2).sum() / (valid.numel() - 1)
    return ((tiled - mean) / torch.sqrt(var + 1e-8) * mask).float()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_baseline_matches_verl_s_definition(seed: int) -> None:
    # Random batches of 12 rows in groups of 1 to 4 (not contiguous), every row non-empty
    # (verl's whitening raises otherwise), an outcome score plus a per-token KL penalty.
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 7, (12,), generator=generator)
    mask = (torch.arange(6).unsqueeze(0) < lengths.unsqueeze(1)).long()
    kl = 0.1 * torch.randn(12, 6, generator=generator)
    rewards = token_level_rewards(torch.randn(12, generator=generator), mask, kl, kl_coef=0.5)
    uids = [int(u) for u in torch.randint(0, 5, (12,), generator=generator)]
    got = compute_advantages("reinforce_plus_plus_baseline", rewards, mask, uids).advantages
    torch.testing.assert_close(got, verl_reference(rewards, mask, uids), atol=1e-6, rtol=0)


def test_baseline_refuses_a_mask_that_does_not_fit() -> None:
    with pytest.raises(ValueError, match="response_mask"):
        compute_reinforce_plus_plus_baseline_advantages(torch.zeros(3), torch.ones(2, 4), [0, 0, 1])
    with pytest.raises(ValueError, match="response_mask"):
        compute_reinforce_plus_plus_baseline_advantages(torch.zeros(3), torch.ones(3), [0, 0, 1])


def test_the_estimator_is_a_config_choice() -> None:
    assert set(get_args(AdvEstimator)) == set(ESTIMATORS)
    config = AlgorithmConfig(adv_estimator="reinforce_plus_plus_baseline")
    assert config.adv_estimator == "reinforce_plus_plus_baseline"
    with pytest.raises(ValueError, match=r"algorithm\.adv_estimator"):
        AlgorithmConfig(adv_estimator="reinforce_plus_plus_baselines")  # type: ignore[arg-type]


# --- a verl-style config composes ----------------------------------------------------------

VERL_OVERRIDES = [
    "model.path=some/model",
    "algorithm.kl_penalty=kl",
    "algorithm.use_kl_in_reward=true",
    "actor.use_kl_loss=true",
    "actor.kl_loss_type=kl",
    "actor.loss_agg_mode=token-sum",
    "algorithm.adv_estimator=reinforce_plus_plus_baseline",
]


def test_a_verl_style_config_composes() -> None:
    config = to_run_config(compose("config", VERL_OVERRIDES))
    assert config.algorithm.kl_penalty == "kl"
    assert config.algorithm.adv_estimator == "reinforce_plus_plus_baseline"
    assert config.actor.kl_loss_type == "kl"
    assert config.actor.loss_agg_mode == "token-sum"
