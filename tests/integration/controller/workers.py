"""Worker classes for the controller tests (importable by the Ray workers)."""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

from hybrid.controller import Dispatch, Worker, register
from hybrid.data.batch import Batch
from hybrid.memory.ledger import process_ledger

RANK_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


class Echo(Worker):
    """Records the environment its __init__ saw; exercises every dispatch mode."""

    def __init__(self, tag: str) -> None:
        self.tag = tag
        self.env_at_init = {name: os.environ.get(name) for name in RANK_VARS}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def describe(self) -> dict:
        return {
            "tag": self.tag,
            "rank": self.rank,
            "world_size": self.world_size,
            "env_at_init": self.env_at_init,
            "pid": os.getpid(),
        }

    @register(dispatch_mode=Dispatch.DP_COMPUTE)
    def double(self, batch: Batch, offset: int = 0) -> Batch:
        rows = len(batch)
        return Batch.from_dict(
            {"y": batch["x"] * 2 + offset, "served_by": torch.full((rows,), self.rank)},
            non_tensors={"text": [f"{t}!" for t in batch["text"]]},
        )

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    def add_rank(self, value: int) -> int:
        return value + self.rank

    @register(dispatch_mode=Dispatch.RANK_ZERO)
    def rank_plus_one(self) -> int:
        return self.rank + 1

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def fail_on(self, rank: int) -> int:
        if self.rank == rank:
            raise ValueError(f"deliberate failure on rank {rank}")
        return self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def slow_square(self, value: int) -> int:
        return value * value

    def not_registered(self) -> None:
        """Not callable from the driver."""


class Collective(Worker):
    """Joins a gloo world in __init__, with no arguments: the group exported the env."""

    def __init__(self) -> None:
        if not dist.is_initialized():
            dist.init_process_group("gloo")

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def all_reduce_sum(self, value: float) -> float:
        tensor = torch.tensor([value * (self.rank + 1)])
        dist.all_reduce(tensor)
        return float(tensor.item())

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def die_on(self, rank: int) -> None:
        if self.rank == rank:
            os._exit(1)  # a hard crash: no exception, no cleanup
        dist.barrier()  # the survivors block on the dead peer

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def ping(self) -> int:
        return self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def pass_boundary_then_sleep(self, boundary: str, seconds: float) -> int:
        """A worker alive but stuck inside a call, after a named phase boundary."""
        process_ledger(self.rank).record(boundary)
        time.sleep(seconds)
        return self.rank


class SlowStart(Worker):
    """A member whose construction never finishes (a hung model load, a rendezvous nobody
    joins)."""

    def __init__(self) -> None:
        time.sleep(600)
