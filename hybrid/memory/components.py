"""Byte accounting from the objects that hold the memory (not from allocator counters).

Each function returns bytes per device type ("cuda" / "cpu"), so one call tells what sits on
the accelerator and what was offloaded to the host. FSDP2 parameters count their local
shard (the tensor a `DTensor` wraps); tensors sharing a storage (views, tied weights, vLLM's KV
layers carved out of one buffer) count once.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

import torch
from torch.distributed.tensor import DTensor

ByDevice = Counter[str]


def _local(tensor: torch.Tensor) -> torch.Tensor:
    # The shard the DTensor wraps, read directly: to_local() returns a fresh view of it for
    # parameters (and records an autograd node when grad is on), which a ledger boundary
    # walking every tensor of the step pays for many times over.
    return tensor._local_tensor if isinstance(tensor, DTensor) else tensor


def tensor_bytes(tensors: Iterable[torch.Tensor]) -> ByDevice:
    """Bytes of the distinct storages behind `tensors`, per device type."""
    seen: set[tuple[str, int]] = set()
    total: ByDevice = Counter()
    for tensor in tensors:
        local = _local(tensor)
        if local.device.type == "meta":
            continue
        storage = local.untyped_storage()
        key = (local.device.type, storage.data_ptr())
        if storage.nbytes() == 0 or key in seen:
            continue
        seen.add(key)
        total[local.device.type] += storage.nbytes()
    return total


def parameter_bytes(model: torch.nn.Module) -> ByDevice:
    """The model's (local shards of) parameters and buffers."""
    return tensor_bytes([*model.parameters(), *model.buffers()])


def gradient_bytes(model: torch.nn.Module) -> ByDevice:
    return tensor_bytes(p.grad for p in model.parameters() if p.grad is not None)


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> ByDevice:
    """AdamW's moments and the like (scalar `step` tensors included: they are bytes too)."""
    return tensor_bytes(
        value
        for state in optimizer.state.values()
        for value in state.values()
        if isinstance(value, torch.Tensor)
    )


def full_parameter_count(model: torch.nn.Module) -> int:
    """Elements of the whole (unsharded) model, each shared parameter once."""
    seen: set[int] = set()
    count = 0
    for param in model.parameters():
        if id(param) not in seen:
            seen.add(id(param))
            count += param.numel()  # a DTensor's numel is the global one
    return count
