"""Packing a weight stream into flat byte buckets and back (pure, no Ray, no sockets).

A weight stream is an iterable of `(hf_name, full_tensor)` pairs of tensors of any dtype
(bfloat16 included) on any device. `iter_buckets` groups consecutive tensors into flat `uint8`
tensors of at most `bucket_bytes` each (a tensor larger than that gets a bucket of its own) and
describes each tensor with a `TensorMeta`: where its bytes lie in the bucket and, when the
sender asks for them (`sync.verify_checksum`), their CRC-32. `unpack_bucket` gives the tensors
back, bit for bit, as views into the bucket on the bucket's device, and checks every digest the
sender wrote. Digests are opt-in because hashing is the transports' largest cost after the
copies (CRC-32 runs at ~3 GB/s, a copy at ~20).

Where buckets live (`bucket_device`): on the CPU by default (the `memory` transport puts them
into Ray's object store, gloo sends them from host memory); on a GPU when the caller asks for
it (the `nccl` transport on CUDA), and then the tensors are packed and unpacked by device
copies, never through the host. Digests are CRC-32 everywhere, computed on the host: on a GPU
that costs one device-to-host copy of the bucket per bucket, only when digests are on (sent
or verified); with them off, a device bucket never leaves the device.

Tensors are moved as raw bytes (`view(torch.uint8)`), converted only by an explicit `cast_to`,
so every dtype round trips exactly, NaN payloads included. Offsets are aligned to
`ALIGN_BYTES` so that a byte slice of the bucket can be viewed as any dtype again without a
copy.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch

from hybrid.transport.errors import TransportChecksumError, TransportError

Weights = Iterable[tuple[str, torch.Tensor]]
"""A weight stream: `(hf_name, full_tensor)` pairs in the order the receiver must see them."""

ALIGN_BYTES = 16
"""Offsets inside a bucket are multiples of this (the largest element size, complex128)."""


@dataclass(frozen=True)
class TensorMeta:
    """Where one tensor lies in its bucket, and what its bytes must hash to."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    """The torch dtype without its prefix, e.g. "bfloat16"."""
    offset: int
    """First byte of the tensor inside its bucket."""
    nbytes: int
    checksum: str | None
    """`tensor_digest` of the tensor's bytes; None when the sender did not compute one."""


def as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes as a flat `uint8` tensor on its device (a view when it is already
    contiguous)."""
    # reshape before view: a 0-dim tensor cannot be viewed as a dtype of another size.
    return tensor.detach().contiguous().reshape(-1).view(torch.uint8)


def tensor_digest(tensor: torch.Tensor) -> str:
    """CRC-32 of the tensor's bytes, as 8 hex digits (exact: any changed byte changes it)."""
    return _crc32(as_bytes(tensor))


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def dtype_from_name(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise TransportError(f"unknown tensor dtype {name!r}")
    return dtype


def cast_floating(weights: Weights, dtype: torch.dtype | None) -> Weights:
    """The stream with its floating-point tensors cast to `dtype` as they pass (None: as they
    are): the rule `iter_buckets(cast_to=)` applies, for a transport that writes no buckets."""
    if dtype is None:
        return weights
    return ((name, t.to(dtype) if t.is_floating_point() else t) for name, t in weights)


def group_by_size(
    weights: Weights, bucket_bytes: int, align: int = 1
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Consecutive groups of the stream whose bytes (each tensor starting at a multiple of
    `align`) fit in `bucket_bytes`; a tensor larger than that forms a group of its own."""
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
    group: list[tuple[str, torch.Tensor]] = []
    used = 0
    for name, tensor in weights:
        start = _align_up(used, align)
        nbytes = tensor.numel() * tensor.element_size()
        if group and start + nbytes > bucket_bytes:
            yield group
            group, start = [], 0
        group.append((name, tensor))
        used = start + nbytes
    if group:
        yield group


class Staging:
    """Bucket memory kept from one sync to the next: `slots` buffers on `device`, taken in turn.

    Writing into fresh host memory costs a page fault per 4 KiB page, about as much as the copy
    itself; buffers that stay mapped pay that once per run (on a GPU they spare the caching
    allocator a bucket-sized block per bucket). Two slots let one bucket be packed (or loaded)
    while the previous one is on the wire. Each slot grows to the largest bucket asked of it;
    nothing is allocated before the first `take`.
    """

    def __init__(self, slots: int = 1, device: torch.device | str = "cpu") -> None:
        if slots < 1:
            raise ValueError(f"slots must be >= 1, got {slots}")
        self.slots = slots
        self.device = torch.device(device)
        self._buffers: list[torch.Tensor | None] = [None] * slots
        self._next = 0

    def take(self, nbytes: int) -> torch.Tensor:
        """A flat uint8 view of `nbytes` in the next slot, valid until that slot comes round
        again (`slots` takes later)."""
        index = self._next
        self._next = (index + 1) % self.slots
        buffer = self._buffers[index]
        if buffer is None or buffer.numel() < nbytes:
            buffer = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
            self._buffers[index] = buffer
        return buffer[:nbytes]


def bucket_device(
    staging: Staging | None, device: torch.device | str | None = None
) -> torch.device:
    """Where `iter_buckets` puts a bucket: on `device` when given, else on `staging`'s device,
    else on the CPU. A staging on another device than the one asked for is a caller's mistake
    (`ValueError`): a GPU transport must not pack into host buffers, nor the reverse."""
    if device is None:
        return staging.device if staging is not None else torch.device("cpu")
    where = torch.device(device)
    if staging is not None and staging.device != where:
        raise ValueError(
            f"buckets belong on {where}, but the staging buffers are on {staging.device}"
        )
    return where


def iter_buckets(
    weights: Weights,
    bucket_bytes: int,
    checksums: bool = True,
    *,
    cast_to: torch.dtype | None = None,
    staging: Staging | None = None,
    device: torch.device | str | None = None,
) -> Iterator[tuple[torch.Tensor, list[TensorMeta]]]:
    """Pack the stream into `(flat uint8 bucket, metas)` pairs, in stream order, with each
    tensor's digest when `checksums`.

    Buckets are allocated on `device`, by default `staging`'s device or the CPU (see
    `bucket_device`); tensors on another device are copied across as they are packed. `cast_to` casts floating-point tensors on their way into
    the bucket (one pass instead of a cast and a copy). With `staging`, every
    bucket is a view into one of its slots and is overwritten `staging.slots` buckets later:
    the consumer must be done with a bucket (sent or copied it) before then. Holds at most
    one bucket's worth of source tensors plus the bucket being filled.
    """
    where = bucket_device(staging, device)
    for group in group_by_size(weights, bucket_bytes, align=ALIGN_BYTES):
        placed: list[tuple[str, torch.Tensor, torch.dtype, int]] = []
        offset = 0
        for name, tensor in group:
            dtype = cast_to if cast_to is not None and tensor.is_floating_point() else tensor.dtype
            offset = _align_up(offset, ALIGN_BYTES)
            placed.append((name, tensor, dtype, offset))
            offset += tensor.numel() * dtype.itemsize
        flat = (
            staging.take(offset)
            if staging
            else torch.empty(offset, dtype=torch.uint8, device=where)
        )
        spans: list[tuple[int, int]] = []
        end = 0
        for _, tensor, dtype, start in placed:
            nbytes = tensor.numel() * dtype.itemsize
            # Zero the alignment padding, so that a bucket's bytes are deterministic too.
            flat[end:start].zero_()
            raw = flat[start : start + nbytes]
            if dtype == tensor.dtype:
                raw.copy_(as_bytes(tensor))
            else:
                raw.view(dtype).copy_(tensor.detach().reshape(-1))
            end = start + nbytes
            spans.append((start, nbytes))
        digests = _span_digests(flat, spans) if checksums else [None] * len(spans)
        metas = [
            TensorMeta(
                name=name,
                shape=tuple(tensor.shape),
                dtype=dtype_name(dtype),
                offset=start,
                nbytes=nbytes,
                checksum=digest,
            )
            for (name, tensor, dtype, _), (start, nbytes), digest in zip(
                placed, spans, digests, strict=True
            )
        ]
        yield flat, metas


def unpack_bucket(
    flat: torch.Tensor,
    metas: list[TensorMeta],
    verify: bool = True,
    *,
    source: str | None = None,
) -> list[tuple[str, torch.Tensor]]:
    """The tensors of one bucket, as views into `flat` (on its device) with their dtype and
    shape.

    With `verify`, a tensor whose bytes do not match its checksum raises
    `TransportChecksumError` naming the tensor and `source` (e.g. the version and bucket);
    tensors sent without a checksum are not checked.
    """
    if flat.dtype != torch.uint8 or flat.dim() != 1:
        raise TransportError(
            f"a bucket must be a flat uint8 tensor, got {flat.dtype} {tuple(flat.shape)}"
        )
    checked = verify and any(meta.checksum is not None for meta in metas)
    # One host copy of a device bucket for all its digests, none when nothing is verified.
    host = flat.cpu() if checked else flat
    out: list[tuple[str, torch.Tensor]] = []
    for meta in metas:
        end = meta.offset + meta.nbytes
        if end > flat.numel():
            where = f" ({source})" if source else ""
            raise TransportError(
                f"tensor {meta.name!r}{where} ends at byte {end}, past its bucket of {flat.numel()}"
            )
        raw = flat[meta.offset : end]
        if checked and meta.checksum is not None:
            actual = _crc32(host[meta.offset : end])
            if actual != meta.checksum:
                raise TransportChecksumError(meta.name, meta.checksum, actual, source)
        tensor = raw.view(dtype_from_name(meta.dtype)).reshape(meta.shape)
        out.append((meta.name, tensor))
    return out


def _align_up(offset: int, align: int) -> int:
    return -(-offset // align) * align


def _span_digests(flat: torch.Tensor, spans: list[tuple[int, int]]) -> list[str | None]:
    """The CRC-32 of each `(offset, nbytes)` span of `flat`, from one host copy of a device
    bucket (the slices of a CPU bucket are hashed in place)."""
    host = flat.cpu()
    return [_crc32(host[start : start + nbytes]) for start, nbytes in spans]


def _crc32(flat_bytes: torch.Tensor) -> str:
    return f"{zlib.crc32(flat_bytes.cpu().numpy().data):08x}"
