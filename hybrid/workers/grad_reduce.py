"""When the actor's gradients are reduce-scattered: after every micro-batch, or once per
optimizer step (`actor.grad_reduce`).

FSDP2 reduce-scatters each layer's gradient as its backward finishes, so an optimizer step of
k micro-batches pays k reduce-scatters (plus k all-reduces across HSDP replicas) where one
would do: the sum of the micro-batches' gradients is what the step needs. With gradient sync
off for all but the last micro-batch, FSDP2 accumulates the unsharded gradients locally (in
the reduce dtype, fp32 by default) and the last backward reduces their sum once. The price is
memory: every rank holds the whole unsharded gradient of the trainable parameters, 4 bytes
each in fp32, between the first backward and the last, instead of its 1 / world shard.

auto = once per step where that costs little: on a single rank (its shard is the whole
gradient anyway), or where the whole fp32 gradient of the trainable parameters takes at most
a tenth of the device's memory (LoRA's adapters; models small for their device: a 1.5B model
on an 80 GB GPU, anything a CPU trains); per micro-batch otherwise, as verl and TRL do. On
the CPU bench (profiling/bench_update.py --settings, ~100M model, 2 gloo ranks, 4
micro-batches per step) once per step was 1.15x the tokens/s of per micro-batch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Literal

import psutil
import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule

GradReduce = Literal["auto", "step", "micro_batch"]
GRAD_REDUCE_CHOICES: tuple[GradReduce, ...] = ("auto", "step", "micro_batch")


AUTO_GRADIENT_SHARE = 0.1
"""auto reduces once per step while the whole fp32 gradient fits in this share of the device."""


def reduces_once_per_step(
    choice: GradReduce, *, world: int, gradient_bytes: int, device_bytes: int
) -> bool:
    """Whether the update reduces gradients once per optimizer step; `gradient_bytes`: the
    whole (unsharded) fp32 gradient of the trainable parameters, `device_bytes`: the memory
    of the device they train on."""
    if choice == "auto":
        return world == 1 or gradient_bytes <= AUTO_GRADIENT_SHARE * device_bytes
    return choice == "step"


def trainable_gradient_bytes(model: nn.Module) -> int:
    """The whole fp32 gradient of `model`'s trainable parameters (a DTensor counts its global
    size), each shared parameter once."""
    params = {id(p): p for p in model.parameters() if p.requires_grad}
    return 4 * sum(p.numel() for p in params.values())


def device_memory_bytes(device: torch.device) -> int:
    """Total memory of a CUDA device, or of the host for the CPU."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    return int(psutil.virtual_memory().total)


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
