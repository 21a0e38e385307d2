"""What `fused_kernels`, `compile` and `actor.grad_reduce` resolve to on each machine, and
the errors that name what is missing (hybrid.workers.kernels, fused_kernels, compiled_blocks,
grad_reduce). The compiled and once-reduced updates themselves are checked against eager in
tests/integration/workers/test_update_kernels.py; liger's kernels, which need CUDA, in
tests/gpu/."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from hybrid.workers.compiled_blocks import resolve_compile
from hybrid.workers.config import ActorConfig, CriticConfig, DistillConfig, RefConfig
from hybrid.workers.fused_kernels import FUSED_OPS, MOE_FUSED_OPS, fused_ops_for, liger_installed
from hybrid.workers.grad_reduce import reduces_once_per_step, trainable_gradient_bytes
from hybrid.workers.kernels import KernelPlan, plan_for_model

pytestmark = pytest.mark.unit

CUDA_WITH_LIGER = {"on_cuda": True, "installed": True}


def test_auto_fuses_on_cuda_with_liger_and_nowhere_else() -> None:
    assert fused_ops_for("auto", "actor", model_type="qwen2", **CUDA_WITH_LIGER) == FUSED_OPS
    assert fused_ops_for("auto", "actor", model_type="qwen3_moe", **CUDA_WITH_LIGER) == (
        MOE_FUSED_OPS
    )
    assert "swiglu" not in MOE_FUSED_OPS  # the stacked experts keep their grouped GEMMs
    for missing in ({"on_cuda": False}, {"installed": False}):
        where = {**CUDA_WITH_LIGER, **missing}
        assert fused_ops_for("auto", "actor", model_type="qwen2", **where) == ()
    assert fused_ops_for("auto", "actor", model_type="gpt2", **CUDA_WITH_LIGER) == ()
    assert fused_ops_for("off", "actor", model_type="llama", **CUDA_WITH_LIGER) == ()


def test_fused_kernels_on_names_everything_missing() -> None:
    with pytest.raises(ValueError) as error:
        fused_ops_for("on", "ref", model_type="gpt2", on_cuda=False, installed=False)
    message = str(error.value)
    assert message.startswith("ref.fused_kernels=on")
    assert "liger-kernel is not installed" in message
    assert "CUDA" in message
    assert "'gpt2'" in message
    with pytest.raises(ValueError, match=r"actor.fused_kernels=on, but its kernels run on CUDA"):
        fused_ops_for("on", "actor", model_type="qwen2", on_cuda=False, installed=True)


def test_compile_auto_is_cuda_and_dense_text_only() -> None:
    dense = {"mixture_of_experts": False, "vision": False}
    assert resolve_compile("auto", "actor", on_cuda=True, **dense)
    assert not resolve_compile("auto", "actor", on_cuda=False, **dense)
    assert resolve_compile("on", "actor", on_cuda=False, **dense)  # measured on CPU too
    assert not resolve_compile("off", "actor", on_cuda=True, **dense)
    moe = {"mixture_of_experts": True, "vision": False}
    assert not resolve_compile("auto", "critic", on_cuda=True, **moe)
    with pytest.raises(ValueError, match=r"critic.compile=on: .*mixture-of-experts"):
        resolve_compile("on", "critic", on_cuda=True, **moe)
    with pytest.raises(ValueError, match=r"actor.compile=on: .*vision-language"):
        resolve_compile("on", "actor", on_cuda=True, mixture_of_experts=False, vision=True)


def test_grad_reduce_auto_is_once_where_it_costs_little() -> None:
    gb = 2**30
    # A 1.5B model's fp32 gradient (6 GB) on an 80 GB GPU; a 7B model's (28 GB) does not fit.
    assert reduces_once_per_step("auto", world=8, gradient_bytes=6 * gb, device_bytes=80 * gb)
    assert not reduces_once_per_step("auto", world=8, gradient_bytes=28 * gb, device_bytes=80 * gb)
    assert reduces_once_per_step("auto", world=1, gradient_bytes=28 * gb, device_bytes=80 * gb)
    assert reduces_once_per_step("step", world=8, gradient_bytes=28 * gb, device_bytes=80 * gb)
    assert not reduces_once_per_step("micro_batch", world=1, gradient_bytes=1, device_bytes=gb)


def test_the_gradient_counts_trainable_parameters_once() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 4))
    model[1].weight.requires_grad_(False)
    # 12 + 3 trainable in the first, the second's bias 4: 19 floats
    assert trainable_gradient_bytes(model) == 4 * 19


def test_every_member_names_its_own_field() -> None:
    for config, owner in (
        (ActorConfig, "actor"),
        (RefConfig, "ref"),
        (CriticConfig, "critic"),
    ):
        with pytest.raises(ValueError, match=rf"{owner}.compile must be one of"):
            config(compile="yes")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match=rf"{owner}.fused_kernels must be one of"):
            config(fused_kernels=True)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"distill.compile must be one of"):
        DistillConfig(compile="always")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"actor.grad_reduce must be one of"):
        ActorConfig(grad_reduce="never")  # type: ignore[arg-type]


def test_plan_reads_the_model_directory(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    cpu = plan_for_model("actor", ActorConfig(), str(tmp_path), torch.device("cpu"))
    assert cpu == KernelPlan(owner="actor")  # auto: eager on CPU
    assert cpu.describe() == "actor: fused none, compiled layers off"
    forced = plan_for_model("actor", ActorConfig(compile="on"), str(tmp_path), torch.device("cpu"))
    assert forced.compile and forced.compile_required and not forced.fused_head
    cuda = plan_for_model("ref", RefConfig(), str(tmp_path), torch.device("cuda"))
    assert cuda.compile and not cuda.compile_required
    assert cuda.fused_head == liger_installed()
