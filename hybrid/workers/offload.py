"""Moving a sharded model's parameters and its optimizer state between device and host.

Owns the four primitive moves the mode switch composes (`hybrid/sharding` wraps them in
context managers; nothing else should call them): `offload_params` / `onload_params` for the
FSDP2 model and `offload_optimizer` / `onload_optimizer` for AdamW's state. Each is a no-op
when the tensors already sit on the target device, so a CPU run takes the same code path as a
GPU run. Copies are issued non-blocking and the CUDA stream is synchronised once at the end,
before anyone can read host memory that a device-to-host copy is still filling.
"""

from __future__ import annotations

import torch
from torch import nn

_CPU = torch.device("cpu")


def offload_params(model: nn.Module, to: torch.device = _CPU) -> None:
    """Move the (sharded) parameters, gradients and buffers of `model` to `to`."""
    _move_model(model, to)


def onload_params(model: nn.Module, device: torch.device) -> None:
    """Move the (sharded) parameters, gradients and buffers of `model` back to `device`."""
    _move_model(model, device)


def offload_optimizer(optimizer: torch.optim.Optimizer, to: torch.device = _CPU) -> None:
    """Move the optimizer's per-parameter state tensors (AdamW moments) to `to`."""
    _move_optimizer_state(optimizer, to)


def onload_optimizer(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    """Move the optimizer's per-parameter state tensors back to `device`."""
    _move_optimizer_state(optimizer, device)


def _normalize(device: torch.device | str) -> torch.device:
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def _move_model(model: nn.Module, device: torch.device) -> None:
    device = _normalize(device)
    tensors = [*model.parameters(), *model.buffers()]
    if all(t.device == device for t in tensors):
        return
    # FSDP2 overrides `_apply`: it reshards first and re-registers the moved shards as the
    # sharded DTensor parameters, so plain `Module.to` is the supported way to move them.
    model.to(device, non_blocking=True)
    _synchronize(device, *(t.device for t in tensors))


def _move_optimizer_state(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    device = _normalize(device)
    moved_from: set[torch.device] = set()
    for state in optimizer.state.values():
        for key, value in state.items():
            # Scalar tensors are AdamW's `step`: it keeps them on CPU unless `capturable` or
            # `fused`, and moving them would change which code path the next step takes.
            if not isinstance(value, torch.Tensor) or value.dim() == 0:
                continue
            if value.device != device:
                moved_from.add(value.device)
                state[key] = value.to(device, non_blocking=True)
    if moved_from:
        _synchronize(device, *moved_from)


def _synchronize(*devices: torch.device) -> None:
    """Wait for the non-blocking copies involving a CUDA device."""
    if any(d.type == "cuda" for d in devices):
        torch.cuda.synchronize()
