"""The agent demo's reward (hybrid/data/agent_task.py).

1 when the model's final turn is the vault's code. A trajectory that called the tool and did
not end in the code gets 0.1, plus 0.3 per digit it put in the right place: the steps from
"call the tool" to "repeat what it showed" each pay a little. Without a tool call nothing but
the exact code pays, so a model that cannot call the tool (the control run) can only guess,
1 in 100.
"""

from __future__ import annotations

from typing import Any

CALL_CREDIT = 0.1
DIGIT_CREDIT = 0.3


def compute_score(
    data_source: str, solution_str: str, ground_truth: str, extra_info: dict[str, Any] | None
) -> float:
    agent = (extra_info or {}).get("agent") or {}
    answer = str(agent.get("final_text", solution_str)).strip()
    if answer == ground_truth:
        return 1.0
    if agent.get("tool_calls", 0) == 0:
        return 0.0
    placed = sum(a == b for a, b in zip(answer, ground_truth, strict=False))
    return CALL_CREDIT + DIGIT_CREDIT * placed
