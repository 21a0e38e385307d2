"""PPO with a critic: token-level rewards, masked whitening and GAE (Schulman et al. 2016).

Token-level rewards (outcome reward with the in-reward KL penalty, as in verl / TinyZero):

    r_t = s * [t == last valid token of the row] - kl_coef * kl_t      on valid tokens, else 0

GAE, with V the critic's values of the response tokens and V = 0 after the last valid token:

    delta_t = r_t + gamma * V_{t+1} - V_t
    A_t     = delta_t + gamma * lam * A_{t+1}          (backwards; A = 0 after the end)
    R_t     = A_t + V_t                                (the critic's target, before whitening)

then A is whitened over the response mask of the whole batch. lam = 1 gives the Monte Carlo
return minus V_t; lam = 0 the one-step TD error. Masked positions are skipped, not stepped
through: "t + 1" means the next VALID token of the row, so a mask with holes (observation
tokens of a multi-turn rollout) neither discounts nor leaks across them, and padding, whatever
it holds, never reaches a valid token. Advantages and returns are 0 where the mask is 0.

Whitening: (x - mean) / sqrt(var + eps) over the masked elements of the whole tensor, var
UNBIASED (divided by n - 1, as verl's masked_whiten). Unlike verl, which raises for n < 2, one
element has variance 0 and an empty mask gives all zeros; masked positions are 0 in the output.

Shapes: B batch rows, T response_len (padded). scores (B,); token rewards, values,
response_mask, kl, advantages and returns (B, T). All results are float32 without gradient.
"""

from __future__ import annotations

import torch


def token_level_rewards(
    scores: torch.Tensor,
    response_mask: torch.Tensor,
    kl: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> torch.Tensor:
    """Per-token rewards (B, T) float32: each row's score on its last valid token, minus
    kl_coef * kl on every valid token (the in-reward KL penalty); 0 on masked tokens.

    The last valid token is the last position where response_mask is 1 (for a mask of leading
    ones, index mask.sum() - 1). A row with no valid token gets no score and no penalty.
    """
    if response_mask.dim() != 2:
        raise ValueError(f"response_mask must be (B, T), got shape {tuple(response_mask.shape)}")
    batch, length = response_mask.shape
    if tuple(scores.shape) != (batch,):
        raise ValueError(f"scores {tuple(scores.shape)} do not fit response_mask ({batch}, T)")
    keep = response_mask.bool()
    positions = torch.arange(length, device=keep.device).expand(batch, length)
    last = torch.where(keep, positions, -1).amax(dim=-1)  # (B,), -1 for an empty row
    at_last = positions == last.unsqueeze(-1)  # never true on an empty row
    rewards = torch.where(at_last, scores.detach().float().unsqueeze(-1), 0.0)  # (B, T)
    if kl is not None:
        if kl.shape != response_mask.shape:
            raise ValueError(f"kl {tuple(kl.shape)} and response_mask {(batch, length)} differ")
        # where(), not multiply: padding may hold inf/NaN, and NaN * 0 is NaN.
        rewards = rewards - kl_coef * torch.where(keep, kl.detach().float(), 0.0)
    return rewards


def masked_whiten(
    values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8
) -> torch.Tensor:
    """(values - mean) / sqrt(var + eps) over the elements where mask is 1; 0 elsewhere.

    mean and the UNBIASED var (sum of squared deviations / (n - 1)) are taken over all masked
    elements of the tensor together, in float64. n = 1 counts as var 0; n = 0 returns zeros.
    With shift_mean=False the mean is added back (scale only). Returns float32.
    """
    if values.shape != mask.shape:
        raise ValueError(f"values {tuple(values.shape)} and mask {tuple(mask.shape)} differ")
    keep = mask.bool()
    x = torch.where(keep, values.detach().to(torch.float64), 0.0)
    count = keep.sum()
    mean = x.sum() / count.clamp(min=1)
    centered = torch.where(keep, x - mean, 0.0)
    var = centered.square().sum() / (count - 1).clamp(min=1)
    whitened = centered * torch.rsqrt(var + eps)
    if not shift_mean:
        whitened = whitened + mean
    return torch.where(keep, whitened, 0.0).to(torch.float32)


def compute_gae_advantages(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE advantages and returns, both (B, T) float32 without gradient.

    returns = raw advantages + values (the critic's regression target); advantages are then
    whitened over response_mask (masked_whiten). See the module docstring for the recursion
    and how masked positions are skipped.
    """
    if not 0 < gamma <= 1:
        raise ValueError(f"algorithm.gamma must be in (0, 1], got {gamma}")
    if not 0 <= lam <= 1:
        raise ValueError(f"algorithm.lam must be in [0, 1], got {lam}")
    if not token_rewards.shape == values.shape == response_mask.shape or values.dim() != 2:
        raise ValueError(
            f"token_rewards {tuple(token_rewards.shape)}, values {tuple(values.shape)} and "
            f"response_mask {tuple(response_mask.shape)} must have one (B, T) shape"
        )
    with torch.no_grad():
        keep = response_mask.bool()
        rewards = torch.where(keep, token_rewards.float(), 0.0)
        vals = torch.where(keep, values.float(), 0.0)
        batch, length = vals.shape
        next_value = vals.new_zeros(batch)  # V of the next valid token; 0 after the end
        next_advantage = vals.new_zeros(batch)
        advantages = torch.zeros_like(vals)
        for t in reversed(range(length)):
            delta = rewards[:, t] + gamma * next_value - vals[:, t]
            advantage = delta + gamma * lam * next_advantage
            valid = keep[:, t]
            # A masked token leaves the carried value and advantage as they were: skipped.
            next_value = torch.where(valid, vals[:, t], next_value)
            next_advantage = torch.where(valid, advantage, next_advantage)
            advantages[:, t] = torch.where(valid, advantage, 0.0)
        returns = advantages + vals  # both 0 on masked tokens
        return masked_whiten(advantages, keep), returns
