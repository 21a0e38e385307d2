"""The `nccl` transport on GPUs: two processes (a trainer rank 0 on GPU 0, an explorer on GPU 1)
join through `broadcast_group_for` as the workers do, and the sender's GPU tensors arrive on
the receiver's GPU bit for bit, over NCCL, with and without staging buffers and digests.
Needs 2 visible GPUs (NCCL refuses two ranks on one GPU); no Ray, no vLLM.
"""

from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp

from hybrid.transport import Staging, broadcast_group_for, free_port
from hybrid.transport.buckets import as_bytes

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.timeout(180),
    pytest.mark.skipif(
        torch.cuda.device_count() < 2, reason="the NCCL broadcast needs 2 GPUs (one per rank)"
    ),
]

HOST = "127.0.0.1"
BUCKET_BYTES = 4096  # several buckets, one tensor larger than a bucket


def weights(device: torch.device) -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    cpu = [
        ("embed.weight", torch.randn(64, 40, generator=g).to(torch.bfloat16)),
        ("layer.0.special", torch.tensor([float("nan"), -0.0, float("inf"), 1e-45])),
        ("layer.0.scale", torch.tensor(2.5)),
        ("layer.0.ids", torch.arange(-50, 51, dtype=torch.int64)),
        ("layer.1.weight", torch.randn(3, 5, 7, generator=g).half()),
        ("lm_head.weight", torch.randn(30, 8, generator=g).to(torch.bfloat16)),
    ]
    return [(name, t.to(device)) for name, t in cpu]


def run_rank(rank: int, port: int) -> None:
    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    with broadcast_group_for(device, HOST, port, rank, 2, timeout_s=60) as group:
        assert (group.device, group.backend) == (device, "nccl"), group
        for staged, checksums in [(True, True), (False, False)]:
            staging = Staging(2, device=device) if staged else None
            if rank == 0:
                group.send(weights(device), BUCKET_BYTES, checksums, staging=staging)
                continue
            got = [(n, t.clone()) for n, t in group.receive(verify=True, staging=staging)]
            want = weights(torch.device("cpu"))
            assert [n for n, _ in got] == [n for n, _ in want]
            for (name, a), (_, b) in zip(got, want, strict=True):
                assert a.device == device, (name, a.device)  # never copied to the host
                assert a.dtype == b.dtype and a.shape == b.shape, name
                assert torch.equal(as_bytes(a).cpu(), as_bytes(b)), name


def test_nccl_broadcast_moves_gpu_tensors_between_two_gpus() -> None:
    # Both ranks raise in their own process; spawn re-raises the first failure here.
    mp.spawn(run_rank, args=(free_port(HOST),), nprocs=2, join=True)
