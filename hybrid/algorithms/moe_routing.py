"""The math of a mixture-of-experts router, as the trainer sees it: scores of chosen experts,
how two routings of the same tokens differ, how evenly tokens spread over experts, and the
load-balancing loss.

Shapes: n tokens, E experts, k experts per token. `logits` (n, E) are the router's, `experts`
(n, k) expert indices in any order within a row.
"""

from __future__ import annotations

import torch


def chosen_scores(logits: torch.Tensor, experts: torch.Tensor, normalise: bool) -> torch.Tensor:
    """(n, k) gate weights of `experts` under `logits`: their softmax probabilities over all E
    experts, renormalised over the k chosen when `normalise` (the family's norm_topk_prob),
    in the logits' dtype. Differentiable in `logits`, so a router whose choice is replayed
    still learns."""
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    scores = probs.gather(1, experts.long())
    if normalise:
        scores = scores / scores.sum(dim=-1, keepdim=True)
    return scores.to(logits.dtype)


def routing_differs(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """(n,) True where the two (n, k) choices are different sets of experts."""
    return (a.sort(dim=-1).values != b.sort(dim=-1).values).any(dim=-1)


def expert_counts(experts: torch.Tensor, num_experts: int) -> torch.Tensor:
    """(E,) how many of the n tokens chose each expert (a token counts once per expert)."""
    return torch.bincount(experts.flatten().long(), minlength=num_experts)


def load_max_over_mean(counts: torch.Tensor) -> torch.Tensor:
    """(...,) the busiest expert's load over the mean load of (..., E) counts: 1.0 is a perfect
    spread, E every token on one expert; 0.0 where no token was routed."""
    counts = counts.double()
    mean = counts.mean(dim=-1)
    return torch.where(mean > 0, counts.max(dim=-1).values / mean.clamp(min=1e-12), 0.0)


def load_balancing_loss(logits: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
    """The Switch-Transformer auxiliary loss of one layer over n tokens:
    E * sum_e f_e * P_e, with f_e the share of the n * k choices that went to expert e and P_e
    the mean router probability of e. 1.0 at a uniform spread; its gradient flows through P
    only (the choice is discrete)."""
    num_experts = logits.shape[-1]
    if logits.shape[0] == 0:
        return logits.new_zeros((), dtype=torch.float32)
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    share = expert_counts(experts, num_experts).to(torch.float32) / experts.numel()
    return num_experts * (share * probs.mean(dim=0)).sum()
