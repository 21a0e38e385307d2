"""LoRA helpers against real peft and a real tiny Qwen2: names, initialisation, merging, the
adapter files, and the config's checks."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from peft import LoraConfig as PeftLoraConfig
from peft import PeftModel, get_peft_model
from transformers import AutoModelForCausalLM

from hybrid.models import TinyModelConfig, build_tiny_model
from hybrid.sharding.lora_files import (
    adapter_file_name,
    hf_name,
    is_lora_name,
    merge_into_base,
    write_adapter,
)
from hybrid.workers.config import LoraConfig
from hybrid.workers.lora import (
    adapted_modules,
    adapter_spec,
    add_adapters,
    initial_adapter,
    target_modules,
)

ALL_LINEAR = ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    config = TinyModelConfig.preset("tiny", initializer_range=0.1)
    return build_tiny_model(tmp_path_factory.mktemp("lora") / "model", config, seed=0)


def test_names_map_between_peft_hf_and_adapter_files() -> None:
    base = "base_model.model.model.layers.1.mlp.up_proj.base_layer.weight"
    adapter = "base_model.model.model.layers.1.mlp.up_proj.lora_B.default.weight"
    assert hf_name(base) == "model.layers.1.mlp.up_proj.weight"
    assert hf_name("base_model.model.model.norm.weight") == "model.norm.weight"
    assert hf_name("model.norm.weight") == "model.norm.weight"  # plain models pass through
    assert adapter_file_name(adapter) == "base_model.model.model.layers.1.mlp.up_proj.lora_B.weight"
    assert is_lora_name(adapter) and not is_lora_name(base)


def test_target_modules_resolve_all_linear_and_name_what_exists(model_dir: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    assert target_modules(model, LoraConfig(rank=4)) == ALL_LINEAR
    assert target_modules(model, LoraConfig(rank=4, target_modules=("q_proj",))) == ["q_proj"]
    with pytest.raises(ValueError, match=r"\['lm_proj'\] match no linear module.*'v_proj'"):
        target_modules(model, LoraConfig(rank=4, target_modules=("q_proj", "lm_proj")))


def test_initial_adapter_is_peft_default_and_reproducible() -> None:
    shapes = [("x.lora_A.default.weight", torch.Size([8, 64])),
              ("x.lora_B.default.weight", torch.Size([32, 8]))]  # fmt: skip
    first = initial_adapter(shapes, torch.float32, seed=3)
    assert torch.equal(first["x.lora_A.default.weight"],
                       initial_adapter(shapes, torch.float32, seed=3)["x.lora_A.default.weight"])  # fmt: skip
    assert not torch.equal(first["x.lora_A.default.weight"],
                           initial_adapter(shapes, torch.float32, seed=4)["x.lora_A.default.weight"])  # fmt: skip
    assert torch.count_nonzero(first["x.lora_B.default.weight"]) == 0
    a = first["x.lora_A.default.weight"]
    assert a.abs().max() <= 1 / 64**0.5 and a.std() > 0.5 / (3 * 64) ** 0.5


def test_merge_and_adapter_files_match_peft(model_dir: Path, tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    lora = LoraConfig(rank=4, alpha=8)
    peft_model = get_peft_model(model, PeftLoraConfig(r=4, lora_alpha=8, target_modules=ALL_LINEAR))
    for name, param in peft_model.named_parameters():
        if ".lora_B." in name:
            param.data.normal_(0, 0.1)
    adapters = {n: p.detach().clone() for n, p in peft_model.named_parameters() if is_lora_name(n)}
    module = "base_model.model.model.layers.0.self_attn.q_proj"
    merged = merge_into_base(
        dict(peft_model.named_parameters())[f"{module}.base_layer.weight"].detach(),
        adapters[f"{module}.lora_A.default.weight"],
        adapters[f"{module}.lora_B.default.weight"],
        lora.scaling,
    )
    ids = torch.tensor([[1, 5, 9, 12, 3]])
    with torch.no_grad():
        expected = peft_model(input_ids=ids).logits
        folded = peft_model.merge_and_unload()
        assert torch.allclose(folded.model.layers[0].self_attn.q_proj.weight, merged, atol=1e-6)

    write_adapter(tmp_path / "adapter", adapters, adapter_spec(peft_model, lora, str(model_dir)))
    fresh = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    loaded = PeftModel.from_pretrained(fresh, tmp_path / "adapter")
    with torch.no_grad():
        assert torch.allclose(loaded(input_ids=ids).logits, expected, atol=1e-5)


def test_add_adapters_freezes_the_base_in_its_dtype(model_dir: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    peft_model = add_adapters(
        model,
        LoraConfig(rank=4, target_modules=("q_proj", "v_proj")),
        torch.bfloat16,
        torch.float32,
    )
    assert adapted_modules(peft_model) == ["q_proj", "v_proj"]
    for name, param in peft_model.named_parameters():
        assert param.requires_grad == is_lora_name(name), name
        assert param.dtype == (torch.float32 if is_lora_name(name) else torch.bfloat16), name


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rank": -1}, r"model\.lora\.rank must be >= 0"),
        ({"alpha": 32}, r"rank is 0 \(LoRA off\) but LoRA is configured \(alpha=32\)"),
        (
            {"rank": 8, "target_modules": "everything"},
            r"target_modules must be a list.*'all-linear'",
        ),
        ({"rank": 8, "target_modules": ()}, r"target_modules is empty"),
        ({"rank": 8, "dropout": 1.0}, r"model\.lora\.dropout must be in \[0, 1\)"),
    ],
)
def test_bad_lora_configs_name_the_field(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LoraConfig(**kwargs)
