"""Which `WeightTransport` a run uses: the one place that reads `sync.method`."""

from __future__ import annotations

import torch

from hybrid.transport.base import Side, TransportSettings, WeightTransport
from hybrid.transport.checkpoint import CheckpointTransport
from hybrid.transport.collective import BroadcastTransport
from hybrid.transport.memory import MemoryTransport

TransportClass = type[BroadcastTransport] | type[MemoryTransport] | type[CheckpointTransport]

TRANSPORTS: dict[str, TransportClass] = {
    "nccl": BroadcastTransport,
    "memory": MemoryTransport,
    "checkpoint": CheckpointTransport,
}
"""sync.method -> its transport (`nccl` names the GPU backend; on the CPU it is gloo)."""


def transport_class(settings: TransportSettings) -> TransportClass:
    """The transport of `settings.method` (its `rendezvous` tells the driver whether the two
    sides meet for every version); ValueError naming sync.method for an unknown one."""
    if settings.method not in TRANSPORTS:
        raise ValueError(f"sync.method must be one of {list(TRANSPORTS)}, got {settings.method!r}")
    return TRANSPORTS[settings.method]


def make_transport(
    settings: TransportSettings,
    side: Side,
    device: torch.device | None = None,
    cast_to: torch.dtype | None = None,
) -> WeightTransport:
    """This worker's end of the run's transport: `side` publishes or receives, `device` is the
    worker's own (a broadcast moves bytes on its GPU, else on the CPU), and a publisher casts
    floating tensors to `cast_to` (the engine's dtype) on the way."""
    cls = transport_class(settings)
    return cls.from_settings(settings, side, device or torch.device("cpu"), cast_to)
