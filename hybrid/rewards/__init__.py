"""Rule-based rewards: built-in scorers by `data_source`, custom ones from a file, and the
`RewardManager` that scores a `Batch`.

Built-ins: gsm8k (`#### N` or last number), math (math-verify on the last `\\boxed{}`),
countdown (TinyZero's equation task), arithmetic (the synthetic "3+4=" task).
"""

from hybrid.rewards.manager import RewardManager
from hybrid.rewards.registry import (
    BUILTIN_REWARDS,
    RewardFn,
    compute_score,
    load_reward_function,
)

__all__ = ["BUILTIN_REWARDS", "RewardFn", "RewardManager", "compute_score", "load_reward_function"]
