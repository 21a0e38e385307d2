"""On-policy distillation: the teacher's per-token reverse KL as the advantage.

The student samples a response; a frozen teacher scores the same tokens. On each sampled token
x_t the single-sample estimate of the reverse KL, KL(pi_student || pi_teacher), is

    d_t = log pi_student(x_t | x_<t) - log pi_teacher(x_t | x_<t)

and the distillation advantage is A_t = -coef * d_t: tokens the teacher finds likelier than the
student does are pushed up, the others down (Agarwal et al.'s GKD, 2024, with the reverse
KL; Thinking Machines' "On-Policy Distillation", 2025). The student's log-probs are the
rollout's own (`rollout_log_probs`, the sampling policy's raw log-softmax), so no extra pass is
needed. With the task reward mixed in:

    A_t = -coef * d_t + reward_coef * A_task,t

where A_task is algorithm.adv_estimator's advantage, per row (B,) or per token (B, T).

Shapes: B rows, T response tokens; log-probs, masks and per-token advantages (B, T), 0 off the
response mask.
"""

from __future__ import annotations

import torch

from hybrid.algorithms.logprob import masked_mean


def reverse_kl_advantages(
    student_log_probs: torch.Tensor,
    teacher_log_probs: torch.Tensor,
    mask: torch.Tensor,
    coef: float,
) -> torch.Tensor:
    """(B, T) -coef * (student - teacher) on the response tokens, 0 elsewhere."""
    if student_log_probs.shape != teacher_log_probs.shape or student_log_probs.shape != mask.shape:
        raise ValueError(
            f"student log-probs {tuple(student_log_probs.shape)}, teacher log-probs "
            f"{tuple(teacher_log_probs.shape)} and mask {tuple(mask.shape)} must have one shape"
        )
    gap = student_log_probs - teacher_log_probs
    # where, not a product: a padded position may hold anything (inf - inf is NaN).
    return torch.where(mask.bool(), -coef * gap, 0.0)


def mix_with_task(
    distill_advantages: torch.Tensor,
    task_advantages: torch.Tensor,
    mask: torch.Tensor,
    reward_coef: float,
) -> torch.Tensor:
    """(B, T) distill_advantages + reward_coef * task_advantages on the response tokens, 0
    elsewhere; task_advantages (B,) count on every token of their row."""
    if distill_advantages.shape != mask.shape:
        raise ValueError(
            f"distillation advantages {tuple(distill_advantages.shape)} and mask "
            f"{tuple(mask.shape)} must have one shape"
        )
    if task_advantages.dim() == 1:
        task_advantages = task_advantages[:, None].expand_as(mask)
    if task_advantages.shape != mask.shape:
        raise ValueError(
            f"task advantages {tuple(task_advantages.shape)} fit neither (B,) nor (B, T) "
            f"of the mask {tuple(mask.shape)}"
        )
    valid = mask.bool()
    if reward_coef == 0:  # distillation alone: a NaN task advantage must not leak in (0 * NaN)
        return torch.where(valid, distill_advantages, 0.0)
    mixed = distill_advantages + reward_coef * task_advantages.to(distill_advantages.dtype)
    return torch.where(valid, mixed, 0.0)


def distill_metrics(
    student_log_probs: torch.Tensor,
    teacher_log_probs: torch.Tensor,
    mask: torch.Tensor,
    distill_advantages: torch.Tensor,
) -> dict[str, float]:
    """Over the response tokens (0 for an empty mask): the means of the reverse-KL estimate
    (distill/reverse_kl), of the teacher's log-prob of the sampled tokens
    (distill/teacher_log_prob_mean) and of the distillation advantage before any task mix
    (distill/advantage_mean); the largest |student - teacher| of a token
    (distill/log_ratio_abs_max: where the two disagree most, which a mean can hide)."""
    valid = mask.bool()
    gap = torch.where(valid, student_log_probs - teacher_log_probs, 0.0)
    teacher = torch.where(valid, teacher_log_probs, 0.0)
    return {
        "distill/reverse_kl": float(masked_mean(gap, mask)),
        "distill/teacher_log_prob_mean": float(masked_mean(teacher, mask)),
        "distill/advantage_mean": float(masked_mean(distill_advantages, mask)),
        "distill/log_ratio_abs_max": float(gap.abs().max()) if gap.numel() else 0.0,
    }
