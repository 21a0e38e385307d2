"""Balancing tokens across data-parallel ranks.

DP_COMPUTE hands rank r the r-th contiguous chunk of a batch. Reordering the rows so that
every chunk has (nearly) the same number of tokens keeps one rank from waiting on another in
each FSDP collective: greedy longest-first into the lightest partition that still has room.
"""

from __future__ import annotations

import heapq

import torch


def balanced_order(lengths: torch.Tensor, num_partitions: int) -> torch.Tensor:
    """A permutation of range(len(lengths)) whose `num_partitions` equal-size contiguous
    chunks have near-equal length sums. lengths: (rows,); rows must divide evenly."""
    rows = len(lengths)
    if rows % num_partitions:
        raise ValueError(f"{rows} rows do not split into {num_partitions} equal partitions")
    capacity = rows // num_partitions
    heap = [(0, p) for p in range(num_partitions)]  # (token load, partition)
    members: list[list[int]] = [[] for _ in range(num_partitions)]
    for index in torch.argsort(lengths, descending=True, stable=True).tolist():
        full = []
        load, partition = heapq.heappop(heap)
        while len(members[partition]) == capacity:
            full.append((load, partition))
            load, partition = heapq.heappop(heap)
        members[partition].append(index)
        heapq.heappush(heap, (load + int(lengths[index]), partition))
        for item in full:
            heapq.heappush(heap, item)
    return torch.tensor([i for part in members for i in sorted(part)])
