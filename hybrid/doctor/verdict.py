"""The doctor's verdicts: one `Check` per line of its report, and the `Report` they make."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

Level = Literal["ok", "warn", "FAIL"]


@dataclass(frozen=True)
class Check:
    section: str
    """versions, gpus, environment, attention, rollout, memory, inputs."""
    level: Level
    what: str
    """The short statement; for a FAIL, what is missing (the JSON's `missing` lists these)."""
    reason: str = ""
    fix: str = ""


@dataclass(frozen=True)
class PlanSummary:
    fits: bool
    peak_gib: float
    margin_gib: float
    peak_phase: str
    memory_gib: float
    """Memory per worker planned for (a GPU's, or the host's share on CPU)."""
    memory_source: str
    """Where memory_gib came from: "detected", "assumed" or "host RAM / workers"."""
    model: str
    parameters: int = 0
    active_parameters: int = 0
    """Those one token computes with (below `parameters` for a mixture of experts)."""


@dataclass(frozen=True)
class Report:
    config: str
    device: str
    """"cuda" (trainer.use_gpu) or "cpu"."""
    checks: tuple[Check, ...]
    versions: Mapping[str, str | None] = field(default_factory=dict)
    plan: PlanSummary | None = None

    @property
    def can_run(self) -> bool:
        return not self.missing

    @property
    def missing(self) -> list[str]:
        return [check.what for check in self.checks if check.level == "FAIL"]

    @property
    def warnings(self) -> list[str]:
        return [
            f"{check.what}: {check.reason}" if check.reason else check.what
            for check in self.checks
            if check.level == "warn"
        ]
