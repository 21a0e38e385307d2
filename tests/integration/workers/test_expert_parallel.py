"""Expert parallelism on gloo ranks (no Ray): the tiny mixtures of experts with their experts
owned by ep ranks and fed by all-to-all (hybrid.workers.expert_parallel) compute what the
FSDP2-sharded model computes (EP = 1) on the same weights and the same per-rank data: log-probs,
every gradient, the clipped norm and the parameters after an AdamW step; under activation
checkpointing too, and with LoRA on the attention. The weights EP holds reach the sync, the checkpoint and the export as they
would without EP.

Default tier: 2 ranks (efsdp 1 x ep 2), the tiny Qwen3-MoE (EP touches only the routed experts,
which both families hold alike). Full tier: Qwen2-MoE (its shared expert beside them) on 2
ranks, and both families on 4 ranks (efsdp 2 x ep 2: the experts' rows split too).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from transformers import AutoModelForCausalLM

from hybrid.models import TinyModelConfig, build_tiny_model
from hybrid.models.config import MOE_ARCHITECTURES
from hybrid.models.state_dict import adapter_for
from hybrid.sharding.full_weights import expert_buckets
from hybrid.sharding.gather import iter_full_parameters
from hybrid.workers.checkpoint import load_checkpoint, save_checkpoint
from hybrid.workers.config import LoraConfig
from hybrid.workers.expert_parallel import ExpertParallelExperts
from hybrid.workers.export import export_hf_model
from hybrid.workers.fsdp import build_fsdp_model, build_optimizer, clip_and_step
from tests.integration.workers.gloo_ranks import spawn_ranks
from tests.integration.workers.test_fsdp import CPU, OPTIM_KWARGS, VOCAB

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

FP32 = torch.float32
GRAD_ATOL = 1e-6  # fp32: the same arithmetic, the k experts' rows summed in another order
# AdamW's first step is lr * g / (|g| + eps) per element: a gradient of ~1e-8 whose last bit
# differs moves its weight by up to lr * 1e-3.
PARAM_ATOL = 1e-4


def _token_log_probs(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    logits = model(ids).logits.float()[:, :-1]
    return torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)


def _full(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.full_tensor().detach().clone() for n, p in model.named_parameters()}


def _train_once(
    rank: int, model_dir: Path, mesh: DeviceMesh, expert_mesh: DeviceMesh | None, **build: Any
) -> tuple[torch.nn.Module, torch.optim.Optimizer, dict[str, Any]]:
    """One forward without grad, one backward and one clipped AdamW step on this rank's data."""
    model = build_fsdp_model(str(model_dir), mesh, CPU, expert_mesh=expert_mesh, **build)
    ids = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(rank))
    with torch.no_grad():
        log_probs = _token_log_probs(model, ids)
    optimizer = build_optimizer(model, **OPTIM_KWARGS)
    (-_token_log_probs(model, ids).mean()).backward()
    grads = {
        n: p.grad.full_tensor().clone() for n, p in model.named_parameters() if p.grad is not None
    }
    grad_norm, _ = clip_and_step(model, optimizer, 0.5)
    run = {"log_probs": log_probs, "grads": grads, "grad_norm": grad_norm, "params": _full(model)}
    return model, optimizer, run


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys(), sorted(a.keys() ^ b.keys())
    return max((a[k] - b[k]).abs().max().item() for k in a)


def _compare(rank: int, mesh: DeviceMesh, model_dir: Path, out: Path, ep_size: int) -> dict:
    world = mesh.size()
    expert_mesh = init_device_mesh(
        "cpu", (world // ep_size, ep_size), mesh_dim_names=("efsdp", "ep")
    )
    fp32 = {"param_dtype": FP32, "reduce_dtype": FP32}
    _, _, plain = _train_once(rank, model_dir, mesh, None, **fp32)
    model, optimizer, ep = _train_once(rank, model_dir, mesh, expert_mesh, **fp32)
    _, _, recomputed = _train_once(
        rank, model_dir, mesh, expert_mesh, gradient_checkpointing=True, **fp32
    )
    # LoRA on the attention over an expert-parallel base: the adapters learn the same.
    lora = {"lora": LoraConfig(rank=4, alpha=8), **fp32}
    _, _, plain_lora = _train_once(rank, model_dir, mesh, None, **lora)
    _, _, ep_lora = _train_once(rank, model_dir, mesh, expert_mesh, **lora)
    experts = model.model.layers[1].mlp.experts
    local_rows = experts.gate_up_proj.to_local().shape
    # The streams a sync sends: the layer gather, and experts a bucket at a time.
    by_layer = dict(iter_full_parameters(model, "layer", FP32))
    named = list(model.named_parameters())
    bucketed = dict(expert_buckets(named, adapter_for(model.config), FP32, bucket_bytes=1))
    expected_buckets = dict(adapter_for(model.config).to_checkpoint(by_layer.items()))
    # A checkpoint of the EP model restores into a fresh one; the export is the Hub's layout.
    save_checkpoint(out / "ckpt", model, optimizer, {"step": 1})
    restored = build_fsdp_model(str(model_dir), mesh, CPU, expert_mesh=expert_mesh, **fp32)
    load_checkpoint(out / "ckpt", restored, build_optimizer(restored, **OPTIM_KWARGS))
    exported = export_hf_model(model, model_dir, out / "export")
    # bf16 compute from fp32 master weights: both cast the same weights once.
    bf16 = {"param_dtype": torch.bfloat16}
    ids = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(rank))
    with torch.no_grad():
        mixed = [
            _token_log_probs(
                build_fsdp_model(str(model_dir), mesh, CPU, expert_mesh=m, **bf16), ids
            )
            for m in (None, expert_mesh)
        ]
    return {
        "is_ep": isinstance(experts, ExpertParallelExperts),
        "local_gate_up": tuple(local_rows),
        "log_prob_diff": (plain["log_probs"] - ep["log_probs"]).abs().max().item(),
        "grad_diff": _max_diff(plain["grads"], ep["grads"]),
        "recomputed_grad_diff": _max_diff(ep["grads"], recomputed["grads"]),
        "grad_norms": (plain["grad_norm"], ep["grad_norm"]),
        "param_diff": _max_diff(plain["params"], ep["params"]),
        "expert_grad": plain["grads"]["model.layers.1.mlp.experts.down_proj"].abs().sum().item(),
        "stream_equals_params": sorted(by_layer) == sorted(ep["params"])
        and all(torch.equal(by_layer[n], ep["params"][n]) for n in by_layer),
        "buckets_equal": sorted(bucketed) == sorted(expected_buckets)
        and all(torch.equal(bucketed[n], expected_buckets[n]) for n in bucketed),
        "restored_diff": _max_diff(ep["params"], _full(restored)),
        "exported": exported,
        "params_after_step": ep["params"],
        "bf16_log_prob_diff": (mixed[0] - mixed[1]).abs().max().item(),
        "lora_grad_diff": _max_diff(
            {n: g for n, g in plain_lora["grads"].items() if g is not None},
            {n: g for n, g in ep_lora["grads"].items() if g is not None},
        ),
        "lora_log_prob_diff": (plain_lora["log_probs"] - ep_lora["log_probs"]).abs().max().item(),
    }


def _run(rank: int, mesh: DeviceMesh, dirs: dict[str, Path], out: Path, ep_size: int) -> dict:
    return {name: _compare(rank, mesh, d, out / name, ep_size) for name, d in dirs.items()}


def _model_dirs(root: Path, families: tuple[str, ...] = MOE_ARCHITECTURES) -> dict[str, Path]:
    return {
        name: build_tiny_model(
            root / name, TinyModelConfig.preset("tiny-moe", architecture=name, dtype="float32")
        )
        for name in families
    }


def _check(results: list[dict[str, Any]], dirs: dict[str, Path], local_experts: int) -> None:
    for rank, result in enumerate(results):
        for family, r in result.items():
            print(
                f"rank {rank} {family}: log-prob diff {r['log_prob_diff']:.1e}, grad diff "
                f"{r['grad_diff']:.1e} (recomputed {r['recomputed_grad_diff']:.1e}), norms "
                f"{r['grad_norms']}, params after the step {r['param_diff']:.1e}, bf16 "
                f"{r['bf16_log_prob_diff']:.1e}"
            )
            assert r["is_ep"] and r["local_gate_up"][0] == local_experts
            assert r["expert_grad"] > 0  # the compared gradient reaches the experts
            assert r["log_prob_diff"] < 1e-6
            assert r["grad_diff"] < GRAD_ATOL and r["recomputed_grad_diff"] < GRAD_ATOL
            plain_norm, ep_norm = r["grad_norms"]
            assert abs(plain_norm - ep_norm) < 1e-5 * plain_norm
            assert r["param_diff"] < PARAM_ATOL
            assert r["bf16_log_prob_diff"] < 1e-2
            assert r["stream_equals_params"] and r["buckets_equal"]
            assert r["restored_diff"] == 0.0
            assert r["lora_log_prob_diff"] < 1e-6 and r["lora_grad_diff"] < GRAD_ATOL
    for family, r in results[0].items():
        exported = Path(r["exported"])
        # The Hub's per-expert keys, as the source checkpoint; the trained weights, rounded
        # once to the export's bf16.
        assert _checkpoint_keys(exported) == _checkpoint_keys(dirs[family])
        loaded = AutoModelForCausalLM.from_pretrained(exported, dtype=FP32).state_dict()
        trained = r["params_after_step"]
        assert all(torch.equal(loaded[n], t.to(torch.bfloat16).float()) for n, t in trained.items())


def _checkpoint_keys(model_dir: Path) -> set[str]:
    with safe_open(str(model_dir / "model.safetensors"), framework="pt") as f:
        return set(f.keys())


def test_ep2_equals_ep1_on_two_ranks(tmp_path: Path) -> None:
    dirs = _model_dirs(tmp_path / "models", ("qwen3_moe",))
    results = spawn_ranks(_run, tmp_path / "run", dirs, tmp_path, 2)
    _check(results, dirs, local_experts=2)


@pytest.mark.full
def test_ep2_with_a_shared_expert_equals_ep1_on_two_ranks(tmp_path: Path) -> None:
    dirs = _model_dirs(tmp_path / "models", ("qwen2_moe",))
    results = spawn_ranks(_run, tmp_path / "run", dirs, tmp_path, 2)
    _check(results, dirs, local_experts=2)


@pytest.mark.full
def test_ep2_with_split_expert_rows_equals_fsdp_on_four_ranks(tmp_path: Path) -> None:
    dirs = _model_dirs(tmp_path / "models")
    results = spawn_ranks(_run, tmp_path / "run", dirs, tmp_path, 2, world=4)
    _check(results, dirs, local_experts=2)
