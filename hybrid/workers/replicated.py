"""A model every trainer rank holds whole, kept a plain module: its gradients averaged in one
all-reduce per optimizer step.

With one replica per rank (a (world, 1) mesh: `actor.hsdp_replicas` equal to the world, what
auto picks for a small model on a CPU, hybrid.workers.replication) FSDP2 shards nothing, yet it
still turns every parameter into a DTensor (each op dispatched through DTensor's rules), runs
its hooks before and after every unit's forward and backward, copies each unit's gradients
into a buffer of their own and all-reduces each unit apart. None of that buys anything when
nothing is sharded. Such a model is built as the Hugging Face module itself here, and the
trainer averages its gradients before clipping: every trainable parameter's gradient in one
flat buffer, one all-reduce (sum, then divided by the replicas: FSDP2's mean over ranks, which
the losses are scaled for). Micro-batches accumulate into the local gradients, so the step
reduces once whatever `actor.grad_reduce` says.

Kept for what FSDP2 would not do without sharding either: a compute dtype that differs from the
master dtype (FSDP2 casts; a plain module would need autocast), adapters (LoRA's sync reads
FSDP's units), experts on their own mesh, sequence parallelism.

Measured on the tiny GRPO update (profiling/bench_replication.py, 2 gloo ranks on a 2-core CPU,
16 rows a rank, fp32): 0.0335 s a step against FSDP2's HSDP on the same mesh 0.0474 s (0.71x)
and sharded FSDP2 0.0584 s (0.57x), the same gradient norm (docs/benchmarks.md).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor


def replicated_plainly(
    mesh_shape: tuple[int, ...],
    *,
    param_dtype: torch.dtype,
    master_dtype: torch.dtype,
    lora: bool,
    experts: bool,
    sp_size: int,
) -> bool:
    """Whether build_fsdp_model leaves the model on a mesh of `mesh_shape` a plain module on
    every rank: a (replicas, 1) mesh of several replicas, computing in the master dtype,
    without adapters, experts on their own mesh or sequence parallelism."""
    return (
        len(mesh_shape) == 2
        and mesh_shape[1] == 1
        and mesh_shape[0] > 1
        and param_dtype == master_dtype
        and not lora
        and not experts
        and sp_size == 1
    )


def gradient_replicas(model: nn.Module, mesh: DeviceMesh) -> dist.ProcessGroup | None:
    """The ranks whose gradients the trainer of `model` (built by build_fsdp_model on `mesh`)
    averages itself: every rank of the mesh for a plain module on several ranks; None where
    FSDP2 reduces them in backward (its parameters are DTensors) or one rank trains alone."""
    if mesh.size() == 1 or any(isinstance(p, DTensor) for p in model.parameters()):
        return None
    return mesh.get_group(0)


def average_gradients(model: nn.Module, group: dist.ProcessGroup) -> None:
    """Every trainable parameter's gradient replaced by its mean over `group`, in one
    all-reduce; the gradients become views of its buffer. A parameter without a gradient on
    this rank sends zeros (the ranks' buffers must line up); one that has none on any rank
    (unused by every rank's rows: a vision tower on text) keeps none, as under FSDP2, so
    that the optimizer leaves it alone. Each parameter's count of ranks with a gradient rides
    at the end of the buffer."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        return
    grads = [(torch.zeros_like(p) if p.grad is None else p.grad).reshape(-1) for p in params]
    flags = torch.tensor([p.grad is not None for p in params], dtype=grads[0].dtype)
    flat = torch.cat([*grads, flags.to(grads[0].device)])
    dist.all_reduce(flat, group=group)
    with_grad = flat[-len(params) :].tolist()
    flat = flat[: -len(params)].div_(dist.get_world_size(group))
    offset = 0
    for param, ranks in zip(params, with_grad, strict=True):
        mean = flat[offset : offset + param.numel()].view_as(param)
        param.grad = mean if ranks > 0 else None
        offset += param.numel()
