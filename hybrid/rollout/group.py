"""Where one rank sits among the rollout engines: data-parallel groups of `tp` ranks, each
group running one engine with vLLM tensor parallelism.

Every rank of a TP group must feed its engine the same requests, so each rank's share is
gathered across the group before a call (`gather`) and each rank keeps its own slice of the
results. Built once from the worker's 2-D rollout mesh (dims "dp", "tp"); a frozen value, so
the rollout code never touches the process group set-up.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

T = TypeVar("T")


@dataclass(frozen=True)
class RolloutGroup:
    dp_rank: int
    """Which TP group (engine) this rank belongs to."""
    dp_size: int
    """How many engines share the prompts."""
    tp_rank: int
    tp_size: int
    tp_group: dist.ProcessGroup | None = None
    """The TP ranks' process group (None: a group of one, nothing to gather)."""

    def __post_init__(self) -> None:
        if self.tp_size > 1 and self.tp_group is None:
            raise ValueError(f"a TP group of {self.tp_size} ranks needs its process group")

    @classmethod
    def of_mesh(cls, mesh: DeviceMesh) -> RolloutGroup:
        """The group of this rank in a rollout mesh of dims ("dp", "tp")."""
        tp_size = mesh.size(1)
        return cls(
            dp_rank=mesh.get_local_rank("dp"),
            dp_size=mesh.size(0),
            tp_rank=mesh.get_local_rank("tp"),
            tp_size=tp_size,
            tp_group=mesh.get_group("tp") if tp_size > 1 else None,
        )

    @property
    def speaks_for_group(self) -> bool:
        """The first rank of each TP group hands the group's results on (the others hold
        the same ones)."""
        return self.tp_rank == 0

    def gather(self, items: list[T]) -> tuple[list[T], slice]:
        """Every TP rank's items concatenated in TP-rank order (what the engine gets) and
        where this rank's own items sit in them."""
        if self.tp_size == 1:
            return items, slice(0, len(items))
        per_rank: list[list[T] | None] = [None] * self.tp_size
        dist.all_gather_object(per_rank, items, group=self.tp_group)
        sizes = [len(chunk or []) for chunk in per_rank]
        start = sum(sizes[: self.tp_rank])
        shared = [item for chunk in per_rank for item in (chunk or [])]
        return shared, slice(start, start + len(items))

    def share_from_first(self, items: list[T]) -> list[T]:
        """The group's first rank's items on every rank of the group (what only it computed,
        e.g. an agent's environment replies, that every engine of the group must see)."""
        if self.tp_size == 1:
            return items
        box: list[list[T] | None] = [items if self.tp_rank == 0 else None]
        first = dist.get_global_rank(self.tp_group, 0)  # type: ignore[arg-type]
        dist.broadcast_object_list(box, src=first, group=self.tp_group)
        return box[0] or []
