"""Unit tests for `hybrid.sharding.loader`: the Hugging Face -> engine parameter name map and
the choice between the reload and direct strategies (no vLLM engine needed)."""

import pytest
import torch
from torch import nn

from hybrid.sharding.loader import choose_strategy, direct_applies, engine_name

pytestmark = pytest.mark.unit

ATTN = "model.layers.3.self_attn"
MLP = "model.layers.3.mlp"


@pytest.mark.parametrize(
    ("hf_name", "expected"),
    [
        (f"{ATTN}.q_proj.weight", (f"{ATTN}.qkv_proj.weight", "q")),
        (f"{ATTN}.k_proj.weight", (f"{ATTN}.qkv_proj.weight", "k")),
        (f"{ATTN}.v_proj.weight", (f"{ATTN}.qkv_proj.weight", "v")),
        (f"{ATTN}.q_proj.bias", (f"{ATTN}.qkv_proj.bias", "q")),
        (f"{ATTN}.k_proj.bias", (f"{ATTN}.qkv_proj.bias", "k")),
        (f"{ATTN}.v_proj.bias", (f"{ATTN}.qkv_proj.bias", "v")),
        (f"{MLP}.gate_proj.weight", (f"{MLP}.gate_up_proj.weight", 0)),
        (f"{MLP}.up_proj.weight", (f"{MLP}.gate_up_proj.weight", 1)),
    ],
)
def test_fused_projections_map_to_their_shard(hf_name: str, expected: tuple) -> None:
    assert engine_name(hf_name) == expected


@pytest.mark.parametrize(
    "hf_name",
    [
        f"{ATTN}.o_proj.weight",
        f"{ATTN}.o_proj.bias",
        f"{ATTN}.q_norm.weight",  # Qwen3's per-head norms are not fused
        f"{ATTN}.k_norm.weight",
        f"{MLP}.down_proj.weight",
        "model.layers.3.input_layernorm.weight",
        "model.embed_tokens.weight",
        "model.norm.weight",
        "lm_head.weight",
    ],
)
def test_other_names_are_unchanged(hf_name: str) -> None:
    assert engine_name(hf_name) == (hf_name, None)


def empty_weight_linear() -> nn.Linear:
    """A linear whose weight was repacked away (what vLLM's CPU backend leaves)."""
    layer = nn.Linear(4, 4)
    layer.weight = nn.Parameter(torch.empty(0))
    return layer


def test_direct_applies_only_when_every_parameter_has_storage() -> None:
    assert direct_applies(nn.Sequential(nn.Linear(4, 4), nn.Embedding(3, 4)))
    assert not direct_applies(nn.Sequential(nn.Embedding(3, 4), empty_weight_linear()))


@pytest.mark.parametrize(
    ("requested", "plain", "expected"),
    [
        ("reload", True, "reload"),
        ("reload", False, "reload"),
        ("auto", True, "direct"),
        ("auto", False, "reload"),
        ("direct", True, "direct"),
    ],
)
def test_choose_strategy(requested: str, plain: bool, expected: str) -> None:
    model = nn.Linear(4, 4) if plain else empty_weight_linear()
    assert choose_strategy(requested, model) == expected  # type: ignore[arg-type]


def test_direct_on_a_repacked_engine_names_the_config_field() -> None:
    with pytest.raises(ValueError, match=r"sync\.strategy=direct"):
        choose_strategy("direct", empty_weight_linear())
