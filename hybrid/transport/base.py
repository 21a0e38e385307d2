"""The `WeightTransport` protocol: how one weight version travels from the trainer's rank 0
(the publisher) to every explorer rank (the receivers), whatever the medium.

The publisher hands `publish` the version's stream of `(hf_name, full tensor)` pairs and an
`announce` callback (which tells the Synchronizer that the version is out); the transport moves
the stream, announces it with its payload (what a receiver needs to find it) and returns that
payload. A receiver gets the payload from the Synchronizer and `receive`s the same stream.

`rendezvous` says whether both sides must meet for every version: a broadcast (`nccl`) only
moves bytes while the receivers receive, so the publisher waits for them; the object store
(`memory`) and a shared directory (`checkpoint`) keep the version, so the publisher goes on
and the receivers read it when they choose. A rendezvous transport is a `GroupTransport`: its
sides form their group once (`join`) before the first version.

One class per medium (memory.py, checkpoint.py, collective.py); `hybrid.transport.factory`
picks one from `sync.method`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, ClassVar, Literal, Protocol, runtime_checkable

import torch

from hybrid.transport.buckets import Weights

Side = Literal["publisher", "receiver"]
"""Which end of the transport a worker holds: the trainer's ranks publish (rank 0 sends, the
others only take part in the gather), the explorer's ranks receive."""

Payload = Any
"""What the Synchronizer keeps per version for the receivers: the bucket ObjectRefs
(`memory`), the version's directory (`checkpoint`), nothing (`nccl`: the bytes travel during
the rendezvous)."""

Announce = Callable[[Payload], None]
"""Tells the Synchronizer that the version is readable, with its payload."""


class TransportSettings(Protocol):
    """The fields of `SyncConfig` a transport reads (the transport knows no config class)."""

    @property
    def method(self) -> str: ...
    @property
    def bucket_mb(self) -> int: ...
    @property
    def verify_checksum(self) -> bool: ...
    @property
    def timeout_s(self) -> float: ...
    @property
    def checkpoint_dir(self) -> str | None: ...
    @property
    def keep_versions(self) -> int: ...


@runtime_checkable
class WeightTransport(Protocol):
    rendezvous: ClassVar[bool]
    """True: both sides must meet for every version (the publisher waits for the receivers);
    False: the publisher publishes and goes on, receivers read the version later."""

    def publish(self, version: int, weights: Weights, announce: Announce) -> Payload:
        """Publisher side: move `version`'s stream, call `announce(payload)` once the version
        is readable, and return the payload."""
        ...

    def receive(self, version: int, payload: Payload) -> Iterator[tuple[str, torch.Tensor]]:
        """Receiver side: `version`'s stream, from the payload its publisher announced.
        Consume it to the end (a broadcast's sender waits for every bucket to be taken)."""
        ...

    def close(self) -> None:
        """Release what the transport holds (a group, its sockets); idempotent."""
        ...


@runtime_checkable
class GroupTransport(WeightTransport, Protocol):
    """A rendezvous transport whose sides form a group once, before the first version."""

    def join(self, host: str, port: int, world_size: int, worker_rank: int) -> None:
        """Join the group listening at `host:port` (collective: returns once all `world_size`
        members have joined) as this side's rank `worker_rank`."""
        ...
