"""RayResourcePool: placement groups that pin one worker per bundle, in a fixed rank order.

Bundles are listed entry by entry ([entry 0's bundles..., entry 1's bundles...]); the worker
group numbers ranks node by node from where Ray actually placed them (`ranks_by_node`), so
local ranks and LOCAL_WORLD_SIZE hold even if two entries share a node.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group

_READY_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Bundle:
    placement_group: PlacementGroup
    index: int
    """Bundle index inside its placement group (the worker's local rank)."""
    node_index: int
    """Which entry of `process_on_nodes` this bundle belongs to."""
    local_world_size: int


class RayResourcePool:
    """One STRICT_PACK placement group per node entry; `process_on_nodes[i]` workers on it."""

    def __init__(
        self,
        process_on_nodes: Sequence[int],
        use_gpu: bool = False,
        num_cpus_per_worker: float = 1.0,
        name_prefix: str = "hybrid",
    ) -> None:
        if not process_on_nodes or any(n <= 0 for n in process_on_nodes):
            raise ValueError(
                f"process_on_nodes must list positive counts, got {list(process_on_nodes)}"
            )
        self.process_on_nodes = list(process_on_nodes)
        self.use_gpu = use_gpu
        self.num_cpus_per_worker = num_cpus_per_worker
        self.name_prefix = name_prefix
        self._placement_groups: list[PlacementGroup] = []

    @property
    def world_size(self) -> int:
        return sum(self.process_on_nodes)

    @property
    def bundle_resources(self) -> dict[str, float]:
        """What each worker asks Ray for: one GPU in GPU pools, one CPU slot in CPU pools."""
        if self.use_gpu:
            return {"CPU": self.num_cpus_per_worker, "GPU": 1.0}
        return {"CPU": self.num_cpus_per_worker}

    def bundles(self) -> list[Bundle]:
        """All bundles in rank order; creates the placement groups on first use."""
        if not self._placement_groups:
            self._placement_groups = [
                self._create(i, n) for i, n in enumerate(self.process_on_nodes)
            ]
        return [
            Bundle(pg, index, node_index, n)
            for node_index, (pg, n) in enumerate(
                zip(self._placement_groups, self.process_on_nodes, strict=True)
            )
            for index in range(n)
        ]

    def release(self) -> None:
        for pg in self._placement_groups:
            remove_placement_group(pg)
        self._placement_groups = []

    def _create(self, node_index: int, num_workers: int) -> PlacementGroup:
        pg = placement_group(
            [self.bundle_resources] * num_workers,
            strategy="STRICT_PACK",
            name=f"{self.name_prefix}_node{node_index}_{id(self):x}",
        )
        ready, _ = ray.wait([pg.ready()], timeout=_READY_TIMEOUT_S)
        if not ready:
            remove_placement_group(pg)
            raise RuntimeError(
                f"placement group for node entry {node_index} ({num_workers} x "
                f"{self.bundle_resources}) was not ready after {_READY_TIMEOUT_S:.0f}s; "
                f"cluster resources: {ray.cluster_resources()}, available: {ray.available_resources()}"
            )
        return pg


@dataclass(frozen=True)
class NodeRef:
    """A Ray node a worker runs on."""

    node_id: str
    address: str

    def __str__(self) -> str:
        return f"{self.address} (id {self.node_id[:8]})"

    def is_alive(self) -> bool:
        """Whether the cluster still counts this node as alive."""
        return any(n["NodeID"] == self.node_id and n["Alive"] for n in ray.nodes())


@dataclass(frozen=True)
class Placement:
    """Where one worker's rank puts it: its global rank and its place on its node."""

    rank: int
    local_rank: int
    local_world_size: int


def ranks_by_node(node_ids: Sequence[str]) -> list[Placement]:
    """Ranks for workers placed on `node_ids` (in bundle order): node by node, nodes in the
    order they first appear, bundle order within a node."""
    nodes = list(dict.fromkeys(node_ids))
    order = sorted(range(len(node_ids)), key=lambda i: (nodes.index(node_ids[i]), i))
    rank_of = {index: rank for rank, index in enumerate(order)}
    placements = []
    for index, node in enumerate(node_ids):
        peers = [i for i in order if node_ids[i] == node]
        placements.append(Placement(rank_of[index], peers.index(index), len(peers)))
    return placements
