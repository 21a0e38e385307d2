"""Per-token KL estimators between the actor and the reference policy (Schulman's k1/k2/k3).

With d = log_prob - ref_log_prob (log pi(x) - log pi_ref(x), x sampled from the actor):

    "k1", alias "kl"      d                         unbiased for KL(pi || ref), high variance
    "abs"                 |d|
    "k2", alias "mse"     0.5 * d^2                 biased, low variance
    "k3", alias "low_var_kl"
                          exp(-d) + d - 1           unbiased, non-negative, low variance
                          with -d clamped to [-20, 20] and the result to [-10, 10]

"kl" is verl's name for k1 (its default `kl_penalty`), accepted so that a verl config's
estimator names read the same here (verl's "full", over the whole vocabulary, is not offered).
The k3 clamps (verl's low_var_kl) keep exp() finite, so that a token where the two policies
disagree wildly contributes a bounded loss and a zero, not NaN, gradient.

Shapes: log_prob, ref_log_prob and the result (batch, response_len), or any common shape:
the estimators are elementwise. Aggregate with policy_loss.aggregate_loss.
"""

from __future__ import annotations

import torch

KL_KINDS = ("k1", "kl", "abs", "k2", "mse", "k3", "low_var_kl")
"""Accepted values of `kind` (aliases included)."""

K3_LOG_RATIO_CLAMP = 20.0
K3_VALUE_CLAMP = 10.0


def kl_penalty(log_prob: torch.Tensor, ref_log_prob: torch.Tensor, kind: str) -> torch.Tensor:
    """Elementwise KL estimate of `kind` (see the module docstring); same shape as the inputs."""
    if kind in ("k1", "kl"):
        return log_prob - ref_log_prob
    if kind == "abs":
        return (log_prob - ref_log_prob).abs()
    if kind in ("k2", "mse"):
        return 0.5 * (log_prob - ref_log_prob).square()
    if kind in ("k3", "low_var_kl"):
        log_ratio = (ref_log_prob - log_prob).clamp(-K3_LOG_RATIO_CLAMP, K3_LOG_RATIO_CLAMP)
        kl = torch.exp(log_ratio) - log_ratio - 1
        return kl.clamp(-K3_VALUE_CLAMP, K3_VALUE_CLAMP)
    raise ValueError(f"unknown KL kind {kind!r}; expected one of {list(KL_KINDS)}")
