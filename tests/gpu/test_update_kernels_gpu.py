"""The update's faster kernels on CUDA, bf16, world 1 (issue 48): compiled decoder layers
(inductor) and liger-kernel's fused ops give the eager model's log-probs, entropy and
gradients within bf16 tolerances; liger's fused log-prob head gives the chunked head's
log-probs and gradients, fp32 and bf16.

The CPU tests (tests/integration/workers/test_update_kernels.py) compare in fp32 with
aot_eager; here the real kernels run: inductor's Triton code, liger's Triton kernels, bf16
compute on a 1-rank NCCL group. The tolerances below are first guesses. Every test prints
what it measured (`pytest -s`) and, where SMOKE_OUT names a directory (tests/gpu/lease.sh
sets it), adds it to `$SMOKE_OUT/update_kernels_gpu.json`, with the bf16 noise of the eager
model itself (bf16 eager against fp32 eager) beside it for scale: replace the guesses with a
margin over the measured spread. The liger tests skip where liger_kernel is not installed.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from hybrid.algorithms.chunked_logprob import chunked_log_probs
from hybrid.data import Batch
from hybrid.data.sample import position_ids_from_mask
from hybrid.models import TinyModelConfig, build_tiny_model
from hybrid.workers import log_prob_head
from hybrid.workers.compiled_blocks import compiled_graphs, is_compiled
from hybrid.workers.forward import PassConfig, score_micro_batch
from hybrid.workers.fsdp import build_fsdp_model, decoder_layers
from hybrid.workers.fused_kernels import FUSED_OPS, fused_log_probs
from hybrid.workers.kernels import KernelPlan

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(600)]

# First guesses, to be replaced by a margin over the spread the GPU run measures (printed,
# and in $SMOKE_OUT/update_kernels_gpu.json). Model passes: bf16 compute, the tiny model. On
# the CPU (inductor's C++ code, bf16, 2026-12-03) compiled against eager measured 0.039 /
# 0.010 / 0.031 for these three, and eager's own bf16 noise (fp32 against bf16) 0.042 /
# 0.007 / 0.042: the guesses leave about 2.5 times that.
LOG_PROB_ATOL = 0.1
"""Largest |log-prob difference| over response tokens, against eager bf16."""
ENTROPY_ATOL = 0.05
"""Largest |entropy difference| over response tokens, against eager bf16."""
GRAD_RTOL = 0.1
"""Largest relative gradient difference ||g - g_eager|| / ||g_eager|| over the parameters."""
# liger's fused head against the chunked head, per input dtype: the same logits rounded to
# the same dtype, but the matmuls run in other chunk shapes (other accumulation orders), so
# in bf16 a logit can round one step apart: 0.0625 for a logit near 10.
HEAD_LOG_PROB_ATOL = {torch.float32: 1e-4, torch.bfloat16: 0.1}
HEAD_GRAD_RTOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2}

STEPS = 3
PASS = PassConfig(micro_batch_size=4, packed=True, chunk_tokens=16)
NO_LIGER = "liger-kernel is not installed here (tests/gpu/README.md: the wheel in .whl/)"
RESULTS_FILE = "update_kernels_gpu.json"


# --- fixtures ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def device() -> torch.device:
    cuda = torch.device("cuda", 0)
    torch.cuda.set_device(cuda)
    return cuda


@pytest.fixture(scope="module")
def mesh(device: torch.device) -> Iterator[DeviceMesh]:
    """World 1 on NCCL bound to the device (as tests/gpu/smoke_fsdp.py), unless a group is
    already up."""
    created = not dist.is_initialized()
    if created:
        dist.init_process_group(
            "nccl", store=dist.HashStore(), rank=0, world_size=1, device_id=device
        )
    try:
        yield init_device_mesh("cuda", (1,), mesh_dim_names=("fsdp",))
    finally:
        if created:
            dist.destroy_process_group()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # initializer_range 0.1, as the CPU tests: logits far enough from uniform that the
    # log-probs and gradients carry signal.
    config = TinyModelConfig.preset("tiny", initializer_range=0.1)
    return build_tiny_model(tmp_path_factory.mktemp("tiny"), config, seed=0)


@pytest.fixture(scope="module")
def measured() -> Iterator[dict[str, Any]]:
    """What the tests measured, written to $SMOKE_OUT/update_kernels_gpu.json at the end."""
    figures: dict[str, Any] = {
        "tolerances": {
            "log_prob_atol": LOG_PROB_ATOL,
            "entropy_atol": ENTROPY_ATOL,
            "grad_rtol": GRAD_RTOL,
            "head_log_prob_atol": {str(k): v for k, v in HEAD_LOG_PROB_ATOL.items()},
            "head_grad_rtol": {str(k): v for k, v in HEAD_GRAD_RTOL.items()},
        },
        "torch": torch.__version__,
    }
    yield figures
    out = os.environ.get("SMOKE_OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / RESULTS_FILE).write_text(json.dumps(figures, indent=2))


@pytest.fixture
def with_torch_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    """tests/conftest.py turns torch.compile off for the suite (TORCHDYNAMO_DISABLE, read
    when a function is compiled): on here."""
    monkeypatch.delenv("TORCHDYNAMO_DISABLE", raising=False)


# --- passes and differences ----------------------------------------------------------------


def ragged_batch(rows: int, seed: int, device: torch.device) -> Batch:
    """Left-padded prompts and right-padded responses of varied lengths, on `device`: each
    seed packs to another token count (a graph specialised to one length would recompile)."""
    g = torch.Generator().manual_seed(seed)
    prompt, response = 24, 16
    prompt_len = torch.randint(2, prompt + 1, (rows,), generator=g)
    response_len = torch.randint(1, response + 1, (rows,), generator=g)
    prompt_mask = (torch.arange(prompt) >= prompt - prompt_len[:, None]).long()
    response_mask = (torch.arange(response) < response_len[:, None]).long()
    mask = torch.cat([prompt_mask, response_mask], dim=1)
    ids = torch.randint(5, 250, mask.shape, generator=g) * mask
    return Batch.from_dict(
        {
            "input_ids": ids,
            "attention_mask": mask,
            "position_ids": position_ids_from_mask(mask),
            "responses": ids[:, prompt:],
            "response_mask": response_mask,
        }
    ).to(device)


@dataclass
class PassResult:
    log_probs: torch.Tensor
    entropy: torch.Tensor | None
    grads: dict[str, torch.Tensor]
    mask: torch.Tensor


def run_pass(
    model: torch.nn.Module, micro: Batch, config: PassConfig, with_entropy: bool
) -> PassResult:
    """Log-probs (and entropy) of the micro-batch and the gradients of a loss of both (the
    entropy term, when there, sends a gradient through the entropy as actor.entropy_coeff
    does)."""
    scores = score_micro_batch(model, micro, config, with_entropy=with_entropy)
    mask = micro.tensors["response_mask"].bool()
    tokens = mask.sum()
    loss = -(scores.log_probs * mask).sum() / tokens
    if with_entropy:
        assert scores.entropy is not None
        loss = loss - 0.1 * (scores.entropy * mask).sum() / tokens
    loss.backward()
    grads = {
        name: p.grad.full_tensor().double().clone()
        for name, p in model.named_parameters()
        if p.grad is not None
    }
    model.zero_grad(set_to_none=True)
    entropy = None if scores.entropy is None else scores.entropy.detach().double()
    return PassResult(scores.log_probs.detach().double(), entropy, grads, mask)


def differences(ours: PassResult, reference: PassResult) -> dict[str, Any]:
    """Largest |difference| of log-probs and entropy over response tokens; the largest
    relative gradient difference and the parameter it is in."""
    mask = reference.mask
    out: dict[str, Any] = {
        "log_prob": float((ours.log_probs - reference.log_probs)[mask].abs().max()),
    }
    if ours.entropy is not None and reference.entropy is not None:
        out["entropy"] = float((ours.entropy - reference.entropy)[mask].abs().max())
    assert ours.grads.keys() == reference.grads.keys(), "the models' parameters differ"
    worst, where = 0.0, ""
    for name, grad in reference.grads.items():
        relative = float((ours.grads[name] - grad).norm() / grad.norm().clamp_min(1e-30))
        if relative > worst:
            worst, where = relative, name
    out["grad_rel"] = worst
    out["grad_rel_worst_param"] = where
    return out


def worst(steps: list[dict[str, Any]]) -> dict[str, Any]:
    """The largest of each difference over the steps."""
    keys = [k for k in steps[0] if isinstance(steps[0][k], float)]
    return {key: max(step[key] for step in steps) for key in keys}


def compare_passes(
    models: dict[str, torch.nn.Module],
    config: PassConfig,
    with_entropy: bool,
    wrap: dict[str, Callable[[], Any]] | None = None,
) -> dict[str, Any]:
    """STEPS micro-batches of other lengths through every model (each name's context from
    `wrap` around its pass), each compared with `models["eager"]`, and the dynamo graphs
    compiled per step. Returns the per-step differences, their maxima and the graphs."""
    wrap = wrap or {}
    device = next(models["eager"].parameters()).device
    per_model: dict[str, list[dict[str, Any]]] = {name: [] for name in models if name != "eager"}
    graphs: list[int] = []
    for step in range(STEPS):
        micro = ragged_batch(4, seed=10 * step + 1, device=device)
        before = compiled_graphs()
        results = {}
        for name, model in models.items():
            context = wrap.get(name)
            if context is None:
                results[name] = run_pass(model, micro, config, with_entropy)
            else:
                with context():
                    results[name] = run_pass(model, micro, config, with_entropy)
        graphs.append(compiled_graphs() - before)
        for name in per_model:
            per_model[name].append(differences(results[name], results["eager"]))
    return {
        "per_step": per_model,
        "max": {name: worst(steps) for name, steps in per_model.items()},
        "graphs_per_step": graphs,
    }


def build(
    model_dir: Path,
    mesh: DeviceMesh,
    device: torch.device,
    dtype: torch.dtype,
    kernels: KernelPlan | None = None,
    gradient_checkpointing: bool = False,
) -> torch.nn.Module:
    return build_fsdp_model(
        str(model_dir),
        mesh,
        device,
        param_dtype=dtype,
        gradient_checkpointing=gradient_checkpointing,
        kernels=kernels,
    )


def report(measured: dict[str, Any], key: str, result: dict[str, Any]) -> None:
    measured[key] = result
    print(f"\n[{key}] largest differences: {json.dumps(result['max'])}")
    if "bf16_noise" in result:
        print(
            f"[{key}] bf16 noise (eager fp32 against eager bf16): {json.dumps(result['bf16_noise'])}"
        )
    if "graphs_per_step" in result:
        print(f"[{key}] graphs compiled per step: {result['graphs_per_step']}")


def assert_within(result: dict[str, Any], name: str, key: str) -> None:
    got = result["max"][name]
    assert got["log_prob"] <= LOG_PROB_ATOL, (key, name, got)
    if "entropy" in got:
        assert got["entropy"] <= ENTROPY_ATOL, (key, name, got)
    assert got["grad_rel"] <= GRAD_RTOL, (key, name, got)


# --- liger ---------------------------------------------------------------------------------


def need_liger() -> None:
    """Skip, naming why, where liger-kernel is absent or does not import with this torch and
    transformers (tests/gpu/lease.sh's env.txt says which)."""
    if importlib.util.find_spec("liger_kernel") is None:
        pytest.skip(NO_LIGER)
    try:
        importlib.import_module("liger_kernel.transformers.monkey_patch")
    except Exception as error:
        pytest.skip(
            f"liger-kernel is installed but does not import: {type(error).__name__}: {error}"
        )


_MISSING = object()


@contextmanager
def captured_patches(module: ModuleType) -> Iterator[dict[str, Any]]:
    """Yields a dict that holds, on exit, what was rebound in `module` inside the block
    (liger's apply_liger_kernel_to_<family> rebinds the family's apply_rotary_pos_emb and its
    norm and MLP classes for every model in the process); the originals are back on exit, so
    the eager model stays eager."""
    before = dict(vars(module))
    patched: dict[str, Any] = {}
    try:
        yield patched
    finally:
        for name, value in list(vars(module).items()):
            if before.get(name, _MISSING) is not value:
                patched[name] = value
        for name in patched:
            if name in before:
                setattr(module, name, before[name])
            else:
                delattr(module, name)


@contextmanager
def swapped(module: ModuleType, values: dict[str, Any]) -> Iterator[None]:
    """`values` bound in `module` within the block."""
    saved = {name: getattr(module, name, _MISSING) for name in values}
    for name, value in values.items():
        setattr(module, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is _MISSING:
                delattr(module, name)
            else:
                setattr(module, name, value)


def family_module(model: torch.nn.Module) -> ModuleType:
    """The transformers modeling module of `model`'s family (the FSDP2 class subclasses it)."""
    for cls in type(model).__mro__:
        if cls.__module__.startswith("transformers.models."):
            return sys.modules[cls.__module__]
    raise TypeError(f"{type(model).__name__} is not a transformers model class")


# --- tests ---------------------------------------------------------------------------------


@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointing"])
def test_compiled_layers_match_eager_in_bf16(
    model_dir: Path,
    mesh: DeviceMesh,
    device: torch.device,
    measured: dict[str, Any],
    with_torch_compile: None,
    checkpointing: bool,
) -> None:
    eager = build(model_dir, mesh, device, torch.bfloat16, gradient_checkpointing=checkpointing)
    compiled = build(
        model_dir,
        mesh,
        device,
        torch.bfloat16,
        KernelPlan("actor", compile=True, compile_required=True),
        gradient_checkpointing=checkpointing,
    )
    fp32 = build(model_dir, mesh, device, torch.float32, gradient_checkpointing=checkpointing)
    models = {"eager": eager, "compiled": compiled, "eager_fp32": fp32}
    key = f"compiled_{'checkpointing' if checkpointing else 'plain'}"
    result = compare_passes(models, PASS, with_entropy=True)
    result["bf16_noise"] = result["max"].pop("eager_fp32")  # eager fp32 against eager bf16
    report(measured, key, result)
    assert all(is_compiled(layer) for layer in decoder_layers(compiled)), "a layer fell back"
    assert compiled_graphs() > 0, "nothing was compiled (is TORCHDYNAMO_DISABLE set?)"
    # Micro-batches of other lengths reuse the first one's graphs: dynamic shapes.
    assert result["graphs_per_step"][1:] == [0] * (STEPS - 1), result["graphs_per_step"]
    assert_within(result, "compiled", key)


@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointing"])
def test_liger_fused_layers_match_eager_in_bf16(
    model_dir: Path,
    mesh: DeviceMesh,
    device: torch.device,
    measured: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
    checkpointing: bool,
) -> None:
    need_liger()
    ckpt = {"gradient_checkpointing": checkpointing}
    eager = build(model_dir, mesh, device, torch.bfloat16, **ckpt)
    module = family_module(eager)
    with captured_patches(module) as patches:
        fused = build(
            model_dir,
            mesh,
            device,
            torch.bfloat16,
            KernelPlan("actor", fused_ops=FUSED_OPS),
            **ckpt,
        )
    measured["liger_patched_globals"] = sorted(patches)
    assert "apply_rotary_pos_emb" in patches, sorted(patches)
    fp32 = build(model_dir, mesh, device, torch.float32, **ckpt)
    tag = "checkpointing" if checkpointing else "plain"
    models = {"eager": eager, "fused": fused, "eager_fp32": fp32}
    liger = {"fused": lambda: swapped(module, patches)}

    # With entropy: liger's norms, rotary embedding and SwiGLU; the chunked head.
    layers = compare_passes(models, PASS, with_entropy=True, wrap=liger)
    layers["bf16_noise"] = layers["max"].pop("eager_fp32")
    report(measured, f"fused_layers_{tag}", layers)

    # Without entropy, the fused model's pass takes liger's fused linear cross-entropy head
    # (PassConfig.fused_head); the eager ones keep the chunked head.
    calls = [0]

    def counted(*args: Any, **kwargs: Any) -> torch.Tensor:
        calls[0] += 1
        return fused_log_probs(*args, **kwargs)

    monkeypatch.setattr(log_prob_head, "fused_log_probs", counted)
    fused_head = dataclasses.replace(PASS, fused_head=True)
    per_model: dict[str, list[dict[str, Any]]] = {"fused": [], "eager_fp32": []}
    for step in range(STEPS):
        micro = ragged_batch(4, seed=10 * step + 2, device=device)
        reference = run_pass(eager, micro, PASS, with_entropy=False)
        with swapped(module, patches):
            ours = run_pass(fused, micro, fused_head, with_entropy=False)
        per_model["fused"].append(differences(ours, reference))
        per_model["eager_fp32"].append(
            differences(run_pass(fp32, micro, PASS, with_entropy=False), reference)
        )
    head = {
        "per_step": per_model,
        "max": {"fused": worst(per_model["fused"])},
        "bf16_noise": worst(per_model["eager_fp32"]),
        "fused_head_calls": calls[0],
    }
    report(measured, f"fused_layers_and_head_{tag}", head)
    assert calls[0] == STEPS, f"the fused head ran {calls[0]} times in {STEPS} passes"
    assert_within(layers, "fused", f"fused_layers_{tag}")
    assert_within(head, "fused", f"fused_layers_and_head_{tag}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_liger_fused_head_matches_chunked_head(
    device: torch.device, measured: dict[str, Any], dtype: torch.dtype
) -> None:
    need_liger()
    result = head_differences(device, dtype)
    key = f"fused_head_{str(dtype).removeprefix('torch.')}"
    measured[key] = result
    print(f"\n[{key}] {json.dumps(result)}")
    fused = result["fused_vs_chunked"]
    assert fused["log_prob"] <= HEAD_LOG_PROB_ATOL[dtype], result
    assert fused["grad_hidden_rel"] <= HEAD_GRAD_RTOL[dtype], result
    assert fused["grad_weight_rel"] <= HEAD_GRAD_RTOL[dtype], result


def head_differences(
    device: torch.device, dtype: torch.dtype, n: int = 1000, width: int = 256, vocab: int = 32000
) -> dict[str, Any]:
    """liger's fused head and the chunked head on the same random inputs (rounded to `dtype`),
    values and gradients under a random per-token upstream gradient (the update's loss
    weighs tokens differently), each also against float64 on those rounded inputs."""
    g = torch.Generator(device=device).manual_seed(0)
    hidden = torch.randn(n, width, generator=g, device=device).to(dtype)
    # Logits of std ~3: peaked distributions, as a trained model's.
    weight = (3.0 * width**-0.5 * torch.randn(vocab, width, generator=g, device=device)).to(dtype)
    labels = torch.randint(0, vocab, (n,), generator=g, device=device)
    upstream = torch.randn(n, generator=g, device=device, dtype=torch.float64)

    def run(
        fn: Callable[..., torch.Tensor], compute: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        h = hidden.to(compute, copy=True).requires_grad_()  # fresh leaves for every run
        w = weight.to(compute, copy=True).requires_grad_()
        log_probs = fn(h, w, labels)
        (log_probs.double() * upstream).sum().backward()
        assert h.grad is not None and w.grad is not None
        return log_probs.detach().double(), h.grad.double(), w.grad.double()

    def chunked(h: torch.Tensor, w: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return chunked_log_probs(h, w, labels, 256, False)[0]

    fused = run(fused_log_probs, dtype)
    ours = run(chunked, dtype)
    exact = run(chunked, torch.float64)

    def compare(a: tuple[torch.Tensor, ...], b: tuple[torch.Tensor, ...]) -> dict[str, float]:
        return {
            "log_prob": float((a[0] - b[0]).abs().max()),
            "grad_hidden_rel": float((a[1] - b[1]).norm() / b[1].norm()),
            "grad_weight_rel": float((a[2] - b[2]).norm() / b[2].norm()),
        }

    return {
        "shape": {"tokens": n, "hidden": width, "vocab": vocab},
        "fused_vs_chunked": compare(fused, ours),
        "fused_vs_float64": compare(fused, exact),
        "chunked_vs_float64": compare(ours, exact),
    }
