"""What the console shows while an evaluation generates: a progress bar on a terminal (prompts
done, elapsed, ETA, samples per second, the running mean score), a plain line per batch
otherwise (a log file or a pipe keeps every line)."""

from __future__ import annotations

import math
import time

from rich import get_console
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn


def format_duration(seconds: float) -> str:
    """42s, 3m05s, 2h07m."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def progress_line(done: int, total: int, samples: int, mean_score: float, elapsed_s: float) -> str:
    """`prompts 64/100  samples 512  mean score 0.812  23s  eta 13s  22.3 samples/s`."""
    rate = samples / elapsed_s if elapsed_s > 0 else 0.0
    eta = elapsed_s * (total - done) / done if done else float("nan")
    parts = [
        f"prompts {done}/{total}",
        f"samples {samples}",
        f"mean score {mean_score:.3f}",
        format_duration(elapsed_s),
    ]
    if done < total and math.isfinite(eta):
        parts.append(f"eta {format_duration(eta)}")
    parts.append(f"{rate:.1f} samples/s")
    return "  ".join(parts)


class EvalProgress:
    def __init__(self, total_prompts: int, console: Console | None = None) -> None:
        self._console = console or get_console()
        self._total = total_prompts
        self._done = self._samples = 0
        self._score_sum = 0.0
        self._started = time.monotonic()
        self._live = self._console.is_terminal
        self._bar = Progress(
            TextColumn("[bold]prompts {task.completed}/{task.total}"),
            BarColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[line]}"),
            console=self._console,
            transient=True,
            refresh_per_second=2,
        )
        self._task = self._bar.add_task("eval", total=total_prompts, line="starting the engines")
        if self._live:
            self._bar.start()

    def advance(self, prompts: int, scores: list[float]) -> None:
        """`prompts` more prompts are scored, with these sample scores."""
        self._done += prompts
        self._samples += len(scores)
        self._score_sum += sum(scores)
        mean = self._score_sum / self._samples if self._samples else float("nan")
        elapsed = time.monotonic() - self._started
        line = progress_line(self._done, self._total, self._samples, mean, elapsed)
        if self._live:
            tail = line.split("  ", 1)[1]  # the bar shows the prompt count itself
            self._bar.update(self._task, completed=self._done, line=tail)
        else:
            self._console.print(line, soft_wrap=True, highlight=False, markup=False)

    def close(self) -> None:
        if self._live:
            self._bar.stop()
