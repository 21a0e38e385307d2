"""The memory report's timeline figure: one rank's phase boundaries over a few steps.

x is the boundary index (in recording order), y is GiB. The components the ledger attributed
at each boundary are stacked areas (COMPONENTS order, one colour each, the same in every
report); the measured current is a line over them, so the gap between the stack and the line
is the unattributed memory; the interval peak (what the boundary's `peak_gib` says was reached
since the previous one) is a marker above it. The background is shaded by phase family (sync,
rollout, trainer, ref, old_log_prob, update) and dashed lines mark where each step starts.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from hybrid.memory.records import COMPONENTS, MemoryRecord

# Fixed colours, so a component looks the same in every report.
COMPONENT_COLOURS: dict[str, str] = dict(
    zip(
        COMPONENTS,
        (
            "#bab0ac",  # runtime
            "#4e79a7",  # actor_params
            "#f28e2b",  # actor_grads
            "#e15759",  # optimizer_state
            "#76b7b2",  # ref_params
            "#499894",  # teacher_params
            "#9c755f",  # critic_params
            "#d4a6c8",  # critic_grads
            "#8cd17d",  # critic_optimizer_state
            "#59a14f",  # rollout_weights
            "#edc948",  # kv_cache
            "#b07aa1",  # engine_overhead
            "#ff9da7",  # gather_buffers
        ),
        strict=True,
    )
)
_EXTRA_COLOURS = ("#17becf", "#bcbd22", "#7f7f7f", "#8c564b", "#e377c2")

PHASE_FAMILIES: dict[str, str] = {
    "sync": "#4e79a7",
    "rollout": "#59a14f",
    "trainer": "#9c9c9c",
    "ref": "#76b7b2",
    "old_log_prob": "#b07aa1",
    "values": "#9c755f",
    "update_critic": "#f28e2b",
    "update": "#e15759",
}
_OTHER_FAMILY_COLOUR = "#d9d9d9"  # init/, validate/, checkpoint/ ...

_MAX_TICK_LABELS = 120  # past this, only step starts are labelled


def family(phase: str) -> str:
    return phase.split("/", 1)[0]


def _component_order(records: Sequence[MemoryRecord]) -> list[str]:
    present = {name for r in records for name in r.components_gib}
    extras = sorted(present - set(COMPONENTS))
    return [name for name in COMPONENTS if name in present] + extras


def _colour(component: str, extras: list[str]) -> str:
    if component in COMPONENT_COLOURS:
        return COMPONENT_COLOURS[component]
    return _EXTRA_COLOURS[extras.index(component) % len(_EXTRA_COLOURS)]


def _tick_label(record: MemoryRecord) -> str:
    return record.phase if record.chunk is None else f"{record.phase}[{record.chunk}]"


def _shade_phases(ax: Axes, records: Sequence[MemoryRecord]) -> list[Patch]:
    """One span per run of boundaries of the same family; returns the legend handles."""
    used: dict[str, str] = {}
    start = 0
    for index in range(1, len(records) + 1):
        if index < len(records) and family(records[index].phase) == family(records[start].phase):
            continue
        name = family(records[start].phase)
        colour = PHASE_FAMILIES.get(name, _OTHER_FAMILY_COLOUR)
        ax.axvspan(start - 0.5, index - 0.5, color=colour, alpha=0.12, linewidth=0)
        used.setdefault(name if name in PHASE_FAMILIES else "other", colour)
        start = index
    return [Patch(color=c, alpha=0.3, label=name) for name, c in used.items()]


def _mark_steps(ax: Axes, records: Sequence[MemoryRecord]) -> None:
    for index, record in enumerate(records):
        if index == 0 or record.step != records[index - 1].step:
            ax.axvline(index - 0.5, color="black", ls="--", lw=0.8)
            ax.annotate(
                f"step {record.step}",
                (index - 0.4, 1.0),
                xycoords=("data", "axes fraction"),
                va="top",
                fontsize=8,
            )


def plot_timeline(records: Sequence[MemoryRecord], path: Path, title: str) -> None:
    """Draw `records` (one rank, in recording order) to `path` (PNG)."""
    if not records:
        raise ValueError("no records to plot")
    xs = list(range(len(records)))
    order = _component_order(records)
    extras = [name for name in order if name not in COMPONENT_COLOURS]
    # A Figure with its own Agg canvas: no pyplot, so no global backend or figure registry.
    fig = Figure(figsize=(max(10.0, min(40.0, 0.28 * len(records))), 6.5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    family_handles = _shade_phases(ax, records)
    if order:
        ax.stackplot(
            xs,
            [[r.components_gib.get(name, 0.0) for r in records] for name in order],
            labels=order,
            colors=[_colour(name, extras) for name in order],
            alpha=0.85,
        )
    ax.plot(xs, [r.current_gib for r in records], color="black", lw=1.6, label="current")
    ax.plot(
        xs,
        [r.peak_gib for r in records],
        color="#d62728",
        lw=0.8,
        ls=":",
        marker="v",
        markersize=4,
        label="peak since previous boundary",
    )
    _mark_steps(ax, records)
    if len(records) <= _MAX_TICK_LABELS:
        ax.set_xticks(xs, [_tick_label(r) for r in records], rotation=90, fontsize=6)
    ax.set_xlim(-0.5, len(records) - 0.5)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("phase boundary")
    ax.set_ylabel("GiB")
    ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)
    ax.add_artist(ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8))
    ax.legend(
        handles=family_handles,
        title="phase family",
        loc="lower left",
        bbox_to_anchor=(1.01, 0.0),
        fontsize=8,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110, format="png", bbox_inches="tight")
