"""FSDP2 model build, training step, offload and sharded checkpoints on 2 gloo ranks (no Ray).

Each spawned run (`spawn_ranks`, 2 processes, one CPU thread each) does many checks
and writes its numbers to `result_rank{r}.pt`; the tests below assert on them in the parent.
A run's rendezvous and model build dominate its checks, so there are only two runs:
`first_run` (build, forward, train, offload, save) and the resumed run of the last test.
"""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor
from transformers import AutoModelForCausalLM

from hybrid.models import TinyModelConfig, build_tiny_model
from hybrid.sharding.gather import CoalescedGather
from hybrid.sharding.offload import (
    offload_optimizer,
    offload_params,
    onload_optimizer,
    onload_params,
)
from hybrid.workers.checkpoint import load_checkpoint, save_checkpoint
from hybrid.workers.fsdp import build_fsdp_model, build_optimizer, clip_and_step
from tests.integration.workers.gloo_ranks import spawn_ranks

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

CPU = torch.device("cpu")
# bf16 compute (FSDP) vs fp32 (HF) on the tiny model, whose logits reach ~1.4: measured max
# abs diffs are 5.3e-3 (bf16 checkpoint) and 6.5e-3 (fp32 checkpoint).
LOGITS_ATOL = 2e-2
MAX_GRAD_NORM = 1.0
VOCAB = 272  # the tiny model's "text" vocabulary
OPTIM_KWARGS: dict[str, Any] = {
    "lr": 1e-3,
    "weight_decay": 0.01,
    "betas": (0.9, 0.999),
    "eps": 1e-8,
}


# --- spawned side -------------------------------------------------------------------------


def _batch(step: int, rank: int) -> torch.Tensor:
    """A deterministic (batch=2, seq=16) batch of token ids for `step` on `rank`."""
    generator = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randint(0, VOCAB, (2, 16), generator=generator)


def _loss(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    logits = model(ids).logits.float()  # (batch, seq, vocab)
    return F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())


def _train_step(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, step: int, rank: int
) -> tuple[float, float, bool]:
    loss = _loss(model, _batch(step, rank))
    loss.backward()
    norm, applied = clip_and_step(model, optimizer, MAX_GRAD_NORM)
    return loss.item(), norm, applied


def _full_params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.full_tensor().detach().clone() for n, p in model.named_parameters()}


def _state_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [v for state in optimizer.state.values() for v in state.values()]


def _seed_all(seed: int) -> None:
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)


def _rng_draws() -> tuple[torch.Tensor, float, float]:
    return torch.rand(4), random.random(), float(np.random.rand())


def _check_build(rank: int, mesh: DeviceMesh, model_dir: Path) -> dict[str, Any]:
    """Exact weights, tie, RoPE buffers and logits of one model vs the checkpoint and HF."""
    model = build_fsdp_model(str(model_dir), mesh, CPU)
    reference = load_file(model_dir / "model.safetensors")
    full = _full_params(model)
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    ids = _batch(0, 0)
    with torch.no_grad():
        logits = model(ids).logits
        hf_logits = hf(ids).logits
    rotary, hf_rotary = model.model.rotary_emb, hf.model.rotary_emb
    head_weight = model.lm_head.weight
    return {
        "coalesced_exact": _coalesced_gathers_are_exact(model, mesh),
        "names": sorted(full),
        "checkpoint_names": sorted(reference),
        "mismatched": sorted(
            n
            for n, t in full.items()
            if not torch.equal(t, reference.get(n, reference["model.embed_tokens.weight"]).float())
        ),
        "dtypes": {str(p.dtype) for p in model.parameters()},
        "all_sharded": all(
            isinstance(p, DTensor) and p.placements == (Shard(0),) for p in model.parameters()
        ),
        "head_is_embedding": head_weight is model.model.embed_tokens.weight,
        "head_is_dtensor": isinstance(head_weight, DTensor),
        "head_equals_checkpoint": torch.equal(
            head_weight.full_tensor(),
            reference.get("lm_head.weight", reference["model.embed_tokens.weight"]).float(),
        ),
        "inv_freq_equal": torch.equal(rotary.inv_freq, hf_rotary.inv_freq)
        and torch.equal(rotary.original_inv_freq, hf_rotary.original_inv_freq),
        "logits_dtype": str(logits.dtype),
        "logits_max_diff": (logits.float() - hf_logits).abs().max().item(),
        "logits_max_abs": hf_logits.abs().max().item(),
    }


def _coalesced_gathers_are_exact(model: torch.nn.Module, mesh: DeviceMesh) -> bool:
    """Coalesced all-gathers, two in flight at once and finished out of order, give the
    bf16 full tensors bit for bit: model parameters, an uneven shard (5 rows on 2 ranks) and
    a plain tensor."""
    generator = torch.Generator().manual_seed(7)
    odd = distribute_tensor(torch.randn(5, 3, generator=generator), mesh, [Shard(0)])
    named = [*model.named_parameters(), ("odd", odd), ("plain", torch.ones(2, 2))]
    first, second = named[: len(named) // 2], named[len(named) // 2 :]
    in_flight = [CoalescedGather(first, torch.bfloat16), CoalescedGather(second, torch.bfloat16)]
    gathered = (
        in_flight[1].result()
        + in_flight[0].result()
        + CoalescedGather(named, torch.bfloat16).result()
    )
    expected = {
        name: (p.full_tensor() if isinstance(p, DTensor) else p).detach().to(torch.bfloat16)
        for name, p in named
    }
    return len(gathered) == 2 * len(named) and all(
        torch.equal(t, expected[name]) for name, t in gathered
    )


def _first_run(rank: int, mesh: DeviceMesh, dirs: dict[str, Path], ckpt: Path) -> dict[str, Any]:
    result: dict[str, Any] = {
        "build": {name: _check_build(rank, mesh, d) for name, d in dirs.items()}
    }
    tied = str(dirs["tied"])

    # Bad inputs fail on every rank before any collective.
    for key, kwargs in {
        "flash_error": {"attn_implementation": "flash_attention_2"},
        "bad_keys_error": {},
    }.items():
        try:
            path = str(dirs["tied"].parent / "bad_keys") if key == "bad_keys_error" else tied
            build_fsdp_model(path, mesh, CPU, **kwargs)
            result[key] = None
        except ValueError as e:
            result[key] = str(e)

    ref = build_fsdp_model(tied, mesh, CPU, trainable=False)
    result["ref_requires_grad"] = [n for n, p in ref.named_parameters() if p.requires_grad]
    result["ref_training"] = ref.training

    # Training: a few steps change the parameters; a NaN loss is skipped.
    model = build_fsdp_model(tied, mesh, CPU)
    optimizer = build_optimizer(model, **OPTIM_KWARGS)
    before = _full_params(model)
    result["steps"] = [_train_step(model, optimizer, step, rank) for step in range(3)]
    after = _full_params(model)
    result["unchanged_after_steps"] = [n for n in before if torch.equal(before[n], after[n])]
    (_loss(model, _batch(9, rank)) * float("nan")).backward()
    result["nan_step"] = clip_and_step(model, optimizer, MAX_GRAD_NORM)
    result["changed_by_nan_step"] = [
        n for n, t in _full_params(model).items() if not torch.equal(t, after[n])
    ]
    result["grads_after_step"] = [n for n, p in model.named_parameters() if p.grad is not None]

    # Gradient checkpointing recomputes the same forward: same loss and gradient norm.
    plain = build_fsdp_model(tied, mesh, CPU)
    ckpt_model = build_fsdp_model(tied, mesh, CPU, gradient_checkpointing=True)
    result["grad_ckpt"] = [
        _train_step(m, build_optimizer(m, **OPTIM_KWARGS), 0, rank)[:2] for m in (plain, ckpt_model)
    ]

    # Offload on CPU: no-ops that keep the same tensors and values.
    params = {n: p for n, p in model.named_parameters()}
    values = _full_params(model)
    moments = _state_tensors(optimizer)
    offload_params(model)
    offload_optimizer(optimizer)
    onload_params(model, CPU)
    onload_optimizer(optimizer, CPU)
    result["offload_same_objects"] = all(
        p is params[n] for n, p in model.named_parameters()
    ) and all(a is b for a, b in zip(moments, _state_tensors(optimizer), strict=True))
    result["offload_changed"] = [
        n for n, t in _full_params(model).items() if not torch.equal(t, values[n])
    ]

    # Checkpoint: save at step 0, overwrite at step 1, then record steps 2 and 3. Seeded per
    # rank so that the RNG states saved differ between ranks and from a fresh process's.
    _seed_all(100 + rank)
    model = build_fsdp_model(tied, mesh, CPU)
    optimizer = build_optimizer(model, **OPTIM_KWARGS)
    save_checkpoint(ckpt, model, optimizer, extra={"step": 0})
    _train_step(model, optimizer, 1, rank)
    save_checkpoint(ckpt, model, optimizer, extra={"step": 1})
    result["rng_after_save"] = _rng_draws()
    result["resumed_losses"] = [_train_step(model, optimizer, s, rank)[0] for s in (2, 3)]
    result["params_after_step3"] = _full_params(model)
    return result


def _resumed_run(rank: int, mesh: DeviceMesh, model_dir: Path, ckpt: Path) -> dict[str, Any]:
    model = build_fsdp_model(str(model_dir), mesh, CPU)
    optimizer = build_optimizer(model, **OPTIM_KWARGS)
    _seed_all(0)  # load_checkpoint must overwrite this
    extra = load_checkpoint(ckpt, model, optimizer)
    rng = _rng_draws()
    losses = [_train_step(model, optimizer, s, rank)[0] for s in (2, 3)]
    return {
        "extra": extra,
        "rng_after_load": rng,
        "resumed_losses": losses,
        "params_after_step3": _full_params(model),
    }


# --- parent side ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    tied = build_tiny_model(root / "tied", TinyModelConfig.preset("tiny"), seed=0)
    untied_config = TinyModelConfig.preset("tiny", tie_word_embeddings=False, dtype="float32")
    untied = build_tiny_model(root / "untied", untied_config, seed=1)
    # A broken copy of the tied checkpoint: one key renamed.
    bad = build_tiny_model(root / "bad_keys", TinyModelConfig.preset("tiny"), seed=0)
    weights = load_file(bad / "model.safetensors")
    weights["model.norm.wrong"] = weights.pop("model.norm.weight")
    save_file(weights, bad / "model.safetensors", metadata={"format": "pt"})
    return {"tied": tied, "untied": untied}


@pytest.fixture(scope="module")
def first_run(
    model_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> tuple[list[dict[str, Any]], Path]:
    out = tmp_path_factory.mktemp("first_run")
    ckpt = out / "checkpoints" / "step_1"
    return spawn_ranks(_first_run, out, model_dirs, ckpt), ckpt


@pytest.mark.parametrize("variant", ["tied", "untied"])
def test_weights_tie_and_rope_buffers(first_run: tuple[list[dict], Path], variant: str) -> None:
    for result in first_run[0]:
        build = result["build"][variant]
        assert build["mismatched"] == []
        assert build["dtypes"] == {"torch.float32"}
        assert build["all_sharded"]
        assert build["coalesced_exact"]
        assert build["head_is_dtensor"] and build["head_equals_checkpoint"]
        assert build["inv_freq_equal"]
        if variant == "tied":
            assert build["head_is_embedding"]
            assert "lm_head.weight" not in build["checkpoint_names"]
            assert "lm_head.weight" not in build["names"]  # one parameter, listed once
        else:
            assert not build["head_is_embedding"]
            assert build["names"] == build["checkpoint_names"]


@pytest.mark.parametrize("variant", ["tied", "untied"])
def test_logits_match_hf_fp32(first_run: tuple[list[dict], Path], variant: str) -> None:
    for result in first_run[0]:
        build = result["build"][variant]
        print(
            f"{variant}: max |logits diff| {build['logits_max_diff']:.2e}, "
            f"max |logit| {build['logits_max_abs']:.2e}"
        )
        assert build["logits_dtype"] == "torch.bfloat16"
        assert build["logits_max_diff"] < LOGITS_ATOL


def test_bad_inputs_raise_on_every_rank(first_run: tuple[list[dict], Path]) -> None:
    for result in first_run[0]:
        if importlib.util.find_spec("flash_attn") is None:
            assert "attn_implementation" in result["flash_error"]
            assert ".[flash]" in result["flash_error"]  # the fix: the optional extra
        assert "model.norm.weight" in result["bad_keys_error"]
        assert "model.norm.wrong" in result["bad_keys_error"]


def test_reference_policy_is_frozen(first_run: tuple[list[dict], Path]) -> None:
    for result in first_run[0]:
        assert result["ref_requires_grad"] == []
        assert result["ref_training"] is False


def test_steps_update_and_nan_step_is_skipped(first_run: tuple[list[dict], Path]) -> None:
    results = first_run[0]
    for result in results:
        for _, norm, applied in result["steps"]:
            assert np.isfinite(norm) and applied
        assert result["unchanged_after_steps"] == []
        norm, applied = result["nan_step"]
        assert not np.isfinite(norm) and applied is False
        assert result["changed_by_nan_step"] == []
        assert result["grads_after_step"] == []
        (plain_loss, plain_norm), (ckpt_loss, ckpt_norm) = result["grad_ckpt"]
        assert ckpt_loss == plain_loss
        assert ckpt_norm == pytest.approx(plain_norm, rel=1e-5)
    # The norm is all-reduced: every rank sees the same one.
    assert [s[1] for s in results[0]["steps"]] == [s[1] for s in results[1]["steps"]]


def test_offload_on_cpu_is_a_no_op(first_run: tuple[list[dict], Path]) -> None:
    for result in first_run[0]:
        assert result["offload_same_objects"]
        assert result["offload_changed"] == []


def test_checkpoint_resume_is_bit_exact(
    first_run: tuple[list[dict], Path], model_dirs: dict[str, Path], tmp_path: Path
) -> None:
    first, ckpt = first_run
    assert ckpt.is_dir()
    assert sorted(p.name for p in ckpt.parent.iterdir()) == [ckpt.name]  # no .tmp or .old left
    assert sorted(p.name for p in ckpt.glob("rng_rank*.pt")) == ["rng_rank0.pt", "rng_rank1.pt"]
    with pytest.raises(FileNotFoundError, match="missing"):
        load_checkpoint(tmp_path / "missing", torch.nn.Linear(1, 1), None)

    resumed = spawn_ranks(_resumed_run, tmp_path / "resumed", model_dirs["tied"], ckpt)
    for before, after in zip(first, resumed, strict=True):
        assert after["extra"] == {"step": 1}
        assert after["resumed_losses"] == before["resumed_losses"]  # bit for bit
        for name, tensor in before["params_after_step3"].items():
            assert torch.equal(after["params_after_step3"][name], tensor), name
        for a, b in zip(after["rng_after_load"], before["rng_after_save"], strict=True):
            assert torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b
    # Each rank got its own RNG state back, not rank 0's.
    assert not torch.equal(resumed[0]["rng_after_load"][0], resumed[1]["rng_after_load"][0])
