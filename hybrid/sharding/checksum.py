"""Bit-exact checksums of the tensors the engine keeps readable, compared with the source.

A checksum is (sum of the bit patterns, sum of their squares) as int64: exact, cheap, and
additive over concatenation along dim 0, so a fused engine parameter (qkv_proj, gate_up_proj)
checks against the sum of its parts. Only the rows the sync wrote are compared (vLLM pads
vocabulary rows). Tensors the engine repacked (CPU linears) have no readable storage; the
log-prob comparison after every sync covers them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import torch

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
    engine_name: Callable[[str], str],
) -> Iterator[tuple[str, torch.Tensor]]:
    """Pass tensors through unchanged while adding up their checksums under engine names."""
    for name, tensor in weights:
        key = engine_name(name)
        part = tensor_checksum(tensor)
        into[key] = into[key] + part if key in into else part
        yield name, tensor


def verify(engine_model: torch.nn.Module, expected: dict[str, Checksum]) -> int:
    """Compare every readable engine parameter that the sync wrote with its expected checksum.

    Returns how many were checked; raises ChecksumMismatchError naming the first mismatch.
    """
    checked = 0
    for name, param in engine_model.named_parameters():
        want = expected.get(name)
        if want is None or param.numel() == 0:
            continue
        got = tensor_checksum(param[: want.rows] if param.dim() else param)
        if got != want:
            raise ChecksumMismatchError(
                f"engine tensor {name!r} does not match the synced weights: checksum {got} != expected {want}"
            )
        checked += 1
    return checked
