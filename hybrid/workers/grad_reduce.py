"""When the actor's gradients are reduce-scattered: after every micro-batch, or once per
optimizer step (`actor.grad_reduce`).

FSDP2 reduce-scatters each layer's gradient as its backward finishes, so an optimizer step of
k micro-batches pays k reduce-scatters (plus k all-reduces across HSDP replicas) where one
would do: the sum of the micro-batches' gradients is what the step needs. With gradient sync
off for all but the last micro-batch, FSDP2 accumulates the unsharded gradients locally (in
the reduce dtype, fp32 by default) and the last backward reduces their sum once. The price is
memory: every rank holds the whole unsharded gradient of the trainable parameters, 4 bytes
each in fp32, between the first backward and the last, instead of its 1 / world shard.

auto = once per step where that costs little: LoRA (the trainable adapters are a sliver of
the model) or a single rank (its shard is the whole gradient anyway); per micro-batch
otherwise, as verl and TRL do.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Literal

from torch import nn
from torch.distributed.fsdp import FSDPModule

GradReduce = Literal["auto", "step", "micro_batch"]
GRAD_REDUCE_CHOICES: tuple[GradReduce, ...] = ("auto", "step", "micro_batch")


def reduces_once_per_step(choice: GradReduce, *, lora: bool, world: int) -> bool:
    """Whether the update reduces gradients once per optimizer step."""
    if choice == "auto":
        return lora or world == 1
    return choice == "step"


@contextmanager
def step_gradients(model: nn.Module, once_per_step: bool) -> Iterator[Callable[[bool], None]]:
    """Around one optimizer step's backward passes; yields `before_backward(last)`, to call
    before each: with `once_per_step` FSDP2 reduces only in the backward whose `last` is True.
    Reduction is on again when the block leaves, whatever happened inside it."""
    fsdp = model if once_per_step and isinstance(model, FSDPModule) else None

    def before_backward(last: bool) -> None:
        if fsdp is not None:
            fsdp.set_requires_gradient_sync(last)

    try:
        yield before_backward
    finally:
        if fsdp is not None:
            fsdp.set_requires_gradient_sync(True)
