"""What one reward call gave: a finite score (with its extra metrics) or a named kind of error.

Pure and light (no torch): the pool's worker processes import it.
"""

from __future__ import annotations

import math
from numbers import Real
from typing import Any, Literal

ERROR_KINDS = ("timeout", "exception", "not_finite", "wrong_type")
"""timeout: no score within reward.timeout_s; exception: the function raised (or its process
died); not_finite: NaN or inf; wrong_type: neither a number nor a dict with a numeric 'score'."""

OnError = Literal["fail", "score"]
"""What a failed row does (reward.on_error): stop the run naming it, or score error_score."""

Outcome = tuple[str, Any, dict[str, float]]
"""("ok", score, extras) or (kind, message, {}) with kind in ERROR_KINDS."""


def checked_outcome(result: Any) -> Outcome:
    """The outcome of a reward function's return value: a float, or a dict holding 'score'
    (its other numeric keys become metrics)."""
    extras: dict[str, float] = {}
    if isinstance(result, dict):
        if "score" not in result:
            return ("wrong_type", f"a dict without a 'score' key (keys: {sorted(result)})", {})
        extras = {
            str(k): float(v) for k, v in result.items() if k != "score" and isinstance(v, Real)
        }
        result = result["score"]
    if not isinstance(result, Real):  # bools count as 0 / 1
        return ("wrong_type", f"a {type(result).__name__} ({result!r:.60}), not a number", {})
    value = float(result)
    if not math.isfinite(value):
        return ("not_finite", f"the score is {value}", {})
    return ("ok", value, extras)
