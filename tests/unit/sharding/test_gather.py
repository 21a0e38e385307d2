"""Unit tests for `hybrid.sharding.gather`: how parameters are grouped per gather granularity,
the decoder-layer key, and the plain-tensor (non-DTensor) path of `gather_full`, which needs no
process group."""

import itertools

import pytest
import torch
from torch import nn

from hybrid.memory.model_shape import layer_key
from hybrid.sharding.gather import (
    gather_full,
    group_parameters,
    iter_full_parameters,
)

pytestmark = pytest.mark.unit

NamedParam = tuple[str, torch.Tensor]


def params(*specs: tuple[str, int]) -> list[NamedParam]:
    """(name, numel) -> (name, float32 tensor of that many elements)."""
    return [(name, torch.zeros(numel)) for name, numel in specs]


MODEL = params(
    ("model.embed_tokens.weight", 40),
    ("model.layers.0.self_attn.q_proj.weight", 16),
    ("model.layers.0.mlp.up_proj.weight", 16),
    ("model.layers.1.self_attn.q_proj.weight", 16),
    ("model.layers.1.input_layernorm.weight", 4),
    ("model.layers.10.self_attn.q_proj.weight", 16),
    ("model.norm.weight", 4),
    ("lm_head.weight", 40),
)


def names(groups: list[list[NamedParam]]) -> list[list[str]]:
    return [[name for name, _ in group] for group in groups]


def flat(groups: list[list[NamedParam]]) -> list[NamedParam]:
    return [item for group in groups for item in group]


@pytest.mark.parametrize("granularity", ["tensor", "layer", "bucket"])
def test_every_parameter_once_in_model_order(granularity: str) -> None:
    groups = group_parameters(MODEL, granularity, bucket_bytes=64, dtype=torch.bfloat16)
    got = flat(groups)
    assert [n for n, _ in got] == [n for n, _ in MODEL]
    assert all(a is b for (_, a), (_, b) in zip(got, MODEL, strict=True))
    assert all(groups), "no empty group"


def test_tensor_granularity_is_one_parameter_per_group() -> None:
    groups = group_parameters(MODEL, "tensor", bucket_bytes=1, dtype=torch.bfloat16)
    assert names(groups) == [[n] for n, _ in MODEL]


def test_layer_granularity_groups_by_decoder_layer() -> None:
    groups = group_parameters(MODEL, "layer", bucket_bytes=1, dtype=torch.bfloat16)
    assert names(groups) == [
        ["model.embed_tokens.weight"],
        ["model.layers.0.self_attn.q_proj.weight", "model.layers.0.mlp.up_proj.weight"],
        ["model.layers.1.self_attn.q_proj.weight", "model.layers.1.input_layernorm.weight"],
        ["model.layers.10.self_attn.q_proj.weight"],
        ["model.norm.weight"],
        ["lm_head.weight"],
    ]


def test_small_layers_share_a_bucket_and_no_layer_is_split() -> None:
    # bf16 bytes: embed 80, layer 0 64, layer 1 40, layer 10 32, norm 8, lm_head 80
    groups = group_parameters(MODEL, "layer", bucket_bytes=100, dtype=torch.bfloat16)
    assert names(groups) == [
        ["model.embed_tokens.weight"],
        ["model.layers.0.self_attn.q_proj.weight", "model.layers.0.mlp.up_proj.weight"],
        [
            "model.layers.1.self_attn.q_proj.weight",
            "model.layers.1.input_layernorm.weight",
            "model.layers.10.self_attn.q_proj.weight",
            "model.norm.weight",
        ],
        ["lm_head.weight"],
    ]
    whole = group_parameters(MODEL, "layer", bucket_bytes=1 << 20, dtype=torch.bfloat16)
    assert names(whole) == [[name for name, _ in MODEL]]


def test_bucket_granularity_hand_computed() -> None:
    # bf16 bytes: a 32, b 32, c 16, d 200 (oversized), e 8, f 64 (exactly one bucket)
    named = params(("a", 16), ("b", 16), ("c", 8), ("d", 100), ("e", 4), ("f", 32))
    groups = group_parameters(named, "bucket", bucket_bytes=64, dtype=torch.bfloat16)
    assert names(groups) == [["a", "b"], ["c"], ["d"], ["e"], ["f"]]


def test_bucket_sizes_use_the_target_dtype_not_the_stored_one() -> None:
    named = params(("a", 16), ("b", 16))  # stored as float32: 64 bytes each
    assert names(group_parameters(named, "bucket", 64, torch.bfloat16)) == [["a", "b"]]
    assert names(group_parameters(named, "bucket", 64, torch.float32)) == [["a"], ["b"]]


@pytest.mark.parametrize("bucket_bytes", [1, 20, 64, 100, 1000])
def test_buckets_respect_the_limit_except_a_lone_oversized_parameter(bucket_bytes: int) -> None:
    groups = group_parameters(MODEL, "bucket", bucket_bytes, torch.bfloat16)
    assert flat(groups) == MODEL
    for group in groups:
        nbytes = sum(p.numel() * 2 for _, p in group)
        assert nbytes <= bucket_bytes or len(group) == 1
    # greedy: the next bucket's first parameter would not have fit into the previous bucket
    for prev, nxt in itertools.pairwise(groups):
        prev_bytes = sum(p.numel() * 2 for _, p in prev)
        assert prev_bytes + nxt[0][1].numel() * 2 > bucket_bytes


def test_invalid_granularity_names_the_config_field() -> None:
    with pytest.raises(ValueError, match=r"sync\.gather.*'row'"):
        group_parameters(MODEL, "row", 64, torch.bfloat16)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("model.layers.3.mlp.up_proj.weight", "model.layers.3"),
        ("model.layers.12.self_attn.o_proj.bias", "model.layers.12"),
        ("layers.0.weight", "layers.0"),
        ("model.norm.weight", "model.norm.weight"),
        ("model.embed_tokens.weight", "model.embed_tokens.weight"),
        ("model.layers.weight", "model.layers.weight"),  # no index after "layers"
        ("model.layers.x.weight", "model.layers.x.weight"),
        ("vision.layers.2.blocks.layers.5.w", "vision.layers.2"),  # the first match wins
        ("model.language_model.layers.1.mlp.down_proj.weight", "model.language_model.layers.1"),
        ("model.visual.blocks.0.attn.qkv.weight", "model.visual.blocks.0"),  # a vision block
        ("model.visual.merger.mlp.0.weight", "model.visual.merger.mlp.0.weight"),
    ],
)
def test_layer_key(name: str, key: str) -> None:
    assert layer_key(name) == key


# ---- the plain-tensor path (no process group) --------------------------------------------------


def test_gather_full_casts_plain_tensors() -> None:
    weight = nn.Parameter(torch.tensor([[1.0, 2.5], [-3.0, 1.0 / 3.0]]))
    bias = torch.tensor([0.1, 0.2], dtype=torch.float64)
    got = gather_full([("w", weight), ("b", bias)], torch.bfloat16)
    assert [n for n, _ in got] == ["w", "b"]
    for (_, full), source in zip(got, [weight, bias], strict=True):
        assert full.dtype == torch.bfloat16
        assert not full.requires_grad
        assert torch.equal(full, source.detach().to(torch.bfloat16))


def test_iter_full_parameters_on_a_plain_module_yields_tied_weights_once() -> None:
    model = nn.ModuleDict({"embed": nn.Embedding(6, 4), "head": nn.Linear(4, 6, bias=False)})
    model["head"].weight = model["embed"].weight  # tied
    for granularity in ("tensor", "layer", "bucket"):
        got = list(iter_full_parameters(model, granularity, torch.bfloat16, bucket_bytes=16))
        assert [n for n, _ in got] == ["embed.weight"]
        assert torch.equal(got[0][1], model["embed"].weight.detach().bfloat16())
