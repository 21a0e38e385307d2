"""When each side of the split placement syncs: Trinity-RFT's `fixed` and
`dynamic_by_explorer` styles as pure arithmetic on step numbers and versions.

Versions: version 0 is the initial weights, published before anything starts; the trainer's
step t (1-based) turns version t-1 into version t. The explorer's step k (1-based) generates
batch k, which the trainer consumes at its step k holding version k-1, so a sample generated
with version v lags (k-1) - v versions when trained. The explorer loads the newest published
version that is >= `required_version(k)` (newer is always allowed), which bounds that lag by
`lag_bound()`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from hybrid.validation import check_choice, check_positive

SyncStyle = Literal["fixed", "dynamic_by_explorer"]


@dataclass(frozen=True)
class SyncPolicy:
    style: SyncStyle
    """fixed: the trainer publishes on a schedule; dynamic_by_explorer: when the explorer asks."""
    interval: int = 1
    """fixed: the trainer publishes after every `interval` steps."""
    offset: int = 0
    """fixed: the explorer may run `offset` steps ahead (slime's one-step-off is 1)."""
    explorer_steps: int = 1
    """dynamic: the explorer asks for new weights every `explorer_steps` of its steps."""
    max_staleness: int = 1
    """Every style: most versions a trained token may lag."""

    def __post_init__(self) -> None:
        check_choice("sync", "style", self.style, ("fixed", "dynamic_by_explorer"))
        check_positive("sync", interval=self.interval, explorer_steps=self.explorer_steps)
        for name in ("offset", "max_staleness"):
            if getattr(self, name) < 0:
                raise ValueError(f"sync.{name} must be >= 0, got {getattr(self, name)}")
        if self.style == "fixed" and self.offset + self.interval - 1 > self.max_staleness:
            raise ValueError(
                f"sync.max_staleness={self.max_staleness} is below what the fixed schedule "
                f"itself produces: sync.offset + sync.interval - 1 = "
                f"{self.offset + self.interval - 1}; raise sync.max_staleness or lower "
                "sync.offset / sync.interval"
            )

    def trainer_publishes_after(self, step: int) -> bool:
        """Whether the trainer publishes its weights after its step `step` (1-based);
        the dynamic trainer publishes only when asked."""
        _check_step("trainer", step)
        return self.style == "fixed" and step % self.interval == 0

    def required_version(self, explorer_step: int) -> int:
        """The oldest version the explorer may generate its step `explorer_step` with."""
        k = _check_step("explorer", explorer_step)
        if self.style == "fixed":
            return max(0, (k - 1 - self.offset) // self.interval * self.interval)
        return max(0, k - 1 - self.max_staleness)

    def explorer_requests(self, explorer_step: int, version_held: int) -> bool:
        """dynamic: whether the explorer asks for new weights before its step `explorer_step`
        (every `explorer_steps` steps, or when what it holds is too old); fixed: never."""
        k = _check_step("explorer", explorer_step)
        if self.style == "fixed":
            return False
        due = k > 1 and (k - 1) % self.explorer_steps == 0
        return due or version_held < self.required_version(k)

    def lag_bound(self) -> int:
        """Most versions a trained sample can lag under this schedule."""
        if self.style == "fixed":
            return self.offset + self.interval - 1
        return self.max_staleness

    def buffer_batches(self) -> int:
        """Train batches the experience buffer must hold so that the explorer never blocks on
        a full buffer while the trainer waits for it."""
        return self.lag_bound() + 1


def _check_step(side: str, step: int) -> int:
    if step < 1:
        raise ValueError(f"{side} steps are 1-based, got {step}")
    return step
