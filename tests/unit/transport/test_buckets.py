"""`hybrid.transport.buckets`: packing a weight stream into byte buckets and back, bit for bit,
with per-tensor digests that catch a corrupted byte."""

import pickle

import pytest
import torch

from hybrid.transport.buckets import (
    ALIGN_BYTES,
    Staging,
    as_bytes,
    cast_floating,
    iter_buckets,
    tensor_digest,
    unpack_bucket,
)
from hybrid.transport.errors import TransportChecksumError, TransportError

pytestmark = pytest.mark.unit


def mixed_weights() -> list[tuple[str, torch.Tensor]]:
    """Every dtype a model ships, odd shapes, a scalar, an empty tensor, NaN and -0.0."""
    g = torch.Generator().manual_seed(0)
    special = torch.tensor([float("nan"), -0.0, float("inf"), 1e-45, -3.5])
    return [
        ("embed.weight", torch.randn(17, 5, generator=g).to(torch.bfloat16)),
        ("layer.0.norm", torch.randn(7, generator=g)),
        ("layer.0.special", special),
        ("layer.0.bf16_special", special.to(torch.bfloat16)),
        ("layer.0.scale", torch.tensor(2.5)),
        ("layer.0.empty", torch.empty(0, 3)),
        ("layer.0.half", torch.randn(3, 1, 3, generator=g).half()),
        ("layer.0.ids", torch.arange(-5, 6, dtype=torch.int64).reshape(11, 1)),
        ("layer.0.mask", torch.tensor([True, False, True])),
        ("layer.1.odd", torch.randn(3, 5, 7, generator=g, dtype=torch.float64)),
        ("lm_head.weight", torch.randn(13, 3, generator=g).to(torch.bfloat16)),
    ]


def assert_same_stream(
    got: list[tuple[str, torch.Tensor]], want: list[tuple[str, torch.Tensor]]
) -> None:
    assert [n for n, _ in got] == [n for n, _ in want]
    for (name, a), (_, b) in zip(got, want, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert torch.equal(as_bytes(a), as_bytes(b)), name  # bytes: NaN == NaN, -0.0 != 0.0


def round_trip(
    weights: list[tuple[str, torch.Tensor]], bucket_bytes: int
) -> list[tuple[str, torch.Tensor]]:
    return [
        pair
        for flat, metas in iter_buckets(weights, bucket_bytes)
        for pair in unpack_bucket(flat, metas)
    ]


@pytest.mark.parametrize("bucket_bytes", [1, 40, 200, 1 << 20])
def test_round_trip_is_bit_exact(bucket_bytes: int) -> None:
    weights = mixed_weights()
    assert_same_stream(round_trip(weights, bucket_bytes), weights)


def test_a_non_contiguous_tensor_arrives_with_its_values() -> None:
    weight = torch.arange(12, dtype=torch.float32).reshape(3, 4).t()
    ((name, got),) = round_trip([("w", weight)], 1024)
    assert name == "w" and got.shape == (4, 3) and torch.equal(got, weight)


def test_buckets_respect_the_size_and_a_large_tensor_gets_its_own() -> None:
    weights = [
        ("a", torch.zeros(10)),  # 40 bytes
        ("b", torch.zeros(10)),
        ("big", torch.zeros(100)),  # 400 bytes, more than a bucket
        ("c", torch.zeros(3)),
        ("d", torch.zeros(3)),
    ]
    buckets = list(iter_buckets(weights, bucket_bytes=64))
    assert [[m.name for m in metas] for _, metas in buckets] == [["a"], ["b"], ["big"], ["c", "d"]]
    for flat, metas in buckets:
        assert flat.dtype == torch.uint8 and flat.dim() == 1
        assert flat.numel() <= 64 or len(metas) == 1
        assert all(m.offset % ALIGN_BYTES == 0 for m in metas)
    assert buckets[3][1][1].offset == 16  # "d" after 12 bytes of "c", aligned


def test_unpacked_tensors_are_views_of_the_bucket() -> None:
    ((flat, metas),) = iter_buckets([("w", torch.ones(4))], 1024)
    ((_, tensor),) = unpack_bucket(flat, metas)
    assert tensor.untyped_storage().data_ptr() == flat.untyped_storage().data_ptr()


def test_a_corrupted_byte_names_the_tensor_and_source() -> None:
    weights = [("a", torch.ones(4)), ("b", torch.ones(4, dtype=torch.bfloat16))]
    ((flat, metas),) = iter_buckets(weights, 1024)
    flat[metas[1].offset] ^= 1
    with pytest.raises(TransportChecksumError, match=r"'b' \(version 3, bucket 1\)") as info:
        unpack_bucket(flat, metas, source="version 3, bucket 1")
    assert info.value.name == "b" and isinstance(info.value, RuntimeError)
    assert len(unpack_bucket(flat, metas, verify=False)) == 2


def test_checksum_error_survives_pickling() -> None:
    error = TransportChecksumError("w", "0000", "ffff", "version 1")
    again = pickle.loads(pickle.dumps(error))
    assert str(again) == str(error) and again.source == "version 1"


def test_a_truncated_bucket_is_an_error() -> None:
    ((flat, metas),) = iter_buckets([("w", torch.ones(8))], 1024)
    with pytest.raises(TransportError, match=r"'w'.*past its bucket"):
        unpack_bucket(flat[:16], metas)


def test_digest_changes_with_any_bit() -> None:
    x = torch.randn(64)
    y = x.clone()
    assert tensor_digest(x) == tensor_digest(y)
    y.view(torch.int32)[5] ^= 1  # one bit of one float
    assert tensor_digest(x) != tensor_digest(y)
    assert tensor_digest(torch.tensor(0.0)) != tensor_digest(torch.tensor(-0.0))


def test_bucket_bytes_must_be_positive() -> None:
    with pytest.raises(ValueError, match="bucket_bytes"):
        list(iter_buckets([("w", torch.ones(1))], 0))


@pytest.mark.parametrize("bucket_bytes", [40, 1 << 20])
def test_cast_while_packing_equals_casting_first(bucket_bytes: int) -> None:
    """`cast_to` casts floating tensors in the copy into the bucket, bit-identical to casting
    them before; integer and bool tensors keep their dtype."""
    weights = mixed_weights()
    cast_first = [
        (name, t.to(torch.bfloat16) if t.is_floating_point() else t) for name, t in weights
    ]
    packed = [
        pair
        for flat, metas in iter_buckets(weights, bucket_bytes, cast_to=torch.bfloat16)
        for pair in unpack_bucket(flat, metas)
    ]
    assert_same_stream(packed, cast_first)
    # The digests are those of the cast bytes, so a receiver's check still holds.
    for flat, metas in iter_buckets(weights, bucket_bytes, cast_to=torch.bfloat16):
        for meta, (name, tensor) in zip(metas, unpack_bucket(flat, metas), strict=True):
            assert meta.checksum == tensor_digest(tensor), name


@pytest.mark.parametrize("slots", [1, 2])
def test_staged_buckets_take_the_slots_in_turn_and_round_trip(slots: int) -> None:
    """With a Staging, every bucket is a view into one of its slots, taken in turn (no fresh
    memory per bucket), and a consumer that copies each bucket in time still gets every byte."""
    g = torch.Generator().manual_seed(0)
    weights = [(f"w{i}", torch.randn(64, generator=g)) for i in range(10)]  # 2 per 512 B bucket
    staging = Staging(slots)
    for _ in range(slots):
        staging.take(512)  # what the first stream would grow them to
    buffers = [staging.take(512).data_ptr() for _ in range(slots)]
    pointers, received = [], []
    for flat, metas in iter_buckets(weights, 512, staging=staging):
        pointers.append(flat.data_ptr())
        received += [(name, t.clone()) for name, t in unpack_bucket(flat, metas)]
    assert len(pointers) == 5
    assert pointers == [buffers[i % slots] for i in range(len(pointers))]
    assert_same_stream(received, weights)


def test_staging_refuses_zero_slots() -> None:
    with pytest.raises(ValueError, match="slots"):
        Staging(0)


def test_buckets_without_checksums_skip_only_the_digest() -> None:
    """`checksums=False` leaves the digests out (None) and the receiver then has nothing to
    check; the bytes still round-trip exactly."""
    weights = mixed_weights()
    buckets = list(iter_buckets(weights, 1 << 20, checksums=False))
    assert all(meta.checksum is None for _, metas in buckets for meta in metas)
    flat, metas = buckets[0]
    assert_same_stream(unpack_bucket(flat, metas), weights)


def test_cast_floating_casts_floating_tensors_only_and_none_keeps_the_stream() -> None:
    stream = [("w", torch.ones(2, dtype=torch.float32)), ("ids", torch.arange(3))]
    assert cast_floating(stream, None) is stream
    cast = list(cast_floating(stream, torch.bfloat16))
    assert [(n, t.dtype) for n, t in cast] == [("w", torch.bfloat16), ("ids", torch.int64)]
    assert cast[1][1] is stream[1][1]
