"""Ulysses sequence parallelism through the real scoring path on gloo ranks (no Ray): tiny
Qwen2 and Qwen3 models, FSDP2-sharded, score the same ragged micro-batch with sp = 1 and with
its packed row split over the sp ranks (hybrid.workers.sequence_parallel): log-probs and
entropy equal (fp32, 1e-5), with the chunked scoring head and with full logits, every
gradient equal, and so the parameters after an AdamW step; a critic's values on the same
decoder equal too. The packed rows' lengths are not multiples of sp, and the tiny models have
one kv head (repeated for the ranks). Default tier: sp 2 on 2 ranks; full tier: sp 4 on 4
ranks (4 query heads), and dp 2 x sp 2 on 4 ranks (two batches, the sp groups as sub-meshes)
against plain data parallelism on the same batches.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from hybrid.models import TinyModelConfig, build_tiny_model
from hybrid.workers.forward import PassConfig, score_micro_batch
from hybrid.workers.fsdp import build_fsdp_model, build_optimizer, clip_and_step
from hybrid.workers.sequence_parallel import SpGroup
from hybrid.workers.value import value_micro_batch
from tests.integration.workers.gloo_ranks import spawn_ranks
from tests.integration.workers.test_fsdp import CPU, OPTIM_KWARGS
from tests.unit.workers.test_forward import ragged_batch

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ATOL = 1e-5
# AdamW's first step moves each weight by about lr * g / |g|: a gradient near zero whose last
# bits differ moves by up to lr there (test_expert_parallel.py measures the same).
PARAM_ATOL = 1e-4


def _pass(
    model: torch.nn.Module, batch: Any, config: PassConfig, sp: int, keep_grads: bool = False
) -> dict[str, Any]:
    """Scores without grad, then one backward of the token-mean NLL; gradients in full."""
    mask = batch.tensors["response_mask"]
    with torch.no_grad():
        scores = score_micro_batch(model, batch, config, with_entropy=True)
    graded = score_micro_batch(model, batch, config, with_entropy=True)
    loss = -(graded.log_probs * mask).sum() / mask.sum()
    # Every rank of an sp group holds this loss; FSDP2 averages the slices' gradients over
    # the ranks, so the group's sum is sp times the mean (the trainer scales by the world).
    (loss * sp).backward()
    grads = {n: p.grad.full_tensor().clone() for n, p in model.named_parameters()}
    if not keep_grads:
        model.zero_grad(set_to_none=True)
    return {"log_probs": scores.log_probs, "entropy": scores.entropy, "grads": grads}


def _compare(rank: int, mesh: DeviceMesh, dirs: dict[str, Path], sp: int) -> dict:
    group = SpGroup(dist.group.WORLD, rank, sp)
    batch = ragged_batch(rows=6, prompt=9, response=7, seed=3)
    out = {}
    for name, model_dir in dirs.items():
        fp32 = {"param_dtype": torch.float32, "reduce_dtype": torch.float32}
        model = build_fsdp_model(str(model_dir), mesh, CPU, **fp32)
        result = {}
        for chunk in (1024, 0):  # the chunked scoring head, and full logits
            plain = _pass(model, batch, PassConfig(6, chunk_tokens=chunk), 1)
            split = _pass(model, batch, PassConfig(6, chunk_tokens=chunk, sp=group), sp)
            result[chunk] = {
                "log_probs": (plain["log_probs"] - split["log_probs"]).abs().max().item(),
                "entropy": (plain["entropy"] - split["entropy"]).abs().max().item(),
                "grads": max(
                    (plain["grads"][k] - split["grads"][k]).abs().max().item()
                    for k in plain["grads"]
                ),
                "grad_size": max(g.abs().max().item() for g in plain["grads"].values()),
            }
        result["values"] = _values_diff(model_dir, mesh, batch, group)
        result["params_after_step"] = _step_diff(model_dir, mesh, batch, group, sp)
        out[name] = result
    mask = batch.tensors["attention_mask"]
    out["tokens"] = int(mask.sum())
    return out


def _values_diff(model_dir: Path, mesh: DeviceMesh, batch: Any, group: SpGroup) -> float:
    """A critic (value head) on the same decoder: its values with and without the split."""
    fp32 = {"param_dtype": torch.float32, "reduce_dtype": torch.float32}
    critic = build_fsdp_model(str(model_dir), mesh, CPU, value_head=True, **fp32)
    with torch.no_grad():
        plain = value_micro_batch(critic, batch, PassConfig(6))
        split = value_micro_batch(critic, batch, PassConfig(6, sp=group))
    return (plain - split).abs().max().item()


def _step_diff(model_dir: Path, mesh: DeviceMesh, batch: Any, group: SpGroup, sp: int) -> float:
    """Two copies of the model, one AdamW step each (without and with the split): the
    parameters after it."""
    fp32 = {"param_dtype": torch.float32, "reduce_dtype": torch.float32}
    stepped = []
    for config, scale in ((PassConfig(6), 1), (PassConfig(6, sp=group), sp)):
        model = build_fsdp_model(str(model_dir), mesh, CPU, **fp32)
        optimizer = build_optimizer(model, **OPTIM_KWARGS)
        _pass(model, batch, config, scale, keep_grads=True)
        clip_and_step(model, optimizer, 1.0)
        stepped.append({n: p.full_tensor() for n, p in model.named_parameters()})
    return max((stepped[0][k] - stepped[1][k]).abs().max().item() for k in stepped[0])


def _dirs(root: Path, heads: int) -> dict[str, Path]:
    return {
        arch: build_tiny_model(
            root / arch,
            TinyModelConfig.preset(
                "tiny", architecture=arch, dtype="float32", num_attention_heads=heads
            ),
        )
        for arch in ("qwen2", "qwen3")
    }


def _check(results: list[dict], sp: int) -> None:
    assert results[0]["tokens"] % sp, "the packed row should not fill the ranks evenly"
    for rank, result in enumerate(results):
        for arch in ("qwen2", "qwen3"):
            values, stepped = result[arch].pop("values"), result[arch].pop("params_after_step")
            print(
                f"sp {sp} rank {rank} {arch}: values {values:.1e}, params after a step {stepped:.1e}"
            )
            assert values < ATOL and stepped < PARAM_ATOL
            for chunk, diffs in result[arch].items():
                print(f"sp {sp} rank {rank} {arch} chunk {chunk}: {diffs}")
                assert diffs["grad_size"] > 1e-3  # the compared gradients are not all zero
                assert diffs["log_probs"] < ATOL and diffs["entropy"] < ATOL
                assert diffs["grads"] < ATOL


def test_sp2_scores_and_gradients_equal_sp1(tmp_path: Path) -> None:
    results = spawn_ranks(_compare, tmp_path / "run", _dirs(tmp_path / "models", 2), 2)
    _check(results, 2)


@pytest.mark.full
def test_sp4_scores_and_gradients_equal_sp1(tmp_path: Path) -> None:
    results = spawn_ranks(_compare, tmp_path / "run", _dirs(tmp_path / "models", 4), 4, world=4)
    _check(results, 4)


def _dp2_sp2(rank: int, mesh: DeviceMesh, dirs: dict[str, Path]) -> dict:
    """dp 2 x sp 2 on 4 ranks against dp 4 with each batch on two ranks (the same mean
    gradient as dp 2 on 2 ranks): ranks 0, 1 score batch A, ranks 2, 3 batch B."""
    sp_mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "sp"))
    group = SpGroup(sp_mesh.get_group("sp"), sp_mesh.get_local_rank("sp"), 2)
    batch = ragged_batch(rows=6, prompt=9, response=7, seed=10 + rank // 2)
    model_dir = dirs["qwen2"]
    fp32 = {"param_dtype": torch.float32, "reduce_dtype": torch.float32}
    model = build_fsdp_model(str(model_dir), mesh, CPU, **fp32)
    plain = _pass(model, batch, PassConfig(6), 1)
    split = _pass(model, batch, PassConfig(6, sp=group), 2)
    return {
        "grads": max(
            (plain["grads"][k] - split["grads"][k]).abs().max().item() for k in plain["grads"]
        ),
        "log_probs": (plain["log_probs"] - split["log_probs"]).abs().max().item(),
        "params_after_step": _step_diff(model_dir, mesh, batch, group, 2),
    }


@pytest.mark.full
def test_dp2_by_sp2_equals_dp_alone(tmp_path: Path) -> None:
    results = spawn_ranks(_dp2_sp2, tmp_path / "run", _dirs(tmp_path / "models", 2), world=4)
    for result in results:
        print(f"dp 2 x sp 2: {result}")
        assert result["grads"] < ATOL and result["log_probs"] < ATOL
        assert result["params_after_step"] < PARAM_ATOL
