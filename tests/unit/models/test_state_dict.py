"""State-dict adapters: a mixture of experts written in the Hub's layout (one key per expert)
is what transformers' own conversion reads and writes, our plan and combine rebuild the
module's stacked tensors exactly, and bad input is named."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, MixtralConfig

from hybrid.model_families import STACKED_EXPERT_FAMILIES, num_experts
from hybrid.models import TinyModelConfig, build_tiny_model, hf_config, init_state_dict
from hybrid.models.config import MOE_ARCHITECTURES
from hybrid.models.state_dict import StackedExperts, StateDictAdapter, adapter_for
from hybrid.models.tiny import WEIGHTS_NAME

pytestmark = pytest.mark.unit


def _stored(model_dir: Path) -> dict[str, torch.Tensor]:
    with safe_open(str(model_dir / WEIGHTS_NAME), framework="pt") as f:
        return {key: f.get_tensor(key) for key in f.keys()}  # noqa: SIM118


def _rebuild(adapter: StateDictAdapter, stored: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    plan = adapter.plan(stored)
    return {key: adapter.combine(key, [stored[k] for k in keys]) for key, keys in plan.items()}


@pytest.mark.parametrize("architecture", MOE_ARCHITECTURES)
def test_the_hub_layout_is_transformers_own(architecture: str, tmp_path: Path) -> None:
    config = TinyModelConfig.preset("tiny-moe", architecture=architecture)
    model_dir = build_tiny_model(tmp_path / "model", config, seed=0)
    stored = _stored(model_dir)
    # One key per expert and projection on disk, as released checkpoints have them.
    assert "model.layers.1.mlp.experts.3.gate_proj.weight" in stored
    assert not any(key.endswith("experts.gate_up_proj") for key in stored)
    assert stored["model.layers.1.mlp.experts.0.gate_proj.weight"].shape == (64, 128)
    assert stored["model.layers.1.mlp.experts.0.down_proj.weight"].shape == (128, 64)
    assert "model.layers.0.mlp.gate_proj.weight" in stored  # mlp_only_layers: a dense layer
    # transformers' conversion reads the same tensors our adapter builds, bit for bit...
    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True)
    loaded = dict(model.named_parameters())  # a tied head once, as ours
    ours = init_state_dict(config, seed=0)
    assert loaded.keys() == ours.keys()
    for key, tensor in ours.items():
        assert torch.equal(loaded[key], tensor), key
    assert _rebuild(adapter_for(model.config), stored).keys() == ours.keys()
    for key, tensor in _rebuild(adapter_for(model.config), stored).items():
        assert torch.equal(tensor, ours[key]), key
    # ... and writes back what we write.
    model.save_pretrained(tmp_path / "saved")
    saved = _stored(tmp_path / "saved")
    assert saved.keys() == stored.keys()
    for key, tensor in stored.items():
        assert torch.equal(saved[key], tensor), key


def test_the_experts_are_stacked_gate_then_up() -> None:
    gates = [torch.full((2, 3), float(e)) for e in range(3)]
    ups = [torch.full((2, 3), 10.0 + e) for e in range(3)]
    downs = [torch.full((3, 2), -1.0 - e) for e in range(3)]
    stored = {"model.norm.weight": torch.ones(3)}
    for e in range(3):
        prefix = f"model.layers.0.mlp.experts.{e}"
        stored[f"{prefix}.gate_proj.weight"] = gates[e]
        stored[f"{prefix}.up_proj.weight"] = ups[e]
        stored[f"{prefix}.down_proj.weight"] = downs[e]
    module = _rebuild(StackedExperts(), stored)
    assert sorted(module) == [
        "model.layers.0.mlp.experts.down_proj",
        "model.layers.0.mlp.experts.gate_up_proj",
        "model.norm.weight",
    ]
    gate_up = module["model.layers.0.mlp.experts.gate_up_proj"]
    assert gate_up.shape == (3, 4, 3)  # [E, 2I, H]
    for e in range(3):
        assert torch.equal(gate_up[e, :2], gates[e]) and torch.equal(gate_up[e, 2:], ups[e])
    assert torch.equal(module["model.layers.0.mlp.experts.down_proj"], torch.stack(downs))
    # Back to the checkpoint: the same keys and tensors.
    back = dict(StackedExperts().to_checkpoint(module.items()))
    assert back.keys() == stored.keys()
    assert all(torch.equal(back[k], stored[k]) for k in stored)


def test_a_checkpoint_already_stacked_plans_as_the_identity() -> None:
    stored = {
        "model.layers.0.mlp.experts.gate_up_proj": torch.zeros(4, 8, 6),
        "model.layers.0.mlp.experts.down_proj": torch.zeros(4, 6, 4),
    }
    module = _rebuild(StackedExperts(), stored)
    assert module.keys() == stored.keys()
    assert all(module[k] is stored[k] for k in stored)


def test_a_missing_expert_is_named() -> None:
    keys = [
        f"model.layers.1.mlp.experts.{e}.{proj}.weight"
        for e in range(4)
        for proj in ("gate_proj", "up_proj", "down_proj")
        if not (e == 2 and proj == "up_proj")
    ]
    with pytest.raises(ValueError, match=r"model\.layers\.1\.mlp\.experts.*no up_proj.*\[2\]"):
        StackedExperts().plan(keys)


def test_dense_families_are_the_identity() -> None:
    config = hf_config(TinyModelConfig())
    assert type(adapter_for(config)) is StateDictAdapter and num_experts(config) == 0
    named = [("model.embed_tokens.weight", torch.zeros(2, 2))]
    assert list(adapter_for(config).to_checkpoint(named)) == named


def test_an_expert_family_without_an_adapter_is_named() -> None:
    config = MixtralConfig(num_local_experts=4)
    with pytest.raises(
        ValueError, match=r"model: model type 'mixtral' is a mixture of experts.*qwen3_moe, qwen2_moe"
    ):
        adapter_for(config)
    assert STACKED_EXPERT_FAMILIES == ("qwen3_moe", "qwen2_moe")


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"moe_intermediate_size": 48}, "moe_intermediate_size"),
        ({"num_experts_per_tok": 5}, "num_experts_per_tok"),
        ({"mlp_only_layers": (2,)}, "mlp_only_layers"),
        ({"mlp_only_layers": (0, 1)}, "mlp_only_layers"),
        ({"num_experts": 0}, "num_experts"),
    ],
)
def test_bad_expert_sizes_name_the_field(overrides: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        TinyModelConfig.preset("tiny-moe", **overrides)  # type: ignore[arg-type]
