"""Unit tests for `hybrid.algorithms.kl_control`: the adaptive coefficient over five hand-
computed steps (clipped and unclipped errors, n_steps), the fixed one staying put, exact
resume through state_dict, the config errors, and the batch KL of kl_in_reward."""

import pytest
import torch

from hybrid.algorithms.kl_control import (
    AdaptiveKLController,
    FixedKLController,
    kl_in_reward,
    make_kl_controller,
)

pytestmark = pytest.mark.unit

# init 0.1, target 0.05, horizon 100; e = clip(kl / 0.05 - 1, -0.2, 0.2), mult 1 + e * n / 100
STEPS = [
    # (current_kl, n_steps, expected coefficient after the update)
    (0.055, 10, 0.101),  # e = 1.1 - 1 = 0.1, mult 1 + 0.1 * 10 / 100 = 1.01; 0.1 * 1.01
    (0.5, 10, 0.10302),  # e = 10 - 1 = 9, clipped to 0.2: mult 1.02; 0.101 * 1.02
    (0.05, 10, 0.10302),  # on target: e = 0, mult 1
    (0.045, 20, 0.1009596),  # e = 0.9 - 1 = -0.1, mult 1 - 0.1 * 20 / 100 = 0.98
    (0.0, 10, 0.098940408),  # e = -1, clipped to -0.2: mult 0.98; 0.1009596 * 0.98
]


def test_adaptive_five_steps_by_hand() -> None:
    controller = AdaptiveKLController(init_kl_coef=0.1, target_kl=0.05, horizon=100)
    assert controller.value == 0.1
    for current_kl, n_steps, expected in STEPS:
        controller.update(current_kl, n_steps)
        assert controller.value == pytest.approx(expected, rel=1e-12)


def test_fixed_stays() -> None:
    controller = make_kl_controller("fixed", kl_coef=0.001, target_kl=0.05, horizon=100)
    assert isinstance(controller, FixedKLController)
    for current_kl, n_steps, _ in STEPS:
        controller.update(current_kl, n_steps)
    assert controller.value == 0.001


def test_state_dict_round_trip_resumes_exactly() -> None:
    uninterrupted = make_kl_controller("adaptive", kl_coef=0.1, target_kl=0.05, horizon=100)
    for current_kl, n_steps, _ in STEPS:
        uninterrupted.update(current_kl, n_steps)

    first = make_kl_controller("adaptive", kl_coef=0.1, target_kl=0.05, horizon=100)
    for current_kl, n_steps, _ in STEPS[:2]:
        first.update(current_kl, n_steps)
    state = first.state_dict()
    assert state == {"value": pytest.approx(0.10302)}
    resumed = make_kl_controller("adaptive", kl_coef=0.1, target_kl=0.05, horizon=100)
    resumed.load_state_dict(state)
    for current_kl, n_steps, _ in STEPS[2:]:
        resumed.update(current_kl, n_steps)
    assert resumed.value == uninterrupted.value  # bit for bit

    fixed = FixedKLController(0.5)
    fixed.load_state_dict(FixedKLController(0.25).state_dict())
    assert fixed.value == 0.25


def test_config_errors_name_the_field() -> None:
    with pytest.raises(ValueError, match=r"algorithm\.kl_ctrl\.type 'pid'"):
        make_kl_controller("pid", kl_coef=0.1, target_kl=0.05, horizon=100)
    with pytest.raises(ValueError, match=r"algorithm\.kl_ctrl\.horizon .*got 0"):
        make_kl_controller("adaptive", kl_coef=0.1, target_kl=0.05, horizon=0)
    with pytest.raises(ValueError, match=r"algorithm\.kl_ctrl\.target_kl .*got -1"):
        make_kl_controller("adaptive", kl_coef=0.1, target_kl=-1, horizon=100)
    with pytest.raises(ValueError, match=r"algorithm\.kl_ctrl\.kl_coef"):
        make_kl_controller("fixed", kl_coef=-0.1, target_kl=0.05, horizon=100)
    # the fixed controller does not need a target or a horizon
    assert make_kl_controller("fixed", kl_coef=0.1, target_kl=0, horizon=0).value == 0.1


def test_kl_in_reward_by_hand() -> None:
    nan = float("nan")
    log_prob = torch.tensor([[-1.0, -2.0, nan], [-0.3, nan, nan], [nan, nan, nan]])
    ref_log_prob = torch.tensor([[-1.5, -1.0, 0.0], [-0.5, 0.0, 0.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]])
    kl, current_kl = kl_in_reward(log_prob, ref_log_prob, mask, "k2")
    # k2 = 0.5 * d^2: row 0 d = 0.5, -1 -> 0.125, 0.5; row 1 d = 0.2 -> 0.02; row 2 empty
    expected = torch.tensor([[0.125, 0.5, 0.0], [0.02, 0.0, 0.0], [0.0, 0.0, 0.0]])
    torch.testing.assert_close(kl, expected)
    # row means 0.625 / 2 = 0.3125, 0.02, 0 (empty row counts as 0); mean over 3 rows
    assert current_kl == pytest.approx((0.3125 + 0.02 + 0.0) / 3)
    # k1 keeps the sign: row 0 (0.5 - 1) / 2 = -0.25, row 1 0.2 -> (-0.25 + 0.2 + 0) / 3
    _, k1_mean = kl_in_reward(log_prob, ref_log_prob, mask, "k1")
    assert k1_mean == pytest.approx(-0.05 / 3)
