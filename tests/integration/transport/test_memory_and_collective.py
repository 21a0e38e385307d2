"""The `memory` and `nccl` (gloo here) transports between real processes (Ray actors).

`memory`: one actor puts a version into the object store, the test process and another actor
read it back bit for bit. `collective`: three actors, each with a default gloo group of its own,
join a BroadcastGroup over 127.0.0.1 as CPU workers do (`broadcast_group_for`: gloo, host
buckets); rank 0 sends, the others receive the identical stream as CPU tensors and their
default groups still work afterwards (with fresh, reused and double-buffered bucket memory); a
receiver whose sender never sends times out, one whose sender dies fails fast.
(tests/gpu/test_nccl_transport.py runs the same broadcast over NCCL between two GPUs.)
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
import ray
import torch
import torch.distributed as dist

from hybrid.transport import (
    BroadcastGroup,
    Staging,
    TransportError,
    broadcast_group_for,
    free_port,
    get_version,
    put_version,
)
from hybrid.transport.buckets import as_bytes

pytestmark = [
    pytest.mark.integration,
    pytest.mark.usefixtures("ray_cluster"),
    pytest.mark.timeout(120),
]

HOST = "127.0.0.1"
BUCKET_BYTES = 1024  # the weights below fill 4+ buckets
TIMEOUT_S = 5.0


def mixed_weights() -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [
        ("model.embed_tokens.weight", torch.randn(40, 8, generator=g).to(torch.bfloat16)),
        ("model.layers.0.input_layernorm.weight", torch.tensor([float("nan"), -0.0, 1e-45])),
        ("model.layers.0.scale", torch.tensor(2.5)),
        ("model.layers.0.self_attn.q_proj.weight", torch.randn(16, 9, generator=g)),
        ("model.layers.0.ids", torch.arange(-50, 51, dtype=torch.int64)),
        ("model.layers.0.empty", torch.empty(0, 3, dtype=torch.bfloat16)),
        ("model.layers.1.mlp.weight", torch.randn(3, 5, 7, generator=g).half()),
        ("lm_head.weight", torch.randn(30, 8, generator=g).to(torch.bfloat16)),
    ]


def assert_same_stream(got: list[tuple[str, torch.Tensor]]) -> None:
    want = mixed_weights()
    assert [n for n, _ in got] == [n for n, _ in want]
    for (name, a), (_, b) in zip(got, want, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert torch.equal(as_bytes(a), as_bytes(b)), name


@ray.remote(num_cpus=1)
class Peer:
    """One process with a default gloo group of its own (world size 1), like a trainer or an
    explorer rank, that publishes, reads, sends or receives weights."""

    def __init__(self, default_group_port: int) -> None:
        torch.set_num_threads(1)
        dist.init_process_group(
            "gloo", init_method=f"tcp://{HOST}:{default_group_port}", rank=0, world_size=1
        )
        self.idle_group: BroadcastGroup | None = None
        self.receiving_group: BroadcastGroup | None = None

    def default_group_works(self) -> bool:
        tensor = torch.full((3,), 2.0)
        dist.all_reduce(tensor)
        return dist.get_world_size() == 1 and dist.get_rank() == 0 and tensor.eq(2.0).all().item()

    def publish(self) -> list[ray.ObjectRef]:
        return put_version(mixed_weights(), BUCKET_BYTES)

    def read(self, refs: list[ray.ObjectRef]) -> list[tuple[str, torch.Tensor]]:
        return list(get_version(refs, version=1))

    def broadcast(self, port: int, rank: int, world_size: int, slots: int = 0) -> Any:
        """Send or receive the stream as a CPU worker joins (`broadcast_group_for`); `slots`
        > 0: through a Staging of that many slots on both sides (a receiver then copies each
        tensor as it arrives, as the loaders do)."""
        staging = Staging(slots) if slots else None
        cpu = torch.device("cpu")
        with broadcast_group_for(cpu, HOST, port, rank, world_size, timeout_s=60) as group:
            assert (group.device, group.backend) == (cpu, "gloo"), group
            if rank == 0:
                return group.send(mixed_weights(), BUCKET_BYTES, staging=staging)
            received = [(name, t.clone()) for name, t in group.receive(staging=staging)]
            assert {t.device for _, t in received} == {cpu}
            return received

    def join_and_stay_silent(self, port: int, timeout_s: float) -> None:
        self.idle_group = BroadcastGroup(HOST, port, 0, 2, timeout_s=timeout_s)

    def leave(self) -> None:
        if self.idle_group is not None:
            self.idle_group.close()
            self.idle_group = None

    def join_as_receiver(self, port: int, timeout_s: float) -> None:
        self.receiving_group = BroadcastGroup(HOST, port, 1, 2, timeout_s=timeout_s)

    def receive_until_error(self, port: int, timeout_s: float, slots: int = 0) -> tuple[str, float]:
        self.join_as_receiver(port, timeout_s)
        return self.receive_on_joined(slots)

    def receive_on_joined(self, slots: int = 0) -> tuple[str, float]:
        """Receive on the group `join_as_receiver` formed until the receive fails."""
        assert self.receiving_group is not None, "join_as_receiver first"
        group, self.receiving_group = self.receiving_group, None
        staging = Staging(slots) if slots else None
        with group:
            start = time.monotonic()
            try:
                list(group.receive(staging=staging))
            except TransportError as e:
                return str(e), time.monotonic() - start
        raise AssertionError("receive() returned although nothing was sent")


@pytest.fixture(scope="module")
def peers(ray_cluster: None) -> Iterator[list[Any]]:
    actors = [Peer.remote(free_port(HOST)) for _ in range(3)]  # type: ignore[attr-defined]
    assert ray.get([a.default_group_works.remote() for a in actors]) == [True] * 3
    yield actors
    for actor in actors:
        ray.kill(actor)


def test_memory_round_trip_through_the_object_store(peers: list[Any]) -> None:
    publisher, reader, _ = peers
    refs = ray.get(publisher.publish.remote())
    assert len(refs) >= 3 and all(isinstance(r, ray.ObjectRef) for r in refs)
    assert_same_stream(list(get_version(refs)))  # in the test process
    assert_same_stream(ray.get(reader.read.remote(refs)))  # in another actor


@pytest.mark.parametrize("slots", [0, 1, 2], ids=["fresh", "one-slot", "two-slots-prefetch"])
def test_broadcast_delivers_identical_tensors_beside_the_default_group(
    peers: list[Any], slots: int
) -> None:
    """Fresh buffers per bucket, one reused buffer, and two slots (the sender packs while a
    bucket is on the wire, a receiver thread fetches the next one while this one is read)."""
    port = free_port(HOST)
    sent, *received = ray.get(
        [peer.broadcast.remote(port, rank, len(peers), slots) for rank, peer in enumerate(peers)]
    )
    assert sent > 4 * BUCKET_BYTES // 2
    for stream in received:
        assert_same_stream(stream)
    assert ray.get([p.default_group_works.remote() for p in peers]) == [True] * 3


def test_a_receiver_whose_sender_never_sends_times_out(peers: list[Any]) -> None:
    sender, receiver, _ = peers
    port = free_port(HOST)
    joined = sender.join_and_stay_silent.remote(port, TIMEOUT_S)
    message, waited = ray.get(receiver.receive_until_error.remote(port, TIMEOUT_S))
    ray.get(joined)
    ray.get(sender.leave.remote())
    assert TIMEOUT_S - 1 < waited < TIMEOUT_S + 10
    assert re.search(rf"rank 1/2, {HOST}:{port}.*[Tt]imed out", message), message
    assert ray.get(receiver.default_group_works.remote())


@pytest.mark.parametrize("slots", [0, 2], ids=["in-line", "prefetch-thread"])
def test_a_receiver_whose_sender_dies_fails_fast(peers: list[Any], slots: int) -> None:
    """Also when the receive runs on the prefetch thread: its error reaches the consumer."""
    doomed = Peer.remote(free_port(HOST))  # type: ignore[attr-defined]
    receiver = peers[1]
    port = free_port(HOST)
    # Both ranks have formed the group before the sender dies: its death is then seen by the
    # receive, not by the receiver's join (which a loaded machine can leave unfinished).
    ray.get(
        [doomed.join_and_stay_silent.remote(port, 60), receiver.join_as_receiver.remote(port, 60)]
    )
    ray.kill(doomed)
    message, waited = ray.get(receiver.receive_on_joined.remote(slots))
    assert waited < 20, "the death should be seen long before the 60 s timeout"
    assert re.search(rf"rank 1/2, {HOST}:{port}.*broadcast failed", message), message


def test_a_receiver_without_a_sender_fails_to_join() -> None:
    port = free_port(HOST)
    start = time.monotonic()
    with pytest.raises(TransportError, match=rf"rank 1/2, {HOST}:{port}.*cannot form the group"):
        BroadcastGroup(HOST, port, 1, 2, timeout_s=2)
    assert time.monotonic() - start < 15
