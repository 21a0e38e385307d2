"""Rule-based rewards: built-in scorers by `data_source`, custom ones from a file, and the
`RewardManager` that scores a `Batch` (in a `RewardPool` of processes, each call under a
deadline).

Built-ins: gsm8k (`#### N` or last number), math (math-verify on the last `\\boxed{}`),
countdown (TinyZero's equation task), arithmetic (the synthetic "3+4=" task).
"""

from typing import TYPE_CHECKING, Any

from hybrid.rewards.registry import (
    BUILTIN_REWARDS,
    RewardFn,
    compute_score,
    load_reward_function,
)

if TYPE_CHECKING:
    from hybrid.rewards.manager import RewardManager

__all__ = ["BUILTIN_REWARDS", "RewardFn", "RewardManager", "compute_score", "load_reward_function"]


def __getattr__(name: str) -> Any:
    # The manager (torch, the process pool) loads on first use: the reward processes import
    # this package to unpickle a built-in scorer and need none of it.
    if name == "RewardManager":
        from hybrid.rewards.manager import RewardManager

        return RewardManager
    raise AttributeError(f"module 'hybrid.rewards' has no attribute {name!r}")
