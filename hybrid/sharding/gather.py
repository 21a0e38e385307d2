"""Gathering the actor's DTensor shards into full tensors, one group at a time.

FSDP2 shards every parameter on dim 0 with `torch.chunk` semantics (rank r holds rows
[r * c, (r + 1) * c) with c = ceil(rows / world), the last ranks possibly fewer or none). A
rank pads its shard to c rows and `all_gather_single` writes every rank's rows straight into
the full tensor's buffer: one collective per parameter, no staging copy. With HSDP (a 2-D
mesh, replicated on one dim and sharded on the other) the gather runs over the shard dim's
group only: every replica already holds the rows of its own group. Shards are cast to
the engine dtype before the gather, which halves the bytes moved and is bit-identical to
casting the full tensor afterwards.

Granularity decides how many full tensors are alive together, hence the peak memory:
  full:   the whole model         (peak: all parameters at once; what a plain state_dict does)
  tensor: one parameter          (peak: the largest parameter)
  layer:  one decoder layer      (the "layered summon"; consecutive layers smaller than
                                 `bucket_bytes` go together: peak the larger of the largest
                                 layer and one bucket)
  bucket: up to `bucket_bytes`   (peak: one bucket, or a larger single parameter)
All four produce the same tensors. The consumer takes them one by one and each is released
as soon as the consumer lets go of it. The tensors are read-only to the consumer: with world
size 1 and the parameters' own dtype they are the parameters themselves, not copies.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Literal

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Shard

from hybrid.memory.model_shape import layer_key
from hybrid.torch_compat import all_gather_single

Granularity = Literal["full", "tensor", "layer", "bucket"]
NamedParam = tuple[str, torch.Tensor]

# gloo has no 16-bit collectives: move bf16/fp16 as raw bytes (dim-0 rows stay rows).
_TRANSPORT_DTYPE = {torch.bfloat16: torch.uint8, torch.float16: torch.uint8}


def group_parameters(
    named_params: list[NamedParam], granularity: Granularity, bucket_bytes: int, dtype: torch.dtype
) -> list[list[NamedParam]]:
    """Split parameters (in model order) into the groups gathered together."""
    if granularity == "full":
        return [list(named_params)]
    if granularity == "tensor":
        return [[item] for item in named_params]
    if granularity == "layer":
        layers: dict[str, list[NamedParam]] = {}
        for name, param in named_params:
            layers.setdefault(layer_key(name), []).append((name, param))
        # Small layers travel together up to a bucket: on the host every group costs a
        # collective round trip, whatever its size. A layer is never split.
        return _fill_buckets(list(layers.values()), bucket_bytes, dtype)
    if granularity == "bucket":
        return _fill_buckets([[item] for item in named_params], bucket_bytes, dtype)
    raise ValueError(f"sync.gather must be full, tensor, layer or bucket, got {granularity!r}")


def _fill_buckets(
    units: list[list[NamedParam]], bucket_bytes: int, dtype: torch.dtype
) -> list[list[NamedParam]]:
    """Consecutive units joined while they fit in `bucket_bytes` (a larger unit stays alone)."""
    buckets: list[list[NamedParam]] = [[]]
    size = 0
    for unit in units:
        nbytes = sum(param.numel() for _, param in unit) * dtype.itemsize
        if buckets[-1] and size + nbytes > bucket_bytes:
            buckets.append([])
            size = 0
        buckets[-1].extend(unit)
        size += nbytes
    return buckets if buckets[-1] else []


def gather_full(group: list[NamedParam], dtype: torch.dtype) -> list[NamedParam]:
    """All-gather a group of (possibly sharded) parameters into full tensors of `dtype`.

    One parameter at a time: the group's full tensors accumulate (that is the group's peak),
    while only one cast shard is alive beside them.
    """
    return [(name, full_parameter(param, dtype)) for name, param in group]


def gather_group(group: list[NamedParam], dtype: torch.dtype) -> list[NamedParam]:
    """The group's full tensors: one all-gather for the whole group where the shards live on
    the host (gloo: each collective is a TCP round trip, about a millisecond, so a layer
    of a dozen tensors costs a dozen of them), one per parameter on a device (no staging
    copy; NCCL's per-call latency is tens of microseconds). The same tensors either way."""
    on_host = any(isinstance(p, DTensor) and p.device.type == "cpu" for _, p in group)
    return CoalescedGather(group, dtype).result() if on_host else gather_full(group, dtype)


def dim0_shard_group(param: torch.Tensor) -> tuple[dist.ProcessGroup, int] | None:
    """(group, size) of the mesh dim that shards `param` on dim 0, when every other mesh dim
    replicates it (FSDP's and HSDP's layouts); None for any other tensor."""
    if not isinstance(param, DTensor):
        return None
    placements = param.placements
    if placements.count(Shard(0)) != 1 or not all(
        p == Shard(0) or p.is_replicate() for p in placements
    ):
        return None
    dim = placements.index(Shard(0))
    mesh = param.device_mesh
    return mesh.get_group(dim), mesh.size(dim)


def full_parameter(param: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if not isinstance(param, DTensor):
        return param.detach().to(dtype)
    sharding = dim0_shard_group(param)
    if sharding is None:
        return param.detach().full_tensor().to(dtype)  # type: ignore[attr-defined]
    group, world = sharding
    if world == 1:  # the local shard is the whole tensor: a collective would only copy it
        return param.to_local().detach().to(dtype)
    rows = param.shape[0]
    chunk = -(-rows // world)
    local = param.to_local().detach().to(dtype)
    if local.shape[0] < chunk:  # the short tail of torch.chunk: pad to equal pieces
        pad = local.new_zeros((chunk - local.shape[0], *local.shape[1:]))
        local = torch.cat([local, pad])
    transport = _TRANSPORT_DTYPE.get(dtype, dtype) if local.device.type == "cpu" else dtype
    padded = torch.empty((chunk * world, *param.shape[1:]), dtype=dtype, device=local.device)
    all_gather_single(padded.view(transport), local.contiguous().view(transport), group=group)
    return padded[:rows]


class CoalescedGather:
    """Like `gather_full`, with one all-gather for the whole group, started on construction
    (asynchronously) and finished by `result()`. Parameters that are not dim-0 shards
    (`dim0_shard_group`) are gathered one by one."""

    def __init__(self, group: list[NamedParam], dtype: torch.dtype) -> None:
        self.group = group
        self.dtype = dtype
        self.sharded: list[tuple[str, DTensor]] = [
            (name, p) for name, p in group if isinstance(p, DTensor) and dim0_shard_group(p)
        ]
        self.work: dist.Work | None = None
        if len(self.sharded) < 2:
            return
        # FSDP2 shards every parameter of a model on the same mesh dim.
        sharding = dim0_shard_group(self.sharded[0][1])
        assert sharding is not None
        shard_group, self.world = sharding
        if self.world == 1:  # nothing to gather: `result` casts each local tensor
            return
        # Few ops per tensor: with hundreds of small tensors the dispatcher, not the bytes,
        # sets the time. Shards are flattened in their own dtype and cast once, together.
        pieces, self.layouts = [], []
        for _, param in self.sharded:
            chunk = -(-param.shape[0] // self.world)
            local = param.to_local().detach()
            if local.shape[0] < chunk:  # the short tail of torch.chunk: pad to equal pieces
                pad = local.new_zeros((chunk - local.shape[0], *local.shape[1:]))
                local = torch.cat([local, pad])
            pieces.append(local.reshape(-1))
            self.layouts.append((chunk, local.numel()))
        local_flat = torch.cat(pieces).to(dtype)
        cpu = local_flat.device.type == "cpu"
        transport = _TRANSPORT_DTYPE.get(dtype, dtype) if cpu else dtype
        self.gathered = local_flat.new_empty(self.world * local_flat.numel())
        self.work = all_gather_single(
            self.gathered.view(transport),
            local_flat.view(transport),
            group=shard_group,
            async_op=True,
        )

    def result(self) -> list[NamedParam]:
        if self.work is None:
            return gather_full(self.group, self.dtype)
        self.work.wait()
        per_rank = self.gathered.view(self.world, -1)
        full: dict[str, torch.Tensor] = {}
        offset = 0
        for (name, param), (chunk, numel) in zip(self.sharded, self.layouts, strict=True):
            rows = per_rank[:, offset : offset + numel].reshape(
                self.world * chunk, *param.shape[1:]
            )
            # With world > 1 the reshape already copied (the ranks' rows interleave); a view
            # would keep the whole gathered buffer alive.
            full[name] = (
                rows[: param.shape[0]].clone() if self.world == 1 else rows[: param.shape[0]]
            )
            offset += numel
        del self.gathered
        return [
            (name, full[name] if name in full else full_parameter(p, self.dtype))
            for name, p in self.group
        ]


def prefetched_groups(
    groups: list[list[NamedParam]], dtype: torch.dtype
) -> Iterator[list[NamedParam]]:
    """Each group's full tensors (coalesced), the next group's all-gather already in flight:
    for many small tensors the collective's latency, not the bytes, sets the time. At most
    two groups are alive at once."""
    pending = CoalescedGather(groups[0], dtype) if groups else None
    for following in [*groups[1:], None]:
        assert pending is not None
        current = pending
        pending = None if following is None else CoalescedGather(following, dtype)
        yield current.result()


def iter_full_parameters(
    model: torch.nn.Module,
    granularity: Granularity,
    dtype: torch.dtype,
    bucket_bytes: int = 64 << 20,
    on_group_done: Callable[[int, int], None] | None = None,
) -> Iterator[NamedParam]:
    """Yield (name, full tensor) for every parameter of `model`, gathering group by group.

    Tied parameters appear once, under their first name (what vLLM expects of a tied
    checkpoint). See `iter_full_tensors`.
    """
    named: list[NamedParam] = list(model.named_parameters())
    yield from iter_full_tensors(named, granularity, dtype, bucket_bytes, on_group_done)


def iter_full_tensors(
    named: list[NamedParam],
    granularity: Granularity,
    dtype: torch.dtype,
    bucket_bytes: int = 64 << 20,
    on_group_done: Callable[[int, int], None] | None = None,
) -> Iterator[NamedParam]:
    """Yield (name, full tensor) for the given (possibly sharded) parameters, in order.

    Only one group is materialised at a time: the consumer (the engine's loader) copies each
    tensor before the next group is gathered. `on_group_done(index, full_bytes)` runs when
    the consumer asks for the tensor after a group's last one, i.e. once it has loaded the
    whole group (the memory ledger's per-chunk boundary).
    """
    for index, group in enumerate(group_parameters(named, granularity, bucket_bytes, dtype)):
        yield from hand_over(gather_group(group, dtype), index, on_group_done)


def hand_over(
    tensors: list[NamedParam], index: int, on_group_done: Callable[[int, int], None] | None
) -> Iterator[NamedParam]:
    """One gathered group's tensors to the consumer, each forgotten once handed over (freed as
    soon as the consumer is done with it); then `on_group_done(index, the group's bytes)`."""
    full_bytes = sum(t.nbytes for _, t in tensors)
    tensors.reverse()
    while tensors:
        yield tensors.pop()
    if on_group_done is not None:
        on_group_done(index, full_bytes)


def iter_row_slices(
    param: torch.Tensor, dtype: torch.dtype, bucket_bytes: int
) -> Iterator[tuple[list[int], torch.Tensor]]:
    """A dim-0 sharded parameter gathered a few rows of every rank's shard at a time, about
    `bucket_bytes` per round (at least one row of each rank): (the global indices of the rows,
    the rows), with every row exactly once. For a stacked expert tensor a row is an expert, so
    the whole tensor never exists at once. The same all-gather as `full_parameter`, on a slice
    of each rank's padded shard: rank r's local row j is global row r * c + j (FSDP2 chunks
    dim 0 into c = ceil(rows / world) rows a rank)."""
    rows = param.shape[0]
    row_bytes = param[0].numel() * dtype.itemsize if rows else 0
    sharding = dim0_shard_group(param)
    world = 1 if sharding is None else sharding[1]
    per_round = max(1, bucket_bytes // max(world * row_bytes, 1))
    if sharding is None or world == 1:
        full = full_parameter(param, dtype)
        for start in range(0, rows, per_round):
            stop = min(start + per_round, rows)
            yield list(range(start, stop)), full[start:stop]
        return
    group, _ = sharding
    chunk = -(-rows // world)
    local = param.to_local().detach()  # type: ignore[attr-defined]
    transport = _TRANSPORT_DTYPE.get(dtype, dtype) if local.device.type == "cpu" else dtype
    for start in range(0, chunk, per_round):
        take = min(per_round, chunk - start)
        piece = local[start : start + take].to(dtype)
        if piece.shape[0] < take:  # this rank holds fewer rows (the tail of torch.chunk)
            pad = piece.new_zeros((take - piece.shape[0], *piece.shape[1:]))
            piece = torch.cat([piece, pad])
        gathered = piece.new_empty((world * take, *param.shape[1:]))
        all_gather_single(gathered.view(transport), piece.contiguous().view(transport), group=group)
        index = [r * chunk + start + i for r in range(world) for i in range(take)]
        kept = [i for i, row in enumerate(index) if row < rows]
        yield [index[i] for i in kept], gathered[kept] if len(kept) < len(index) else gathered
