"""Ulysses sequence parallelism for a packed micro-batch (issue 45; docs/long-context.md).

The sp ranks of one data-parallel slot receive the same micro-batch. Each packs it into one
row of T tokens (hybrid.workers.packing), pads the row to a multiple of sp with a segment of
its own (positions restarting at 0, so no real token attends to it), embeds the whole row and
keeps its slice of t = T / sp tokens of the embeddings: rank r computes tokens
[r * t, (r + 1) * t) from there on. The labels are taken on the
whole row first: the state at position p predicts the token at p + 1, which may sit on the
next rank's slice (peers that shifted after slicing gave every shard's last token a wrong
label, verl #6068). Attention sees the whole row by two all-to-alls per layer
(hybrid.workers.ulysses); everything else in the model is per token. Each rank scores only
the response positions of its slice, and the scalar scores (log-probs, entropy, values) are
gathered, never logits: score_index ascends, so the ranks' pieces concatenate in order.

Every rank of an sp group computes the same loss from the gathered scores, and its own
slice's graph carries the gradient: the gather's backward keeps this rank's piece without
summing the copies (summing would count the loss sp times).
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from hybrid.workers.packing import ModelInputs

_ACTIVE: contextvars.ContextVar[dist.ProcessGroup | None] = contextvars.ContextVar(
    "hybrid_sp_group", default=None
)


def active_group() -> dist.ProcessGroup | None:
    """The sp group whose attention runs Ulysses now (None: plain attention)."""
    return _ACTIVE.get()


@contextmanager
def sliced_pass(model: nn.Module, shard: Shard, group: dist.ProcessGroup) -> Iterator[None]:
    """Within: `model` embeds the whole padded row and keeps this rank's slice of the
    embeddings (whatever the embedding step merges in, image features later, sees the whole
    row), and its attention runs Ulysses over `group`."""
    start, end = shard.span

    def keep_slice(module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
        return output[:, start:end]

    embedding = model.get_input_embeddings()  # type: ignore[operator]
    handle = embedding.register_forward_hook(keep_slice)
    token = _ACTIVE.set(group)  # read by the registered varlen attention (active_group)
    try:
        yield
    finally:
        _ACTIVE.reset(token)
        handle.remove()


@dataclass(frozen=True)
class SpGroup:
    """This rank's place in its sequence-parallel group."""

    group: dist.ProcessGroup
    rank: int
    size: int


@dataclass(frozen=True)
class Shard:
    """One rank's slice of a packed row and where its scores sit among all ranks'."""

    inputs: ModelInputs
    """What this rank's model call reads: the whole padded row's ids (1, T) and cu_seqlens,
    the slice's positions (1, t), and its local score_index and labels (the scores of the
    slice's positions, in ascending order)."""
    span: tuple[int, int]
    """[start, end) of the slice in the padded row: what the embedding's output is cut to."""
    counts: list[int]
    """Scored positions on each rank of the group, in rank order."""


def shard_inputs(inputs: ModelInputs, rank: int, size: int) -> Shard:
    """Rank `rank`'s slice of a packed micro-batch's row (pure: every rank computes every
    rank's counts from the same inputs)."""
    if inputs.cu_seqlens is None or inputs.input_ids.shape[0] != 1:
        raise ValueError("sequence parallelism needs packed inputs (model.use_remove_padding)")
    tokens = inputs.input_ids.shape[1]
    local = -(-tokens // size)
    pad = local * size - tokens
    ids = F.pad(inputs.input_ids, (0, pad))
    positions = torch.cat(
        [inputs.position_ids, torch.arange(pad, device=ids.device).view(1, pad)], dim=1
    )
    cu_seqlens = inputs.cu_seqlens
    if pad:  # the padding is a sequence of its own: nothing real attends to it
        tail = torch.tensor([tokens + pad], dtype=cu_seqlens.dtype, device=cu_seqlens.device)
        cu_seqlens = torch.cat([cu_seqlens, tail])
    start, end = rank * local, (rank + 1) * local
    mine = (inputs.score_index >= start) & (inputs.score_index < end)
    edges = torch.arange(size + 1, device=ids.device) * local
    counts = torch.bucketize(inputs.score_index, edges[1:-1], right=True).bincount(minlength=size)
    sliced = replace(
        inputs,
        input_ids=ids,
        position_ids=positions[:, start:end],
        score_index=inputs.score_index[mine] - start,
        labels=inputs.labels[mine],
        cu_seqlens=cu_seqlens,
        max_seqlen=max(inputs.max_seqlen, pad),
    )
    return Shard(sliced, (start, end), counts.tolist())


class _GatherScores(torch.autograd.Function):
    """Every rank's (n_r, k) scores, concatenated in rank order; backward: this rank's rows of
    the gradient (every rank holds the same loss of the gathered scores)."""

    @staticmethod
    def forward(
        ctx: Any, local: torch.Tensor, counts: list[int], rank: int, group: dist.ProcessGroup
    ) -> torch.Tensor:
        ctx.rows = (sum(counts[:rank]), sum(counts[: rank + 1]))
        widest = max(counts)
        padded = F.pad(local, (0, 0, 0, widest - local.shape[0])).contiguous()
        pieces = [torch.empty_like(padded) for _ in counts]
        dist.all_gather(pieces, padded, group=group)
        return torch.cat([piece[:n] for piece, n in zip(pieces, counts, strict=True)])

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        first, last = ctx.rows
        return grad[first:last], None, None, None


def gather_scores(local: torch.Tensor, shard: Shard, sp: SpGroup) -> torch.Tensor:
    """(n_local, k) scores of this rank's positions -> (n, k) of the whole row, in order,
    in fp32 (gloo moves no 16-bit tensors)."""
    return _GatherScores.apply(local.float(), shard.counts, sp.rank, sp.group)


def scores_over_group(
    model: nn.Module,
    inputs: ModelInputs,
    sp: SpGroup,
    score: Callable[[ModelInputs], torch.Tensor],
) -> torch.Tensor:
    """`score(inputs)`'s (n, k) scalars of a whole packed row, computed split over the sp
    group: this rank's slice through `model` (embedding cut, Ulysses attention), every
    rank's rows gathered in order."""
    shard = shard_inputs(inputs, sp.rank, sp.size)
    with sliced_pass(model, shard, sp.group):
        local = score(shard.inputs)
    return gather_scores(local, shard, sp)
