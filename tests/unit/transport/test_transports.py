"""The `WeightTransport` protocol and its three classes: each satisfies it, `make_transport`
is the one reader of sync.method (an unknown one is refused naming it), and the checkpoint
transport's publish / receive cycle on a real directory: what it announces, when it prunes,
what it clears. (The memory and broadcast classes move bytes between processes:
tests/integration/transport/test_weight_transports.py.)"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from hybrid.sharding.config import SyncConfig
from hybrid.transport.base import GroupTransport, WeightTransport
from hybrid.transport.buckets import as_bytes
from hybrid.transport.checkpoint import (
    CheckpointTransport,
    complete_versions,
    version_dir,
    write_version,
)
from hybrid.transport.collective import BroadcastTransport
from hybrid.transport.errors import TransportError
from hybrid.transport.factory import TRANSPORTS, make_transport, transport_class
from hybrid.transport.memory import MemoryTransport

pytestmark = pytest.mark.unit

BUCKET_BYTES = 256


def weights(seed: int = 0) -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [
        ("embed.weight", torch.randn(9, 4, generator=g)),
        ("layer.0.ids", torch.arange(-3, 4, dtype=torch.int64)),
        ("layer.0.norm", torch.tensor([float("nan"), -0.0, 1e-45])),
        ("lm_head.weight", torch.randn(7, 4, generator=g).to(torch.bfloat16)),
    ]


def assert_same(got: list[tuple[str, torch.Tensor]], want: list[tuple[str, torch.Tensor]]) -> None:
    assert [n for n, _ in got] == [n for n, _ in want]
    for (name, a), (_, b) in zip(got, want, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert torch.equal(as_bytes(a), as_bytes(b)), name


@dataclass(frozen=True)
class Settings:
    """Any object with SyncConfig's transport fields will do (a method SyncConfig refuses
    itself included, to test the transport's own check)."""

    method: str
    bucket_mb: int = 1
    verify_checksum: bool = True
    timeout_s: float = 5.0
    checkpoint_dir: str | None = None
    keep_versions: int = 2


def every_transport(tmp_path: Path) -> list[WeightTransport]:
    return [
        MemoryTransport(BUCKET_BYTES, checksums=True),
        CheckpointTransport(tmp_path, BUCKET_BYTES, keep_versions=2, verify=True),
        BroadcastTransport("receiver", torch.device("cpu"), BUCKET_BYTES, True, timeout_s=5.0),
    ]


# --- the protocol and the factory ---------------------------------------------------------


def test_every_class_satisfies_the_protocol(tmp_path: Path) -> None:
    for transport in every_transport(tmp_path):
        assert isinstance(transport, WeightTransport), type(transport).__name__
    assert sorted(cls.__name__ for cls in TRANSPORTS.values()) == [
        "BroadcastTransport",
        "CheckpointTransport",
        "MemoryTransport",
    ]


def test_only_the_broadcast_is_a_rendezvous_with_a_group_to_join(tmp_path: Path) -> None:
    memory, checkpoint, broadcast = every_transport(tmp_path)
    assert (memory.rendezvous, checkpoint.rendezvous, broadcast.rendezvous) == (False, False, True)
    assert isinstance(broadcast, GroupTransport)
    assert not isinstance(memory, GroupTransport)
    assert not isinstance(checkpoint, GroupTransport)


@pytest.mark.parametrize(
    ("method", "cls"),
    [
        ("nccl", BroadcastTransport),
        ("memory", MemoryTransport),
        ("checkpoint", CheckpointTransport),
    ],
)
def test_make_transport_builds_the_class_of_sync_method(
    method: str, cls: type, tmp_path: Path
) -> None:
    sync = SyncConfig(method=method, checkpoint_dir=str(tmp_path), bucket_mb=3)  # type: ignore[arg-type]
    assert transport_class(sync) is cls
    publisher = make_transport(sync, "publisher", cast_to=torch.bfloat16)
    assert type(publisher) is cls
    assert publisher.rendezvous is cls.rendezvous
    assert vars(publisher)["cast_to"] is torch.bfloat16
    assert vars(publisher)["bucket_bytes"] == 3 << 20


def test_an_unknown_method_is_refused_naming_sync_method() -> None:
    with pytest.raises(ValueError, match=r"sync\.method must be one of .*nccl.*got 'pigeon'"):
        make_transport(Settings(method="pigeon"), "publisher")
    with pytest.raises(ValueError, match=r"sync\.method"):
        transport_class(Settings(method="NCCL"))


def test_the_checkpoint_transport_needs_its_directory() -> None:
    with pytest.raises(ValueError, match=r"sync\.checkpoint_dir must be set"):
        make_transport(Settings(method="checkpoint"), "receiver")


def test_a_broadcast_is_joined_on_the_workers_device_with_the_sync_timeout() -> None:
    transport = make_transport(Settings(method="nccl", timeout_s=7.0), "receiver")
    assert isinstance(transport, BroadcastTransport)
    assert (transport.worker_device, transport.timeout_s) == (torch.device("cpu"), 7.0)
    assert transport.checksums is True


# --- checkpoint: a real directory -----------------------------------------------------------


def test_checkpoint_round_trip_announces_the_directory_it_returns(tmp_path: Path) -> None:
    transport = CheckpointTransport(tmp_path, BUCKET_BYTES, keep_versions=2, verify=True)
    announced: list[object] = []
    payload = transport.publish(0, weights(), announced.append)
    assert announced == [payload] == [str(version_dir(tmp_path, 0))]
    assert_same(list(transport.receive(0, payload)), weights())


def test_checkpoint_casts_floating_tensors_only(tmp_path: Path) -> None:
    transport = CheckpointTransport(
        tmp_path, BUCKET_BYTES, keep_versions=1, verify=True, cast_to=torch.bfloat16
    )
    payload = transport.publish(3, weights(), lambda _: None)
    want = [(n, t.to(torch.bfloat16) if t.is_floating_point() else t) for n, t in weights()]
    assert_same(list(transport.receive(3, payload)), want)


def test_checkpoint_prunes_old_versions_only_after_announcing_the_new_one(tmp_path: Path) -> None:
    transport = CheckpointTransport(tmp_path, BUCKET_BYTES, keep_versions=2, verify=True)
    transport.publish(1, weights(1), lambda _: None)
    transport.publish(2, weights(2), lambda _: None)
    seen_at_announce: list[list[int]] = []

    def announce(payload: object) -> None:
        seen_at_announce.append([v for v, _ in complete_versions(tmp_path)])

    transport.publish(3, weights(3), announce)
    # The Synchronizer may still hand out version 1 until it has heard of 3.
    assert seen_at_announce == [[1, 2, 3]]
    assert [v for v, _ in complete_versions(tmp_path)] == [2, 3]


def test_the_first_publish_clears_what_an_earlier_run_left_beyond_it(tmp_path: Path) -> None:
    for version in (1, 2, 5):
        write_version(tmp_path, version, weights(version), BUCKET_BYTES)
    (tmp_path / ".tmp-v6-killed").mkdir()
    transport = CheckpointTransport(tmp_path, BUCKET_BYTES, keep_versions=3, verify=True)
    transport.publish(2, weights(20), lambda _: None)  # a run resumed at step 2
    assert [v for v, _ in complete_versions(tmp_path)] == [1, 2]
    assert not (tmp_path / ".tmp-v6-killed").exists()
    assert_same(list(transport.receive(2, str(version_dir(tmp_path, 2)))), weights(20))
    # Only the first publish clears: later ones never touch a newer version.
    write_version(tmp_path, 9, weights(9), BUCKET_BYTES)
    transport.publish(3, weights(3), lambda _: None)
    assert [v for v, _ in complete_versions(tmp_path)] == [2, 3, 9]


def test_checkpoint_refuses_a_payload_that_is_not_a_directory(tmp_path: Path) -> None:
    transport = CheckpointTransport(tmp_path, BUCKET_BYTES, keep_versions=2, verify=True)
    with pytest.raises(TransportError, match=r"checkpoint transport, version 4: .* got list"):
        transport.receive(4, [])
    with pytest.raises(TransportError, match="missing or unreadable"):
        transport.receive(4, str(tmp_path / "v4"))


# --- what needs no second process -----------------------------------------------------------


def test_memory_refuses_a_payload_that_is_not_its_refs() -> None:
    transport = MemoryTransport(BUCKET_BYTES, checksums=True)
    with pytest.raises(TransportError, match=r"memory transport, version 2: .* got str"):
        transport.receive(2, "/some/dir")


def test_a_broadcast_moves_nothing_before_its_group_is_joined() -> None:
    receiver = BroadcastTransport("receiver", torch.device("cpu"), BUCKET_BYTES, True, 5.0)
    with pytest.raises(TransportError, match=r"\(receiver\): cannot receive before joining"):
        receiver.receive(1, None)
    publisher = BroadcastTransport("publisher", torch.device("cpu"), BUCKET_BYTES, True, 5.0)
    # A trainer rank other than 0 only gathers: it stays out of the group.
    publisher.join("127.0.0.1", 1, world_size=3, worker_rank=1)
    with pytest.raises(TransportError, match=r"\(publisher\): cannot publish before joining"):
        publisher.publish(1, weights(), lambda _: None)
    publisher.close()  # idempotent, and fine without a group
    publisher.close()
