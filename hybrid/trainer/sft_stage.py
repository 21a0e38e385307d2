"""The SFT stage: supervised fine-tuning on the actor workers before RL (docs/sft.md).

Steps 1..sft.total_steps each take the next sft.batch_size rows of the shuffled SFT data
(hybrid.data.sft_loader), balanced across the training workers by tokens, and make one
optimizer step at sft.lr (`actor.sft_update`). Metrics go to output_dir/sft/metrics.jsonl (and
the other configured sinks under output_dir/sft/), checkpoints to
output_dir/sft/checkpoints/step_N with the RL checkpoints' manifest scheme
(hybrid/trainer/checkpoints.py): the actor's sharded state and, in its `extra`, the stage, the
step and the SFT data position. The stage's last step is always saved: its whole checkpoint
is what says "SFT done" to a later run. At the end `actor.end_sft()` puts actor.optim.lr back
and clears the optimizer's moments, and a reference member of its own (a KL term on, no LoRA)
becomes the SFT model (exported to output_dir/sft/hf_model), so that the KL terms of RL stay
close to the fine-tuned policy, not to the one before it.

Where a run with trainer.resume=auto starts (`sft_start`, from what is on disk):
  1. a whole RL checkpoint in output_dir/checkpoints: RL has begun, the stage is done and
     skipped (the RL resume loads the weights, as without SFT);
  2. else a whole SFT checkpoint of step >= sft.total_steps: the stage is done; its weights are
     loaded (the optimizer fresh), then RL starts at step 0;
  3. else a whole SFT checkpoint of an earlier step: loaded, and SFT continues after it;
  4. else SFT starts at step 0.
trainer.resume=disable always starts at 4.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from hybrid.controller import WorkerGroupView
from hybrid.data import Batch
from hybrid.data.sft import SftDataset
from hybrid.data.sft_loader import SftLoader
from hybrid.models import load_tokenizer
from hybrid.trainer.balance import balanced_order
from hybrid.trainer.checkpoints import CheckpointWriter, checkpoint_dir, resumable_checkpoint
from hybrid.trainer.config import TrainerRunConfig
from hybrid.trainer.console import print_lines
from hybrid.trainer.metrics import drop_rows_after, make_sinks, reduce_over_ranks

logger = logging.getLogger(__name__)

SFT_DIR = "sft"
"""Under output_dir: the stage's metrics, checkpoints and memory records."""
SFT_MODEL_DIR = "hf_model"
"""Under output_dir/sft: the stage's final weights, which the reference member loads."""
STAGE = "sft"
"""The `stage` an SFT checkpoint's extra carries."""


def sft_dir(output_dir: str | Path) -> Path:
    return Path(output_dir) / SFT_DIR


@dataclass(frozen=True)
class SftStart:
    """Where the SFT stage begins (`sft_start`)."""

    action: Literal["skip", "done", "continue", "fresh"]
    """skip: RL has checkpoints; done: load the final SFT weights; continue: load a partial
    SFT checkpoint and go on; fresh: SFT from step 0."""
    step: int = 0
    """The SFT step of `checkpoint` (0: none)."""
    checkpoint: Path | None = None
    skipped: tuple[tuple[int, str], ...] = ()
    """(step, reason) of each damaged SFT checkpoint newer than the one chosen."""


def sft_start(
    output_dir: str | Path, total_steps: int, resume: str, needs_critic: bool
) -> SftStart:
    """The resume rules of the module docstring, read from output_dir."""
    if resume != "auto":
        return SftStart("fresh")
    if resumable_checkpoint(output_dir, needs_critic).found is not None:
        return SftStart("skip")
    choice = resumable_checkpoint(sft_dir(output_dir), needs_critic=False)
    if choice.found is None:
        return SftStart("fresh", skipped=choice.skipped)
    step, path = choice.found
    action: Literal["done", "continue"] = "done" if step >= total_steps else "continue"
    return SftStart(action, step, path, choice.skipped)


class SftStage:
    """The stage's data (read and tokenized when made: a bad row fails before any worker
    starts) and its run on the actor."""

    def __init__(self, config: TrainerRunConfig) -> None:
        self.config = config
        s = config.sft
        tokenizer = load_tokenizer(config.model.path)
        self.dataset = SftDataset(s.train_files, tokenizer, s.max_length, s.truncation)
        self.loader = SftLoader(self.dataset, s.batch_size, seed=s.seed)
        t = config.trainer
        self.writer = CheckpointWriter(
            self.out, t.max_checkpoints_to_keep, t.memory_log_freq, what="SFT checkpoint"
        )

    @property
    def out(self) -> Path:
        return sft_dir(self.config.trainer.output_dir)

    def run(
        self,
        actor: WorkerGroupView,
        training_workers: int,
        needs_critic: bool,
        reference: WorkerGroupView | None = None,
    ) -> dict[str, float]:
        """The stage on `actor` (split over `training_workers` ranks), from where the resume
        rules say; the last step's metrics (empty when the stage was done already).
        `reference`: a reference member of its own (a KL term is on, no LoRA), which becomes
        the SFT model once the stage is done."""
        c, s = self.config, self.config.sft
        start = sft_start(c.trainer.output_dir, s.total_steps, c.trainer.resume, needs_critic)
        for damaged, reason in start.skipped:
            logger.warning(
                "SFT checkpoint %s is damaged (%s)", checkpoint_dir(self.out, damaged), reason
            )
        if start.action == "skip":
            logger.info("SFT stage skipped: RL checkpoints in %s (RL began)", c.trainer.output_dir)
            if reference is not None:
                self._reference_from_sft(actor, reference, may_export=False)
            return {}
        if start.action == "done":
            assert start.checkpoint is not None
            actor.load_checkpoint(str(start.checkpoint))
            actor.end_sft()
            if reference is not None:
                self._reference_from_sft(actor, reference, may_export=True)
            logger.info("SFT stage done before (%s): RL starts from its weights", start.checkpoint)
            return {}
        first = 1
        if start.action == "continue":
            assert start.checkpoint is not None
            self._load(actor, start.checkpoint)
            first = start.step + 1
            logger.info("resumed the SFT stage from %s", start.checkpoint)
        dropped, aside = drop_rows_after(self.out / "metrics.jsonl", first - 1)
        if dropped:
            logger.warning(
                "moved %d SFT metric rows after step %d to %s", dropped, first - 1, aside
            )
        print_lines([f"SFT stage: steps {first}..{s.total_steps} of {s.batch_size} rows ..."])
        sinks = make_sinks(
            c.trainer.loggers,
            self.out,
            s.total_steps,
            dataclasses.asdict(c),
            log_freq=c.trainer.log_freq,
        )
        metrics: dict[str, float] = {}
        try:
            for step in range(first, s.total_steps + 1):
                metrics = self._step(actor, training_workers)
                sinks.log(step, metrics)
                if step == s.total_steps or (s.save_freq and step % s.save_freq == 0):
                    self._save(actor, step)
                self.writer.log_memory(actor, step)  # to sft/memory.jsonl
        finally:
            sinks.close()
        actor.end_sft()
        if reference is not None:
            self._reference_from_sft(actor, reference, may_export=True)
        return metrics

    def _reference_from_sft(
        self, actor: WorkerGroupView, reference: WorkerGroupView, may_export: bool
    ) -> None:
        """Load the SFT model into the reference member, from output_dir/sft/hf_model, which
        is exported from the actor (holding the SFT weights) when missing and `may_export`."""
        model_dir = self.out / SFT_MODEL_DIR
        if not (model_dir / "config.json").is_file():
            if not may_export:
                logger.warning(
                    "%s is missing: the reference stays %s (the model before SFT)",
                    model_dir,
                    self.config.model.path,
                )
                return
            # Written beside, then moved: a crash mid-export leaves no directory that looks whole.
            partial = model_dir.with_name(SFT_MODEL_DIR + ".partial")
            actor.export_hf(str(partial))
            partial.rename(model_dir)
        reference.reload_model(str(model_dir))
        logger.info("the reference policy is now the SFT model (%s)", model_dir)

    def _step(self, actor: WorkerGroupView, training_workers: int) -> dict[str, float]:
        """One optimizer step on the next rows; its metrics."""
        started = time.perf_counter()
        batch: Batch = self.loader.next_batch()
        batch = batch[balanced_order(batch["attention_mask"].sum(-1), training_workers)]
        update = actor.sft_update.submit(batch, self.config.sft.lr)
        # Queued right behind the update (a Ray actor runs one caller's calls in order).
        worker = actor.pop_metrics.submit()
        metrics = reduce_over_ranks(update.get())
        recorded = reduce_over_ranks(worker.get())
        metrics.update(
            {k: v for k, v in recorded.items() if k.startswith(("memory/", "timing_s/"))}
        )
        metrics["sft/epoch"] = float(self.loader.epoch)
        metrics["sft/truncated_rows"] = float(sum(batch["truncated"]))
        metrics["perf/tokens"] = float(batch["attention_mask"].sum())
        metrics["timing_s/step"] = time.perf_counter() - started
        return metrics

    def _save(self, actor: WorkerGroupView, step: int) -> None:
        """A checkpoint of SFT step `step`: the actor's state, with the SFT data position."""
        extra: dict[str, Any] = {
            "stage": STAGE,
            "step": step,
            "total_steps": self.config.sft.total_steps,
            "loader": self.loader.state_dict(),
        }
        self.writer.save(step, actor, extra)

    def _load(self, actor: WorkerGroupView, path: Path) -> None:
        extra = actor.load_checkpoint(str(path))[0]
        if extra.get("stage") != STAGE or "loader" not in extra:
            raise ValueError(
                f"{path} is no SFT checkpoint (its extra has stage={extra.get('stage')!r}); "
                f"{self.out / 'checkpoints'} holds only the SFT stage's"
            )
        self.loader.load_state_dict(extra["loader"])
