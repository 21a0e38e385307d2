"""The critic's passes (hybrid.workers.value) on a real (tiny, unsharded) value model in one
process: the value of a response token is read from the state before it, the packed, padded
and token-budget layouts agree, padding gets 0, the micro-batch size does not change the
step, updates fit the returns, the value clip takes effect, the warm-up schedule, and missing
inputs are named."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoConfig, AutoModelForTokenClassification

from hybrid.data import Batch
from hybrid.data.sample import position_ids_from_mask
from hybrid.models import TinyModelConfig, build_tiny_model
from hybrid.workers.config import CriticConfig, CriticOptimConfig, WorkerSpec
from hybrid.workers.forward import PassConfig
from hybrid.workers.fsdp import warmup_scheduler
from hybrid.workers.value import ValueTrainer, compute_values

pytestmark = pytest.mark.unit

NO_CLIP = CriticOptimConfig(max_grad_norm=1e9)
"""The optimizer config of tests that compare steps: no gradient clipping."""

PROMPT, RESPONSE = 3, 4


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> torch.nn.Module:
    path = build_tiny_model(
        tmp_path_factory.mktemp("m"), TinyModelConfig.preset("tiny", dtype="float32"), seed=0
    )
    # As hybrid.workers.fsdp builds a critic: one label, no dropout on the value head.
    config = AutoConfig.from_pretrained(path)
    config.num_labels = 1
    config.classifier_dropout = 0.0
    torch.manual_seed(0)  # the value head is not in the checkpoint: a seeded init
    return AutoModelForTokenClassification.from_pretrained(path, config=config, dtype=torch.float32)


def _batch(rows: int = 4) -> Batch:
    """test_policy's batch (row 0: two response tokens, then padding) with old values and
    returns of the critic."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 200, (rows, PROMPT + RESPONSE), generator=g)
    mask = torch.ones_like(ids)
    response_mask = torch.ones((rows, RESPONSE), dtype=torch.long)
    response_mask[0, 2:] = 0
    mask[0, PROMPT + 2 :] = 0
    return Batch.from_dict(
        {
            "input_ids": ids,
            "attention_mask": mask,
            "position_ids": position_ids_from_mask(mask),
            "responses": ids[:, PROMPT:],
            "response_mask": response_mask,
            "values": 0.1 * torch.randn((rows, RESPONSE), generator=g) * response_mask,
            "returns": torch.randn((rows, RESPONSE), generator=g) * response_mask,
        }
    )


def _with(batch: Batch, **tensors: torch.Tensor) -> Batch:
    """`batch` with some tensors replaced."""
    kept = [key for key in batch.keys() if key not in tensors]  # noqa: SIM118 (a Batch)
    return batch.select(kept).union(Batch.from_dict(tensors))


def _update(
    model: torch.nn.Module,
    config: CriticConfig,
    batch: Batch,
    lr: float = 1e-2,
    spec: WorkerSpec | None = None,
) -> tuple[dict[str, float], torch.nn.Module]:
    fresh = copy.deepcopy(model)
    # SGD: the step is the gradient itself (AdamW would blow rounding noise up to lr-sized steps).
    optimizer = torch.optim.SGD(fresh.parameters(), lr=lr)
    passes = PassConfig(micro_batch_size=config.micro_batch_size)
    scheduler = warmup_scheduler(optimizer, 0)
    trainer = ValueTrainer(fresh, optimizer, scheduler, config, spec or WorkerSpec(), passes)
    return trainer.update(batch), fresh


def _same_step(a: torch.nn.Module, b: torch.nn.Module, atol: float = 1e-6) -> bool:
    return all(
        torch.allclose(pa, pb, atol=atol)
        for pa, pb in zip(a.parameters(), b.parameters(), strict=True)
    )


def _value_loss(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """0.5 x the mean squared error over the valid tokens (the unclipped token-mean loss)."""
    keep = mask.bool()
    return float(0.5 * (values[keep] - returns[keep]).square().mean())


@torch.no_grad()
def test_a_token_s_value_is_read_from_the_state_before_it(model: torch.nn.Module) -> None:
    batch = _batch()
    values = compute_values(model, batch, PassConfig(micro_batch_size=4))
    assert values.shape == (4, RESPONSE) and values.dtype == torch.float32
    ids, mask = batch.tensors["input_ids"], batch.tensors["attention_mask"]
    for row in range(4):
        length = int(mask[row].sum())
        # the row alone, without padding: response token t is predicted at PROMPT - 1 + t
        logits = model(input_ids=ids[row : row + 1, :length]).logits[0, :, 0]
        valid = length - PROMPT
        torch.testing.assert_close(
            values[row, :valid], logits[PROMPT - 1 : PROMPT - 1 + valid], atol=1e-5, rtol=1e-4
        )


@pytest.mark.parametrize(
    "passes",
    [
        PassConfig(micro_batch_size=1, packed=False),
        PassConfig(micro_batch_size=4, packed=False),
        PassConfig(micro_batch_size=3, packed=True),
        PassConfig(micro_batch_size=4, packed=True, max_tokens=14),
    ],
    ids=["padded rows of 1", "padded rows of 4", "packed rows of 3", "packed token budget"],
)
def test_packed_and_padded_passes_give_the_same_values(
    model: torch.nn.Module, passes: PassConfig
) -> None:
    batch = _batch()
    reference = compute_values(model, batch, PassConfig(micro_batch_size=4, packed=True))
    torch.testing.assert_close(compute_values(model, batch, passes), reference, atol=1e-5, rtol=0)


def test_values_are_zero_where_the_response_mask_is_zero(model: torch.nn.Module) -> None:
    batch = _batch()
    for packed in (True, False):
        values = compute_values(model, batch, PassConfig(micro_batch_size=2, packed=packed))
        assert values[0, 2:].tolist() == [0.0, 0.0]  # row 0's padding
        assert (values[batch.tensors["response_mask"].bool()] != 0).all()


def test_micro_batch_size_does_not_change_the_step(model: torch.nn.Module) -> None:
    # Row 0 has 2 response tokens, the others 4: a per-micro-batch mean would weight them
    # differently from the mini-batch's token mean.
    whole, a = _update(model, CriticConfig(micro_batch_size=4, optim=NO_CLIP), _batch())
    split, b = _update(model, CriticConfig(micro_batch_size=1, optim=NO_CLIP), _batch())
    assert whole["critic/vf_loss"] == pytest.approx(split["critic/vf_loss"], abs=1e-6)
    assert whole["critic/grad_norm"] == pytest.approx(split["critic/grad_norm"], rel=1e-4)
    assert whole["critic/vpred_mean"] == pytest.approx(split["critic/vpred_mean"], abs=1e-6)
    assert whole["critic/grad_norm"] > 0 and whole["critic/step_applied"] == 1.0
    assert not _same_step(model, a)  # the step moved the critic ...
    assert _same_step(a, b)  # ... by the same amount


def test_the_first_loss_is_the_hand_computed_value_loss(model: torch.nn.Module) -> None:
    batch = _batch()
    values = compute_values(model, batch, PassConfig(micro_batch_size=4))
    # old values = the current ones: nothing to clip, the loss is 0.5 x the token-mean MSE
    metrics, _ = _update(model, CriticConfig(micro_batch_size=2), _with(batch, values=values))
    mask, returns = batch.tensors["response_mask"], batch.tensors["returns"]
    assert metrics["critic/vf_loss"] == pytest.approx(_value_loss(values, returns, mask), rel=1e-5)
    assert metrics["critic/vpred_mean"] == pytest.approx(
        float(values[mask.bool()].mean()), rel=1e-5
    )
    assert metrics["critic/vf_clipfrac"] == 0.0


def test_a_few_updates_fit_the_returns(model: torch.nn.Module) -> None:
    batch = _batch()
    mask, returns = batch.tensors["response_mask"], batch.tensors["returns"]
    critic = copy.deepcopy(model)
    optimizer = torch.optim.AdamW(critic.parameters(), lr=1e-2)
    passes = PassConfig(micro_batch_size=2)
    config = CriticConfig(micro_batch_size=2, cliprange_value=10.0)
    scheduler = warmup_scheduler(optimizer, 0)
    trainer = ValueTrainer(critic, optimizer, scheduler, config, WorkerSpec(), passes)
    before = _value_loss(compute_values(critic, batch, passes), returns, mask)
    losses = []
    for _ in range(8):
        old = compute_values(critic, batch, passes)  # as PPO: the values at rollout time
        losses.append(trainer.update(_with(batch, values=old))["critic/vf_loss"])
    after = _value_loss(compute_values(critic, batch, passes), returns, mask)
    assert losses[0] == pytest.approx(before, rel=1e-5)
    assert after < 0.5 * before, (before, losses, after)


def test_the_clipped_branch_stops_the_gradient(model: torch.nn.Module) -> None:
    batch = _batch()
    current = compute_values(model, batch, PassConfig(micro_batch_size=4))
    mask = batch.tensors["response_mask"]
    # Old values 1 below the current ones, returns 10 above: V - V_old = 1 > the clip 1e-3,
    # so V_clip = V_old + 1e-3 = V - 0.999 is farther from R than V on every valid token.
    far = _with(batch, values=(current - 1.0) * mask, returns=(current + 10.0) * mask)
    clipped, a = _update(model, CriticConfig(micro_batch_size=2, cliprange_value=1e-3), far)
    assert clipped["critic/vf_clipfrac"] == 1.0
    # 0.5 x (10.999)^2 on every token; the clipped branch is constant in V: no gradient
    assert clipped["critic/vf_loss"] == pytest.approx(0.5 * 10.999**2, rel=1e-4)
    assert clipped["critic/grad_norm"] == 0.0
    assert _same_step(model, a, atol=0.0)
    # A wide clip leaves the branch alone: 0.5 x 10^2, and a step
    wide, b = _update(model, CriticConfig(micro_batch_size=2, cliprange_value=100.0), far)
    assert wide["critic/vf_clipfrac"] == 0.0
    assert wide["critic/vf_loss"] == pytest.approx(0.5 * 10.0**2, rel=1e-4)
    assert wide["critic/grad_norm"] > 0 and not _same_step(model, b)


def test_a_tiny_clip_clips_once_the_values_have_moved(model: torch.nn.Module) -> None:
    batch = _batch()
    old = compute_values(model, batch, PassConfig(micro_batch_size=4))
    mask = batch.tensors["response_mask"]
    far = _with(batch, values=old, returns=(old + 10.0) * mask)
    # One epoch: the values are the old ones, nothing to clip.
    one = CriticConfig(micro_batch_size=2, cliprange_value=1e-3, ppo_epochs=1)
    assert _update(model, one, far, lr=0.1)[0]["critic/vf_clipfrac"] == 0.0
    # Two: the first moves every value towards the returns by more than 1e-3, so the second
    # finds them all outside the clip range (clip fraction 0, then 1: mean 0.5).
    two = CriticConfig(micro_batch_size=2, cliprange_value=1e-3, ppo_epochs=2)
    got, _ = _update(model, two, far, lr=0.1)
    assert got["critic/vf_clipfrac"] > 0
    assert got["critic/vf_clipfrac"] == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("warmup_steps", "factors"),
    [
        (4, [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]),
        (1, [1.0, 1.0, 1.0]),
        (0, [1.0, 1.0, 1.0]),
    ],
)
def test_warmup_scheduler(warmup_steps: int, factors: list[float]) -> None:
    parameter = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([parameter], lr=2.0)
    scheduler = warmup_scheduler(optimizer, warmup_steps)
    seen = []
    for _ in factors:
        seen.append(optimizer.param_groups[0]["lr"])  # the lr of the next optimizer step
        optimizer.step()
        scheduler.step()
    assert seen == pytest.approx([2.0 * f for f in factors])


def test_the_lr_metric_follows_the_warmup(model: torch.nn.Module) -> None:
    critic = copy.deepcopy(model)
    optimizer = torch.optim.SGD(critic.parameters(), lr=1e-3)
    config = CriticConfig(micro_batch_size=4, optim=CriticOptimConfig(lr_warmup_steps=4))
    scheduler = warmup_scheduler(optimizer, config.optim.lr_warmup_steps)
    passes = PassConfig(micro_batch_size=4)
    trainer = ValueTrainer(critic, optimizer, scheduler, config, WorkerSpec(), passes)
    # one optimizer step per update; the metric is the lr after the scheduler's step
    lrs = [trainer.update(_batch())["critic/lr"] for _ in range(2)]
    assert lrs == pytest.approx([0.5e-3, 0.75e-3])


def test_missing_inputs_are_named(model: torch.nn.Module) -> None:
    batch = _batch()
    keys = list(batch.keys())
    without_targets = batch.select([k for k in keys if k not in ("values", "returns")])
    with pytest.raises(KeyError, match=r"\['values', 'returns'\]"):
        _update(model, CriticConfig(), without_targets)
    with pytest.raises(KeyError, match=r"\['response_mask'\]"):
        _update(model, CriticConfig(), batch.select([k for k in keys if k != "response_mask"]))


def test_rows_that_do_not_split_into_mini_batches_are_refused(model: torch.nn.Module) -> None:
    with pytest.raises(ValueError, match="4 rows per rank do not split into mini-batches of 3"):
        _update(model, CriticConfig(), _batch(), spec=WorkerSpec(mini_batch_rows=3))
