"""The built-in rewards by `data_source`, and custom reward functions loaded from a file.

`compute_score(data_source, solution_str, ground_truth, extra_info)` is the signature verl
users already write; a custom function with that signature replaces the built-ins wholesale
(see `load_reward_function` and `RewardManager`). It returns a float, or a dict holding at
least "score" (its other numeric keys become metrics).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from hybrid.rewards import arithmetic, code, countdown, digits, gsm8k, math_reward
from hybrid.userfiles import import_python_file

RewardFn = Callable[[str, str, Any, dict[str, Any] | None], float | dict[str, Any]]
"""compute_score(data_source, solution_str, ground_truth, extra_info) -> float | {"score": ...}"""

BUILTIN_REWARDS: Mapping[str, Callable[..., float | dict[str, Any]]] = {
    "openai/gsm8k": gsm8k.compute_score,
    "gsm8k": gsm8k.compute_score,
    "math": math_reward.compute_score,
    "lighteval/MATH": math_reward.compute_score,
    "DigitalLearningGmbH/MATH-lighteval": math_reward.compute_score,
    "hiyouga/geometry3k": math_reward.compute_score,
    "countdown": countdown.compute_score,
    "arithmetic": arithmetic.compute_score,
    "code": code.compute_score,
    "digits_vl": digits.compute_score,
}
"""data_source -> the built-in scorer, called as fn(solution_str, ground_truth); `code` also
takes the row's extra_info (its per-row sandbox limits)."""


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict[str, Any] | None = None,
) -> float | dict[str, Any]:
    """Score one response with the built-in reward for `data_source`.

    `ground_truth` is a string for most tasks; countdown takes a dict (or JSON string) with
    "target" and "numbers"; code a JSON object of tests (hybrid/rewards/code.py). `extra_info`
    reaches only the code reward (extra_info["sandbox"]: that row's sandbox limits).
    """
    fn = BUILTIN_REWARDS.get(str(data_source))
    if fn is None:
        raise ValueError(
            f"no built-in reward for data_source {data_source!r}; known: {sorted(BUILTIN_REWARDS)}. "
            "For another dataset, configure a custom reward function (a Python file defining "
            "compute_score(data_source, solution_str, ground_truth, extra_info))."
        )
    if fn is code.compute_score:
        return code.compute_score(solution_str, ground_truth, extra_info)
    return fn(solution_str, ground_truth)


def load_reward_function(path: str, name: str = "compute_score") -> Callable[..., Any]:
    """Load the function `name` from the Python file at `path` (not from an installed module)."""
    module = import_python_file(path, "hybrid_custom_reward", "custom reward file")
    fn = getattr(module, name, None)
    if fn is None:
        raise AttributeError(f"custom reward file {path} defines no function {name!r}")
    if not callable(fn):
        raise TypeError(
            f"{name!r} in custom reward file {path} is a {type(fn).__name__}, not callable"
        )
    return fn
