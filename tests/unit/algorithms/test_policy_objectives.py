"""Unit tests for `hybrid.algorithms.policy_objectives` against values worked out by hand from
the papers' formulas: GSPO's sequence ratio and clip (and GSPO-token's equal value with
per-token gradients), CISPO's detached clipped weight (clipped tokens keep their gradient),
SAPO's soft gate and its gradient weight; empty rows, all-equal (zero) advantages as a
single-sample or all-equal group gives them, length-1 responses, and the dispatcher."""

from __future__ import annotations

import math

import pytest
import torch

from hybrid.algorithms.policy_loss import policy_loss
from hybrid.algorithms.policy_objectives import (
    POLICY_LOSSES,
    PolicyLossSettings,
    cispo_loss,
    gspo_loss,
    gspo_token_loss,
    sapo_loss,
    select_policy_loss,
)

pytestmark = pytest.mark.unit

E03 = math.exp(0.3)  # 1.3498588...


def from_ratios(
    ratios: list[list[float]], log_probs: list[list[float]] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(log_prob, old_log_prob), float64, log_prob a leaf that requires grad, with
    exp(log_prob - old_log_prob) == ratios."""
    r = torch.tensor(ratios, dtype=torch.float64)
    if log_probs is None:
        lp = torch.linspace(-2.0, -0.5, r.numel(), dtype=torch.float64).reshape(r.shape)
    else:
        lp = torch.tensor(log_probs, dtype=torch.float64)
    return lp.clone().requires_grad_(True), lp - r.log()


def grad_of(loss: torch.Tensor, log_prob: torch.Tensor) -> torch.Tensor:
    (grad,) = torch.autograd.grad(loss, log_prob)
    return grad


# --- GSPO ------------------------------------------------------------------------------------

# Row 0: ratios (2, 0.5, 1), three valid tokens: s_0 = exp((ln 2 - ln 2 + 0) / 3) = 1.
# Row 1: ratios (e^0.2, e^0.4, junk), two valid: s_1 = exp((0.2 + 0.4) / 2) = e^0.3 = 1.34986.
# A = (-1, +1), clip 0.2 / 0.2:
#   l_0 = max(1 * 1, 1 * clip(1)) = 1              (inside the band)
#   l_1 = max(-1.34986, -clip(1.34986) = -1.2) = -1.2   (clipped)
TWO_ROWS = [[2.0, 0.5, 1.0], [math.exp(0.2), math.exp(0.4), 7.0]]
TWO_MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])
TWO_ADV = torch.tensor([-1.0, 1.0], dtype=torch.float64)


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("seq-mean-token-mean", (1 - 1.2) / 2),  # the paper's: mean over sequences = -0.1
        ("token-mean", (3 * 1 + 2 * -1.2) / 5),  # each row weighed by its length = 0.12
        ("seq-mean-token-sum", (3 * 1 + 2 * -1.2) / 2),  # = 0.3
    ],
)
def test_gspo_hand_values_per_aggregation(mode: str, expected: float) -> None:
    log_prob, old = from_ratios(TWO_ROWS)
    for fn in (gspo_loss, gspo_token_loss):
        loss, metrics = fn(log_prob, old, TWO_ADV, TWO_MASK, 0.2, 0.2, mode)
        assert loss.item() == pytest.approx(expected)
        assert metrics["actor/pg_clipfrac"] == pytest.approx(2 / 5)  # row 1's 2 of 5 tokens
        # -(ln 2 - ln 2 + 0 + 0.2 + 0.4) / 5
        assert metrics["actor/ppo_kl"] == pytest.approx(-0.12)
        # token-weighted: (3 * 1 + 2 * e^0.3) / 5 = 1.13994
        assert metrics["actor/gspo_seq_ratio_mean"] == pytest.approx((3 + 2 * E03) / 5)
        assert metrics["actor/gspo_seq_ratio_max"] == pytest.approx(E03)
        assert metrics["actor/gspo_seq_ratio_min"] == pytest.approx(1.0)


def test_gspo_ignores_what_padding_holds() -> None:
    log_prob, old = from_ratios(TWO_ROWS)
    old = old.detach().clone()
    old[1, 2] = float("nan")  # padding: neither the ratio nor the gradient may see it
    loss, metrics = gspo_loss(log_prob, old, TWO_ADV, TWO_MASK, 0.2, 0.2, "seq-mean-token-mean")
    assert loss.item() == pytest.approx(-0.1)
    assert all(math.isfinite(v) for v in metrics.values())
    assert torch.isfinite(grad_of(loss, log_prob)).all()


def test_gspo_length_one_rows_are_token_level_ppo_clip() -> None:
    # |y| = 1: s = r. r = 1.5, A = 1: max(-1.5, -1.2) = -1.2; r = 0.5, A = -1: max(0.5, 0.8) = 0.8
    log_prob, old = from_ratios([[1.5, 9.0], [0.5, 9.0]])
    mask = torch.tensor([[1, 0], [1, 0]])
    adv = torch.tensor([1.0, -1.0], dtype=torch.float64)
    loss, metrics = gspo_loss(log_prob, old, adv, mask, 0.2, 0.2, "token-mean")
    assert loss.item() == pytest.approx((-1.2 + 0.8) / 2)
    assert metrics["actor/pg_clipfrac"] == 1.0
    assert (metrics["actor/gspo_seq_ratio_max"], metrics["actor/gspo_seq_ratio_min"]) == (
        pytest.approx(1.5),
        pytest.approx(0.5),
    )
    vanilla, _ = policy_loss(log_prob, old, adv, mask, 0.2, 0.2, loss_agg_mode="token-mean")
    assert loss.item() == pytest.approx(vanilla.item())  # no dual clip reached here


def test_gspo_gradient_spreads_over_the_row_gspo_token_keeps_it_per_token() -> None:
    # One row, ratios (e^0.1, e^-0.1): s = exp(0) = 1, inside the band.
    log_prob, old = from_ratios([[math.exp(0.1), math.exp(-0.1)]])
    mask = torch.ones(1, 2)
    # One advantage A = 2 for the row; seq-mean-token-mean: loss = l = -A s = -2.
    # GSPO: d l / d log pi_t = -A s / |y| = -1 for each token; GSPO-token:
    # (1 / |y|) * (-A s) per token = -1: the same (the paper's remark).
    adv = torch.tensor([2.0], dtype=torch.float64)
    for fn in (gspo_loss, gspo_token_loss):
        loss, _ = fn(log_prob, old, adv, mask, 0.2, 0.2, "seq-mean-token-mean")
        assert loss.item() == pytest.approx(-2.0)
        assert grad_of(loss, log_prob).flatten().tolist() == pytest.approx([-1.0, -1.0])
    # Per-token advantages (2, 0): loss = (1/2)(-2 s + 0) = -1 for both.
    # GSPO: the row's s gets gradient -1 and spreads it: -1 * s / 2 = -0.5 on each token.
    # GSPO-token: token 0 gets (1/2)(-2) s = -1, token 1 gets 0.
    per_token = torch.tensor([[2.0, 0.0]], dtype=torch.float64)
    loss, _ = gspo_loss(log_prob, old, per_token, mask, 0.2, 0.2, "seq-mean-token-mean")
    assert loss.item() == pytest.approx(-1.0)
    assert grad_of(loss, log_prob).flatten().tolist() == pytest.approx([-0.5, -0.5])
    loss, _ = gspo_token_loss(log_prob, old, per_token, mask, 0.2, 0.2, "seq-mean-token-mean")
    assert loss.item() == pytest.approx(-1.0)
    assert grad_of(loss, log_prob).flatten().tolist() == pytest.approx([-1.0, 0.0])


def test_gspo_clipped_rows_get_no_gradient() -> None:
    # s = e^0.3 > 1.2 with A > 0: the clipped branch, constant in theta.
    log_prob, old = from_ratios([[math.exp(0.2), math.exp(0.4)]])
    adv = torch.tensor([1.0], dtype=torch.float64)
    for fn in (gspo_loss, gspo_token_loss):
        loss, _ = fn(log_prob, old, adv, torch.ones(1, 2), 0.2, 0.2, "seq-mean-token-mean")
        assert loss.item() == pytest.approx(-1.2)
        assert grad_of(loss, log_prob).abs().max().item() == 0.0


def test_gspo_token_value_equals_gspo_to_the_bit_and_gradients_agree_per_row() -> None:
    g = torch.Generator().manual_seed(0)
    lp = -torch.rand(4, 5, generator=g, dtype=torch.float64) - 0.5
    old = lp + 0.05 * torch.randn(4, 5, generator=g, dtype=torch.float64)
    mask = torch.ones(4, 5)
    mask[1, 3:] = 0
    adv = torch.tensor([1.0, -0.5, 2.0, -1.5], dtype=torch.float64)
    seq_lp, tok_lp = lp.clone().requires_grad_(True), lp.clone().requires_grad_(True)
    seq, seq_metrics = gspo_loss(seq_lp, old, adv, mask, 0.01, 0.01, "seq-mean-token-mean")
    tok, tok_metrics = gspo_token_loss(tok_lp, old, adv, mask, 0.01, 0.01, "seq-mean-token-mean")
    assert torch.equal(seq.detach(), tok.detach())
    assert seq_metrics == tok_metrics
    assert torch.allclose(grad_of(seq, seq_lp), grad_of(tok, tok_lp), atol=1e-12)


def test_gspo_per_token_weights_scale_the_rows_loss() -> None:
    # The worker's TIS: A_t = A w_t. s = e^0.3 clipped: l = -1.2; w = (0.5, 1.5):
    # seq-mean-token-mean = (1/2)(-1.2 * 0.5 - 1.2 * 1.5) = -1.2 * mean(w) = -1.2.
    log_prob, old = from_ratios([[math.exp(0.2), math.exp(0.4)]])
    adv = torch.tensor([[0.5, 1.5]], dtype=torch.float64)
    loss, _ = gspo_loss(log_prob, old, adv, torch.ones(1, 2), 0.2, 0.2, "seq-mean-token-mean")
    assert loss.item() == pytest.approx(-1.2)


def test_gspo_empty_rows_add_nothing_and_are_no_sequence_of_the_ratio_statistics() -> None:
    # Row 1 is fully masked (stale-token masking can empty a row); row 0 is TWO_ROWS's row 1.
    log_prob, old = from_ratios([[math.exp(0.2), math.exp(0.4)], [5.0, 0.1]])
    mask = torch.tensor([[1, 1], [0, 0]])
    adv = torch.tensor([1.0, 1.0], dtype=torch.float64)
    loss, metrics = gspo_loss(log_prob, old, adv, mask, 0.2, 0.2, "token-mean")
    assert loss.item() == pytest.approx(-1.2)
    # The empty row's s (1 by definition) is not the minimum: only row 0 counts.
    assert metrics["actor/gspo_seq_ratio_min"] == pytest.approx(E03)
    assert metrics["actor/gspo_seq_ratio_max"] == pytest.approx(E03)
    # With the caller's global row count (1 row with tokens) the seq-mean loss is row 0's.
    loss, _ = gspo_loss(log_prob, old, adv, mask, 0.2, 0.2, "seq-mean-token-mean", 2.0, 1.0)
    assert loss.item() == pytest.approx(-1.2)


def test_gspo_defaults_are_the_papers_clip_range() -> None:
    # s = e^0.001 = 1.0010005 is above 1 + 4e-4 already: clipped to 1.0004 (A = 1).
    log_prob, old = from_ratios([[math.exp(0.001)]])
    loss, metrics = gspo_loss(log_prob, old, torch.tensor([1.0]), torch.ones(1, 1))
    assert loss.item() == pytest.approx(-1.0004)
    assert metrics["actor/pg_clipfrac"] == 1.0


# --- CISPO -----------------------------------------------------------------------------------

# ratios (0.5, 1.0, 2.0), log pi = (-1, -2, -0.5), A = 1, clip 0.2 / 0.28:
# w = clip(r, 0.8, 1.28) = (0.8, 1.0, 1.28); l_t = -A w log pi = (0.8, 2.0, 0.64);
# token-mean: 3.44 / 3. Gradient: -A w / 3 = (-0.8, -1, -1.28) / 3: the clipped tokens too.
CISPO_LP = [[-1.0, -2.0, -0.5]]
CISPO_R = [[0.5, 1.0, 2.0]]


def test_cispo_hand_values_and_metrics() -> None:
    log_prob, old = from_ratios(CISPO_R, CISPO_LP)
    adv = torch.tensor([1.0], dtype=torch.float64)
    loss, metrics = cispo_loss(log_prob, old, adv, torch.ones(1, 3), 0.2, 0.28, "token-mean")
    assert loss.item() == pytest.approx(3.44 / 3)
    assert metrics == {
        "actor/pg_clipfrac": pytest.approx(2 / 3),
        "actor/cispo_clipfrac_high": pytest.approx(1 / 3),  # r = 2 > 1.28
        "actor/cispo_clipfrac_low": pytest.approx(1 / 3),  # r = 0.5 < 0.8
        "actor/ppo_kl": pytest.approx(0.0),  # -(ln 0.5 + 0 + ln 2) / 3
    }
    assert all(isinstance(v, float) for v in metrics.values())


def test_cispo_clipped_tokens_keep_their_gradient_through_log_prob_only() -> None:
    log_prob, old = from_ratios(CISPO_R, CISPO_LP)
    adv = torch.tensor([1.0], dtype=torch.float64)
    loss, _ = cispo_loss(log_prob, old, adv, torch.ones(1, 3), 0.2, 0.28, "token-mean")
    # A detached weight: d l / d log pi = -A w. (Through a live weight the unclipped token 1
    # would get -A (w + r log pi) / 3 = +1/3 instead of -1/3.)
    assert grad_of(loss, log_prob).flatten().tolist() == pytest.approx(
        [-0.8 / 3, -1.0 / 3, -1.28 / 3]
    )
    # PPO-clip drops the token above the band with A > 0 (r = 2): gradient 0 there.
    log_prob, old = from_ratios(CISPO_R, CISPO_LP)
    vanilla, _ = policy_loss(log_prob, old, adv, torch.ones(1, 3), 0.2, 0.28)
    assert grad_of(vanilla, log_prob)[0, 2].item() == 0.0


def test_cispo_without_a_lower_bound() -> None:
    # clip_ratio_low = 1: the floor is 0, so r = 0.01 keeps its weight 0.01 (not clipped).
    # l = -(-1) * 0.01 * log pi = 0.01 * -3 = -0.03 for A = -1, log pi = -3.
    log_prob, old = from_ratios([[0.01]], [[-3.0]])
    adv = torch.tensor([-1.0], dtype=torch.float64)
    loss, metrics = cispo_loss(log_prob, old, adv, torch.ones(1, 1), 1.0, 0.28, "token-mean")
    assert loss.item() == pytest.approx(-0.03)
    assert metrics["actor/cispo_clipfrac_low"] == 0.0
    assert grad_of(loss, log_prob).item() == pytest.approx(0.01)  # -A w


def test_cispo_ignores_what_padding_holds() -> None:
    log_prob, old = from_ratios([[1.0, 1.0]], [[-1.0, -1.0]])
    old = old.detach().clone()
    old[0, 1] = float("nan")
    mask = torch.tensor([[1, 0]])
    loss, metrics = cispo_loss(log_prob, old, torch.tensor([1.0]), mask, 0.2, 0.28, "token-mean")
    assert loss.item() == pytest.approx(1.0)  # -1 * 1 * (-1) on the one valid token
    assert all(math.isfinite(v) for v in metrics.values())
    assert grad_of(loss, log_prob).flatten().tolist() == pytest.approx([-1.0, 0.0])


# --- SAPO ------------------------------------------------------------------------------------

# f(r) = sigmoid(tau (r - 1)) * 4 / tau, l = -f A; gate weight g = 4 sigma (1 - sigma);
# d l / d log pi = -A g r.
#   r = 1,   A = +1, tau 1:    sigma = 0.5, f = 2, l = -2; g = 1; grad -1
#   r = 1,   A = -1, tau 1.05: f = 2 / 1.05 = 1.9047619, l = +1.9047619; g = 1; grad +1
#   r = 2,   A = +1, tau 1:    sigma(1) = 0.7310586, f = 2.9242343, l = -2.9242343;
#                              g = 4 * 0.7310586 * 0.2689414 = 0.7864477; grad -1.5728955
#   r = 0.5, A = -1, tau 1.05: sigma(-0.525) = 0.3716838, f = 1.4159383, l = +1.4159383;
#                              g = 0.9341398; grad = 0.9341398 * 0.5 = 0.4670699
SAPO_CASES = [
    (1.0, 1.0, -2.0, 1.0, -1.0),
    (1.0, -1.0, 1.9047619, 1.0, 1.0),
    (2.0, 1.0, -2.9242343, 0.7864477, -1.5728955),
    (0.5, -1.0, 1.4159383, 0.9341398, 0.4670699),
]


@pytest.mark.parametrize(("ratio", "advantage", "loss", "gate", "grad"), SAPO_CASES)
def test_sapo_each_case(
    ratio: float, advantage: float, loss: float, gate: float, grad: float
) -> None:
    log_prob, old = from_ratios([[ratio]])
    adv = torch.tensor([advantage], dtype=torch.float64)
    value, metrics = sapo_loss(log_prob, old, adv, torch.ones(1, 1))
    assert value.item() == pytest.approx(loss, abs=1e-7)
    assert metrics["actor/sapo_gate_weight_mean"] == pytest.approx(gate, abs=1e-7)
    assert metrics["actor/ppo_kl"] == pytest.approx(-math.log(ratio))
    assert grad_of(value, log_prob).item() == pytest.approx(grad, abs=1e-7)


def test_sapo_all_cases_together_and_bad_temperatures() -> None:
    log_prob, old = from_ratios([[c[0] for c in SAPO_CASES]])
    adv = torch.tensor([[c[1] for c in SAPO_CASES]], dtype=torch.float64)
    loss, metrics = sapo_loss(log_prob, old, adv, torch.ones(1, 4), 1.0, 1.05, "token-mean")
    assert loss.item() == pytest.approx(sum(c[2] for c in SAPO_CASES) / 4, abs=1e-7)
    assert metrics["actor/sapo_gate_weight_mean"] == pytest.approx(
        sum(c[3] for c in SAPO_CASES) / 4, abs=1e-7
    )
    with pytest.raises(ValueError, match=r"tau_pos=0\.0"):
        sapo_loss(log_prob, old, adv, torch.ones(1, 4), 0.0, 1.05)


# --- every loss ------------------------------------------------------------------------------

SETTINGS = PolicyLossSettings(clip_ratio_low=0.2, clip_ratio_high=0.28)


def test_the_names_and_a_bad_one() -> None:
    assert POLICY_LOSSES == ("vanilla", "gspo", "gspo_token", "cispo", "sapo")
    with pytest.raises(ValueError, match=r"actor\.policy_loss must be one of .*got 'ppo'"):
        select_policy_loss("ppo")


def test_vanilla_is_policy_loss_bit_for_bit() -> None:
    log_prob, old = from_ratios([[1.5, 0.5, 10.0], [0.9, 1.1, 1.0]])
    adv = torch.tensor([[1.0, -1.0, -1.0], [0.5, 0.5, -2.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    settings = PolicyLossSettings(0.2, 0.28, 3.0, loss_agg_mode="seq-mean-token-mean")
    got, got_metrics = select_policy_loss("vanilla")(log_prob, old, adv, mask, settings, 5.0, 2.0)
    want, want_metrics = policy_loss(
        log_prob, old, adv, mask, 0.2, 0.28, 3.0, "seq-mean-token-mean", 5.0, 2.0
    )
    assert torch.equal(got, want) and got_metrics == want_metrics


@pytest.mark.parametrize("name", POLICY_LOSSES)
def test_zero_advantages_give_zero_loss_and_gradient(name: str) -> None:
    # A single-sample group (or a group whose rewards are all equal) has advantage 0.
    log_prob, old = from_ratios([[1.5, 0.5], [2.0, 1.0]])
    loss, metrics = select_policy_loss(name)(
        log_prob, old, torch.zeros(2, dtype=torch.float64), torch.ones(2, 2), SETTINGS
    )
    assert loss.item() == 0.0
    assert grad_of(loss, log_prob).abs().max().item() == 0.0
    assert all(math.isfinite(v) for v in metrics.values())


@pytest.mark.parametrize("name", POLICY_LOSSES)
def test_all_rows_empty(name: str) -> None:
    log_prob, old = from_ratios([[1.5, 0.5], [2.0, 1.0]])
    adv = torch.tensor([1.0, -1.0], dtype=torch.float64)
    loss, metrics = select_policy_loss(name)(log_prob, old, adv, torch.zeros(2, 2), SETTINGS)
    assert loss.item() == 0.0
    assert grad_of(loss, log_prob).abs().max().item() == 0.0
    assert metrics["actor/ppo_kl"] == 0.0
    if name.startswith("gspo"):  # no sequence: the neutral ratio
        assert metrics["actor/gspo_seq_ratio_max"] == metrics["actor/gspo_seq_ratio_min"] == 1.0


@pytest.mark.parametrize("name", POLICY_LOSSES)
def test_on_policy_every_loss_is_the_plain_policy_gradient(name: str) -> None:
    # r = 1 everywhere (old = log_prob): the gradient of each loss is -A grad log pi per token
    # under token-mean (SAPO: g = 1; CISPO: w = 1; GSPO: s = 1, inside any band; with one
    # advantage per row GSPO's spread gradient sums to the same per row and, the rows'
    # tokens being uniform here, per token).
    lp = torch.tensor([[-1.0, -2.0], [-0.5, -1.5]], dtype=torch.float64)
    log_prob = lp.clone().requires_grad_(True)
    adv = torch.tensor([1.0, -2.0], dtype=torch.float64)
    loss, _ = select_policy_loss(name)(log_prob, lp, adv, torch.ones(2, 2), SETTINGS)
    assert grad_of(loss, log_prob).flatten().tolist() == pytest.approx([-0.25, -0.25, 0.5, 0.5])


@pytest.mark.parametrize("name", POLICY_LOSSES)
def test_bad_shapes_are_refused(name: str) -> None:
    log_prob, old = from_ratios([[1.0, 1.0]])
    with pytest.raises(ValueError, match="advantages"):
        select_policy_loss(name)(log_prob, old, torch.ones(3), torch.ones(1, 2), SETTINGS)
    with pytest.raises(ValueError, match="one shape"):
        select_policy_loss(name)(log_prob, old, torch.ones(1), torch.ones(1, 3), SETTINGS)
