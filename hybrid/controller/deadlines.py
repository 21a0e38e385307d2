"""How long the driver waits for a phase before it calls the run stalled.

A phase is one group call (`member.method`: a generation, an update, a weight publish, a
checkpoint save) or one driver-side wait (a queue take). Its deadline scales with the work the
run has already seen it do: `scale` times the slowest it took so far in this run, never below
the floor (`trainer.stall_timeout_s`). The first call of a phase has no history and includes
one-time work (model build, engine start, kernel compilation, a cold page cache), so it gets
`first_scale` times the floor.

Pure bookkeeping: the waits that use it (hybrid/controller/worker_group.py) check the deadline
themselves, with a timeout, and never block past it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from hybrid.validation import check_timeout

SCALE = 4.0
"""A phase may take this many times the slowest it took earlier in the run."""

FIRST_SCALE = 3.0
"""The first call of a phase may take this many times the floor."""


@dataclass(eq=False)
class Deadlines:
    floor_s: float
    """trainer.stall_timeout_s: no phase's deadline is shorter."""
    scale: float = SCALE
    first_scale: float = FIRST_SCALE
    watches: list[Any] = field(default_factory=list)
    """The worker groups that share this clock (hybrid/controller/stall.py `Watch`): a stall
    in one names a stopped worker in any of them."""
    _slowest: dict[str, float] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        check_timeout("trainer.stall_timeout_s", self.floor_s)

    def for_phase(self, phase: str) -> float:
        """Seconds the next call of `phase` may take."""
        with self._lock:
            slowest = self._slowest.get(phase)
        if slowest is None:
            return self.first_scale * self.floor_s
        return max(self.floor_s, self.scale * slowest)

    def done(self, phase: str, seconds: float) -> None:
        """A call of `phase` finished after `seconds`."""
        with self._lock:
            self._slowest[phase] = max(seconds, self._slowest.get(phase, 0.0))

    def rule(self, phase: str) -> str:
        """How `for_phase` got its number, for an error message."""
        with self._lock:
            slowest = self._slowest.get(phase)
        if slowest is None:
            return f"first call: {self.first_scale:g} x trainer.stall_timeout_s={self.floor_s:g}"
        return (
            f"max(trainer.stall_timeout_s={self.floor_s:g}, {self.scale:g} x the slowest "
            f"earlier call {slowest:.3g}s)"
        )
