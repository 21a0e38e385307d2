"""The precision and offload groups of every model a run holds: the actor and critic
(`PrecisionConfig`, `OffloadConfig`) and the frozen ones, the reference, the distillation teacher
and the reward model (their `ForwardPrecisionConfig` and `ParamOffloadConfig` parts).

A group does not know where it sits, so it has no `__post_init__`: its `check(owner)` runs from
its owner's `__post_init__` with the owner's dotted name, and an error names the whole field
(`ref.precision.param_dtype must be one of ...`). At the package root because the workers'
configs (hybrid.workers.config) and the reward model's (hybrid.rewards.config) both nest them.
"""

from __future__ import annotations

from dataclasses import dataclass

from hybrid.dtypes import DTYPE_CHOICES, DTYPES, Dtype, DtypeChoice
from hybrid.validation import check_choice


@dataclass(frozen=True)
class ForwardPrecisionConfig:
    """The dtype a model computes in (`ref.precision`: the reference also stores its weights
    in it)."""

    param_dtype: DtypeChoice = "auto"
    """Compute dtype of the passes (FSDP2 MixedPrecisionPolicy.param_dtype); auto: bfloat16
    where the device computes it natively, else float32 (hybrid/dtypes.py)."""

    def check(self, owner: str) -> None:
        check_choice(owner, "param_dtype", self.param_dtype, DTYPE_CHOICES)


@dataclass(frozen=True)
class PrecisionConfig(ForwardPrecisionConfig):
    """Mixed precision of a trained model (`actor.precision`, `critic.precision`)."""

    reduce_dtype: Dtype = "float32"
    """Dtype of the gradient reduce-scatter."""
    master_dtype: Dtype = "float32"
    """Dtype of the sharded parameters the optimizer updates."""

    def check(self, owner: str) -> None:
        super().check(owner)
        for name in ("reduce_dtype", "master_dtype"):
            check_choice(owner, name, getattr(self, name), DTYPES)


@dataclass(frozen=True)
class ParamOffloadConfig:
    """Whether a model's weights leave the device between its phases (`ref.offload`)."""

    param_offload: bool = False
    """Keep the (sharded) parameters on CPU outside the model's own phases (CUDA only; no-op
    on CPU)."""


@dataclass(frozen=True)
class OffloadConfig(ParamOffloadConfig):
    """Offload of a trained model (`actor.offload`, `critic.offload`)."""

    optimizer_offload: bool = False
    """Keep the optimizer state on CPU outside the optimizer step (CUDA only; no-op on CPU)."""
