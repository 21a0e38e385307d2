"""The coefficient of the in-reward KL penalty: fixed, or adaptive (Ziegler et al. 2019).

PPO with a critic (verl / TinyZero) subtracts kl_coef * kl_t from every token's reward
(gae.token_level_rewards), with kl_t an estimator of kl.kl_penalty between the actor's
log-probs of the rollout and the reference's. The adaptive controller steers kl_coef so that
the batch's mean KL tracks a target:

    e        = clip(current_kl / target_kl - 1, -0.2, 0.2)
    kl_coef *= 1 + e * n_steps / horizon

with current_kl the mean over rows of each row's masked token-mean KL (kl_in_reward), and
n_steps the number of rows of the batch (verl passes the batch size). The fixed controller
ignores its updates. Both save and restore their coefficient (state_dict / load_state_dict)
so that a resumed run uses the coefficient the interrupted one had reached.

Shapes: log_prob, ref_log_prob, response_mask and the per-token KL (B, T).
"""

from __future__ import annotations

from typing import Protocol

import torch

from hybrid.algorithms.kl import kl_penalty

KL_CTRL_TYPES = ("fixed", "adaptive")
"""Accepted values of `algorithm.kl_ctrl.type`."""

PROPORTIONAL_ERROR_CLIP = 0.2


class KLController(Protocol):
    """What the trainer needs of a KL controller."""

    value: float

    def update(self, current_kl: float, n_steps: int) -> None: ...

    def state_dict(self) -> dict[str, float]: ...

    def load_state_dict(self, state: dict[str, float]) -> None: ...


class FixedKLController:
    """kl_coef stays what it was configured to."""

    def __init__(self, kl_coef: float) -> None:
        if kl_coef < 0:
            raise ValueError(f"algorithm.kl_ctrl.kl_coef must be >= 0, got {kl_coef}")
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """No-op: the coefficient is fixed."""

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.value = float(state["value"])


class AdaptiveKLController:
    """kl_coef moves towards the value that makes the mean KL equal target_kl (see module)."""

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: float) -> None:
        if init_kl_coef < 0:
            raise ValueError(f"algorithm.kl_ctrl.kl_coef must be >= 0, got {init_kl_coef}")
        if target_kl <= 0:
            raise ValueError(f"algorithm.kl_ctrl.target_kl must be > 0, got {target_kl}")
        if horizon <= 0:
            raise ValueError(f"algorithm.kl_ctrl.horizon must be > 0, got {horizon}")
        self.value = float(init_kl_coef)
        self.target = float(target_kl)
        self.horizon = float(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        """One multiplicative step; n_steps is the number of rows the KL was measured on."""
        error = current_kl / self.target - 1
        error = min(max(error, -PROPORTIONAL_ERROR_CLIP), PROPORTIONAL_ERROR_CLIP)
        self.value *= 1 + error * n_steps / self.horizon

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.value = float(state["value"])


def make_kl_controller(
    kind: str, kl_coef: float, target_kl: float, horizon: float
) -> FixedKLController | AdaptiveKLController:
    """The controller named by `algorithm.kl_ctrl.type` ("fixed" or "adaptive")."""
    if kind == "fixed":
        return FixedKLController(kl_coef)
    if kind == "adaptive":
        return AdaptiveKLController(kl_coef, target_kl, horizon)
    raise ValueError(
        f"unknown algorithm.kl_ctrl.type {kind!r}; expected one of {list(KL_CTRL_TYPES)}"
    )


def kl_in_reward(
    log_prob: torch.Tensor, ref_log_prob: torch.Tensor, response_mask: torch.Tensor, kind: str
) -> tuple[torch.Tensor, float]:
    """Per-token KL estimate for the reward penalty and the batch's mean KL.

    Returns (kl, current_kl): kl (B, T) float32, kl.kl_penalty(log_prob, ref_log_prob, kind)
    where response_mask is 1 and 0 elsewhere, detached; current_kl the mean over ALL rows of
    each row's token-mean of kl (a row without valid tokens counts as 0, as in verl), the
    value to pass to KLController.update. Multiply kl by the controller's value BEFORE its
    update, as gae.token_level_rewards(..., kl, controller.value) does.
    """
    if not log_prob.shape == ref_log_prob.shape == response_mask.shape or log_prob.dim() != 2:
        raise ValueError(
            f"log_prob {tuple(log_prob.shape)}, ref_log_prob {tuple(ref_log_prob.shape)} and "
            f"response_mask {tuple(response_mask.shape)} must have one (B, T) shape"
        )
    with torch.no_grad():
        keep = response_mask.bool()
        kl = torch.where(keep, kl_penalty(log_prob.float(), ref_log_prob.float(), kind), 0.0)
        per_row = kl.sum(-1) / keep.sum(-1).clamp(min=1)  # (B,)
        current_kl = per_row.mean().item() if per_row.numel() else 0.0
    return kl, current_kl
