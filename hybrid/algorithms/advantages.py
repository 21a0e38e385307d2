"""Outcome-reward advantages: GRPO, Dr.GRPO, RLOO, REINFORCE++ and REINFORCE++-baseline.

Each prompt is sampled `n` times; the rows sharing a prompt uid form a group. The group-based
advantage of a row is its score relative to its own group:

    GRPO:     A_i = (s_i - mean_g) / (std_g + epsilon)    std_g unbiased (torch.std default)
    Dr.GRPO:  A_i =  s_i - mean_g                           (norm_by_std=False)
    RLOO:     A_i =  s_i - mean_{j in g, j != i} s_j  =  n / (n - 1) * (s_i - mean_g)

A group of one row has no baseline to compare with and gets advantage 0, never NaN (for
RLOO verl keeps the raw score there; we do not). Groups need not be contiguous: rows are
matched by uid, not by position.

REINFORCE++ (Hu 2025) needs no group: per token, the discounted return-to-go of the
token-level rewards (gae.token_level_rewards, KL penalty included),

    G_t = r_t + gamma * G_{t+1}     over the valid tokens, G = 0 after the last one,

whitened over the response mask of the whole batch (gae.masked_whiten, unbiased variance).
Masked tokens contribute nothing and reset nothing: "t + 1" is the next valid token, as in
gae.compute_gae_advantages. For masks of leading ones this is verl's result exactly; for a
mask with holes verl differs: it restarts the return at 0 before each masked token, so the
tokens before a hole do not see the rewards after it.

REINFORCE++-baseline (verl's reinforce_plus_plus_baseline; Hu 2025) puts a group
baseline under the outcome score and whitens over the batch instead of over the group:

    c_i   = s_i - mean_g     (mean_g taken as 0 in a group of one: the raw score, as verl)
    A_i,t = (c_i - mu) / sqrt(var + 1e-8)    on every valid token t of row i

with mu and the unbiased var over all valid tokens of the batch (gae.masked_whiten), so a row
weighs in by its length, as in verl. No discount: verl's estimator reads no gamma, and c_i on
every token is the undiscounted return-to-go of a score on the last token. Unlike GRPO and
RLOO, a group of one keeps its score here: with every group a singleton (rollout.n = 1) this
is REINFORCE++ with gamma = 1 on outcome rewards, not all zeros. A row with no valid token
gets 0 everywhere and stays out of mu and var; its score (0: gae.token_level_rewards gives
it none) still counts in its group's mean, as in GRPO and in verl.

Shapes: scores and the group-based advantages (batch,), a per-sequence scalar that
policy_loss broadcasts over the response tokens; group_ids one hashable per row.
token_rewards, response_mask and the REINFORCE++ advantages, with or without the baseline,
(batch, response_len).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np
import torch

from hybrid.algorithms.gae import masked_whiten


def compute_grpo_advantages(
    scores: torch.Tensor,
    group_ids: Sequence[Hashable] | np.ndarray | torch.Tensor,
    norm_by_std: bool = True,
    epsilon: float = 1e-6,
) -> torch.Tensor:
    """Group-relative advantages, (batch,) float scores -> (batch,) float32 advantages.

    `group_ids[i]` is row i's prompt uid (str, int, ...; a tensor or array of them works too).
    Statistics are taken in float64 so that large, nearly equal scores keep their differences.
    The result carries no gradient: advantages are constants of the policy-gradient loss.
    """
    values, index, counts = _grouped(scores, group_ids)
    zeros = torch.zeros_like(counts)
    mean = zeros.index_add(0, index, values) / counts.clamp(min=1)  # (groups,)
    centered = values - mean[index]  # (batch,)
    if norm_by_std:
        # Two-pass variance (sum of squared deviations from the mean): no cancellation.
        squares = zeros.index_add(0, index, centered.square())
        std = (squares / (counts - 1).clamp(min=1)).sqrt()  # (groups,), unbiased
        advantages = centered / (std[index] + epsilon)
    else:
        advantages = centered
    # Singleton groups: centered is already 0, but make it explicit and immune to epsilon=0.
    advantages = torch.where(counts[index] > 1, advantages, torch.zeros_like(advantages))
    return advantages.to(torch.float32)


def compute_rloo_advantages(
    scores: torch.Tensor, group_ids: Sequence[Hashable] | np.ndarray | torch.Tensor
) -> torch.Tensor:
    """Leave-one-out advantages, (batch,) float scores -> (batch,) float32 advantages.

    A_i = s_i - (sum_g - s_i) / (n_g - 1): the baseline is the mean of the OTHER rows of the
    group, so it does not depend on s_i. A group of one gets 0. No gradient; float64 inside.
    """
    values, index, counts = _grouped(scores, group_ids)
    zeros = torch.zeros_like(counts)
    sums = zeros.index_add(0, index, values)  # (groups,)
    others = counts[index] - 1  # (batch,)
    baseline = (sums[index] - values) / others.clamp(min=1)
    advantages = torch.where(others > 0, values - baseline, torch.zeros_like(values))
    return advantages.to(torch.float32)


def compute_reinforce_plus_plus_advantages(
    token_rewards: torch.Tensor, response_mask: torch.Tensor, gamma: float
) -> torch.Tensor:
    """REINFORCE++ advantages (batch, T) float32: whitened discounted returns-to-go.

    See the module docstring for the recursion and masking. 0 where response_mask is 0.
    """
    if not 0 < gamma <= 1:
        raise ValueError(f"algorithm.gamma must be in (0, 1], got {gamma}")
    if token_rewards.shape != response_mask.shape or token_rewards.dim() != 2:
        raise ValueError(
            f"token_rewards {tuple(token_rewards.shape)} and response_mask "
            f"{tuple(response_mask.shape)} must have one (B, T) shape"
        )
    with torch.no_grad():
        keep = response_mask.bool()
        rewards = torch.where(keep, token_rewards.float(), 0.0)
        returns = torch.zeros_like(rewards)
        running = rewards.new_zeros(rewards.shape[0])  # G of the next valid token
        for t in reversed(range(rewards.shape[1])):
            # A masked token keeps the running return as it was: skipped, not a reset.
            running = torch.where(keep[:, t], rewards[:, t] + gamma * running, running)
            returns[:, t] = torch.where(keep[:, t], running, 0.0)
        return masked_whiten(returns, keep)


def compute_reinforce_plus_plus_baseline_advantages(
    scores: torch.Tensor,
    response_mask: torch.Tensor,
    group_ids: Sequence[Hashable] | np.ndarray | torch.Tensor,
) -> torch.Tensor:
    """REINFORCE++-baseline advantages (batch, T) float32: the group-centred score on every
    valid token, whitened over the batch's valid tokens (see the module docstring); 0 where
    response_mask is 0."""
    if response_mask.dim() != 2 or response_mask.shape[0] != scores.shape[0]:
        raise ValueError(
            f"response_mask {tuple(response_mask.shape)} does not fit scores "
            f"{tuple(scores.shape)}: expected (batch, response_len)"
        )
    values, index, counts = _grouped(scores, group_ids)
    means = torch.zeros_like(counts).index_add(0, index, values) / counts.clamp(min=1)
    baseline = torch.where(counts[index] > 1, means[index], torch.zeros_like(values))
    centred = (values - baseline).unsqueeze(-1).expand(response_mask.shape)  # (B, T)
    return masked_whiten(centred, response_mask)


def _grouped(
    scores: torch.Tensor, group_ids: Sequence[Hashable] | np.ndarray | torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The outcome estimators' common start: (batch,) float64 scores without gradient, each
    row's dense group index, and the (groups,) float64 row count of every group."""
    if scores.dim() != 1:
        raise ValueError(f"scores must be 1-D (batch,), got shape {tuple(scores.shape)}")
    index = _group_index(group_ids, scores.device)
    if index.numel() != scores.numel():
        raise ValueError(f"got {index.numel()} group_ids for {scores.numel()} scores")
    num_groups = int(index.max().item()) + 1 if index.numel() else 0
    counts = torch.bincount(index, minlength=num_groups).to(torch.float64)
    return scores.detach().to(torch.float64), index, counts


def _group_index(
    group_ids: Sequence[Hashable] | np.ndarray | torch.Tensor, device: torch.device
) -> torch.Tensor:
    """Dense group index per row (first-seen order), (batch,) int64 on `device`."""
    ids = group_ids.tolist() if isinstance(group_ids, torch.Tensor | np.ndarray) else group_ids
    dense: dict[Hashable, int] = {}
    index = [dense.setdefault(uid, len(dense)) for uid in ids]
    return torch.tensor(index, dtype=torch.int64, device=device)
