"""Where the `nccl` transport's buckets live and which backend moves them: one rule, applied by
the sender and by every receiver to its own worker's device.

A worker on a GPU broadcasts with NCCL: buckets are packed, sent and received in that GPU's
memory (no host copy). A worker on anything else broadcasts with gloo over TCP, buckets in
host memory. `BroadcastGroup` checks when it forms that every rank chose the same backend.
"""

from __future__ import annotations

from typing import Literal

import torch

Backend = Literal["nccl", "gloo"]


def transport_device(worker_device: torch.device) -> torch.device:
    """The device a worker's broadcast buckets live on: its own GPU (index kept) for a CUDA
    worker, else the CPU."""
    if worker_device.type == "cuda":
        return worker_device
    return torch.device("cpu")


def transport_backend(device: torch.device) -> Backend:
    """The collective backend that moves buckets living on `device`."""
    return "nccl" if device.type == "cuda" else "gloo"
