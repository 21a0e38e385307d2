"""The answer a response gives, as the reward for its data source reads it: what maj@k votes on
(hybrid/evaluation/estimators.py). None means nothing was parsed (such a sample never wins a
vote while a parsed answer is drawn).

Built-in data sources read the way their reward does: gsm8k the `#### N` number (normalised, so
"1,600" and "1600" are one answer), math and geometry3k the last `\\boxed{...}`, arithmetic the
number the response starts with, digits_vl the whole stripped response (its reward compares
exactly that), countdown the equation in the last `<answer>` tag; code has no answer to vote on
(None). A custom reward file (reward.custom_path) may define
`extract_answer(data_source, solution_str) -> str | None`; `answer_function` loads it, and a
custom file without one votes on the stripped response, since the built-in readers need not be
what its `compute_score` compares. So does a data source without a built-in reader.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import cast

from hybrid.rewards import countdown, gsm8k, math_reward
from hybrid.rewards.arithmetic import strip_response
from hybrid.userfiles import import_python_file

AnswerFn = Callable[[str, str], str | None]
"""extract_answer(data_source, solution_str) -> the parsed answer, or None."""

_LEADING_NUMBER_RE = re.compile(r"[-+]?\d+(?:\.\d+)?")


def _gsm8k(solution_str: str) -> str | None:
    answer = gsm8k.extract_answer(solution_str)
    return None if answer is None else gsm8k.normalize_number(answer)


def _boxed(solution_str: str) -> str | None:
    boxed = math_reward.last_boxed(solution_str)
    return boxed.strip() if boxed is not None and boxed.strip() else None


def _leading_number(solution_str: str) -> str | None:
    """The number the stripped response starts with ("7.5" is not "7", as for the reward)."""
    match = _LEADING_NUMBER_RE.match(strip_response(solution_str))
    return match.group() if match else None


def _equation(solution_str: str) -> str | None:
    equation = countdown.extract_equation(solution_str)
    return None if not equation else "".join(equation.split())


def _no_answer(solution_str: str) -> str | None:
    return None


def stripped(solution_str: str) -> str | None:
    """The response without surrounding whitespace and end tokens (None when empty)."""
    return strip_response(solution_str) or None


BUILTIN_ANSWERS: Mapping[str, Callable[[str], str | None]] = {
    "openai/gsm8k": _gsm8k,
    "gsm8k": _gsm8k,
    "math": _boxed,
    "lighteval/MATH": _boxed,
    "DigitalLearningGmbH/MATH-lighteval": _boxed,
    "hiyouga/geometry3k": _boxed,
    "countdown": _equation,
    "arithmetic": _leading_number,
    "code": _no_answer,
    "digits_vl": stripped,
}
"""data_source -> the answer its built-in reward (hybrid/rewards/registry.py) compares."""


def extract_answer(
    data_source: str, solution_str: str, custom: AnswerFn | None = None
) -> str | None:
    """The answer `solution_str` gives: `custom(data_source, solution_str)` when given, else
    the built-in reader of `data_source`, else the stripped response."""
    if custom is not None:
        answer = custom(data_source, solution_str)
        return None if answer is None else str(answer)
    reader = BUILTIN_ANSWERS.get(str(data_source), stripped)
    return reader(solution_str)


def _stripped_of_any_source(data_source: str, solution_str: str) -> str | None:
    return stripped(solution_str)


def answer_function(custom_path: str | None) -> AnswerFn | None:
    """The `custom` argument of `extract_answer` for a run: None without a custom reward file
    (the built-in readers); with one, its `extract_answer` if it defines it, else a reader of
    the stripped response."""
    if custom_path is None:
        return None
    module = import_python_file(custom_path, "hybrid_custom_answers", "custom reward file")
    fn = getattr(module, "extract_answer", None)
    if fn is None:
        return _stripped_of_any_source
    if not callable(fn):
        raise TypeError(
            f"'extract_answer' in custom reward file {custom_path} is a {type(fn).__name__}, "
            "not callable"
        )
    return cast(AnswerFn, fn)
