"""The rank environment of one worker process, read once into a frozen object.

The worker group exports these variables before any member class is constructed, so that
`torch.distributed.init_process_group()` works with no arguments inside a member's `__init__`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class RankEnv:
    rank: int
    """Global rank of this worker in its group (0 .. world_size - 1)."""
    world_size: int
    """Number of workers in the group."""
    local_rank: int
    """Rank among the workers placed on the same node."""
    local_world_size: int
    """Number of workers of the group placed on this node."""
    master_addr: str
    """Address of rank 0's node, the rendezvous host for torch.distributed."""
    master_port: int
    """A port that was free on rank 0's node when the group started."""
    node: str = ""
    """This worker's node as `<address> <Ray node id prefix>` (HYBRID_NODE; "" if unknown):
    for errors and the memory ledger."""

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is outside world_size {self.world_size}")
        if not 0 <= self.local_rank < self.local_world_size:
            raise ValueError(
                f"local_rank {self.local_rank} is outside local_world_size {self.local_world_size}"
            )

    def to_environ(self) -> dict[str, str]:
        """The variables torch.distributed's env:// rendezvous reads."""
        return {
            "RANK": str(self.rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_RANK": str(self.local_rank),
            "LOCAL_WORLD_SIZE": str(self.local_world_size),
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
            "HYBRID_NODE": self.node,
        }

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] = os.environ) -> RankEnv:
        missing = [name for name in _VARS if name not in environ]
        if missing:
            raise RuntimeError(
                f"rank environment variables {missing} are not set: this code must run inside "
                "a worker started by RayWorkerGroup (or set them by hand)"
            )
        return cls(
            rank=int(environ["RANK"]),
            world_size=int(environ["WORLD_SIZE"]),
            local_rank=int(environ["LOCAL_RANK"]),
            local_world_size=int(environ["LOCAL_WORLD_SIZE"]),
            master_addr=environ["MASTER_ADDR"],
            master_port=int(environ["MASTER_PORT"]),
            node=environ.get("HYBRID_NODE", ""),
        )
