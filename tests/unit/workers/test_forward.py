"""Packed vs padded forward passes, chunked vs full-logit scores, token-budget micro-batches:
the same log-probs, entropies and gradients on a real (tiny, unsharded) HF model."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from hybrid.data import Batch
from hybrid.data.sample import Sample, SampleStatus, samples_to_batch
from hybrid.models import TinyModelConfig, build_tiny_model
from hybrid.workers import varlen_attention
from hybrid.workers.forward import PassConfig, score_micro_batch, score_responses
from hybrid.workers.packing import packed_inputs

pytestmark = pytest.mark.unit

PADDED_FULL = PassConfig(micro_batch_size=3, packed=False, chunk_tokens=0)
VARIANTS = {
    "packed, full logits": PassConfig(micro_batch_size=3, packed=True, chunk_tokens=0),
    "padded, chunked": PassConfig(micro_batch_size=3, packed=False, chunk_tokens=5),
    "packed, chunked": PassConfig(micro_batch_size=3, packed=True, chunk_tokens=5),
    "packed, chunked, token budget": PassConfig(
        micro_batch_size=3, packed=True, chunk_tokens=7, max_tokens=24
    ),
}


def tiny_model(root: object, dtype: str) -> torch.nn.Module:
    path = build_tiny_model(root, TinyModelConfig.preset("tiny", dtype=dtype), seed=0)  # type: ignore[arg-type]
    return AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype))


@pytest.fixture(scope="module")
def fp32_model(tmp_path_factory: pytest.TempPathFactory) -> torch.nn.Module:
    return tiny_model(tmp_path_factory.mktemp("fp32"), "float32")


def ragged_batch(rows: int = 6, prompt: int = 7, response: int = 6, seed: int = 0) -> Batch:
    """Rows as a rollout delivers them (hybrid.data.sample): prompts of 1..`prompt`
    tokens left-padded, responses of 1..`response` tokens right-padded, pad id 0."""
    g = torch.Generator().manual_seed(seed)

    def tokens(longest: int) -> list[int]:
        length = int(torch.randint(1, longest + 1, (1,), generator=g))
        return torch.randint(5, 200, (length,), generator=g).tolist()

    samples = [
        Sample(
            uid=str(i),
            index=0,
            prompt_ids=tokens(prompt),
            response_ids=ids,
            rollout_log_probs=[0.0] * len(ids),
            versions=[0] * len(ids),
            status=SampleStatus.COMPLETED,
        )
        for i, ids in enumerate(tokens(response) for _ in range(rows))
    ]
    return samples_to_batch(samples, response, pad_token_id=0, prompt_width=prompt)


def test_packed_inputs_keep_only_valid_tokens_and_restart_positions() -> None:
    batch = ragged_batch()
    inputs = packed_inputs(batch)
    mask = batch.tensors["attention_mask"]
    assert inputs.input_ids.shape == (1, int(mask.sum()))
    starts = (inputs.position_ids[0] == 0).nonzero().flatten()
    assert len(starts) == len(batch)  # one sequence per row
    assert torch.equal(
        inputs.labels, batch.tensors["responses"][batch.tensors["response_mask"].bool()]
    )
    # Each scored state sits just before its label in the packed stream.
    assert torch.equal(inputs.input_ids[0, inputs.score_index + 1], inputs.labels)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_log_probs_and_entropy_match_the_padded_full_logits(
    fp32_model: torch.nn.Module, variant: str
) -> None:
    batch = ragged_batch()
    mask = batch.tensors["response_mask"].bool()
    reference = score_responses(fp32_model, batch, PADDED_FULL, with_entropy=True)
    got = score_responses(fp32_model, batch, VARIANTS[variant], with_entropy=True)
    for key in ("log_probs", "entropy"):
        diff = (got[key] - reference[key])[mask].abs().max().item()
        print(f"{variant}: fp32 max |{key} diff| {diff:.2e}")
        assert diff < 1e-5, key
        assert torch.all(got[key][~mask] == 0)


def _gradients(model: torch.nn.Module, batch: Batch, config: PassConfig) -> dict[str, torch.Tensor]:
    model.zero_grad()
    weights = torch.linspace(-1, 1, batch.tensors["responses"].numel()).view_as(
        batch.tensors["responses"]
    )
    scores = score_micro_batch(model, batch, config, with_entropy=True)
    assert scores.entropy is not None
    ((scores.log_probs * weights).sum() + 0.3 * scores.entropy.sum()).backward()
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("variant", ["packed, full logits", "padded, chunked", "packed, chunked"])
def test_gradients_match_the_padded_full_logits(fp32_model: torch.nn.Module, variant: str) -> None:
    batch = ragged_batch()
    reference = _gradients(fp32_model, batch, PADDED_FULL)
    got = _gradients(fp32_model, batch, VARIANTS[variant])
    assert got.keys() == reference.keys()
    worst = max((got[n] - reference[n]).abs().max().item() for n in reference)
    scale = max(reference[n].abs().max().item() for n in reference)
    print(f"{variant}: fp32 max |grad diff| {worst:.2e} (max |grad| {scale:.2e})")
    assert worst < 1e-5 * max(scale, 1.0)


def test_bf16_packed_chunked_figure(tmp_path_factory: pytest.TempPathFactory) -> None:
    model = tiny_model(tmp_path_factory.mktemp("bf16"), "bfloat16")
    batch = ragged_batch()
    mask = batch.tensors["response_mask"].bool()
    reference = score_responses(model, batch, PADDED_FULL, with_entropy=False)["log_probs"]
    got = score_responses(model, batch, VARIANTS["packed, chunked"], with_entropy=False)
    diff = (got["log_probs"] - reference)[mask].abs().max().item()
    print(f"bf16 packed+chunked vs padded full logits: max |log-prob diff| {diff:.2e}")
    assert diff < 5e-2  # bf16 rounding of different kernels and reduction orders


def test_token_budget_errors_name_the_field(fp32_model: torch.nn.Module) -> None:
    config = PassConfig(
        micro_batch_size=3, max_tokens=4, budget_field="actor.ppo_max_token_len_per_gpu"
    )
    with pytest.raises(ValueError, match=r"actor\.ppo_max_token_len_per_gpu=4 is smaller than row"):
        score_responses(fp32_model, ragged_batch(), config, with_entropy=False)


def test_empty_prompt_is_an_error() -> None:
    batch = ragged_batch()
    prompt_width = batch.tensors["input_ids"].shape[1] - batch.tensors["responses"].shape[1]
    batch.tensors["attention_mask"][2, :prompt_width] = 0
    with pytest.raises(ValueError, match=r"rows \[2\] have an empty prompt"):
        packed_inputs(batch)


@pytest.mark.parametrize("dense_max_tokens", [0, 1024], ids=["per sequence", "one masked call"])
def test_varlen_attention_equals_the_dense_block_mask(
    fp32_model: torch.nn.Module,
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
    dense_max_tokens: int,
) -> None:
    """sdpa per packed sequence (or one call with our block mask, for short packs) ==
    sdpa with transformers' dense block-causal mask, values and gradients; padded inputs take
    the plain sdpa path (bit-identical)."""
    monkeypatch.setattr(varlen_attention, "DENSE_MAX_TOKENS", dense_max_tokens)
    monkeypatch.setattr(varlen_attention, "CPU_DENSE_MAX_MEAN_TOKENS", dense_max_tokens)
    path = build_tiny_model(
        tmp_path_factory.mktemp("varlen"), TinyModelConfig.preset("tiny", dtype="float32"), seed=0
    )
    varlen = AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation=varlen_attention.register()
    )
    batch = ragged_batch()
    packed = VARIANTS["packed, chunked"]
    dense = score_responses(fp32_model, batch, packed, with_entropy=True)
    split = score_responses(varlen, batch, packed, with_entropy=True)
    for key in ("log_probs", "entropy"):
        assert (dense[key] - split[key]).abs().max().item() < 1e-5, key
    padded = score_responses(varlen, batch, PADDED_FULL, with_entropy=True)
    reference = score_responses(fp32_model, batch, PADDED_FULL, with_entropy=True)
    assert torch.equal(padded["log_probs"], reference["log_probs"])
    dense_grads, split_grads = (
        _gradients(fp32_model, batch, packed),
        _gradients(varlen, batch, packed),
    )
    assert max((dense_grads[n] - split_grads[n]).abs().max().item() for n in dense_grads) < 1e-5


def test_a_cpu_takes_the_dense_call_only_for_very_short_sequences() -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    mean = varlen_attention.CPU_DENSE_MAX_MEAN_TOKENS
    assert varlen_attention.takes_dense_call(32 * mean, 32, cpu)
    assert not varlen_attention.takes_dense_call(32 * (mean + 1), 32, cpu)
    assert varlen_attention.takes_dense_call(32 * (mean + 1), 32, cuda)  # launches cost more
    over = varlen_attention.DENSE_MAX_TOKENS + 1
    assert not varlen_attention.takes_dense_call(over, over, cpu)
    assert not varlen_attention.takes_dense_call(over, 2, cuda)


def test_sequence_bounds_split_where_positions_restart() -> None:
    positions = torch.tensor([[0, 1, 2, 0, 1, 0, 0, 1, 2, 3]])
    assert varlen_attention.sequence_bounds(positions) == [(0, 3), (3, 5), (5, 6), (6, 10)]


@pytest.mark.parametrize("dense_max_tokens", [0, 1024], ids=["per sequence", "one masked call"])
def test_a_pass_reads_the_packed_bounds_once_not_per_layer(
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
    dense_max_tokens: int,
) -> None:
    """The bounds come off the device (a host sync on a GPU) on the first layer of a forward;
    the other layers reuse them, and the short pack's block mask, built once."""
    monkeypatch.setattr(varlen_attention, "DENSE_MAX_TOKENS", dense_max_tokens)
    monkeypatch.setattr(varlen_attention, "CPU_DENSE_MAX_MEAN_TOKENS", dense_max_tokens)
    config = TinyModelConfig.preset("tiny", dtype="float32")
    path = build_tiny_model(tmp_path_factory.mktemp("varlen_once"), config, seed=0)
    varlen = AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation=varlen_attention.register()
    )
    assert varlen.config.num_hidden_layers > 1
    reads = {"bounds": 0, "masks": 0}
    for name, key in (("bounds_from_cu_seqlens", "bounds"), ("sequence_bounds", "bounds")):
        original = getattr(varlen_attention, name)

        def counted(*args: Any, _original: Any = original, _key: str = key) -> Any:
            reads[_key] += 1
            return _original(*args)

        monkeypatch.setattr(varlen_attention, name, counted)
    block_mask = varlen_attention.PackedLayout.block_mask

    def counted_mask(layout: varlen_attention.PackedLayout, device: torch.device) -> torch.Tensor:
        reads["masks"] += device not in layout._masks
        return block_mask(layout, device)

    monkeypatch.setattr(varlen_attention.PackedLayout, "block_mask", counted_mask)
    variant = VARIANTS["packed, chunked"]
    score_responses(varlen, ragged_batch(), variant, with_entropy=True)
    micro_batches = 6 // variant.micro_batch_size  # the ragged batch's 6 rows
    assert reads["bounds"] == micro_batches
    assert reads["masks"] == (micro_batches if dense_max_tokens else 0)
