"""The update's faster paths give the eager update's numbers, on 2 gloo ranks (no Ray):
compiled decoder layers (hybrid.workers.compiled_blocks), gradients reduced once per
optimizer step (hybrid.workers.grad_reduce) and a model replicated on both ranks kept a plain
module (hybrid.workers.replicated).

One spawned run per backend does every check and writes its figures to `result_rank{r}.pt`;
the tests assert on them in the parent. The default tier compiles with dynamo's `eager`
backend: the graphs, graph breaks, dynamic shapes, guards, recompiles and fallbacks of the
real path, its graphs run as traced (a quarter of `aot_eager`'s cost, without inductor's C++
build); the full tier with inductor, the backend `actor.compile` uses, forward and backward
graphs included.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor

from hybrid.data import Batch
from hybrid.data.sample import position_ids_from_mask
from hybrid.models import TinyModelConfig, build_tiny_model
from hybrid.workers.checkpoint import load_checkpoint, save_checkpoint
from hybrid.workers.compiled_blocks import compile_blocks, compiled_graphs, is_compiled
from hybrid.workers.config import ActorConfig, OptimConfig, WorkerSpec
from hybrid.workers.forward import PassConfig, score_micro_batch, score_responses
from hybrid.workers.fsdp import build_fsdp_model, build_optimizer, decoder_layers
from hybrid.workers.grad_reduce import step_gradients
from hybrid.workers.policy import PolicyTrainer
from hybrid.workers.replicated import average_gradients, gradient_replicas
from tests.integration.workers.gloo_ranks import spawn_ranks

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]

WORLD = 2
CPU = torch.device("cpu")
STEPS = 3
COMPILE_ATOL = 1e-5
"""fp32 on CPU: compiled and eager log-probs, entropy and gradients agree within this."""
REPLICA_ATOL = 1e-5
"""fp32 on CPU, lr 1e-3: the plain replicas' weights after their two updates and FSDP2's agree
within 1% of a step. The gradients are the same sums in another order, and where one element's
gradient is near AdamW's eps (1e-8) its last-bit difference moves that element's step by a
fraction of lr: measured 5.1e-6 on one of 64 with AVX2 kernels, under 1e-6 with AVX-512 ones."""
PASS = PassConfig(micro_batch_size=2, packed=True, chunk_tokens=16)


def _ragged_batch(rows: int, seed: int) -> Batch:
    """Left-padded prompts and right-padded responses of varied lengths: every seed packs to
    another token count, so a graph that specialised to one would recompile."""
    g = torch.Generator().manual_seed(seed)
    prompt, response = 12, 10
    prompt_len = torch.randint(2, prompt + 1, (rows,), generator=g)
    response_len = torch.randint(1, response + 1, (rows,), generator=g)
    prompt_mask = (torch.arange(prompt) >= prompt - prompt_len[:, None]).long()
    response_mask = (torch.arange(response) < response_len[:, None]).long()
    mask = torch.cat([prompt_mask, response_mask], dim=1)
    ids = torch.randint(5, 250, mask.shape, generator=g) * mask
    log_probs = -torch.rand((rows, response), generator=g) - 1.0
    return Batch.from_dict(
        {
            "input_ids": ids,
            "attention_mask": mask,
            "position_ids": position_ids_from_mask(mask),
            "responses": ids[:, prompt:],
            "response_mask": response_mask,
            "old_log_probs": log_probs,
            "rollout_log_probs": log_probs,
            "advantages": torch.randn(rows, generator=g),
        }
    )


def _named_layers(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    names = {id(module): name for name, module in model.named_modules()}
    return [(names[id(layer)], layer) for layer in decoder_layers(model)]


def _scores_and_grads(
    model: torch.nn.Module, micro: Batch
) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    scores = score_micro_batch(model, micro, PASS, with_entropy=True)
    assert scores.entropy is not None
    mask = micro.tensors["response_mask"]
    loss = -(scores.log_probs * mask).sum() / mask.sum() - 0.1 * (scores.entropy * mask).mean()
    loss.backward()
    grads = [p.grad.full_tensor().clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return scores.log_probs.detach(), scores.entropy.detach(), grads


def _max_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(a, b, strict=True))


def _failing_backend(graph: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable:
    raise RuntimeError("this backend compiles nothing")


def _compiled_run(rank: int, mesh: DeviceMesh, model_dir: Path, backend: str) -> dict[str, Any]:
    build = lambda: build_fsdp_model(str(model_dir), mesh, CPU, param_dtype=torch.float32)  # noqa: E731
    eager, compiled = build(), build()
    compile_blocks(_named_layers(compiled), "actor", required=True, backend=backend)
    out: dict[str, Any] = {"log_prob": [], "entropy": [], "grad": [], "graphs": []}
    for step in range(STEPS):
        micro = _ragged_batch(4, seed=10 * step + rank)
        e_lp, e_ent, e_grads = _scores_and_grads(eager, micro)
        c_lp, c_ent, c_grads = _scores_and_grads(compiled, micro)
        out["log_prob"].append(float((e_lp - c_lp).abs().max()))
        out["entropy"].append(float((e_ent - c_ent).abs().max()))
        out["grad"].append(_max_diff(e_grads, c_grads))
        out["graphs"].append(compiled_graphs())
    # The no-grad pass (old log-probs, the reference): its own graphs, once.
    batch = _ragged_batch(6, seed=99 + rank)
    for model in (eager, compiled):
        model.eval()
    first = score_responses(compiled, batch, PASS, with_entropy=True)
    graphs_after_first = compiled_graphs()
    again = score_responses(compiled, _ragged_batch(6, seed=123 + rank), PASS, with_entropy=True)
    reference = score_responses(eager, batch, PASS, with_entropy=True)
    out["no_grad_log_prob"] = float((first["log_probs"] - reference["log_probs"]).abs().max())
    out["no_grad_recompiles"] = compiled_graphs() - graphs_after_first
    assert again["log_probs"].shape == batch.tensors["responses"].shape
    out["compiled"] = [is_compiled(layer) for _, layer in _named_layers(compiled)]

    # A compile that fails: auto runs the layer eagerly (same numbers), on names the layer.
    fallback = build()
    compile_blocks(_named_layers(fallback), "actor", required=False, backend=_failing_backend)
    for model in (eager, fallback):
        model.train()
    micro = _ragged_batch(4, seed=7 + rank)
    e_lp, _, e_grads = _scores_and_grads(eager, micro)
    f_lp, _, f_grads = _scores_and_grads(fallback, micro)
    out["fallback_log_prob"] = float((e_lp - f_lp).abs().max())
    out["fallback_grad"] = _max_diff(e_grads, f_grads)
    out["fallback_compiled"] = [is_compiled(layer) for _, layer in _named_layers(fallback)]
    strict = build()
    compile_blocks(_named_layers(strict), "actor", required=True, backend=_failing_backend)
    try:
        _scores_and_grads(strict, micro)
        out["strict_error"] = None
    except RuntimeError as error:
        out["strict_error"] = str(error)
    return out


def _counting_reduce_scatters() -> list[int]:
    """Count FSDP2's gradient reduce-scatters in this process: it calls torch.distributed's
    (`reduce_scatter_single` in torch 2.13, `reduce_scatter_tensor` before) at call time."""
    calls = [0]
    for name in ("reduce_scatter_single", "reduce_scatter_tensor"):
        original = getattr(dist, name, None)
        if original is None:
            continue

        def counted(*args: Any, _original: Callable = original, **kwargs: Any) -> Any:
            calls[0] += 1
            return _original(*args, **kwargs)

        setattr(dist, name, counted)
    return calls


def _grad_reduce_run(rank: int, mesh: DeviceMesh, model_dir: Path) -> dict[str, Any]:
    """One optimizer step of 3 micro-batches, reduced per micro-batch and once: the same
    updated weights, and a third of the reduce-scatters."""
    calls = _counting_reduce_scatters()
    batch = _ragged_batch(6, seed=rank)
    config = ActorConfig(micro_batch_size=2, optim=OptimConfig(lr=1e-3))
    out: dict[str, Any] = {}
    for reduce_once in (False, True):
        model = build_fsdp_model(str(model_dir), mesh, CPU, param_dtype=torch.float32)
        optimizer = build_optimizer(model, 1e-3, 0.0, (0.9, 0.999), 1e-8)
        trainer = PolicyTrainer(
            model, optimizer, config, WorkerSpec(), PASS, reduce_once=reduce_once
        )
        before = calls[0]
        metrics = trainer.update(batch)
        key = "once" if reduce_once else "per_micro_batch"
        out[f"{key}_reduce_scatters"] = calls[0] - before
        out[f"{key}_params"] = [p.full_tensor().clone() for p in model.parameters()]
        out[f"{key}_grad_norm"] = metrics["actor/grad_norm"]
        # Reduction is on again after the step: a plain backward reduces.
        with step_gradients(model, once_per_step=True) as before_backward:
            before_backward(False)
        before = calls[0]
        _scores_and_grads(model, _ragged_batch(2, seed=5))
        out[f"{key}_reduces_after"] = calls[0] - before
    return out


def _full(model: torch.nn.Module) -> list[torch.Tensor]:
    return [
        (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone()
        for p in model.parameters()
    ]


def _plain_replica_run(rank: int, mesh: DeviceMesh, model_dir: Path, ckpt: Path) -> dict[str, Any]:
    """The same two updates (3 micro-batches each) of a model sharded by FSDP2 over the ranks
    and of one replicated on both as a plain module; then the plain model's checkpoint loaded
    into a fresh sharded model."""
    replicated = init_device_mesh("cpu", (WORLD, 1), mesh_dim_names=("replicate", "shard"))
    config = ActorConfig(micro_batch_size=2, optim=OptimConfig(lr=1e-3))
    out: dict[str, Any] = {}
    for name, on in (("sharded", mesh), ("plain", replicated)):
        model = build_fsdp_model(str(model_dir), on, CPU, param_dtype=torch.float32)
        optimizer = build_optimizer(model, 1e-3, 0.0, (0.9, 0.999), 1e-8)
        replicas = gradient_replicas(model, on)
        out[f"{name}_dtensors"] = any(isinstance(p, DTensor) for p in model.parameters())
        out[f"{name}_averages"] = replicas is not None
        trainer = PolicyTrainer(model, optimizer, config, WorkerSpec(), PASS, replicas=replicas)
        norms = [trainer.update(_ragged_batch(6, seed=10 * step + rank))["actor/grad_norm"]
                 for step in range(2)]  # fmt: skip
        out[f"{name}_grad_norms"] = norms
        out[f"{name}_params"] = _full(model)
        if name == "plain":
            save_checkpoint(ckpt, model, optimizer, extra={"step": 2})
    # A plain run's checkpoint resumes into FSDP2 shards (a run that changed its replicas).
    model = build_fsdp_model(str(model_dir), mesh, CPU, param_dtype=torch.float32)
    optimizer = build_optimizer(model, 1e-3, 0.0, (0.9, 0.999), 1e-8)
    out["resumed_extra"] = load_checkpoint(ckpt, model, optimizer)
    out["resumed_params"] = _full(model)
    # A parameter no rank used keeps no gradient; one used on some ranks gets the mean.
    layers = torch.nn.ModuleList(torch.nn.Linear(2, 2, bias=False) for _ in range(3))
    x = torch.full((1, 2), float(rank + 1))
    (layers[0](x).sum() + (layers[1](x).sum() if rank == 1 else 0)).backward()
    average_gradients(layers, gradient_replicas(layers, replicated))
    out["sparse_grads"] = [None if p.grad is None else p.grad.clone() for p in layers.parameters()]
    # Compute in another dtype than the master weights: FSDP2 keeps the casts.
    mixed = build_fsdp_model(str(model_dir), replicated, CPU, param_dtype=torch.bfloat16)
    out["mixed_dtensors"] = all(isinstance(p, DTensor) for p in mixed.parameters())
    return out


@pytest.fixture(autouse=True)
def with_torch_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    """The suite runs without torch.compile (tests/conftest.py); the ranks these tests spawn
    inherit the environment without that setting."""
    monkeypatch.delenv("TORCHDYNAMO_DISABLE", raising=False)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    config = TinyModelConfig.preset("tiny", initializer_range=0.1)
    return build_tiny_model(tmp_path_factory.mktemp("tiny"), config, seed=0)


def _check_compiled(results: list[dict[str, Any]]) -> None:
    for rank, r in enumerate(results):
        where = f"rank {rank}"
        assert all(r["compiled"]), where
        assert max(r["log_prob"]) <= COMPILE_ATOL, (where, r["log_prob"])
        assert max(r["entropy"]) <= COMPILE_ATOL, (where, r["entropy"])
        assert max(r["grad"]) <= COMPILE_ATOL, (where, r["grad"])
        assert r["no_grad_log_prob"] <= COMPILE_ATOL, where
        # Steps of other lengths reuse the first step's graphs: no recompiles.
        assert r["graphs"][0] > 0, where
        assert r["graphs"][1:] == [r["graphs"][0]] * (STEPS - 1), (where, r["graphs"])
        assert r["no_grad_recompiles"] == 0, where
        # compile=auto: the failing layers ran eagerly, with eager's numbers.
        assert r["fallback_log_prob"] == 0.0 and r["fallback_grad"] == 0.0, where
        assert not any(r["fallback_compiled"]), where
        # compile=on: the error names the setting and the layer.
        assert r["strict_error"] is not None, where
        assert "actor.compile=on" in r["strict_error"], r["strict_error"]
        assert "model.layers.0" in r["strict_error"], r["strict_error"]


def test_compiled_layers_match_eager_without_recompiles(model_dir: Path, tmp_path: Path) -> None:
    _check_compiled(spawn_ranks(_compiled_run, tmp_path, model_dir, "eager"))


@pytest.mark.full
def test_inductor_compiled_layers_match_eager(model_dir: Path, tmp_path: Path) -> None:
    _check_compiled(spawn_ranks(_compiled_run, tmp_path, model_dir, "inductor"))


def _gradient_runs(rank: int, mesh: DeviceMesh, model_dir: Path, ckpt: Path) -> dict[str, Any]:
    return {
        "reduce_once": _grad_reduce_run(rank, mesh, model_dir),
        "plain_replica": _plain_replica_run(rank, mesh, model_dir, ckpt),
    }


@pytest.fixture(scope="module")
def gradient_runs(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """Both gradient checks in one spawn of the 2 ranks (a spawn costs seconds)."""
    out = tmp_path_factory.mktemp("gradients")
    return spawn_ranks(_gradient_runs, out, model_dir, out / "ckpt")


def test_gradients_reduced_once_per_step(gradient_runs: list[dict]) -> None:
    for rank, r in enumerate(run["reduce_once"] for run in gradient_runs):
        per, once = r["per_micro_batch_reduce_scatters"], r["once_reduce_scatters"]
        # 3 micro-batches: every FSDP unit reduces 3 times, or once.
        assert per == 3 * once and once > 0, (rank, per, once)
        for a, b in zip(r["per_micro_batch_params"], r["once_params"], strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
        assert abs(r["per_micro_batch_grad_norm"] - r["once_grad_norm"]) <= 1e-5
        assert r["per_micro_batch_reduces_after"] == r["once_reduces_after"] == once, rank


def test_a_plainly_replicated_model_updates_as_fsdp_does(gradient_runs: list[dict]) -> None:
    results = [run["plain_replica"] for run in gradient_runs]
    for rank, r in enumerate(results):
        assert r["sharded_dtensors"] and not r["sharded_averages"], rank
        assert not r["plain_dtensors"] and r["plain_averages"], rank
        assert r["mixed_dtensors"], rank
        for a, b in zip(r["sharded_params"], r["plain_params"], strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=REPLICA_ATOL)
        for sharded, plain in zip(r["sharded_grad_norms"], r["plain_grad_norms"], strict=True):
            assert abs(sharded - plain) <= 1e-5 * sharded, (rank, sharded, plain)
        assert r["resumed_extra"] == {"step": 2}
        for a, b in zip(r["plain_params"], r["resumed_params"], strict=True):
            assert torch.equal(a, b), rank
        used_by_both, used_by_rank1, unused = r["sparse_grads"]
        torch.testing.assert_close(used_by_both, torch.full((2, 2), 1.5))  # mean of 1 and 2
        torch.testing.assert_close(used_by_rank1, torch.full((2, 2), 1.0))  # (0 + 2) / 2
        assert unused is None, rank
    # Each rank trained its own copy on its own rows: the averaged gradients kept them equal.
    for a, b in zip(results[0]["plain_params"], results[1]["plain_params"], strict=True):
        assert torch.equal(a, b)
