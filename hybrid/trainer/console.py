"""What a person sees on the console: one start-up summary, a live progress bar, a compact
metrics line every `trainer.log_freq` steps, and a closing line.

Everything else (vLLM, Ray, library logs) goes to `<output_dir>/logs/` unless
`trainer.verbose=true`; warnings reach the console once each, errors always. The formatting is
small pure functions (`startup_summary`, `compact_line`, `final_summary`); `ConsoleSink` and
`configure_logging` are the thin parts that touch the terminal.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NoReturn

from rich import get_console
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from hybrid.controller.worker_dict import OnceFilter
from hybrid.trainer.config import TrainerRunConfig
from hybrid.trainer.config_derived import sync_policy

MAX_COLUMNS = 100
"""No console line of ours is wider (a compact metrics line drops fields to fit)."""

LOG_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"


def run_log_dir(output_dir: str | Path, verbose: bool) -> Path | None:
    """Where the run's logs go (<output_dir>/logs), or None when they stay on the console."""
    return None if verbose else Path(output_dir) / "logs"


# --- numbers ---------------------------------------------------------------------------------


def format_duration(seconds: float) -> str:
    """42s, 3m05s, 2h07m; "?" when unknown."""
    if not math.isfinite(seconds) or seconds < 0:
        return "?"
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def format_rate(steps_per_s: float) -> str:
    """2.4 step/s when fast, 3.1 s/step when slow."""
    if not math.isfinite(steps_per_s) or steps_per_s <= 0:
        return "? s/step"
    if steps_per_s >= 1:
        return f"{steps_per_s:.1f} step/s"
    return f"{1 / steps_per_s:.1f} s/step"


def format_value(value: float) -> str:
    """Three significant digits, no exponent for everyday magnitudes."""
    if value == 0:
        return "0"
    if 1e-3 <= abs(value) < 1e5:
        return f"{value:.3g}"
    return f"{value:.2e}"


def eta_seconds(steps_done: int, elapsed_s: float, steps_left: int) -> float:
    """Remaining time at the mean pace so far (nan before the first step)."""
    if steps_done <= 0 or elapsed_s <= 0:
        return math.nan
    return steps_left * elapsed_s / steps_done


# --- the compact metrics line ----------------------------------------------------------------

# (metric, label, priority): shown in this order; when a line would be too wide, the fields
# with the largest priority number go first. Step and ETA are always kept.
LINE_FIELDS: tuple[tuple[str, str, int], ...] = (
    ("reward/mean", "reward", 0),
    ("val/reward_mean", "val", 0),
    ("reward/errors", "reward_errors", 0),  # failed reward rows (reward.on_error=score)
    ("actor/pg_loss", "loss", 2),
    ("sft/loss", "sft_loss", 2),
    ("actor/kl_loss", "kl", 5),
    ("actor/entropy", "ent", 6),
    ("response_length/mean", "len", 3),
    ("rollout/logprob_diff_max", "lp_diff", 4),
)

SHOWN_IF_NONZERO = {"actor/kl_loss", "reward/errors"}
"""A zero here means "off" or "none": no column for it."""


def compact_line(
    step: int,
    total_steps: int,
    metrics: Mapping[str, float],
    eta_s: float = math.nan,
    width: int = MAX_COLUMNS,
) -> str:
    """One line of headline numbers, never wider than `width` (fields drop by priority)."""
    fields: list[tuple[int, str]] = []
    for key, label, priority in LINE_FIELDS:
        value = metrics.get(key)
        if value is None or (key in SHOWN_IF_NONZERO and value == 0):
            continue
        if key == "reward/errors":
            text = f"{value:.0f}"
        elif key.startswith(("reward/", "val/")):
            text = f"{value:.3f}"
        else:
            text = format_value(value)
        fields.append((priority, f"{label} {text}"))
    if "timing_s/step" in metrics:
        fields.append((1, f"{format_duration_short(metrics['timing_s/step'])}/step"))
    head = f"step {step:>{len(str(total_steps))}}/{total_steps}"
    tail = f"eta {format_duration(eta_s)}" if step < total_steps and math.isfinite(eta_s) else ""

    def render(kept: list[tuple[int, str]]) -> str:
        return "  ".join([head, *(text for _, text in kept), *([tail] if tail else [])])

    while fields and len(render(fields)) > width:
        drop = max(range(len(fields)), key=lambda i: (fields[i][0], i))
        del fields[drop]
    return render(fields)[:width]


def format_duration_short(seconds: float) -> str:
    """0.35s, 12s, 3m05s: a step's wall time."""
    return f"{seconds:.2g}s" if seconds < 10 else format_duration(seconds)


# --- start-up and closing summaries ----------------------------------------------------------


def startup_summary(
    config: TrainerRunConfig,
    facts: Mapping[str, Any],
    log_dir: str | Path | None,
    ray_address: str | None = None,
) -> list[str]:
    """The block printed once the workers are up; `facts` is rank 0's `describe()` dict."""
    c = config
    model = f"{c.model.path} ({facts['parameters']:,} parameters"
    model += f", LoRA rank {c.model.lora.rank})" if c.model.lora.enabled else ")"
    device = "GPU" if c.trainer.use_gpu else "CPU"
    where = f"Ray at {ray_address}" if ray_address else "local Ray"
    t, s = c.trainer, c.sync
    count = t.num_explorer_workers + t.num_trainer_workers if t.split else t.num_workers
    workers = f"{count} on {device}, {where}"
    if t.split:
        workers += f", split: {t.num_explorer_workers} explorer + {t.num_trainer_workers} trainer"
    if c.trainer.nnodes > 1:
        workers += f", {c.trainer.nnodes} nodes x {c.trainer.workers_per_node}"
    replicas = int(facts.get("hsdp_replicas", c.actor.hsdp_replicas))
    if replicas > 1:
        workers += f", HSDP {replicas} replicas"
        if replicas == c.trainer.training_workers:
            workers += " (the whole model on each)"
    if c.rollout.tensor_parallel_size > 1:
        workers += f", rollout tensor parallel {c.rollout.tensor_parallel_size}"
    rows = [
        ("model", model),
        ("workers", workers),
        ("hardware", str(facts["hardware"])) if facts.get("hardware") else None,
        (
            "dtypes",
            f"actor {facts['actor_dtype']}, ref {facts['ref_dtype']}, "
            f"rollout {facts['rollout_dtype']}",
        ),
        (
            "sync",
            f"{facts['sync_strategy']} (engine weights: {facts['weight_layout']}), "
            f"gather {c.sync.gather}",
        ),
        *(("engine", note) for note in facts.get("weight_notes", [])),
        ("kernels", str(facts["kernels"])) if facts.get("kernels") else None,
        (
            (
                "schedule",
                f"sync.method {s.method}, style {s.style} (interval {s.interval}, offset "
                f"{s.offset}), lag <= {sync_policy(s).lag_bound()} versions",
            )
            if t.split
            else None
        ),
        (
            "run",
            f"{c.trainer.total_steps} steps x {c.data.train_batch_size} prompts x "
            f"{c.rollout.n} samples",
        ),
        ("objective", objective) if (objective := objective_line(c)) else None,
        ("outputs", c.trainer.output_dir),
        (
            ("logs", f"{log_dir}/ (trainer.verbose=true shows them here)")
            if log_dir is not None
            else None
        ),
    ]
    title = f"hybrid: {c.algorithm.adv_estimator.upper()} with {count} {device} workers"
    return [title] + [f"  {name:<9} {value}" for name, value in filter(None, rows)]


def objective_line(config: TrainerRunConfig) -> str | None:
    """What the run optimises beyond the estimator, when it is not the plain policy loss."""
    c, parts = config, []
    if c.sft.enabled:
        parts.append(f"SFT for {c.sft.total_steps} steps first")
    if c.actor.policy_loss != "vanilla":
        parts.append(f"policy loss {c.actor.policy_loss}")
    if c.distill.enabled:
        parts.append(
            f"distillation from {c.distill.teacher_path} (coef {c.distill.coef:g}, task reward "
            f"x {c.distill.reward_coef:g})"
        )
    if c.algorithm.filter_groups.enable:
        rounds = c.algorithm.filter_groups.max_num_gen_batches
        parts.append(f"dynamic sampling (<= {rounds} rounds a step)")
    if c.reward.overlong_buffer.enable:
        parts.append(f"overlong shaping over the last {c.reward.overlong_buffer.len} tokens")
    return "; ".join(parts) or None


def final_summary(
    rewards: list[float], elapsed_s: float, final: Mapping[str, float], output_dir: str
) -> list[str]:
    """The closing lines: steps, time, reward at the start and the end, validation, outputs."""
    window = min(10, len(rewards))
    line = f"done: {len(rewards)} steps in {format_duration(elapsed_s)}"
    if window:
        first = sum(rewards[:window]) / window
        last = sum(rewards[-window:]) / window
        line += f"; mean reward, first {window} steps {first:.3f}, last {window} {last:.3f}"
    if "val/reward_mean" in final:
        line += f"; validation {final['val/reward_mean']:.3f}"
    return [line, f"outputs in {output_dir}"]


# --- the terminal ----------------------------------------------------------------------------


def line_width(console: Console) -> int:
    return min(MAX_COLUMNS, console.width) if console.is_terminal else MAX_COLUMNS


def print_lines(lines: list[str], console: Console | None = None) -> None:
    console = console or get_console()
    for line in lines:
        # soft_wrap: a long path is not broken at the console's (default 80) width.
        console.print(line, soft_wrap=True, highlight=False, markup=False)


def print_startup_summary(
    config: TrainerRunConfig, facts: Mapping[str, Any], log_dir: str | Path | None
) -> None:
    address = config.trainer.ray_address or os.environ.get("RAY_ADDRESS")
    print_lines(startup_summary(config, facts, log_dir, address))


class ConsoleSink:
    """A progress bar (step/total, elapsed, ETA, pace, latest reward) that moves every step,
    and a compact metrics line every `log_freq` steps, on the last step and with validation."""

    def __init__(self, total_steps: int, log_freq: int = 1, console: Console | None = None) -> None:
        self._console = console or get_console()
        self._total = total_steps
        self._log_freq = log_freq
        self._progress = Progress(
            TextColumn("[bold]step {task.completed}/{task.total}"),
            BarColumn(),
            TimeElapsedColumn(),
            TextColumn("eta {task.fields[eta]}  {task.fields[rate]}  reward {task.fields[reward]}"),
            console=self._console,
            transient=True,
            refresh_per_second=2,
        )
        self._task = self._progress.add_task(
            "train", total=total_steps, eta="?", rate="", reward="-"
        )
        self._started = time.monotonic()
        self._origin: tuple[int, float] | None = None
        # In a file or a pipe no bar is drawn: the metrics lines carry the ETA.
        self._live = self._console.is_terminal
        if self._live:
            self._progress.start()

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        now = time.monotonic()
        if self._origin is None:
            # The pace is measured from the first step of this process (a resumed run starts
            # late); validation before the first step is not part of it.
            self._origin = (0, now) if step == 0 else (step - 1, self._started)
        done, elapsed = step - self._origin[0], now - self._origin[1]
        eta = eta_seconds(done, elapsed, self._total - step)
        fields: dict[str, Any] = {"eta": format_duration(eta)}
        if done > 0:
            fields["rate"] = format_rate(done / elapsed)
        if "reward/mean" in metrics:
            fields["reward"] = f"{metrics['reward/mean']:.3f}"
        self._progress.update(self._task, completed=step, **fields)
        due = step % self._log_freq == 0 or step == self._total
        if due or any(key.startswith("val/") for key in metrics):
            line = compact_line(step, self._total, metrics, eta, line_width(self._console))
            print_lines([line], self._console)

    def close(self) -> None:
        if self._live:
            self._progress.stop()


# --- logging ---------------------------------------------------------------------------------


class _RichConsoleHandler(logging.Handler):
    """Log records printed through the rich console, so they land above the progress bar."""

    def __init__(self, console: Console) -> None:
        super().__init__()
        self._console = console

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record)
            level = record.levelno
            style = (
                "red" if level >= logging.ERROR else "yellow" if level >= logging.WARNING else None
            )
            self._console.print(text, style=style, soft_wrap=True, highlight=False, markup=False)
        except Exception:
            self.handleError(record)


def shown_on_console(record: logging.LogRecord) -> bool:
    """In quiet mode: our own INFO lines (a resume, a deleted checkpoint), others' warnings."""
    ours = record.name.split(".")[0] == "hybrid"
    return record.levelno >= (logging.INFO if ours else logging.WARNING)


def configure_logging(verbose: bool, log_dir: Path | None) -> None:
    """The driver's logging. Verbose: everything at INFO on the console. Quiet: everything at
    INFO into `<log_dir>/driver.log`; on the console what `shown_on_console` lets through,
    each message once (errors every time)."""
    if verbose or log_dir is None:
        logging.basicConfig(level=logging.INFO, format=LOG_FORMAT, force=True)
        return
    log_dir.mkdir(parents=True, exist_ok=True)
    to_file = logging.FileHandler(log_dir / "driver.log", delay=True)  # created on first use
    to_file.setFormatter(logging.Formatter(LOG_FORMAT))
    to_console = _RichConsoleHandler(get_console())
    to_console.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    to_console.addFilter(shown_on_console)
    to_console.addFilter(OnceFilter())
    logging.basicConfig(level=logging.INFO, handlers=[to_file, to_console], force=True)


INPUT_ERRORS = (ValueError, FileNotFoundError)
"""What the entry points' checks of the config, the model, the data and the reward files raise
on bad input: the message names the field, file or row (exit code 2)."""


def stop(program: str, error: BaseException, output_dir: str | None, code: int) -> NoReturn:
    """One line a user reads instead of a traceback (`program: error`); the traceback goes to
    output_dir/logs/error.txt once the output directory is known."""
    where = ""
    if output_dir is not None:
        path = Path(output_dir) / "logs" / "error.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(traceback.format_exception(error)))
        where = f" (traceback: {path})"
    print(f"{program}: {error}{where}", file=sys.stderr, flush=True)
    raise SystemExit(code)
