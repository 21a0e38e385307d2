"""Metrics: reduced over ranks in one place, written to one sink interface (the console sink
lives in hybrid/trainer/console.py).

Namespaces: actor/, rollout/, reward/, response_length/, timing_s/, perf/, memory/, val/.
`reduce_over_ranks` takes the per-rank dicts a group call returns: memory is reported as the
max over ranks (the binding one), everything else as the mean.

A resumed run continues `metrics.jsonl` where its checkpoint left it: `drop_rows_after` takes
out the rows a crashed run logged after that checkpoint (they are kept beside the file), so
each step appears once.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

from hybrid.trainer.console import ConsoleSink

logger = logging.getLogger(__name__)


def reduce_over_ranks(per_rank: Sequence[Mapping[str, float]]) -> dict[str, float]:
    keys = {key for metrics in per_rank for key in metrics}
    reduced = {}
    for key in sorted(keys):
        values = [float(m[key]) for m in per_rank if key in m]
        reduced[key] = max(values) if key.startswith("memory/") else sum(values) / len(values)
    return reduced


class MetricSink(Protocol):
    def log(self, step: int, metrics: Mapping[str, float]) -> None: ...

    def close(self) -> None: ...


class JsonlSink:
    """One JSON object per step, appended (a resumed run continues the same file)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = path.open("a")

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        self._file.write(json.dumps({"step": step, **metrics}) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def split_rows_after(lines: Iterable[str], last_step: int) -> tuple[list[str], list[str]]:
    """(kept, dropped) lines of a metrics jsonl: kept are the rows of steps <= last_step;
    dropped the rows after it and any line that is not a row with an integer step (the last
    write of a killed run, cut short)."""
    kept: list[str] = []
    dropped: list[str] = []
    for line in lines:
        if not line.strip():
            continue
        try:
            step = json.loads(line).get("step")
        except (json.JSONDecodeError, AttributeError):
            step = None
        is_kept = isinstance(step, int) and step <= last_step
        (kept if is_kept else dropped).append(line if line.endswith("\n") else line + "\n")
    return kept, dropped


def drop_rows_after(path: Path, last_step: int) -> tuple[int, Path | None]:
    """Take the rows after `last_step` out of the metrics jsonl at `path`, appending them to
    `<path>.before_resume_<last_step>` first so that nothing is lost; (how many, that file),
    or (0, None) when there is nothing to drop. Call it before a sink opens `path`."""
    if not path.is_file():
        return 0, None
    with path.open() as f:
        kept, dropped = split_rows_after(f, last_step)
    if not dropped:
        return 0, None
    aside = path.with_name(f"{path.name}.before_resume_{last_step}")
    with aside.open("a") as f:  # a second resume at the same step adds to the first's
        f.writelines(dropped)
        f.flush()
        os.fsync(f.fileno())
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w") as f:
        f.writelines(kept)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return len(dropped), aside


class TensorBoardSink:
    def __init__(self, log_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(log_dir=str(log_dir))

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        for key, value in metrics.items():
            self._writer.add_scalar(key, value, step)

    def close(self) -> None:
        self._writer.close()


class WandbSink:
    """W&B in offline mode unless WANDB_MODE says otherwise (works without network)."""

    def __init__(self, project: str, run_dir: Path, config: Mapping[str, object]) -> None:
        import os

        import wandb

        os.environ.setdefault("WANDB_MODE", "offline")
        self._run = wandb.init(project=project, dir=str(run_dir), config=dict(config))

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        self._run.log(dict(metrics), step=step)

    def close(self) -> None:
        self._run.finish()


class Sinks:
    """Fans one call out to every configured sink, so call sites never branch."""

    def __init__(self, sinks: Iterable[MetricSink]) -> None:
        self._sinks = list(sinks)

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        for sink in self._sinks:
            sink.log(step, metrics)

    def close(self) -> None:
        for sink in self._sinks:
            sink.close()


def make_sinks(
    names: Sequence[str],
    output_dir: Path,
    total_steps: int,
    config: Mapping[str, object],
    log_freq: int = 1,
) -> Sinks:
    """`log_freq`: the console prints a metrics line every N steps (the others log each step)."""
    made: list[MetricSink] = []
    for name in names:
        if name == "console":
            made.append(ConsoleSink(total_steps, log_freq))
        elif name == "jsonl":
            made.append(JsonlSink(output_dir / "metrics.jsonl"))
        elif name == "tensorboard":
            made.append(TensorBoardSink(output_dir / "tensorboard"))
        elif name == "wandb":
            made.append(WandbSink("hybrid", output_dir, config))
    return Sinks(made)
