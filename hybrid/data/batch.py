"""`Batch`: the data protocol passed between the driver and the workers.

A `Batch` owns three things:
  - `tensors`: torch tensors that share their first dimension, the batch size (rows);
  - `non_tensors`: per-row Python values (prompts, dicts, lists) kept as 1-D numpy object arrays;
  - `meta`: batch-level values (step, temperature, ...) that are copied, never split.

Every operation returns a new `Batch` whose `meta` is a shallow copy, so changing a derived
batch's meta never changes the original. Row selection by slice returns views that share
storage with the source; pickling (Ray) compacts such views so a chunk ships only its own rows.

Padding contract: `chunk(n)` never pads. A caller whose batch size may not divide the number of
workers pads explicitly, and drops the padding after the round trip:

    padded, num_pad = batch.pad_to_multiple(world_size)
    out = Batch.concat([worker(c) for c in padded.chunk(world_size)])
    out = out.unpad(num_pad)  # same as out[: len(out) - num_pad]

Padding rows repeat rows from the start of the batch (cyclically), so they hold real data and
never NaN or garbage; they are appended at the end.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

import numpy as np
import torch

RowIndex = int | slice | Sequence[int] | torch.Tensor | np.ndarray


@dataclass(eq=False)
class Batch:
    """Rows of tensors and per-row Python values, plus batch-level `meta`. Build with `from_dict`."""

    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    """Tensors of shape (batch, ...), all with the same first dimension."""
    non_tensors: dict[str, np.ndarray] = field(default_factory=dict)
    """Per-row values as 1-D numpy object arrays of length batch."""
    meta: dict[str, Any] = field(default_factory=dict)
    """Batch-level values; never split, shallow-copied into every derived batch."""

    def __post_init__(self) -> None:
        both = sorted(set(self.tensors) & set(self.non_tensors))
        if both:
            raise ValueError(f"keys {both} are both tensor and non-tensor; a key must be one kind")
        size = self.batch_size
        for key, tensor in self.tensors.items():
            if not isinstance(tensor, torch.Tensor):
                raise TypeError(f"tensor {key!r} is a {type(tensor).__name__}, not a Tensor")
            if tensor.ndim < 1:
                raise ValueError(f"tensor {key!r} is 0-d; batch tensors need a batch dimension")
            if tensor.shape[0] != size:
                raise ValueError(f"tensor {key!r} has first dim {tensor.shape[0]}, expected {size}")
        for key, array in self.non_tensors.items():
            if not isinstance(array, np.ndarray) or array.ndim != 1 or array.dtype != object:
                raise TypeError(f"non-tensor {key!r} must be a 1-D numpy object array")
            if len(array) != size:
                raise ValueError(f"non-tensor {key!r} has length {len(array)}, expected {size}")

    @classmethod
    def from_dict(
        cls,
        tensors: Mapping[str, torch.Tensor],
        non_tensors: Mapping[str, Sequence[Any] | np.ndarray] | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> Batch:
        """Build a validated batch; lists become 1-D object arrays (a list of lists stays 1-D)."""
        arrays = {key: _to_object_array(key, values) for key, values in (non_tensors or {}).items()}
        return cls(dict(tensors), arrays, dict(meta or {}))

    @property
    def batch_size(self) -> int:
        """Rows in the batch: from the tensors, else the non-tensors, else 0."""
        for tensor in self.tensors.values():
            return int(tensor.shape[0]) if tensor.ndim >= 1 else 0
        for array in self.non_tensors.values():
            return len(array)
        return 0

    def __len__(self) -> int:
        return self.batch_size

    def keys(self) -> list[str]:
        """Tensor keys, then non-tensor keys (meta keys are not included)."""
        return [*self.tensors, *self.non_tensors]

    def __contains__(self, key: object) -> bool:
        return key in self.tensors or key in self.non_tensors

    @overload
    def __getitem__(self, index: str) -> torch.Tensor | np.ndarray: ...
    @overload
    def __getitem__(self, index: RowIndex) -> Batch: ...
    def __getitem__(self, index: str | RowIndex) -> torch.Tensor | np.ndarray | Batch:
        """A str gives that column; a row index gives a new Batch (an int keeps the row dim)."""
        if isinstance(index, str):
            if index in self.tensors:
                return self.tensors[index]
            if index in self.non_tensors:
                return self.non_tensors[index]
            raise KeyError(f"no key {index!r} in batch; available: {self.keys()}")
        if isinstance(index, int | np.integer):
            size = len(self)
            if not -size <= index < size:
                raise IndexError(f"row {index} out of range for batch of size {size}")
            start = int(index) % size
            return self._rows(slice(start, start + 1))
        if isinstance(index, slice):
            return self._rows(index)
        return self._rows(self._index_array(index))

    def _index_array(self, index: Sequence[int] | torch.Tensor | np.ndarray) -> np.ndarray:
        """Turn a list, an index tensor/array or a bool mask into a 1-D int64 row-index array."""
        if isinstance(index, torch.Tensor):
            index = index.detach().cpu().numpy()
        array = np.asarray(index)
        size = len(self)
        if array.dtype == bool:
            if array.shape != (size,):
                raise IndexError(f"bool mask has shape {array.shape}, expected ({size},)")
            return np.flatnonzero(array)
        if array.size == 0:
            return np.zeros(0, dtype=np.int64)
        if array.ndim != 1 or not np.issubdtype(array.dtype, np.integer):
            raise TypeError(f"row index must be 1-D ints or a bool mask, got {array.dtype}")
        if array.min() < -size or array.max() >= size:
            raise IndexError(f"row index out of range for batch of size {size}")
        return array.astype(np.int64, copy=False)

    def _rows(self, rows: slice | np.ndarray) -> Batch:
        if isinstance(rows, slice):
            tensors = {key: t[rows] for key, t in self.tensors.items()}
        else:
            index = torch.from_numpy(rows)
            tensors = {key: t[index.to(t.device)] for key, t in self.tensors.items()}
        non_tensors = {key: a[rows] for key, a in self.non_tensors.items()}
        return Batch(tensors, non_tensors, dict(self.meta))

    def chunk(self, n: int) -> list[Batch]:
        """Split into `n` equal consecutive chunks; never pads (see `pad_to_multiple`)."""
        _check_positive("n", n)
        size = len(self)
        if size % n != 0:
            raise ValueError(
                f"batch size {size} is not divisible by {n}; "
                f"call pad_to_multiple({n}) first and unpad(num_pad) after"
            )
        step = size // n
        return [self[i * step : (i + 1) * step] for i in range(n)]

    def pad_to_multiple(self, n: int) -> tuple[Batch, int]:
        """Append rows repeated cyclically from the start until len is a multiple of `n`.

        Returns `(padded, num_pad)`; drop the padding later with `unpad(num_pad)`.
        """
        _check_positive("n", n)
        size = len(self)
        num_pad = -size % n if size > 0 else 0
        if num_pad == 0:
            return self._rows(slice(None)), 0
        rows = np.concatenate([np.arange(size), np.arange(num_pad) % size])
        return self._rows(rows), num_pad

    def unpad(self, num_pad: int) -> Batch:
        """Drop the last `num_pad` rows added by `pad_to_multiple`."""
        if not 0 <= num_pad <= len(self):
            raise ValueError(f"num_pad must be in [0, {len(self)}], got {num_pad}")
        return self[: len(self) - num_pad]

    @classmethod
    def concat(cls, batches: Sequence[Batch]) -> Batch:
        """Concatenate rows; keys must match. Meta is merged; a key whose values differ raises."""
        if not batches:
            raise ValueError("Batch.concat needs at least one batch, got an empty sequence")
        first = batches[0]
        meta = dict(first.meta)
        for i, batch in enumerate(batches[1:], start=1):
            _check_same_keys("tensor", first.tensors, batch.tensors, i)
            _check_same_keys("non-tensor", first.non_tensors, batch.non_tensors, i)
            for key, value in batch.meta.items():
                if key in meta and not _values_equal(meta[key], value):
                    raise ValueError(f"meta key {key!r} of batch {i} differs from earlier batches")
                meta.setdefault(key, value)
        tensors = {key: torch.cat([b.tensors[key] for b in batches]) for key in first.tensors}
        non_tensors = {
            key: np.concatenate([b.non_tensors[key] for b in batches]) for key in first.non_tensors
        }
        return cls(tensors, non_tensors, meta)

    def union(self, other: Batch) -> Batch:
        """Merge the keys of two same-size batches; a shared key must hold equal values."""
        if len(self) != len(other):
            raise ValueError(f"union needs equal batch sizes, got {len(self)} and {len(other)}")
        return Batch(
            _merge("tensor", self.tensors, other.tensors),
            _merge("non-tensor", self.non_tensors, other.non_tensors),
            _merge("meta", self.meta, other.meta),
        )

    def repeat(self, n: int, interleave: bool = True) -> Batch:
        """Repeat every row `n` times: [a, a, b, b] if `interleave`, else [a, b, a, b]."""
        _check_positive("n", n)
        rows = np.arange(len(self))
        return self._rows(np.repeat(rows, n) if interleave else np.tile(rows, n))

    def select(self, keys: Iterable[str]) -> Batch:
        """Keep only `keys` (tensor or non-tensor); meta is kept whole."""
        if isinstance(keys, str):
            raise TypeError(f"select takes a list of keys, got the str {keys!r}")
        wanted = list(keys)
        missing = [key for key in wanted if key not in self]
        if missing:
            raise KeyError(f"keys {missing} not in batch; available: {self.keys()}")
        return Batch(
            {key: self.tensors[key] for key in wanted if key in self.tensors},
            {key: self.non_tensors[key] for key in wanted if key in self.non_tensors},
            dict(self.meta),
        )

    def to(self, device: torch.device | str) -> Batch:
        """Move every tensor to `device`; non-tensors and meta are untouched."""
        tensors = {key: t.to(device) for key, t in self.tensors.items()}
        return Batch(tensors, dict(self.non_tensors), dict(self.meta))

    def equals(self, other: Batch) -> bool:
        """True when both batches hold the same keys with equal values (tensors bit-exact)."""
        return (
            _mappings_equal(self.tensors, other.tensors)
            and _mappings_equal(self.non_tensors, other.non_tensors)
            and _mappings_equal(self.meta, other.meta)
        )

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["tensors"] = {key: _to_wire(t) for key, t in self.tensors.items()}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state["tensors"] = {key: _from_wire(value) for key, value in state["tensors"].items()}
        self.__dict__.update(state)

    def __repr__(self) -> str:
        tensors = ", ".join(f"{k}: {tuple(t.shape)} {t.dtype}" for k, t in self.tensors.items())
        return (
            f"Batch(size={len(self)}, tensors={{{tensors}}}, "
            f"non_tensors={list(self.non_tensors)}, meta={list(self.meta)})"
        )


def _to_object_array(key: str, values: Sequence[Any] | np.ndarray) -> np.ndarray:
    if isinstance(values, str | bytes) or not isinstance(values, Sequence | np.ndarray):
        raise TypeError(f"non-tensor {key!r} must be a list/ndarray, not {type(values).__name__}")
    if isinstance(values, np.ndarray) and values.ndim == 0:
        raise ValueError(f"non-tensor {key!r} is 0-d; it needs one value per row")
    if isinstance(values, np.ndarray) and values.ndim == 1 and values.dtype == object:
        return values
    array = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):  # element-wise so equal-length lists stay 1-D
        array[i] = value
    return array


def _check_positive(name: str, value: int) -> None:
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")


def _check_same_keys(kind: str, first: Mapping[str, Any], got: Mapping[str, Any], i: int) -> None:
    if set(first) != set(got):
        missing, extra = sorted(set(first) - set(got)), sorted(set(got) - set(first))
        msg = f"batch {i} {kind} keys differ from batch 0: missing {missing}, extra {extra}"
        raise ValueError(msg)


def _merge(kind: str, left: Mapping[str, Any], right: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(left)
    for key, value in right.items():
        if key in merged and not _values_equal(merged[key], value):
            raise ValueError(f"union conflict: {kind} key {key!r} differs between the batches")
        merged.setdefault(key, value)
    return merged


def _values_equal(a: Any, b: Any) -> bool:
    if a is b:
        return True
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return False
        same_type = a.shape == b.shape and a.dtype == b.dtype
        return same_type and torch.equal(a, b.to(a.device))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape:
            return False
        if a.dtype != object and b.dtype != object:
            return bool(np.array_equal(a, b))
        return all(_values_equal(x, y) for x, y in zip(a.flat, b.flat, strict=True))
    try:
        return bool(a == b)
    except (RuntimeError, TypeError, ValueError):  # e.g. lists holding tensors
        return False


def _mappings_equal(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    return a.keys() == b.keys() and all(_values_equal(a[k], b[k]) for k in a)


WireTensor = tuple[np.ndarray, torch.dtype]
"""A host tensor as pickled: its memory as a numpy array (bfloat16 and other types numpy lacks
viewed as integers of their width) and the dtype to view it back as."""

_SAME_WIDTH_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _to_wire(tensor: torch.Tensor) -> WireTensor | torch.Tensor:
    """What a batch tensor pickles as. A host tensor becomes a numpy array, which pickle 5
    hands to Ray as an out-of-band buffer (torch pickles each tensor's storage itself: ~10x
    slower at a step's sizes); a view is compacted first so a chunk ships only its rows. A
    device tensor or one that needs grad keeps torch's own pickling."""
    if tensor.device.type != "cpu" or tensor.requires_grad:
        return _compact(tensor)
    host = _compact(tensor).contiguous()
    try:
        return host.numpy(), tensor.dtype
    except TypeError:  # a dtype numpy lacks
        return host.view(_SAME_WIDTH_INT[host.element_size()]).numpy(), tensor.dtype


def _from_wire(value: WireTensor | torch.Tensor) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value
    array, dtype = value
    # Ray may hand out read-only memory (its object store); batch tensors must be writable.
    tensor = torch.from_numpy(array if array.flags.writeable else array.copy())
    return tensor if tensor.dtype == dtype else tensor.view(dtype)


def _compact(tensor: torch.Tensor) -> torch.Tensor:
    """A view of a larger storage cloned: pickling a view would serialize the whole storage."""
    needed = tensor.numel() * tensor.element_size()
    return tensor.clone() if tensor.untyped_storage().nbytes() > needed else tensor
