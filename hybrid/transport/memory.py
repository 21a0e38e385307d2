"""The `memory` transport: weight buckets in Ray's object store.

The publisher (trainer rank 0) `put_version`s a weight stream: each bucket becomes one object,
`(bytes, metas)`, and the list of their ObjectRefs is the version. Whoever holds that list (the
Synchronizer) keeps the objects alive: refs nested in a list are not resolved by Ray, only
counted. An explorer `get_version`s the list, one bucket at a time.

The bucket travels as a NumPy `uint8` array, which Ray stores and reads back without pickling
its bytes: on one node a reader maps the object store's shared memory, between nodes Ray copies
the object itself; nothing is routed through the driver. Needs: every process in the same Ray
cluster, and the publisher alive while the version is read (Ray's objects die with their owner,
the process that put them). `MemoryTransport` is this medium behind the `WeightTransport`
protocol.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch

from hybrid.transport.base import Announce, Side, TransportSettings
from hybrid.transport.buckets import Staging, TensorMeta, Weights, iter_buckets, unpack_bucket
from hybrid.transport.errors import TransportError

if TYPE_CHECKING:
    import ray

# Ray is imported where a version is put or got, not here: the other transports (and the GPU
# smoke tests, on a machine without Ray) import this package without needing it.


def put_version(
    weights: Weights, bucket_bytes: int, checksums: bool = True, **packing: Any
) -> list[ray.ObjectRef]:
    """Put the stream into the object store, one object per bucket (with each tensor's digest
    when `checksums`); the refs in stream order. `packing`: `iter_buckets`'s keyword options
    (a staging buffer is safe: `ray.put` copies the bucket before the next is packed)."""
    import ray

    buckets = iter_buckets(weights, bucket_bytes, checksums, **packing)
    return [ray.put((flat.numpy(), metas)) for flat, metas in buckets]


def get_version(
    refs: list[ray.ObjectRef],
    verify: bool = True,
    *,
    version: int | None = None,
    timeout_s: float = 600.0,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield the stream `put_version` stored, verifying each tensor's checksum with `verify`.

    Fetches one bucket at a time. The tensors are read-only views into the object store's
    shared memory, not copies (the loader copies each into the engine, so one more copy would
    only cost time): the consumer must not write to them. A bucket's memory is released once
    none of its tensors is referenced any more. `version` only names the source in errors.
    Raises `TransportError` if a bucket takes longer than `timeout_s` or is gone (its owner,
    the publisher, died).
    """
    import ray
    from ray.exceptions import GetTimeoutError, ObjectLostError

    label = "memory transport" if version is None else f"memory transport, version {version}"
    for index, ref in enumerate(refs):
        source = f"{label}, bucket {index + 1}/{len(refs)}"
        try:
            array, metas = ray.get(ref, timeout=timeout_s)
        except GetTimeoutError as e:
            raise TransportError(f"{source}: not fetched within {timeout_s} s") from e
        except ObjectLostError as e:
            raise TransportError(f"{source} is lost (did its publisher die?): {e}") from e
        flat = _read_only_tensor(array)
        unpacked = unpack_bucket(flat, _checked_metas(metas, source), verify, source=source)
        del array, flat
        # Hand over and forget: the bucket lives only as long as the consumer keeps a tensor.
        unpacked.reverse()
        while unpacked:
            yield unpacked.pop()


def _read_only_tensor(array: np.ndarray) -> torch.Tensor:
    # The object store hands out a read-only buffer; torch warns that it cannot enforce that.
    # Nothing writes to this tensor: it is only viewed, digested and copied from.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(array)


def _checked_metas(metas: object, source: str) -> list[TensorMeta]:
    if not isinstance(metas, list) or not all(isinstance(m, TensorMeta) for m in metas):
        raise TransportError(f"{source} is not a bucket written by put_version")
    return metas


class MemoryTransport:
    """`sync.method=memory`: the version's buckets go into the object store and the list of
    their refs is the payload (the Synchronizer holding it keeps the objects alive); the
    publisher goes on at once. Floating tensors are cast to `cast_to` while packed."""

    rendezvous: ClassVar[bool] = False

    def __init__(
        self, bucket_bytes: int, checksums: bool, cast_to: torch.dtype | None = None
    ) -> None:
        self.bucket_bytes = bucket_bytes
        self.checksums = checksums
        self.cast_to = cast_to
        # Kept between publishes; two slots: one bucket packs while the previous one is put.
        self._staging = Staging(slots=2)

    @classmethod
    def from_settings(
        cls,
        settings: TransportSettings,
        side: Side,
        device: torch.device,
        cast_to: torch.dtype | None = None,
    ) -> MemoryTransport:
        return cls(settings.bucket_mb << 20, settings.verify_checksum, cast_to)

    def publish(self, version: int, weights: Weights, announce: Announce) -> list[ray.ObjectRef]:
        refs = put_version(
            weights, self.bucket_bytes, self.checksums, cast_to=self.cast_to, staging=self._staging
        )
        announce(refs)
        return refs

    def receive(self, version: int, payload: Any) -> Iterator[tuple[str, torch.Tensor]]:
        if not isinstance(payload, list):
            raise TransportError(
                f"memory transport, version {version}: the payload must be the list of bucket "
                f"refs its publisher announced, got {type(payload).__name__}"
            )
        return get_version(payload, version=version)

    def close(self) -> None:
        """Nothing to release: the objects live while the Synchronizer holds their refs."""
