"""The memory planner's byte model of on-policy distillation's teacher (distill.teacher_path):
the frozen causal LM one worker holds beside the actor, and the transient of its one pass.

The teacher is built like the reference (hybrid.workers.teacher, hybrid.workers.frozen): its
own model, FSDP2-sharded over the training mesh (W / hsdp_replicas ranks, like the reference),
stored and computed in distill.precision.param_dtype, no gradients, no optimizer. Its shape is
its own (config.json of distill.teacher_path), not the student's: a 32B teacher of a 7B student
weighs 32B parameters. docs/memory-model.md ("The distillation teacher") derives the terms.

Resident (COMPONENTS name):
  teacher_params   P_t/W x bytes(distill.precision.param_dtype), P_t the teacher's parameters.
distill.offload.param_offload parks it on the host outside the teacher's pass (CUDA only).

Phases: `offloader.phase("teacher", ledger)` records teacher/onload and teacher/offload around
the worker's own teacher/forward (TEACHER_PHASES). The driver submits the teacher's pass after
the other scoring passes (reference, old log-probs, the critic's values), so the worker runs it
just before the first update (`with_teacher_phases`).

Transient, teacher/forward: the reference's no-grad scoring forward (passes.scoring_bytes) on
the teacher's shape and dtype, at distill.micro_batch_size rows (or
distill.log_prob_max_token_len_per_gpu tokens with distill.use_dynamic_bsz); no entropy.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

from hybrid.dtypes import dtype_bytes, resolve_dtype
from hybrid.memory.model_shape import ModelShape, model_shape
from hybrid.planner.passes import Bytes, MicroBatch, micro_batch_of, scoring_bytes, unsharded_bytes
from hybrid.planner.sizes import planned_hardware

if TYPE_CHECKING:
    from hybrid.trainer.config import TrainerRunConfig

__all__ = ["TEACHER_PHASES", "TeacherSizes", "teacher_of", "with_teacher_phases"]

TEACHER_PHASES: tuple[str, ...] = ("teacher/onload", "teacher/forward", "teacher/offload")
"""The boundaries the teacher's pass records (Offloader.phase's onload / offload around it)."""
LOG_PROB_FP32_COPIES = 2
"""(n, V) fp32 upcasts of a log-prob without entropy on the full-logits path (the reference's)."""


@dataclass(frozen=True)
class TeacherSizes:
    """Bytes of one worker's teacher, from the run's config and the teacher's shape."""

    config: TrainerRunConfig
    shape: ModelShape
    """The shape of distill.teacher_path (its own config.json)."""

    @cached_property
    def compute(self) -> str:
        """distill.precision.param_dtype with `auto` resolved for the planned device."""
        hardware = planned_hardware(self.config.trainer.use_gpu)
        return resolve_dtype(self.config.distill.precision.param_dtype, "trainer", hardware)

    @property
    def cb(self) -> int:
        """Bytes per element of its weights and activations (stored as computed)."""
        return dtype_bytes(self.compute)

    @property
    def shard_world(self) -> int:
        """Ranks its parameters shard over: the reference's (one HSDP replica's)."""
        c = self.config
        return c.trainer.num_workers // c.actor.hsdp_replicas

    def params(self) -> int:
        """Rank 0's shard (the largest: ceil(rows / world) rows of every tensor)."""
        return self.shape.shard(self.shard_world) * self.cb

    def micro_batch(self) -> MicroBatch:
        d = self.config.distill
        budget, sp = d.log_prob_max_token_len_per_gpu, self.config.actor.sp_size
        return micro_batch_of(self.config, False, d.use_dynamic_bsz, budget, d.micro_batch_size, sp)

    def forward(self) -> Bytes:
        """teacher/forward's transient: a no-grad scoring forward of its largest micro-batch."""
        chunk = self.config.model.log_prob_chunk_tokens
        unsharded = unsharded_bytes(self.shape, self.cb, ep_size=self.config.actor.ep_size)
        return scoring_bytes(
            self.shape, self.micro_batch(), self.cb, unsharded, chunk, LOG_PROB_FP32_COPIES
        )


def teacher_of(
    config: TrainerRunConfig, shape: ModelShape | None = None
) -> tuple[TeacherSizes | None, str | None]:
    """(the teacher's sizes, None), or (None, why it is not counted) when distill.teacher_path's
    config.json does not load; (None, None) without distillation. `shape`: the teacher's, when
    the caller has it (else read from distill.teacher_path, a directory or a preset name)."""
    path = config.distill.teacher_path
    if path is None:
        return None, None
    if shape is None:
        try:
            shape = model_shape(path)
        except (OSError, ValueError) as error:
            return None, (
                f"distill.teacher_path={path!r}: the teacher's config.json does not load "
                f"({error}), so the plan leaves the teacher out (teacher_params, "
                f"{', '.join(TEACHER_PHASES)}, its host copy): plan where the teacher's "
                "directory is, or name a preset of its shape (distill.teacher_path=Qwen2.5-32B) "
                "for the plan only"
            )
    return TeacherSizes(config, shape), None


def with_teacher_phases(phases: tuple[str, ...]) -> tuple[str, ...]:
    """`phases` (a step's boundaries) with the teacher's pass before the first update (the
    critic's, or else the actor's): the last of the scoring passes the driver submits."""
    first_update = next(i for i, name in enumerate(phases) if name.startswith("update"))
    return phases[:first_update] + TEACHER_PHASES + phases[first_update:]
