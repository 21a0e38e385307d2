"""Unit tests for `hybrid.sharding.checksum`: hand-computed bit checksums, one-ulp sensitivity,
additivity over dim-0 concatenation, recording fused parts under one engine name, and
`verify` on a small module with padded rows, skipped and corrupted parameters."""

import pytest
import torch
from torch import nn

from hybrid.sharding.checksum import (
    Checksum,
    ChecksumMismatchError,
    recording,
    tensor_checksum,
    verify,
)

pytestmark = pytest.mark.unit


def bump_one_ulp(tensor: torch.Tensor, index: tuple[int, ...]) -> torch.Tensor:
    """A copy of a bf16 tensor with one element moved to the next representable value."""
    out = tensor.clone()
    bits = out.view(torch.int16)
    bits[index] += 1
    return out


def randn_bf16(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).bfloat16()


# ---- tensor_checksum -------------------------------------------------------------------------


def test_checksum_hand_computed_bf16() -> None:
    # bf16 1.0 = 0x3F80 = 16256; -2.0 = 0xC000 = -16384 as int16
    got = tensor_checksum(torch.tensor([1.0, -2.0], dtype=torch.bfloat16))
    assert got == Checksum(16256 - 16384, 16256**2 + 16384**2, rows=2)


def test_checksum_hand_computed_float32_and_scalar() -> None:
    # float32 1.0 = 0x3F800000 = 1065353216
    got = tensor_checksum(torch.tensor(1.0))
    assert got == Checksum(1065353216, 1065353216**2, rows=1)


def test_checksum_rows_are_dim0() -> None:
    assert tensor_checksum(torch.zeros(5, 3, dtype=torch.bfloat16)).rows == 5


def test_one_ulp_change_changes_the_checksum() -> None:
    x = randn_bf16(4, 8)
    y = bump_one_ulp(x, (2, 5))
    assert not torch.equal(x, y)
    assert (y.float() - x.float()).abs().max() > 0
    assert tensor_checksum(y) != tensor_checksum(x)
    assert tensor_checksum(y).bit_sum == tensor_checksum(x).bit_sum + 1


def test_checksum_distinguishes_positive_and_negative_zero() -> None:
    pos = torch.zeros(3, dtype=torch.bfloat16)
    neg = pos.clone()
    neg[1] = -0.0
    assert torch.equal(pos, neg)  # equal as numbers, different as bits
    assert tensor_checksum(pos) != tensor_checksum(neg)


@pytest.mark.parametrize(
    "dtype", [torch.bfloat16, torch.float16, torch.float32], ids=["bf16", "fp16", "fp32"]
)
def test_checksum_is_additive_over_dim0_concatenation(dtype: torch.dtype) -> None:
    # fp32 bit patterns are ~1e9, their squares ~1e18: a handful of them overflows the int64
    # sum, which wraps, while Checksum.__add__ adds unbounded Python ints.
    a, b = randn_bf16(3, 4, seed=1).to(dtype), randn_bf16(2, 4, seed=2).to(dtype)
    whole = tensor_checksum(torch.cat([a, b]))
    assert whole == tensor_checksum(a) + tensor_checksum(b)
    assert whole.rows == 5


def test_checksum_of_non_contiguous_view_matches_its_copy() -> None:
    x = randn_bf16(4, 6)
    view = x.t()
    assert not view.is_contiguous()
    assert tensor_checksum(view) == tensor_checksum(view.contiguous())


# ---- recording -------------------------------------------------------------------------------


def fuse(name: str) -> str:
    """q/k/v_proj -> qkv_proj, the name function the mode switch passes."""
    parts = ["qkv_proj" if p in ("q_proj", "k_proj", "v_proj") else p for p in name.split(".")]
    return ".".join(parts)


def test_recording_passes_tensors_through_and_sums_fused_parts() -> None:
    q, k, v = randn_bf16(4, 4, seed=3), randn_bf16(2, 4, seed=4), randn_bf16(2, 4, seed=5)
    norm = randn_bf16(4, seed=6)
    weights = [("attn.q_proj.weight", q), ("attn.k_proj.weight", k)]
    weights += [("attn.v_proj.weight", v), ("norm.weight", norm)]
    into: dict[str, Checksum] = {}
    stream = recording(weights, into, fuse)
    assert into == {}, "lazy: nothing recorded before the stream is consumed"
    out = list(stream)
    assert [n for n, _ in out] == [n for n, _ in weights]
    assert all(a is b for (_, a), (_, b) in zip(out, weights, strict=True))
    assert set(into) == {"attn.qkv_proj.weight", "norm.weight"}
    assert into["attn.qkv_proj.weight"] == tensor_checksum(torch.cat([q, k, v]))
    assert into["attn.qkv_proj.weight"].rows == 8
    assert into["norm.weight"] == tensor_checksum(norm)


# ---- verify ----------------------------------------------------------------------------------


class EngineLike(nn.Module):
    """An engine-shaped module: padded vocabulary, a fused projection, a repacked (empty)
    weight, a scalar and a parameter the sync does not write."""

    def __init__(self) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(12, 4, dtype=torch.bfloat16)  # 10 real rows + 2 pad
        self.qkv_proj = nn.Linear(4, 8, bias=False, dtype=torch.bfloat16)
        self.repacked = nn.Parameter(torch.empty(0, dtype=torch.bfloat16))
        self.scale = nn.Parameter(torch.tensor(0.5, dtype=torch.bfloat16))
        self.unsynced = nn.Parameter(torch.ones(3, dtype=torch.bfloat16))


@pytest.fixture
def engine_and_expected() -> tuple[EngineLike, dict[str, Checksum]]:
    torch.manual_seed(0)
    engine = EngineLike()
    qkv = engine.qkv_proj.weight.detach()
    sent = [
        ("embed_tokens.weight", engine.embed_tokens.weight.detach()[:10].clone()),
        ("q_proj.weight", qkv[:4].clone()),
        ("k_proj.weight", qkv[4:6].clone()),
        ("v_proj.weight", qkv[6:].clone()),
        ("scale", engine.scale.detach().clone()),
    ]
    expected: dict[str, Checksum] = {}
    list(recording(sent, expected, fuse))
    expected["repacked"] = Checksum(1, 1, 1)  # would mismatch if it were compared
    return engine, expected


def test_verify_passes_and_counts_checked_parameters(engine_and_expected) -> None:
    engine, expected = engine_and_expected
    assert verify(engine, expected) == 3  # embed_tokens, qkv_proj, scale


def test_verify_compares_only_the_synced_rows(engine_and_expected) -> None:
    engine, expected = engine_and_expected
    with torch.no_grad():
        engine.embed_tokens.weight[10:] = 7.0  # vocabulary padding the sync never wrote
        engine.unsynced.fill_(-1.0)  # not in expected
    assert verify(engine, expected) == 3


def test_verify_with_no_expected_checks_nothing(engine_and_expected) -> None:
    engine, _ = engine_and_expected
    assert verify(engine, {}) == 0


@pytest.mark.parametrize(
    ("name", "index"),
    [("qkv_proj.weight", (5, 1)), ("embed_tokens.weight", (9, 3)), ("scale", ())],
)
def test_verify_names_a_one_ulp_corruption(engine_and_expected, name: str, index) -> None:
    engine, expected = engine_and_expected
    param = dict(engine.named_parameters())[name]
    with torch.no_grad():
        param.copy_(bump_one_ulp(param.detach(), index))
    with pytest.raises(ChecksumMismatchError, match=rf"'{name}'"):
        verify(engine, expected)
