"""Moving full weight tensors from the trainer's rank 0 to the explorers (docs/modes.md,
docs/architecture.md). Knows no trainer, explorer, model or sharding class: it moves a stream of
`(hf_name, full tensor)` pairs and hands the same stream, bit for bit (cast to the engine's
dtype on the way when asked), to the receiver.

Both sides see one protocol, `WeightTransport` (`base`): the trainer's rank 0 `publish`es a
version, the explorers `receive` it; `rendezvous` says whether the two must meet for it.
`factory.make_transport` builds a worker's end from `sync.method`. Three transports, one
module and one class each, all packing the stream with `buckets`:
- `memory` (`MemoryTransport`): buckets in Ray's object store; the version is a list of
  ObjectRefs that the Synchronizer holds. Needs every process in the same Ray cluster, and the
  publisher alive while the version is read.
- `checkpoint` (`CheckpointTransport`): safetensors shards plus a manifest with per-tensor
  digests, written to `root/v<N>/` atomically (temp dir, fsync, rename). Needs a filesystem
  every process sees.
- `collective` (`BroadcastTransport`, sync.method=nccl): a broadcast group of its own, apart
  from the default process group, from rank 0 to the explorer ranks. On GPUs it is NCCL and
  the buckets stay in GPU memory end to end; on CPU it is gloo through host memory (`device`
  holds the rule both sides apply). Needs a port on the sender's host that every receiver can
  reach.
Receivers verify each tensor's digest when asked to (`sync.verify_checksum`;
`TransportChecksumError` on a mismatch); waits have deadlines and fail with `TransportError` naming the other side.
"""

from hybrid.ports import free_port
from hybrid.transport.base import GroupTransport, Payload, WeightTransport
from hybrid.transport.buckets import (
    Staging,
    TensorMeta,
    Weights,
    bucket_device,
    iter_buckets,
    tensor_digest,
    unpack_bucket,
)
from hybrid.transport.checkpoint import (
    CheckpointTransport,
    complete_versions,
    newest_version,
    prune_versions,
    read_version,
    remove_stale_temps,
    write_version,
)
from hybrid.transport.collective import (
    BroadcastGroup,
    BroadcastTransport,
    broadcast_group_for,
)
from hybrid.transport.device import transport_backend, transport_device
from hybrid.transport.errors import TransportChecksumError, TransportError
from hybrid.transport.factory import make_transport, transport_class
from hybrid.transport.memory import MemoryTransport, get_version, put_version

__all__ = [
    "BroadcastGroup",
    "BroadcastTransport",
    "CheckpointTransport",
    "GroupTransport",
    "MemoryTransport",
    "Payload",
    "Staging",
    "TensorMeta",
    "TransportChecksumError",
    "TransportError",
    "WeightTransport",
    "Weights",
    "broadcast_group_for",
    "bucket_device",
    "complete_versions",
    "free_port",
    "get_version",
    "iter_buckets",
    "make_transport",
    "newest_version",
    "prune_versions",
    "put_version",
    "read_version",
    "remove_stale_temps",
    "tensor_digest",
    "transport_backend",
    "transport_class",
    "transport_device",
    "unpack_bucket",
    "write_version",
]
