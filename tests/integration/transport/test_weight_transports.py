"""The `WeightTransport` classes between real processes, through the protocol alone, as the
workers use them: a publisher actor publishes a version and announces it to a real
Synchronizer actor; receiver actors receive it from the payload the Synchronizer keeps
(`memory`) or while it is sent (`nccl`, gloo here: a group of the publisher's rank 0 and
every receiver; another publisher rank stays out). What arrives is the stream, cast to the
engine's dtype on the way, bit for bit.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import ray
import torch

from hybrid.ports import free_port
from hybrid.synchronizer.actor import SynchronizerActor
from hybrid.transport.base import GroupTransport, Payload, Side, WeightTransport
from hybrid.transport.buckets import as_bytes
from hybrid.transport.collective import BroadcastTransport
from hybrid.transport.memory import MemoryTransport

pytestmark = [
    pytest.mark.integration,
    pytest.mark.usefixtures("ray_cluster"),
    pytest.mark.timeout(120),
]

HOST = "127.0.0.1"
BUCKET_BYTES = 1024  # the weights below fill several buckets
CAST_TO = torch.bfloat16


def weights() -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [
        ("model.embed_tokens.weight", torch.randn(40, 8, generator=g)),
        ("model.layers.0.input_layernorm.weight", torch.tensor([float("nan"), -0.0, 1e-45])),
        ("model.layers.0.ids", torch.arange(-50, 51, dtype=torch.int64)),
        ("model.layers.0.self_attn.q_proj.weight", torch.randn(16, 9, generator=g)),
        ("lm_head.weight", torch.randn(30, 8, generator=g).to(torch.bfloat16)),
    ]


def engine_stream() -> list[tuple[str, torch.Tensor]]:
    return [(n, t.to(CAST_TO) if t.is_floating_point() else t) for n, t in weights()]


def assert_engine_stream(got: list[tuple[str, torch.Tensor]]) -> None:
    want = engine_stream()
    assert [n for n, _ in got] == [n for n, _ in want]
    for (name, a), (_, b) in zip(got, want, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert torch.equal(as_bytes(a), as_bytes(b)), name


@ray.remote(num_cpus=1)
class End:
    """One worker's end of a transport (a trainer or an explorer rank); `use` gives it one,
    so that the module's tests share four processes instead of starting seven."""

    def __init__(self) -> None:
        torch.set_num_threads(1)

    def use(self, method: str, side: Side) -> None:
        cpu = torch.device("cpu")
        self.transport: WeightTransport = (
            MemoryTransport(BUCKET_BYTES, checksums=True, cast_to=CAST_TO)
            if method == "memory"
            else BroadcastTransport(side, cpu, BUCKET_BYTES, True, timeout_s=30, cast_to=CAST_TO)
        )

    def join(self, port: int, world_size: int, worker_rank: int) -> None:
        assert isinstance(self.transport, GroupTransport)
        self.transport.join(HOST, port, world_size, worker_rank)

    def publish(self, version: int, synchronizer: Any) -> Payload:
        def announce(payload: Payload) -> None:
            ray.get(synchronizer.publish.remote(version, payload))

        return self.transport.publish(version, weights(), announce)

    def receive(self, version: int, payload: Payload) -> list[tuple[str, torch.Tensor]]:
        # Copies, as the engine's loaders make: a received bucket's memory is reused.
        return [(name, t.clone()) for name, t in self.transport.receive(version, payload)]

    def close(self) -> None:
        self.transport.close()


@pytest.fixture(scope="module")
def ends() -> Iterator[list[Any]]:
    actors = [End.remote() for _ in range(4)]  # type: ignore[attr-defined]
    yield actors
    for actor in actors:
        ray.kill(actor)


def take(ends: list[Any], method: str, *sides: Side) -> list[Any]:
    """The first len(sides) shared ends, each given a fresh transport of `method`."""
    chosen = ends[: len(sides)]
    ray.get([end.use.remote(method, side) for end, side in zip(chosen, sides, strict=True)])
    return chosen


@pytest.fixture
def synchronizer() -> Iterator[Any]:
    actor = SynchronizerActor.remote("memory", None, 2)
    yield actor
    ray.kill(actor)


def test_memory_publishes_into_the_store_and_receivers_read_the_announced_refs(
    synchronizer: Any, ends: list[Any]
) -> None:
    publisher, *receivers = take(ends, "memory", "publisher", "receiver", "receiver")
    returned = ray.get(publisher.publish.remote(3, synchronizer))
    newest, payload = ray.get(synchronizer.newest.remote())
    assert newest == 3 and len(payload) == len(returned) > 1
    for got in ray.get([r.receive.remote(3, payload) for r in receivers]):
        assert_engine_stream(got)


def test_a_broadcast_reaches_every_receiver_while_it_is_sent(
    synchronizer: Any, ends: list[Any]
) -> None:
    sender, other_trainer_rank, *receivers = take(
        ends, "nccl", "publisher", "publisher", "receiver", "receiver"
    )
    port, world = free_port(HOST), 1 + len(receivers)
    try:
        ray.get(
            [
                sender.join.remote(port, world, 0),
                other_trainer_rank.join.remote(port, world, 1),  # stays out: world is 3
                *[r.join.remote(port, world, rank) for rank, r in enumerate(receivers)],
            ],
            timeout=60,
        )
        for version in (1, 2):  # the group and its buckets serve every version
            receiving = [r.receive.remote(version, None) for r in receivers]
            assert ray.get(sender.publish.remote(version, synchronizer), timeout=60) is None
            for got in ray.get(receiving, timeout=60):
                assert_engine_stream(got)
            assert ray.get(synchronizer.newest.remote()) == (version, None)
    finally:
        ray.get([actor.close.remote() for actor in (sender, other_trainer_rank, *receivers)])
