"""MATH (competition math) reward: the last `\\boxed{}` of a response checked with `math-verify`.

1.0 when math-verify finds the answer equivalent to the gold one (symbolically or numerically,
so `\\boxed{\\frac{1}{2}}` matches "0.5"), else 0.0; never raises on unparsable input. A
response with no `\\boxed{}` is parsed whole. The module is named `math_reward` so that it can
never shadow the stdlib `math`.

math-verify bounds each parse with `signal.alarm`, which only works on the main thread; off it
(a threaded actor, a thread pool) we parse without the timeout rather than fail every row.
"""

from __future__ import annotations

import threading
from typing import Any

from math_verify import parse, verify
from math_verify.errors import TimeoutException

_TIMEOUT_S = 5


def last_boxed(text: str) -> str | None:
    """The contents of the last `\\boxed{...}` (nested braces balanced), or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth = 0
    begin = start + len("\\boxed{")
    for i in range(begin - 1, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[begin:i]
    return None


def _parse(text: str, timeout: int | None) -> list[Any]:
    return list(parse(text, parsing_timeout=timeout))


def compute_score(solution_str: str, ground_truth: str) -> float:
    """1.0 if the response's final answer equals `ground_truth` by math-verify, else 0.0."""
    timeout = _TIMEOUT_S if threading.current_thread() is threading.main_thread() else None
    try:
        gold_text = str(ground_truth)
        # A bare gold like "x+1" needs math delimiters for math-verify's LaTeX extractor.
        gold = _parse(f"${gold_text}$", timeout) or _parse(gold_text, timeout)
        boxed = last_boxed(solution_str)
        answer = _parse(solution_str if boxed is None else f"\\boxed{{{boxed}}}", timeout)
        if not gold or not answer:
            return 0.0
        return 1.0 if verify(gold, answer, timeout_seconds=timeout) else 0.0
    except (Exception, TimeoutException):
        return 0.0
