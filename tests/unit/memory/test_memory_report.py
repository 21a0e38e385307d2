"""Unit tests for `profiling.memory_analysis` and `profiling.memory_report`: a hand-built
3-step, 2-rank ledger (every step phase, chunked sync and micro-batched update, init and
validate boundaries) goes through the analysis and the CLI; the report lists the phases in
order, finds the peak where it was put, computes the breakdown, flags a 50 MiB/step creep and
not a flat run, compares with the planner less what it does not predict on CPU, and fails
clearly on a malformed line or a missing snapshot."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from hybrid.memory.records import MemoryRecord, step_phases, write_records
from profiling import memory_report
from profiling.memory_analysis import (
    UNPREDICTED_ON_CPU,
    Prediction,
    breakdown,
    drift,
    global_peak,
    least_squares_slope,
    load_run,
    measured_peak,
    phase_table,
)
from profiling.memory_report import main

pytestmark = pytest.mark.unit
GRPO_PHASES = step_phases(critic=False)  # the synthetic run has no critic

REPO = Path(__file__).resolve().parents[3]
UNATTRIBUTED = 0.25
ENGINE = 0.5

# What each boundary moves (component -> GiB on the device, or "host" to park it there,
# None to free it) and the transient reached in the interval it closes.
MOVES: dict[str, tuple[dict[str, float | str | None], float]] = {
    "rollout/enter": ({}, 0.2),
    "sync/onload_actor": ({"actor_params": 1.0}, 0.0),
    "sync/wake_weights": ({"rollout_weights": 1.0}, 0.0),
    "sync/gather_load": ({"gather_buffers": 0.25}, 0.1),
    "sync/offload_actor": ({"actor_params": "host", "gather_buffers": None}, 0.0),
    "rollout/wake_kv": ({"kv_cache": 4.0}, 0.0),
    "rollout/generate": ({}, 1.0),
    "trainer/release_kv": ({"kv_cache": None, "rollout_weights": "host"}, 0.0),
    "trainer/ready": ({}, 0.0),
    "ref/onload": ({"ref_params": 1.0}, 0.0),
    "ref/forward": ({}, 1.5),
    "ref/offload": ({"ref_params": "host"}, 0.0),
    "old_log_prob/onload": ({"actor_params": 1.0}, 0.0),
    "old_log_prob/forward": ({}, 1.2),
    "old_log_prob/offload": ({"actor_params": "host"}, 0.0),
    "update/onload": ({"actor_params": 1.0, "optimizer_state": 2.0}, 0.0),
    "update/forward": ({}, 2.0),
    "update/backward": ({"actor_grads": 1.0}, 3.0),
    "update/optimizer_step": ({}, 0.5),
    "update/offload": (
        {"actor_params": "host", "optimizer_state": "host", "actor_grads": None},
        0.0,
    ),
}
REPEATS = {"sync/gather_load": 2, "update/forward": 2, "update/backward": 2}
MICRO_BATCHED = ("update/forward", "update/backward")


class Ledger:
    """Builds one rank's records the way the trainer's ledger would."""

    def __init__(self, rank: int, device: str, runtime: float) -> None:
        self.rank, self.device, self.t = rank, device, 0.0
        self.on_device: dict[str, float] = {"engine_overhead": ENGINE}
        if runtime:
            self.on_device["runtime"] = runtime
        self.on_host: dict[str, float] = {}
        self.records: list[MemoryRecord] = []

    def apply(self, moves: dict[str, float | str | None]) -> None:
        for name, where in moves.items():
            gib = self.on_device.pop(name, None) or self.on_host.pop(name, None) or 0.0
            if where == "host":
                self.on_host[name] = gib
            elif isinstance(where, float):
                self.on_device[name] = where

    def record(
        self, step: int, phase: str, transient: float, extra: float, chunk: int | None
    ) -> None:
        self.t += 0.5
        current = sum(self.on_device.values()) + UNATTRIBUTED + extra
        self.records.append(
            MemoryRecord(
                step=step,
                rank=self.rank,
                phase=phase,
                t_s=self.t,
                device=self.device,
                current_gib=current,
                peak_gib=current + transient,
                rss_gib=current + 2.0,
                reserved_gib=current + 0.5 if self.device == "cuda" else None,
                chunk=chunk,
                components_gib=dict(self.on_device),
                host_gib=dict(self.on_host),
            )
        )


def make_records(
    num_steps: int = 3,
    num_ranks: int = 2,
    device: str = "cuda",
    creep_mib: float = 0.0,
    runtime: float = 0.0,
) -> list[MemoryRecord]:
    """Step 0: init boundaries; steps 1..: every GRPO_PHASES boundary (2 sync chunks, 2
    micro-batches); a validate boundary in step 2. Rank r's backward transient is 0.5 r GiB
    higher and micro-batch 1's 0.1 GiB higher, so the peak is update/backward on the last
    rank; `creep_mib` is added to everything once per step after the first."""
    ledgers = [Ledger(rank, device, runtime) for rank in range(num_ranks)]
    out: list[MemoryRecord] = []
    for ledger in ledgers:
        ledger.apply({"actor_params": 1.0, "optimizer_state": 2.0})
        ledger.record(0, "init/actor", 0.3, 0.0, None)
        ledger.apply({"ref_params": 1.0})
        ledger.record(0, "init/ref", 0.1, 0.0, None)
        ledger.apply({"ref_params": "host", "actor_params": "host", "optimizer_state": "host"})
        ledger.apply({"rollout_weights": "host"})
        ledger.record(0, "init/rollout", 0.6, 0.0, None)
    for step in range(1, num_steps + 1):
        extra = creep_mib / 1024 * (step - 1)
        for ledger in ledgers:
            for phase in GRPO_PHASES:
                moves, transient = MOVES[phase]
                for chunk in range(REPEATS.get(phase, 1)):
                    ledger.apply(moves)
                    bump = 0.5 * ledger.rank + 0.1 * chunk if phase == "update/backward" else 0
                    index = chunk if phase in REPEATS else None
                    ledger.record(step, phase, transient + bump, extra, index)
            if step == 2:
                ledger.record(step, "validate/generate", 0.8, extra, None)
    for ledger in ledgers:  # the driver drains rank by rank, step by step
        out += ledger.records
    return sorted(out, key=lambda r: (r.step, r.rank))  # stable: keeps each rank's order


def write_run(tmp_path: Path, **kwargs: float | int | str) -> Path:
    write_records(tmp_path / "memory.jsonl", make_records(**kwargs))  # type: ignore[arg-type]
    return tmp_path


def section(markdown: str, title: str) -> str:
    start = markdown.index(f"## {title}")
    end = markdown.find("\n## ", start + 1)
    return markdown[start : end if end >= 0 else None]


def first_cells(table_text: str) -> list[str]:
    return [
        line.split("|")[1].strip().strip("`")
        for line in table_text.splitlines()
        if line.startswith("| `")
    ]


# --- analysis -----------------------------------------------------------------------------


def test_phase_table_orders_and_aggregates(tmp_path: Path) -> None:
    run = load_run(write_run(tmp_path))
    rows = phase_table(run)
    others = ["init/actor", "init/ref", "init/rollout", "validate/generate"]
    assert [row.phase for row in rows] == [*GRPO_PHASES, *others]
    by_phase = {row.phase: row for row in rows}
    assert by_phase["sync/gather_load"].count_per_step == 2
    assert by_phase["update/backward"].count_per_step == 2
    assert by_phase["trainer/ready"].count_per_step == 1
    assert run.steady_steps == [2, 3]
    # repeats: max over micro-batches (chunk 1's transient is 0.1 higher)
    current = by_phase["update/backward"].current_gib[1]
    assert by_phase["update/backward"].peak_gib[1] == pytest.approx(current + 3.6)


def test_global_peak_and_transient(tmp_path: Path) -> None:
    top = global_peak(load_run(write_run(tmp_path, creep_mib=1.0)))
    assert (top.phase, top.rank, top.step, top.chunk) == ("update/backward", 1, 3, 1)
    assert top.peak_gib - top.attributed_gib == pytest.approx(3.6 + UNATTRIBUTED + 2 / 1024)


def test_breakdown_percentages(tmp_path: Path) -> None:
    run = load_run(write_run(tmp_path))
    trainer = breakdown(run, "trainer")
    assert [(b.rank, b.step) for b in trainer] == [(0, 3), (1, 3)]
    assert trainer[0].attributed_gib == pytest.approx(ENGINE)
    assert trainer[0].unattributed_gib == pytest.approx(UNATTRIBUTED)
    assert trainer[0].attributed_pct == pytest.approx(100 * 0.5 / 0.75)
    assert trainer[0].host_gib == {
        "actor_params": 1.0,
        "optimizer_state": 2.0,
        "ref_params": 1.0,
        "rollout_weights": 1.0,
    }
    rollout = breakdown(run, "rollout")[0]
    assert rollout.components_gib == {
        "engine_overhead": 0.5,
        "rollout_weights": 1.0,
        "kv_cache": 4.0,
    }
    assert rollout.attributed_pct == pytest.approx(100 * 5.5 / 5.75)


def test_least_squares_slope() -> None:
    assert least_squares_slope([1, 2, 3, 4], [1.0, 3.0, 5.0, 7.0]) == pytest.approx(2.0)
    assert least_squares_slope([2], [1.0]) is None


def test_drift_flags_a_creep_and_not_a_flat_run(tmp_path: Path) -> None:
    creeping = load_run(write_run(tmp_path / "creep", creep_mib=50.0))
    for mode in ("trainer", "rollout"):
        for d in drift(creeping, mode):
            assert d.slope_mib_per_step == pytest.approx(50.0)
            assert d.creeping
    flat = load_run(write_run(tmp_path / "flat"))
    assert not any(d.creeping for mode in ("trainer", "rollout") for d in drift(flat, mode))


def test_measured_peak_leaves_out_the_named_components(tmp_path: Path) -> None:
    run = load_run(write_run(tmp_path, device="cpu", runtime=0.4))
    peaks = [r.peak_gib for r in run.records if r.phase == "update/backward" and r.step >= 2]
    assert measured_peak(run, "update/backward") == pytest.approx(max(peaks))
    # every record holds runtime 0.4 and engine_overhead ENGINE: both come off on CPU
    on_cpu = measured_peak(run, "update/backward", UNPREDICTED_ON_CPU)
    assert on_cpu == pytest.approx(max(peaks) - 0.4 - ENGINE)
    assert measured_peak(run, "ref/missing", UNPREDICTED_ON_CPU) is None


def test_resumed_run_keeps_the_latest_recording(tmp_path: Path) -> None:
    records = make_records(num_steps=3)
    resumed = make_records(num_steps=3, creep_mib=10.0)
    # the resumed run records step 0 again, then steps 2.. (its checkpoint was step 1)
    again = [r for r in resumed if r.step in (0, 2, 3)]
    write_records(tmp_path / "memory.jsonl", records + again)
    run = load_run(tmp_path)
    assert run.replaced == len([r for r in records if r.step in (0, 2, 3)])
    assert len(run.records) == len(records)
    assert max(r.current_gib for r in run.records if r.step == 3) == max(
        r.current_gib for r in again if r.step == 3
    )


# --- the CLI and the report -----------------------------------------------------------------


def test_cli_writes_the_report_and_a_png(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "profiling.memory_report", str(run_dir)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    report, png = run_dir / "memory_report.md", run_dir / "memory_timeline.png"
    assert done.stdout.splitlines()[0] == str(report)
    assert "global peak" in done.stdout and "update/backward (rank 1" in done.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 1000
    markdown = report.read_text()
    others = ["init/actor", "init/ref", "init/rollout", "validate/generate"]
    assert first_cells(section(markdown, "Per phase")) == [*GRPO_PHASES, *others]
    assert "in the interval closed by `update/backward` (micro-batch 1), rank 1" in markdown
    breakdown_text = section(markdown, "Component breakdown")
    assert "| attributed / measured | 66.7% | 66.7% |" in breakdown_text
    assert "| attributed / measured | 95.7% | 95.7% |" in breakdown_text
    assert "Offloaded to host memory in trainer mode" in breakdown_text
    assert "No drift" in markdown and "**Warning**" not in markdown
    assert "Predicted vs measured" not in markdown  # no config.json, no --predict
    assert "trainer.memory_snapshot_step" in markdown
    assert "![memory timeline](memory_timeline.png)" in markdown


def test_report_warns_on_drift(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = write_run(tmp_path / "run", creep_mib=50.0)
    out = tmp_path / "report"
    assert main([str(run_dir), "--out", str(out), "--steps", "1:3", "--rank", "1"]) == 0
    markdown = (out / "memory_report.md").read_text()
    assert "**Warning**: trainer-mode memory on rank 0 grows 50.0 MiB/step" in markdown
    assert "**Warning**: rollout-mode memory on rank 1 grows 50.0 MiB/step" in markdown
    assert (out / "memory_timeline.png").stat().st_size > 0
    assert not (run_dir / "memory_report.md").exists()


def test_malformed_line_names_the_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = write_run(tmp_path, num_steps=1)
    lines = (run_dir / "memory.jsonl").read_text().splitlines()
    lines.insert(4, '{"step": 1, "rank": 0')
    (run_dir / "memory.jsonl").write_text("\n".join(lines) + "\n")
    assert main([str(run_dir)]) == 1
    assert f"{run_dir / 'memory.jsonl'}:5" in capsys.readouterr().err
    assert not (run_dir / "memory_report.md").exists()


@pytest.mark.parametrize("content", [None, "", "\n\n"])
def test_missing_or_empty_ledger(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | None
) -> None:
    if content is not None:
        (tmp_path / "memory.jsonl").write_text(content)
    assert main([str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert str(tmp_path / "memory.jsonl") in err
    assert ("does not exist" if content is None else "empty") in err


def test_snapshot_required_but_missing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = write_run(tmp_path)
    assert main([str(run_dir), "--snapshot"]) == 1
    assert "trainer.memory_snapshot_step=K" in capsys.readouterr().err


def test_snapshots_are_linked(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "run")
    (run_dir / "memory_snapshots").mkdir()
    (run_dir / "memory_snapshots" / "step2_rank0.pickle").write_bytes(b"\x80\x04N.")
    out = tmp_path / "report"
    assert main([str(run_dir), "--snapshot", "--out", str(out)]) == 0
    markdown = (out / "memory_report.md").read_text()
    assert "[step2_rank0.pickle](../run/memory_snapshots/step2_rank0.pickle)" in markdown
    assert "https://pytorch.org/memory_viz" in markdown


def test_prediction_unavailable_without_config(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path)
    assert main([str(run_dir), "--predict"]) == 0
    text = section((run_dir / "memory_report.md").read_text(), "Predicted vs measured")
    assert "Prediction unavailable: no" in text and "config.json" in text


def test_prediction_on_cpu_leaves_out_what_the_planner_does_not_predict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = write_run(tmp_path, device="cpu", runtime=0.4)
    config = SimpleNamespace(model=SimpleNamespace(path="tiny"))
    monkeypatch.setattr(memory_report, "load_config", lambda _: config)
    seen: dict[str, object] = {}

    def fake_planner(config_: object, model: str, gpu_memory_gib: float) -> Prediction:
        seen.update(config=config_, model=model, gib=gpu_memory_gib)
        run = load_run(run_dir)
        # the planner predicts runtime and engine_overhead as 0 on CPU
        backward = max(
            r.peak_gib - 0.4 - ENGINE for r in run.records if r.phase == "update/backward"
        )
        peaks = {"update/backward": backward * 1.1}
        return Prediction(peaks, "update/backward", True, model, gpu_memory_gib)

    monkeypatch.setattr(memory_report, "planner_prediction", fake_planner)
    assert main([str(run_dir), "--predict", "--gpu-memory-gib", "24"]) == 0
    assert seen == {"config": config, "model": "tiny", "gib": 24.0}
    text = section((run_dir / "memory_report.md").read_text(), "Predicted vs measured")
    assert "Planner for model `tiny` on a 24 GiB device" in text
    assert "minus the `runtime` and `engine_overhead` components of the same record" in text
    assert "| `update/backward` |" in text and "| +10.0% |" in text
