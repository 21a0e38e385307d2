"""Offloader: which of the actor's tensors leave the device between phases, per config.

A thin policy over the move functions of hybrid.workers.offload's counterpart here; on CPU
every move is a no-op, so CPU and CUDA runs take the same path through the mode switch.
"""

from __future__ import annotations

import torch


class Offloader:
    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None,
        device: torch.device,
        param_offload: bool,
        optimizer_offload: bool,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.device = device
        self.param_offload = param_offload and device.type == "cuda"
        self.optimizer_offload = (
            optimizer_offload and device.type == "cuda" and optimizer is not None
        )

    def onload_params(self) -> None:
        if self.param_offload:
            self.model.to(self.device)

    def offload_params(self) -> None:
        if self.param_offload:
            self.model.to("cpu")
            self.empty_cache()

    def onload_optimizer(self) -> None:
        if self.optimizer_offload:
            _move_optimizer_state(self.optimizer, self.device)

    def offload_optimizer(self) -> None:
        if self.optimizer_offload:
            _move_optimizer_state(self.optimizer, torch.device("cpu"))
            self.empty_cache()

    def empty_cache(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def _move_optimizer_state(optimizer: torch.optim.Optimizer | None, device: torch.device) -> None:
    assert optimizer is not None
    for state in optimizer.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                state[key] = value.to(device, non_blocking=True)
    if device.type == "cuda":
        torch.cuda.synchronize()
