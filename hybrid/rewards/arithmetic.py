"""Arithmetic reward: the synthetic task a tiny model learns ("3+4=" -> "7").

1.0 iff the response, stripped of whitespace and chat end tokens, starts with exactly the gold
integer and the number ends there: "7" and "7<|im_end|>" score 1.0; "77", "17", "07" and
"7.5" score 0.0 (a following digit, or a decimal point and digit, makes it another number).
Text after the number is ignored: this scores correctness only, never format or length.
"""

from __future__ import annotations

import re

END_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>", "</s>")
"""Chat end tokens a decoded response may still carry."""

_INTEGER_RE = re.compile(r"[-+]?\d+")


def strip_response(text: str) -> str:
    """`text` without surrounding whitespace and end tokens (repeated until none is left)."""
    previous = None
    while previous != text:
        previous = text
        text = text.strip()
        for token in END_TOKENS:
            text = text.removeprefix(token).removesuffix(token)
    return text


def compute_score(solution_str: str, ground_truth: str | int) -> float:
    """1.0 if the response starts with exactly the integer `ground_truth`, else 0.0."""
    gold = str(ground_truth).strip()
    if not _INTEGER_RE.fullmatch(gold):
        raise ValueError(f"arithmetic ground_truth must be an integer, got {ground_truth!r}")
    gold = str(int(gold))
    answer = strip_response(solution_str)
    if not answer.startswith(gold):
        return 0.0
    rest = answer[len(gold) :]
    if rest[:1].isdigit() or (rest[:1] == "." and rest[1:2].isdigit()):
        return 0.0
    return 1.0
