"""Policy losses beside PPO-clip, and the one choice among them (`actor.policy_loss`).

Variants implemented, with r_t = pi(y_t) / pi_old(y_t) per token and A the advantage:
  - GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization", arXiv:2507.18071): one
    importance ratio per sequence, the geometric mean of its tokens' ratios,
        s_i = exp( (1 / |y_i|) * sum_t log r_t )     over the row's valid tokens,
    clipped PPO-style: l_i = max(-A_i s_i, -A_i clip(s_i, 1 - clip_ratio_low, 1 + clip_ratio_high)).
    The gradient of s_i reaches every token of the row with weight s_i / |y_i|.
  - GSPO-token (same paper): s_{i,t} = sg[s_i] * pi(y_t) / sg[pi(y_t)], the value of s_i with
    the gradient of one token; with one advantage per row it equals GSPO, and it admits an
    advantage that varies along the row.
  - CISPO (MiniMax-M1, arXiv:2506.13585): l_t = -sg[clip(r_t, 1 - eps_low, 1 + eps_high)] A_t
    log pi(y_t): the clipped importance weight is a detached coefficient, so every token keeps
    its gradient (PPO's clip drops the gradient of a token outside the band).
  - SAPO (Gao et al. 2025, "Soft Adaptive Policy Optimization", arXiv:2511.20347): a soft gate
    instead of the hard clip, l_t = -f(r_t) A_t with f(r) = sigmoid(tau (r - 1)) * 4 / tau,
    tau = tau_pos where A > 0 and tau_neg elsewhere; df/dr = 4 sigma (1 - sigma) is 1 at r = 1
    and decays smoothly away from it (faster for larger tau).
  - "vanilla": hybrid.algorithms.policy_loss.policy_loss (PPO-clip, clip-higher, dual clip).

Shape legend (as hybrid.algorithms.policy_loss):
  B  batch (rows of this micro-batch)    T  response_len (padded)
  log_prob, old_log_prob, response_mask, per-token losses: (B, T)
  advantages: (B, T), or (B,) broadcast over T
Every loss puts its per-token (GSPO: its per-sequence) value on the row's valid tokens and
reduces it with `aggregate_loss`, so `loss_agg_mode` and the global normalisers mean what they
mean for PPO-clip. Losses are 0-d tensors; metrics are python floats, local to the call (means
over its valid tokens, unless the name says otherwise), read back in one device sync.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol, get_args

import torch

from hybrid.algorithms.policy_loss import LOG_RATIO_CLAMP, aggregate_loss, policy_loss

PolicyLossName = Literal["vanilla", "gspo", "gspo_token", "cispo", "sapo"]
POLICY_LOSSES: tuple[str, ...] = get_args(PolicyLossName)
"""Accepted values of `actor.policy_loss`."""


@dataclass(frozen=True)
class PolicyLossSettings:
    """The hyperparameters any of the losses reads (each reads its own; see select_policy_loss)."""

    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    clip_ratio_c: float = 3.0
    sapo_tau_pos: float = 1.0
    sapo_tau_neg: float = 1.05
    loss_agg_mode: str = "token-mean"


class PolicyLossFn(Protocol):
    """The common signature of the losses `select_policy_loss` returns."""

    def __call__(
        self,
        log_prob: torch.Tensor,
        old_log_prob: torch.Tensor,
        advantages: torch.Tensor,
        response_mask: torch.Tensor,
        settings: PolicyLossSettings,
        global_tokens: float | None = None,
        global_seqs: float | None = None,
    ) -> tuple[torch.Tensor, dict[str, float]]: ...


def gspo_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_ratio_low: float = 3e-4,
    clip_ratio_high: float = 4e-4,
    loss_agg_mode: str = "seq-mean-token-mean",
    global_tokens: float | None = None,
    global_seqs: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GSPO: the sequence ratio s_i clipped PPO-style; gradient through s_i to the whole row.

    Per token of row i: l = max(-A s_i, -A clip(s_i, 1 - clip_ratio_low, 1 + clip_ratio_high)),
    then aggregate_loss(l, response_mask, loss_agg_mode, ...). With one advantage per row every
    valid token of it holds the row's loss l_i, so "seq-mean-token-mean" gives mean_i l_i, the
    paper's objective; "token-mean" weighs a row by its length instead. A per-token advantage
    (e.g. GRPO's times TIS weights w_t > 0) scales the row's loss per token: w_t l_i.

    The paper's clip range is tiny (3e-4 / 4e-4, the defaults here) because s_i is a mean of
    log-ratios: the worker passes actor.clip_ratio_low / high, which the user sets for GSPO.

    Metrics: actor/pg_clipfrac (fraction of valid tokens whose row took the clipped branch: the
    fraction of sequences clipped, weighted by their lengths), actor/ppo_kl (token mean of
    old_log_prob - log_prob), actor/gspo_seq_ratio_mean (s_i, weighted by length),
    actor/gspo_seq_ratio_max / _min (over rows with a valid token; 1.0 when there is none).
    """
    advantages = _checked_advantages(log_prob, old_log_prob, advantages, response_mask)
    _check_clip(clip_ratio_low, clip_ratio_high)
    keep = response_mask.bool()
    log_ratio = torch.where(keep, log_prob - old_log_prob, 0.0)  # (B, T)
    seq_log_ratio = _row_mean(log_ratio, keep)  # (B,)
    seq_ratio = torch.exp(seq_log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    ratio = seq_ratio.unsqueeze(-1).expand_as(log_prob)  # (B, T), the row's s_i
    return _clipped_ratio_loss(
        ratio, seq_ratio, log_ratio, advantages, response_mask,
        clip_ratio_low, clip_ratio_high, loss_agg_mode, global_tokens, global_seqs,
    )  # fmt: skip


def gspo_token_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_ratio_low: float = 3e-4,
    clip_ratio_high: float = 4e-4,
    loss_agg_mode: str = "seq-mean-token-mean",
    global_tokens: float | None = None,
    global_seqs: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GSPO-token: s_{i,t} = sg[s_i] * pi(y_t) / sg[pi(y_t)] in GSPO's clipped loss.

    The value (loss and metrics) is GSPO's exactly; the gradient of token t is
    -A_t s_i grad log pi(y_t) where unclipped, instead of s_i / |y_i| times the row's summed
    gradient. With one advantage per row and "seq-mean-token-mean" the two gradients agree (the
    paper's remark); a per-token advantage steers each token separately.
    """
    advantages = _checked_advantages(log_prob, old_log_prob, advantages, response_mask)
    _check_clip(clip_ratio_low, clip_ratio_high)
    keep = response_mask.bool()
    log_ratio = torch.where(keep, log_prob - old_log_prob, 0.0)  # (B, T)
    seq_log_ratio = _row_mean(log_ratio, keep).detach().clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    # log_prob - sg[log_prob] is exactly 0 (x - x), so the value is s_i to the last bit while
    # the gradient is the token's own. Only the detached part is clamped: a far-off row keeps
    # its per-token gradient.
    own = torch.where(keep, log_prob - log_prob.detach(), 0.0)  # (B, T), value 0
    ratio = torch.exp(seq_log_ratio.unsqueeze(-1) + own)  # (B, T)
    return _clipped_ratio_loss(
        ratio, torch.exp(seq_log_ratio), log_ratio, advantages, response_mask,
        clip_ratio_low, clip_ratio_high, loss_agg_mode, global_tokens, global_seqs,
    )  # fmt: skip


def cispo_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_ratio_low: float = 1.0,
    clip_ratio_high: float = 0.28,
    loss_agg_mode: str = "token-mean",
    global_tokens: float | None = None,
    global_seqs: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """CISPO: l_t = -sg[clip(r_t, 1 - clip_ratio_low, 1 + clip_ratio_high)] * A_t * log pi(y_t).

    The weight is detached, so the gradient of every token is -A_t w_t grad log pi(y_t), also
    where r_t left the band (PPO-clip gives those tokens none). MiniMax-M1 sets no lower bound
    and tunes only the upper one: clip_ratio_low = 1.0 (the weight's floor is 0, which a ratio
    never goes below), the default here, with clip_ratio_high e.g. 0.28. The loss VALUE holds
    log pi, so it is not comparable with PPO-clip's; its gradient is what matters.

    Metrics: actor/pg_clipfrac (fraction of valid tokens whose weight was clipped, either
    bound), actor/cispo_clipfrac_high (r_t > 1 + clip_ratio_high), actor/cispo_clipfrac_low
    (r_t < 1 - clip_ratio_low), actor/ppo_kl (token mean of old_log_prob - log_prob).
    """
    advantages = _checked_advantages(log_prob, old_log_prob, advantages, response_mask)
    _check_clip(clip_ratio_low, clip_ratio_high)
    keep = response_mask.bool()
    log_ratio = torch.where(keep, log_prob - old_log_prob, 0.0)  # (B, T)
    ratio = torch.exp(log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)).detach()
    weight = ratio.clamp(1 - clip_ratio_low, 1 + clip_ratio_high)  # (B, T), no gradient
    per_token = -advantages * weight * log_prob
    loss = aggregate_loss(per_token, response_mask, loss_agg_mode, global_tokens, global_seqs)

    with torch.no_grad():
        high = ratio > 1 + clip_ratio_high
        low = ratio < 1 - clip_ratio_low
        clipfrac, clipfrac_high, clipfrac_low, ppo_kl = torch.stack(
            [
                _masked_mean((high | low).to(ratio.dtype), keep),
                _masked_mean(high.to(ratio.dtype), keep),
                _masked_mean(low.to(ratio.dtype), keep),
                _masked_mean(-log_ratio, keep),
            ]
        ).tolist()  # one device sync
    metrics = {
        "actor/pg_clipfrac": clipfrac,
        "actor/cispo_clipfrac_high": clipfrac_high,
        "actor/cispo_clipfrac_low": clipfrac_low,
        "actor/ppo_kl": ppo_kl,
    }
    return loss, metrics


def sapo_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    loss_agg_mode: str = "token-mean",
    global_tokens: float | None = None,
    global_seqs: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """SAPO: l_t = -f(r_t) A_t, f(r) = sigmoid(tau (r - 1)) * 4 / tau, as in arXiv:2511.20347
    (eq. of the soft gate; defaults tau_pos = 1.0, tau_neg = 1.05 are the paper's).

    tau = tau_pos where A_t > 0, tau_neg elsewhere (A_t = 0 adds nothing either way). The
    gradient is -A_t g_t r_t grad log pi(y_t) with the gate weight g_t = 4 sigma (1 - sigma),
    sigma = sigmoid(tau (r_t - 1)): 1 on-policy, so a fresh batch gets the plain policy
    gradient, and smaller the further r_t strays. The paper keeps tau_neg > tau_pos: negative
    updates spread over the whole vocabulary and are damped sooner.

    Metrics: actor/sapo_gate_weight_mean (mean g_t), actor/ppo_kl (token mean of
    old_log_prob - log_prob).
    """
    advantages = _checked_advantages(log_prob, old_log_prob, advantages, response_mask)
    if tau_pos <= 0 or tau_neg <= 0:
        raise ValueError(f"SAPO temperatures must be > 0, got tau_pos={tau_pos}, tau_neg={tau_neg}")
    keep = response_mask.bool()
    log_ratio = torch.where(keep, log_prob - old_log_prob, 0.0)  # (B, T)
    ratio = torch.exp(log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    # Built in the ratio's dtype: a float32 1.05 would be off by 5e-8.
    tau = torch.full_like(advantages, tau_neg, dtype=ratio.dtype).masked_fill(
        advantages > 0, tau_pos
    )
    gate = torch.sigmoid(tau * (ratio - 1))  # (B, T)
    per_token = -(gate * 4 / tau) * advantages
    loss = aggregate_loss(per_token, response_mask, loss_agg_mode, global_tokens, global_seqs)

    with torch.no_grad():
        gate_weight, ppo_kl = torch.stack(
            [_masked_mean(4 * gate * (1 - gate), keep), _masked_mean(-log_ratio, keep)]
        ).tolist()  # one device sync
    return loss, {"actor/sapo_gate_weight_mean": gate_weight, "actor/ppo_kl": ppo_kl}


def select_policy_loss(name: str) -> PolicyLossFn:
    """The loss named by `actor.policy_loss`, with the common signature (PolicyLossFn).

    What each reads from PolicyLossSettings: vanilla clip_ratio_low / high / c; gspo and
    gspo_token and cispo clip_ratio_low / high; sapo sapo_tau_pos / neg; all loss_agg_mode.
    """
    if name not in _BY_NAME:
        raise ValueError(f"actor.policy_loss must be one of {list(POLICY_LOSSES)}, got {name!r}")
    return _BY_NAME[name]


def _vanilla(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    settings: PolicyLossSettings,
    global_tokens: float | None = None,
    global_seqs: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    s = settings
    return policy_loss(
        log_prob, old_log_prob, advantages, response_mask,
        clip_ratio_low=s.clip_ratio_low, clip_ratio_high=s.clip_ratio_high,
        clip_ratio_c=s.clip_ratio_c, loss_agg_mode=s.loss_agg_mode,
        global_tokens=global_tokens, global_seqs=global_seqs,
    )  # fmt: skip


def _gspo(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    settings: PolicyLossSettings,
    global_tokens: float | None = None,
    global_seqs: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    s = settings
    return gspo_loss(
        log_prob, old_log_prob, advantages, response_mask,
        s.clip_ratio_low, s.clip_ratio_high, s.loss_agg_mode, global_tokens, global_seqs,
    )  # fmt: skip


def _gspo_token(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    settings: PolicyLossSettings,
    global_tokens: float | None = None,
    global_seqs: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    s = settings
    return gspo_token_loss(
        log_prob, old_log_prob, advantages, response_mask,
        s.clip_ratio_low, s.clip_ratio_high, s.loss_agg_mode, global_tokens, global_seqs,
    )  # fmt: skip


def _cispo(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    settings: PolicyLossSettings,
    global_tokens: float | None = None,
    global_seqs: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    s = settings
    return cispo_loss(
        log_prob, old_log_prob, advantages, response_mask,
        s.clip_ratio_low, s.clip_ratio_high, s.loss_agg_mode, global_tokens, global_seqs,
    )  # fmt: skip


def _sapo(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    settings: PolicyLossSettings,
    global_tokens: float | None = None,
    global_seqs: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    s = settings
    return sapo_loss(
        log_prob, old_log_prob, advantages, response_mask,
        s.sapo_tau_pos, s.sapo_tau_neg, s.loss_agg_mode, global_tokens, global_seqs,
    )  # fmt: skip


_BY_NAME: dict[str, PolicyLossFn] = {
    "vanilla": _vanilla,
    "gspo": _gspo,
    "gspo_token": _gspo_token,
    "cispo": _cispo,
    "sapo": _sapo,
}
assert tuple(_BY_NAME) == POLICY_LOSSES  # one name, one loss


def _clipped_ratio_loss(
    ratio: torch.Tensor,
    seq_ratio: torch.Tensor,
    log_ratio: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_ratio_low: float,
    clip_ratio_high: float,
    loss_agg_mode: str,
    global_tokens: float | None,
    global_seqs: float | None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GSPO's clipped loss and metrics from its (B, T) ratio (the value s_i at every token of
    row i), the (B,) s_i and the (B, T) token log-ratios."""
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1 - clip_ratio_low, 1 + clip_ratio_high)
    per_token = torch.maximum(unclipped, clipped)  # (B, T)
    loss = aggregate_loss(per_token, response_mask, loss_agg_mode, global_tokens, global_seqs)

    with torch.no_grad():
        keep = response_mask.bool()
        seq_ratio = seq_ratio.detach()
        rows = keep.any(-1)
        some = rows.any()
        clipfrac, ppo_kl, ratio_mean, ratio_max, ratio_min = torch.stack(
            [
                _masked_mean((clipped > unclipped).to(ratio.dtype), keep),
                _masked_mean(-log_ratio, keep),
                _masked_mean(ratio.detach(), keep),
                torch.where(some, torch.where(rows, seq_ratio, -torch.inf).max(), 1.0),
                torch.where(some, torch.where(rows, seq_ratio, torch.inf).min(), 1.0),
            ]
        ).tolist()  # one device sync
    metrics = {
        "actor/pg_clipfrac": clipfrac,
        "actor/ppo_kl": ppo_kl,
        "actor/gspo_seq_ratio_mean": ratio_mean,
        "actor/gspo_seq_ratio_max": ratio_max,
        "actor/gspo_seq_ratio_min": ratio_min,
    }
    return loss, metrics


def _checked_advantages(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
) -> torch.Tensor:
    """The advantages as (B, 1) or (B, T) after checking every shape against log_prob's."""
    if not log_prob.shape == old_log_prob.shape == response_mask.shape:
        raise ValueError(
            f"log_prob {tuple(log_prob.shape)}, old_log_prob {tuple(old_log_prob.shape)} and "
            f"response_mask {tuple(response_mask.shape)} must have one shape"
        )
    if log_prob.dim() != 2:
        raise ValueError(f"log_prob must be (batch, response_len), got {tuple(log_prob.shape)}")
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1)  # (B, 1), broadcast over T
    batch, length = log_prob.shape
    if tuple(advantages.shape) not in ((batch, 1), (batch, length)):
        raise ValueError(
            f"advantages {tuple(advantages.shape)} do not fit log_prob {tuple(log_prob.shape)}"
        )
    return advantages


def _check_clip(clip_ratio_low: float, clip_ratio_high: float) -> None:
    if not 0 <= clip_ratio_low <= 1 or clip_ratio_high < 0:
        raise ValueError(
            f"clip bounds must satisfy 0 <= clip_ratio_low <= 1 and clip_ratio_high >= 0, got "
            f"{clip_ratio_low} and {clip_ratio_high}"
        )


def _row_mean(values: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """(B,) mean of each row's kept values; 0 for a row with none. values is 0 outside keep."""
    return values.sum(-1) / keep.sum(-1).clamp(min=1)


def _masked_mean(values: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Mean of values where keep is True (0 if none); NaN/inf outside keep do not leak in."""
    return torch.where(keep, values, 0.0).sum() / keep.sum().clamp(min=1)
