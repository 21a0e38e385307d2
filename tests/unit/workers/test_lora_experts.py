"""LoRA on a mixture of experts' stacked experts (peft's ParamWrapper) against real peft and a
tiny Qwen3-MoE: the names, the expert-by-expert merge, the merged full weights the sync sends,
the adapter files, and what is refused before any worker starts."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

from hybrid.models import TinyModelConfig, build_tiny_model
from hybrid.sharding.lora_files import hf_name, is_lora_name, merge_experts_into_base, write_adapter
from hybrid.sharding.lora_sync import LoraSync
from hybrid.workers.config import LoraConfig
from hybrid.workers.lora import (
    adapter_spec,
    adapts_experts,
    add_adapters,
    check_lora_setup,
    expert_adapters,
    target_modules,
)

pytestmark = pytest.mark.unit

ON_EXPERTS = LoraConfig(
    rank=4, alpha=8, target_modules=("q_proj", "gate_proj", "up_proj", "down_proj")
)
EXPERTS = "base_model.model.model.layers.1.mlp.experts"
IDS = torch.tensor([[1, 5, 9, 12, 3, 7, 2]])


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    config = TinyModelConfig.preset("tiny-moe", dtype="float32", initializer_range=0.1)
    return build_tiny_model(tmp_path_factory.mktemp("lora_experts") / "model", config, seed=0)


def _adapted(model_dir: Path) -> torch.nn.Module:
    """The tiny MoE with adapters on q_proj and every expert, A and B drawn from a seed (B not
    zero, so the adapters change the model)."""
    model = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, experts_implementation="grouped_mm"
    )
    peft_model = add_adapters(model, ON_EXPERTS, torch.float32, torch.float32)
    generator = torch.Generator().manual_seed(0)
    for name, param in peft_model.named_parameters():
        if is_lora_name(name):
            param.data = torch.randn(param.shape, generator=generator) * 0.05
    return peft_model.eval()


def test_adapters_sit_on_every_expert_and_names_map_back(model_dir: Path) -> None:
    peft_model = _adapted(model_dir)
    adapters = expert_adapters(peft_model)
    assert sorted(adapters) == [
        f"{EXPERTS}.base_layer.base_layer.down_proj",
        f"{EXPERTS}.base_layer.base_layer.gate_up_proj",
    ]
    assert hf_name(f"{EXPERTS}.base_layer.base_layer.gate_up_proj") == (
        "model.layers.1.mlp.experts.gate_up_proj"
    )
    assert {a.num_experts for a in adapters.values()} == {4}
    assert {a.scaling for a in adapters.values()} == {
        2.0
    }  # peft doubles the fused pair's r and alpha
    assert adapts_experts(peft_model, ON_EXPERTS)
    assert not adapts_experts(peft_model, LoraConfig(rank=4))  # all-linear: the attention


def test_the_expert_merge_and_the_merged_stream_compute_what_peft_computes(
    model_dir: Path, tmp_path: Path
) -> None:
    peft_model = _adapted(model_dir)
    params = dict(peft_model.named_parameters())
    with torch.no_grad():
        expected = peft_model(input_ids=IDS).logits
    spec = adapter_spec(peft_model, ON_EXPERTS, str(model_dir))
    sync = LoraSync(
        peft_model, spec, tmp_path / "files", torch.float32, expert_adapters(peft_model)
    )
    merged = dict(sync.iter_merged(layered=True, on_group_done=None))
    for name, adapter in expert_adapters(peft_model).items():
        own = merge_experts_into_base(
            params[name].detach(), params[adapter.lora_a], params[adapter.lora_b], adapter
        )
        assert torch.equal(merged[hf_name(name)], own)
        assert not torch.equal(own, params[name])  # the adapter moved every expert

    # The merged full weights are the adapted model: a plain transformers model computes it.
    plain = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, experts_implementation="grouped_mm"
    ).eval()
    missing, unexpected = plain.load_state_dict(merged, strict=False)
    assert (missing, unexpected) == (["lm_head.weight"], [])  # tied to the embedding
    with torch.no_grad():
        assert torch.allclose(plain(input_ids=IDS).logits, expected, atol=1e-5)
        folded = peft_model.merge_and_unload()  # peft's own merge agrees
        experts = folded.model.layers[1].mlp.experts
        assert torch.allclose(
            merged["model.layers.1.mlp.experts.gate_up_proj"], experts.gate_up_proj, atol=1e-6
        )

    # The adapter files (target_parameters, the fused pair's rank) load back into peft.
    adapters = {
        n: p.detach().clone() for n, p in _adapted(model_dir).named_parameters() if is_lora_name(n)
    }
    write_adapter(tmp_path / "adapter", adapters, spec)
    fresh = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, experts_implementation="grouped_mm"
    )
    loaded = PeftModel.from_pretrained(fresh, tmp_path / "adapter").eval()
    with torch.no_grad():
        assert torch.allclose(loaded(input_ids=IDS).logits, expected, atol=1e-5)


def test_what_experts_with_adapters_cannot_do_is_named(model_dir: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    halves = LoraConfig(rank=4, target_modules=("q_proj", "gate_proj"))
    with pytest.raises(
        ValueError, match=r"model\.lora\.target_modules: .*gate_proj without also targeting up_proj"
    ):
        target_modules(model, halves)
    with pytest.raises(
        ValueError, match=r"sync\.lora_mode=adapter: .* stacked experts.* sync\.lora_mode=merge"
    ):
        check_lora_setup(str(model_dir), ON_EXPERTS, "adapter")
    with pytest.raises(ValueError, match=r"actor\.ep_size \(2\) with adapters on the experts"):
        check_lora_setup(str(model_dir), ON_EXPERTS, "merge", ep_size=2)
    check_lora_setup(str(model_dir), ON_EXPERTS, "merge")
