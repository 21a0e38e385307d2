"""Splitting one rank's rows into micro-batches: a fixed row count, or a token budget.

With a token budget (`use_dynamic_bsz`) micro-batches hold as many sequences as fit in
`max_tokens` valid tokens, so a batch of short responses runs in few large passes and a long
one in more small passes. Every FSDP rank must run the same number of forward/backward
passes (each pass all-gathers parameters collectively), so the count is the maximum over
ranks; the rows are then spread over that many micro-batches with near-equal token sums.
The loss does not depend on the split: its normalisers are global (hybrid.workers.policy).
"""

from __future__ import annotations

import heapq

import torch
import torch.distributed as dist


def fixed_micro_batches(rows: int, micro_batch_size: int) -> list[list[int]]:
    return [
        list(range(start, min(start + micro_batch_size, rows)))
        for start in range(0, rows, micro_batch_size)
    ]


def balanced_partition(lengths: list[int], parts: int) -> list[list[int]]:
    """`parts` non-empty groups of row indices with near-equal length sums (longest first,
    each to the lightest group), each group in row order. Needs 1 <= parts <= len(lengths)."""
    if not 1 <= parts <= len(lengths):
        raise ValueError(f"cannot split {len(lengths)} rows into {parts} non-empty parts")
    # (load, size, part): at equal load the smaller group wins, so every group gets a row.
    heap = [(0, 0, part) for part in range(parts)]
    groups: list[list[int]] = [[] for _ in range(parts)]
    for index in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        load, size, part = heapq.heappop(heap)
        groups[part].append(index)
        heapq.heappush(heap, (load + lengths[index], size + 1, part))
    return [sorted(group) for group in groups]


def parts_needed(lengths: list[int], max_tokens: int, field: str) -> int:
    """The fewest balanced parts whose token sums all fit in `max_tokens`."""
    longest = max(lengths, default=0)
    if longest > max_tokens:
        row = lengths.index(longest)
        raise ValueError(
            f"{field}={max_tokens} is smaller than row {row}, which has {longest} tokens: "
            f"raise it to at least the longest prompt + response"
        )
    parts = max(1, -(-sum(lengths) // max_tokens))
    while max(sum(lengths[i] for i in g) for g in balanced_partition(lengths, parts)) > max_tokens:
        parts += 1
    return parts


def token_budget_micro_batches(
    lengths: list[int], max_tokens: int, field: str, device: torch.device
) -> list[list[int]]:
    """Micro-batches of at most `max_tokens` tokens each, as many on every rank."""
    parts = parts_needed(lengths, max_tokens, field)
    if dist.is_initialized():
        count = torch.tensor([parts], device=device)
        dist.all_reduce(count, op=dist.ReduceOp.MAX)
        # Ranks hold equal row counts (the driver splits evenly), and no rank needs more
        # parts than it has rows: the maximum fits every rank.
        parts = int(count.item())
    return balanced_partition(lengths, parts)
