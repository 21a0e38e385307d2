"""One evaluation: inputs checked, samples generated and scored, estimates computed.

  prepare    the model directory (a checkpoint converted), the prompts (the model's chat
             template, the length filter counted per file), the rewards: every input error
             is raised here, before any worker starts;
  generate   batch by batch on the workers (hybrid/evaluation/workers.py), the driver scoring
             one batch while the workers generate the next;
  summarize  mean@n, pass@k, best@k and maj@k per data source and overall, with their 95%
             confidence intervals over prompts (hybrid/evaluation/estimators.py).
`run_eval` does all three and writes the report (hybrid/evaluation/report.py); a caller that
evaluates several configs on the same engines passes its own started `EvalWorkers`.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer

from hybrid.controller import GroupFuture
from hybrid.data import Batch, PromptDataset, PromptLoader
from hybrid.evaluation.config import SEED_STRIDE, EvalConfig
from hybrid.evaluation.estimators import Estimate, default_ks, summarize
from hybrid.evaluation.model_dir import ResolvedModel, resolve_model
from hybrid.evaluation.progress import EvalProgress
from hybrid.evaluation.report import write_report
from hybrid.evaluation.scoring import Rewards, ScoredPrompt, describe_rewards
from hybrid.evaluation.workers import EvalWorkers


@dataclass(frozen=True)
class FileCounts:
    path: str
    prompts: int
    """Prompts evaluated."""
    filtered: int
    """Prompts left out: longer than max_prompt_length tokens."""


@dataclass
class Inputs:
    config: EvalConfig
    ks: list[int]
    model: ResolvedModel
    dataset: PromptDataset
    rewards: Rewards
    files: list[FileCounts]


@dataclass
class EvalResult:
    config: EvalConfig
    ks: list[int]
    model: ResolvedModel
    files: list[FileCounts]
    prompts: list[ScoredPrompt]
    estimates: dict[str, Estimate]
    rewards: dict[str, str]
    timing_s: dict[str, float]
    engine: dict[str, Any] = field(default_factory=dict)
    """What the workers resolved (hardware, dtype)."""

    @property
    def samples_per_prompt(self) -> int:
        return self.config.n


def check_data_files(config: EvalConfig) -> None:
    for path in config.data:
        if not Path(path).is_file():
            raise FileNotFoundError(f"data: {path} does not exist")


def file_counts(dataset: PromptDataset) -> list[FileCounts]:
    """Per file, the prompts kept and those left out for length (rows' sources: "file:row")."""
    kept = Counter(row.source.rpartition(":")[0] for row in dataset.rows)
    dropped = Counter(source.rpartition(":")[0] for source in dataset.filtered_rows)
    return [FileCounts(str(p), kept[str(p)], dropped[str(p)]) for p in dataset.paths]


def prepare(config: EvalConfig) -> Inputs:
    """Everything checked and loaded that needs no worker (a bad input fails here, named)."""
    check_data_files(config)
    ks = list(config.k) if config.k is not None else default_ks(config.n)
    model = resolve_model(config.model, config.output_dir)
    tokenizer = AutoTokenizer.from_pretrained(model.path)
    dataset = PromptDataset(list(config.data), tokenizer, config.max_prompt_length)
    rewards = Rewards.build(config.custom_path, config.custom_name, config.reward_workers, dataset)
    return Inputs(config, ks, model, dataset, rewards, file_counts(dataset))


def start_line(inputs: Inputs) -> str:
    """What is about to run (the engines take a while to start)."""
    c = inputs.config
    filtered = sum(f.filtered for f in inputs.files)
    left_out = f" ({filtered} longer than max_prompt_length left out)" if filtered else ""
    device = "GPU" if c.use_gpu else "CPU"
    return (
        f"evaluating {inputs.model.describe()}: {len(inputs.dataset)} prompts{left_out} x "
        f"{c.n} samples on {c.workers} {device} workers ..."
    )


def seeded(prompts: Batch, seed: int) -> Batch:
    """Each row's sampling seed from its dataset index (its uid `val-<index>`)."""
    indices = [int(str(uid).rpartition("-")[2]) for uid in prompts.non_tensors["uid"]]
    seeds = torch.tensor(indices, dtype=torch.long) + seed * SEED_STRIDE
    return prompts.union(Batch.from_dict({"seed": seeds}))


def generate(inputs: Inputs, workers: EvalWorkers) -> list[ScoredPrompt]:
    """Every prompt's samples, scored, in dataset order."""
    c = inputs.config
    loader = PromptLoader(inputs.dataset, c.batch_size, shuffle=False, drop_last=False)
    batches = (seeded(b, c.seed) for b in loader.validation_batches(c.batch_size))
    progress = EvalProgress(len(inputs.dataset))
    scored: list[ScoredPrompt] = []
    try:
        pending: GroupFuture | None = workers.submit(next(batches), c.sampling)
        while pending is not None:
            generated = pending.get()
            upcoming = next(batches, None)
            pending = None if upcoming is None else workers.submit(upcoming, c.sampling)
            part = [  # scored while the workers generate the next batch
                replace(p, source=inputs.dataset.rows[p.index].source)
                for p in inputs.rewards.score(generated, c.n)
            ]
            scored.extend(part)
            progress.advance(len(part), [s for p in part for s in p.scores])
    finally:
        progress.close()
    return scored


def run_eval(config: EvalConfig, workers: EvalWorkers | None = None) -> EvalResult:
    """Evaluate and write the report into output_dir (hybrid/evaluation/report.py).
    `workers`: engines already started for this model and these engine settings (else they
    are started and closed here)."""
    started = time.monotonic()
    inputs = prepare(config)
    prepared = time.monotonic()
    print(start_line(inputs), flush=True)
    own = workers is None
    try:
        if workers is None:
            log_dir = None if config.verbose else Path(config.output_dir) / "logs"
            workers = EvalWorkers(config, inputs.model.path, log_dir)
        workers.check_serves(config, inputs.model.path)
        engines = time.monotonic()
        scored = generate(inputs, workers)
        generated = time.monotonic()
    finally:
        inputs.rewards.close()
        if own and workers is not None:
            workers.close()
    estimates = summarize([p.samples() for p in scored], inputs.ks, config.correct_threshold)
    result = EvalResult(
        config=config,
        ks=inputs.ks,
        model=inputs.model,
        files=inputs.files,
        prompts=scored,
        estimates=estimates,
        rewards=describe_rewards(config.custom_path, config.custom_name),
        timing_s={
            "prepare": prepared - started,
            "engines": engines - prepared,
            "generate_and_score": generated - engines,
            "total": time.monotonic() - started,
        },
        engine=workers.facts,
    )
    write_report(result)
    return result
