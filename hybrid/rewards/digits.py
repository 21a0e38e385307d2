"""Digit-reading reward: the vision-language demo task (hybrid/data/digits_task.py).

1.0 iff the response, stripped of whitespace and chat end tokens, is exactly the gold digit:
"7" and "7<|im_end|>" score 1.0; "77", "7+0" and "" score 0.0. Exact match, so a model cannot
collect reward by listing digits.
"""

from __future__ import annotations

from hybrid.rewards.arithmetic import strip_response


def compute_score(solution_str: str, ground_truth: str | int) -> float:
    """1.0 if the stripped response equals `ground_truth` exactly, else 0.0."""
    return 1.0 if strip_response(solution_str) == str(ground_truth).strip() else 0.0
