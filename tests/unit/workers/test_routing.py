"""MoE routing on the tiny Qwen3-MoE in one process: the router math, the record of the
old-log-prob pass (the same packed or padded), router replay (R2) in PolicyTrainer's update
(its own routing replayed takes the same step; a moved router is held to the recorded experts
and still learns; activation checkpointing's recomputation replays the same), the load
figures and the load-balancing loss."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM
from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

from hybrid.algorithms.moe_routing import (
    chosen_scores,
    load_balancing_loss,
    load_max_over_mean,
    routing_differs,
)
from hybrid.data import Batch
from hybrid.data.sample import ROUTED_EXPERTS
from hybrid.models import TinyModelConfig, build_tiny_model
from hybrid.models.routers import find_routers
from hybrid.workers.config import ActorConfig, OptimConfig, WorkerSpec
from hybrid.workers.forward import PassConfig, score_responses
from hybrid.workers.policy import PolicyTrainer
from hybrid.workers.routing import MoeRouting
from tests.unit.workers.test_policy import _batch

pytestmark = pytest.mark.unit

NO_CLIP = OptimConfig(max_grad_norm=1e9)
PACKED, PADDED = PassConfig(micro_batch_size=2), PassConfig(micro_batch_size=4, packed=False)


@pytest.fixture(scope="module")
def moe(tmp_path_factory: pytest.TempPathFactory) -> torch.nn.Module:
    path = build_tiny_model(
        tmp_path_factory.mktemp("moe"), TinyModelConfig.preset("tiny-moe", dtype="float32"), seed=0
    )
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


def _record(model: torch.nn.Module, batch: Batch, passes: PassConfig = PACKED) -> torch.Tensor:
    """The old-log-prob pass's routed_experts of `batch` under a copy of `model`."""
    scorer = copy.deepcopy(model)
    scored = score_responses(scorer, batch, passes, True, MoeRouting(find_routers(scorer)))
    return scored[ROUTED_EXPERTS]


def _update(
    model: torch.nn.Module, batch: Batch, **actor: object
) -> tuple[dict[str, float], torch.nn.Module]:
    """One SGD update of a copy of `model` with its routers hooked."""
    fresh = copy.deepcopy(model)
    optimizer = torch.optim.SGD(fresh.parameters(), lr=1e-2)
    config = ActorConfig(micro_batch_size=2, optim=NO_CLIP, **actor)  # type: ignore[arg-type]
    routing = MoeRouting(find_routers(fresh))
    trainer = PolicyTrainer(fresh, optimizer, config, WorkerSpec(), PACKED, routing=routing)
    return trainer.update(batch), fresh


def _max_step_gap(a: torch.nn.Module, b: torch.nn.Module) -> float:
    return max(
        (pa - pb).abs().max().item() for pa, pb in zip(a.parameters(), b.parameters(), strict=True)
    )


def _moved_router(model: torch.nn.Module) -> torch.nn.Module:
    """A copy whose routers are redrawn: most tokens pick other experts."""
    moved = copy.deepcopy(model)
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for router in find_routers(moved):
            weight = router.module.weight
            weight.copy_(torch.randn(weight.shape, generator=g) * weight.std() * 4)
    return moved


def test_the_router_math(moe: torch.nn.Module) -> None:
    router = find_routers(moe)[0]
    hidden = torch.randn(10, moe.config.hidden_size, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits, scores, experts = router.module(hidden)
    assert torch.allclose(chosen_scores(logits, experts, router.normalise), scores, atol=1e-7)
    a = torch.tensor([[0, 1], [2, 3], [1, 2]])
    b = torch.tensor([[1, 0], [2, 1], [1, 2]])
    assert routing_differs(a, b).tolist() == [False, True, False]
    counts = torch.tensor([[2, 2, 2, 2], [8, 0, 0, 0], [0, 0, 0, 0]])
    assert load_max_over_mean(counts).tolist() == [1.0, 4.0, 0.0]
    # 1.0 at a uniform spread; transformers' version is top_k times ours (it sums the k
    # slots' shares instead of averaging them).
    uniform = load_balancing_loss(torch.zeros(4, 4), torch.tensor([[0, 1], [2, 3]] * 2))
    assert uniform.item() == pytest.approx(1.0)
    ours = load_balancing_loss(logits, experts)
    theirs = load_balancing_loss_func((logits,), router.num_experts, router.top_k)
    assert ours.item() * router.top_k == pytest.approx(float(theirs), rel=1e-6)


def test_the_record_is_the_same_packed_or_padded(moe: torch.nn.Module) -> None:
    batch = _batch()
    packed, padded = _record(moe, batch, PACKED), _record(moe, batch, PADDED)
    routers = find_routers(moe)
    assert packed.shape == (4, 7, len(routers), routers[0].top_k)
    assert packed.dtype == torch.uint8
    valid = batch.tensors["attention_mask"].bool()
    assert torch.equal(packed[valid], padded[valid])
    assert not packed[~valid].any()  # padding keeps zeros
    assert len(packed[valid].unique()) > 1


def test_replaying_its_own_routing_takes_the_same_step(moe: torch.nn.Module) -> None:
    batch = _batch().union(Batch.from_dict({ROUTED_EXPERTS: _record(moe, _batch())}))
    plain, plain_model = _update(moe, batch)
    replayed, replayed_model = _update(moe, batch, router_replay="record")
    assert _max_step_gap(plain_model, replayed_model) < 1e-6
    assert replayed["actor/moe_routing_diff_frac"] == 0.0
    assert replayed["actor/moe_router_drift_frac"] == 0.0
    assert "actor/moe_routing_diff_frac" not in plain  # off: nothing recorded, nothing compared
    for metrics in (plain, replayed):
        assert metrics["actor/moe_load_max_over_mean"] >= 1.0
        assert metrics["actor/moe_load/layer_1"] == metrics["actor/moe_load_max_over_mean_max"]
        assert metrics["actor/moe_aux_loss"] > 0.0


def test_a_moved_router_is_held_to_the_recorded_experts_and_still_learns(
    moe: torch.nn.Module,
) -> None:
    batch = _batch().union(Batch.from_dict({ROUTED_EXPERTS: _record(moe, _batch())}))
    moved = _moved_router(moe)
    measured, _ = _update(moved, batch, router_replay="measure")
    replayed, replayed_model = _update(moved, batch, router_replay="record")
    assert measured["actor/moe_routing_diff_frac"] > 0.1
    assert measured["actor/moe_router_drift_frac"] == measured["actor/moe_routing_diff_frac"]
    assert measured["actor/moe_routing_diff_token_frac"] >= measured["actor/moe_routing_diff_frac"]
    assert replayed["actor/moe_routing_diff_frac"] == 0.0
    assert replayed["actor/moe_router_drift_frac"] == measured["actor/moe_router_drift_frac"]
    # The experts are the old pass's, the gate weights the live router's: the router learns.
    before = find_routers(moved)[0].module.weight
    after = find_routers(replayed_model)[0].module.weight
    assert (after - before).abs().max().item() > 0.0


def test_activation_checkpointing_replays_the_same_experts(moe: torch.nn.Module) -> None:
    batch = _batch().union(Batch.from_dict({ROUTED_EXPERTS: _record(moe, _batch())}))
    moved = _moved_router(moe)
    checkpointed = copy.deepcopy(moved)
    checkpointed.gradient_checkpointing_enable(
        gradient_checkpointing_kwargs={"use_reentrant": False}
    )
    _, eager = _update(moved, batch, router_replay="record", moe_aux_loss_coef=0.1)
    metrics, recomputed = _update(
        checkpointed, batch, router_replay="record", moe_aux_loss_coef=0.1
    )
    assert metrics["actor/moe_routing_diff_frac"] == 0.0
    assert _max_step_gap(eager, recomputed) < 1e-6


def test_the_aux_loss_trains_only_when_weighted(moe: torch.nn.Module) -> None:
    batch = _batch()
    unweighted, plain = _update(moe, batch)
    weighted, balanced = _update(moe, batch, moe_aux_loss_coef=1.0)
    assert weighted["actor/moe_aux_loss"] == pytest.approx(unweighted["actor/moe_aux_loss"])
    gate = find_routers(plain)[0].module.weight
    assert (find_routers(balanced)[0].module.weight - gate).abs().max().item() > 1e-6


def test_a_replay_without_the_record_or_of_another_shape_is_named(moe: torch.nn.Module) -> None:
    with pytest.raises(KeyError, match=ROUTED_EXPERTS):
        _update(moe, _batch(), router_replay="record")
    wrong = torch.zeros((4, 7, 2, 2), dtype=torch.uint8)  # two layers; the model routes one
    with pytest.raises(ValueError, match=r"holds \(2, 2\) \(layers, top-k\) per token"):
        _update(
            moe, _batch().union(Batch.from_dict({ROUTED_EXPERTS: wrong})), router_replay="record"
        )


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"router_replay": "r2"}, "actor.router_replay must be one of"),
        ({"moe_aux_loss_coef": -1.0}, "actor.moe_aux_loss_coef must be >= 0"),
    ],
)
def test_bad_routing_settings_are_named(fields: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ActorConfig(**fields)
