"""Countdown reward (TinyZero's task): reach `target` using each of `numbers` exactly once.

The response writes its equation as `<answer>(25 - 5) * 4 / 2</answer>`; the last answer tag
counts. Scores follow TinyZero: `score` for a correct equation, `format_score` for an answer tag
whose content is wrong in any way (bad characters, numbers reused, missing or extra, a division
by zero, a wrong value), 0.0 when there is no answer tag at all.

The equation is never passed to `eval`: it is parsed with `ast` and walked with only numbers,
unary +/- and binary + - * / allowed, in exact `Fraction` arithmetic.
"""

from __future__ import annotations

import ast
import json
import re
from collections import Counter
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_ALLOWED_RE = re.compile(r"[\d+\-*/()\s]+")
_TOLERANCE = 1e-5
_BINARY_OPS = (ast.Add, ast.Sub, ast.Mult, ast.Div)


def parse_ground_truth(ground_truth: Mapping[str, Any] | str) -> tuple[int, list[int]]:
    """`(target, numbers)` from a dict-like or a JSON string {"target": int, "numbers": [ints]}."""
    data = json.loads(ground_truth) if isinstance(ground_truth, str | bytes) else ground_truth
    if not isinstance(data, Mapping) or "target" not in data or "numbers" not in data:
        raise ValueError(
            f"countdown ground_truth must hold 'target' and 'numbers', got {ground_truth!r}"
        )
    return int(data["target"]), [int(n) for n in data["numbers"]]


def extract_equation(solution_str: str) -> str | None:
    """The stripped contents of the last `<answer>...</answer>`, or None."""
    matches = _ANSWER_RE.findall(solution_str)
    return matches[-1].strip() if matches else None


def evaluate(equation: str) -> Fraction:
    """The exact value of an arithmetic expression; ValueError for anything else.

    Raises ValueError (a disallowed node or character), SyntaxError or ZeroDivisionError.
    """
    if not _ALLOWED_RE.fullmatch(equation):
        raise ValueError(f"equation has characters other than digits, + - * / ( ): {equation!r}")
    return _eval_node(ast.parse(equation, mode="eval").body)


def _eval_node(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return Fraction(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.UAdd | ast.USub):
        value = _eval_node(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and isinstance(node.op, _BINARY_OPS):
        left, right = _eval_node(node.left), _eval_node(node.right)
        if isinstance(node.op, ast.Add):
            return left + right
        if isinstance(node.op, ast.Sub):
            return left - right
        if isinstance(node.op, ast.Mult):
            return left * right
        return left / right
    raise ValueError(f"disallowed expression node {type(node).__name__}")


def compute_score(
    solution_str: str,
    ground_truth: Mapping[str, Any] | str,
    format_score: float = 0.1,
    score: float = 1.0,
) -> float:
    """`score` if the last answer tag reaches the target with each number once, else see above."""
    target, numbers = parse_ground_truth(ground_truth)
    equation = extract_equation(solution_str)
    if equation is None:
        return 0.0
    used = [int(n) for n in re.findall(r"\d+", equation)]
    if Counter(used) != Counter(numbers):
        return format_score
    try:
        value = evaluate(equation)
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError, MemoryError):
        return format_score
    return score if abs(value - target) < _TOLERANCE else format_score
