"""The `nccl` transport: a broadcast group of its own between the trainer's rank 0 (the sender,
rank 0 here) and the explorer ranks (receivers, ranks 1..), NCCL on CUDA and gloo on CPU.

Every process already has a default torch.distributed group (FSDP's or vLLM's), and this group
must not touch it: it is built from its own `TCPStore` (hosted by rank 0) and a backend object
made directly (`ProcessGroupGloo` / `ProcessGroupNCCL`), whose own collectives it calls. It
never calls `init_process_group` or a `dist.*` function that uses the default group.

Where the bytes go (`hybrid.transport.device`, decided by each side from its worker's device,
checked to agree when the group forms):
- CUDA: NCCL between the GPUs. The sender packs its buckets on its GPU (device-to-device
  copies, cast included), NCCL moves those device buffers, and a receiver yields tensors that
  are views into a bucket on its own GPU, for the engine to copy from: nothing goes through
  host memory. The communicator is bound to the worker's GPU and connected when the group
  forms. Deadlines of later broadcasts are enforced by NCCL's watchdog, which aborts the
  communicator (with torch's default error handling, the process) instead of raising here.
- CPU: gloo over TCP, buckets in host memory; the group's timeout raises `TransportError`.
Digests (`sync.verify_checksum`) are CRC-32 on either device, hashed on the host: on CUDA
that costs one device-to-host copy per bucket on each side, and only when they are on.

Wire format, one round per bucket (every message is a broadcast from rank 0):
  1. an int64 tensor `[header_len, bucket_len]`; `header_len == 0` means the stream has ended
  2. the header: the bucket's `TensorMeta`s as JSON bytes in a uint8 tensor (JSON, not
     pickle, so that a receiver never unpickles what arrives on a socket)
  3. the flat uint8 bucket
Messages 1 and 2 are tiny and read on the host; message 3 stays on the group's device.
Needs: a `host:port` that rank 0 can listen on and every receiver can reach.
`BroadcastTransport` is this medium behind the `WeightTransport` protocol.
"""

from __future__ import annotations

import json
import queue
import socket
import threading
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import asdict
from datetime import timedelta
from typing import Any, ClassVar

import torch
import torch.distributed as dist

from hybrid.transport.base import Announce, Side, TransportSettings
from hybrid.transport.buckets import Staging, TensorMeta, Weights, iter_buckets, unpack_bucket
from hybrid.transport.device import Backend, transport_backend, transport_device
from hybrid.transport.errors import TransportError

_STORE_PREFIX = "hybrid-transport"


class BroadcastGroup:
    """A sender (rank 0) and `world_size - 1` receivers, joined over `host:port`, moving
    buckets on `device` (`cuda[:N]`: NCCL on that GPU; `cpu`: gloo).

    The constructor is collective: it returns once all `world_size` ranks have joined (and
    agree on the backend), or raises `TransportError` after `timeout_s`. Every later broadcast
    has the same deadline. Workers build it with `broadcast_group_for`.
    """

    def __init__(
        self,
        host: str,
        port: int,
        rank: int,
        world_size: int,
        device: torch.device | str = "cpu",
        timeout_s: float = 600,
    ) -> None:
        if world_size < 2:
            raise ValueError(f"world_size must be >= 2 (a sender and a receiver), got {world_size}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
        self.host, self.port, self.rank, self.world_size = host, port, rank, world_size
        self.device = torch.device(device)
        if self.device.type not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'cpu' or 'cuda[:N]', got {device!r}")
        self.backend: Backend = transport_backend(self.device)
        if self.backend == "nccl" and not dist.is_nccl_available():
            raise TransportError(
                f"{self}: this torch build ({torch.__version__}) has no NCCL; "
                "a CUDA worker needs torch's CUDA build"
            )
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.timeout_s = timeout_s
        timeout = timedelta(seconds=timeout_s)
        self._pg: Any = None
        self._store: dist.TCPStore | None = None
        try:
            self._store = dist.TCPStore(
                host,
                port,
                world_size,
                is_master=rank == 0,
                timeout=timeout,
                wait_for_workers=False,
            )
            store = dist.PrefixStore(_STORE_PREFIX, self._store)
            self._check_peers(store, timeout)
            self._pg = self._make_backend(store, timeout)
        except TransportError:
            raise
        except (RuntimeError, OSError) as e:  # DistStoreError and DistNetworkError included
            raise TransportError(f"{self}: cannot form the group: {e}") from e

    def __repr__(self) -> str:
        return (
            f"BroadcastGroup(rank {self.rank}/{self.world_size}, "
            f"{self.host}:{self.port}, {self.device} over {self.backend})"
        )

    def send(
        self, weights: Weights, bucket_bytes: int, checksums: bool = True, **packing: Any
    ) -> int:
        """Broadcast the stream to every receiver (rank 0 only), with each tensor's digest when
        `checksums`; return the bucket bytes sent. `packing`: `iter_buckets`'s keyword options.

        Buckets are packed on the group's device (a `staging` must be on it too): on CUDA the
        weights are copied into GPU buckets and never visit the host. Pipelined: bucket i is on
        the wire while bucket i+1 is packed; at most two buckets are in flight (with a
        `staging` of fewer than two slots, one: a slot is only packed again once its broadcast
        is done; on CUDA "done" is in stream order, the host does not wait).
        """
        if self.rank != 0:
            raise RuntimeError(f"{self}: only rank 0 sends")
        staging: Staging | None = packing.get("staging")
        depth = min(2, staging.slots) if staging is not None else 2
        in_flight: deque[list[tuple[Any, torch.Tensor]]] = deque()
        sent = 0
        buckets = iter_buckets(weights, bucket_bytes, checksums, device=self.device, **packing)
        for flat, metas in buckets:
            header = json.dumps([asdict(m) for m in metas]).encode()
            in_flight.append(
                [
                    self._start(torch.tensor([len(header), flat.numel()], dtype=torch.int64)),
                    self._start(torch.frombuffer(bytearray(header), dtype=torch.uint8)),
                    self._start(flat),
                ]
            )
            sent += flat.numel()
            # The next bucket is packed into the slot of the oldest one in flight.
            while len(in_flight) >= depth:
                self._finish(in_flight.popleft())
        while in_flight:
            self._finish(in_flight.popleft())
        self._broadcast(torch.zeros(2, dtype=torch.int64))
        return sent

    def receive(
        self, verify: bool = True, staging: Staging | None = None
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield the stream rank 0 sends, in order, until its end (receivers only), as tensors
        on the group's device: on CUDA, views into a GPU bucket (never copied to the host).

        With `staging` (on the group's device), buckets are received into its slots and the
        tensors are views that a later bucket overwrites: a consumer that copies each tensor as
        it comes (the engine's loaders do) saves an allocation per bucket; one that keeps them
        must not pass `staging`. On the CPU a thread receives ahead into the free slots: with
        two, the next bucket arrives while the consumer copies out the current one. On CUDA
        no thread is needed: NCCL writes a slot on its own stream, after the consumer's copies
        out of it (stream order).

        Raises `TransportError` if nothing arrives within the group's timeout or the sender
        dies (on CUDA, NCCL's watchdog handles both), and `TransportChecksumError` for a tensor
        whose bytes do not match its digest (when the sender sent digests).
        Consume it to the end: a receiver that stops early leaves the sender waiting until its
        timeout, and the group out of step.
        """
        if self.rank == 0:
            raise RuntimeError(f"{self}: rank 0 sends, it cannot receive")
        if staging is not None and staging.device != self.device:
            raise ValueError(f"{self}: the staging buffers are on {staging.device}")
        if staging is None:
            buckets = self._buckets(lambda n: self._receive_buffer(n, torch.uint8, on_host=False))
        elif self.device.type == "cuda":
            buckets = self._buckets(lambda n: self._broadcast_into(staging.take(n)))
        else:
            buckets = self._prefetched_buckets(staging)
        for index, (flat, metas) in enumerate(buckets):
            source = f"broadcast from {self.host}:{self.port}, bucket {index + 1}"
            yield from unpack_bucket(flat, metas, verify, source=source)

    def _buckets(
        self, receive_flat: Callable[[int], torch.Tensor]
    ) -> Iterator[tuple[torch.Tensor, list[TensorMeta]]]:
        """The buckets of one stream, each received when asked for."""
        while True:
            header_len, bucket_len = self._receive_buffer(2, torch.int64).tolist()
            if header_len == 0:
                return
            header = self._receive_buffer(header_len, torch.uint8)
            flat = receive_flat(bucket_len)
            yield flat, [_meta_from_json(m) for m in json.loads(header.numpy().tobytes())]

    def _prefetched_buckets(
        self, staging: Staging
    ) -> Iterator[tuple[torch.Tensor, list[TensorMeta]]]:
        """`_buckets` run ahead by a thread, into the staging slots: a slot is received into
        again only after the consumer has asked for the bucket that follows it."""
        ready: queue.Queue[Any] = queue.Queue()
        free_slots = threading.Semaphore(staging.slots)
        abandoned = threading.Event()

        def take_slot(nbytes: int) -> torch.Tensor:
            while not free_slots.acquire(timeout=0.5):
                if abandoned.is_set():
                    raise TransportError(f"{self}: the consumer stopped reading")
            return self._broadcast_into(staging.take(nbytes))

        def run() -> None:
            try:
                for bucket in self._buckets(take_slot):
                    ready.put(bucket)
                ready.put(None)
            except BaseException as e:  # handed to the consumer, raised there
                ready.put(e)

        thread = threading.Thread(target=run, name="broadcast-receive", daemon=True)
        thread.start()
        try:
            while (item := ready.get()) is not None:
                if isinstance(item, BaseException):
                    raise item
                yield item
                free_slots.release()  # the consumer is done with that bucket's slot
        finally:
            abandoned.set()
            thread.join(timeout=1.0)

    def close(self) -> None:
        """Leave the group (idempotent). Peers still waiting on this rank then fail."""
        if self._pg is not None:
            self._pg.shutdown()
            self._pg = None
        self._store = None

    def __enter__(self) -> BroadcastGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_peers(self, store: dist.Store, timeout: timedelta) -> None:
        """Wait (until `timeout`) for every rank to arrive, and check they all chose this
        rank's backend: a gloo rank and an NCCL rank would otherwise hang each other."""
        store.set(f"backend/{self.rank}", self.backend)
        keys = [f"backend/{r}" for r in range(self.world_size)]
        store.wait(keys, timeout)
        chosen = {r: store.get(key).decode() for r, key in enumerate(keys)}
        if set(chosen.values()) != {self.backend}:
            raise TransportError(
                f"{self}: the ranks chose different backends {chosen} (a worker on a GPU "
                "and one on the CPU cannot share a broadcast group)"
            )

    def _make_backend(self, store: dist.Store, timeout: timedelta) -> Any:
        if self.backend == "nccl":
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = timeout
            options.is_high_priority_stream = False
            # Made on, and connected for, this worker's GPU (as torch's `new_group(device_id=)`
            # does): a failure to connect shows here, and no broadcast guesses its device.
            with torch.cuda.device(self.device):
                pg = dist.ProcessGroupNCCL(store, self.rank, self.world_size, options)
                pg.eager_connect_single_device(self.device)
            return pg
        # torch 2.13: the gloo options class is `_Options` at runtime (`Options` is the generic
        # Backend.Options there), while the type stubs only know `Options`.
        options = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]
        options._timeout = timeout
        # Listen on the interface that routes to rank 0's host (loopback for 127.0.0.1), not
        # on whatever the machine's hostname resolves to.
        options._devices = [dist.ProcessGroupGloo.create_device(hostname=_local_address(self.host))]
        return dist.ProcessGroupGloo(store, self.rank, self.world_size, options)

    def _receive_buffer(self, numel: int, dtype: torch.dtype, on_host: bool = True) -> torch.Tensor:
        """The next message from rank 0: on the host (`on_host`, for the small control
        messages) or where it arrived, on the group's device (buckets)."""
        buffer = self._broadcast_into(torch.empty(numel, dtype=dtype, device=self.device))
        return buffer.cpu() if on_host else buffer

    def _broadcast_into(self, buffer: torch.Tensor) -> torch.Tensor:
        """Receive the next message into `buffer` (on the group's device); `buffer`."""
        self._broadcast(buffer)
        return buffer

    def _broadcast(self, tensor: torch.Tensor) -> None:
        """Broadcast `tensor` from rank 0 (a CPU tensor is copied to the device first)."""
        self._finish([self._start(tensor)])

    def _start(self, tensor: torch.Tensor) -> tuple[Any, torch.Tensor]:
        """Start broadcasting `tensor` from rank 0; (work, the tensor on the device) -- the
        tensor must stay alive until the work is done."""
        if self._pg is None:
            raise TransportError(f"{self} is closed")
        options = dist.BroadcastOptions()
        options.rootRank = 0
        options.rootTensor = 0
        options.timeout = timedelta(seconds=self.timeout_s)
        on_device = tensor.to(self.device)
        try:
            return self._pg.broadcast([on_device], options), on_device
        except RuntimeError as e:
            raise TransportError(f"{self}: broadcast failed (peer dead or timed out): {e}") from e

    def _finish(self, started: list[tuple[Any, torch.Tensor]]) -> None:
        """Wait for broadcasts begun by `_start`, in order."""
        try:
            for work, _ in started:
                work.wait()
        except RuntimeError as e:
            raise TransportError(f"{self}: broadcast failed (peer dead or timed out): {e}") from e
        finally:
            started.clear()


class BroadcastTransport:
    """`sync.method=nccl`: a broadcast group from the trainer's rank 0 (group rank 0) to every
    explorer rank (rank r is group rank 1 + r), NCCL between GPUs and gloo on the CPU. A
    rendezvous: the bytes move only while the receivers receive, so the payload is nothing.
    The group is joined once (`join`), by the publisher's rank 0 and every receiver rank.
    The publisher casts floating tensors to `cast_to` while packing."""

    rendezvous: ClassVar[bool] = True

    def __init__(
        self,
        side: Side,
        worker_device: torch.device,
        bucket_bytes: int,
        checksums: bool,
        timeout_s: float,
        cast_to: torch.dtype | None = None,
    ) -> None:
        self.side: Side = side
        self.worker_device = worker_device
        self.bucket_bytes = bucket_bytes
        self.checksums = checksums
        self.timeout_s = timeout_s
        self.cast_to = cast_to
        self._group: BroadcastGroup | None = None
        self._staging: Staging | None = None

    @classmethod
    def from_settings(
        cls,
        settings: TransportSettings,
        side: Side,
        device: torch.device,
        cast_to: torch.dtype | None = None,
    ) -> BroadcastTransport:
        bucket_bytes = settings.bucket_mb << 20
        return cls(
            side, device, bucket_bytes, settings.verify_checksum, settings.timeout_s, cast_to
        )

    def join(self, host: str, port: int, world_size: int, worker_rank: int) -> None:
        """Join the group at `host:port` (collective). The publisher's ranks other than 0 stay
        out: they only take part in the gather."""
        if self.side == "publisher" and worker_rank != 0:
            return
        rank = 0 if self.side == "publisher" else 1 + worker_rank
        self._group = broadcast_group_for(
            self.worker_device, host, port, rank, world_size, self.timeout_s
        )
        # Kept between versions, where the group moves bytes (the GPU under NCCL); two slots:
        # one bucket is packed (or loaded into the engine) while the next is on the wire.
        self._staging = Staging(slots=2, device=self._group.device)

    def publish(self, version: int, weights: Weights, announce: Announce) -> None:
        group = self._joined("publish")
        group.send(
            weights, self.bucket_bytes, self.checksums, cast_to=self.cast_to, staging=self._staging
        )
        announce(None)

    def receive(self, version: int, payload: Any) -> Iterator[tuple[str, torch.Tensor]]:
        # The loaders copy every tensor as it arrives, so received buckets can share a slot.
        return self._joined("receive").receive(staging=self._staging)

    def close(self) -> None:
        if self._group is not None:
            self._group.close()
            self._group = None

    def _joined(self, action: str) -> BroadcastGroup:
        if self._group is None:
            raise TransportError(
                f"broadcast transport ({self.side}): cannot {action} before joining the group"
            )
        return self._group


def broadcast_group_for(
    worker_device: torch.device, host: str, port: int, rank: int, world_size: int, timeout_s: float
) -> BroadcastGroup:
    """Join the group as a worker on `worker_device` does (collective): buckets on that GPU
    over NCCL for a CUDA worker, on the CPU over gloo otherwise. The sender and the receivers
    all join through here, so they choose by the same rule."""
    device = transport_device(worker_device)
    return BroadcastGroup(host, port, rank, world_size, device=device, timeout_s=timeout_s)


def _local_address(remote_host: str) -> str:
    """This machine's address on the route to `remote_host` (a UDP connect sends nothing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect((remote_host, 9))
        address: str = sock.getsockname()[0]
        return address


def _meta_from_json(data: dict[str, Any]) -> TensorMeta:
    return TensorMeta(**{**data, "shape": tuple(data["shape"])})
