"""Where the `nccl` transport's buckets live: a CUDA worker broadcasts GPU buckets over NCCL, a
CPU worker host buckets over gloo (`hybrid.transport.device`, `bucket_device`). Runs without a
GPU: `torch.device("cuda", 3)` is only a name until memory is allocated on it, and the `meta`
device stands in for a GPU where a bucket must really be allocated off the host."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from hybrid.transport import (
    BroadcastGroup,
    Staging,
    TransportError,
    broadcast_group_for,
    bucket_device,
    iter_buckets,
    transport_backend,
    transport_device,
    unpack_bucket,
)

pytestmark = pytest.mark.unit

GPU3 = torch.device("cuda", 3)


@pytest.mark.parametrize(
    ("worker", "device", "backend"),
    [
        (GPU3, GPU3, "nccl"),
        (torch.device("cuda"), torch.device("cuda"), "nccl"),
        (torch.device("cpu"), torch.device("cpu"), "gloo"),
        (torch.device("meta"), torch.device("cpu"), "gloo"),
    ],
    ids=["cuda:3", "cuda", "cpu", "other"],
)
def test_a_worker_device_picks_where_buckets_live_and_the_backend(
    worker: torch.device, device: torch.device, backend: str
) -> None:
    assert transport_device(worker) == device
    assert transport_backend(transport_device(worker)) == backend


def test_buckets_for_a_gpu_are_allocated_on_it() -> None:
    assert bucket_device(None, GPU3) == GPU3
    assert bucket_device(Staging(2, device=GPU3)) == GPU3  # a staging's own device
    assert bucket_device(Staging(2, device=GPU3), GPU3) == GPU3
    assert bucket_device(None) == torch.device("cpu")  # the memory transport's default


def test_a_staging_on_another_device_than_the_buckets_is_refused() -> None:
    with pytest.raises(ValueError, match=r"buckets belong on cuda:3.*staging buffers are on cpu"):
        bucket_device(Staging(2), GPU3)
    with pytest.raises(ValueError, match="staging"):
        list(iter_buckets([("w", torch.ones(4))], 1024, staging=Staging(1), device="meta"))


def test_a_gpu_staging_allocates_nothing_until_taken() -> None:
    staging = Staging(2, device=GPU3)  # would fail here if it allocated on the (absent) GPU
    assert staging.device == GPU3 and staging.slots == 2


@pytest.mark.parametrize("staged", [False, True], ids=["fresh", "staging"])
def test_buckets_are_packed_and_unpacked_off_the_host_when_asked(staged: bool) -> None:
    """Packing into a bucket on another device allocates it there and copies across;
    unpacking gives views on that device (no host copy without digests to check)."""
    weights = [("a", torch.ones(3, 4)), ("b", torch.arange(5)), ("c", torch.zeros(2).half())]
    staging = Staging(2, device="meta") if staged else None
    device = None if staged else "meta"
    buckets = list(iter_buckets(weights, 1 << 20, checksums=False, staging=staging, device=device))
    ((flat, metas),) = buckets
    assert flat.device == torch.device("meta") and flat.dtype == torch.uint8
    unpacked = unpack_bucket(flat, metas)
    assert [(n, t.device, t.dtype, t.shape) for n, t in unpacked] == [
        (n, torch.device("meta"), t.dtype, t.shape) for n, t in weights
    ]


@pytest.mark.skipif(dist.is_nccl_available(), reason="checks a torch build without NCCL")
def test_a_cuda_worker_joins_over_nccl_or_says_why_it_cannot() -> None:
    """The factory both worker sides call hands a CUDA worker's device to the group, which
    asks for NCCL before it touches the network (port 9 is never connected to here)."""
    with pytest.raises(TransportError, match=r"rank 1/2, 127\.0\.0\.1:9, cuda:3 over nccl.*NCCL"):
        broadcast_group_for(GPU3, "127.0.0.1", 9, 1, 2, timeout_s=1)
    with pytest.raises(TransportError, match=r"cuda over nccl"):
        BroadcastGroup("127.0.0.1", 9, 0, 2, device="cuda", timeout_s=1)
