"""GSM8K reward: the final number of a response against the gold number.

Two extraction methods, as in verl's `gsm8k` scorer:
  - "strict": the answer must be written `#### N` (the last such marker counts);
  - "flexible": the last number anywhere in the text ("The answer is $1,234." -> 1234).

Answers compare as numbers, not strings: thousands commas, `$`, a leading `+` and a trailing
period are dropped and the rest is read as an exact `Decimal`, so "1,600" == "1600" and
"5.0" == "5" (GSM8K golds are integers, some negative, some written with commas; a model that
writes "5.0" has the right answer). Text that is not a number compares as a stripped string.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Literal

# A sign only counts when it does not follow a word or ")", so "10-3=7" holds 10, 3 and 7, not -3.
# Thousands groups need exactly three digits ("1,234", not "1,2345"); a trailing period is left out.
_NUMBER = r"(?:(?<![\w)])[-+])?\$?(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?"
_NUMBER_RE = re.compile(_NUMBER)
_STRICT_RE = re.compile(r"####\s*(" + _NUMBER + ")")


def normalize_number(text: str) -> str:
    """The canonical form of a number: "$1,234." -> "1234", "+5.0" -> "5", "-0" -> "0".

    Text that does not read as a finite number comes back stripped, commas and `$` removed.
    """
    cleaned = text.strip().replace(",", "").replace("$", "").rstrip(".").removeprefix("+")
    try:
        value = Decimal(cleaned)
    except InvalidOperation:
        return cleaned
    if not value.is_finite():
        return cleaned
    if value == value.to_integral_value():
        return str(int(value))
    return format(value.normalize(), "f")


def extract_answer(
    solution_str: str, method: Literal["strict", "flexible"] = "strict"
) -> str | None:
    """The answer a response gives (as written, not normalised), or None when it gives none."""
    if method == "strict":
        matches = _STRICT_RE.findall(solution_str)
    elif method == "flexible":
        matches = _NUMBER_RE.findall(solution_str)
    else:
        raise ValueError(f"method must be one of ['strict', 'flexible'], got {method!r}")
    return matches[-1] if matches else None


def extract_gsm8k_gold(answer_field: str) -> str:
    """The normalised gold number of a raw GSM8K `answer` field ("... #### 1,600" -> "1600")."""
    if "####" not in answer_field:
        raise ValueError(f"GSM8K answer field has no '#### N' marker: {answer_field[-200:]!r}")
    return normalize_number(answer_field.rsplit("####", 1)[1])


def compute_score(
    solution_str: str,
    ground_truth: str,
    method: Literal["strict", "flexible"] = "strict",
    format_score: float = 0.0,
    score: float = 1.0,
) -> float:
    """`score` for the right number, `format_score` for a wrong one, 0.0 when none is found."""
    answer = extract_answer(solution_str, method)
    if answer is None:
        return 0.0
    if normalize_number(answer) == normalize_number(str(ground_truth)):
        return score
    return format_score
