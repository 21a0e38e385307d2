"""Moving the actor's parameters and optimizer state between device and host.

Two layers: the primitive moves (`offload_params` / `onload_params` for an FSDP2 model,
`offload_optimizer` / `onload_optimizer` for AdamW's state), and `Offloader`, the policy the
mode switch applies at phase boundaries (what moves, per config). Only the mode switch and
the reference worker's phase bracket call them. Each move is a no-op when the tensors already
sit on the target device, so a CPU run takes the same code path as a GPU run. Copies are
issued non-blocking and the CUDA stream is synchronised once at the end, before anyone can
read host memory that a device-to-host copy is still filling.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from hybrid.memory.ledger import MemoryLedger

_CPU = torch.device("cpu")


def offload_params(model: nn.Module, to: torch.device = _CPU) -> bool:
    """Move the (sharded) parameters, gradients and buffers of `model` to `to`; whether
    anything moved."""
    return _move_model(model, to)


def onload_params(model: nn.Module, device: torch.device) -> bool:
    """Move the (sharded) parameters, gradients and buffers of `model` back to `device`;
    whether anything moved."""
    return _move_model(model, device)


def offload_optimizer(optimizer: torch.optim.Optimizer, to: torch.device = _CPU) -> bool:
    """Move the optimizer's per-parameter state tensors (AdamW moments) to `to`; whether
    anything moved."""
    return _move_optimizer_state(optimizer, to)


def onload_optimizer(optimizer: torch.optim.Optimizer, device: torch.device) -> bool:
    """Move the optimizer's per-parameter state tensors back to `device`; whether anything
    moved."""
    return _move_optimizer_state(optimizer, device)


def _normalize(device: torch.device | str) -> torch.device:
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def _move_model(model: nn.Module, device: torch.device) -> bool:
    device = _normalize(device)
    tensors = [*model.parameters(), *model.buffers()]
    if all(t.device == device for t in tensors):
        return False
    # FSDP2 overrides `_apply`: it reshards first and re-registers the moved shards as the
    # sharded DTensor parameters, so plain `Module.to` is the supported way to move them.
    model.to(device, non_blocking=True)
    _synchronize(device, *(t.device for t in tensors))
    return True


def _move_optimizer_state(optimizer: torch.optim.Optimizer, device: torch.device) -> bool:
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
    return bool(moved_from)


def _synchronize(*devices: torch.device) -> None:
    """Wait for the non-blocking copies involving a CUDA device."""
    if any(d.type == "cuda" for d in devices):
        torch.cuda.synchronize()


class Offloader:
    """What leaves the device between phases, per config. On CPU every move is a no-op (the
    target is the current device), so the mode switch runs the same calls everywhere."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | None,
        device: torch.device,
        param_offload: bool,
        optimizer_offload: bool,
    ) -> None:
        self.model = model
        self.optimizer = optimizer if optimizer_offload else None
        self.device = device
        self.param_offload = param_offload

    # Each returns whether anything moved: a ledger boundary after a move that did nothing
    # can reuse the previous boundary's breakdown instead of walking every tensor again.

    def onload_params(self) -> bool:
        return self.param_offload and onload_params(self.model, self.device)

    def offload_params(self) -> bool:
        if not (self.param_offload and offload_params(self.model)):
            return False
        self.empty_cache()
        return True

    def onload_optimizer(self) -> bool:
        return self.optimizer is not None and onload_optimizer(self.optimizer, self.device)

    def offload_optimizer(self) -> bool:
        if not (self.optimizer is not None and offload_optimizer(self.optimizer)):
            return False
        self.empty_cache()
        return True

    @contextmanager
    def phase(
        self, name: str, ledger: MemoryLedger, with_optimizer: bool = False
    ) -> Iterator[None]:
        """Training-side work (log-probs, updates, a weight publish) with the actor on device;
        `name` labels the ledger's boundaries and timing."""
        with ledger.timed(name):
            moved = self.onload_params()
            if with_optimizer:
                moved = self.onload_optimizer() or moved
            ledger.record(f"{name}/onload", reuse_components=not moved)
            try:
                yield
            finally:
                moved = self.offload_optimizer() if with_optimizer else False
                moved = self.offload_params() or moved
                ledger.record(f"{name}/offload", reuse_components=not moved)

    def empty_cache(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
