"""Mixtures of experts on 2 FSDP2 gloo ranks (no Ray): a Hub checkpoint (one key per expert)
loads into the module's stacked experts, the sharded forward equals a single-process
transformers forward in fp32, a training step reaches every expert and the router, and the
export is in the Hub's layout again and loads in transformers.

One spawned run for both families (Qwen3-MoE, and Qwen2-MoE with its shared expert); process
start-up dominates, as in test_fsdp.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from safetensors import safe_open
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Shard, distribute_tensor
from transformers import AutoModelForCausalLM

from hybrid.models import TinyModelConfig, build_tiny_model
from hybrid.models.config import MOE_ARCHITECTURES
from hybrid.models.state_dict import adapter_for
from hybrid.sharding.full_weights import expert_buckets
from hybrid.sharding.gather import iter_full_parameters, iter_row_slices
from hybrid.sharding.lora_files import is_lora_name
from hybrid.sharding.lora_sync import LoraSync
from hybrid.workers.config import LoraConfig
from hybrid.workers.export import export_hf_model
from hybrid.workers.fsdp import build_fsdp_model, build_optimizer, clip_and_step
from hybrid.workers.lora import adapter_spec, expert_adapters
from tests.integration.workers.gloo_ranks import spawn_ranks
from tests.integration.workers.test_fsdp import CPU, OPTIM_KWARGS, VOCAB

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

LOGPROB_ATOL = 1e-5  # fp32 on both sides: the sharded forward is the same arithmetic


def _ids() -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(0))


def _token_log_probs(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    logits = model(ids).logits.float()[:, :-1]
    return torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)


def _check_family(rank: int, mesh: DeviceMesh, model_dir: Path, export_dir: Path) -> dict:
    fp32 = torch.float32
    model = build_fsdp_model(str(model_dir), mesh, CPU, param_dtype=fp32, reduce_dtype=fp32)
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=fp32).eval()
    ids = _ids()
    with torch.no_grad():
        diff = (_token_log_probs(model, ids) - _token_log_probs(hf, ids)).abs().max().item()
    experts = model.model.layers[1].mlp.experts
    # One step: the loss reaches every expert some token was routed to, and the router.
    optimizer = build_optimizer(model, **OPTIM_KWARGS)
    logits = model(ids).logits.float()
    F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten()).backward()
    grads = {
        name: p.grad.full_tensor().abs().sum().item()
        for name, p in model.named_parameters()
        if "layers.1.mlp" in name
    }
    clip_and_step(model, optimizer, 1.0)
    exported = export_hf_model(model, model_dir, export_dir)
    # The sync's two streams of the same weights: a layer's experts stacked, and experts a
    # bucket at a time under their checkpoint names (one expert of each rank per bucket here).
    by_layer = dict(
        adapter_for(model.config).to_checkpoint(iter_full_parameters(model, "layer", fp32))
    )
    named = list(model.named_parameters())
    bucketed = list(expert_buckets(named, adapter_for(model.config), fp32, bucket_bytes=1))
    full = {n: p.full_tensor().detach().clone() for n, p in model.named_parameters()}
    return {
        "logprob_diff": diff,
        "experts_impl": experts.config._experts_implementation,
        "gate_up_shape": tuple(experts.gate_up_proj.shape),
        "grads": grads,
        "exported": exported,
        "params_after_step": full,
        "bucketed_matches": [n for n, t in bucketed if torch.equal(t, by_layer[n])],
        "bucketed_names": [n for n, _ in bucketed],
        "by_layer_names": sorted(by_layer),
    }


def _uneven_row_slices(mesh: DeviceMesh) -> list[bool]:
    """5 rows over 2 ranks (3 and 2: the tail pads), gathered 1 and 2 rows a rank a round:
    every row once, each equal to the full tensor's."""
    full = torch.arange(5 * 3, dtype=torch.float32).view(5, 3)
    sharded = distribute_tensor(full, mesh, [Shard(0)])
    checks = []
    for rows_per_rank in (1, 2):
        seen: dict[int, torch.Tensor] = {}
        bucket = rows_per_rank * 2 * 3 * 4  # two ranks' rows of 3 fp32 values
        for ids, rows in iter_row_slices(sharded, torch.float32, bucket):
            seen.update(zip(ids, rows, strict=True))
        checks.append(sorted(seen) == list(range(5)))
        checks.append(all(torch.equal(seen[i], full[i]) for i in range(5)))
    return checks


def _lora_on_experts(mesh: DeviceMesh, model_dir: Path) -> float:
    """Adapters on q_proj and every expert, on 2 FSDP2 ranks, set to seeded random values: the
    merged full weights the sync sends, in a plain transformers model, give the sharded peft
    model's log-probs (the max difference)."""
    lora = LoraConfig(
        rank=4, alpha=8, target_modules=("q_proj", "gate_proj", "up_proj", "down_proj")
    )
    model = build_fsdp_model(
        str(model_dir), mesh, CPU, param_dtype=torch.float32, reduce_dtype=torch.float32, lora=lora
    )
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if is_lora_name(name):
                full = torch.randn(param.shape, generator=generator) * 0.05
                param.copy_(distribute_tensor(full, param.device_mesh, param.placements))
    ids = _ids()
    with torch.no_grad():
        sharded = _token_log_probs(model, ids)
    spec = adapter_spec(model, lora, str(model_dir))
    sync = LoraSync(model, spec, Path("unused"), torch.float32, expert_adapters(model))
    merged = dict(sync.iter_merged(layered=True, on_group_done=None))
    plain = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    plain.load_state_dict(merged, strict=False)
    with torch.no_grad():
        return (_token_log_probs(plain, ids) - sharded).abs().max().item()


def _moe_run(rank: int, mesh: DeviceMesh, dirs: dict[str, Path], out: Path) -> dict[str, Any]:
    families = {
        name: _check_family(rank, mesh, d, out / f"export_{name}") for name, d in dirs.items()
    }
    lora = {f"lora_{name}": _lora_on_experts(mesh, d) for name, d in dirs.items()}
    return {**families, **lora, "uneven_row_slices": _uneven_row_slices(mesh)}


@pytest.fixture(scope="module")
def moe_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict[str, Any]], dict]:
    root = tmp_path_factory.mktemp("moe")
    dirs = {
        name: build_tiny_model(
            root / name, TinyModelConfig.preset("tiny-moe", architecture=name, dtype="float32")
        )
        for name in MOE_ARCHITECTURES
    }
    return spawn_ranks(_moe_run, root / "run", dirs, root), dirs


@pytest.mark.parametrize("family", MOE_ARCHITECTURES)
def test_a_hub_checkpoint_loads_sharded_and_computes_as_transformers(
    moe_run: tuple[list[dict[str, Any]], dict], family: str
) -> None:
    results, _ = moe_run
    for result in results:
        checked = result[family]
        assert checked["gate_up_shape"] == (4, 128, 128)  # [E, 2I, H], stacked in the module
        assert checked["experts_impl"] == "grouped_mm"
        print(f"{family}: sharded vs transformers log-prob diff {checked['logprob_diff']:.2e}")
        assert checked["logprob_diff"] < LOGPROB_ATOL, checked["logprob_diff"]


@pytest.mark.parametrize("family", MOE_ARCHITECTURES)
def test_a_step_reaches_the_experts_and_the_router(
    moe_run: tuple[list[dict[str, Any]], dict], family: str
) -> None:
    grads = moe_run[0][0][family]["grads"]
    assert grads["model.layers.1.mlp.gate.weight"] > 0  # the router learns
    assert grads["model.layers.1.mlp.experts.gate_up_proj"] > 0
    assert grads["model.layers.1.mlp.experts.down_proj"] > 0
    if family == "qwen2_moe":
        assert grads["model.layers.1.mlp.shared_expert.up_proj.weight"] > 0
        assert grads["model.layers.1.mlp.shared_expert_gate.weight"] > 0


@pytest.mark.parametrize("family", MOE_ARCHITECTURES)
def test_the_export_is_in_hub_layout_and_loads_in_transformers(
    moe_run: tuple[list[dict[str, Any]], dict], family: str
) -> None:
    results, dirs = moe_run
    exported = Path(results[0][family]["exported"])
    with safe_open(str(exported / "model.safetensors"), framework="pt") as f:
        keys = set(f.keys())
    with safe_open(str(dirs[family] / "model.safetensors"), framework="pt") as f:
        assert keys == set(f.keys())  # per-expert keys, as the source checkpoint
    loaded = AutoModelForCausalLM.from_pretrained(exported, dtype=torch.float32)
    trained = results[0][family]["params_after_step"]
    state = loaded.state_dict()
    for name, tensor in trained.items():
        # The export is bf16: the trained fp32 weights rounded once.
        assert torch.equal(state[name], tensor.to(torch.bfloat16).float()), name


@pytest.mark.parametrize("family", MOE_ARCHITECTURES)
def test_bucketed_experts_stream_the_same_weights_as_the_layer_gather(
    moe_run: tuple[list[dict[str, Any]], dict], family: str
) -> None:
    """sync.gather=bucket sends each expert under its checkpoint name, bit for bit what the
    layer gather's stacked tensors hold, every tensor once, on every rank."""
    for result in moe_run[0]:
        checked = result[family]
        names = checked["bucketed_names"]
        assert sorted(names) == checked["by_layer_names"] and len(set(names)) == len(names)
        assert "model.layers.1.mlp.experts.3.gate_proj.weight" in names
        assert len(checked["bucketed_matches"]) == len(names)
        assert all(result["uneven_row_slices"])


@pytest.mark.parametrize("family", MOE_ARCHITECTURES)
def test_adapters_on_every_expert_merge_into_the_weights_the_sync_sends(
    moe_run: tuple[list[dict[str, Any]], dict], family: str
) -> None:
    for result in moe_run[0]:
        print(
            f"{family}: LoRA on the experts, merged vs sharded peft {result[f'lora_{family}']:.1e}"
        )
        assert result[f"lora_{family}"] < LOGPROB_ATOL
