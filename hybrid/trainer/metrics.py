"""Metrics: reduced over ranks in one place, written to one sink interface (the console sink
lives in hybrid/trainer/console.py).

Namespaces: actor/, rollout/, reward/, response_length/, timing_s/, perf/, memory/, val/.
`reduce_over_ranks` takes the per-rank dicts a group call returns: memory is reported as the
max over ranks (the binding one), everything else as the mean.
"""

from __future__ import annotations

import json
import logging
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
