"""SftTrainer on a real (tiny, unsharded) HF model in one process: its loss is the
cross-entropy of the target tokens, padded and packed passes agree, the micro-batch size does
not change the step, and the stage's end leaves a fresh optimizer at the RL learning rate."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from hybrid.data import write_rows
from hybrid.data.batch import Batch
from hybrid.data.sft import SftDataset
from hybrid.data.sft_loader import sft_batch
from hybrid.models import TinyModelConfig, build_tiny_model, load_tokenizer
from hybrid.workers.forward import PassConfig
from hybrid.workers.sft import SftTrainer, reset_optimizer, set_learning_rate

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    preset = TinyModelConfig.preset("tiny", dtype="float32")
    return build_tiny_model(tmp_path_factory.mktemp("m"), preset, seed=0)


@pytest.fixture(scope="module")
def model(model_dir: Path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)


@pytest.fixture(scope="module")
def batch(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Batch:
    rows = [
        {"prompt": [{"role": "user", "content": "1+2="}], "response": "3"},
        {"prompt": [{"role": "user", "content": "a longer question"}], "response": "an answer"},
        {
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "yo"},
                {"role": "user", "content": "again"},
                {"role": "assistant", "content": "no"},
            ]
        },
        {"prompt": [{"role": "user", "content": "q"}], "response": "x"},
    ]
    path = write_rows(rows, tmp_path_factory.mktemp("d") / "sft.jsonl")
    data = SftDataset(path, load_tokenizer(model_dir), 128)
    return sft_batch(data.rows, data.pad_token_id)


def step(
    model: torch.nn.Module, batch: Batch, passes: PassConfig, lr: float = 1e-2
) -> tuple[dict[str, float], torch.nn.Module]:
    fresh = copy.deepcopy(model)
    # SGD: the step is the gradient itself, so equal steps mean equal gradients.
    optimizer = torch.optim.SGD(fresh.parameters(), lr=lr)
    return SftTrainer(fresh, optimizer, passes, max_grad_norm=1e9).update(batch), fresh


def cross_entropy(model: torch.nn.Module, batch: Batch) -> float:
    """The mean negative log-likelihood of the target tokens, from the full logits."""
    t = batch.tensors
    with torch.no_grad():
        logits = model(input_ids=t["input_ids"], attention_mask=t["attention_mask"],
                       position_ids=t["position_ids"]).logits  # fmt: skip
    width = t["responses"].shape[1]
    # Position i predicts token i + 1: the response tokens are predicted from one step before.
    predicting = logits[:, -width - 1 : -1].log_softmax(-1)
    picked = predicting.gather(-1, t["responses"].unsqueeze(-1)).squeeze(-1)
    mask = t["response_mask"].bool()
    return float(-picked[mask].mean())


def test_the_loss_is_the_cross_entropy_of_the_targets(model: torch.nn.Module, batch: Batch) -> None:
    metrics, _ = step(model, batch, PassConfig(micro_batch_size=4, packed=False, chunk_tokens=0))
    assert metrics["sft/loss"] == pytest.approx(cross_entropy(model, batch), rel=1e-5)
    assert metrics["sft/tokens"] == float(batch["response_mask"].sum())
    assert metrics["sft/lr"] == 1e-2 and metrics["sft/step_applied"] == 1.0
    assert metrics["sft/grad_norm"] > 0


def test_packed_and_chunked_passes_give_the_padded_step(
    model: torch.nn.Module, batch: Batch
) -> None:
    padded, a = step(model, batch, PassConfig(micro_batch_size=4, packed=False, chunk_tokens=0))
    packed, b = step(model, batch, PassConfig(micro_batch_size=4, packed=True, chunk_tokens=16))
    assert packed["sft/loss"] == pytest.approx(padded["sft/loss"], rel=1e-5)
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.allclose(pa, pb, atol=1e-6)


@pytest.mark.parametrize(
    "passes", [PassConfig(micro_batch_size=1), PassConfig(micro_batch_size=3, max_tokens=60)]
)
def test_the_micro_batches_do_not_change_the_step(
    model: torch.nn.Module, batch: Batch, passes: PassConfig
) -> None:
    whole, a = step(model, batch, PassConfig(micro_batch_size=4))
    split, b = step(model, batch, passes)
    assert split["sft/loss"] == pytest.approx(whole["sft/loss"], rel=1e-5)
    changed = False
    for pa, pb, p0 in zip(a.parameters(), b.parameters(), model.parameters(), strict=True):
        assert torch.allclose(pa, pb, atol=1e-6)
        changed |= not torch.equal(pa, p0)
    assert changed  # the step moved the weights


def test_the_stage_end_leaves_a_fresh_optimizer_at_the_rl_rate(
    model: torch.nn.Module, batch: Batch
) -> None:
    fresh = copy.deepcopy(model)
    optimizer = torch.optim.AdamW(fresh.parameters(), lr=3e-4)
    trainer = SftTrainer(fresh, optimizer, PassConfig(micro_batch_size=4), max_grad_norm=1.0)
    set_learning_rate(optimizer, 1e-3)
    assert trainer.update(batch)["sft/lr"] == 1e-3
    assert optimizer.state  # Adam's moments after the step
    reset_optimizer(optimizer, 3e-4)
    assert not optimizer.state
    assert all(group["lr"] == 3e-4 for group in optimizer.param_groups)
    assert all(p.grad is None for p in fresh.parameters())
    # The next step starts the moments again: AdamW's step count restarts at 1.
    trainer.update(batch)
    assert {float(s["step"]) for s in optimizer.state.values()} == {1.0}


def test_missing_inputs_are_named(model: torch.nn.Module, batch: Batch) -> None:
    trainer = SftTrainer(model, torch.optim.SGD(model.parameters(), lr=0.0), PassConfig(4), 1.0)
    with pytest.raises(KeyError, match=r"sft_update needs batch keys \['response_mask'\]"):
        trainer.update(batch.select(["input_ids", "attention_mask", "position_ids", "responses"]))
