"""The toy engine's routing record (rollout.return_routed_experts) on the tiny Qwen3-MoE: the
experts of every token it ran, prompt first, equal to the model's routers on the whole
sequence; the same whether generated at once or stepped; samples_to_batch lays them out in the
padded rows with the positions that have a record marked; a dense model is refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from hybrid.data.sample import ROUTED_EXPERTS, ROUTED_EXPERTS_KNOWN, Sample, samples_to_batch
from hybrid.models import TinyModelConfig, build_tiny_model
from hybrid.models.routers import find_routers
from hybrid.rollout.base import Continuation
from hybrid.rollout.config import RolloutConfig
from hybrid.rollout.toy_engine import ToyEngine

pytestmark = pytest.mark.unit

PROMPT = [3, 5, 7, 2]
ROUTING = RolloutConfig(
    engine="toy", response_length=5, n=1, ignore_eos=True, return_routed_experts=True
)


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    config = TinyModelConfig.preset("tiny-moe", dtype="float32", initializer_range=0.1)
    return build_tiny_model(tmp_path_factory.mktemp("moe"), config, seed=0)


def _engine(model_dir: Path, config: RolloutConfig = ROUTING) -> ToyEngine:
    return ToyEngine(str(model_dir), config, torch.device("cpu"), "float32")


def test_the_record_is_the_routers_choice_over_the_whole_sequence(moe_dir: Path) -> None:
    (sample,) = _engine(moe_dir).generate([PROMPT], seeds=[1])
    routing = sample.routed_experts
    assert routing is not None and routing.dtype == torch.uint8
    ran = PROMPT + sample.token_ids[:-1]  # the last sampled token never runs
    model = AutoModelForCausalLM.from_pretrained(moe_dir, dtype=torch.float32).eval()
    chosen: dict[int, torch.Tensor] = {}
    for router in find_routers(model):
        router.module.register_forward_hook(
            lambda m, a, out, layer=router.layer: chosen.__setitem__(layer, out[2])
        )
    with torch.no_grad():
        model(input_ids=torch.tensor([ran]))
    expected = torch.stack([chosen[layer] for layer in sorted(chosen)], dim=1)
    assert routing.shape == (len(ran), 1, 2)
    assert torch.equal(routing.sort(-1).values.long(), expected.sort(-1).values)


def test_stepping_records_the_same_experts_at_the_finish(moe_dir: Path) -> None:
    engine = _engine(moe_dir)
    (whole,) = engine.generate([PROMPT], seeds=[1])
    engine.submit("r", Continuation(list(PROMPT), 5, seed=1))
    finals = []
    while engine.has_unfinished():
        for _, delta, finished in engine.step():
            assert (delta.routed_experts is not None) == finished
            if finished:
                finals.append(delta.routed_experts)
    assert len(finals) == 1 and torch.equal(finals[0], whole.routed_experts)


def test_samples_to_batch_places_the_record_and_marks_it(moe_dir: Path) -> None:
    (g,) = _engine(moe_dir).generate([PROMPT], seeds=[1])
    sample = Sample("u", 0, [9, *PROMPT], g.token_ids, g.log_probs, [0] * len(g.token_ids))
    sample.routed_experts = torch.cat([torch.zeros((1, 1, 2), dtype=torch.uint8), g.routed_experts])
    short = Sample("v", 0, PROMPT[:2], g.token_ids[:2], g.log_probs[:2], [0, 0])
    short.routed_experts = g.routed_experts[:3]
    batch = samples_to_batch([sample, short], response_length=6, pad_token_id=0)
    experts, known = batch.tensors[ROUTED_EXPERTS], batch.tensors[ROUTED_EXPERTS_KNOWN]
    assert experts.shape == (2, 5 + 6, 1, 2)
    # Row 0: prompt of 5 at columns 0-4, 5 response tokens at 5-9, the last one without a record.
    assert known[0].tolist() == [1] * 9 + [0, 0]
    assert torch.equal(experts[0, 1:9], g.routed_experts)
    # Row 1: a prompt of 2 left-padded to 5 (columns 3-4), then 2 response tokens (5-6).
    assert known[1].tolist() == [0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0]
    bad = Sample("w", 0, PROMPT, g.token_ids[:1], g.log_probs[:1], [0])
    bad.routed_experts = g.routed_experts  # more tokens than the sample has
    with pytest.raises(ValueError, match=r"sample w#0: routed_experts .* does not fit"):
        samples_to_batch([sample, bad], response_length=6, pad_token_id=0)


def test_a_dense_model_has_no_routing_to_return(tmp_path: Path) -> None:
    dense = build_tiny_model(tmp_path / "dense", TinyModelConfig.preset("tiny"))
    with pytest.raises(ValueError, match=r"rollout\.return_routed_experts: .* is a dense model"):
        _engine(dense)
