"""`algorithm.adv_estimator` -> advantages: the one place a step picks its estimator.

Every estimator starts from the token-level rewards (gae.token_level_rewards: the outcome
score on each response's last token, minus the in-reward KL penalty when it is on):

    grpo                 group-normalised outcome (the rewards summed per row)
    rloo                 leave-one-out baseline within the prompt's group
    reinforce_plus_plus  whitened discounted returns-to-go, per token
    reinforce_plus_plus_baseline
                         the outcome minus its group's mean, on every token, whitened over
                         the batch (verl's estimator of that name; no discount)
    gae                  generalized advantage estimation on the critic's values, whitened;
                         also the returns the critic regresses to

Shapes: token_rewards, response_mask, values (B, T); group_ids one per row. Advantages are
(B,) for the outcome estimators (the policy loss broadcasts them over the response) or (B, T).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from hybrid.algorithms.advantages import (
    compute_grpo_advantages,
    compute_reinforce_plus_plus_advantages,
    compute_reinforce_plus_plus_baseline_advantages,
    compute_rloo_advantages,
)
from hybrid.algorithms.gae import compute_gae_advantages

ESTIMATORS = ("grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "gae")
NEEDS_VALUES = frozenset({"gae"})


@dataclass(frozen=True)
class Advantages:
    advantages: torch.Tensor
    """(B,) or (B, T)."""
    returns: torch.Tensor | None = None
    """(B, T) value targets (gae), else None."""


def compute_advantages(
    estimator: str,
    token_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    group_ids: Sequence[Hashable] | np.ndarray | torch.Tensor,
    *,
    values: torch.Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    norm_adv_by_std: bool = True,
) -> Advantages:
    """The advantages of `estimator` (see the module docstring); `values` only for gae."""
    if estimator not in ESTIMATORS:
        raise ValueError(
            f"algorithm.adv_estimator must be one of {list(ESTIMATORS)}, got {estimator!r}"
        )
    if (values is not None) != (estimator in NEEDS_VALUES):
        raise ValueError(
            f"adv_estimator={estimator}: values {'needed' if values is None else 'unused'}"
        )
    # where, not a product: NaN x 0 is NaN, and padding must never reach an advantage
    outcome = torch.where(response_mask.bool(), token_rewards, 0.0).sum(-1)
    if estimator == "grpo":
        return Advantages(compute_grpo_advantages(outcome, group_ids, norm_by_std=norm_adv_by_std))
    if estimator == "rloo":
        return Advantages(compute_rloo_advantages(outcome, group_ids))
    if estimator == "reinforce_plus_plus":
        return Advantages(
            compute_reinforce_plus_plus_advantages(token_rewards, response_mask, gamma)
        )
    if estimator == "reinforce_plus_plus_baseline":
        return Advantages(
            compute_reinforce_plus_plus_baseline_advantages(outcome, response_mask, group_ids)
        )
    assert values is not None
    advantages, returns = compute_gae_advantages(token_rewards, values, response_mask, gamma, lam)
    return Advantages(advantages, returns)
